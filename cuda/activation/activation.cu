// Fray activation family: non-template entry points. The kernels are compiled
// by the per-dtype units act_mul_{f32,f16,bf16}.cu (declared extern here).
#include "cuda/activation/activation.h"

#include "cuda/activation/act_mul.cuh"
#include "cuda/common/dtype.h"

namespace fray {

extern template cudaError_t launch_act_mul<float>(const ActMulParams&, cudaStream_t);
extern template cudaError_t launch_act_mul<__half>(const ActMulParams&, cudaStream_t);
extern template cudaError_t launch_act_mul<__nv_bfloat16>(const ActMulParams&, cudaStream_t);
extern template int act_mul_num_kernels<float>();
extern template int act_mul_num_kernels<__half>();
extern template int act_mul_num_kernels<__nv_bfloat16>();

cudaError_t act_mul(DType dtype, const ActMulParams& p, cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_act_mul<T>(p, stream);
  });
}

int act_mul_num_kernel_instances() {
  return act_mul_num_kernels<float>() + act_mul_num_kernels<__half>() + act_mul_num_kernels<__nv_bfloat16>();
}

}  // namespace fray
