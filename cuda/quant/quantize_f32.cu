// Explicit instantiation of the quantizers for dtype float.
#include "cuda/quant/quantize.cuh"

namespace fray {
template cudaError_t launch_quantize<float>(const QuantizeParams& p, cudaStream_t stream);
template int quantize_num_kernels<float>();
}  // namespace fray
