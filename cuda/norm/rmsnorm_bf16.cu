// Explicit instantiation of the RMSNorm family for x dtype __nv_bfloat16.
#include "cuda/norm/rmsnorm.cuh"

namespace fray {
template cudaError_t launch_rmsnorm<__nv_bfloat16>(const RmsNormParams& p, cudaStream_t stream);
template int rmsnorm_num_kernels<__nv_bfloat16>();
}  // namespace fray
