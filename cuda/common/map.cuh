// Fray: one streaming elementwise kernel, out[i] = f(in_0[i], ..., in_{NIN-1}[i]) over flat dense
// arrays, shared by the flat ops of several families (activation: the unary activations;
// elementwise: mul, axpy). vector_add keeps its own tuned copy of this shape.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/launch.h"
#include "cuda/common/vec.cuh"

namespace fray {
namespace map_detail {

// vector_add's measured choice on the H200 (512 threads, 2 vectors a thread per array, a grid
// sized to the work): these ops stream the same bytes per element or fewer.
constexpr int kThreads = 512;
constexpr int kUnroll = 2;

template <int NIN>
struct MapArgs {
  const void* in[NIN];
  void* out;
  int64_t n;     // elements
  int64_t head;  // leading elements before the 16-byte aligned body (done one by one)
  int64_t nvec;  // VEC-element vectors in the body; the rest is a scalar tail
};

template <int NIN, typename F>
__device__ __forceinline__ float apply(const F& f, const float (&x)[NIN]) {
  if constexpr (NIN == 1) {
    return f(x[0]);
  } else {
    static_assert(NIN == 2, "map: one or two inputs");
    return f(x[0], x[1]);
  }
}

template <typename T, int NIN, typename F>
__device__ __forceinline__ void map_one(const MapArgs<NIN>& p, const F& f, int64_t i) {
  float x[NIN];
#pragma unroll
  for (int k = 0; k < NIN; ++k) x[k] = to_float(static_cast<const T*>(p.in[k])[i]);
  static_cast<T*>(p.out)[i] = from_float<T>(apply<NIN>(f, x));
}

// No __restrict__ and no read-only loads: out may be one of the inputs exactly (each element is
// read and then written by the same thread).
template <typename T, int VEC, int NIN, typename F>
__global__ void __launch_bounds__(kThreads, 2) map_kernel(const MapArgs<NIN> p, const F f) {
  using V = AlignedVec<T, VEC>;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (tid < p.head) map_one<T>(p, f, tid);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  for (int64_t v0 = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; v0 < p.nvec;
       v0 += stride) {
    V x[kUnroll][NIN];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (v0 + u * kThreads < p.nvec) {
#pragma unroll
        for (int k = 0; k < NIN; ++k) {
          load_vec(x[u][k], static_cast<const T*>(p.in[k]) + p.head + (v0 + u * kThreads) * VEC);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (v0 + u * kThreads < p.nvec) {
        float g[NIN][VEC];
#pragma unroll
        for (int k = 0; k < NIN; ++k) vec_to_float(x[u][k], g[k]);
        float r[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          float e[NIN];
#pragma unroll
          for (int k = 0; k < NIN; ++k) e[k] = g[k][j];
          r[j] = apply<NIN>(f, e);
        }
        V y;
        vec_from_float(y, r);
        store_vec(static_cast<T*>(p.out) + p.head + (v0 + u * kThreads) * VEC, y);
      }
    }
  }
  const int64_t tail = p.head + p.nvec * VEC;
  if (tid < p.n - tail) map_one<T>(p, f, tail + tid);
}

}  // namespace map_detail

// out[i] = T(f(float(in[0][i]), ...)) for i < n: fp32 math, one rounding. 128-bit body when every
// pointer sits at the same offset from a 16-byte boundary (always, for fresh tensors), else one
// element per thread. Enqueues on `stream`; never throws or synchronises.
template <typename T, int NIN, typename F>
cudaError_t launch_map(const void* const (&in)[NIN], void* out, int64_t n, const F& f, cudaStream_t stream) {
  using namespace map_detail;
  if (n <= 0) return cudaSuccess;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr uintptr_t kAlign = 16;
  MapArgs<NIN> k{};
  for (int i = 0; i < NIN; ++i) k.in[i] = in[i];
  k.out = out;
  k.n = n;
  const uintptr_t mis = reinterpret_cast<uintptr_t>(out) & (kAlign - 1);
  bool vec_ok = mis % sizeof(T) == 0;
  for (int i = 0; i < NIN; ++i) vec_ok = vec_ok && (reinterpret_cast<uintptr_t>(in[i]) & (kAlign - 1)) == mis;
  const int64_t per_block = static_cast<int64_t>(kThreads) * kUnroll;
  int64_t units;
  if (vec_ok) {
    const int64_t head = static_cast<int64_t>(((kAlign - mis) & (kAlign - 1)) / sizeof(T));
    k.head = head < n ? head : n;
    k.nvec = (n - k.head) / kVec;
    units = k.nvec;
  } else {
    k.nvec = n;
    units = n;
  }
  int64_t blocks = (units + per_block - 1) / per_block;
  if (blocks > 2147483647) blocks = 2147483647;
  if (blocks < 1) blocks = 1;
  if (vec_ok) {
    map_kernel<T, kVec, NIN, F><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(k, f);
  } else {
    map_kernel<T, 1, NIN, F><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(k, f);
  }
  return launch_error();
}

}  // namespace fray
