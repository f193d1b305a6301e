// Explicit instantiation of the quantizers for dtype __nv_bfloat16.
#include "cuda/quant/quantize.cuh"

namespace fray {
template cudaError_t launch_quantize<__nv_bfloat16>(const QuantizeParams& p, cudaStream_t stream);
template int quantize_num_kernels<__nv_bfloat16>();
}  // namespace fray
