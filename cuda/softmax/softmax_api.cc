// Fray softmax family: Python-facing adapters with plain integer / float
// arguments (no torch, no pybind11). Host-only; compiled by the C++ compiler.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/softmax/softmax.h"

#ifndef FRAY_CUDA_ARCHS
#define FRAY_CUDA_ARCHS "unknown"
#endif

namespace fray {
namespace softmax_api {
namespace {

void run(const SoftmaxParams& p, int device_index, uintptr_t stream, const char* what) {
  DeviceGuard guard(device_index);
  check_cuda(fray::softmax(p, reinterpret_cast<cudaStream_t>(stream)), what);
}

}  // namespace

void softmax(uintptr_t x, int64_t x_row_stride, int x_dtype, uintptr_t y, int64_t y_row_stride, int y_dtype,
             int64_t rows, int64_t cols, double temperature, int device_index, uintptr_t stream) {
  // 1 / temperature must be a finite fp32 (the kernels multiply by log2(e) / T).
  if (!(std::isfinite(temperature) && temperature > 0.0 && 1.4426950408889634 / temperature < 3.0e38)) {
    throw std::invalid_argument("fray: softmax temperature must be finite and > 0 with 1/temperature a finite "
                                "float32, got " + std::to_string(temperature));
  }
  SoftmaxParams p;
  p.x = reinterpret_cast<const void*>(x);
  p.x_row_stride = x_row_stride;
  p.x_dtype = dtype_from_code(x_dtype, "x");
  p.y = reinterpret_cast<void*>(y);
  p.y_row_stride = y_row_stride;
  p.y_dtype = dtype_from_code(y_dtype, "y");
  p.rows = rows;
  p.cols = cols;
  p.temperature = temperature;
  run(p, device_index, stream, "softmax");
}

void online_softmax(uintptr_t x, int64_t x_row_stride, uintptr_t y, int64_t y_row_stride, uintptr_t row_max,
                    uintptr_t row_lse, int64_t rows, int64_t cols, int dtype, int device_index, uintptr_t stream) {
  if ((row_max == 0) != (row_lse == 0)) {
    throw std::invalid_argument("fray: online_softmax needs both row_max and row_lse, or neither");
  }
  SoftmaxParams p;
  p.x = reinterpret_cast<const void*>(x);
  p.x_row_stride = x_row_stride;
  p.x_dtype = dtype_from_code(dtype, "x");
  p.y = reinterpret_cast<void*>(y);
  p.y_row_stride = y_row_stride;
  p.y_dtype = p.x_dtype;
  p.row_max = reinterpret_cast<float*>(row_max);
  p.row_lse = reinterpret_cast<float*>(row_lse);
  p.rows = rows;
  p.cols = cols;
  p.temperature = 1.0;
  run(p, device_index, stream, "online_softmax");
}

std::string archs() { return FRAY_CUDA_ARCHS; }

int cuda_runtime_version() {
  int version = 0;
  check_cuda(cudaRuntimeGetVersion(&version), "cudaRuntimeGetVersion");
  return version;
}

int num_kernel_instances() { return softmax_num_kernel_instances(); }

}  // namespace softmax_api
}  // namespace fray
