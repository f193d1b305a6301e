// Explicit instantiation of the sampling kernel for bf16 logits.
#include "cuda/sampling/sample.cuh"

namespace fray {
template cudaError_t launch_sample<__nv_bfloat16>(const SampleParams& p, cudaStream_t stream);
}  // namespace fray
