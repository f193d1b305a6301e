// Where does the CUDA decode kernel lose to its own loader? decode_split_mma_kernel (bf16, D=128,
// contiguous HND) timed with parts switched off through its PROBE template parameter
// (kProbeNoMath: loads and barriers only; kProbeNoFinish: no merge / output; kProbeNoLens:
// capacity instead of lens), against the production launcher, with and without the L2 flush the
// benchmark does before each call. The runs at 937cbf6..c152ab8 (2026-11-30) also timed per-warp
// cp.async rings (no block barrier in the loop): the same as the block-wide ring, not kept.
// Build + run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/dx bench/micro/decode_variants.cu && /tmp/dx
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench/micro/micro.h"
#include "cuda/attention/decode_attention.cuh"

using namespace fray;
using namespace fray::attn_detail;
constexpr int kNoMath = kProbeNoMath, kNoFinish = kProbeNoFinish, kNoLens = kProbeNoLens;
using T = __nv_bfloat16;

int main() {
  struct Shape { const char* name; int B, Hq, Hkv, Tcap, splits; };
  const Shape shapes[] = {{"B32Hq32Hkv8T4096 s1", 32, 32, 8, 4096, 1},
                          {"B64Hq64Hkv8T8192 s1", 64, 64, 8, 8192, 1},
                          {"B64Hq64Hkv8T8192 s2", 64, 64, 8, 8192, 2},
                          {"B1Hq32Hkv8T4096 s16", 1, 32, 8, 4096, 16}};
  char* flush;
  CK(cudaMalloc(&flush, 256 << 20));
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
    fill_hash_uniform<<<1024, 256>>>(q, size_t(s.B) * s.Hq * D, 1);
    fill_hash_uniform<<<1024, 256>>>(k, kv, 2);
    fill_hash_uniform<<<1024, 256>>>(v, kv, 3);
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
      const std::vector<float> t = event_times_us(launch, 30, flush_l2 ? flush : nullptr, 256 << 20);
      printf("%-22s %-26s %9.1f %8.2f\n", s.name, name, t[15], bytes / t[15] * 1e-6);
    };
    constexpr int smem = MmaConfig<128>::kSmemBytes;
#define VARIANT(M, NAME)                                                                       \
  {                                                                                            \
    CK(prepare_kernel<decode_split_mma_kernel<T, 128, false, M>>(smem));                                    \
    timeit(NAME, [&] { decode_split_mma_kernel<T, 128, false, M><<<grid, kThreads, smem>>>(a); });          \
  }
    const size_t n_out = size_t(s.B) * s.Hq * D;
    std::vector<uint16_t> ref(n_out), got(n_out);
    CK(launch_decode<T>(p, nullptr));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(ref.data(), out, n_out * 2, cudaMemcpyDeviceToHost));
    {  // the probe-free instantiation launched directly computes what the launcher does
      CK(prepare_kernel<decode_split_mma_kernel<T, 128, false, 0>>(smem));
      CK(cudaMemset(out, 0xff, n_out * 2));
      if (s.splits == 1) {
        decode_split_mma_kernel<T, 128, false, 0><<<grid, kThreads, smem>>>(a);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got.data(), out, n_out * 2, cudaMemcpyDeviceToHost));
        printf("%-22s direct launch bit-equal to the launcher: %s\n", s.name, ref == got ? "yes" : "NO");
      }
    }
    for (int round = 0; round < 2; ++round) {
      timeit("production (split+combine)", [&] { CK(launch_decode<T>(p, nullptr)); });
      VARIANT(0, "split kernel only")
      VARIANT(kNoLens, "no lens read")
      VARIANT(kNoFinish, "no merge/finish")
      VARIANT(kNoMath, "no math")
      VARIANT(kNoMath | kNoFinish, "no math, no finish")
      VARIANT(kNoMath | kNoFinish | kNoLens, "loads only")
      timeit("production, no L2 flush", [&] { CK(launch_decode<T>(p, nullptr)); }, false);
      timeit("loads only, no L2 flush",
             [&] { decode_split_mma_kernel<T, 128, false, kNoMath | kNoFinish | kNoLens><<<grid, kThreads, smem>>>(a); }, false);
    }
    cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(out); cudaFree(lse); cudaFree(po); cudaFree(pl); cudaFree(lens);
  }
  return 0;
}
