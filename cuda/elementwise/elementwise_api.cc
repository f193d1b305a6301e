// Fray elementwise family: the launcher behind the generic binder (FrayArgs in; no torch, no
// pybind11). Host-only; compiled by the C++ compiler. Slot order: cuda/elementwise/elementwise.h.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/elementwise/elementwise.h"

namespace fray {
namespace elementwise_api {
void vector_add(const FrayArgs& a) {
  require_slots(a, 3, 2, 0, "vector_add");
  const DType d = dtype_from_code(static_cast<int>(a.ints[1]), "a");
  VectorAddParams p;
  p.a = reinterpret_cast<const void*>(a.ptrs[0]);
  p.b = reinterpret_cast<const void*>(a.ptrs[1]);
  p.out = reinterpret_cast<void*>(a.ptrs[2]);
  p.n = a.ints[0];
  DeviceGuard guard(a.device);
  check_cuda(fray::vector_add(d, p, reinterpret_cast<cudaStream_t>(a.stream)), "vector_add");
}

void mul(const FrayArgs& a) {
  require_slots(a, 3, 2, 0, "mul");
  const DType d = dtype_from_code(static_cast<int>(a.ints[1]), "a");
  MulParams p;
  p.a = reinterpret_cast<const void*>(a.ptrs[0]);
  p.b = reinterpret_cast<const void*>(a.ptrs[1]);
  p.out = reinterpret_cast<void*>(a.ptrs[2]);
  p.n = a.ints[0];
  DeviceGuard guard(a.device);
  check_cuda(fray::mul(d, p, reinterpret_cast<cudaStream_t>(a.stream)), "mul");
}

void axpy(const FrayArgs& a) {
  require_slots(a, 2, 2, 2, "axpy");
  const DType d = dtype_from_code(static_cast<int>(a.ints[1]), "x");
  AxpyParams p;
  p.x = reinterpret_cast<const void*>(a.ptrs[0]);
  p.out = reinterpret_cast<void*>(a.ptrs[1]);
  p.n = a.ints[0];
  p.a = static_cast<float>(a.floats[0]);
  p.b = static_cast<float>(a.floats[1]);
  DeviceGuard guard(a.device);
  check_cuda(fray::axpy(d, p, reinterpret_cast<cudaStream_t>(a.stream)), "axpy");
}

}  // namespace elementwise_api
}  // namespace fray
