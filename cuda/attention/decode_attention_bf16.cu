// Explicit instantiation of the decode-attention kernels for __nv_bfloat16 caches (split kernels for head
// dims 64 / 128 / 256, contiguous and paged, and the combine kernels).
#include "cuda/attention/decode_attention.cuh"

namespace fray {
namespace attn_detail {
template cudaError_t launch_decode<__nv_bfloat16>(const DecodeParams& p, cudaStream_t stream);
}  // namespace attn_detail
}  // namespace fray
