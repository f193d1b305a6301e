// Explicit instantiation of the LayerNorm family for x dtype __half.
#include "cuda/norm/layernorm.cuh"

namespace fray {
template cudaError_t launch_layernorm<__half>(const LayerNormParams& p, cudaStream_t stream);
template int layernorm_num_kernels<__half>();
}  // namespace fray
