// Fray rope family: the launcher behind the generic binder (FrayArgs in; no torch, no
// pybind11). Host-only; compiled by the C++ compiler. Slot order: cuda/rope/rope.h.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/rope/rope.h"

namespace fray {
namespace rope_api {
void rope(const FrayArgs& a) {
  require_slots(a, 7, 19, 0, "rope");
  const int64_t* n = a.ints;
  const DType d = dtype_from_code(static_cast<int>(n[17]), "q");
  const int64_t positions_dtype = n[8], head_dim = n[14], rotary_dim = n[15];
  if (positions_dtype != 0 && positions_dtype != 32 && positions_dtype != 64) {
    throw std::invalid_argument("fray: rope positions_dtype must be 0 (none), 32 or 64, got " +
                                std::to_string(positions_dtype));
  }
  if ((positions_dtype == 0) != (a.ptrs[4] == 0)) {
    throw std::invalid_argument("fray: rope positions pointer and positions_dtype disagree");
  }
  if (rotary_dim < 2 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    throw std::invalid_argument("fray: rope rotary_dim must be even and in [2, head_dim=" +
                                std::to_string(head_dim) + "], got " + std::to_string(rotary_dim));
  }
  RopeParams p;
  p.q = reinterpret_cast<const void*>(a.ptrs[0]);
  p.q_out = reinterpret_cast<void*>(a.ptrs[1]);
  p.k = reinterpret_cast<const void*>(a.ptrs[2]);
  p.k_out = reinterpret_cast<void*>(a.ptrs[3]);
  p.positions = reinterpret_cast<const void*>(a.ptrs[4]);
  p.cos = reinterpret_cast<const float*>(a.ptrs[5]);
  // sin == 0: cos is the [max_position, rotary_dim] cos | sin table, sin its second half.
  p.sin = a.ptrs[6] != 0 ? reinterpret_cast<const float*>(a.ptrs[6]) : p.cos + rotary_dim / 2;
  p.q_token_stride = n[0];
  p.q_head_stride = n[1];
  p.q_out_token_stride = n[2];
  p.q_out_head_stride = n[3];
  p.k_token_stride = n[4];
  p.k_head_stride = n[5];
  p.k_out_token_stride = n[6];
  p.k_out_head_stride = n[7];
  p.positions_int64 = positions_dtype == 64;
  p.positions_stride = n[9];
  p.cs_row_stride = n[10];
  p.tokens = n[11];
  p.q_heads = n[12];
  p.k_heads = a.ptrs[2] == 0 ? 0 : n[13];
  p.head_dim = head_dim;
  p.rotary_dim = rotary_dim;
  p.neox = n[16] != 0;
  p.position_offset = n[18];
  DeviceGuard guard(a.device);
  check_cuda(fray::rope(d, p, reinterpret_cast<cudaStream_t>(a.stream)), "rope");
}

int num_kernel_instances() { return rope_num_kernel_instances(); }

}  // namespace rope_api
}  // namespace fray
