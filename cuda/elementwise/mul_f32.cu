// Explicit instantiation of mul for dtype float.
#include "cuda/elementwise/mul.cuh"

namespace fray {
template cudaError_t launch_mul<float>(const MulParams& p, cudaStream_t stream);
}  // namespace fray
