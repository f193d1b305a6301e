// Explicit instantiation of the unary activations for dtype __half.
#include "cuda/activation/unary.cuh"

namespace fray {
template cudaError_t launch_unary<__half>(const UnaryParams& p, cudaStream_t stream);
template int unary_num_kernels<__half>();
}  // namespace fray
