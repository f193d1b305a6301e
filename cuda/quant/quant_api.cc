// Fray quant family: the launcher behind the generic binder (FrayArgs in; no torch, no pybind11).
// Host-only; compiled by the C++ compiler. Slot order: cuda/quant/quant.h.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/quant/quant.h"

namespace fray {
namespace quant_api {

void quantize(const FrayArgs& a) {
  require_slots(a, 3, 10, 0, "quantize");
  const DType dt = dtype_from_code(static_cast<int>(a.ints[9]), "x");
  const int64_t group = a.ints[6];
  if (group != 0 && group != 128) {
    throw std::invalid_argument("fray: quantize group " + std::to_string(group) + " (expected 0, per row, or 128)");
  }
  if (a.ints[7] != 0 && a.ints[7] != 1) {
    throw std::invalid_argument("fray: quantize out code " + std::to_string(a.ints[7]) +
                                " (expected 0 int8 or 1 float8_e4m3fn)");
  }
  QuantizeParams p;
  p.x = reinterpret_cast<const void*>(a.ptrs[0]);
  p.q = reinterpret_cast<void*>(a.ptrs[1]);
  p.scale = reinterpret_cast<float*>(a.ptrs[2]);
  p.x_row_stride = a.ints[0];
  p.q_row_stride = a.ints[1];
  p.scale_row_stride = a.ints[2];
  p.scale_group_stride = a.ints[3];
  p.rows = a.ints[4];
  p.cols = a.ints[5];
  p.group = static_cast<int>(group);
  p.fp8 = a.ints[7] == 1;
  p.is_static = a.ints[8] != 0;
  DeviceGuard guard(a.device);
  check_cuda(fray::quantize(dt, p, reinterpret_cast<cudaStream_t>(a.stream)), "quantize");
}

int num_kernel_instances() { return quantize_num_kernel_instances(); }

}  // namespace quant_api
}  // namespace fray
