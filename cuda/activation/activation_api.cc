// Fray activation family: Python-facing adapters with plain integer arguments
// (no torch, no pybind11). Host-only; compiled by the C++ compiler.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/activation/activation.h"
#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"

#ifndef FRAY_CUDA_ARCHS
#define FRAY_CUDA_ARCHS "unknown"
#endif

namespace fray {
namespace activation_api {
namespace {

void run(Activation act, uintptr_t gate, int64_t gate_row_stride, uintptr_t up, int64_t up_row_stride,
         uintptr_t out, int64_t out_row_stride, int64_t rows, int64_t d, int dtype, int device_index,
         uintptr_t stream, const char* what) {
  const DType dt = dtype_from_code(dtype, "gate");
  ActMulParams p;
  p.act = act;
  p.gate = reinterpret_cast<const void*>(gate);
  p.gate_row_stride = gate_row_stride;
  p.up = reinterpret_cast<const void*>(up);
  p.up_row_stride = up_row_stride;
  p.out = reinterpret_cast<void*>(out);
  p.out_row_stride = out_row_stride;
  p.rows = rows;
  p.d = d;
  DeviceGuard guard(device_index);
  check_cuda(fray::act_mul(dt, p, reinterpret_cast<cudaStream_t>(stream)), what);
}

}  // namespace

void silu_mul(uintptr_t gate, int64_t gate_row_stride, uintptr_t up, int64_t up_row_stride, uintptr_t out,
              int64_t out_row_stride, int64_t rows, int64_t d, int dtype, int device_index, uintptr_t stream) {
  run(Activation::kSilu, gate, gate_row_stride, up, up_row_stride, out, out_row_stride, rows, d, dtype,
      device_index, stream, "silu_mul");
}

void gelu_mul(uintptr_t gate, int64_t gate_row_stride, uintptr_t up, int64_t up_row_stride, uintptr_t out,
              int64_t out_row_stride, int64_t rows, int64_t d, bool approximate_tanh, int dtype, int device_index,
              uintptr_t stream) {
  run(approximate_tanh ? Activation::kGeluTanh : Activation::kGeluErf, gate, gate_row_stride, up, up_row_stride,
      out, out_row_stride, rows, d, dtype, device_index, stream, "gelu_mul");
}

std::string archs() { return FRAY_CUDA_ARCHS; }

int cuda_runtime_version() {
  int version = 0;
  check_cuda(cudaRuntimeGetVersion(&version), "cudaRuntimeGetVersion");
  return version;
}

int num_kernel_instances() { return act_mul_num_kernel_instances(); }

}  // namespace activation_api
}  // namespace fray
