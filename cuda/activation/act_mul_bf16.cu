// Explicit instantiation of the activation family for dtype __nv_bfloat16.
#include "cuda/activation/act_mul.cuh"

namespace fray {
template cudaError_t launch_act_mul<__nv_bfloat16>(const ActMulParams& p, cudaStream_t stream);
template int act_mul_num_kernels<__nv_bfloat16>();
}  // namespace fray
