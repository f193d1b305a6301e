// Fray norm family: host-only API (plain C++; no CUDA compiler needed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch_abi.h"

namespace fray {

// RMSNorm (optionally fused with a residual add) over `rows` rows of `hidden`
// elements. Row strides are in elements; the last dim is contiguous.
//
//   residual == nullptr:
//     y[i,j] = T(x[i,j] * rsqrt(mean_j(x[i,:]^2) + eps) * (w[j] + weight_offset))
//   residual != nullptr:
//     s = T(float(x) + float(residual));  sum_out = s;  y = rmsnorm(s) as above.
//
// All math in fp32, one rounding to T at the end. In place is allowed:
// y may alias x and sum_out may alias residual (same pointers and strides).
// `weight` is contiguous [hidden], of dtype `weight_dtype` = x's dtype or fp32.
struct RmsNormParams {
  const void* x = nullptr;
  int64_t x_row_stride = 0;
  const void* residual = nullptr;  // nullptr: plain rmsnorm
  int64_t residual_row_stride = 0;
  const void* weight = nullptr;
  DType weight_dtype = DType::kFloat32;
  void* y = nullptr;
  int64_t y_row_stride = 0;
  void* sum_out = nullptr;  // required iff residual != nullptr
  int64_t sum_row_stride = 0;
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 1e-6f;
  float weight_offset = 0.0f;  // 1.0 for Gemma's (1 + w)
};

// Enqueues the kernel on `stream` (the caller has made the stream's device
// current). Never synchronises, allocates or throws. Returns
// cudaErrorInvalidValue for an unsupported dtype pair, else the launch status.
cudaError_t rmsnorm(DType x_dtype, const RmsNormParams& p, cudaStream_t stream);

// Number of distinct RMSNorm kernels compiled into the library.
int rmsnorm_num_kernel_instances();

// LayerNorm over `rows` rows of `hidden` elements (row strides in elements, last
// dim contiguous), biased variance as torch:
//   y[i,j] = T((x[i,j] - mean_i) / sqrt(var_i + eps) * w[j] + b[j]),
//   var_i = mean_j((x[i,j] - mean_i)^2)
// All math in fp32, one rounding to T. y may alias x (same pointer and stride).
// `weight` and `bias` are contiguous [hidden] of dtype `weight_dtype` (x's dtype
// or fp32); bias == nullptr means no bias.
struct LayerNormParams {
  const void* x = nullptr;
  int64_t x_row_stride = 0;
  const void* weight = nullptr;
  const void* bias = nullptr;
  DType weight_dtype = DType::kFloat32;
  void* y = nullptr;
  int64_t y_row_stride = 0;
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 1e-5f;
};

// As rmsnorm(): enqueues on `stream`, never synchronises, allocates or throws.
cudaError_t layernorm(DType x_dtype, const LayerNormParams& p, cudaStream_t stream);

// Number of distinct LayerNorm kernels compiled into the library.
int layernorm_num_kernel_instances();

// Launchers (norm_api.cc), called through the generic binder (cuda/common/binder.h) as
// ext.<name>(ptrs, ints, floats, device, stream); dtype codes 0 fp32, 1 fp16, 2 bf16; row strides in
// elements. They throw std::invalid_argument for bad dtype codes or pairs and std::runtime_error
// for CUDA errors.
namespace norm_api {

// rmsnorm, and add_rmsnorm when residual != 0:
//   ptrs   x, weight, y, residual (0: plain rmsnorm), sum_out
//   ints   x_row_stride, y_row_stride, residual_row_stride, sum_row_stride, rows, hidden,
//          x_dtype, weight_dtype
//   floats eps, weight_offset
void rmsnorm(const FrayArgs& a);

//   ptrs   x, weight, bias (0: none; weight's dtype), y
//   ints   x_row_stride, y_row_stride, rows, hidden, x_dtype, weight_dtype
//   floats eps
void layernorm(const FrayArgs& a);

int num_kernel_instances();

}  // namespace norm_api
}  // namespace fray
