// Explicit instantiation of the LayerNorm family for x dtype __nv_bfloat16.
#include "cuda/norm/layernorm.cuh"

namespace fray {
template cudaError_t launch_layernorm<__nv_bfloat16>(const LayerNormParams& p, cudaStream_t stream);
template int layernorm_num_kernels<__nv_bfloat16>();
}  // namespace fray
