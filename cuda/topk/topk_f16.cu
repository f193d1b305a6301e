// Explicit instantiation of the topk family (topk and argmax) for element type __half.
#include "cuda/topk/argmax.cuh"
#include "cuda/topk/topk.cuh"

namespace fray {
template cudaError_t launch_topk<__half>(const TopkParams& p, cudaStream_t stream);
template cudaError_t launch_argmax<__half>(const ArgmaxParams& p, cudaStream_t stream);
}  // namespace fray
