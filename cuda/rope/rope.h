// Fray rope family: host-only API (plain C++; no CUDA compiler needed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch_abi.h"

namespace fray {

// Rotary position embedding of q [tokens, q_heads, head_dim] and (optionally)
// k [tokens, k_heads, head_dim]. Token and head strides are in elements and
// arbitrary (views into a fused qkv buffer are fine); the last dim is contiguous.
//
// For each token t with position p (positions[t * positions_stride], int32 or
// int64, or position_offset + t when positions == nullptr) and each rotated
// pair (x, y) of a head, with c = cos[p * cs_row_stride + i], s = sin[...]:
//   neox (rotate halves):  x = h[i],     y = h[i + rotary_dim/2], i < rotary_dim/2
//   gptj (interleaved):    x = h[2i],    y = h[2i + 1],           i < rotary_dim/2
//   x' = T(x*c - y*s),  y' = T(y*c + x*s)      (fp32 math, one rounding)
// Elements [rotary_dim, head_dim) pass through (copied when out != in).
// Positions are trusted: they must lie in [0, max_position) of the cos/sin rows.
//
// In place is allowed: q_out may alias q and k_out may alias k (same pointers and
// strides); every element is read and later written by the same thread.
struct RopeParams {
  const void* q = nullptr;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  void* q_out = nullptr;
  int64_t q_out_token_stride = 0;
  int64_t q_out_head_stride = 0;
  const void* k = nullptr;  // nullptr (and k_heads == 0): q only
  int64_t k_token_stride = 0;
  int64_t k_head_stride = 0;
  void* k_out = nullptr;
  int64_t k_out_token_stride = 0;
  int64_t k_out_head_stride = 0;
  const void* positions = nullptr;  // nullptr: position = position_offset + token
  bool positions_int64 = false;
  int64_t positions_stride = 1;
  int64_t position_offset = 0;
  const float* cos = nullptr;  // fp32 rows of rotary_dim / 2 values
  const float* sin = nullptr;
  int64_t cs_row_stride = 0;  // floats between the rows of cos (and of sin)
  int64_t tokens = 0;
  int64_t q_heads = 0;
  int64_t k_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // even, 2 <= rotary_dim <= head_dim
  bool neox = true;        // false: gptj
};

// Enqueues the kernel on `stream` (the caller has made the stream's device
// current). Never synchronises, allocates or throws. Returns
// cudaErrorInvalidValue for an odd or out-of-range rotary_dim, else the launch
// status.
cudaError_t rope(DType dtype, const RopeParams& p, cudaStream_t stream);

// Number of distinct rope kernels compiled into the library.
int rope_num_kernel_instances();

// The launcher (rope_api.cc), called through the generic binder (cuda/common/binder.h) as
// ext.rope(ptrs, ints, floats, device, stream); dtype codes 0 fp32, 1 fp16, 2 bf16. Throws
// std::invalid_argument for bad codes or sizes and std::runtime_error for CUDA errors.
namespace rope_api {

//   ptrs   q, q_out, k (0: none), k_out, positions (0: position_offset + token index),
//          cos, sin (0: cos is the cos | sin table of rotary_dim columns)
//   ints   q_token_stride, q_head_stride, q_out_token_stride, q_out_head_stride,
//          k_token_stride, k_head_stride, k_out_token_stride, k_out_head_stride,
//          positions_dtype (0 none, 32 int32, 64 int64), positions_stride, cs_row_stride,
//          tokens, q_heads, k_heads, head_dim, rotary_dim, neox, dtype, position_offset
//   floats none
// position_offset is last: it changes from call to call where the rest does not.
void rope(const FrayArgs& a);

int num_kernel_instances();

}  // namespace rope_api
}  // namespace fray
