// Fray elementwise family: Python-facing adapters with plain integer arguments (no torch, no
// pybind11). Host-only; compiled by the C++ compiler.
#include <cuda_runtime_api.h>

#include <atomic>
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
namespace {

// Multiprocessor count of `device`, queried once per device and kept per device index (a
// process may drive several GPUs of different kinds). Benign race: two threads may both query
// and store the same value.
int sm_count(int device) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cache[kCachedDevices] = {};
  if (device >= 0 && device < kCachedDevices) {
    const int hit = cache[device].load(std::memory_order_relaxed);
    if (hit > 0) return hit;
  }
  int count = 0;
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  if (device >= 0 && device < kCachedDevices) cache[device].store(count, std::memory_order_relaxed);
  return count;
}

}  // namespace

void vector_add(uintptr_t a, uintptr_t b, uintptr_t out, int64_t n, int dtype, int device_index, uintptr_t stream) {
  const DType d = dtype_from_code(dtype, "a");
  DeviceGuard guard(device_index);
  int device = device_index;
  if (device < 0) check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  VectorAddParams p;
  p.a = reinterpret_cast<const void*>(a);
  p.b = reinterpret_cast<const void*>(b);
  p.out = reinterpret_cast<void*>(out);
  p.n = n;
  p.sm_count = sm_count(device);
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
