// Fray elementwise family: out = a + b over flat arrays (torch-free kernel and launcher).
// See README.md for the design.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/common/vec.cuh"
#include "cuda/elementwise/elementwise.h"

namespace fray {
namespace vector_add_detail {

// Measured on the H200 (bf16, 2^28 elements, L2 flushed): a grid sized to the work, one tile
// per block, reaches 4.31 TB/s (torch.add 4.34); the earlier persistent grid (4 blocks of 256
// per SM, grid-stride loop) stayed at 4.03. 512 x 2 edged out 256 x 4, 256 x 2, 128 x 8 and
// 128 x 4 (4.29 TB/s each): with short-lived blocks the scheduler keeps every SM's slots full
// to the end, and the tail of the last wave is a few small blocks instead of whole strides.
constexpr int kThreads = 512;  // block size
// Vectors per array a thread loads before it adds and stores: 2 x 16 B x 2 inputs in flight.
constexpr int kUnroll = 2;
// Launch-bounds minimum (2 x 512 threads per SM: a cap of 64 registers, more than enough).
constexpr int kBlocksPerSm = 2;

struct KernelArgs {
  const void* a;
  const void* b;
  void* out;
  int64_t n;     // elements
  int64_t head;  // leading elements before the 16-byte aligned body (done one by one)
  int64_t nvec;  // VEC-element vectors in the body; the n - head - nvec * VEC tail is scalar
};

template <typename T, int VEC>
__device__ __forceinline__ AlignedVec<T, VEC> add(const AlignedVec<T, VEC>& x, const AlignedVec<T, VEC>& y) {
  float f[VEC], g[VEC];
  vec_to_float(x, f);
  vec_to_float(y, g);
#pragma unroll
  for (int k = 0; k < VEC; ++k) f[k] += g[k];
  AlignedVec<T, VEC> r;
  vec_from_float(r, f);
  return r;
}

template <typename T>
__device__ __forceinline__ void add_one(const T* a, const T* b, T* out, int64_t i) {
  out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

// Each block covers kThreads * kUnroll consecutive vectors (the loop only strides past the
// grid limit); thread t handles vectors t, t + kThreads, ... of that tile, so each warp instruction
// moves 32 consecutive vectors (512 B). All loads of an iteration are issued before any store.
// Aliasing: out may be a or b. Every element is read and then written by the same thread,
// so there is no __restrict__ and no read-only (.nc) load.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) vector_add_kernel(const KernelArgs p) {
  using V = AlignedVec<T, VEC>;
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* out = static_cast<T*>(p.out);
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;

  if (tid < p.head) add_one(a, b, out, tid);

  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  for (int64_t v0 = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; v0 < p.nvec;
       v0 += stride) {
    // One base address per array and iteration; the items sit at constant offsets from it
    // (immediates in the load / store instructions, no per-item 64-bit address registers).
    const T* pa = a + p.head + v0 * VEC;
    const T* pb = b + p.head + v0 * VEC;
    T* po = out + p.head + v0 * VEC;
    const int64_t left = p.nvec - v0;  // vectors from this thread's first one to the end
    V x[kUnroll], y[kUnroll];
    if (left > (kUnroll - 1) * kThreads) {  // whole tile: no per-item predicates
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        load_vec(x[u], pa + u * kThreads * VEC);
        load_vec(y[u], pb + u * kThreads * VEC);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) store_vec(po + u * kThreads * VEC, add(x[u], y[u]));
    } else {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (u * kThreads < left) {
          load_vec(x[u], pa + u * kThreads * VEC);
          load_vec(y[u], pb + u * kThreads * VEC);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (u * kThreads < left) store_vec(po + u * kThreads * VEC, add(x[u], y[u]));
      }
    }
  }

  const int64_t tail = p.head + p.nvec * VEC;
  if (tid < p.n - tail) add_one(a, b, out, tail + tid);
}

using KernelFn = void (*)(KernelArgs);

template <typename T>
cudaError_t launch_typed(const VectorAddParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr uintptr_t kAlign = 16;
  KernelArgs k{p.a, p.b, p.out, p.n, 0, 0};
  // 128-bit body when the three pointers sit at the same offset from a 16-byte boundary
  // (always, for freshly allocated tensors): the first `head` elements bring them to it.
  const uintptr_t mis = reinterpret_cast<uintptr_t>(p.a) & (kAlign - 1);
  const bool vec_ok = (reinterpret_cast<uintptr_t>(p.b) & (kAlign - 1)) == mis &&
                      (reinterpret_cast<uintptr_t>(p.out) & (kAlign - 1)) == mis && mis % sizeof(T) == 0;
  KernelFn fn;
  int64_t units;  // body vectors
  if (vec_ok) {
    const int64_t head = static_cast<int64_t>(((kAlign - mis) & (kAlign - 1)) / sizeof(T));
    k.head = head < p.n ? head : p.n;
    k.nvec = (p.n - k.head) / kVec;
    fn = &vector_add_kernel<T, kVec>;
    units = k.nvec;
  } else {
    k.nvec = p.n;  // one element per "vector", no head or tail
    fn = &vector_add_kernel<T, 1>;
    units = p.n;
  }
  // One tile per block; the loop in the kernel strides only past the 2^31 - 1 grid limit. At
  // least one block (head and tail are < VEC elements, done by the first threads).
  const int64_t per_block = static_cast<int64_t>(kThreads) * kUnroll;
  int64_t blocks = (units + per_block - 1) / per_block;
  if (blocks > 2147483647) blocks = 2147483647;
  if (blocks < 1) blocks = 1;
  fn<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(k);
  return launch_error();
}

}  // namespace vector_add_detail

// out = a + b for n elements of type T (float, __half, __nv_bfloat16): fp32 math, one
// rounding. Enqueues on `stream`; never throws or synchronises.
template <typename T>
cudaError_t launch_vector_add(const VectorAddParams& p, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  return vector_add_detail::launch_typed<T>(p, stream);
}

}  // namespace fray
