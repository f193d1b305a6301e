// Fray topk family: non-template entry points. The kernels are compiled by the
// per-dtype units topk_{f32,f16,bf16}.cu (declared extern here).
#include "cuda/topk/topk.h"

#include "cuda/common/dtype.h"
#include "cuda/topk/argmax.cuh"
#include "cuda/topk/topk.cuh"

namespace fray {

extern template cudaError_t launch_topk<float>(const TopkParams&, cudaStream_t);
extern template cudaError_t launch_topk<__half>(const TopkParams&, cudaStream_t);
extern template cudaError_t launch_topk<__nv_bfloat16>(const TopkParams&, cudaStream_t);
extern template cudaError_t launch_argmax<float>(const ArgmaxParams&, cudaStream_t);
extern template cudaError_t launch_argmax<__half>(const ArgmaxParams&, cudaStream_t);
extern template cudaError_t launch_argmax<__nv_bfloat16>(const ArgmaxParams&, cudaStream_t);

cudaError_t topk(const TopkParams& p, cudaStream_t stream) {
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_topk<T>(p, stream);
  });
}

cudaError_t argmax(const ArgmaxParams& p, cudaStream_t stream) {
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_argmax<T>(p, stream);
  });
}

int topk_num_kernel_instances() {
  return 3 * (topk_num_kernels<float>() + argmax_num_kernels<float>());
}

}  // namespace fray
