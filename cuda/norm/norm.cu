// Fray norm family: non-template entry points. The kernels are compiled by the
// per-dtype units rmsnorm_{f32,f16,bf16}.cu and layernorm_{f32,f16,bf16}.cu
// (declared extern here).
#include "cuda/norm/norm.h"

#include "cuda/common/dtype.h"
#include "cuda/norm/layernorm.cuh"
#include "cuda/norm/rmsnorm.cuh"

namespace fray {

extern template cudaError_t launch_rmsnorm<float>(const RmsNormParams&, cudaStream_t);
extern template cudaError_t launch_rmsnorm<__half>(const RmsNormParams&, cudaStream_t);
extern template cudaError_t launch_rmsnorm<__nv_bfloat16>(const RmsNormParams&, cudaStream_t);
extern template int rmsnorm_num_kernels<float>();
extern template int rmsnorm_num_kernels<__half>();
extern template int rmsnorm_num_kernels<__nv_bfloat16>();
extern template cudaError_t launch_layernorm<float>(const LayerNormParams&, cudaStream_t);
extern template cudaError_t launch_layernorm<__half>(const LayerNormParams&, cudaStream_t);
extern template cudaError_t launch_layernorm<__nv_bfloat16>(const LayerNormParams&, cudaStream_t);
extern template int layernorm_num_kernels<float>();
extern template int layernorm_num_kernels<__half>();
extern template int layernorm_num_kernels<__nv_bfloat16>();

cudaError_t rmsnorm(DType x_dtype, const RmsNormParams& p, cudaStream_t stream) {
  return dispatch_dtype(x_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_rmsnorm<T>(p, stream);
  });
}

int rmsnorm_num_kernel_instances() {
  return rmsnorm_num_kernels<float>() + rmsnorm_num_kernels<__half>() + rmsnorm_num_kernels<__nv_bfloat16>();
}

cudaError_t layernorm(DType x_dtype, const LayerNormParams& p, cudaStream_t stream) {
  return dispatch_dtype(x_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_layernorm<T>(p, stream);
  });
}

int layernorm_num_kernel_instances() {
  return layernorm_num_kernels<float>() + layernorm_num_kernels<__half>() + layernorm_num_kernels<__nv_bfloat16>();
}

}  // namespace fray
