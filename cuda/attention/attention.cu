// Fray attention family: non-template entry points (dtype dispatch, the split plan) and the
// kv_append kernels. The decode kernels are compiled by the per-dtype units
// decode_attention_{f32,f16,bf16}.cu (declared extern here) so nvcc builds them in parallel.
#include "cuda/attention/attention.h"

#include <algorithm>

#include "cuda/attention/decode_attention.cuh"
#include "cuda/attention/kv_append.cuh"
#include "cuda/common/dtype.h"

namespace fray {
namespace attn_detail {
extern template cudaError_t launch_decode<float>(const DecodeParams&, cudaStream_t);
extern template cudaError_t launch_decode<__half>(const DecodeParams&, cudaStream_t);
extern template cudaError_t launch_decode<__nv_bfloat16>(const DecodeParams&, cudaStream_t);
}  // namespace attn_detail

cudaError_t decode_attention(const DecodeParams& p, cudaStream_t stream) {
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return attn_detail::launch_decode<T>(p, stream);
  });
}

int decode_tile_tokens(DType dtype, int head_dim) {
  int tile = 0;
  dispatch_dtype(dtype, [&](auto tag) {
    tile = attn_detail::decode_tile_tokens_t<typename decltype(tag)::type>(head_dim);
    return cudaSuccess;
  });
  return tile;
}

int decode_split_size(DType dtype, int head_dim, int group, int batch, int n_kv_heads, int capacity,
                      int num_splits, int num_sms, bool paged) {
  using namespace attn_detail;
  const int tile = decode_tile_tokens(dtype, head_dim);
  if (tile <= 0 || capacity <= 0) return tile;
  int64_t splits = num_splits;
  if (splits <= 0) {
    int ctas_per_sm = 1;
    dispatch_dtype(dtype, [&](auto tag) {
      ctas_per_sm = decode_ctas_per_sm_t<typename decltype(tag)::type>(head_dim);
      return cudaSuccess;
    });
    const int64_t chunks = dtype == DType::kFloat32 ? (group + F32Config<64>::kHeads - 1) / F32Config<64>::kHeads : 1;
    const int64_t units = static_cast<int64_t>(batch) * n_kv_heads * chunks;
    const int64_t slots = static_cast<int64_t>(num_sms > 0 ? num_sms : 1) * ctas_per_sm;
    // Wave-quantised time of s splits: ceil(units * s / slots) waves of CTAs that each take 1 / s
    // of a sequence. The smallest s within kWaveSlack of the best s in [lo, hi] wins: split-KV
    // fills the SMs for small batches, while a batch that already fills them keeps whole
    // sequences per CTA (no partials, no combine).
    const int64_t target = paged ? kTargetSplitTokensPaged : kTargetSplitTokens;
    const int64_t lo = (static_cast<int64_t>(capacity) + target - 1) / target;
    const int64_t hi = std::max<int64_t>(lo, std::min<int64_t>(std::max<int64_t>(1, capacity / kMinSplitTokens),
                                                               kMaxSplits));
    auto waves = [&](int64_t s) { return static_cast<double>((units * s + slots - 1) / slots) / static_cast<double>(s); };
    double best = waves(lo);
    for (int64_t s = lo + 1; s <= hi; ++s) best = std::min(best, waves(s));
    splits = lo;
    while (splits < hi && waves(splits) > kWaveSlack * best) ++splits;
    splits = std::min<int64_t>(splits, kMaxSplits);
  }
  const int64_t per = (capacity + splits - 1) / splits;
  return static_cast<int>((per + tile - 1) / tile * tile);
}

cudaError_t kv_append(const AppendParams& p, cudaStream_t stream) { return attn_detail::launch_append(p, stream); }

int attention_num_kernel_instances() {
  using namespace attn_detail;
  return decode_num_kernels<float>() + decode_num_kernels<__half>() + decode_num_kernels<__nv_bfloat16>() +
         append_num_kernels();
}

}  // namespace fray
