// Fray rope family: Python-facing adapter with plain integer arguments (no
// torch, no pybind11). Host-only; compiled by the C++ compiler.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/rope/rope.h"

#ifndef FRAY_CUDA_ARCHS
#define FRAY_CUDA_ARCHS "unknown"
#endif

namespace fray {
namespace rope_api {
void rope(uintptr_t q, int64_t q_token_stride, int64_t q_head_stride, uintptr_t q_out,
          int64_t q_out_token_stride, int64_t q_out_head_stride, uintptr_t k, int64_t k_token_stride,
          int64_t k_head_stride, uintptr_t k_out, int64_t k_out_token_stride, int64_t k_out_head_stride,
          uintptr_t positions, int positions_dtype, int64_t positions_stride, int64_t position_offset,
          uintptr_t cos, uintptr_t sin, int64_t cs_row_stride, int64_t tokens, int64_t q_heads,
          int64_t k_heads, int64_t head_dim, int64_t rotary_dim, bool neox, int dtype, int device_index,
          uintptr_t stream) {
  const DType d = dtype_from_code(dtype, "q");
  if (positions_dtype != 0 && positions_dtype != 32 && positions_dtype != 64) {
    throw std::invalid_argument("fray: rope positions_dtype must be 0 (none), 32 or 64, got " +
                                std::to_string(positions_dtype));
  }
  if ((positions_dtype == 0) != (positions == 0)) {
    throw std::invalid_argument("fray: rope positions pointer and positions_dtype disagree");
  }
  if (rotary_dim < 2 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    throw std::invalid_argument("fray: rope rotary_dim must be even and in [2, head_dim=" +
                                std::to_string(head_dim) + "], got " + std::to_string(rotary_dim));
  }
  RopeParams p;
  p.q = reinterpret_cast<const void*>(q);
  p.q_token_stride = q_token_stride;
  p.q_head_stride = q_head_stride;
  p.q_out = reinterpret_cast<void*>(q_out);
  p.q_out_token_stride = q_out_token_stride;
  p.q_out_head_stride = q_out_head_stride;
  p.k = reinterpret_cast<const void*>(k);
  p.k_token_stride = k_token_stride;
  p.k_head_stride = k_head_stride;
  p.k_out = reinterpret_cast<void*>(k_out);
  p.k_out_token_stride = k_out_token_stride;
  p.k_out_head_stride = k_out_head_stride;
  p.positions = reinterpret_cast<const void*>(positions);
  p.positions_int64 = positions_dtype == 64;
  p.positions_stride = positions_stride;
  p.position_offset = position_offset;
  p.cos = reinterpret_cast<const float*>(cos);
  p.sin = reinterpret_cast<const float*>(sin);
  p.cs_row_stride = cs_row_stride;
  p.tokens = tokens;
  p.q_heads = q_heads;
  p.k_heads = k == 0 ? 0 : k_heads;
  p.head_dim = head_dim;
  p.rotary_dim = rotary_dim;
  p.neox = neox;
  DeviceGuard guard(device_index);
  check_cuda(fray::rope(d, p, reinterpret_cast<cudaStream_t>(stream)), "rope");
}

std::string archs() { return FRAY_CUDA_ARCHS; }

int cuda_runtime_version() {
  int version = 0;
  check_cuda(cudaRuntimeGetVersion(&version), "cudaRuntimeGetVersion");
  return version;
}

int num_kernel_instances() { return rope_num_kernel_instances(); }

}  // namespace rope_api
}  // namespace fray
