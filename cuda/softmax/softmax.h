// Fray softmax family: host-only API (plain C++; no CUDA compiler needed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch_abi.h"

namespace fray {

// Row softmax over `rows` rows of `cols` elements (row strides in elements, last
// dim contiguous):
//
//   y[i,j] = TO(exp(x[i,j]/T - max_i/T) / sum_j exp(x[i,j]/T - max_i/T))
//
// fp32 math, one rounding to the output type. A row that is all -inf gives NaN
// (as torch.softmax); a row holding NaN or +inf gives NaN. When row_max /
// row_lse are not null they receive, per row, max_j(x/T) and the natural-log
// log-sum-exp of x/T as fp32 (contiguous [rows]); an all -inf row gives -inf
// for both. y may alias x (same pointer, stride and dtype).
struct SoftmaxParams {
  const void* x = nullptr;
  int64_t x_row_stride = 0;
  DType x_dtype = DType::kFloat32;
  void* y = nullptr;
  int64_t y_row_stride = 0;
  DType y_dtype = DType::kFloat32;
  float* row_max = nullptr;  // optional
  float* row_lse = nullptr;  // optional (set both or neither)
  int64_t rows = 0;
  int64_t cols = 0;
  double temperature = 1.0;  // > 0, with 1/temperature finite in fp32
};

// Enqueues the kernel(s) on `stream` (the caller has made the stream's device
// current). Never synchronises, allocates or throws. Returns the launch status.
cudaError_t softmax(const SoftmaxParams& p, cudaStream_t stream);

// Number of distinct softmax kernels compiled into the library.
int softmax_num_kernel_instances();

// The launcher (softmax_api.cc), called through the generic binder (cuda/common/binder.h) as
// ext.softmax(ptrs, ints, floats, device, stream); dtype codes 0 fp32, 1 fp16, 2 bf16. Throws
// std::invalid_argument for bad codes or a temperature whose inverse is no finite fp32, and
// std::runtime_error for CUDA errors.
namespace softmax_api {

// softmax, and online_softmax when row_max and row_lse are given (both or neither):
//   ptrs   x, y, row_max (fp32 [rows] or 0), row_lse (fp32 [rows] or 0)
//   ints   x_row_stride, y_row_stride, rows, cols, x_dtype, y_dtype
//   floats temperature
void softmax(const FrayArgs& a);

int num_kernel_instances();

}  // namespace softmax_api
}  // namespace fray
