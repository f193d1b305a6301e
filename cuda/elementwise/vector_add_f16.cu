// Explicit instantiation of vector_add for dtype __half.
#include "cuda/elementwise/vector_add.cuh"

namespace fray {
template cudaError_t launch_vector_add<__half>(const VectorAddParams& p, cudaStream_t stream);
}  // namespace fray
