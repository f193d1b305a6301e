// Fray softmax family: non-template entry points. The kernels are compiled by
// the per-input-dtype units softmax_{f32,f16,bf16}.cu (declared extern here).
#include "cuda/softmax/softmax.h"

#include "cuda/common/dtype.h"
#include "cuda/softmax/softmax.cuh"

namespace fray {

extern template cudaError_t launch_softmax<float>(const SoftmaxParams&, cudaStream_t);
extern template cudaError_t launch_softmax<__half>(const SoftmaxParams&, cudaStream_t);
extern template cudaError_t launch_softmax<__nv_bfloat16>(const SoftmaxParams&, cudaStream_t);
extern template int softmax_num_kernels<float>();
extern template int softmax_num_kernels<__half>();
extern template int softmax_num_kernels<__nv_bfloat16>();

cudaError_t softmax(const SoftmaxParams& p, cudaStream_t stream) {
  return dispatch_dtype(p.x_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_softmax<T>(p, stream);
  });
}

int softmax_num_kernel_instances() {
  return softmax_num_kernels<float>() + softmax_num_kernels<__half>() + softmax_num_kernels<__nv_bfloat16>();
}

}  // namespace fray
