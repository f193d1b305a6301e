// Explicit instantiation of the rope family for element type __half.
#include "cuda/rope/rope.cuh"

namespace fray {
template cudaError_t launch_rope<__half>(const RopeParams& p, cudaStream_t stream);
template int rope_num_kernels<__half>();
}  // namespace fray
