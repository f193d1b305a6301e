// Fray rope family: non-template entry points. The kernels are compiled by the
// per-dtype units rope_{f32,f16,bf16}.cu (declared extern here).
#include "cuda/rope/rope.h"

#include "cuda/common/dtype.h"
#include "cuda/rope/rope.cuh"

namespace fray {

extern template cudaError_t launch_rope<float>(const RopeParams&, cudaStream_t);
extern template cudaError_t launch_rope<__half>(const RopeParams&, cudaStream_t);
extern template cudaError_t launch_rope<__nv_bfloat16>(const RopeParams&, cudaStream_t);
extern template int rope_num_kernels<float>();
extern template int rope_num_kernels<__half>();
extern template int rope_num_kernels<__nv_bfloat16>();

cudaError_t rope(DType dtype, const RopeParams& p, cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_rope<T>(p, stream);
  });
}

int rope_num_kernel_instances() {
  return rope_num_kernels<float>() + rope_num_kernels<__half>() + rope_num_kernels<__nv_bfloat16>();
}

}  // namespace fray
