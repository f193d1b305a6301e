// Fray elementwise family: Python-facing adapters with plain integer arguments (no torch, no
// pybind11). Host-only; compiled by the C++ compiler.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/elementwise/elementwise.h"

#ifndef FRAY_CUDA_ARCHS
#define FRAY_CUDA_ARCHS "unknown"
#endif

namespace fray {
namespace elementwise_api {
void vector_add(uintptr_t a, uintptr_t b, uintptr_t out, int64_t n, int dtype, int device_index, uintptr_t stream) {
  const DType d = dtype_from_code(dtype, "a");
  DeviceGuard guard(device_index);
  VectorAddParams p;
  p.a = reinterpret_cast<const void*>(a);
  p.b = reinterpret_cast<const void*>(b);
  p.out = reinterpret_cast<void*>(out);
  p.n = n;
  check_cuda(fray::vector_add(d, p, reinterpret_cast<cudaStream_t>(stream)), "vector_add");
}

std::string archs() { return FRAY_CUDA_ARCHS; }

int cuda_runtime_version() {
  int version = 0;
  check_cuda(cudaRuntimeGetVersion(&version), "cudaRuntimeGetVersion");
  return version;
}

}  // namespace elementwise_api
}  // namespace fray
