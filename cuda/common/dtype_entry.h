// Fray: the non-template entry point of a per-dtype launcher, written once for every family.
//
// A family's kernels are instantiated per element type in <op>_{f32,f16,bf16}.cu (one nvcc action
// each, in parallel); its <family>.cu declares those instantiations extern and defines the
// entry points the host-only launcher calls. FRAY_DTYPE_ENTRY writes that unit's body:
//
//   FRAY_DTYPE_ENTRY(rmsnorm, launch_rmsnorm, RmsNormParams)
//     extern template cudaError_t launch_rmsnorm<T>(const RmsNormParams&, cudaStream_t), T = float,
//     __half, __nv_bfloat16, and
//     cudaError_t rmsnorm(DType dtype, const RmsNormParams& p, cudaStream_t stream), dispatching on
//     dtype (cudaErrorInvalidValue for any other);
//   FRAY_DTYPE_KERNEL_COUNT(rmsnorm_num_kernel_instances, rmsnorm_num_kernels)
//     extern template int rmsnorm_num_kernels<T>(), and
//     int rmsnorm_num_kernel_instances(), their sum over the three dtypes.
//
// Use inside namespace fray. Only host code: the kernels stay in the per-dtype units.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/dtype.h"

#define FRAY_DTYPE_ENTRY(entry, launch, Params)                                               \
  extern template cudaError_t launch<float>(const Params&, cudaStream_t);                     \
  extern template cudaError_t launch<__half>(const Params&, cudaStream_t);                    \
  extern template cudaError_t launch<__nv_bfloat16>(const Params&, cudaStream_t);             \
  cudaError_t entry(DType dtype, const Params& p, cudaStream_t stream) {                      \
    return dispatch_dtype(dtype, [&](auto tag) {                                              \
      return launch<typename decltype(tag)::type>(p, stream);                                 \
    });                                                                                       \
  }

#define FRAY_DTYPE_KERNEL_COUNT(entry, count)                                                 \
  extern template int count<float>();                                                         \
  extern template int count<__half>();                                                        \
  extern template int count<__nv_bfloat16>();                                                 \
  int entry() { return count<float>() + count<__half>() + count<__nv_bfloat16>(); }
