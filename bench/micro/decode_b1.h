// Shared by the B = 1 decode micro-benchmarks (decode_paged_b1.cu, decode_timeline.cu): the issue's
// B1 shape (bf16, D = 128, Hq 32, Hkv 8, T 4096; 16 splits of 256 tokens, as the production plan
// picks), its buffers, and paged copies of its cache. A program that defines FRAY_DECODE_STAMP does
// so before including this header.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

#include "bench/micro/micro.h"
#include "cuda/attention/decode_attention.cuh"

namespace b1 {

using namespace fray;
using namespace fray::attn_detail;
using T = __nv_bfloat16;

constexpr int B = 1, Hq = 32, Hkv = 8, Tcap = 4096, D = 128, splits = 16;
constexpr size_t kv = size_t(B) * Hkv * Tcap * D, n_out = size_t(B) * Hq * D;

// Copies the contiguous HND cache [Hkv, T, D] of sequence 0 into pages [num_blocks, P, Hkv, D].
__global__ void scatter_pages(const T* src, T* dst, const int* bt, int P) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < kv; i += size_t(gridDim.x) * blockDim.x) {
    const int d = int(i % D), t = int((i / D) % Tcap), h = int(i / (size_t(D) * Tcap));
    dst[(size_t(bt[t / P]) * P + t % P) * Hkv * D + size_t(h) * D + d] = src[i];
  }
}

// The inputs (q, an HND cache with lens = T), the outputs and partials, and a page pool of
// `pool_factor` times the cache's blocks with its block table.
struct Setup {
  T *q, *k, *v, *kp, *vp, *out;
  float *lse, *po, *pl;
  int *lens, *bt;
  int pool_factor;
  DecodeParams p;  // the contiguous HND cache

  explicit Setup(int pool_factor_) : pool_factor(pool_factor_) {
    CK(cudaMalloc(&q, n_out * 2));
    CK(cudaMalloc(&k, kv * 2));
    CK(cudaMalloc(&v, kv * 2));
    CK(cudaMalloc(&kp, pool_factor * kv * 2));
    CK(cudaMalloc(&vp, pool_factor * kv * 2));
    CK(cudaMalloc(&out, n_out * 2));
    CK(cudaMalloc(&lse, n_out / D * 4));
    CK(cudaMalloc(&po, n_out * splits * 4));
    CK(cudaMalloc(&pl, n_out / D * splits * 4));
    CK(cudaMalloc(&lens, B * 4));
    CK(cudaMalloc(&bt, pool_factor * Tcap * 4));  // room for block size 1
    fill_hash_uniform<<<1024, 256>>>(q, n_out, 1);
    fill_hash_uniform<<<1024, 256>>>(k, kv, 2);
    fill_hash_uniform<<<1024, 256>>>(v, kv, 3);
    const int len_h = Tcap;
    CK(cudaMemcpy(lens, &len_h, 4, cudaMemcpyHostToDevice));
    p.q = q; p.q_sb = Hq * D; p.q_sh = D;
    p.k = k; p.k_sb = size_t(Hkv) * Tcap * D; p.k_sh = size_t(Tcap) * D; p.k_st = D;
    p.v = v; p.v_sb = p.k_sb; p.v_sh = p.k_sh; p.v_st = D;
    p.lens = lens; p.out = out; p.o_sb = Hq * D; p.o_sh = D; p.lse = lse; p.lse_sb = Hq;
    p.part_out = po; p.part_lse = pl;
    p.batch = B; p.n_heads = Hq; p.n_kv_heads = Hkv; p.head_dim = D; p.capacity = Tcap;
    p.num_splits = splits; p.split_size = Tcap / splits; p.scale = 0.088f; p.dtype = DType::kBFloat16;
  }

  // The cache's pages at blocks perm[0, T / P) of the pool (the other blocks hold NaN): the
  // paged parameters.
  DecodeParams paged(int P, const std::vector<int>& perm) const {
    const int nb = Tcap / P;
    CK(cudaMemcpy(bt, perm.data(), nb * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(kp, 0xff, pool_factor * kv * 2));
    CK(cudaMemset(vp, 0xff, pool_factor * kv * 2));
    scatter_pages<<<1024, 256>>>(k, kp, bt, P);
    scatter_pages<<<1024, 256>>>(v, vp, bt, P);
    CK(cudaDeviceSynchronize());
    DecodeParams pp = p;
    pp.k = kp; pp.v = vp;
    pp.k_sb = size_t(P) * Hkv * D; pp.k_sh = D; pp.k_st = size_t(Hkv) * D;
    pp.v_sb = pp.k_sb; pp.v_sh = pp.k_sh; pp.v_st = pp.k_st;
    pp.block_table = bt; pp.bt_sb = nb; pp.page_size = P;
    return pp;
  }
};

// The kernel arguments launch_decode derives from `p` (for direct kernel launches).
inline DecodeArgs args_of(const DecodeParams& p) {
  DecodeArgs a;
  a.p = p;
  a.group = p.n_heads / p.n_kv_heads;
  a.head_chunks = 1;
  a.page_shift = 0;
  while ((1 << a.page_shift) < p.page_size) ++a.page_shift;
  a.scale_log2 = p.scale * kLog2e;
  a.q_async = true;
  return a;
}

// Per-call µs (sorted) of `reps` replays of a CUDA graph of `calls` launches captured on `st`,
// `before(r)` enqueued on `st` ahead of replay r (outside the timed events).
template <typename F, typename G>
std::vector<float> graph_times_us(cudaStream_t st, int calls, int reps, F launch, G before) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int c = 0; c < calls; ++c) launch();
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  std::vector<float> t = event_times_us_after([&] { CK(cudaGraphLaunch(ge, st)); }, reps, before, st);
  for (float& x : t) x /= calls;
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return t;
}

}  // namespace b1
