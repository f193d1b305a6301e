// Explicit instantiation of the penalties kernel (fp32, fp16, bf16 logits; small kernels, one unit).
#include "cuda/sampling/penalties.cuh"

namespace fray {
template cudaError_t launch_penalties<float>(const PenaltyParams& p, cudaStream_t stream);
template cudaError_t launch_penalties<__half>(const PenaltyParams& p, cudaStream_t stream);
template cudaError_t launch_penalties<__nv_bfloat16>(const PenaltyParams& p, cudaStream_t stream);
}  // namespace fray
