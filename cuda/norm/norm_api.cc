// Fray norm family: the launchers behind the generic binder (FrayArgs in; no torch, no
// pybind11). Host-only; compiled by the C++ compiler. Slot orders: cuda/norm/norm.h.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/common/launch_abi.h"
#include "cuda/norm/norm.h"

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

}  // namespace

void rmsnorm(const FrayArgs& a) {
  require_slots(a, 5, 8, 2, "rmsnorm");
  const DType xd = dtype_from_code(static_cast<int>(a.ints[6]), "x");
  const DType wd = dtype_from_code(static_cast<int>(a.ints[7]), "weight");
  const bool fused = a.ptrs[3] != 0;
  check_weight_dtype(fused ? "add_rmsnorm" : "rmsnorm", xd, wd);
  RmsNormParams p;
  p.x = reinterpret_cast<const void*>(a.ptrs[0]);
  p.weight = reinterpret_cast<const void*>(a.ptrs[1]);
  p.y = reinterpret_cast<void*>(a.ptrs[2]);
  p.residual = reinterpret_cast<const void*>(a.ptrs[3]);
  p.sum_out = reinterpret_cast<void*>(a.ptrs[4]);
  p.x_row_stride = a.ints[0];
  p.y_row_stride = a.ints[1];
  p.residual_row_stride = a.ints[2];
  p.sum_row_stride = a.ints[3];
  p.rows = a.ints[4];
  p.hidden = a.ints[5];
  p.weight_dtype = wd;
  p.eps = static_cast<float>(a.floats[0]);
  p.weight_offset = static_cast<float>(a.floats[1]);
  DeviceGuard guard(a.device);
  check_cuda(fray::rmsnorm(xd, p, reinterpret_cast<cudaStream_t>(a.stream)), fused ? "add_rmsnorm" : "rmsnorm");
}

void layernorm(const FrayArgs& a) {
  require_slots(a, 4, 6, 1, "layernorm");
  const DType xd = dtype_from_code(static_cast<int>(a.ints[4]), "x");
  const DType wd = dtype_from_code(static_cast<int>(a.ints[5]), "weight");
  check_weight_dtype("layernorm", xd, wd);
  LayerNormParams p;
  p.x = reinterpret_cast<const void*>(a.ptrs[0]);
  p.weight = reinterpret_cast<const void*>(a.ptrs[1]);
  p.bias = reinterpret_cast<const void*>(a.ptrs[2]);
  p.y = reinterpret_cast<void*>(a.ptrs[3]);
  p.x_row_stride = a.ints[0];
  p.y_row_stride = a.ints[1];
  p.rows = a.ints[2];
  p.hidden = a.ints[3];
  p.weight_dtype = wd;
  p.eps = static_cast<float>(a.floats[0]);
  DeviceGuard guard(a.device);
  check_cuda(fray::layernorm(xd, p, reinterpret_cast<cudaStream_t>(a.stream)), "layernorm");
}

int num_kernel_instances() { return rmsnorm_num_kernel_instances(); }

}  // namespace norm_api
}  // namespace fray
