// Explicit instantiation of mul for dtype __nv_bfloat16.
#include "cuda/elementwise/mul.cuh"

namespace fray {
template cudaError_t launch_mul<__nv_bfloat16>(const MulParams& p, cudaStream_t stream);
}  // namespace fray
