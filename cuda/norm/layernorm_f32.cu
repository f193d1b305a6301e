// Explicit instantiation of the LayerNorm family for x dtype float.
#include "cuda/norm/layernorm.cuh"

namespace fray {
template cudaError_t launch_layernorm<float>(const LayerNormParams& p, cudaStream_t stream);
template int layernorm_num_kernels<float>();
}  // namespace fray
