// Fray softmax family: the launcher behind the generic binder (FrayArgs in; no torch, no
// pybind11). Host-only; compiled by the C++ compiler. Slot order: cuda/softmax/softmax.h.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/softmax/softmax.h"

namespace fray {
namespace softmax_api {
void softmax(const FrayArgs& a) {
  require_slots(a, 4, 6, 1, "softmax");
  const double temperature = a.floats[0];
  // 1 / temperature must be a finite fp32 (the kernels multiply by log2(e) / T).
  if (!(std::isfinite(temperature) && temperature > 0.0 && 1.4426950408889634 / temperature < 3.0e38)) {
    throw std::invalid_argument("fray: softmax temperature must be finite and > 0 with 1/temperature a finite "
                                "float32, got " + std::to_string(temperature));
  }
  if ((a.ptrs[2] == 0) != (a.ptrs[3] == 0)) {
    throw std::invalid_argument("fray: online_softmax needs both row_max and row_lse, or neither");
  }
  const bool online = a.ptrs[2] != 0;
  SoftmaxParams p;
  p.x = reinterpret_cast<const void*>(a.ptrs[0]);
  p.y = reinterpret_cast<void*>(a.ptrs[1]);
  p.row_max = reinterpret_cast<float*>(a.ptrs[2]);
  p.row_lse = reinterpret_cast<float*>(a.ptrs[3]);
  p.x_row_stride = a.ints[0];
  p.y_row_stride = a.ints[1];
  p.rows = a.ints[2];
  p.cols = a.ints[3];
  p.x_dtype = dtype_from_code(static_cast<int>(a.ints[4]), "x");
  p.y_dtype = dtype_from_code(static_cast<int>(a.ints[5]), "y");
  p.temperature = temperature;
  DeviceGuard guard(a.device);
  check_cuda(fray::softmax(p, reinterpret_cast<cudaStream_t>(a.stream)), online ? "online_softmax" : "softmax");
}

int num_kernel_instances() { return softmax_num_kernel_instances(); }

}  // namespace softmax_api
}  // namespace fray
