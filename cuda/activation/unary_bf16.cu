// Explicit instantiation of the unary activations for dtype __nv_bfloat16.
#include "cuda/activation/unary.cuh"

namespace fray {
template cudaError_t launch_unary<__nv_bfloat16>(const UnaryParams& p, cudaStream_t stream);
template int unary_num_kernels<__nv_bfloat16>();
}  // namespace fray
