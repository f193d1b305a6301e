// Explicit instantiation of the rope family for element type __nv_bfloat16.
#include "cuda/rope/rope.cuh"

namespace fray {
template cudaError_t launch_rope<__nv_bfloat16>(const RopeParams& p, cudaStream_t stream);
template int rope_num_kernels<__nv_bfloat16>();
}  // namespace fray
