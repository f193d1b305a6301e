// Fray elementwise family: out = a * b over flat arrays, on the shared streaming kernel.
#pragma once

#include "cuda/common/map.cuh"
#include "cuda/elementwise/elementwise.h"

namespace fray {
namespace mul_detail {
struct Mul {
  __device__ __forceinline__ float operator()(float a, float b) const { return a * b; }
};
}  // namespace mul_detail

template <typename T>
cudaError_t launch_mul(const MulParams& p, cudaStream_t stream) {
  const void* const in[2] = {p.a, p.b};
  return launch_map<T, 2>(in, p.out, p.n, mul_detail::Mul{}, stream);
}

}  // namespace fray
