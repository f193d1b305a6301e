// Fray elementwise family: out = a * x + b (scalars a, b) over flat arrays, on the shared
// streaming kernel.
#pragma once

#include "cuda/common/map.cuh"
#include "cuda/elementwise/elementwise.h"

namespace fray {
namespace axpy_detail {
struct Axpy {
  float a, b;
  __device__ __forceinline__ float operator()(float x) const { return fmaf(a, x, b); }
};
}  // namespace axpy_detail

template <typename T>
cudaError_t launch_axpy(const AxpyParams& p, cudaStream_t stream) {
  const void* const in[1] = {p.x};
  return launch_map<T, 1>(in, p.out, p.n, axpy_detail::Axpy{p.a, p.b}, stream);
}

}  // namespace fray
