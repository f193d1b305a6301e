// Fray topk family: order-preserving unsigned keys for fp32 / fp16 / bf16 bits.
//
// key(a) > key(b) exactly when a comes before b in the documented "largest" order:
// every NaN (any sign, any payload) is above +inf, -0.0 and +0.0 are one key, and
// the rest is the numeric order. Folding NaN and the signed zeros into the key
// makes the whole value contract one unsigned comparison; the index tie-break is
// the caller's (lower index first). For largest=False the key is complemented
// (key ^ kAll): the order reverses and NaN becomes the smallest key, i.e. last.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fray {
namespace topk_detail {

template <typename T>
struct OrderKey;

template <>
struct OrderKey<float> {
  using Bits = uint32_t;  // raw element bits (values are copied through this type)
  using Key = uint32_t;   // key as stored in shared memory
  static constexpr int kBits = 32;
  static constexpr uint32_t kAll = 0xffffffffu;

  __device__ __forceinline__ static uint32_t of(uint32_t u) {
    const uint32_t a = u & 0x7fffffffu;
    const uint32_t s = a == 0u ? 0u : u;  // -0 -> +0
    const uint32_t k = (s & 0x80000000u) ? ~s : (s | 0x80000000u);
    return a > 0x7f800000u ? kAll : k;  // NaN: above +inf (0xff800000)
  }
};

// fp16 and bf16 differ only in where +inf sits (the largest non-NaN magnitude).
template <uint32_t kInfBits>
struct OrderKey16 {
  using Bits = uint16_t;
  using Key = uint16_t;
  static constexpr int kBits = 16;
  static constexpr uint32_t kAll = 0xffffu;

  __device__ __forceinline__ static uint32_t of(uint32_t u) {
    const uint32_t a = u & 0x7fffu;
    const uint32_t s = a == 0u ? 0u : u;
    const uint32_t k = (s & 0x8000u) ? (~s & 0xffffu) : (s | 0x8000u);
    return a > kInfBits ? kAll : k;
  }
};

template <>
struct OrderKey<__half> : OrderKey16<0x7c00u> {};
template <>
struct OrderKey<__nv_bfloat16> : OrderKey16<0x7f80u> {};

// Element j (compile-time) of a 16-byte word holding 4 x 32-bit or 8 x 16-bit items.
template <int kItemBytes>
__device__ __forceinline__ uint32_t item_of(const uint4& w, int j) {
  const uint32_t word = j / (4 / kItemBytes) == 0   ? w.x
                        : j / (4 / kItemBytes) == 1 ? w.y
                        : j / (4 / kItemBytes) == 2 ? w.z
                                                    : w.w;
  if constexpr (kItemBytes == 4) {
    return word;
  } else {
    return (j & 1) ? (word >> 16) : (word & 0xffffu);
  }
}

// Packs 16 / kItemBytes items (low bits of each) into a 16-byte word.
template <int kItemBytes>
__device__ __forceinline__ uint4 pack_items(const uint32_t (&v)[16 / kItemBytes]) {
  if constexpr (kItemBytes == 4) {
    return make_uint4(v[0], v[1], v[2], v[3]);
  } else {
    return make_uint4(v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16), v[6] | (v[7] << 16));
  }
}

// Loads the U vectors base + u * nthreads + tid (u < U) of src[0, len) into w, U loads in flight
// per thread: 16-byte loads for VEC > 1 (nfull = len / VEC whole vectors; the last, partial one
// element by element, zeros past len), one element in .x for VEC == 1 (0 past len). Shared by
// the topk, streaming topk and argmax kernels' reads of their slices.
template <int VEC, int U, typename Bits>
__device__ __forceinline__ void load_vectors(const Bits* src, int len, int nfull, int base, int nthreads, int tid,
                                             uint4 (&w)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int vi = base + u * nthreads + tid;
    if constexpr (VEC > 1) {
      if (vi < nfull) {
        w[u] = __ldg(reinterpret_cast<const uint4*>(src) + vi);
      } else {
        uint32_t t[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const int e = vi * VEC + j;
          t[j] = e < len ? static_cast<uint32_t>(__ldg(src + e)) : 0u;
        }
        w[u] = pack_items<static_cast<int>(sizeof(Bits))>(t);
      }
    } else {
      w[u] = make_uint4(vi < len ? static_cast<uint32_t>(__ldg(src + vi)) : 0u, 0u, 0u, 0u);
    }
  }
}

}  // namespace topk_detail
}  // namespace fray
