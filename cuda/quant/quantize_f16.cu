// Explicit instantiation of the quantizers for dtype __half.
#include "cuda/quant/quantize.cuh"

namespace fray {
template cudaError_t launch_quantize<__half>(const QuantizeParams& p, cudaStream_t stream);
template int quantize_num_kernels<__half>();
}  // namespace fray
