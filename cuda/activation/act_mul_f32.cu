// Explicit instantiation of the activation family for dtype float.
#include "cuda/activation/act_mul.cuh"

namespace fray {
template cudaError_t launch_act_mul<float>(const ActMulParams& p, cudaStream_t stream);
template int act_mul_num_kernels<float>();
}  // namespace fray
