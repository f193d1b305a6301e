// Explicit instantiation of the softmax family for x dtype float (every output dtype).
#include "cuda/softmax/softmax.cuh"

namespace fray {
template cudaError_t launch_softmax<float>(const SoftmaxParams& p, cudaStream_t stream);
template int softmax_num_kernels<float>();
}  // namespace fray
