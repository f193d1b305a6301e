// Explicit instantiation of mul for dtype __half.
#include "cuda/elementwise/mul.cuh"

namespace fray {
template cudaError_t launch_mul<__half>(const MulParams& p, cudaStream_t stream);
}  // namespace fray
