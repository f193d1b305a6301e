// Fray activation family: host-only API (plain C++; no CUDA compiler needed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch_abi.h"

namespace fray {

// Activations. Integer values are part of the Python ABI. act_mul (the gated MLP) takes the first
// three; the unary kernel takes all six.
enum class Activation : int {
  kSilu = 0,      // g / (1 + exp(-g))
  kGeluErf = 1,   // 0.5 g (1 + erf(g / sqrt(2)))
  kGeluTanh = 2,  // 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
  kRelu = 3,      // max(g, 0), NaN kept
  kTanh = 4,      // tanh(g)
  kSigmoid = 5,   // 1 / (1 + exp(-g))
};

inline constexpr bool is_valid_activation_code(int code) { return code >= 0 && code <= 2; }
inline constexpr bool is_valid_unary_code(int code) { return code >= 0 && code <= 5; }

// Gated activation over `rows` rows of `d` elements:
//
//   out[i,j] = T(act(float(gate[i,j])) * float(up[i,j]))
//
// fp32 math, one rounding to T. Row strides are in elements; the last dim is
// contiguous. The engines' fused layout x = [rows, 2d] (gate in the first
// half, up in the second) is gate = x, up = x + d with both strides = x's.
// `out` may alias gate or up exactly (same pointer and stride): every element
// is read and then written by the same thread. Partial overlap is undefined.
struct ActMulParams {
  Activation act = Activation::kSilu;
  const void* gate = nullptr;
  int64_t gate_row_stride = 0;
  const void* up = nullptr;
  int64_t up_row_stride = 0;
  void* out = nullptr;
  int64_t out_row_stride = 0;
  int64_t rows = 0;
  int64_t d = 0;
};

// Enqueues the kernel on `stream` (the caller has made the stream's device
// current). Never synchronises, allocates or throws. Returns
// cudaErrorInvalidValue for an unsupported dtype or activation, else the
// launch status.
cudaError_t act_mul(DType dtype, const ActMulParams& p, cudaStream_t stream);

// Number of distinct activation kernels compiled into the library.
int act_mul_num_kernel_instances();

// out[i] = T(act(float(x[i]))) for i < n over flat, dense arrays (the caller has checked that x and
// out share one layout). fp32 math, one rounding; the same activation code as act_mul's gate for
// silu and both GELUs. out may be x itself; partial overlap is undefined.
struct UnaryParams {
  Activation act = Activation::kSilu;
  const void* x = nullptr;
  void* out = nullptr;
  int64_t n = 0;
};

// Enqueues on `stream`; cudaErrorInvalidValue for an unsupported dtype or activation.
cudaError_t unary(DType dtype, const UnaryParams& p, cudaStream_t stream);
int unary_num_kernel_instances();

// The launcher (activation_api.cc), called through the generic binder (cuda/common/binder.h) as
// ext.act_mul(ptrs, ints, floats, device, stream); dtype codes 0 fp32, 1 fp16, 2 bf16. Throws
// std::invalid_argument for bad codes and std::runtime_error for CUDA errors.
namespace activation_api {

//   ptrs   gate, up (0: the fused [rows, 2d] layout, up = gate + d), out
//   ints   gate_row_stride, up_row_stride, out_row_stride, rows, d, activation code, dtype
//   floats none
void act_mul(const FrayArgs& a);

//   ptrs   x, out
//   ints   n, activation code (0-5), dtype
//   floats none
void unary(const FrayArgs& a);

int num_kernel_instances();

}  // namespace activation_api
}  // namespace fray
