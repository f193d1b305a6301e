// Explicit instantiation of the activation family for dtype __half.
#include "cuda/activation/act_mul.cuh"

namespace fray {
template cudaError_t launch_act_mul<__half>(const ActMulParams& p, cudaStream_t stream);
template int act_mul_num_kernels<__half>();
}  // namespace fray
