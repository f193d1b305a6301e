// Explicit instantiation of axpy for dtype float.
#include "cuda/elementwise/axpy.cuh"

namespace fray {
template cudaError_t launch_axpy<float>(const AxpyParams& p, cudaStream_t stream);
}  // namespace fray
