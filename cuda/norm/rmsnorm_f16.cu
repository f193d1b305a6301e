// Explicit instantiation of the RMSNorm family for x dtype __half.
#include "cuda/norm/rmsnorm.cuh"

namespace fray {
template cudaError_t launch_rmsnorm<__half>(const RmsNormParams& p, cudaStream_t stream);
template int rmsnorm_num_kernels<__half>();
}  // namespace fray
