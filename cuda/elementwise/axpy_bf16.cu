// Explicit instantiation of axpy for dtype __nv_bfloat16.
#include "cuda/elementwise/axpy.cuh"

namespace fray {
template cudaError_t launch_axpy<__nv_bfloat16>(const AxpyParams& p, cudaStream_t stream);
}  // namespace fray
