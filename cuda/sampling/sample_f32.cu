// Explicit instantiation of the sampling kernel for fp32 logits.
#include "cuda/sampling/sample.cuh"

namespace fray {
template cudaError_t launch_sample<float>(const SampleParams& p, cudaStream_t stream);
}  // namespace fray
