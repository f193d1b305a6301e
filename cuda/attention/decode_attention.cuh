// Fray attention family: split-KV decode attention kernels and their launcher templates.
// Torch-free: raw pointers, sizes and a stream. See README.md for the design and attention.h for
// the semantics.
//
// Why this shape. A decode step reads every K/V byte once and does ~2 * group flops per byte: it
// is purely bandwidth-bound, so what decides the speed is (1) each K/V byte leaves HBM once,
// (2) enough bytes are in flight per SM to cover HBM latency (~64 KB and more here), (3) every
// SM has work, and (4) the arithmetic never becomes the limit.
//  (1) One CTA per (sequence, kv head, split) computes all `group` query heads sharing the kv
//      head, so K/V rows are read once per kv head, not once per query head.
//  (2) K/V tiles stream through a multi-stage cp.async ring in shared memory: 16-bit caches keep
//      2 of 3 stages (64 KB) in flight per CTA at D = 128, two CTAs per SM (5 of 6 stages of
//      16 KB at D = 64; at D = 256 one CTA of 3 x 64 KB). Loads past the sequence end are
//      zero-filled (src-size 0), never issued to memory.
//  (3) Split-KV: the host picks the split count from the capacity T, the number of (sequence, kv
//      head) pairs and the SM count -- never from lens (a host read of lens would synchronise and
//      break CUDA-graph replay with new lengths). Splits that start at or past lens[b] exit at
//      once; a second small kernel merges the partials in split order (deterministic), launched
//      with programmatic dependent launch so its launch latency hides under the split kernel.
//  (4) 16-bit caches use tensor cores (mma.sync m16n8k16, fp32 accumulate) for S = Q K^T and
//      O = P V with the group padded to 16 rows: at group 8-16 CUDA cores would need 35-70
//      TFLOP/s of fp32 FMA to keep up with 4.3 TB/s, at or past the H200's CUDA-core peak, while
//      the padded mma work is < 10% of the tensor cores' rate even at group 1. So one kernel
//      serves every group size (group is a runtime value: no per-group instantiations).
//      Each warp owns 16 tokens of every 64-token tile (its own running max / sum / accumulator,
//      no barrier between QK^T and PV); the four warps merge once at the end through shared
//      memory. P is rounded to the cache dtype for P V, as every flash kernel does.
//      fp32 caches keep IEEE fp32 products (TF32 would cost ~1e-3 relative): CUDA cores, four
//      query heads per CTA, lanes across D; correct and bandwidth-reasonable, not tuned.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention/attention.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"

// Timeline probe of the 16-bit split kernel: a micro-benchmark defines FRAY_DECODE_STAMP(i) before
// including this header to record when each CTA reaches point i; production builds compile it out.
#ifndef FRAY_DECODE_STAMP
#define FRAY_DECODE_STAMP(i)
#endif

namespace fray {
namespace attn_detail {

constexpr int kThreads = 128;  // 4 warps per CTA
constexpr int kWarps = kThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Split-count heuristic (decode_split_size). Measured on the H200 (bf16, D=128, Hq32/Hkv8, graph
// replay or L2-flushed medians; bench/micro/decode_split_sweep.py at 937cbf6 (2026-11-30), with the one-round-
// trip combine): B=1 T=4096 with 8/16/24/32/48/64 splits 10.3/8.7/8.7/9.2/9.3/12.6 us, so splits
// shorter than 256 tokens cost more in partials and combine than they gain in parallelism; B=32
// T=4096 (256 CTAs for 264 slots) 1 split 134.7 us, 2 splits 142.0 us. At least ceil(T / 8192) splits. Measured (L2 flushed, 937cbf6..c152ab8): B=64 Hq64 T=8192 with 1 / 2 / 4
// splits 497.1 / 512.4 / 516.6 us (SDPA 497.7); lens uniform in [1, 8192] 285.0 / 277.3 / 268.6
// (SDPA with a mask 505.9). One split per 8192 tokens wins where every sequence is full and costs
// 3% on uneven lengths, still 1.8x SDPA there.
constexpr int kTargetSplitTokens = 8192;
// Paged caches keep ceil(T / 4096): their loader looks page ids up one tile ahead, so a long split
// running alone at the end of an uneven batch is slower than a contiguous one (B=64 lens uniform
// in [1, 8192], P16: 307.5 us with one split per 8192 tokens against 278.6 contiguous; 296.7 with
// two splits, runs at 73e5a91..a5b1d58).
constexpr int kTargetSplitTokensPaged = 4096;
constexpr int kMinSplitTokens = 256;
constexpr double kWaveSlack = 1.05;       // fewer splits unless more of them save > 5% of wave time
constexpr int kMaxSplits = 256;           // bounds the partial buffers
constexpr int kPrefetchTiles = 4;         // splits of <= 4 tiles (contiguous caches) load before lens
// Measurement probes of the 16-bit split kernel (bench/micro/decode_variants.cu times the kernel
// with parts switched off); every production launch uses PROBE = 0.
constexpr int kProbeNoMath = 1;    // loads and barriers only: no QK^T, softmax or PV
constexpr int kProbeNoFinish = 2;  // no merge of the warps, nothing written
constexpr int kProbeNoLens = 4;    // lens[b] taken as the capacity: no lens read

// 16-bit caches (tensor-core kernel). 64 tokens per stage = 16 per warp (one m16n8k16 k-step
// of P V). Stages: ~96 KB of ring per CTA so two CTAs share an SM (228 KB) at D <= 128. (A 5-stage
// one-CTA-per-SM form for B = 1, every tile of a 4-tile split requested before lens, measured
// slower than these 3 stages at 5a45683 (2026-11-30): 7.38-7.49 against 7.21-7.29 us per graph-replayed
// call, L2 warm; its copies took longer to issue than lens took to arrive. Removed.)
template <int D>
struct MmaConfig {
  static constexpr int kTile = 64;
  static constexpr int kRowBytes = D * 2;
  static constexpr int kStageBytes = kTile * kRowBytes;  // one of K, V
  static constexpr int kStages = D == 64 ? 6 : 3;
  static constexpr int kMinBlocks = D == 256 ? 1 : 2;
  static constexpr int kRingBytes = kStages * 2 * kStageBytes;
  static constexpr int kQBytes = 16 * kRowBytes;
  // the end-of-kernel merge reuses the ring: m, l, coefficients, then 4 x [16][D + 8] floats
  static constexpr int kMergeBytes = (3 * kWarps * 16 + kWarps * 16 * (D + 8)) * 4;
  static_assert(kMergeBytes <= kRingBytes, "merge area must fit in the ring");
  static constexpr int kSmemBytes = kRingBytes + kQBytes;
  static constexpr bool kQInRegisters = D <= 128;  // D = 256: 64 more registers would spill
};

// fp32 caches (CUDA-core kernel): 32 KB of K+V per stage, 3 stages, 4 query heads per CTA.
template <int D>
struct F32Config {
  static constexpr int kTile = 4096 / D;  // 64, 32, 16 tokens
  static constexpr int kRowBytes = D * 4;
  static constexpr int kStageBytes = kTile * kRowBytes;
  static constexpr int kStages = 3;
  static constexpr int kMinBlocks = 2;
  static constexpr int kHeads = 4;
  static constexpr int kRingBytes = kStages * 2 * kStageBytes;
  static constexpr int kMergeBytes = (3 * kWarps * kHeads + kWarps * kHeads * D) * 4;
  static_assert(kMergeBytes <= kRingBytes, "merge area must fit in the ring");
  static constexpr int kSmemBytes = kRingBytes;
};

// Kernel arguments: the public parameters plus what the host derives once.
struct DecodeArgs {
  DecodeParams p;
  int group;        // n_heads / n_kv_heads
  int head_chunks;  // CTAs per (sequence, kv head, split): 1, or ceil(group / 4) for fp32
  int page_shift;   // log2(page_size)
  float scale_log2; // scale * log2(e): softmax in base 2
  bool q_async;     // 16-bit q rows 16-byte aligned: Q tile copied by cp.async (else element loads)
};

// ---------------------------------------------------------------------------------------------
// PTX helpers

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// 2^x as one MUFU.EX2 (relative error ~2^-22); 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy, bypassing L1; valid = false zero-fills without reading memory.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a (16x16, row) * b (16x8, col), fp32 accumulate.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two fp32 values as one 32-bit register of T pairs (lo in the low half), round to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Programmatic dependent launch (sm_90): the combine kernel may start while the split kernel
// runs and waits here for its results; without the launch attribute both are no-ops.
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Shared-memory byte offset of 16-byte chunk `chunk` of ring row `row`: the chunk index is XORed
// with row % 8 so the 8 row addresses of one ldmatrix (and the 8 rows a warp's cp.async lanes
// write) fall in 8 different bank groups (rows are multiples of 128 B apart).
__device__ __forceinline__ int swz(int row, int chunk, int row_bytes) {
  return row * row_bytes + ((chunk ^ (row & 7)) << 4);
}

// ---------------------------------------------------------------------------------------------
// The K/V tile loader shared by both kernels: thread i copies 16-byte chunk i % CPR of rows
// i / CPR + j * RPP of each tile (consecutive threads -> consecutive 16 B of a row: coalesced).
// Paged caches read the block table a window of 64 entries at a time, every warp its own copy: lane
// L loads entries 64 w + L and 64 w + 32 + L (two coalesced loads per warp and window), and each
// row's page comes out of the window by a shuffle. Windows are aligned to 64 entries and a tile's
// entries (64 / page_size of them, or one) never straddle two, so the current window and the next
// are all a split needs in registers; the next is requested when the tiles enter the current one,
// 64 entries ahead of its first use. (Per-thread lookups, one per row and tile, measured the same
// at B = 1 with 16x the requests and more registers; bench/NOTES.md, a04f307.)

template <typename T, int D, int kTile, bool PAGED>
struct TileLoader {
  static constexpr int kRowBytes = D * static_cast<int>(sizeof(T));
  static constexpr int kCpr = kRowBytes / 16;
  static constexpr int kRpp = kThreads / kCpr;
  static constexpr int kRows = kTile / kRpp;
  static constexpr int kElemsPerChunk = 16 / static_cast<int>(sizeof(T));
  static_assert(kThreads % kCpr == 0 && kTile % kRpp == 0, "tile / row shape");
  static_assert(kCpr >= 8, "the swizzle needs >= 8 chunks per row");

  const T* kbase;
  const T* vbase;
  int64_t k_st, v_st;
  int k_page32, v_page32, k_st32, v_st32;  // paged: page and token strides (elements, < 2^31)
  bool one_shuffle;                        // paged: page_size >= kRowsPerWarp
  const int32_t* bt_row;
  int page_shift, page_mask;
  int chunk, row0, start, end;
  int e_last;                          // paged: the last table entry the split may use
  int win;                             // paged: the window held in cur_lo / cur_hi
  int cur_lo, cur_hi, nxt_lo, nxt_hi;  // paged: windows win and win + 1 (lane L: entries L, 32 + L)

  __device__ __forceinline__ TileLoader(const DecodeArgs& a, int b, int kvh, int start_, int end_) {
    const DecodeParams& p = a.p;
    const int tid = static_cast<int>(threadIdx.x);
    chunk = tid % kCpr;
    row0 = tid / kCpr;
    start = start_;
    end = end_;
    const int64_t col = static_cast<int64_t>(chunk) * kElemsPerChunk;
    kbase = static_cast<const T*>(p.k) + kvh * p.k_sh + col;
    vbase = static_cast<const T*>(p.v) + kvh * p.v_sh + col;
    if constexpr (!PAGED) {
      kbase += b * p.k_sb;
      vbase += b * p.v_sb;
    }
    k_st = p.k_st;
    v_st = p.v_st;
    k_page32 = static_cast<int>(p.k_sb);
    v_page32 = static_cast<int>(p.v_sb);
    k_st32 = static_cast<int>(p.k_st);
    v_st32 = static_cast<int>(p.v_st);
    one_shuffle = (1 << a.page_shift) >= kRowsPerWarp;
    bt_row = p.block_table + (PAGED ? b * p.bt_sb : 0);
    page_shift = a.page_shift;
    page_mask = (1 << a.page_shift) - 1;
  }

  // Zeroes this thread's rows of `tile` at or past `end` in the stage at `smem` (its own copies,
  // complete after its cp.async wait).
  __device__ __forceinline__ void zero_rows_past_end(int tile, uint32_t smem) const {
    const int t0 = start + tile * kTile;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int row = row0 + j * kRpp;
      if (t0 + row >= end) {
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(smem + swz(row, chunk, kRowBytes)), "r"(0)
                     : "memory");
      }
    }
  }

  // Paged: table window w (entries past e_last, outside the split, are not read).
  __device__ __forceinline__ void load_window(int w, int& lo, int& hi) const {
    const int e = w * 64 + static_cast<int>(threadIdx.x & 31);
    lo = e <= e_last ? __ldg(bt_row + e) : 0;
    hi = e + 32 <= e_last ? __ldg(bt_row + e + 32) : 0;
  }
  // Paged: requests the windows of the split's first tiles. Every entry up to the capacity-bounded
  // end is inside the block table whatever lens[b] is, so this may run before lens arrives (pages
  // past lens are never dereferenced).
  __device__ __forceinline__ void start_pages() {
    if constexpr (PAGED) {
      e_last = (end - 1) >> page_shift;
      win = (start >> page_shift) >> 6;
      load_window(win, cur_lo, cur_hi);
      load_window(win + 1, nxt_lo, nxt_hi);
    }
  }
  // When a page holds at least the rows a warp copies at once (32 / CPR of them, aligned), all
  // lanes of a warp want the same table entry for a row: each lane then picks that entry's half of
  // the window itself, and one shuffle per row does (issue_paged_rows<true>).
  static constexpr int kRowsPerWarp = kCpr >= 32 ? 1 : 32 / kCpr;

  // Copies tile `tile` into ring stage `stage` (K at k_smem, V at k_smem + stage bytes). Tiles are
  // issued in increasing order. Always commits one group (empty past the end) so that
  // cp.async.wait_group counts stay uniform.
  __device__ __forceinline__ void issue(int tile, int n_tiles, uint32_t k_smem, uint32_t v_smem) {
    if (tile < n_tiles) {
      const int t0 = start + tile * kTile;
      if constexpr (PAGED) {
        // A tile advances the entries by at most 64: into the next window at most.
        const int w = (t0 >> page_shift) >> 6;
        if (w != win) {
          win = w;
          cur_lo = nxt_lo;
          cur_hi = nxt_hi;
          load_window(w + 1, nxt_lo, nxt_hi);
        }
        if (one_shuffle) {
          issue_paged_rows<true>(t0, k_smem, v_smem);
        } else {
          issue_paged_rows<false>(t0, k_smem, v_smem);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          const int row = row0 + j * kRpp;
          const int t = t0 + row;
          const bool ok = t < end;
          const int64_t ko = t * k_st;
          const int64_t vo = t * v_st;
          const int off = swz(row, chunk, kRowBytes);
          cp_async_16(k_smem + off, ok ? kbase + ko : kbase, ok);
          cp_async_16(v_smem + off, ok ? vbase + vo : vbase, ok);
        }
      }
    }
    cp_async_commit();
  }

  // Paged: this thread's rows of the tile at token t0. Strides fit 32 bits (the host checks) and
  // page ids are trusted non-negative: one 32 x 32 -> 64-bit multiply-add per term. A row past the
  // end reads page 0 (inside the pool; its copy is a zero fill anyway).
  template <bool ONE_SHUFFLE>
  __device__ __forceinline__ void issue_paged_rows(int t0, uint32_t k_smem, uint32_t v_smem) const {
    const int wbase = win * 64;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int row = row0 + j * kRpp;
      const int t = t0 + row;
      const bool ok = t < end;
      const int idx = (t >> page_shift) - wbase;
      int id;  // every lane shuffles
      if constexpr (ONE_SHUFFLE) {
        id = __shfl_sync(0xffffffffu, idx < 32 ? cur_lo : cur_hi, idx & 31);
      } else {
        const int lo = __shfl_sync(0xffffffffu, cur_lo, idx & 31);
        const int hi = __shfl_sync(0xffffffffu, cur_hi, idx & 31);
        id = idx < 32 ? lo : hi;
      }
      const uint32_t page = ok ? static_cast<uint32_t>(id) : 0u;
      const uint32_t slot = static_cast<uint32_t>(t & page_mask);
      const uint64_t ko = static_cast<uint64_t>(page) * static_cast<uint32_t>(k_page32) +
                          static_cast<uint64_t>(slot) * static_cast<uint32_t>(k_st32);
      const uint64_t vo = static_cast<uint64_t>(page) * static_cast<uint32_t>(v_page32) +
                          static_cast<uint64_t>(slot) * static_cast<uint32_t>(v_st32);
      const int off = swz(row, chunk, kRowBytes);
      cp_async_16(k_smem + off, kbase + ko, ok);
      cp_async_16(v_smem + off, vbase + vo, ok);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// End of a split: merge the per-warp states (m in base-2 scaled units, l, unnormalised acc) of
// `rows` query heads h0 + r, and write either the final row (num_splits == 1: out in TO, lse)
// or the split's partial (fp32 normalised output and natural-log lse).
// m_s, l_s, coef: [kWarps][R]; acc: [kWarps][R][DP]. Contains barriers: all threads call it.

template <typename TO, int R, int D, int DP>
__device__ __forceinline__ void finish_split(const DecodeArgs& a, const float* m_s, const float* l_s, float* coef,
                                             const float* acc, int b, int h0, int rows, int split) {
  const DecodeParams& p = a.p;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < rows) {
    float m = neg_inf();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, m_s[w * R + tid]);  // finite: warp 0 saw a token
    float l = 0.0f;
    float e[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      e[w] = fast_exp2(m_s[w * R + tid] - m);  // a warp without tokens: exp2(-inf) = 0
      l += l_s[w * R + tid] * e[w];
    }
    const float inv = 1.0f / l;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) coef[w * R + tid] = e[w] * inv;
    const float lse = (m + log2f(l)) * kLn2;
    const int h = h0 + tid;
    if (p.num_splits == 1) {
      p.lse[b * p.lse_sb + h] = lse;
    } else {
      p.part_lse[(static_cast<int64_t>(b) * p.n_heads + h) * p.num_splits + split] = lse;
    }
  }
  __syncthreads();
  for (int i = tid; i < rows * D; i += kThreads) {
    const int r = i / D;
    const int d = i % D;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += acc[(w * R + r) * DP + d] * coef[w * R + r];
    const int h = h0 + r;
    if (p.num_splits == 1) {
      static_cast<TO*>(p.out)[b * p.o_sb + h * p.o_sh + d] = from_float<TO>(o);
    } else {
      p.part_out[((static_cast<int64_t>(b) * p.n_heads + h) * p.num_splits + split) * D + d] = o;
    }
  }
}

// A sequence with lens[b] = 0 and a single split: zero rows and lse = -inf (with several splits
// the combine kernel writes them).
template <typename TO, int D>
__device__ __forceinline__ void write_empty(const DecodeParams& p, int b, int h0, int rows) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int i = tid; i < rows * D; i += kThreads) {
    static_cast<TO*>(p.out)[b * p.o_sb + (h0 + i / D) * p.o_sh + i % D] = from_float<TO>(0.0f);
  }
  if (tid < rows) p.lse[b * p.lse_sb + h0 + tid] = neg_inf();
}

// ---------------------------------------------------------------------------------------------
// 16-bit caches: tensor-core split kernel. blockIdx.x = pair * num_splits + split.

template <typename T, int D, bool PAGED, int PROBE = 0>
__global__ void __launch_bounds__(kThreads, MmaConfig<D>::kMinBlocks) decode_split_mma_kernel(const DecodeArgs a) {
  using Cfg = MmaConfig<D>;
  constexpr int kTile = Cfg::kTile;
  constexpr int kStages = Cfg::kStages;
  constexpr int kRowBytes = Cfg::kRowBytes;
  constexpr int kK16 = D / 16;  // k-steps of Q K^T, and pairs of 8-column tiles of P V
  extern __shared__ __align__(128) unsigned char smem[];
  const DecodeParams& p = a.p;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int split = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.num_splits));
  const int pair = static_cast<int>(blockIdx.x / static_cast<unsigned>(p.num_splits));
  const int b = pair / p.n_kv_heads;
  const int kvh = pair % p.n_kv_heads;
  const int group = a.group;
  const int h0 = kvh * group;
  // Launched programmatically: wait until whatever ran before on the stream is complete, and only
  // then let the combine launch (it reads lens before its own wait; lens may have been written by
  // the kernel before this one).
  FRAY_DECODE_STAMP(0);
  griddep_wait();
  FRAY_DECODE_STAMP(1);
  griddep_launch_dependents();

  // lens[b] is requested first and used only after the Q and K/V copies are in flight. Clamped
  // so that a bad length reads only inside the cache (FRAY_CHECK_INDICES=1 reports it).
  const int len_b = (PROBE & kProbeNoLens) != 0 ? p.capacity : __ldg(p.lens + b);
  const int start = split * p.split_size;
  const uint32_t ring = smem_addr(smem);
  const uint32_t q_smem = ring + Cfg::kRingBytes;
  // Q [16][D] in the swizzled row format, rows >= group zero (their scores are finite and never
  // stored). Aligned rows: one cp.async group issued first, so its latency overlaps the lens read
  // and the K/V prologue (element loads here would put several dependent round trips in front
  // of the first tile's math).
  const T* qb = static_cast<const T*>(p.q) + b * p.q_sb + h0 * p.q_sh;
  if (a.q_async) {
    constexpr int kCpr = kRowBytes / 16;
    for (int i = tid; i < 16 * kCpr; i += kThreads) {
      const int r = i / kCpr;
      const int c = i % kCpr;
      const bool ok = r < group;
      cp_async_16(q_smem + swz(r, c, kRowBytes), ok ? qb + r * p.q_sh + c * 8 : qb, ok);
    }
    cp_async_commit();
  }
  // Short splits of contiguous caches are latency-bound: their first tiles are requested before
  // lens[b] arrives, bounded by the capacity (memory the cache owns); rows at or past the length
  // are masked, and their V rows zeroed once they land (a cache past lens may hold NaN bits).
  const bool early = !PAGED && p.split_size <= kPrefetchTiles * kTile && start < p.capacity;
  TileLoader<T, D, kTile, PAGED> loader(a, b, kvh, start, min(start + p.split_size, p.capacity));
  if (early) {
    const int cap_tiles = (loader.end - start + kTile - 1) / kTile;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      const uint32_t ks = ring + s * 2 * Cfg::kStageBytes;
      loader.issue(s, cap_tiles, ks, ks + Cfg::kStageBytes);
    }
  }
  // Paged caches: the table windows of the first tiles are requested now, overlapping the lens read.
  loader.start_pages();
  const int seqlen = min(max(len_b, 0), p.capacity);
  if (start >= seqlen) {
    cp_async_wait<0>();  // no copy may land in shared memory after the CTA exits
    if (p.num_splits == 1) write_empty<T, D>(p, b, h0, group);
    return;
  }
  FRAY_DECODE_STAMP(2);
  const int end = min(start + p.split_size, seqlen);
  const int n_tiles = (end - start + kTile - 1) / kTile;
  loader.end = end;
  if (!early) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      const uint32_t ks = ring + s * 2 * Cfg::kStageBytes;
      loader.issue(s, n_tiles, ks, ks + Cfg::kStageBytes);
    }
  }

  FRAY_DECODE_STAMP(3);
  if (a.q_async) {
    cp_async_wait<kStages - 1>();  // the Q group (the kStages - 1 prologue groups may be in flight)
  } else {
    T* qs = reinterpret_cast<T*>(smem + Cfg::kRingBytes);
    for (int i = tid; i < 16 * D; i += kThreads) {
      const int r = i / D;
      const int d = i % D;
      const T val = r < group ? qb[r * p.q_sh + d] : from_float<T>(0.0f);
      qs[(swz(r, d / 8, kRowBytes) >> 1) + (d % 8)] = val;
    }
  }
  __syncthreads();
  // ldmatrix lane roles: matrix mi = lane / 8, its row lane % 8.
  const int mi = lane >> 3;
  const int r8 = lane & 7;
  uint32_t qf[Cfg::kQInRegisters ? kK16 : 1][4];
  if constexpr (Cfg::kQInRegisters) {
#pragma unroll
    for (int kk = 0; kk < kK16; ++kk) {
      ldmatrix_x4(qf[kk], q_smem + swz((mi & 1) * 8 + r8, 2 * kk + (mi >> 1), kRowBytes));
    }
  }

  // Per-thread state of rows g = lane / 4 and g + 8 (mma accumulator layout).
  float m_run[2] = {neg_inf(), neg_inf()};
  float l_run[2] = {0.0f, 0.0f};
  float acc[2 * kK16][4];
#pragma unroll
  for (int n = 0; n < 2 * kK16; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` visible to all; stage (it - 1) % kStages free for refill
    if (it == 0) FRAY_DECODE_STAMP(4);
    {
      const int nxt = it + kStages - 1;
      const uint32_t ks = ring + (nxt % kStages) * 2 * Cfg::kStageBytes;
      loader.issue(nxt, n_tiles, ks, ks + Cfg::kStageBytes);
    }
    const uint32_t ks = ring + (it % kStages) * 2 * Cfg::kStageBytes;
    const uint32_t vs = ks + Cfg::kStageBytes;
    if (early && it < kStages - 1 && start + (it + 1) * kTile > end) {  // CTA-uniform
      loader.zero_rows_past_end(it, vs);  // each thread its own rows: its copies have landed
      __syncthreads();
    }
    const int t_warp = start + it * kTile + warp * 16;
    if (t_warp >= end) continue;  // this warp's 16 rows are all past the end
    const int wrow = warp * 16;
    if constexpr ((PROBE & kProbeNoMath) != 0) continue;

    // S = Q K^T for the warp's 16 tokens: two 16x8 tiles (tokens 0-7, 8-15), each accumulated
    // in two chains (even / odd k-steps) and summed: half the dependent-mma latency per tile.
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    float s_odd[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < kK16; ++kk) {
      uint32_t kb[4];  // matrices: (tok 0-7, d lo), (tok 0-7, d hi), (tok 8-15, d lo), (tok 8-15, d hi)
      ldmatrix_x4(kb, ks + swz(wrow + (mi >> 1) * 8 + r8, 2 * kk + (mi & 1), kRowBytes));
      float(&s0)[4] = kk & 1 ? s_odd[0] : s[0];
      float(&s1)[4] = kk & 1 ? s_odd[1] : s[1];
      if constexpr (Cfg::kQInRegisters) {
        mma_16816<T>(s0, qf[kk], kb[0], kb[1]);
        mma_16816<T>(s1, qf[kk], kb[2], kb[3]);
      } else {
        uint32_t qa[4];
        ldmatrix_x4(qa, q_smem + swz((mi & 1) * 8 + r8, 2 * kk + (mi >> 1), kRowBytes));
        mma_16816<T>(s0, qa, kb[0], kb[1]);
        mma_16816<T>(s1, qa, kb[2], kb[3]);
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] += s_odd[j][e];
    }
    // Online softmax, base 2. Element e of tile j: row g + 8 * (e / 2), token 8 j + 2 (lane % 4) + e % 2.
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = t_warp + j * 8 + 2 * (lane & 3) + (e & 1);
        s[j][e] = t < end ? s[j][e] * a.scale_log2 : neg_inf();
        mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
      }
    }
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      // The shift stays 0 while the row max is -inf (the tile has valid tokens, so this only
      // guards the arithmetic): exp2(-inf - 0) = 0 where exp2(-inf + inf) would be NaN.
      base[r] = m_new == neg_inf() ? 0.0f : m_new;
      alpha[r] = fast_exp2(m_run[r] - base[r]);
      m_run[r] = m_new;
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = fast_exp2(s[j][e] - base[e >> 1]);
        rs[e >> 1] += s[j][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + rs[r];
#pragma unroll
    for (int n = 0; n < 2 * kK16; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
    // P (16 x 16 tokens) as the A operand: the two S tiles' accumulators, rounded to T.
    uint32_t pa[4];
    pa[0] = pack2<T>(s[0][0], s[0][1]);
    pa[1] = pack2<T>(s[0][2], s[0][3]);
    pa[2] = pack2<T>(s[1][0], s[1][1]);
    pa[3] = pack2<T>(s[1][2], s[1][3]);
    // O += P V: V^T fragments by transposed ldmatrix, two 8-column tiles per load.
#pragma unroll
    for (int np = 0; np < kK16; ++np) {
      uint32_t vb[4];  // (tok 0-7, d lo), (tok 8-15, d lo), (tok 0-7, d hi), (tok 8-15, d hi)
      ldmatrix_x4_trans(vb, vs + swz(wrow + (mi & 1) * 8 + r8, 2 * np + (mi >> 1), kRowBytes));
      mma_16816<T>(acc[2 * np], pa, vb[0], vb[1]);
      mma_16816<T>(acc[2 * np + 1], pa, vb[2], vb[3]);
    }
  }

  if constexpr ((PROBE & kProbeNoFinish) != 0) {
    cp_async_wait<0>();
    return;
  }
  FRAY_DECODE_STAMP(5);
  // Merge the four warps' states (the ring is reused: wait for the trailing empty groups).
  cp_async_wait<0>();
  __syncthreads();
  constexpr int DP = D + 8;  // row pitch: the quad-wide float2 stores hit each bank once per wavefront
  float* m_s = reinterpret_cast<float*>(smem);
  float* l_s = m_s + kWarps * 16;
  float* coef = l_s + kWarps * 16;
  float* acc_s = coef + kWarps * 16;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const int g = lane >> 2;
  if ((lane & 3) == 0) {
    m_s[warp * 16 + g] = m_run[0];
    m_s[warp * 16 + g + 8] = m_run[1];
    l_s[warp * 16 + g] = l_run[0];
    l_s[warp * 16 + g + 8] = l_run[1];
  }
  float* my = acc_s + warp * 16 * DP;
#pragma unroll
  for (int n = 0; n < 2 * kK16; ++n) {
    const int d = n * 8 + 2 * (lane & 3);
    *reinterpret_cast<float2*>(my + g * DP + d) = make_float2(acc[n][0], acc[n][1]);
    *reinterpret_cast<float2*>(my + (g + 8) * DP + d) = make_float2(acc[n][2], acc[n][3]);
  }
  __syncthreads();
  finish_split<T, 16, D, DP>(a, m_s, l_s, coef, acc_s, b, h0, group, split);
  FRAY_DECODE_STAMP(6);
}

// ---------------------------------------------------------------------------------------------
// fp32 caches: CUDA-core split kernel, 4 query heads per CTA, lanes across D, each warp walking
// its quarter of every tile token by token. blockIdx.x = (pair * head_chunks + chunk) * splits + split.

template <int D, bool PAGED>
__global__ void __launch_bounds__(kThreads, F32Config<D>::kMinBlocks) decode_split_f32_kernel(const DecodeArgs a) {
  using Cfg = F32Config<D>;
  constexpr int kTile = Cfg::kTile;
  constexpr int kStages = Cfg::kStages;
  constexpr int kRowBytes = Cfg::kRowBytes;
  constexpr int kHeads = Cfg::kHeads;
  constexpr int kVec = D / 32;           // fp32 values per lane: 2, 4, 8
  constexpr int kTpw = kTile / kWarps;   // tokens per warp per tile
  extern __shared__ __align__(128) unsigned char smem[];
  const DecodeParams& p = a.p;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int split = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.num_splits));
  const int unit = static_cast<int>(blockIdx.x / static_cast<unsigned>(p.num_splits));
  const int chunk_id = unit % a.head_chunks;
  const int pair = unit / a.head_chunks;
  const int b = pair / p.n_kv_heads;
  const int kvh = pair % p.n_kv_heads;
  const int h0 = kvh * a.group + chunk_id * kHeads;
  const int rows = min(kHeads, a.group - chunk_id * kHeads);
  // Launched programmatically: wait until whatever ran before on the stream is complete, and only
  // then let the combine launch (it reads lens before its own wait; lens may have been written by
  // the kernel before this one).
  griddep_wait();
  griddep_launch_dependents();

  const int seqlen = min(max(__ldg(p.lens + b), 0), p.capacity);
  const int start = split * p.split_size;
  if (start >= seqlen) {
    if (p.num_splits == 1) write_empty<float, D>(p, b, h0, rows);
    return;
  }
  const int end = min(start + p.split_size, seqlen);
  const int n_tiles = (end - start + kTile - 1) / kTile;

  const uint32_t ring = smem_addr(smem);
  TileLoader<float, D, kTile, PAGED> loader(a, b, kvh, start, end);
  loader.start_pages();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const uint32_t ks = ring + s * 2 * Cfg::kStageBytes;
    loader.issue(s, n_tiles, ks, ks + Cfg::kStageBytes);
  }

  float q[kHeads][kVec];
  const float* qb = static_cast<const float*>(p.q) + b * p.q_sb + h0 * p.q_sh + lane * kVec;
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) q[i][e] = i < rows ? qb[i * p.q_sh + e] : 0.0f;
  }
  float m_run[kHeads], l_run[kHeads], acc[kHeads][kVec];
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    m_run[i] = neg_inf();
    l_run[i] = 0.0f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[i][e] = 0.0f;
  }

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      const int nxt = it + kStages - 1;
      const uint32_t ks = ring + (nxt % kStages) * 2 * Cfg::kStageBytes;
      loader.issue(nxt, n_tiles, ks, ks + Cfg::kStageBytes);
    }
    const unsigned char* kt = smem + (it % kStages) * 2 * Cfg::kStageBytes;
    const unsigned char* vt = kt + Cfg::kStageBytes;
    const int t_warp = start + it * kTile + warp * kTpw;
#pragma unroll 2
    for (int tt = 0; tt < kTpw; ++tt) {
      if (t_warp + tt >= end) break;
      const int row = warp * kTpw + tt;
      // lane's kVec values: d = lane * kVec + e, i.e. chunk (lane * kVec) / 4
      float kv[kVec], vv[kVec];
#pragma unroll
      for (int c = 0; c < (kVec + 3) / 4; ++c) {
        const int d0 = lane * kVec + c * 4;
        const int off = swz(row, d0 / 4, kRowBytes) + (d0 % 4) * 4;
        if constexpr (kVec >= 4) {
          const float4 k4 = *reinterpret_cast<const float4*>(kt + off);
          const float4 v4 = *reinterpret_cast<const float4*>(vt + off);
          kv[c * 4] = k4.x, kv[c * 4 + 1] = k4.y, kv[c * 4 + 2] = k4.z, kv[c * 4 + 3] = k4.w;
          vv[c * 4] = v4.x, vv[c * 4 + 1] = v4.y, vv[c * 4 + 2] = v4.z, vv[c * 4 + 3] = v4.w;
        } else {
          const float2 k2 = *reinterpret_cast<const float2*>(kt + off);
          const float2 v2 = *reinterpret_cast<const float2*>(vt + off);
          kv[0] = k2.x, kv[1] = k2.y;
          vv[0] = v2.x, vv[1] = v2.y;
        }
      }
#pragma unroll
      for (int i = 0; i < kHeads; ++i) {
        if (i >= rows) break;  // uniform across the CTA
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot = fmaf(q[i][e], kv[e], dot);
        const float sc = warp_sum<32>(dot) * a.scale_log2;
        const float m_new = fmaxf(m_run[i], sc);  // finite: sc is
        const float alpha = fast_exp2(m_run[i] - m_new);
        const float pw = fast_exp2(sc - m_new);
        l_run[i] = l_run[i] * alpha + pw;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[i][e] = fmaf(pw, vv[e], acc[i][e] * alpha);
        m_run[i] = m_new;
      }
    }
  }

  cp_async_wait<0>();
  __syncthreads();
  float* m_s = reinterpret_cast<float*>(smem);
  float* l_s = m_s + kWarps * kHeads;
  float* coef = l_s + kWarps * kHeads;
  float* acc_s = coef + kWarps * kHeads;
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kHeads; ++i) {
      m_s[warp * kHeads + i] = m_run[i];
      l_s[warp * kHeads + i] = l_run[i];
    }
  }
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc_s[(warp * kHeads + i) * D + lane * kVec + e] = acc[i][e];
  }
  __syncthreads();
  finish_split<float, kHeads, D, D>(a, m_s, l_s, coef, acc_s, b, h0, rows, split);
}

// ---------------------------------------------------------------------------------------------
// Combine: one CTA per (sequence, query head). Only splits that started below lens[b] wrote a
// partial; they are merged with weights exp(lse_s - max lse) and a fixed summation order (warp w
// sums splits w, w + 4, ... in increasing order, then the four warp sums are added 0..3), so the
// result does not depend on which split finished first. The combine is latency-bound (a decode
// step at B = 1 waits for it), so every load of a batch of up to 32 splits is issued before the
// first use: one L2 round trip for the lse values and the partials together, not one per split.
// Lanes own D / 32 consecutive columns; lens is read before the wait on the split kernel.

constexpr int kCombineUnroll = 8;                         // splits per warp per batch
constexpr int kCombineBatch = kCombineUnroll * kWarps;    // 32 splits per batch: one lse per lane

template <typename TO, int D>
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(const DecodeArgs a) {
  constexpr int kVec = D / 32;
  static_assert(kCombineBatch == 32, "one lse per lane per batch");
  __shared__ float red[kWarps][D];
  const DecodeParams& p = a.p;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int64_t row = blockIdx.x;  // b * n_heads + h
  const int b = static_cast<int>(row / p.n_heads);
  const int h = static_cast<int>(row % p.n_heads);
  const int seqlen = min(max(__ldg(p.lens + b), 0), p.capacity);  // not written by the split kernel
  const int n = (seqlen + p.split_size - 1) / p.split_size;
  TO* out = static_cast<TO*>(p.out) + b * p.o_sb + h * p.o_sh;
  const float* pl = p.part_lse + row * p.num_splits;
  const float* po = p.part_out + row * p.num_splits * D + lane * kVec;
  griddep_launch_dependents();  // the next kernel on the stream may launch (it waits for our completion)
  griddep_wait();  // the split kernel's partials are complete and visible past this point
  if (n == 0) {
    for (int d = static_cast<int>(threadIdx.x); d < D; d += kThreads) out[d] = from_float<TO>(0.0f);
    if (threadIdx.x == 0) p.lse[b * p.lse_sb + h] = neg_inf();
    return;
  }
  // Every warp computes the same max and total, in the same order. The first batch's partial
  // loads are issued before the max needs any lse value: both are in flight together.
  float m = neg_inf();
  float o[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) o[e] = 0.0f;
  float total = 0.0f;
  for (int s0 = 0; s0 < n; s0 += kCombineBatch) {
    // warp w's u-th split of the batch is s0 + u * 4 + w; lane j holds split s0 + j's lse
    float x[kCombineUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      const int s = s0 + u * kWarps + warp;
      const float* src = po + static_cast<int64_t>(s < n ? s : 0) * D;
#pragma unroll
      for (int c = 0; c < kVec; c += 2) {
        const float2 v = s < n ? __ldcg(reinterpret_cast<const float2*>(src + c)) : make_float2(0.0f, 0.0f);
        x[u][c] = v.x;
        x[u][c + 1] = v.y;
      }
    }
    const float lse_j = s0 + lane < n ? __ldcg(pl + s0 + lane) : neg_inf();
    if (s0 == 0) {
      m = lse_j;
      for (int s = lane + kCombineBatch; s < n; s += 32) m = fmaxf(m, __ldcg(pl + s));
      m = warp_max(m);  // finite: every active split saw >= 1 token
    }
    const float w_j = fast_exp2((lse_j - m) * kLog2e);  // 0 past n
    total += warp_sum<32>(w_j);
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      const float w = __shfl_sync(0xffffffffu, w_j, u * kWarps + warp);
#pragma unroll
      for (int e = 0; e < kVec; ++e) o[e] = fmaf(w, x[u][e], o[e]);
    }
  }
#pragma unroll
  for (int e = 0; e < kVec; ++e) red[warp][lane * kVec + e] = o[e];
  __syncthreads();
  const float inv = 1.0f / total;
  for (int d = static_cast<int>(threadIdx.x); d < D; d += kThreads) {
    float acc = red[0][d];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) acc += red[w][d];
    out[d] = from_float<TO>(acc * inv);
  }
  if (threadIdx.x == 0) p.lse[b * p.lse_sb + h] = m + logf(total);
}

// ---------------------------------------------------------------------------------------------
// Host side

// Programmatic (PDL) launch of a decode kernel: its CTAs may be scheduled while the previous
// kernel on the stream finishes (that launch latency hides); each waits (griddepcontrol.wait)
// before its first dependent global read, so every earlier write on the stream is visible.
// Without PDL support: an ordinary stream-ordered launch.
template <auto Kernel>
inline cudaError_t launch_pdl(const DecodeArgs& a, unsigned grid, int smem_bytes, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t err = cudaLaunchKernelEx(&cfg, Kernel, a);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    Kernel<<<grid, kThreads, smem_bytes, stream>>>(a);
    err = launch_error();
  }
  return err;
}

template <auto Kernel>
inline cudaError_t launch_split(const DecodeArgs& a, int64_t grid, int smem_bytes, cudaStream_t stream) {
  // Opt-in shared memory (> 48 KB) and the max-shared carveout (two ~100 KB CTAs per SM).
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  err = prepare_kernel(reinterpret_cast<const void*>(Kernel), dev, static_cast<size_t>(smem_bytes), 1, true);
  if (err != cudaSuccess) return err;
  return launch_pdl<Kernel>(a, static_cast<unsigned>(grid), smem_bytes, stream);
}

template <auto Kernel>
inline cudaError_t launch_combine(const DecodeArgs& a, cudaStream_t stream) {
  return launch_pdl<Kernel>(a, static_cast<unsigned>(static_cast<int64_t>(a.p.batch) * a.p.n_heads), 0, stream);
}

template <typename T>
constexpr bool is_16bit() {
  return !std::is_same_v<T, float>;
}

template <typename T, int D>
constexpr int tile_tokens() {
  if constexpr (is_16bit<T>()) {
    return MmaConfig<D>::kTile;
  } else {
    return F32Config<D>::kTile;
  }
}

template <typename T, int D>
constexpr int ctas_per_sm() {
  if constexpr (is_16bit<T>()) {
    return MmaConfig<D>::kMinBlocks;
  } else {
    return F32Config<D>::kMinBlocks;
  }
}

template <typename T, int D, bool PAGED>
cudaError_t launch_decode_d(const DecodeArgs& a, cudaStream_t stream) {
  const DecodeParams& p = a.p;
  const int64_t grid = static_cast<int64_t>(p.batch) * p.n_kv_heads * a.head_chunks * p.num_splits;
  cudaError_t err;
  if constexpr (is_16bit<T>()) {
    err = launch_split<decode_split_mma_kernel<T, D, PAGED>>(a, grid, MmaConfig<D>::kSmemBytes, stream);
  } else {
    err = launch_split<decode_split_f32_kernel<D, PAGED>>(a, grid, F32Config<D>::kSmemBytes, stream);
  }
  if (err != cudaSuccess || p.num_splits == 1) return err;
  return launch_combine<decode_combine_kernel<T, D>>(a, stream);
}

// f(std::integral_constant<int, D>{}) for head_dim D in {64, 128, 256}; `otherwise` for any other.
template <typename R, typename F>
R dispatch_head_dim(int head_dim, R otherwise, F&& f) {
  switch (head_dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
  }
  return otherwise;
}

// The dtype's launcher (instantiated once per dtype in decode_attention_{f32,f16,bf16}.cu).
template <typename T>
cudaError_t launch_decode(const DecodeParams& p, cudaStream_t stream) {
  DecodeArgs a;
  a.p = p;
  a.group = p.n_heads / p.n_kv_heads;
  a.head_chunks = is_16bit<T>() ? 1 : (a.group + F32Config<64>::kHeads - 1) / F32Config<64>::kHeads;
  a.page_shift = 0;
  while ((1 << a.page_shift) < p.page_size) ++a.page_shift;
  a.scale_log2 = p.scale * kLog2e;
  a.q_async = is_16bit<T>() && is_aligned(p.q, 16) && p.q_sb % 8 == 0 && p.q_sh % 8 == 0;
  const bool paged = p.block_table != nullptr;
  return dispatch_head_dim(p.head_dim, cudaErrorInvalidValue, [&](auto d) {
    return paged ? launch_decode_d<T, decltype(d)::value, true>(a, stream)
                 : launch_decode_d<T, decltype(d)::value, false>(a, stream);
  });
}

// Split kernels x {64, 128, 256} x {contiguous, paged} plus one combine per head dim.
template <typename T>
constexpr int decode_num_kernels() {
  return 3 * 2 + 3;
}

template <typename T>
int decode_tile_tokens_t(int head_dim) {
  return dispatch_head_dim(head_dim, 0, [](auto d) { return tile_tokens<T, decltype(d)::value>(); });
}

template <typename T>
int decode_ctas_per_sm_t(int head_dim) {
  return dispatch_head_dim(head_dim, 1, [](auto d) { return ctas_per_sm<T, decltype(d)::value>(); });
}

}  // namespace attn_detail
}  // namespace fray
