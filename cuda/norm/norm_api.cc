// Fray norm family: Python-facing adapters with plain integer / float
// arguments (no torch, no pybind11). Host-only; compiled by the C++ compiler.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/norm/norm.h"

#ifndef FRAY_CUDA_ARCHS
#define FRAY_CUDA_ARCHS "unknown"
#endif

namespace fray {
namespace norm_api {
namespace {

// weight dtype must be x's dtype or fp32.
void check_weight_dtype(const char* op, DType x, DType w) {
  if (w != x && w != DType::kFloat32) {
    throw std::invalid_argument(std::string("fray: ") + op + " weight dtype " + dtype_name(w) +
                                " is not supported with x dtype " + dtype_name(x) +
                                " (use the same dtype as x, or float32)");
  }
}

// rmsnorm and add_rmsnorm: residual == 0 is plain rmsnorm (sum_out unused).
void run_rmsnorm(const char* op, uintptr_t x, int64_t x_row_stride, uintptr_t residual, int64_t residual_row_stride,
                 uintptr_t weight, int weight_dtype, uintptr_t y, int64_t y_row_stride, uintptr_t sum_out,
                 int64_t sum_row_stride, int64_t rows, int64_t hidden, double eps, double weight_offset,
                 int x_dtype, int device_index, uintptr_t stream) {
  const DType xd = dtype_from_code(x_dtype, "x");
  const DType wd = dtype_from_code(weight_dtype, "weight");
  check_weight_dtype(op, xd, wd);
  RmsNormParams p;
  p.x = reinterpret_cast<const void*>(x);
  p.x_row_stride = x_row_stride;
  p.residual = reinterpret_cast<const void*>(residual);
  p.residual_row_stride = residual_row_stride;
  p.weight = reinterpret_cast<const void*>(weight);
  p.weight_dtype = wd;
  p.y = reinterpret_cast<void*>(y);
  p.y_row_stride = y_row_stride;
  p.sum_out = reinterpret_cast<void*>(sum_out);
  p.sum_row_stride = sum_row_stride;
  p.rows = rows;
  p.hidden = hidden;
  p.eps = static_cast<float>(eps);
  p.weight_offset = static_cast<float>(weight_offset);
  DeviceGuard guard(device_index);
  check_cuda(fray::rmsnorm(xd, p, reinterpret_cast<cudaStream_t>(stream)), op);
}

}  // namespace

void rmsnorm(uintptr_t x, int64_t x_row_stride, uintptr_t weight, int weight_dtype, uintptr_t y,
             int64_t y_row_stride, int64_t rows, int64_t hidden, double eps, double weight_offset,
             int x_dtype, int device_index, uintptr_t stream) {
  run_rmsnorm("rmsnorm", x, x_row_stride, 0, 0, weight, weight_dtype, y, y_row_stride, 0, 0, rows, hidden, eps,
              weight_offset, x_dtype, device_index, stream);
}

void add_rmsnorm(uintptr_t x, int64_t x_row_stride, uintptr_t residual, int64_t residual_row_stride,
                 uintptr_t weight, int weight_dtype, uintptr_t y, int64_t y_row_stride,
                 uintptr_t sum_out, int64_t sum_row_stride, int64_t rows, int64_t hidden, double eps,
                 double weight_offset, int x_dtype, int device_index, uintptr_t stream) {
  run_rmsnorm("add_rmsnorm", x, x_row_stride, residual, residual_row_stride, weight, weight_dtype, y, y_row_stride,
              sum_out, sum_row_stride, rows, hidden, eps, weight_offset, x_dtype, device_index, stream);
}

void layernorm(uintptr_t x, int64_t x_row_stride, uintptr_t weight, int weight_dtype, uintptr_t bias,
               int bias_dtype, uintptr_t y, int64_t y_row_stride, int64_t rows, int64_t hidden, double eps,
               int x_dtype, int device_index, uintptr_t stream) {
  const DType xd = dtype_from_code(x_dtype, "x");
  const DType wd = dtype_from_code(weight_dtype, "weight");
  check_weight_dtype("layernorm", xd, wd);
  if (bias != 0) {
    const DType bd = dtype_from_code(bias_dtype, "bias");
    if (bd != wd) {
      throw std::invalid_argument(std::string("fray: layernorm bias dtype ") + dtype_name(bd) +
                                  " differs from the weight dtype " + dtype_name(wd));
    }
  }
  LayerNormParams p;
  p.x = reinterpret_cast<const void*>(x);
  p.x_row_stride = x_row_stride;
  p.weight = reinterpret_cast<const void*>(weight);
  p.bias = reinterpret_cast<const void*>(bias);
  p.weight_dtype = wd;
  p.y = reinterpret_cast<void*>(y);
  p.y_row_stride = y_row_stride;
  p.rows = rows;
  p.hidden = hidden;
  p.eps = static_cast<float>(eps);
  DeviceGuard guard(device_index);
  check_cuda(fray::layernorm(xd, p, reinterpret_cast<cudaStream_t>(stream)), "layernorm");
}

std::string archs() { return FRAY_CUDA_ARCHS; }

int cuda_runtime_version() {
  int version = 0;
  check_cuda(cudaRuntimeGetVersion(&version), "cudaRuntimeGetVersion");
  return version;
}

int num_kernel_instances() { return rmsnorm_num_kernel_instances(); }

}  // namespace norm_api
}  // namespace fray
