// Explicit instantiation of the unary activations for dtype float.
#include "cuda/activation/unary.cuh"

namespace fray {
template cudaError_t launch_unary<float>(const UnaryParams& p, cudaStream_t stream);
template int unary_num_kernels<float>();
}  // namespace fray
