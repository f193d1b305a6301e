// Explicit instantiation of vector_add for dtype float.
#include "cuda/elementwise/vector_add.cuh"

namespace fray {
template cudaError_t launch_vector_add<float>(const VectorAddParams& p, cudaStream_t stream);
}  // namespace fray
