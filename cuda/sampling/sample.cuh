// Fray sampling family: the filtered-sampling kernel (temperature -> top-k -> top-p -> min-p ->
// Philox inverse-CDF draw, or greedy) and its launcher. Torch-free: raw pointers, sizes and a
// stream. See README.md for the design; fray.reference.sampling for the semantics.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cuda/common/bulk_copy.cuh"
#include "cuda/common/dtype.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/vec.cuh"
#include "cuda/sampling/philox.cuh"
#include "cuda/sampling/sampling.h"

namespace fray {
namespace sampling_detail {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;           // per block; 2 blocks per SM (see kSliceTargetBytes)
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kDigitBits = 11;          // radix digit: 2048 bins, <= 3 refinement levels for 32-bit keys
constexpr int kBins = 1 << kDigitBits;
constexpr int kCandCap = 2048;          // candidate keys a block compacts after the first level
constexpr bool kValueLevel = true;      // refine(): a value-linear level before the key digits
// First-level bins are linear in the logit distance from the row max, where float keys would
// lump a binade's worth of values into one bin: counts (top-k) use 64 bins per logit (the
// last bin holds everything >= 32 below the max), masses (top-p) 128 bins per nat of
// (max - l) / T (the last holds w < e^-16). The first and last bin are accumulated in
// registers: they take the masked / hopeless tail and the max ties, where shared-memory
// atomics would serialise.
constexpr float kCountBinsPerLogit = 64.0f;
constexpr float kMassBinsPerNat = 128.0f;  // at least; more when the row spans < 16 nats
constexpr float kMaxMassBinsPerNat = 1048576.0f;
constexpr float kFixedOne = 2147483648.0f;  // mass of w = 1 (2^31): sums exact in 64 bits to 2^22 tokens
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kPortableCluster = 8;
constexpr int kMaxCluster = 16;
// Slice of the row per block: <= 80 KB keeps 2 blocks (+ 33 KB of histograms each) per SM;
// rows wider than 8 x 80 KB use 8 blocks of up to 192 KB (1 per SM); wider still: unsupported
// (sample_max_width), Python falls back to Triton.
constexpr int64_t kSliceTargetBytes = 80 * 1024;
constexpr int64_t kSliceMaxBytes = 192 * 1024;
// Small batches spread a row over more blocks (up to 16) while slices keep >= 4096 elements:
// below that the per-level cluster barriers outweigh the work.
constexpr int64_t kMinSliceElems = 4096;
constexpr int64_t kMaxBlocksPerLaunch = int64_t{1} << 30;
// Top-k survivors path: when the top-k filter leaves at most kSurvMax tokens in the row (k plus
// ties at the k-th value), they are gathered into the cluster's first block, which finishes
// the row alone (top-p, min-p and the draw over the survivors, sorted on chip) instead of three
// more cluster-wide passes over the row. kSurvMax entries of 8 bytes fill `part`; a block
// compacts up to kBins survivors of its slice into `hist`.
constexpr int kSurvMax = kBins / 2;
// Row load: the slice's 16-byte vectors arrive as bulk copies (TMA) of 16 KB, each completing on
// its own mbarrier, so the whole slice is in flight at once and the argmax pass starts on the
// first chunk while the rest land.
constexpr int kLoadChunkVecs = 1024;
constexpr int kLoadChunks = 12;
static_assert(int64_t{kLoadChunks} * kLoadChunkVecs * 16 >= kSliceMaxBytes, "sample: too few load barriers");

// Kernel arguments (param space). Strides in elements.
struct SampleArgs {
  const void* logits;
  int64_t stride;
  int64_t cols;
  const float* temperature;
  const int64_t* top_k;
  const float* top_p;
  const float* min_p;
  const int64_t* seeds;
  const int64_t* offsets;
  float temperature_value;
  float top_p_value;
  float min_p_value;
  int64_t top_k_value;
  int64_t seed_value;
  int64_t offset_value;
  int64_t* tokens;
  float* logprobs;
  int64_t row0;  // first row of this launch (parameters and outputs are indexed by row0 + r)
  int slice;     // elements per block, a multiple of the 16-byte vector
  int vec_ok;    // the row starts are 16-byte aligned: 16-byte global loads
};

// Exchanges pushed into the receivers' shared memory (st.async, completing on the receiver's
// mbarrier: one one-way trip, no cluster barrier, no remote load): each mbarrier completes one
// phase per row. kXMax: every block's (argmax key, min logit) to every block; kXSel + 3k (+0 raw
// portions, +1 portion sums, +2 the crossing bin): the first-level selection k (0 top-k, 1
// top-p) of select_bin_push; kXHdr + k: every block's candidate record to block 0, kXMsg + k:
// block 0's answer to the others, with the threshold and (fused totals) every block's kept mass
// (threshold_cluster).
constexpr int kXMax = 0;
constexpr int kXSel = 1;
constexpr int kXHdr = kXSel + 6;
constexpr int kXMsg = kXHdr + 2;
constexpr int kXchgs = kXMsg + 2;
// Where the pushes land: the receiver's `part` (free at both points: before the first select_bin,
// and after every block's last select_bin of the row), as u64 words.
constexpr int kXMaxAt = 0;                   // [2 * C): (key, min bits) of block c at 2c
constexpr int kXMsgAt = 2 * 16;              // [2 + C): status / threshold, key range, block c's kept mass at 2 + c

#ifndef FRAY_SAMPLE_EXTRA_BARRIERS
// 1 (default): cluster barriers where block 0's remote loads of the other blocks' candidate lists
// (gather_lists) are otherwise ordered only by the pushed exchanges (mbarrier phases), a chain
// compute-sanitizer's racecheck does not follow (it reported the lists' writes in
// compact_candidates against gather_lists' reads at decode_step 4 x 32000 on the H200,
// 2026-12-02): after each threshold's compaction, and between the top-k threshold and the top-p
// level. 0: without them (the emulator, cuda/sampling/emu, checks the exchanges' ordering).
#define FRAY_SAMPLE_EXTRA_BARRIERS 1
#endif

// Per-block scalars that live in shared memory (after the slice, histograms and candidates).
struct Misc {
  uint64_t scan[kWarps];   // block scans
  uint64_t red[kWarps];    // block reductions
  uint64_t part_total;     // this block's merged histogram portion (read by the cluster)
  uint64_t total_slot;     // this block's kept mass (read by the cluster)
  uint64_t sel_above;      // selection broadcast
  int sel_bin;
  uint32_t ncand;
  uint64_t above_total;    // this block's top-p mass in the bins above the threshold bin (pushed to block 0)
  uint64_t tot[kMaxCluster];  // block 0: every block's kept mass (fused totals, pushed to the cluster)
  uint64_t load_bar[kLoadChunks];  // the row load's bulk-copy barriers (one phase each)
  uint64_t xbar[kXchgs];           // the exchanges' mbarriers (one phase each)
  uint64_t xtot[kMaxCluster];      // select_bin_push: every block's portion sum (pushed)
  uint64_t xhdr[kMaxCluster][2];   // block 0: block c's (min key << 32 | max key), (count << 48 | above-bin mass) (pushed)
};

constexpr size_t kAuxBytes = sizeof(uint64_t) * kBins              // hist
                             + sizeof(uint64_t) * (kBins / 2)      // merged portion (clusters >= 2)
                             + sizeof(uint32_t) * kCandCap         // candidate keys
                             + sizeof(Misc);
// Two blocks of the largest 2-per-SM slice fit an SM's 228 KB (1 KB of it reserved per block).
static_assert(2 * (kSliceTargetBytes + static_cast<int64_t>(kAuxBytes) + 1024) <= 228 * 1024,
              "sample: two blocks per SM no longer fit");
// (the message stays below the smallest portion, kBins / 16: select_bin_push's staging)
static_assert(kXMsgAt + 2 + kMaxCluster <= kBins / kMaxCluster && kXMaxAt + 2 * kMaxCluster <= kXMsgAt,
              "sample: push slots");

// ---------------------------------------------------------------------------------------------
// Keys, weights, bins

// Order-preserving key: NaN (one canonical value) above +inf, -0.0 == +0.0; -inf is the
// smallest key any value gets (0x007fffff), so key 0 is below everything.
__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t b = __float_as_uint(x);
  if (x == 0.0f) b = 0u;
  if (x != x) b = 0x7fc00000u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

struct RowCtx {
  float lmax;   // the row's max (the argmax value)
  float mass_scale;  // first-level mass bins per nat
  float inv_t;  // 1 / temperature (fp32, as the Triton kernel)
  float min_p;
};

// w = exp((l - max) / T), the unnormalised probability (1 at the max).
__device__ __forceinline__ float weight_f(float l, const RowCtx& r) {
  return fast_exp2(((l - r.lmax) * r.inv_t) * kLog2e);
}

// t = (max - l) / T >= 0, the distance in nats, and w from it: weight_t(nat_dist(l)) is
// weight_f(l) bit for bit ((l - max) = -(max - l) exactly, and so are the products).
__device__ __forceinline__ float nat_dist(float l, const RowCtx& r) { return (r.lmax - l) * r.inv_t; }
__device__ __forceinline__ float weight_t(float t) { return fast_exp2((-t) * kLog2e); }

// The first-level mass bin of distance t: the row's span (max - min) / T over the 2048 bins, at
// least 128 per nat (the last bin then holds w < e^-16). A near-flat row spreads over all bins
// instead of a few dozen (fewer colliding atomics, fewer candidates in the threshold bin).
// u = t * scale rounded to the nearest integer by adding 2^23 (its low mantissa bits are then
// rint(u)), capped at 2047: an FADD and a LOP instead of a float-to-int conversion, which runs at
// a quarter of the FP32 rate as the ex2 and the fixed-point conversion beside it (694bbe8:
// top-p 256x152064 -13 us). Monotone non-increasing in l for u >= 0 (t >= 0 with T > 0); the
// mask keeps any u (negative from an invalid T, NaN: 2047) inside the histogram. The range pass's
// bin test is this same computation, so the two always agree.
__device__ __forceinline__ uint32_t mass_bin_u(float u) {
  return __float_as_uint(fminf(u, 2047.0f) + 8388608.0f) & 0x7ffu;
}
__device__ __forceinline__ int mass_bin(float t, const RowCtx& r) {
  return static_cast<int>(mass_bin_u(t * r.mass_scale));
}

// key(l) < thr as a float comparison (one instruction, no key): thr_value(thr) is the value of
// key thr; NaN l compares false (its key is the largest), and thr 0 (no filter) gives a NaN
// bound that every l passes. (A bound in the NaN keys, k NaNs in a row, passes every l instead
// of none: such rows have a NaN max, so every mass is 0 either way.)
__device__ __forceinline__ float thr_value(uint32_t thr) { return key_value(thr); }

// The fixed-point mass of w (0 for NaN).
__device__ __forceinline__ uint32_t to_fixed(float w) { return __float2uint_rn(w * kFixedOne); }

// Monotone non-increasing in l: bin 0 holds the max. NaN distances land in bin 0.
__device__ __forceinline__ int value_bin(float l, float lmax, float scale) {
  const int b = __float2int_rz((lmax - l) * scale);
  return min(max(b, 0), kBins - 1);
}

// ---------------------------------------------------------------------------------------------
// Warp / block / cluster helpers (whole block calls where noted)

__device__ __forceinline__ uint64_t warp_sum_u64(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ float warp_min_f(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t y = __shfl_xor_sync(kFull, v, o);
    v = y > v ? y : v;
  }
  return v;
}

__device__ __forceinline__ uint64_t warp_inclusive_scan_u64(uint64_t x) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t y = __shfl_up_sync(kFull, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// Whole block: exclusive prefix of v in thread order; `total` gets the block's sum. Leaves
// `scratch` free for the next call (trailing barrier).
__device__ __forceinline__ uint64_t block_exclusive_scan(uint64_t v, uint64_t* scratch, uint64_t& total) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const uint64_t incl = warp_inclusive_scan_u64(v);
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  uint64_t before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const uint64_t t = scratch[w];
    if (w < warp) before += t;
    total += t;
  }
  __syncthreads();
  return before + incl - v;
}

// 64-bit add to bin b of a histogram kept as (lo, hi) 32-bit words: shared-memory 64-bit and
// float atomics are CAS loops on sm_90 (ATOMS.CAST.SPIN), 32-bit integer adds are native.
// The carry goes to the high word; the final pair is the exact sum in any order.
__device__ __forceinline__ void hist_add(uint32_t* h32, int b, uint64_t v) {
  const uint32_t lo = static_cast<uint32_t>(v);
  const uint32_t old = atomicAdd(h32 + 2 * b, lo);
  const uint32_t carry = (old + lo < old) ? 1u : 0u;
  const uint32_t hi = static_cast<uint32_t>(v >> 32) + carry;
  if (hi) atomicAdd(h32 + 2 * b + 1, hi);
}

__device__ __forceinline__ uint64_t mass_target(float p, uint64_t total) {
  // keep l iff mass above l < p * S  <=>  mass above < ceil(p * S) (integer masses; exact in
  // double below 2^53). At least 1, so the max is always kept.
  const double t = ceil(static_cast<double>(p) * static_cast<double>(total));
  return t < 1.0 ? 1ull : static_cast<uint64_t>(t);
}

struct Selection {
  int bin;
  uint64_t above;  // sum of the bins before `bin`
  uint64_t total;  // sum of all bins
  uint64_t tgt;    // the target used
};

// Warp-uniform: lane c of the warp holds portion c's sum t (0 in lanes >= C). The total, the
// target (with p >= 0: mass_target(p, total)), the first portion whose inclusive prefix reaches
// it (none: the last) and the sum of the portions before that one.
struct Crossing {
  uint64_t total, tgt, above;
  int owner;
};
__device__ __forceinline__ Crossing crossing_portion(uint64_t t, int C, uint64_t tgt, float p) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  Crossing x;
  const uint64_t incl = warp_inclusive_scan_u64(t);
  x.total = __shfl_sync(kFull, incl, 31);
  x.tgt = p >= 0.0f ? mass_target(p, x.total) : tgt;
  const unsigned hit = __ballot_sync(kFull, lane < C && incl >= x.tgt);
  x.owner = hit ? __ffs(hit) - 1 : C - 1;
  x.above = __shfl_sync(kFull, incl - t, x.owner);
  return x;
}

// Whole block, the last step of a selection: the bin (base + j) of the P bins src[0, P) (a
// portion starting at bin `base` whose bins before it sum to above0) where the inclusive prefix
// reaches tgt. `whole`: src is the whole histogram, whose sum is the total (and, with p >= 0,
// tgt = mass_target(p, total)).
__device__ __forceinline__ Selection select_in_portion(const uint64_t* src, int P, int base, uint64_t above0,
                                                       uint64_t total, uint64_t tgt, float p, Misc* m, bool whole) {
  const int tid = static_cast<int>(threadIdx.x);
  const int ipt = (P + kThreads - 1) / kThreads;  // 1..4 bins per thread
  uint64_t v[4];
  uint64_t tsum = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int j = tid * ipt + i;
    v[i] = (i < ipt && j < P) ? src[j] : 0ull;
    tsum += v[i];
  }
  if (tid == 0) {  // only when the target exceeds the total (no mass at all): the last bin
    m->sel_bin = kBins - 1;
    m->sel_above = 0;
  }
  uint64_t btotal;
  const uint64_t excl = block_exclusive_scan(tsum, m->scan, btotal);
  if (whole) {
    total = btotal;
    if (p >= 0.0f) tgt = mass_target(p, total);
  }
  const uint64_t start = above0 + excl;
  if (start < tgt && start + tsum >= tgt) {  // exactly one thread
    uint64_t acc = start;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (i < ipt) {
        if (acc + v[i] >= tgt) {
          m->sel_bin = base + tid * ipt + i;
          m->sel_above = acc;
          break;
        }
        acc += v[i];
      }
    }
  }
  __syncthreads();
  return Selection{m->sel_bin, m->sel_above, total, tgt};
}

// Whole cluster: merges every block's `hist` and returns the first bin (in ascending order,
// i.e. from the top of the row) whose inclusive prefix sum reaches tgt; with p >= 0 the target
// is mass_target(p, total) instead. Same answer in every block.
//
// Two cluster barriers: after A every histogram is complete and block r sums bin slice r of
// all of them into its `part`; after B every block reads the C slice totals, finds the slice
// holding the crossing and scans that slice (remote). `hist` may be rewritten after return;
// `part` only after the next call's barrier A.
static __device__ __noinline__ Selection select_bin(uint64_t* hist, uint64_t* part, uint64_t tgt, float p, Misc* m,
                                             int C, int rank) {
  const cg::cluster_group cluster = cg::this_cluster();
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  if (C > 1) {
    cluster.sync();  // A
  } else {
    __syncthreads();  // (C == 1: also block 0 refining a gathered candidate list alone)
  }
  const uint64_t* src = hist;
  int P = kBins;
  int base = 0;
  uint64_t above0 = 0;
  uint64_t total = 0;
  if (C > 1) {
    P = kBins / C;
    uint64_t mine = 0;
    for (int j = tid; j < P; j += kThreads) {
      uint64_t acc = 0;
#pragma unroll 4
      for (int c = 0; c < C; ++c) acc += cluster.map_shared_rank(hist, c)[rank * P + j];  // 4 remote loads in flight
      part[j] = acc;
      mine += acc;
    }
    uint64_t portion;
    (void)block_exclusive_scan(mine, m->scan, portion);
    if (tid == 0) m->part_total = portion;
    cluster.sync();  // B
    const Crossing x = crossing_portion(lane < C ? *cluster.map_shared_rank(&m->part_total, lane) : 0ull, C, tgt, p);
    total = x.total;
    tgt = x.tgt;
    above0 = x.above;
    src = cluster.map_shared_rank(part, x.owner);
    base = x.owner * P;
  }
  return select_in_portion(src, P, base, above0, total, tgt, p, m, C == 1);
}

// A cluster barrier arrive without release semantics (no fence): for barriers that publish nothing.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

// Pushed exchanges (kXMax, kXSel, kXHdr, kXMsg). One thread per block initialises the mbarriers (count 1: the
// receiver's own arrive with the expected bytes); the cluster barrier that follows publishes the
// inits before any push.
__device__ __forceinline__ void xchg_init(uint64_t* bars) {
  for (int i = 0; i < kXchgs; ++i) mbar_init(&bars[i], 1);
  mbar_init_fence();
}

// The receiver's one arrive on `bar`: `bytes` are still to land (before or after this call).
__device__ __forceinline__ void xchg_expect(uint64_t* bar, uint32_t bytes) {
  mbar_arrive_expect_tx(bar, bytes);
}

// v into block `rank`'s copy of *slot, completing 8 bytes on its copy of *bar (both local
// shared-memory addresses, mapped to the receiver).
__device__ __forceinline__ void xchg_push(uint64_t* slot, uint64_t v, uint64_t* bar, int rank) {
  uint32_t rs, rb;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rs) : "r"(smem_u32(slot)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(smem_u32(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u64 [%0], %1, [%2];" ::"r"(rs), "l"(v), "r"(rb)
               : "memory");
}

// Until every byte expected on `bar` (this row's phase) has landed; the data is then visible.
// Cluster-scope acquire: the senders' own shared-memory writes before their push (a block's
// candidate list, which block 0 then reads remotely) are ordered before what follows the wait.
__device__ __forceinline__ void xchg_wait(uint64_t* bar) {
  while (!mbar_try_wait_cluster(bar, 0)) {
  }
}

// Whole cluster (C >= 2): select_bin's answer for the first-level selection k (0 top-k, 1 top-p)
// with pushed exchanges instead of cluster barriers and remote loads (its own mbarriers, kXSel +
// 3k): (1) block b pushes its bins of every other block c's portion (P = kBins / C bins) into
// c's staging, part[P, C P) (running on into `cand`: sender b at slot b, or b - 1 past c); (2)
// block c merges its portion into part[0, P) and pushes the portion's sum to every block
// (m->xtot); (3) every block finds the portion holding the crossing, whose owner scans it and
// pushes the bin and the sum above it to the others. The same sums as select_bin: the same bin. `hist`
// is left intact (the top-p above-bin sums read it); part and cand are overwritten. The kernel
// keeps every block's part / cand free of remote readers and of other pushes from a cluster
// barrier before the call until every block has returned (see the kernel's first levels).
static __device__ __noinline__ Selection select_bin_push(const uint64_t* hist, uint64_t* part, uint64_t tgt, float p,
                                                         Misc* m, int C, int rank, int k) {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int P = kBins / C;
  uint64_t* const bar_raw = &m->xbar[kXSel + 3 * k];
  uint64_t* const bar_sum = bar_raw + 1;
  uint64_t* const bar_por = bar_raw + 2;
  uint64_t* const sums = m->xtot;  // (a block pushes a second call's sums only after every block left the first)
  if (tid == 0) {
    xchg_expect(bar_raw, static_cast<uint32_t>(8 * (C - 1) * P));
    xchg_expect(bar_sum, static_cast<uint32_t>(8 * C));
  }
  __syncthreads();  // this block's histogram is complete
  // (1) slot s of the others (s < rank: block s, else s + 1); this block lands in their slot
  // rank (past them) or rank - 1.
  for (int i = tid; i < (C - 1) * P; i += kThreads) {
    const int s = i / P;
    const int j = i - s * P;
    const int c = s < rank ? s : s + 1;
    const int at = rank < c ? rank : rank - 1;
    xchg_push(&part[P + at * P + j], hist[c * P + j], bar_raw, c);
  }
  xchg_wait(bar_raw);
  // (2)
  uint64_t mine = 0;
  for (int j = tid; j < P; j += kThreads) {
    uint64_t acc = hist[rank * P + j];
    for (int s = 0; s < C - 1; ++s) acc += part[P + s * P + j];
    part[j] = acc;
    mine += acc;
  }
  uint64_t portion;
  (void)block_exclusive_scan(mine, m->scan, portion);  // (its barriers: part[0, P) complete)
  if (tid < C) xchg_push(&sums[rank], portion, bar_sum, tid);
  xchg_wait(bar_sum);
  const Crossing x = crossing_portion(lane < C ? sums[lane] : 0ull, C, tgt, p);
  const uint64_t total = x.total;
  tgt = x.tgt;
  const int owner = x.owner;
  const uint64_t above0 = x.above;
  // (3) the owner scans its portion and pushes the bin and the sum above it (2 words) into the
  // others' staging, free: every block has merged (it pushed its sum after that).
  if (owner == rank) {
    const Selection sel = select_in_portion(part, P, owner * P, above0, total, tgt, p, m, false);
    if (tid < 2 * (C - 1)) {
      const int c = tid >> 1;
      xchg_push(&part[P + (tid & 1)], (tid & 1) ? sel.above : static_cast<uint64_t>(sel.bin), bar_por,
                c < rank ? c : c + 1);
    }
    return sel;
  }
  if (tid == 0) xchg_expect(bar_por, 16u);
  xchg_wait(bar_por);
  const Selection sel{static_cast<int>(part[P]), part[P + 1], total, tgt};
  // The wait orders only this thread: at C = 2, part[P, P + 2) is cand[0, 4), which the next
  // phase (compact_candidates) writes, so a warp past the wait could overwrite the pushed pair
  // before a slower warp has read it (racecheck at 64 x 30000, bundle at da8da65: WAR between
  // this read and compact_candidates' store). One barrier per row and level, on the blocks
  // that do not own the crossing portion.
  __syncthreads();
  return sel;
}

// Whole block: min and max of (kmin, kmax) over the block, in every thread. sum_above: thread 1
// also sums the per-warp masses in m->scan into m->above_total, between the two barriers (the
// first publishes them, the second keeps the next block scan's writes to m->scan after the read).
// ncand (if given): m->ncand in every thread, read between the barriers too, so that thread 0's
// next reset of it (the next level's `m->ncand = 0`, with no block barrier before it on the
// exchange path) follows every read (racecheck at 4 x 32000 and 1 x 262144, bundle at da8da65).
__device__ __forceinline__ void block_minmax(uint32_t& kmin, uint32_t& kmax, Misc* m, bool sum_above = false,
                                             uint32_t* ncand = nullptr) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  kmin = __reduce_min_sync(kFull, kmin);
  kmax = __reduce_max_sync(kFull, kmax);
  if (lane == 0) m->red[warp] = (static_cast<uint64_t>(kmin) << 32) | kmax;
  __syncthreads();
  const uint64_t r = lane < kWarps ? m->red[lane] : 0xffffffff00000000ull;
  kmin = __reduce_min_sync(kFull, static_cast<uint32_t>(r >> 32));
  kmax = __reduce_max_sync(kFull, static_cast<uint32_t>(r));
  if (sum_above && threadIdx.x == 1) {
    uint64_t sum = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += m->scan[w];
    m->above_total = sum;  // (also read by the draw's shortcut, after later barriers)
  }
  if (ncand) *ncand = m->ncand;
  __syncthreads();  // m->red (and m->scan, m->ncand) are read before their next use
}

// ---------------------------------------------------------------------------------------------
// The slice in shared memory: nv 16-byte vectors (the tail padded with -inf, which behaves as
// a -inf logit at an index past the row: never the argmax over a real element, mass 0).

template <typename T>
struct Vec {
  static constexpr int N = 16 / static_cast<int>(sizeof(T));
};

template <typename T>
__device__ __forceinline__ void load_smem_vec(const T* data, int v, float (&f)[Vec<T>::N]) {
  AlignedVec<T, Vec<T>::N> a;
  *reinterpret_cast<uint4*>(a.val) = reinterpret_cast<const uint4*>(data)[v];
  vec_to_float(a, f);
}

// Vector v of the slice, or -inf in every element past its end (nv vectors): mass 0, never a
// candidate, never the argmax over a real element.
template <typename T>
__device__ __forceinline__ void load_smem_vec_or_pad(const T* data, int v, int nv, float (&f)[Vec<T>::N]) {
  if (v < nv) {
    load_smem_vec(data, v, f);
  } else {
#pragma unroll
    for (int e = 0; e < Vec<T>::N; ++e) f[e] = __uint_as_float(0xff800000u);
  }
}

// f(x, key_ok) over every element of the slice; lanes of a warp iterate together (the ballot
// passes need that), `ok` is false for lanes past the end.
template <typename T, class F>
__device__ __forceinline__ void for_each_element(const T* data, int nv, F&& f) {
  constexpr int N = Vec<T>::N;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int base = static_cast<int>(threadIdx.x) & ~31; base < nv; base += kThreads) {
    const int v = base + lane;
    float x[N];
    load_smem_vec_or_pad(data, v, nv, x);
#pragma unroll
    for (int e = 0; e < N; ++e) f(x[e], v < nv);
  }
}

// Whole block: this block's candidates (pred) of the selected first-level bin: their key range
// [kmin, kmax] (empty: kmin > kmax) and their keys compacted into `cand`, ncand (= m->ncand) of
// them (the keys past kCandCap are dropped: overflow, then the refinement re-reads the slice).
template <typename T, class Pred>
__device__ __forceinline__ void compact_candidates(const T* data, int nv, Pred pred, uint32_t* cand, Misc* m,
                                                   uint32_t& kmin, uint32_t& kmax, uint32_t& ncand,
                                                   bool sum_above = false) {
  constexpr int N = Vec<T>::N;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  uint32_t lo = 0xffffffffu;
  uint32_t hi = 0u;
  // One vote per vector and warp: most vectors hold no candidate.
  for (int base = static_cast<int>(threadIdx.x) & ~31; base < nv; base += kThreads) {
    const int v = base + lane;
    float x[N];
    unsigned cm = 0;
    if (v < nv) {
      load_smem_vec(data, v, x);
#pragma unroll
      for (int e = 0; e < N; ++e) cm |= pred(x[e]) ? 1u << e : 0u;
    }
    if (!__any_sync(kFull, cm != 0u)) continue;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const bool c = (cm >> e) & 1u;
      uint32_t key = 0;
      if (c) {
        key = order_key(x[e]);
        lo = min(lo, key);
        hi = max(hi, key);
      }
      const unsigned mask = __ballot_sync(kFull, c);
      if (mask) {
        uint32_t pos0 = 0;
        if (lane == 0) pos0 = atomicAdd(&m->ncand, static_cast<uint32_t>(__popc(mask)));
        pos0 = __shfl_sync(kFull, pos0, 0);
        if (c) {
          const uint32_t pos = pos0 + static_cast<uint32_t>(__popc(mask & ((1u << lane) - 1u)));
          if (pos < kCandCap) cand[pos] = key;
        }
      }
    }
  }
  block_minmax(lo, hi, m, sum_above, &ncand);  // its barriers also complete cand / ncand
  kmin = lo;
  kmax = hi;
}

// Whole cluster: the exact threshold key inside [lo, hi] holding the tgt-th unit (count or
// fixed-point mass, from the top) of the candidates: 11-bit digits of (hi - key), at most 3
// levels. The candidates are this block's compacted keys, or (overflow) the slice elements
// satisfying pred.
template <bool kMass, typename T, class Pred>
__device__ __forceinline__ uint32_t refine(uint32_t lo, uint32_t hi, uint64_t tgt, const T* data, int nv, Pred pred,
                                           const uint32_t* cand, uint32_t ncand, const RowCtx& r, uint64_t* hist,
                                           uint64_t* part, Misc* m, int C, int rank) {
  constexpr int N = Vec<T>::N;
  const int tid = static_cast<int>(threadIdx.x);
  uint32_t* h32 = reinterpret_cast<uint32_t*>(hist);
  const bool overflow = ncand > static_cast<uint32_t>(kCandCap);
  // Block-local list (C == 1): one level of 2048 bins linear in the candidates' distance from the
  // max first. Key digits need two or three levels for a bin's worth of values (more near 0,
  // where the keys are dense); ~300 candidates over 2048 value bins leave the crossing bin with one
  // distinct key, and its candidates' exact key range then ends the refinement (or bounds it). The
  // bins are monotone non-increasing in the value, so bins before the crossing hold exactly the
  // keys above the range.
  const float x_hi = key_value(hi);
  const float t0 = nat_dist(x_hi, r);
  const float vspan = nat_dist(key_value(lo), r) - t0;
  if (kValueLevel && !overflow && C == 1 && lo < hi && vspan > 0.0f && vspan < __uint_as_float(0x7f800000u)) {
    const float sc = static_cast<float>(kBins - 1) / vspan;
    for (int i = tid; i < kBins; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int i = tid; i < static_cast<int>(ncand); i += kThreads) {
      const uint32_t key = cand[i];
      if (key < lo || key > hi) continue;
      const float x = key_value(key);
      const int d = static_cast<int>(mass_bin_u((nat_dist(x, r) - t0) * sc));
      if constexpr (kMass) {
        const uint32_t w = to_fixed(weight_f(x, r));
        if (w) hist_add(h32, d, w);
      } else {
        atomicAdd(h32 + 2 * d, 1u);
      }
    }
    const Selection s = select_bin(hist, part, tgt, -1.0f, m, C, rank);
    uint32_t lo2 = 0xffffffffu;
    uint32_t hi2 = 0u;
    for (int i = tid; i < static_cast<int>(ncand); i += kThreads) {
      const uint32_t key = cand[i];
      if (key < lo || key > hi) continue;
      if (static_cast<int>(mass_bin_u((nat_dist(key_value(key), r) - t0) * sc)) == s.bin) {
        lo2 = min(lo2, key);
        hi2 = max(hi2, key);
      }
    }
    lo2 = __reduce_min_sync(kFull, lo2);
    hi2 = __reduce_max_sync(kFull, hi2);
    const int lane = tid & 31;
    if (lane == 0) m->red[tid >> 5] = (static_cast<uint64_t>(lo2) << 32) | hi2;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const uint64_t e = m->red[w];
      lo2 = min(lo2, static_cast<uint32_t>(e >> 32));
      hi2 = max(hi2, static_cast<uint32_t>(e));
    }
    __syncthreads();  // m->red is read before its next use
    if (lo2 <= hi2) {
      tgt -= s.above;
      lo = lo2;
      hi = hi2;
    }
  }
  while (lo < hi) {
    const int bits = 32 - __clz(static_cast<int>(hi - lo));
    const int shift = bits > kDigitBits ? bits - kDigitBits : 0;
    for (int i = tid; i < kBins; i += kThreads) hist[i] = 0;
    __syncthreads();
    const uint32_t clo = lo;
    const uint32_t chi = hi;
    auto add = [&](uint32_t key, float x) {
      if (key < clo || key > chi) return;
      const int d = static_cast<int>((chi - key) >> shift);
      if constexpr (kMass) {
        const uint32_t w = to_fixed(weight_f(x, r));
        if (w) hist_add(h32, d, w);
      } else {
        atomicAdd(h32 + 2 * d, 1u);
      }
    };
    if (!overflow) {
      for (int i = tid; i < static_cast<int>(ncand); i += kThreads) {
        const uint32_t key = cand[i];
        add(key, key_value(key));
      }
    } else {
      for (int v = tid; v < nv; v += kThreads) {
        float x[N];
        load_smem_vec(data, v, x);
#pragma unroll
        for (int e = 0; e < N; ++e) {
          if (pred(x[e])) add(order_key(x[e]), x[e]);
        }
      }
    }
    const Selection s = select_bin(hist, part, tgt, -1.0f, m, C, rank);
    tgt -= s.above;
    const int64_t nhi = static_cast<int64_t>(hi) - (static_cast<int64_t>(s.bin) << shift);
    hi = nhi < static_cast<int64_t>(lo) ? lo : static_cast<uint32_t>(nhi);
    const uint32_t span = (1u << shift) - 1u;
    lo = hi - lo > span ? hi - span : lo;
  }
  return lo;
}

// Whole cluster, after the barrier that published every block's list count (m->ncand): lane c
// of every warp holds block c's count cnt and the inclusive prefix incl of the counts (each
// clamped to `clamp`, so that the sum cannot wrap); total is the clamped sum, over is set when
// some block's count exceeds each_cap (its list did not fit).
struct ListCounts {
  uint32_t cnt, incl, total;
  bool over;
};
// cnt: lane c's count (0 in lanes >= C).
__device__ __forceinline__ ListCounts list_counts_of(uint32_t cnt, uint32_t clamp, uint32_t each_cap) {
  ListCounts k;
  k.cnt = cnt;
  k.incl = static_cast<uint32_t>(warp_inclusive_scan_u64(min(k.cnt, clamp)));
  k.total = __shfl_sync(kFull, k.incl, 31);
  k.over = __any_sync(kFull, k.cnt > each_cap);
  return k;
}
__device__ __forceinline__ ListCounts list_counts(Misc* m, int C, uint32_t clamp, uint32_t each_cap) {
  const cg::cluster_group cluster = cg::this_cluster();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  return list_counts_of(lane < C ? *cluster.map_shared_rank(&m->ncand, lane) : 0u, clamp, each_cap);
}

// The block c >= c0 whose list holds slot j of the concatenated lists, and that list's first slot
// (off); lane b of every warp holds block b's inclusive prefix incl of the counts, list c0 starts
// at `start`. Shuffles: call in uniform control flow.
__device__ __forceinline__ int list_owner(uint32_t j, uint32_t incl, uint32_t start, int c0, int C, uint32_t& off) {
  int c = c0;
  off = start;
  for (int b = c0; b < C - 1; ++b) {
    const uint32_t ib = __shfl_sync(kFull, incl, b);
    if (j >= ib) {
      c = b + 1;
      off = ib;
    }
  }
  return c;
}

// Block 0, whole block: appends the lists of blocks c0..C-1 (block c's `list` in its shared
// memory, cnt entries; lane c of every warp holds block c's cnt and the inclusive prefix incl
// of the counts) to dst at their prefix offsets, in block order.
template <typename E>
__device__ __forceinline__ void gather_lists(E* dst, const E* list, uint32_t cnt, uint32_t incl, int c0, int C) {
  // One output slot per thread, all remote loads in flight at once (a loop over the blocks paid
  // one distributed-shared-memory round trip per block). Uniform loop: list_owner shuffles.
  const cg::cluster_group cluster = cg::this_cluster();
  const uint32_t start = __shfl_sync(kFull, incl - cnt, c0);
  const uint32_t end = __shfl_sync(kFull, incl, C - 1);
  for (uint32_t base = start; base < end; base += kThreads) {
    const uint32_t j = base + threadIdx.x;
    uint32_t off;
    const int c = list_owner(j, incl, start, c0, C, off);
    if (j < end) dst[j] = cluster.map_shared_rank(list, c)[j - off];
  }
}

// Whole cluster: the threshold key of a filter (0: no candidate anywhere) from the candidates
// of the selected first-level bin (pred), holding the tgt-th unit (count or fixed-point mass,
// from the top) of them. Every block compacts its candidates and pushes its record (key range,
// count, above-bin mass) to block 0 (kXHdr + k). When every list fits one (<= kCandCap
// together), block 0 copies them behind its own and refines alone with block-local histograms
// (no cluster barriers per digit level); with want_totals it also sums every block's kept mass
// (its bins above the threshold bin, from its record, plus its candidates at or above the
// threshold, which block 0 holds at the block's prefix range of the gathered list). It pushes
// the outcome to the others (kXMsg + k): the threshold or "refine together", the cluster's key
// range and the totals; its remote loads of their lists are done by then. Otherwise every block
// refines together (cluster barriers). Same candidates, same integers: the same threshold. With
// `fused` set on return (want_totals and the list path), lane c of every warp holds block c's
// kept mass in tot_lane.
template <bool kMass, typename T, class Pred>
__device__ __forceinline__ uint32_t threshold_cluster(uint64_t tgt, const T* data, int nv, Pred pred, uint32_t* cand,
                                                      const RowCtx& r, uint64_t* hist, uint64_t* part, Misc* m,
                                                      int C, int rank, int k, bool want_totals, bool& fused,
                                                      uint64_t& tot_lane) {
  const cg::cluster_group cluster = cg::this_cluster();
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  fused = false;
  tot_lane = 0;
  uint32_t lo, hi;
  // (k == 1, want_totals: block_minmax's barriers bracket the sum of the top-p caller's per-warp
  // masses in m->scan; read after them, in thread 1, the draw's block scan overwrote m->scan
  // ordered only through the exchanges' mbarriers: racecheck's block_exclusive_scan vs
  // threshold_cluster hazard)
  uint32_t ncand;
  compact_candidates(data, nv, pred, cand, m, lo, hi, ncand, k == 1 && want_totals);
#if FRAY_SAMPLE_EXTRA_BARRIERS
  // Every block's list is complete before block 0 may read it remotely (gather_lists). The push
  // below already orders it (the senders' complete_tx releases at cluster scope, xchg_wait
  // acquires at cluster scope), which racecheck does not model: it reported the lists' writes
  // against gather_lists' reads at decode_step 4 x 32000 (H200, 2026-12-02). A full barrier: split
  // (arrive here, wait after the header exchange; 69f02e0) it saved the 3-4% this one costs
  // sample_topp at 64 x 131072 and 256 x 152064, but compute-sanitizer's racecheck then never
  // finished a sampling case at C >= 2 (decode_step 4 x 32000 and every sample case from 3 x 8192
  // up ran past 240 s at 87c273e, H200, 2026-12-03, where they took 7-15 s with this barrier), and
  // a kernel racecheck cannot finish is not one the sanitizer sweep verifies.
  if (C > 1) cluster.sync();
#endif
  uint64_t* const bar_hdr = &m->xbar[kXHdr + k];
  uint64_t* const bar_msg = &m->xbar[kXMsg + k];
  const int words = want_totals ? 2 + C : 2;
  // The record: the count clamped to kCandCap + 1 (12 bits) over the above-bin mass (< 2^48: at
  // most 98304 elements of mass <= 2^31), which the top-p caller left per warp in m->scan.
  if (tid < 2) {
    const uint64_t v = tid == 0 ? (static_cast<uint64_t>(lo) << 32) | hi
                                : (static_cast<uint64_t>(min(ncand, static_cast<uint32_t>(kCandCap) + 1u)) << 48) |
                                      (m->above_total & ((1ull << 48) - 1));
    if (C == 1) {
      m->xhdr[0][tid] = v;  // no peer to push to (see the kernel's kXMax exchange)
    } else {
      xchg_push(&m->xhdr[rank][tid], v, bar_hdr, 0);
    }
  }
  uint64_t status;  // the threshold, or kRefineTogether
  uint64_t range;   // (min key << 32) | max key over the cluster
  constexpr uint64_t kRefineTogether = 1ull << 63;
  if (rank == 0) {
    if (C == 1) {
      __syncthreads();
    } else {
      if (tid == 0) xchg_expect(bar_hdr, static_cast<uint32_t>(16 * C));
      xchg_wait(bar_hdr);
    }
    const uint64_t h = lane < C ? m->xhdr[lane][0] : 0xffffffff00000000ull;
    const uint64_t h1 = lane < C ? m->xhdr[lane][1] : 0ull;
    const uint32_t cnt = static_cast<uint32_t>(h1 >> 48);
    const uint64_t above = h1 & ((1ull << 48) - 1);
    const uint32_t kmin = __reduce_min_sync(kFull, static_cast<uint32_t>(h >> 32));
    const uint32_t kmax = __reduce_max_sync(kFull, static_cast<uint32_t>(h));
    range = (static_cast<uint64_t>(kmin) << 32) | kmax;
    const ListCounts kc = list_counts_of(cnt, static_cast<uint32_t>(kCandCap) + 1u, static_cast<uint32_t>(kCandCap));
    status = 0;
    if (kmin <= kmax) {
      if (kc.over || kc.total > static_cast<uint32_t>(kCandCap)) {
        status = kRefineTogether;
      } else {
        // Its remote loads of the others' lists are complete before any of them writes its list
        // again (compact_candidates of the top-p threshold, select_bin_push's staging that runs
        // into cand): their values are in block 0's cand before the __syncthreads below, and
        // every later write to a block's cand follows, in that block, a wait on an mbarrier
        // phase that needs a push block 0 issues after it (kXMsg + k to the others now, or
        // kXSel + 3 of the top-p selection), and st.async completes its bytes with release
        // semantics at cluster scope. racecheck does not follow that chain and reports gather_lists
        // vs compact_candidates (70 x 131072 top-k past kSurvMax + top-p; decode_step 4 x 32000);
        // FRAY_SAMPLE_EXTRA_BARRIERS (on by default) adds the cluster barrier that makes it explicit.
        gather_lists(cand, cand, kc.cnt, kc.incl, 1, C);  // its own list already leads
        __syncthreads();
        const uint32_t thr = refine<kMass>(kmin, kmax, tgt, data, nv, pred, cand, kc.total, r, hist, part, m, 1, 0);
        status = thr;
        if (want_totals) {
          // Summed per block in (lo, hi) words of `hist`.
          uint32_t* h32 = reinterpret_cast<uint32_t*>(hist);
          if (tid < 2 * kMaxCluster) h32[tid] = 0u;
          __syncthreads();
          for (uint32_t base = 0; base < kc.total; base += kThreads) {
            const uint32_t j = base + static_cast<uint32_t>(tid);
            uint32_t off;
            const int c = list_owner(j, kc.incl, 0u, 0, C, off);
            if (j < kc.total) {
              const uint32_t key = cand[j];
              const uint32_t w = key >= thr ? to_fixed(weight_f(key_value(key), r)) : 0u;
              if (w) hist_add(h32, c, w);
            }
          }
          __syncthreads();
          if (tid < C) m->tot[tid] = hist[tid] + above;  // tid < C: lane tid of warp 0
          __syncthreads();
          fused = true;
          tot_lane = lane < C ? m->tot[lane] : 0ull;
        }
      }
    }
    for (int i = tid; i < (C - 1) * words; i += kThreads) {
      const int c = 1 + i / words;
      const int e = i - (c - 1) * words;
      const uint64_t v = e == 0 ? status : e == 1 ? range : fused ? m->tot[e - 2] : 0ull;
      xchg_push(&part[kXMsgAt + e], v, bar_msg, c);
    }
  } else {
    if (tid == 0) xchg_expect(bar_msg, static_cast<uint32_t>(8 * words));
    xchg_wait(bar_msg);
    status = part[kXMsgAt];
    range = part[kXMsgAt + 1];
    fused = want_totals && static_cast<uint32_t>(range >> 32) <= static_cast<uint32_t>(range) &&
            status != kRefineTogether;
    if (fused) tot_lane = lane < C ? part[kXMsgAt + 2 + lane] : 0ull;
  }
  if (status != kRefineTogether) return static_cast<uint32_t>(status);
  const uint32_t thr = refine<kMass>(static_cast<uint32_t>(range >> 32), static_cast<uint32_t>(range), tgt, data, nv,
                                     pred, cand, ncand, r, hist, part, m, C, rank);
  // Its last select_bin's remote loads are done in every block before any block pushes into
  // part / cand again (select_bin_push).
  cluster.sync();
  return thr;
}

// Whole block: sorts s[0, n) in decreasing order (n a power of two).
__device__ __forceinline__ void block_sort_desc(uint64_t* s, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = static_cast<int>(threadIdx.x); t < n / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        const uint64_t x = s[i];
        const uint64_t y = s[j];
        if ((x < y) == ((i & size) == 0)) {
          s[i] = y;
          s[j] = x;
        }
      }
      __syncthreads();
    }
  }
}

// Whole block (the cluster's first): the row's draw over its n <= kSurvMax top-k survivors,
// held in surv[0, n) as (key << 32) | index. The same integers as the cluster-wide path: the
// fixed-point masses of the survivors, the top-p threshold = the largest key whose inclusive
// mass from the top reaches mass_target(p, S), kept = key >= that and w >= min_p, and the draw
// over the kept masses in index order. Returns in m->sel_above: the token, or ~0 when no mass
// is kept (the caller takes the greedy token); m->scan / m->red are used.
__device__ __forceinline__ void draw_survivors(uint64_t* surv, int n, float top_p, const RowCtx& r,
                                               uint64_t draw, uint64_t& total_out, Misc* m) {
  const int tid = static_cast<int>(threadIdx.x);
  int np = 1;
  while (np < n) np <<= 1;
  for (int i = n + tid; i < np; i += kThreads) surv[i] = 0ull;  // below every survivor
  __syncthreads();
  block_sort_desc(surv, np);  // decreasing key
  constexpr int kPer = kSurvMax / kThreads;
  static_assert(kPer * kThreads == kSurvMax, "draw_survivors: kSurvMax / kThreads entries per thread");
  uint32_t mass[kPer];
  uint64_t tsum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = tid * kPer + j;
    mass[j] = i < n ? to_fixed(weight_f(key_value(static_cast<uint32_t>(surv[i] >> 32)), r)) : 0u;
    tsum += mass[j];
  }
  uint64_t S;
  const uint64_t excl = block_exclusive_scan(tsum, m->scan, S);
  uint32_t thr_p = 0;
  if (top_p < 1.0f && S > 0) {
    const uint64_t tgt = mass_target(top_p, S);  // 1 <= tgt <= S: exactly one crossing
    uint64_t acc = excl;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (acc < tgt && acc + mass[j] >= tgt) m->sel_above = surv[tid * kPer + j] >> 32;
      acc += mass[j];
    }
    __syncthreads();
    thr_p = static_cast<uint32_t>(m->sel_above);
  }
  // Kept masses, re-keyed by increasing index: (~index << 32) | mass sorts decreasing.
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = tid * kPer + j;
    if (i < n) {
      const uint64_t e = surv[i];
      const uint32_t key = static_cast<uint32_t>(e >> 32);
      const float w = weight_f(key_value(key), r);
      const uint32_t km = key >= thr_p && w >= r.min_p ? mass[j] : 0u;
      surv[i] = (static_cast<uint64_t>(~static_cast<uint32_t>(e)) << 32) | km;
    }
  }
  __syncthreads();
  block_sort_desc(surv, np);  // increasing index (padding, 0, last)
  tsum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = tid * kPer + j;
    mass[j] = i < n ? static_cast<uint32_t>(surv[i]) : 0u;
    tsum += mass[j];
  }
  uint64_t total;
  const uint64_t before = block_exclusive_scan(tsum, m->scan, total);
  total_out = total;
  if (tid == 0) m->sel_above = ~0ull;
  __syncthreads();
  if (total > 0) {
    const uint64_t target = (__umul64hi(total, draw) << 40) | ((total * draw) >> 24);  // as the final pass
    uint64_t c = before;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (c <= target && target < c + mass[j]) m->sel_above = ~static_cast<uint32_t>(surv[tid * kPer + j] >> 32);
      c += mass[j];
    }
  }
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// The row load (16-byte aligned rows): thread 0 issues the slice's `full` vectors as bulk copies
// (after it, the caller's __syncthreads publishes the initialised barriers); every thread waits
// on chunk k before reading it.
__device__ __forceinline__ void slice_load_issue(void* dst, const void* src, int full, uint64_t* bars) {
  bulk_load_chunks(dst, src, full, kLoadChunkVecs, bars);
}

__device__ __forceinline__ void slice_chunk_wait(uint64_t* bars, int k) {
  mbar_wait(&bars[k], 0);
}

// ---------------------------------------------------------------------------------------------
// The kernel: one cluster of C blocks per row; block r holds elements [r * slice, (r + 1) *
// slice) of the row in shared memory (read from HBM once). Every decision is made identically
// in every block from cluster-merged exact integer histograms, so all blocks follow the same
// path (same barriers).

template <typename T>
__global__ void __launch_bounds__(kThreads, 2) sample_kernel(const SampleArgs a) {
  constexpr int N = Vec<T>::N;
  extern __shared__ __align__(16) unsigned char smem[];
  const cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t lrow = blockIdx.x / C;
  const int64_t row = a.row0 + lrow;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;

  T* data = reinterpret_cast<T*>(smem);
  uint64_t* hist = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(a.slice) * sizeof(T));
  uint64_t* part = hist + kBins;
  uint32_t* cand = reinterpret_cast<uint32_t*>(part + kBins / 2);
  Misc* m = reinterpret_cast<Misc*>(cand + kCandCap);
  uint32_t* h32 = reinterpret_cast<uint32_t*>(hist);

  const int64_t lo = static_cast<int64_t>(rank) * a.slice;
  const int n = static_cast<int>(max(int64_t{0}, min(static_cast<int64_t>(a.slice), a.cols - lo)));
  const int nv = (n + N - 1) / N;

  // ---- Pass 1: HBM -> shared memory, and the argmax key ((key << 32) | ~index).
  const T* g = static_cast<const T*>(a.logits) + lrow * a.stride + lo;
  uint64_t best = 0;
  float vmin = __uint_as_float(0x7f800000u);  // the slice's smallest logit (fminf skips NaN)
  auto consider = [&](float x, int i) {
    const uint64_t k = (static_cast<uint64_t>(order_key(x)) << 32) | (0xffffffffu - static_cast<uint32_t>(lo + i));
    best = k > best ? k : best;
  };
  const T neg_inf = from_float<T>(__uint_as_float(0xff800000u));
  // The exchanges' mbarriers, published to the cluster by a barrier whose wait comes before the
  // first push (after the load: nothing waits here).
  if (tid == 0) xchg_init(m->xbar);
  cluster_arrive_relaxed();  // (fence.mbarrier_init before it in thread 0)
  if (a.vec_ok) {
    const int full = n / N;
    if (tid == 0) slice_load_issue(data, g, full, m->load_bar);
    __syncthreads();  // the barriers are initialised before anyone waits on them
    for (int k = 0, v0 = 0; v0 < full; ++k, v0 += kLoadChunkVecs) {
      slice_chunk_wait(m->load_bar, k);
      const int v1 = min(full, v0 + kLoadChunkVecs);
      for (int v = v0 + tid; v < v1; v += kThreads) {
        float f[N];
        load_smem_vec(data, v, f);
#pragma unroll
        for (int e = 0; e < N; ++e) {
          consider(f[e], v * N + e);
          vmin = fminf(vmin, f[e]);
        }
      }
    }
    if (full < nv && tid == 0) {
      for (int i = full * N; i < nv * N; ++i) {
        const T x = i < n ? g[i] : neg_inf;
        data[i] = x;
        consider(to_float(x), i);
        if (i < n) vmin = fminf(vmin, to_float(x));
      }
    }
  } else {
    for (int i = tid; i < nv * N; i += kThreads) {
      const T x = i < n ? g[i] : neg_inf;
      data[i] = x;
      consider(to_float(x), i);
      if (i < n) vmin = fminf(vmin, to_float(x));
    }
  }
  best = warp_max_u64(best);
  vmin = warp_min_f(vmin);
  if (lane == 0) {
    m->red[warp] = best;
    m->scan[warp] = __float_as_uint(vmin);
  }
  __syncthreads();  // also publishes the slice to the whole block
  cluster.barrier_wait();  // the exchanges' mbarriers are initialised in every block
  uint64_t* xslot = part;  // pushes land in `part` (kXMaxAt, kXMsgAt)
  if (warp == 0) {
    uint64_t b = lane < kWarps ? m->red[lane] : 0ull;
    b = warp_max_u64(b);
    const float mn = warp_min_f(lane < kWarps ? __uint_as_float(static_cast<uint32_t>(m->scan[lane])) : vmin);
    // (key, min) to every block, this block's pair at 2 * rank. A cluster of one block stores
    // its pair locally: st.async to shared::cluster needs a peer (compute-sanitizer memcheck:
    // "Invalid __shared__ write ... Cluster needs to have at least 2 blocks", then the kernel is
    // aborted), and narrow rows (up to ~28K fp32 columns) run on one block.
    if (C == 1) {
      if (lane == 0) {
        xslot[kXMaxAt] = b;
        xslot[kXMaxAt + 1] = __float_as_uint(mn);
      }
    } else {
      if (lane < C) {
        xchg_push(&xslot[kXMaxAt + 2 * rank], b, &m->xbar[kXMax], lane);
        xchg_push(&xslot[kXMaxAt + 2 * rank + 1], __float_as_uint(mn), &m->xbar[kXMax], lane);
      }
      if (lane == 0) xchg_expect(&m->xbar[kXMax], static_cast<uint32_t>(16 * C));
    }
  }
  if (C == 1) {
    __syncthreads();
  } else {
    xchg_wait(&m->xbar[kXMax]);
  }
  best = warp_max_u64(lane < C ? xslot[kXMaxAt + 2 * lane] : 0ull);
  const float lmin =
      warp_min_f(lane < C ? __uint_as_float(static_cast<uint32_t>(xslot[kXMaxAt + 2 * lane + 1])) : vmin);
  const int64_t greedy = static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(best));

  const float temp = a.temperature ? a.temperature[row] : a.temperature_value;
  if (!(temp >= FLT_MIN)) {  // 0 and subnormals (1 / t overflows fp32) are greedy, as the reference
    if (rank == 0 && tid == 0) {
      a.tokens[row] = greedy;
      a.logprobs[row] = 0.0f;
    }
    cluster.sync();  // no block leaves while another may still read its shared memory
    return;
  }

  RowCtx r;
  r.lmax = key_value(static_cast<uint32_t>(best >> 32));
  r.inv_t = 1.0f / temp;
  // NaN span (NaN max): 128; zero span: the cap.
  r.mass_scale = fminf(fmaxf(static_cast<float>(kBins - 1) / ((r.lmax - lmin) * r.inv_t), kMassBinsPerNat),
                       kMaxMassBinsPerNat);
  r.min_p = a.min_p ? a.min_p[row] : a.min_p_value;
  const int64_t top_k = a.top_k ? a.top_k[row] : a.top_k_value;

  // ---- top-k: the k-th largest key (ties at it kept). First level: counts by value bin.
  uint32_t thr_k = 0;
  if (top_k > 0 && top_k < a.cols) {
    for (int i = tid; i < kBins; i += kThreads) hist[i] = 0;
    if (tid == 0) m->ncand = 0;
    __syncthreads();
    uint32_t c_first = 0;
    uint32_t c_last = 0;
    for_each_element(data, nv, [&](float x, bool ok) {
      if (!ok) return;
      const int b = value_bin(x, r.lmax, kCountBinsPerLogit);
      if (b == 0) {
        ++c_first;
      } else if (b == kBins - 1) {
        ++c_last;
      } else {
        atomicAdd(h32 + 2 * b, 1u);
      }
    });
    c_first = __reduce_add_sync(kFull, c_first);
    c_last = __reduce_add_sync(kFull, c_last);
    if (lane == 0) {
      if (c_first) atomicAdd(h32, c_first);
      if (c_last) atomicAdd(h32 + 2 * (kBins - 1), c_last);
    }
    const Selection s = C > 1 ? select_bin_push(hist, part, static_cast<uint64_t>(top_k), -1.0f, m, C, rank, 0)
                              : select_bin(hist, part, static_cast<uint64_t>(top_k), -1.0f, m, C, rank);
    const int b1 = s.bin;
    auto pred = [&](float x) { return value_bin(x, r.lmax, kCountBinsPerLogit) == b1; };
    bool unused;
    uint64_t unused_tot;
    thr_k = threshold_cluster<false>(static_cast<uint64_t>(top_k) - s.above, data, nv, pred, cand, r, hist, part, m, C,
                                     rank, 0, false, unused, unused_tot);
  }

  const float top_p_row = a.top_p ? a.top_p[row] : a.top_p_value;
  const float thr_k_value = thr_value(thr_k);

  // ---- Few top-k survivors: gather them into block 0, which finishes the row alone.
  if (thr_k != 0u && top_k <= kSurvMax) {
    uint64_t* surv = hist;
    if (tid == 0) m->ncand = 0;
    __syncthreads();
    for (int base = tid & ~31; base < nv; base += kThreads) {
      const int v = base + lane;
      float x[N];
      load_smem_vec_or_pad(data, v, nv, x);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const int i = v * N + e;
        const bool c = i < n && !(x[e] < thr_k_value);  // key >= thr_k
        const unsigned mask = __ballot_sync(kFull, c);
        if (mask) {
          uint32_t pos0 = 0;
          if (lane == 0) pos0 = atomicAdd(&m->ncand, static_cast<uint32_t>(__popc(mask)));
          pos0 = __shfl_sync(kFull, pos0, 0);
          const uint32_t pos = pos0 + static_cast<uint32_t>(__popc(mask & ((1u << lane) - 1u)));
          if (c && pos < static_cast<uint32_t>(kBins)) {
            surv[pos] = (static_cast<uint64_t>(order_key(x[e])) << 32) | static_cast<uint32_t>(lo + i);
          }
        }
      }
    }
    cluster.sync();  // every block's survivors and count are complete
    const ListCounts k = list_counts(m, C, static_cast<uint32_t>(kBins), static_cast<uint32_t>(kBins));
    const uint32_t nsurv = k.total;
    if (!k.over && nsurv >= 1u && nsurv <= static_cast<uint32_t>(kSurvMax)) {  // the same decision in every block
      if (rank == 0) gather_lists(part, hist, k.cnt, k.incl, 0, C);
      cluster.sync();  // block 0's remote reads are done: the others may leave
      if (rank != 0) return;
      const uint64_t seed = static_cast<uint64_t>(a.seeds ? a.seeds[row] : a.seed_value);
      const uint64_t offset = static_cast<uint64_t>(a.offsets ? a.offsets[row] : a.offset_value);
      uint64_t total;
      draw_survivors(part, static_cast<int>(nsurv), top_p_row, r, philox_draw24(seed, offset), total, m);
      if (tid == 0) {
        const uint64_t tok = m->sel_above;
        if (tok == ~0ull) {  // no kept mass (no finite max): the greedy token
          a.tokens[row] = greedy;
          a.logprobs[row] = 0.0f;
        } else {
          const T* g0 = static_cast<const T*>(a.logits) + lrow * a.stride;
          const float x = to_float(g0[tok]);
          a.tokens[row] = static_cast<int64_t>(tok);
          const double z = static_cast<double>((x - r.lmax) * r.inv_t);
          a.logprobs[row] = static_cast<float>(z - log(static_cast<double>(total) / 2147483648.0));
        }
      }
      return;
    }
    cluster.sync();  // every block has read the counts before they are reset below
  }

#if FRAY_SAMPLE_EXTRA_BARRIERS
  // The pushed exchanges already order block 0's remote loads of the top-k candidate lists before
  // the top-p level's writes to them (see threshold_cluster); this barrier makes it explicit.
  if (C > 1 && thr_k != 0u) cluster.sync();
#endif
  // ---- top-p over the top-k survivors: first level masses by value bin of (max - l) / T.
  uint32_t thr_p = 0;
  bool fused_totals = false;  // block 0 pushed every block's kept mass (uniform)
  uint64_t fused_tot = 0;     // then lane c of every warp: block c's kept mass
  const float top_p = top_p_row;
  if (top_p < 1.0f) {
    for (int i = tid; i < kBins; i += kThreads) hist[i] = 0;
    if (tid == 0) m->ncand = 0;
    __syncthreads();
    uint64_t m_first = 0;
    uint64_t m_last = 0;
    // Per vector: every element's mass first, then (unless all are 0, as in most vectors of a
    // peaked row) their bins, the vector's shared atomics issued together and then their carries,
    // so the elements' atomic round trips overlap (7d7f10d: -4 us at 256x152064).
    for (int base = tid & ~31; base < nv; base += kThreads) {
      const int v = base + lane;
      float x[N];
      load_smem_vec_or_pad(data, v, nv, x);
      float t[N];
      uint32_t w[N];
      uint32_t any = 0;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        t[e] = nat_dist(x[e], r);
        const uint32_t fw = to_fixed(weight_t(t[e]));
        w[e] = x[e] < thr_k_value ? 0u : fw;  // key(x) < thr_k
        any |= w[e];
      }
      if (!any) continue;
      int b[N];
#pragma unroll
      for (int e = 0; e < N; ++e) {
        b[e] = mass_bin(t[e], r);
        const bool f = b[e] == 0;
        const bool l = b[e] == kBins - 1;
        m_first += f ? w[e] : 0u;
        m_last += l ? w[e] : 0u;
        if (f || l) w[e] = 0u;
      }
      uint32_t old[N];
#pragma unroll
      for (int e = 0; e < N; ++e) old[e] = w[e] ? atomicAdd(h32 + 2 * b[e], w[e]) : 0u;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        if (old[e] + w[e] < old[e]) atomicAdd(h32 + 2 * b[e] + 1, 1u);  // carry into the high word
      }
    }
    m_first = warp_sum_u64(m_first);
    m_last = warp_sum_u64(m_last);
    if (lane == 0) {
      if (m_first) hist_add(h32, 0, m_first);
      if (m_last) hist_add(h32, kBins - 1, m_last);
    }
    const Selection s = C > 1 ? select_bin_push(hist, part, 0, top_p, m, C, rank, 1)
                              : select_bin(hist, part, 0, top_p, m, C, rank);
    if (s.total > 0) {  // 0 only without a finite max (no mass anywhere): no filter
      const int b1 = s.bin;
      // This block's own mass in bins [0, b1) (its histogram is intact until the refinement):
      // every such token is kept (its key exceeds every key of bin b1), so with the kept
      // candidates of b1 it gives the block's kept mass without the final pass (below), which
      // needs min-p off (the same value in every block). Per warp into m->scan here;
      // threshold_cluster sums them into m->above_total between its range pass's block
      // barriers (which leave m->scan alone) and pushes it to block 0 in the block's record.
      if (r.min_p <= 0.0f) {
        uint64_t own = 0;
        for (int i = tid; i < b1; i += kThreads) own += hist[i];
        own = warp_sum_u64(own);
        if (lane == 0) m->scan[warp] = own;
      }
      // mass_bin(nat_dist(x), r) == b1, computed as the mass pass did (no branch).
      const uint32_t b1u = static_cast<uint32_t>(b1);
      auto pred = [&](float x) { return mass_bin_u(nat_dist(x, r) * r.mass_scale) == b1u && !(x < thr_k_value); };
      // min-p off (the same value in every block): block 0 also sums every block's kept mass
      // while it holds all the candidates, and pushes the totals with the threshold.
      thr_p = threshold_cluster<true>(s.tgt - s.above, data, nv, pred, cand, r, hist, part, m, C, rank, 1,
                                      r.min_p <= 0.0f, fused_totals, fused_tot);
    }
  }

  // ---- min-p, the kept mass and the draw. Thread t owns the contiguous vectors [t * q, t * q
  // + q) (q odd: the quarter-warps' 16-byte reads hit distinct banks), so a block scan of the
  // per-thread masses orders the kept tokens by index; the block, then the thread, holding the
  // target re-reads its vectors to find the token.
  const uint32_t thr = max(thr_k, thr_p);
  const float thr_v = thr_value(thr);
  // Branch-free, so the elements of a vector overlap (694bbe8: top-p 256x152064 -5 us).
  auto kept_mass = [&](float x) -> uint32_t {
    const float w = weight_f(x, r);
    const uint32_t fixed = to_fixed(w);
    return x < thr_v || !(w >= r.min_p) ? 0u : fixed;  // key(x) < thr, or below min-p
  };
  const int q = ((nv + kThreads - 1) / kThreads) | 1;
  const int v0 = min(nv, tid * q);
  const int v1 = min(nv, v0 + q);
  // The block's kept mass without a pass over its slice when top-p set the threshold, min-p is
  // off and the block's threshold-bin candidates all fit its list: the mass of its bins above the
  // threshold bin plus its kept candidates' (the same integers the pass would sum). Only the
  // block whose range holds the draw then runs the pass (to order its kept mass by index); the
  // others leave as soon as the cluster has read their totals, so the next rows' clusters can
  // start on their SMs.
  const bool shortcut = thr_p != 0u && r.min_p <= 0.0f && m->ncand <= static_cast<uint32_t>(kCandCap);
  uint64_t tsum = 0;
  uint64_t excl = 0;
  uint64_t block_total = 0;
  auto slice_pass = [&]() {
    tsum = 0;
    for (int v = v0; v < v1; ++v) {
      float x[N];
      load_smem_vec(data, v, x);
#pragma unroll
      for (int e = 0; e < N; ++e) tsum += kept_mass(x[e]);
    }
    excl = block_exclusive_scan(tsum, m->scan, block_total);
  };
  // Block c's kept mass: block 0's sum pushed with the threshold (fused totals: no pass, no
  // barrier, no remote load), else its own m->total_slot published by a cluster barrier.
  uint64_t t = fused_tot;
  if (!fused_totals) {
    if (shortcut) {
      uint64_t cm = 0;
      const int nc = static_cast<int>(m->ncand);  // this block's own list leads `cand`
      for (int i = tid; i < nc; i += kThreads) {
        const uint32_t key = cand[i];
        if (key >= thr) cm += to_fixed(weight_f(key_value(key), r));
      }
      (void)block_exclusive_scan(cm, m->scan, block_total);
      block_total += m->above_total;
    } else {
      slice_pass();
    }
    if (tid == 0) m->total_slot = block_total;
    cluster.sync();
    t = lane < C ? *cluster.map_shared_rank(&m->total_slot, lane) : 0ull;
  }
  const uint64_t incl = warp_inclusive_scan_u64(t);
  const uint64_t total = __shfl_sync(kFull, incl, 31);
  const uint64_t before = __shfl_sync(kFull, incl - t, rank);
  block_total = __shfl_sync(kFull, t, rank);
  // Last remote read done (its value is used above); relaxed: this arrive publishes nothing, it
  // only keeps every block's shared memory alive until all have read (7d7f10d: -3 us).
  cluster_arrive_relaxed();
  if (total == 0) {  // no finite max (NaN / inf rows): the greedy token
    if (rank == 0 && tid == 0) {
      a.tokens[row] = greedy;
      a.logprobs[row] = 0.0f;
    }
  } else {
    const uint64_t seed = static_cast<uint64_t>(a.seeds ? a.seeds[row] : a.seed_value);
    const uint64_t offset = static_cast<uint64_t>(a.offsets ? a.offsets[row] : a.offset_value);
    const uint64_t draw = philox_draw24(seed, offset);
    // Token: the first kept index whose running mass c > u * total, u = draw / 2^24; with
    // integer c that is c > floor(draw * total / 2^24) (total < 2^50: the product fits 74 bits).
    const uint64_t prod_lo = total * draw;
    const uint64_t prod_hi = __umul64hi(total, draw);
    const uint64_t target = (prod_hi << 40) | (prod_lo >> 24);
    if (target >= before && target - before < block_total) {
      const uint64_t tau = target - before;
      if (shortcut || fused_totals) slice_pass();  // the same block_total again, now ordered by thread
      if (tau >= excl && tau - excl < tsum) {
        uint64_t c = excl;
        bool found = false;
        for (int v = v0; v < v1 && !found; ++v) {
          float x[N];
          load_smem_vec(data, v, x);
#pragma unroll
          for (int e = 0; e < N; ++e) {
            if (!found) {
              c += kept_mass(x[e]);
              if (c > tau) {
                found = true;
                a.tokens[row] = lo + static_cast<int64_t>(v) * N + e;
                const double z = static_cast<double>((x[e] - r.lmax) * r.inv_t);
                a.logprobs[row] = static_cast<float>(z - log(static_cast<double>(total) / 2147483648.0));
              }
            }
          }
        }
      }
    }
  }
  cluster.barrier_wait();
}

// ---------------------------------------------------------------------------------------------
// Host side.

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Elements per block for a cluster of c blocks (a multiple of the 16-byte vector).
constexpr int64_t slice_elems(int64_t cols, int c, int vec) { return ceil_div(ceil_div(cols, c), vec) * vec; }

struct Plan {
  int cluster;
  int64_t slice;
};

// The smallest cluster whose slices fit kSliceTargetBytes (2 blocks per SM), else 8 blocks of
// up to kSliceMaxBytes; then doubled (to 16) while the doubled clusters still run in one wave and
// slices keep kMinSliceElems (16 only with 2 blocks per SM: 8 SMs of one GPC hold the cluster).
// One wave: rows x 2C blocks within 90% of 2 blocks per SM, as whole clusters must fit in a GPC
// (the H200 holds 30 clusters of 8 such blocks, not 33; 16 clusters of 16 ran as two waves: top-p
// at 152064 fp32, 16 / 30 rows took 69 / 105.5 us at C 16 and take 47.3 / 49.4 us at C 8).
// cluster 0: the row does not fit.
constexpr Plan sample_plan(int64_t cols, int elem, int64_t rows, int sms) {
  const int vec = 16 / elem;
  int c = 0;
  for (int k = 1; k <= kMaxCluster; k *= 2) {
    if (slice_elems(cols, k, vec) * elem <= kSliceTargetBytes) {
      c = k;
      break;
    }
  }
  if (c == 0) {
    if (slice_elems(cols, kPortableCluster, vec) * elem > kSliceMaxBytes) return Plan{0, 0};
    c = kPortableCluster;
  }
  while (c < kMaxCluster && rows * 2 * c * 10 <= 2 * static_cast<int64_t>(sms) * 9 &&
         slice_elems(cols, 2 * c, vec) >= kMinSliceElems &&
         (2 * c <= kPortableCluster || slice_elems(cols, 2 * c, vec) * elem <= kSliceTargetBytes)) {
    c *= 2;
  }
  return Plan{c, slice_elems(cols, c, vec)};
}

constexpr int64_t max_width(int elem) {
  return kPortableCluster * (kSliceMaxBytes / elem);
}

// Compile-time check of the plan: every width up to the maximum is covered by slices that fit.
constexpr bool sample_plan_ok() {
  const int elems[2] = {4, 2};
  for (const int elem : elems) {
    for (int64_t cols = 1; cols <= max_width(elem); cols += (cols < 4096 ? 7 : 4093)) {
      for (int64_t rows = 1; rows <= 1024; rows *= 4) {
        const Plan p = sample_plan(cols, elem, rows, 132);
        if (p.cluster < 1 || p.cluster > kMaxCluster || (p.cluster & (p.cluster - 1)) != 0) return false;
        if (p.slice * p.cluster < cols || p.slice % (16 / elem) != 0) return false;
        if (p.slice * elem > (p.cluster <= kPortableCluster ? kSliceMaxBytes : kSliceTargetBytes)) return false;
        if ((p.cluster - 1) * p.slice >= cols) return false;  // no block without elements
      }
    }
    if (sample_plan(max_width(elem), elem, 1, 132).cluster == 0) return false;
    if (sample_plan(max_width(elem) + 1, elem, 1, 132).cluster != 0) return false;
  }
  // One wave (fp32 152064, measured): 30 rows take clusters of 8 (30 x 16 blocks would need two
  // waves), 8 rows clusters of 16.
  return sample_plan(152064, 4, 30, 132).cluster == 8 && sample_plan(152064, 4, 8, 132).cluster == 16;
}
static_assert(sample_plan_ok(), "sample_plan violates a kernel constraint");

template <typename T>
cudaError_t launch_sample_typed(const SampleParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.cols <= 0) return cudaSuccess;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const int sms = sm_count(device);
  const Plan plan = sample_plan(p.cols, static_cast<int>(sizeof(T)), p.rows, sms);
  if (plan.cluster == 0) return cudaErrorInvalidValue;

  SampleArgs a{};
  a.logits = p.logits;
  a.stride = p.row_stride;
  a.cols = p.cols;
  a.temperature = p.temperature;
  a.top_k = p.top_k;
  a.top_p = p.top_p;
  a.min_p = p.min_p;
  a.seeds = p.seeds;
  a.offsets = p.offsets;
  a.temperature_value = p.temperature_value;
  a.top_p_value = p.top_p_value;
  a.min_p_value = p.min_p_value;
  a.top_k_value = p.top_k_value;
  a.seed_value = p.seed_value;
  a.offset_value = p.offset_value;
  a.tokens = p.tokens;
  a.logprobs = p.logprobs;
  a.slice = static_cast<int>(plan.slice);
  a.vec_ok = is_aligned(p.logits, 16) && (p.rows == 1 || (p.row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0);

  const size_t smem = static_cast<size_t>(plan.slice) * sizeof(T) + kAuxBytes;
  auto fn = sample_kernel<T>;
  // All of the SM's 228 KB as shared memory (the carveout), so that two 113 KB blocks fit.
  err = prepare_kernel(reinterpret_cast<const void*>(fn), device, smem, plan.cluster, true);
  if (err != cudaSuccess) return err;
  const int64_t rows_per_launch = kMaxBlocksPerLaunch / plan.cluster;
  for (int64_t done = 0; done < p.rows; done += rows_per_launch) {
    const int64_t rows = p.rows - done < rows_per_launch ? p.rows - done : rows_per_launch;
    SampleArgs part = a;
    part.logits = static_cast<const T*>(p.logits) + done * p.row_stride;
    part.row0 = done;
    // Always a cluster launch (also of 1 CTA): the kernel's cluster barriers and DSMEM reads
    // assume one.
    cudaLaunchAttribute attr[2];
    err = launch_ex(fn, part, cluster_config(attr, dim3(static_cast<unsigned>(rows * plan.cluster)), dim3(kThreads),
                                             smem, plan.cluster, false, stream));
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace sampling_detail

template <typename T>
cudaError_t launch_sample(const SampleParams& p, cudaStream_t stream) {
  return sampling_detail::launch_sample_typed<T>(p, stream);
}

}  // namespace fray
