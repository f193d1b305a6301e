// Explicit instantiation of the softmax family for x dtype __half (every output dtype).
#include "cuda/softmax/softmax.cuh"

namespace fray {
template cudaError_t launch_softmax<__half>(const SoftmaxParams& p, cudaStream_t stream);
template int softmax_num_kernels<__half>();
}  // namespace fray
