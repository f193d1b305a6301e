// Explicit instantiation of the softmax family for x dtype __nv_bfloat16 (every output dtype).
#include "cuda/softmax/softmax.cuh"

namespace fray {
template cudaError_t launch_softmax<__nv_bfloat16>(const SoftmaxParams& p, cudaStream_t stream);
template int softmax_num_kernels<__nv_bfloat16>();
}  // namespace fray
