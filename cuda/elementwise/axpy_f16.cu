// Explicit instantiation of axpy for dtype __half.
#include "cuda/elementwise/axpy.cuh"

namespace fray {
template cudaError_t launch_axpy<__half>(const AxpyParams& p, cudaStream_t stream);
}  // namespace fray
