// Fray activation family: the launcher behind the generic binder (FrayArgs in; no torch, no
// pybind11). Host-only; compiled by the C++ compiler. Slot order: cuda/activation/activation.h.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/activation/activation.h"
#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"

namespace fray {
namespace activation_api {
void act_mul(const FrayArgs& a) {
  require_slots(a, 3, 7, 0, "act_mul");
  const DType dt = dtype_from_code(static_cast<int>(a.ints[6]), "gate");
  const int act = static_cast<int>(a.ints[5]);
  if (!is_valid_activation_code(act)) {
    throw std::invalid_argument("fray: act_mul activation code " + std::to_string(act) +
                                " (expected 0 silu, 1 gelu erf, 2 gelu tanh)");
  }
  static const char* const kNames[] = {"silu_mul", "gelu_mul", "gelu_mul"};
  ActMulParams p;
  p.act = static_cast<Activation>(act);
  p.gate = reinterpret_cast<const void*>(a.ptrs[0]);
  p.d = a.ints[4];
  // up == 0: the fused [rows, 2d] layout, up is the second half of each gate row.
  p.up = a.ptrs[1] != 0 ? reinterpret_cast<const void*>(a.ptrs[1])
                        : static_cast<const char*>(p.gate) + p.d * static_cast<int64_t>(dtype_size(dt));
  p.out = reinterpret_cast<void*>(a.ptrs[2]);
  p.gate_row_stride = a.ints[0];
  p.up_row_stride = a.ints[1];
  p.out_row_stride = a.ints[2];
  p.rows = a.ints[3];
  DeviceGuard guard(a.device);
  check_cuda(fray::act_mul(dt, p, reinterpret_cast<cudaStream_t>(a.stream)), kNames[act]);
}

void unary(const FrayArgs& a) {
  require_slots(a, 2, 3, 0, "unary");
  const DType dt = dtype_from_code(static_cast<int>(a.ints[2]), "x");
  const int act = static_cast<int>(a.ints[1]);
  if (!is_valid_unary_code(act)) {
    throw std::invalid_argument("fray: unary activation code " + std::to_string(act) +
                                " (expected 0 silu, 1 gelu erf, 2 gelu tanh, 3 relu, 4 tanh, 5 sigmoid)");
  }
  static const char* const kNames[] = {"silu", "gelu", "gelu", "relu", "tanh", "sigmoid"};
  UnaryParams p;
  p.act = static_cast<Activation>(act);
  p.x = reinterpret_cast<const void*>(a.ptrs[0]);
  p.out = reinterpret_cast<void*>(a.ptrs[1]);
  p.n = a.ints[0];
  DeviceGuard guard(a.device);
  check_cuda(fray::unary(dt, p, reinterpret_cast<cudaStream_t>(a.stream)), kNames[act]);
}

int num_kernel_instances() { return act_mul_num_kernel_instances() + unary_num_kernel_instances(); }

}  // namespace activation_api
}  // namespace fray
