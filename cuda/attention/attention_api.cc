// Fray attention family: the launchers behind the generic binder (FrayArgs in; no torch, no
// pybind11; slot orders in attention.h). Host-only; compiled by the C++ compiler. The Python layer
// (python/fray/ops/attention.py) has validated shapes, dtypes and devices; these checks guard
// what the kernels assume (sizes, alignment, split plan) so a wrong call raises instead of
// reading out of bounds.
#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "cuda/attention/attention.h"
#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"

namespace fray {
namespace attention_api {
namespace {

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("fray: " + what); }

void require(bool ok, const std::string& what) {
  if (!ok) bad(what);
}

bool is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

// cp.async moves 16-byte chunks of K / V rows: base pointers and strides must be 16-byte multiples.
void require_aligned16(const char* name, uintptr_t ptr, std::initializer_list<int64_t> strides, int64_t esz) {
  bool ok = ptr % 16 == 0;
  for (int64_t s : strides) ok = ok && (s * esz) % 16 == 0;
  require(ok, std::string(name) + ": the CUDA decode kernels need a 16-byte aligned pointer and 16-byte multiple "
                                  "strides (use the Triton backend for other views)");
}

int64_t esize(DType d) { return d == DType::kFloat32 ? 4 : 2; }

}  // namespace

int64_t decode_split_size(int dtype, int head_dim, int group, int64_t batch, int64_t n_kv_heads, int64_t capacity,
                          int64_t num_splits, int num_sms, bool paged) {
  const DType d = dtype_from_code(dtype, "q");
  require(head_dim == 64 || head_dim == 128 || head_dim == 256,
          "decode_attention head_dim must be 64, 128 or 256, got " + std::to_string(head_dim));
  require(batch >= 0 && batch <= INT_MAX && n_kv_heads >= 1 && n_kv_heads <= INT_MAX && capacity >= 1 &&
              capacity <= INT_MAX && num_splits >= 0 && num_splits <= INT_MAX,
          "decode_split_size: sizes out of range");
  return fray::decode_split_size(d, head_dim, group, static_cast<int>(batch), static_cast<int>(n_kv_heads),
                                 static_cast<int>(capacity), static_cast<int>(num_splits), num_sms, paged);
}

namespace {

void decode_checked(uintptr_t q, int64_t q_sb, int64_t q_sh, uintptr_t k, int64_t k_sb, int64_t k_sh, int64_t k_st,
            uintptr_t v, int64_t v_sb, int64_t v_sh, int64_t v_st, uintptr_t lens, uintptr_t block_table,
            int64_t bt_sb, int64_t page_size, uintptr_t out, int64_t o_sb, int64_t o_sh, uintptr_t lse,
            int64_t lse_sb, uintptr_t part_out, uintptr_t part_lse, int64_t batch, int64_t n_heads,
            int64_t n_kv_heads, int64_t head_dim, int64_t capacity, int64_t num_splits, int64_t split_size,
            double scale, int dtype, int device_index, uintptr_t stream) {
  const DType d = dtype_from_code(dtype, "q");
  require(head_dim == 64 || head_dim == 128 || head_dim == 256,
          "decode_attention head_dim must be 64, 128 or 256, got " + std::to_string(head_dim));
  require(n_kv_heads >= 1 && n_heads % n_kv_heads == 0 && n_heads / n_kv_heads >= 1 && n_heads / n_kv_heads <= 16,
          "decode_attention n_heads / n_kv_heads must be an integer group size in 1..16, got " +
              std::to_string(n_heads) + " / " + std::to_string(n_kv_heads));
  require(batch >= 1 && capacity >= 1 && capacity <= INT_MAX, "decode_attention: batch and capacity must be >= 1");
  require(std::isfinite(scale) && scale > 0.0, "decode_attention scale must be finite and > 0");
  require(q != 0 && k != 0 && v != 0 && lens != 0 && out != 0 && lse != 0, "decode_attention: null pointer");
  const int tile = fray::decode_tile_tokens(d, static_cast<int>(head_dim));
  require(num_splits >= 1 && split_size >= 1 && split_size % tile == 0 && num_splits * split_size >= capacity &&
              (num_splits - 1) * split_size < capacity,
          "decode_attention: the split plan (" + std::to_string(num_splits) + " x " + std::to_string(split_size) +
              ") does not tile capacity " + std::to_string(capacity) + " (split_size must come from "
              "decode_split_size)");
  require(num_splits == 1 || (part_out != 0 && part_lse != 0),
          "decode_attention: several splits need the partial buffers");
  // CTAs: batch * n_kv_heads * (fp32: head chunks) * num_splits must fit grid.x.
  const int64_t chunks = d == DType::kFloat32 ? (n_heads / n_kv_heads + 3) / 4 : 1;
  require(batch * n_kv_heads * chunks * num_splits <= INT_MAX, "decode_attention: batch * heads * splits too large");
  const bool paged = block_table != 0;
  if (paged) {
    require(is_pow2(page_size) && page_size <= 128, "paged decode_attention: block size must be a power of two "
                                                    "<= 128, got " + std::to_string(page_size));
    for (const int64_t st : {k_sb, v_sb, k_st, v_st}) {
      require(st >= 0 && st <= INT_MAX, "paged decode_attention: block and token strides of k_pages / v_pages must be "
                                        "below 2^31 elements, got " + std::to_string(st));
    }
  }
  const int64_t e = esize(d);
  require_aligned16("k_cache", k, {k_sb, k_sh, k_st}, e);
  require_aligned16("v_cache", v, {v_sb, v_sh, v_st}, e);

  DecodeParams p;
  p.q = reinterpret_cast<const void*>(q);
  p.q_sb = q_sb;
  p.q_sh = q_sh;
  p.k = reinterpret_cast<const void*>(k);
  p.k_sb = k_sb;
  p.k_sh = k_sh;
  p.k_st = k_st;
  p.v = reinterpret_cast<const void*>(v);
  p.v_sb = v_sb;
  p.v_sh = v_sh;
  p.v_st = v_st;
  p.lens = reinterpret_cast<const int32_t*>(lens);
  p.block_table = reinterpret_cast<const int32_t*>(block_table);
  p.bt_sb = bt_sb;
  p.page_size = paged ? static_cast<int>(page_size) : 1;
  p.out = reinterpret_cast<void*>(out);
  p.o_sb = o_sb;
  p.o_sh = o_sh;
  p.lse = reinterpret_cast<float*>(lse);
  p.lse_sb = lse_sb;
  p.part_out = reinterpret_cast<float*>(part_out);
  p.part_lse = reinterpret_cast<float*>(part_lse);
  p.batch = static_cast<int>(batch);
  p.n_heads = static_cast<int>(n_heads);
  p.n_kv_heads = static_cast<int>(n_kv_heads);
  p.head_dim = static_cast<int>(head_dim);
  p.capacity = static_cast<int>(capacity);
  p.num_splits = static_cast<int>(num_splits);
  p.split_size = static_cast<int>(split_size);
  p.scale = static_cast<float>(scale);
  p.dtype = d;
  DeviceGuard guard(device_index);
  check_cuda(fray::decode_attention(p, reinterpret_cast<cudaStream_t>(stream)), "decode_attention");
}

void kv_append_checked(uintptr_t k, int64_t k_sb, int64_t k_sh, int64_t k_st, uintptr_t v, int64_t v_sb, int64_t v_sh,
               int64_t v_st, uintptr_t k_new, int64_t kn_sb, int64_t kn_sh, uintptr_t v_new, int64_t vn_sb,
               int64_t vn_sh, uintptr_t lens, uintptr_t block_table, int64_t bt_sb, int64_t page_size,
               int64_t batch, int64_t n_kv_heads, int64_t head_dim, int64_t capacity, int dtype,
               int device_index, uintptr_t stream) {
  const DType d = dtype_from_code(dtype, "k_cache");
  require(batch >= 1 && batch <= INT_MAX && n_kv_heads >= 1 && head_dim >= 1 && capacity >= 1 &&
              capacity <= INT_MAX && 2 * n_kv_heads * head_dim <= INT_MAX,
          "kv_append: sizes out of range");
  require(k != 0 && v != 0 && k_new != 0 && v_new != 0 && lens != 0, "kv_append: null pointer");
  const bool paged = block_table != 0;
  if (paged) {
    require(is_pow2(page_size) && page_size <= 128, "kv_append_paged: block size must be a power of two <= 128, "
                                                    "got " + std::to_string(page_size));
  }
  AppendParams p;
  p.k = reinterpret_cast<void*>(k);
  p.k_sb = k_sb;
  p.k_sh = k_sh;
  p.k_st = k_st;
  p.v = reinterpret_cast<void*>(v);
  p.v_sb = v_sb;
  p.v_sh = v_sh;
  p.v_st = v_st;
  p.k_new = reinterpret_cast<const void*>(k_new);
  p.kn_sb = kn_sb;
  p.kn_sh = kn_sh;
  p.v_new = reinterpret_cast<const void*>(v_new);
  p.vn_sb = vn_sb;
  p.vn_sh = vn_sh;
  p.lens = reinterpret_cast<const int32_t*>(lens);
  p.block_table = reinterpret_cast<const int32_t*>(block_table);
  p.bt_sb = bt_sb;
  p.page_size = paged ? static_cast<int>(page_size) : 1;
  p.batch = static_cast<int>(batch);
  p.n_kv_heads = static_cast<int>(n_kv_heads);
  p.head_dim = static_cast<int>(head_dim);
  p.capacity = static_cast<int>(capacity);
  p.dtype = d;
  DeviceGuard guard(device_index);
  check_cuda(fray::kv_append(p, reinterpret_cast<cudaStream_t>(stream)), "kv_append");
}

}  // namespace

void decode(const FrayArgs& a) {
  require_slots(a, 9, 21, 1, "decode_attention");
  const uint64_t* p = a.ptrs;
  const int64_t* n = a.ints;
  decode_checked(p[0], n[0], n[1], p[1], n[2], n[3], n[4], p[2], n[5], n[6], n[7], p[3], p[4], n[8], n[9], p[5], n[10],
                 n[11], p[6], n[12], p[7], p[8], n[13], n[14], n[15], n[16], n[17], n[18], n[19], a.floats[0],
                 static_cast<int>(n[20]), a.device, a.stream);
}

void kv_append(const FrayArgs& a) {
  require_slots(a, 6, 17, 0, "kv_append");
  const uint64_t* p = a.ptrs;
  const int64_t* n = a.ints;
  kv_append_checked(p[0], n[0], n[1], n[2], p[1], n[3], n[4], n[5], p[2], n[6], n[7], p[3], n[8], n[9], p[4], p[5],
                    n[10], n[11], n[12], n[13], n[14], n[15], static_cast<int>(n[16]), a.device, a.stream);
}

int num_kernel_instances() { return attention_num_kernel_instances(); }

}  // namespace attention_api
}  // namespace fray
