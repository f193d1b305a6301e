// Where does the CUDA decode kernel lose to its own loader? Variants of decode_split_mma_kernel
// (a snapshot of cuda/attention/decode_attention.cuh's kernel, bf16 D=128 contiguous HND) with
// parts switched off: kNoMath (loads and barriers only), kNoFinish (no merge / output), kNoLens
// (capacity instead of lens: loads start at once), timed against the production launcher.
// Build + run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/dx bench/micro/decode_variants.cu && /tmp/dx
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/attention/decode_attention.cuh"

#define CK(...)                                                                        \
  do {                                                                                 \
    cudaError_t e_ = (__VA_ARGS__);                                                            \
    if (e_ != cudaSuccess) {                                                           \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

namespace fray {
namespace attn_detail {
constexpr int kNoMath = 1, kNoFinish = 2, kNoLens = 4, kPerWarp = 8;

// kPerWarp: warp w copies only its own 16 rows of every tile (lane: chunk lane % 16, rows
// lane / 16 + 2 j) and waits only on its own copies: no block barrier in the loop.
template <typename T, int D>
__device__ __forceinline__ void issue_warp(const DecodeArgs& a, int b, int kvh, int start, int end, int tile,
                                           int n_tiles, uint32_t ks, uint32_t vs, int warp, int lane) {
  constexpr int kRowBytes = D * 2;
  constexpr int kCpr = kRowBytes / 16;
  if (tile < n_tiles) {
    const DecodeParams& p = a.p;
    const int chunk = lane % kCpr;
    const T* kb = static_cast<const T*>(p.k) + b * p.k_sb + kvh * p.k_sh + chunk * 8;
    const T* vb = static_cast<const T*>(p.v) + b * p.v_sb + kvh * p.v_sh + chunk * 8;
#pragma unroll
    for (int j = 0; j < 16 * kCpr / 32; ++j) {
      const int row = warp * 16 + lane / kCpr + j * (32 / kCpr);
      const int t = start + tile * 64 + row;
      const bool ok = t < end;
      const int off = swz(row, chunk, kRowBytes);
      cp_async_16(ks + off, ok ? kb + t * p.k_st : kb, ok);
      cp_async_16(vs + off, ok ? vb + t * p.v_st : vb, ok);
    }
  }
  cp_async_commit();
}


template <typename T, int D, bool PAGED, int MODE>
__global__ void __launch_bounds__(kThreads, MmaConfig<D>::kMinBlocks) exp_kernel(const DecodeArgs a) {
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
  griddep_launch_dependents();

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
  const bool early = !(MODE & kPerWarp) && !PAGED && p.split_size <= kPrefetchTiles * kTile && start < p.capacity;
  TileLoader<T, D, kTile, PAGED> loader(a, b, kvh, start, min(start + p.split_size, p.capacity));
  if (early) {
    const int cap_tiles = (loader.end - start + kTile - 1) / kTile;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      const uint32_t ks = ring + s * 2 * Cfg::kStageBytes;
      loader.issue(s, cap_tiles, ks, ks + Cfg::kStageBytes);
    }
  }
  // Clamped so that a bad length reads only inside the cache (FRAY_CHECK_INDICES=1 reports it).
  const int seqlen = (MODE & kNoLens) ? p.capacity : min(max(__ldg(p.lens + b), 0), p.capacity);
  if (start >= seqlen) {
    cp_async_wait<0>();  // no copy may land in shared memory after the CTA exits
    if (p.num_splits == 1) write_empty<T, D>(p, b, h0, group);
    return;
  }
  const int end = min(start + p.split_size, seqlen);
  const int n_tiles = (end - start + kTile - 1) / kTile;
  loader.end = end;
  if ((MODE & kPerWarp) && !early) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      const uint32_t ks = ring + s * 2 * Cfg::kStageBytes;
      issue_warp<T, D>(a, b, kvh, start, end, s, n_tiles, ks, ks + Cfg::kStageBytes, warp, lane);
    }
  } else if (!early) {
    loader.fetch_pages(0);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      const uint32_t ks = ring + s * 2 * Cfg::kStageBytes;
      loader.issue(s, n_tiles, ks, ks + Cfg::kStageBytes);
    }
  }

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
    if constexpr (MODE & kPerWarp) {
      cp_async_wait<kStages - 2>();
      __syncwarp();
      const int nxt = it + kStages - 1;
      const uint32_t ks = ring + (nxt % kStages) * 2 * Cfg::kStageBytes;
      issue_warp<T, D>(a, b, kvh, start, end, nxt, n_tiles, ks, ks + Cfg::kStageBytes, warp, lane);
    } else {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` visible to all; stage (it - 1) % kStages free for refill
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
    if constexpr (MODE & kNoMath) continue;

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

  if constexpr (MODE & kNoFinish) {
    cp_async_wait<0>();
    return;
  }
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
}

}  // namespace attn_detail
}  // namespace fray

using namespace fray;
using namespace fray::attn_detail;
using T = __nv_bfloat16;

__global__ void fill_random(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    x[i] = __float2bfloat16((h & 0xffff) / 16384.0f - 2.0f);
  }
}

int main() {
  struct Shape { const char* name; int B, Hq, Hkv, Tcap, splits; };
  const Shape shapes[] = {{"B32Hq32Hkv8T4096 s1", 32, 32, 8, 4096, 1},
                          {"B64Hq64Hkv8T8192 s1", 64, 64, 8, 8192, 1},
                          {"B64Hq64Hkv8T8192 s2", 64, 64, 8, 8192, 2},
                          {"B1Hq32Hkv8T4096 s16", 1, 32, 8, 4096, 16}};
  char* flush;
  CK(cudaMalloc(&flush, 256 << 20));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  printf("%-22s %-26s %9s %8s\n", "shape", "variant", "us", "TB/s");
  for (const Shape& s : shapes) {
    const int D = 128;
    const size_t kv = size_t(s.B) * s.Hkv * s.Tcap * D;
    T *q, *k, *v, *out;
    float *lse, *po, *pl;
    int* lens;
    CK(cudaMalloc(&q, size_t(s.B) * s.Hq * D * 2));
    CK(cudaMalloc(&k, kv * 2));
    CK(cudaMalloc(&v, kv * 2));
    CK(cudaMalloc(&out, size_t(s.B) * s.Hq * D * 2));
    CK(cudaMalloc(&lse, size_t(s.B) * s.Hq * 4));
    CK(cudaMalloc(&po, size_t(s.B) * s.Hq * s.splits * D * 4));
    CK(cudaMalloc(&pl, size_t(s.B) * s.Hq * s.splits * 4));
    CK(cudaMalloc(&lens, s.B * 4));
    fill_random<<<1024, 256>>>(q, size_t(s.B) * s.Hq * D, 1);
    fill_random<<<1024, 256>>>(k, kv, 2);
    fill_random<<<1024, 256>>>(v, kv, 3);
    std::vector<int> hl(s.B, s.Tcap);
    CK(cudaMemcpy(lens, hl.data(), s.B * 4, cudaMemcpyHostToDevice));
    DecodeParams p;
    p.q = q; p.q_sb = s.Hq * D; p.q_sh = D;
    p.k = k; p.k_sb = size_t(s.Hkv) * s.Tcap * D; p.k_sh = size_t(s.Tcap) * D; p.k_st = D;
    p.v = v; p.v_sb = p.k_sb; p.v_sh = p.k_sh; p.v_st = D;
    p.lens = lens; p.out = out; p.o_sb = s.Hq * D; p.o_sh = D; p.lse = lse; p.lse_sb = s.Hq;
    p.part_out = po; p.part_lse = pl;
    p.batch = s.B; p.n_heads = s.Hq; p.n_kv_heads = s.Hkv; p.head_dim = D; p.capacity = s.Tcap;
    p.num_splits = s.splits; p.split_size = s.Tcap / s.splits; p.scale = 0.088f; p.dtype = DType::kBFloat16;
    DecodeArgs a;
    a.p = p; a.group = s.Hq / s.Hkv; a.head_chunks = 1; a.page_shift = 0; a.scale_log2 = p.scale * kLog2e; a.q_async = true;
    const double bytes = 2.0 * kv * 2;
    const unsigned grid = s.B * s.Hkv * s.splits;
    auto timeit = [&](const char* name, auto launch, bool flush_l2 = true) {
      launch();
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      std::vector<float> t;
      for (int r = 0; r < 30; ++r) {
        if (flush_l2) CK(cudaMemsetAsync(flush, r, 256 << 20));
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000.0f);
      }
      std::sort(t.begin(), t.end());
      printf("%-22s %-26s %9.1f %8.2f\n", s.name, name, t[15], bytes / t[15] * 1e-6);
    };
    constexpr int smem = MmaConfig<128>::kSmemBytes;
#define VARIANT(M, NAME)                                                                       \
  {                                                                                            \
    CK(prepare_kernel<exp_kernel<T, 128, false, M>>(smem));                                    \
    timeit(NAME, [&] { exp_kernel<T, 128, false, M><<<grid, kThreads, smem>>>(a); });          \
  }
    const size_t n_out = size_t(s.B) * s.Hq * D;
    std::vector<uint16_t> ref(n_out), got(n_out);
    CK(launch_decode<T>(p, nullptr));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(ref.data(), out, n_out * 2, cudaMemcpyDeviceToHost));
    if (s.splits == 1) {
      CK(prepare_kernel<exp_kernel<T, 128, false, kPerWarp>>(smem));
      CK(cudaMemset(out, 0xff, n_out * 2));
      exp_kernel<T, 128, false, kPerWarp><<<grid, kThreads, smem>>>(a);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(got.data(), out, n_out * 2, cudaMemcpyDeviceToHost));
      printf("%-22s per-warp output bit-equal to production: %s\n", s.name, ref == got ? "yes" : "NO");
    }
    for (int round = 0; round < 2; ++round) {
      timeit("production (split+combine)", [&] { CK(launch_decode<T>(p, nullptr)); });
      VARIANT(0, "copy: split kernel only")
      VARIANT(kNoLens, "no lens read")
      VARIANT(kNoFinish, "no merge/finish")
      VARIANT(kNoMath, "no math")
      VARIANT(kNoMath | kNoFinish, "no math, no finish")
      VARIANT(kNoMath | kNoFinish | kNoLens, "loads only")
      VARIANT(kPerWarp, "per-warp rings")
      VARIANT(kPerWarp | kNoLens, "per-warp rings, no lens")
      timeit("production, no L2 flush", [&] { CK(launch_decode<T>(p, nullptr)); }, false);
      timeit("loads only, no L2 flush",
             [&] { exp_kernel<T, 128, false, kNoMath | kNoFinish | kNoLens><<<grid, kThreads, smem>>>(a); }, false);
    }
    cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(out); cudaFree(lse); cudaFree(po); cudaFree(pl); cudaFree(lens);
  }
  return 0;
}
