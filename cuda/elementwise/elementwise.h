// Fray elementwise family: host-only API (plain C++; no CUDA compiler needed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch_abi.h"

namespace fray {

// out[i] = T(float(a[i]) + float(b[i])) for i < n over flat, dense arrays (the caller has
// checked that a, b and out share one layout). out may alias a or b (same pointer); partial
// overlaps are not allowed.
struct VectorAddParams {
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  int64_t n = 0;
};

// Enqueues the kernel on `stream` (the caller has made the stream's device current). Never
// synchronises, allocates or throws. Returns cudaErrorInvalidValue for an unsupported dtype,
// else the launch status.
cudaError_t vector_add(DType dtype, const VectorAddParams& p, cudaStream_t stream);

// out[i] = T(float(a[i]) * float(b[i])), same contract as vector_add.
struct MulParams {
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  int64_t n = 0;
};
cudaError_t mul(DType dtype, const MulParams& p, cudaStream_t stream);

// out[i] = T(fmaf(a, float(x[i]), b)) for scalars a, b (a scale and shift; one rounding in fp32,
// one to T). out may be x itself; partial overlap is undefined.
struct AxpyParams {
  const void* x = nullptr;
  void* out = nullptr;
  int64_t n = 0;
  float a = 1.0f;
  float b = 0.0f;
};
cudaError_t axpy(DType dtype, const AxpyParams& p, cudaStream_t stream);

// The launcher (elementwise_api.cc), called through the generic binder (cuda/common/binder.h) as
// ext.vector_add(ptrs, ints, floats, device, stream); dtype codes 0 fp32, 1 fp16, 2 bf16. Throws
// std::invalid_argument for a bad code and std::runtime_error for CUDA errors.
namespace elementwise_api {

//   ptrs   a, b, out
//   ints   n, dtype
//   floats none
void vector_add(const FrayArgs& a);

//   ptrs   a, b, out
//   ints   n, dtype
//   floats none
void mul(const FrayArgs& a);

//   ptrs   x, out
//   ints   n, dtype
//   floats a, b
void axpy(const FrayArgs& a);


}  // namespace elementwise_api
}  // namespace fray
