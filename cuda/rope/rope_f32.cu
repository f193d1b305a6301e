// Explicit instantiation of the rope family for element type float.
#include "cuda/rope/rope.cuh"

namespace fray {
template cudaError_t launch_rope<float>(const RopeParams& p, cudaStream_t stream);
template int rope_num_kernels<float>();
}  // namespace fray
