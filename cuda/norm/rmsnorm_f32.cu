// Explicit instantiation of the RMSNorm family for x dtype float.
#include "cuda/norm/rmsnorm.cuh"

namespace fray {
template cudaError_t launch_rmsnorm<float>(const RmsNormParams& p, cudaStream_t stream);
template int rmsnorm_num_kernels<float>();
}  // namespace fray
