// Fray: aligned register vectors, vectorised global load/store helpers and
// float <-> element conversions (float, __half, __nv_bfloat16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fray {

// N elements of T, aligned to their total size, so that a 16-byte vector can be
// moved with one 128-bit instruction. Index only with compile-time constants
// (inside unrolled loops) so the array stays in registers.
template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVec {
  static_assert(N >= 1 && (N & (N - 1)) == 0, "AlignedVec: N must be a power of two");
  static constexpr int kSize = N;
  T val[N];

  __host__ __device__ __forceinline__ T& operator[](int i) { return val[i]; }
  __host__ __device__ __forceinline__ const T& operator[](int i) const { return val[i]; }
};

// ---------------------------------------------------------------------------
// Conversions. All math is done in fp32; from_float rounds to nearest even.
// ---------------------------------------------------------------------------
__host__ __device__ __forceinline__ float to_float(float x) { return x; }
__host__ __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__host__ __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__host__ __device__ __forceinline__ T from_float(float x);
template <>
__host__ __device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__host__ __device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__host__ __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Whole vector -> fp32. 16-bit types are read as 32-bit pairs
// (__nv_bfloat162 / __half2) so the packed row stays in 32-bit registers
// instead of being split into one 16-bit value per register.
template <typename T, int N>
__device__ __forceinline__ void vec_to_float(const AlignedVec<T, N>& v, float (&f)[N]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && N % 2 == 0) {
    // bf16 -> fp32 is exact: the bf16 bits are the top half of the fp32 bits.
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const unsigned int w = reinterpret_cast<const unsigned int*>(v.val)[i];
      f[2 * i] = __uint_as_float(w << 16);
      f[2 * i + 1] = __uint_as_float(w & 0xffff0000u);
    }
  } else if constexpr (std::is_same_v<T, __half> && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float2 p = __half22float2(reinterpret_cast<const __half2*>(v.val)[i]);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = to_float(v[i]);
  }
}

// fp32 -> vector of T (round to nearest even); 16-bit types use the paired
// cvt.rn.{f16x2,bf16x2}.f32 instructions.
template <typename T, int N>
__device__ __forceinline__ void vec_from_float(AlignedVec<T, N>& v, const float (&f)[N]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      reinterpret_cast<__nv_bfloat162*>(v.val)[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    }
  } else if constexpr (std::is_same_v<T, __half> && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      reinterpret_cast<__half2*>(v.val)[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = from_float<T>(f[i]);
  }
}

// ---------------------------------------------------------------------------
// Global memory access. `p` must be aligned to min(sizeof(T) * N, 16) bytes.
// Vectors wider than 16 bytes (e.g. 8 x fp32) are moved as several 16-byte
// pieces, so they only need 16-byte alignment.
// ---------------------------------------------------------------------------
namespace detail {
template <int kBytes>
struct RawWord;
template <>
struct RawWord<16> {
  using type = uint4;
};
template <>
struct RawWord<8> {
  using type = uint2;
};
template <>
struct RawWord<4> {
  using type = unsigned int;
};
template <>
struct RawWord<2> {
  using type = unsigned short;
};

template <typename T, int N>
struct VecAccess {
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  static constexpr int kWordBytes = kBytes >= 16 ? 16 : kBytes;
  static constexpr int kWords = kBytes / kWordBytes;
  using Word = typename RawWord<kWordBytes>::type;
  static_assert(kBytes % kWordBytes == 0, "VecAccess: unsupported vector size");
};
}  // namespace detail

// Coherent load (safe when the same kernel later writes the same address).
template <typename T, int N>
__device__ __forceinline__ void load_vec(AlignedVec<T, N>& dst, const T* src) {
  using A = detail::VecAccess<T, N>;
  const auto* s = reinterpret_cast<const typename A::Word*>(src);
  auto* d = reinterpret_cast<typename A::Word*>(dst.val);
#pragma unroll
  for (int i = 0; i < A::kWords; ++i) d[i] = s[i];
}

// Read-only (non-coherent, ld.global.nc) load: only for data no thread of the
// kernel writes, e.g. weights.
template <typename T, int N>
__device__ __forceinline__ void load_vec_ro(AlignedVec<T, N>& dst, const T* src) {
  using A = detail::VecAccess<T, N>;
  const auto* s = reinterpret_cast<const typename A::Word*>(src);
  auto* d = reinterpret_cast<typename A::Word*>(dst.val);
#pragma unroll
  for (int i = 0; i < A::kWords; ++i) d[i] = __ldg(s + i);
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* dst, const AlignedVec<T, N>& src) {
  using A = detail::VecAccess<T, N>;
  auto* d = reinterpret_cast<typename A::Word*>(dst);
  const auto* s = reinterpret_cast<const typename A::Word*>(src.val);
#pragma unroll
  for (int i = 0; i < A::kWords; ++i) d[i] = s[i];
}

// store_vec as one inline-PTX vector store per 16 bytes, built from the
// vector's 32-bit words. NVVM may split store_vec's uint4 copy into four
// 32-bit stores when the vector was computed in registers and the address is
// base + a runtime offset (seen in cuda/activation: 4 x STG.32 instead of one
// STG.128); an asm vector store cannot be split. Plain (weak, write-back)
// st.global like store_vec; same alignment rules.
template <typename T, int N>
__device__ __forceinline__ void store_vec_asm(T* dst, const AlignedVec<T, N>& src) {
  using A = detail::VecAccess<T, N>;
  if constexpr (A::kWordBytes == 16) {
    const auto* w = reinterpret_cast<const unsigned int*>(src.val);
#pragma unroll
    for (int i = 0; i < A::kWords; ++i) {
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst + i * (16 / sizeof(T))), "r"(w[4 * i]),
                   "r"(w[4 * i + 1]), "r"(w[4 * i + 2]), "r"(w[4 * i + 3])
                   : "memory");
    }
  } else if constexpr (A::kWordBytes == 8) {
    const auto* w = reinterpret_cast<const unsigned int*>(src.val);
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(dst), "r"(w[0]), "r"(w[1]) : "memory");
  } else {
    store_vec(dst, src);  // one 32- or 16-bit word: nothing to split
  }
}

// Zero-fill (for masked-off lanes).
template <typename T, int N>
__device__ __forceinline__ void zero_vec(AlignedVec<T, N>& v) {
  using A = detail::VecAccess<T, N>;
  auto* d = reinterpret_cast<typename A::Word*>(v.val);
#pragma unroll
  for (int i = 0; i < A::kWords; ++i) d[i] = typename A::Word{};
}

// Value barrier on a register vector: XORs every 32-bit word with
// `opaque_zero`, a runtime 0 the compiler cannot prove (pass a kernel argument
// that the host sets to 0). Values derived from the vector earlier (e.g. its
// fp32 conversion) can then no longer be reused, so they are recomputed from
// the packed form instead of being kept live: used to keep 16-bit rows packed
// across a reduction (half the registers). An empty asm statement is not
// enough: ptxas sees through it. Costs one LOP3 per 32-bit word.
template <typename T, int N>
__device__ __forceinline__ void reg_barrier(AlignedVec<T, N>& v, unsigned int opaque_zero) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  if constexpr (kBytes % 4 == 0) {
    auto* w = reinterpret_cast<unsigned int*>(v.val);
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) w[i] ^= opaque_zero;
  } else {
    static_assert(kBytes == 2, "reg_barrier: unsupported vector size");
    auto* w = reinterpret_cast<unsigned short*>(v.val);
    w[0] ^= static_cast<unsigned short>(opaque_zero);
  }
}

// True when `p` is aligned to `bytes` (a power of two). Host and device.
__host__ __device__ __forceinline__ bool is_aligned(const void* p, unsigned bytes) {
  return (reinterpret_cast<uintptr_t>(p) & static_cast<uintptr_t>(bytes - 1)) == 0;
}

}  // namespace fray
