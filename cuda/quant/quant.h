// Fray quant family: host-only API of the ahead-of-time quantizers (plain C++; no CUDA compiler
// needed). The scaled GEMMs are JIT kernels (cuda/gemm); these are the memory-bound producers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch_abi.h"

namespace fray {

// x [rows, cols] (fp32 / fp16 / bf16, unit column stride) quantized to int8 or float8_e4m3fn with
// one fp32 scale per group: a row (group = 0, "token") or 128 consecutive columns of a row (group =
// 128, "block" (1, 128); the last group of a row clipped at cols). The semantics of
// fray.reference.quant:
//   dynamic: scale = amax / qmax over the group's finite |x| (qmax 127 or 448; IEEE division),
//            0 replaced by 1, written to `scale`;
//   static:  scale read from `scale` (what the caller gave);
//   q = round-to-nearest-even(x / scale) in fp32 (IEEE division), saturated to [-qmax, qmax]
//   (+-inf saturate); NaN gives 0 (int8) or NaN (e4m3).
// Strides are in elements; a group's scale sits at scale[row * scale_row_stride + g *
// scale_group_stride] (row-major [rows, groups], or DeepGEMM's MN-major layout with stride 1 along
// rows). Any row strides and bases: 16-byte vectors where they are aligned, elements elsewhere.
struct QuantizeParams {
  const void* x = nullptr;
  int64_t x_row_stride = 0;
  void* q = nullptr;  // int8_t or __nv_fp8_e4m3 bytes
  int64_t q_row_stride = 0;
  float* scale = nullptr;
  int64_t scale_row_stride = 0;
  int64_t scale_group_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int group = 0;        // 0: per row; 128: per (1, 128) block
  bool fp8 = false;     // false: int8
  bool is_static = false;
};

// Enqueues on `stream` (the caller has made its device current). Never synchronises, allocates or
// throws; cudaErrorInvalidValue for an unsupported dtype or group, else the launch status.
cudaError_t quantize(DType dtype, const QuantizeParams& p, cudaStream_t stream);
int quantize_num_kernel_instances();

// The launcher (quant_api.cc), called through the generic binder (cuda/common/binder.h) as
// ext.quantize(ptrs, ints, floats, device, stream); dtype codes 0 fp32, 1 fp16, 2 bf16.
namespace quant_api {

//   ptrs   x, q, scale
//   ints   x_row_stride, q_row_stride, scale_row_stride, scale_group_stride, rows, cols,
//          group (0 or 128), out code (0 int8, 1 float8_e4m3fn), static (0 or 1), dtype
//   floats none
void quantize(const FrayArgs& a);

int num_kernel_instances();

}  // namespace quant_api
}  // namespace fray
