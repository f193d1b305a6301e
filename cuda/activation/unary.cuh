// Fray activation family: the unary activations out = act(x) over flat arrays, one template over
// the Activation enum on the shared streaming kernel (cuda/common/map.cuh). silu and both GELUs
// are act_mul's gate functions, so the two ops agree element for element.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/activation/act_mul.cuh"
#include "cuda/activation/activation.h"
#include "cuda/common/map.cuh"

namespace fray {
namespace unary_detail {

template <Activation A, bool kFast>
struct Act {
  __device__ __forceinline__ float operator()(float g) const {
    if constexpr (A == Activation::kRelu) {
      return g < 0.0f ? 0.0f : g;  // not fmaxf: NaN stays NaN, as in torch.relu
    } else if constexpr (A == Activation::kTanh) {
      return tanhf(g);
    } else if constexpr (A == Activation::kSigmoid) {
      // The fast form for 16-bit outputs (see act_mul.cuh): 1-2 ulp of fp32, far inside their rounding.
      if constexpr (kFast) return act_detail::div_one_plus_exp<true>(1.0f, g * -act_detail::kLog2e);
      return 1.0f / (1.0f + expf(-g));
    } else {
      return act_detail::activate<A, kFast>(g);
    }
  }
};

template <typename T, Activation A>
cudaError_t launch(const UnaryParams& p, cudaStream_t stream) {
  const void* const in[1] = {p.x};
  return launch_map<T, 1>(in, p.out, p.n, Act<A, !std::is_same_v<T, float>>{}, stream);
}

}  // namespace unary_detail

template <typename T>
cudaError_t launch_unary(const UnaryParams& p, cudaStream_t stream) {
  using unary_detail::launch;
  switch (p.act) {
    case Activation::kSilu: return launch<T, Activation::kSilu>(p, stream);
    case Activation::kGeluErf: return launch<T, Activation::kGeluErf>(p, stream);
    case Activation::kGeluTanh: return launch<T, Activation::kGeluTanh>(p, stream);
    case Activation::kRelu: return launch<T, Activation::kRelu>(p, stream);
    case Activation::kTanh: return launch<T, Activation::kTanh>(p, stream);
    case Activation::kSigmoid: return launch<T, Activation::kSigmoid>(p, stream);
  }
  return cudaErrorInvalidValue;
}

// 6 activations x {VEC, scalar}.
template <typename T>
int unary_num_kernels() {
  return 6 * 2;
}

}  // namespace fray
