// Explicit instantiation of vector_add for dtype __nv_bfloat16.
#include "cuda/elementwise/vector_add.cuh"

namespace fray {
template cudaError_t launch_vector_add<__nv_bfloat16>(const VectorAddParams& p, cudaStream_t stream);
}  // namespace fray
