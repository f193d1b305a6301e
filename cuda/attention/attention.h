// Fray attention family: host-only API (plain C++; no CUDA compiler needed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/common/dtype.h"
#include "cuda/common/launch_abi.h"

namespace fray {

// Single-token (decode) attention with split-KV, over a contiguous or paged KV cache.
//
// For sequence b and query head h (kv head kvh = h / group, group = n_heads / n_kv_heads), with
// n = clamp(lens[b], 0, capacity):
//   out[b, h] = sum_{t < n} softmax_t(scale * q[b, h] . k[b, kvh, t]) v[b, kvh, t]
//   lse[b, h] = log(sum_{t < n} exp(scale * q[b, h] . k[b, kvh, t]))   (natural log, fp32)
// n = 0 gives out = 0 and lse = -inf. fp32 softmax math, one rounding to the output dtype.
//
// Addressing (strides in elements; the last dim of every tensor is contiguous):
//   contiguous: k[b, kvh, t] = k + b * k_sb + kvh * k_sh + t * k_st   (HND or NHD: only strides differ)
//   paged:      k[b, kvh, t] = k + page * k_sb + kvh * k_sh + (t % page_size) * k_st,
//               page = block_table[b * bt_sb + t / page_size]
// q, out [b, h, d] at b * q_sb + h * q_sh + d (out alike); lse [b, h] at b * lse_sb + h.
// Paged: k_sb, k_st, v_sb, v_st below 2^31 elements (the kernels' 32-bit stride arithmetic).
// k, v must be 16-byte aligned with 16-byte multiples as strides (cp.async rows); q and out
// have no alignment requirement. q, k, v, out share `dtype`.
//
// Split-KV: the sequence is cut into num_splits chunks of split_size tokens (from
// decode_split_size, which also fixes the tile multiple the kernels need). With num_splits == 1
// the split kernel writes out and lse; otherwise each active split (split * split_size <
// n) writes a partial [b, h, split] into part_out (fp32 [batch, n_heads, num_splits, head_dim],
// contiguous) and part_lse (fp32 [batch, n_heads, num_splits]) and a combine kernel merges
// them in split order (deterministic). Splits at or past n exit at once.
struct DecodeParams {
  const void* q = nullptr;
  int64_t q_sb = 0, q_sh = 0;
  const void* k = nullptr;
  int64_t k_sb = 0, k_sh = 0, k_st = 0;
  const void* v = nullptr;
  int64_t v_sb = 0, v_sh = 0, v_st = 0;
  const int32_t* lens = nullptr;
  const int32_t* block_table = nullptr;  // nullptr: contiguous cache
  int64_t bt_sb = 0;
  int page_size = 1;  // a power of two (paged only)
  void* out = nullptr;
  int64_t o_sb = 0, o_sh = 0;
  float* lse = nullptr;
  int64_t lse_sb = 0;
  float* part_out = nullptr;  // num_splits > 1 only
  float* part_lse = nullptr;
  int batch = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // 64, 128 or 256
  int capacity = 0;  // T (paged: max_blocks * page_size); > 0
  int num_splits = 1;
  int split_size = 0;  // a multiple of decode_tile_tokens(); num_splits * split_size >= capacity
  float scale = 1.0f;
  DType dtype = DType::kBFloat16;
};

// Tokens per pipeline stage of the split kernel for (dtype, head_dim): split sizes are
// multiples of it.
int decode_tile_tokens(DType dtype, int head_dim);

// Tokens per split for a launch: num_splits > 0 asks for that many splits (rounded so each is a
// whole number of tiles; the result may give fewer), 0 chooses from the capacity, the number of
// (sequence, kv head) pairs and the SM count (never from lens). The split count is
// ceil(capacity / split_size).
int decode_split_size(DType dtype, int head_dim, int group, int batch, int n_kv_heads, int capacity,
                      int num_splits, int num_sms, bool paged = false);

// Enqueues the split kernel (and the combine) on `stream`, whose device is current. Never
// synchronises, allocates or throws. Returns the launch status.
cudaError_t decode_attention(const DecodeParams& p, cudaStream_t stream);

// KV-cache append, in place: position pos = lens[b] of sequence b gets k_new[b, kvh] / v_new[b, kvh]
// for every kv head; a position outside [0, capacity) is not written. Cache addressing as in
// DecodeParams (paged through block_table); k_new[b, kvh] at b * kn_sb + kvh * kn_sh (v_new alike).
// Any head_dim >= 1; the widest access (16, 8, 4 or 2 bytes) that every pointer, stride and row
// allows is used.
struct AppendParams {
  void* k = nullptr;
  int64_t k_sb = 0, k_sh = 0, k_st = 0;
  void* v = nullptr;
  int64_t v_sb = 0, v_sh = 0, v_st = 0;
  const void* k_new = nullptr;
  int64_t kn_sb = 0, kn_sh = 0;
  const void* v_new = nullptr;
  int64_t vn_sb = 0, vn_sh = 0;
  const int32_t* lens = nullptr;
  const int32_t* block_table = nullptr;  // nullptr: contiguous cache
  int64_t bt_sb = 0;
  int page_size = 1;
  int batch = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int capacity = 0;
  DType dtype = DType::kBFloat16;
};

cudaError_t kv_append(const AppendParams& p, cudaStream_t stream);

// Number of distinct attention kernels compiled into the library.
int attention_num_kernel_instances();

// Launchers (attention_api.cc), called through the generic binder (cuda/common/binder.h) as
// ext.<name>(ptrs, ints, floats, device, stream); pointers 0 = none; dtype codes 0 fp32, 1 fp16,
// 2 bf16. They check what the kernels assume (sizes, alignment, the split plan) and throw
// std::invalid_argument for a bad call, std::runtime_error for CUDA errors.
namespace attention_api {

int64_t decode_split_size(int dtype, int head_dim, int group, int64_t batch, int64_t n_kv_heads,
                          int64_t capacity, int64_t num_splits, int num_sms, bool paged = false);

// decode_attention over a contiguous (block_table 0) or paged cache:
//   ptrs   q, k, v, lens, block_table, out, lse, part_out, part_lse (the combine's inputs; 0 for one split)
//   ints   q_sb, q_sh, k_sb, k_sh, k_st, v_sb, v_sh, v_st, bt_sb, page_size, o_sb, o_sh, lse_sb,
//          batch, n_heads, n_kv_heads, head_dim, capacity, num_splits, split_size, dtype
//   floats scale
void decode(const FrayArgs& a);

// kv_append into a contiguous (block_table 0) or paged cache:
//   ptrs   k, v, k_new, v_new, lens, block_table
//   ints   k_sb, k_sh, k_st, v_sb, v_sh, v_st, kn_sb, kn_sh, vn_sb, vn_sh, bt_sb, page_size,
//          batch, n_kv_heads, head_dim, capacity, dtype
//   floats none
void kv_append(const FrayArgs& a);

int num_kernel_instances();

}  // namespace attention_api
}  // namespace fray
