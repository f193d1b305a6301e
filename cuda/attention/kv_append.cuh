// Fray attention family: KV-cache append (one new token per sequence), torch-free.
//
// The op moves B * Hkv * D * 2 elements to addresses that depend on lens[b] (and the block table),
// which only the device may read (graph capture). One CTA per sequence reads lens[b] once and
// moves the K and V rows of all its kv heads with the widest word every pointer, stride and row
// length allows (16 B for the usual head dims): the whole op is one launch of B small CTAs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention.h"
#include "cuda/common/launch.h"

namespace fray {
namespace attn_detail {

constexpr int kAppendThreads = 256;

struct AppendArgs {
  AppendParams p;
  int64_t esz;          // element bytes
  int words_per_row;    // head_dim * esz / sizeof(W)
  int page_shift;
};

template <typename W, bool PAGED>
__global__ void __launch_bounds__(kAppendThreads) kv_append_kernel(const AppendArgs a) {
  const AppendParams& p = a.p;
  const int b = static_cast<int>(blockIdx.x);
  const int pos = __ldg(p.lens + b);
  if (pos < 0 || pos >= p.capacity) return;  // outside the cache: not written (trust boundary)
  int64_t k_row, v_row;  // element offsets of (b, kvh = 0, pos)
  if constexpr (PAGED) {
    const int64_t page = __ldg(p.block_table + b * p.bt_sb + (pos >> a.page_shift));
    const int64_t slot = pos & ((1 << a.page_shift) - 1);
    k_row = page * p.k_sb + slot * p.k_st;
    v_row = page * p.v_sb + slot * p.v_st;
  } else {
    k_row = b * p.k_sb + static_cast<int64_t>(pos) * p.k_st;
    v_row = b * p.v_sb + static_cast<int64_t>(pos) * p.v_st;
  }
  const int wpr = a.words_per_row;
  const int per_tensor = p.n_kv_heads * wpr;
  for (int i = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x); i < 2 * per_tensor;
       i += static_cast<int>(gridDim.y * blockDim.x)) {
    const bool is_v = i >= per_tensor;
    const int j = is_v ? i - per_tensor : i;
    const int h = j / wpr;
    const int w = j % wpr;
    const char* src = static_cast<const char*>(is_v ? p.v_new : p.k_new) +
                      (b * (is_v ? p.vn_sb : p.kn_sb) + h * (is_v ? p.vn_sh : p.kn_sh)) * a.esz;
    char* dst = static_cast<char*>(is_v ? p.v : p.k) +
                ((is_v ? v_row : k_row) + h * (is_v ? p.v_sh : p.k_sh)) * a.esz;
    reinterpret_cast<W*>(dst)[w] = reinterpret_cast<const W*>(src)[w];
  }
}

inline int64_t gcd64(int64_t x, int64_t y) {
  x = x < 0 ? -x : x;
  y = y < 0 ? -y : y;
  while (y) {
    const int64_t t = x % y;
    x = y;
    y = t;
  }
  return x;
}

template <typename W, bool PAGED>
inline cudaError_t launch_append_w(const AppendArgs& a0, cudaStream_t stream) {
  AppendArgs a = a0;
  a.words_per_row = static_cast<int>(a.p.head_dim * a.esz / static_cast<int64_t>(sizeof(W)));
  const int64_t words = 2 * static_cast<int64_t>(a.p.n_kv_heads) * a.words_per_row;
  const int64_t ychunks = (words + kAppendThreads - 1) / kAppendThreads;
  const dim3 grid(static_cast<unsigned>(a.p.batch), static_cast<unsigned>(ychunks < 65535 ? ychunks : 65535));
  kv_append_kernel<W, PAGED><<<grid, kAppendThreads, 0, stream>>>(a);
  return launch_error();
}

template <bool PAGED>
inline cudaError_t launch_append_p(const AppendArgs& a, cudaStream_t stream) {
  const AppendParams& p = a.p;
  // The widest word dividing every byte address and stride the kernel forms.
  int64_t g = 16;
  for (int64_t x : {static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.k)),
                    static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.v)),
                    static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.k_new)),
                    static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.v_new)), p.k_sb * a.esz, p.k_sh * a.esz,
                    p.k_st * a.esz, p.v_sb * a.esz, p.v_sh * a.esz, p.v_st * a.esz, p.kn_sb * a.esz,
                    p.kn_sh * a.esz, p.vn_sb * a.esz, p.vn_sh * a.esz, p.head_dim * a.esz}) {
    g = gcd64(g, x);
  }
  if (g >= 16) return launch_append_w<uint4, PAGED>(a, stream);
  if (g >= 8) return launch_append_w<uint2, PAGED>(a, stream);
  if (g >= 4) return launch_append_w<uint32_t, PAGED>(a, stream);
  return launch_append_w<uint16_t, PAGED>(a, stream);
}

inline cudaError_t launch_append(const AppendParams& p, cudaStream_t stream) {
  AppendArgs a;
  a.p = p;
  a.esz = p.dtype == DType::kFloat32 ? 4 : 2;
  a.words_per_row = 0;
  a.page_shift = 0;
  while ((1 << a.page_shift) < p.page_size) ++a.page_shift;
  return p.block_table != nullptr ? launch_append_p<true>(a, stream) : launch_append_p<false>(a, stream);
}

// {16, 8, 4, 2}-byte words x {contiguous, paged}.
constexpr int append_num_kernels() { return 4 * 2; }

}  // namespace attn_detail
}  // namespace fray
