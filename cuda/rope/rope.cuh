// Fray rope family: rotary position embedding kernel and launcher template.
// Torch-free: raw pointers, sizes and a stream. See README.md for the design.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/common/vec.cuh"
#include "cuda/rope/rope.h"

namespace fray {
namespace rope_detail {

constexpr int kBlockThreads = 256;     // block size cap: several blocks resident per SM
constexpr int kHeadsPerThread = 4;     // heads whose loads a thread issues before using any
constexpr int kMaxUnitThreads = 128;   // threads across the units of one head (longer heads loop)
constexpr int kMaxTokensPerBlock = 64; // blockDim.z limit
constexpr int kCopyUnroll = 4;         // pass-through vectors in flight per thread
constexpr int64_t kMaxTokensPerLaunch = int64_t{1} << 30;  // keeps grid.x < 2^31 - 1

// Kernel arguments (param space). Strides in elements. Heads are numbered
// 0 .. heads-1: first the q heads, then the k heads.
struct KernelArgs {
  const void* q;
  void* q_out;
  const void* k;
  void* k_out;
  int64_t q_ts, q_hs, qo_ts, qo_hs;
  int64_t k_ts, k_hs, ko_ts, ko_hs;
  const void* positions;  // nullptr: position = pos_offset + token
  int64_t pos_stride;
  int64_t pos_offset;
  const float* cos;
  const float* sin;
  int64_t cs_stride;
  int64_t tokens;
  int q_heads;
  int heads;       // q_heads + k_heads
  int units;       // rotary units per head (see rope_kernel)
  int rest;        // pass-through vectors per head to copy (0: nothing to copy)
  int rotary_dim;
  int half;        // rotary_dim / 2
  int pos_is64;
};

// Shapes of one kernel instance. A "unit" is what one thread rotates per head:
//   neox: VEC elements at e and VEC at e + rotary_dim/2 (both halves of VEC pairs);
//   gptj: VEC consecutive elements (VEC/2 interleaved pairs).
// VECTOR: 16-byte accesses (VEC = 16 / sizeof(T)); else element-wise accesses
// with the smallest unit (1 element per half for neox, one pair for gptj).
template <typename T, bool NEOX, bool VECTOR>
struct Shape {
  static constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));
  static constexpr int VEC = VECTOR ? kVec16 : (NEOX ? 1 : 2);
  static constexpr int NC = NEOX ? VEC : VEC / 2;  // cos (and sin) values per unit
  static constexpr int NH = NEOX ? 2 : 1;          // vectors per unit and head
  static constexpr int PW = VECTOR ? kVec16 : 1;   // elements per pass-through copy
};

template <bool V, typename T, int N>
__device__ __forceinline__ void load_elems(AlignedVec<T, N>& d, const T* p) {
  if constexpr (V) {
    load_vec(d, p);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) d[i] = p[i];
  }
}

template <bool V, typename T, int N>
__device__ __forceinline__ void store_elems(T* p, const AlignedVec<T, N>& s) {
  if constexpr (V) {
    store_vec(p, s);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = s[i];
  }
}

// cos/sin are never written by the kernel: read-only cache path.
template <bool V, int N>
__device__ __forceinline__ void load_cs(AlignedVec<float, N>& d, const float* p) {
  if constexpr (V) {
    load_vec_ro(d, p);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) d[i] = __ldg(p + i);
  }
}

// x' = x*c - y*s, y' = y*c + x*s in fp32, one rounding to T. The fmas are explicit so every
// variant (vector or scalar, in place or not) and the Triton kernel contract the same way.
template <typename T, int N>
__device__ __forceinline__ void rotate_halves(AlignedVec<T, N>& lo, AlignedVec<T, N>& hi,
                                              const AlignedVec<float, N>& c, const AlignedVec<float, N>& s) {
  float x[N], y[N];
  vec_to_float(lo, x);
  vec_to_float(hi, y);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float a = x[i], b = y[i];
    x[i] = fmaf(a, c[i], -(b * s[i]));
    y[i] = fmaf(b, c[i], a * s[i]);
  }
  vec_from_float(lo, x);
  vec_from_float(hi, y);
}

template <typename T, int N>
__device__ __forceinline__ void rotate_pairs(AlignedVec<T, N>& v, const AlignedVec<float, N / 2>& c,
                                             const AlignedVec<float, N / 2>& s) {
  float f[N];
  vec_to_float(v, f);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const float a = f[2 * i], b = f[2 * i + 1];
    f[2 * i] = fmaf(a, c[i], -(b * s[i]));
    f[2 * i + 1] = fmaf(b, c[i], a * s[i]);
  }
  vec_from_float(v, f);
}

// ---------------------------------------------------------------------------
// One token per (blockDim.x x blockDim.y) thread slab, blockDim.z tokens per
// block. Thread (x, y) of a slab owns units x, x + blockDim.x, ... of heads
// y, y + blockDim.y, ...: the token's position is loaded once, each unit's
// cos/sin once per chunk of kHeadsPerThread heads (L1 hits after the first
// warp), and the loads of the whole chunk are issued before any is used.
//
// Order of the loads: position, then the chunk's q/k vectors (independent of
// the position), then cos/sin (which wait for the position), so the position
// latency overlaps the data loads.
//
// Aliasing: q_out may alias q and k_out may alias k; every element is read and
// later written by the same thread, so there is no __restrict__ on them.
// ---------------------------------------------------------------------------
template <typename T, bool NEOX, bool VECTOR>
__global__ void __launch_bounds__(kBlockThreads) rope_kernel(const KernelArgs a) {
  using S = Shape<T, NEOX, VECTOR>;
  using VT = AlignedVec<T, S::VEC>;
  using VC = AlignedVec<float, S::NC>;
  constexpr int HPT = kHeadsPerThread;

  const int64_t token = static_cast<int64_t>(blockIdx.x) * blockDim.z + threadIdx.z;
  if (token >= a.tokens) return;  // no barriers below: early exit is safe

  int64_t pos;
  if (a.positions == nullptr) {
    pos = a.pos_offset + token;
  } else if (a.pos_is64) {
    pos = __ldg(static_cast<const long long*>(a.positions) + token * a.pos_stride);
  } else {
    pos = __ldg(static_cast<const int*>(a.positions) + token * a.pos_stride);
  }

  const T* qin = static_cast<const T*>(a.q) + token * a.q_ts;
  const T* kin = static_cast<const T*>(a.k) + token * a.k_ts;
  T* qout = static_cast<T*>(a.q_out) + token * a.qo_ts;
  T* kout = static_cast<T*>(a.k_out) + token * a.ko_ts;
  const float* crow = a.cos + pos * a.cs_stride;
  const float* srow = a.sin + pos * a.cs_stride;
  const int nx = static_cast<int>(blockDim.x);
  const int ny = static_cast<int>(blockDim.y);

  for (int u = threadIdx.x; u < a.units; u += nx) {
    const int e = u * S::VEC;  // element offset of the unit's (first) vector in a head
    for (int h0 = threadIdx.y; h0 < a.heads; h0 += ny * HPT) {
      VT v[HPT][S::NH];
#pragma unroll
      for (int j = 0; j < HPT; ++j) {
        const int h = h0 + j * ny;
        if (h < a.heads) {
          const T* src = (h < a.q_heads ? qin + h * a.q_hs : kin + (h - a.q_heads) * a.k_hs) + e;
          load_elems<VECTOR>(v[j][0], src);
          if constexpr (NEOX) load_elems<VECTOR>(v[j][1], src + a.half);
        }
      }
      VC c, s;
      load_cs<VECTOR>(c, crow + u * S::NC);
      load_cs<VECTOR>(s, srow + u * S::NC);
#pragma unroll
      for (int j = 0; j < HPT; ++j) {
        const int h = h0 + j * ny;
        if (h < a.heads) {
          T* dst = (h < a.q_heads ? qout + h * a.qo_hs : kout + (h - a.q_heads) * a.ko_hs) + e;
          if constexpr (NEOX) {
            rotate_halves(v[j][0], v[j][1], c, s);
            store_elems<VECTOR>(dst, v[j][0]);
            store_elems<VECTOR>(dst + a.half, v[j][1]);
          } else {
            rotate_pairs(v[j][0], c, s);
            store_elems<VECTOR>(dst, v[j][0]);
          }
        }
      }
    }
  }

  if (a.rest > 0) {
    // Out of place with partial rotary: copy [rotary_dim, head_dim) of every
    // head. Work items (head, vector) are spread over the slab, kCopyUnroll
    // loads in flight per thread.
    using VP = AlignedVec<T, S::PW>;
    const int n = a.heads * a.rest;
    const int nt = nx * ny;
    for (int f0 = static_cast<int>(threadIdx.y) * nx + static_cast<int>(threadIdx.x); f0 < n;
         f0 += kCopyUnroll * nt) {
      VP w[kCopyUnroll];
#pragma unroll
      for (int j = 0; j < kCopyUnroll; ++j) {
        const int f = f0 + j * nt;
        if (f < n) {
          const int h = f / a.rest;
          const int off = a.rotary_dim + (f - h * a.rest) * S::PW;
          const T* src = (h < a.q_heads ? qin + h * a.q_hs : kin + (h - a.q_heads) * a.k_hs) + off;
          load_elems<VECTOR>(w[j], src);
        }
      }
#pragma unroll
      for (int j = 0; j < kCopyUnroll; ++j) {
        const int f = f0 + j * nt;
        if (f < n) {
          const int h = f / a.rest;
          const int off = a.rotary_dim + (f - h * a.rest) * S::PW;
          T* dst = (h < a.q_heads ? qout + h * a.qo_hs : kout + (h - a.q_heads) * a.ko_hs) + off;
          store_elems<VECTOR>(dst, w[j]);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------
using KernelFn = void (*)(KernelArgs);

template <typename T>
struct KernelSet {
  // [neox][vector]; this table is the only place kernels are instantiated.
  static constexpr KernelFn kKernels[2][2] = {
      {&rope_kernel<T, false, false>, &rope_kernel<T, false, true>},
      {&rope_kernel<T, true, false>, &rope_kernel<T, true, true>}};
  static constexpr int count() { return 4; }
};

struct LaunchConfig {
  int unit_threads;  // blockDim.x: threads across the units of a head
  int groups;        // blockDim.y: head groups (each thread takes every groups-th head)
  int tokens;        // blockDim.z: tokens per block
};

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
constexpr int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// The config table: every unit of a head gets a thread (up to 128; longer
// heads loop), kHeadsPerThread heads per thread (so each thread has 4 chunks
// = 64-128 bytes of loads in flight for 16-bit NeoX and reuses its cos/sin 4
// times), as many head groups as that needs within 256 threads, and the rest
// of the 256-thread block filled with further tokens (blockDim.z <= 64).
// Example, bf16 NeoX head_dim 128, 32 q + 8 k heads: 8 units x 10 groups x
// 3 tokens = 240 threads, every thread rotating 4 heads of one token.
constexpr LaunchConfig rope_config(int64_t units, int64_t heads, int64_t tokens) {
  const int64_t ut = min64(max64(units, 1), kMaxUnitThreads);
  const int64_t groups = min64(ceil_div(max64(heads, 1), kHeadsPerThread), max64(1, kBlockThreads / ut));
  int64_t tpb = max64(1, kBlockThreads / (ut * groups));
  tpb = min64(min64(tpb, kMaxTokensPerBlock), max64(tokens, 1));
  return {static_cast<int>(ut), static_cast<int>(groups), static_cast<int>(tpb)};
}

// Compile-time check of the table: block dimensions within the launch bounds
// and CUDA's limits, for every plausible head shape.
constexpr bool rope_config_table_ok() {
  for (int64_t units = 1; units <= 1024; units += (units < 64 ? 1 : 37)) {
    for (int64_t heads = 1; heads <= 4096; heads += (heads < 128 ? 1 : 97)) {
      for (int64_t tokens : {int64_t{1}, int64_t{3}, int64_t{1} << 20}) {
        const LaunchConfig c = rope_config(units, heads, tokens);
        const int64_t threads = int64_t{c.unit_threads} * c.groups * c.tokens;
        if (threads > kBlockThreads || threads < 1) return false;
        if (c.tokens > kMaxTokensPerBlock || c.groups > 1024 || c.unit_threads > kMaxUnitThreads) return false;
        if (c.tokens > tokens) return false;
      }
    }
  }
  return true;
}
static_assert(rope_config_table_ok(), "rope config table violates a launch limit");

template <typename T>
cudaError_t launch_typed(const RopeParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr unsigned kAlign = 16;
  const bool has_k = p.k != nullptr && p.k_heads > 0;
  const int64_t k_heads = has_k ? p.k_heads : 0;
  const int64_t heads = p.q_heads + k_heads;
  const int64_t half = p.rotary_dim / 2;
  if (heads == 0) return cudaSuccess;

  // 128-bit path: every q/k pointer 16-byte aligned, every stride of a dim with
  // more than one entry a multiple of VEC, head_dim and the rotated halves
  // (neox) or the rotated span (gptj) whole vectors, cos/sin rows 16-byte aligned.
  auto strides_ok = [&](const void* ptr, int64_t ts, int64_t hs, int64_t nh) {
    return is_aligned(ptr, kAlign) && (p.tokens <= 1 || ts % kVec == 0) && (nh <= 1 || hs % kVec == 0);
  };
  bool vec_ok = p.head_dim % kVec == 0 && (p.neox ? half % kVec == 0 : p.rotary_dim % kVec == 0) &&
                strides_ok(p.q, p.q_token_stride, p.q_head_stride, p.q_heads) &&
                strides_ok(p.q_out, p.q_out_token_stride, p.q_out_head_stride, p.q_heads) &&
                is_aligned(p.cos, kAlign) && is_aligned(p.sin, kAlign) && p.cs_row_stride % 4 == 0;
  if (has_k) {
    vec_ok = vec_ok && strides_ok(p.k, p.k_token_stride, p.k_head_stride, p.k_heads) &&
             strides_ok(p.k_out, p.k_out_token_stride, p.k_out_head_stride, p.k_heads);
  }

  KernelArgs a{};
  a.q = p.q;
  a.q_out = p.q_out;
  a.k = has_k ? p.k : p.q;  // never dereferenced when k_heads == 0
  a.k_out = has_k ? p.k_out : p.q_out;
  a.q_ts = p.q_token_stride;
  a.q_hs = p.q_head_stride;
  a.qo_ts = p.q_out_token_stride;
  a.qo_hs = p.q_out_head_stride;
  a.k_ts = has_k ? p.k_token_stride : 0;
  a.k_hs = has_k ? p.k_head_stride : 0;
  a.ko_ts = has_k ? p.k_out_token_stride : 0;
  a.ko_hs = has_k ? p.k_out_head_stride : 0;
  a.positions = p.positions;
  a.pos_stride = p.positions_stride;
  a.pos_offset = p.position_offset;
  a.pos_is64 = p.positions_int64 ? 1 : 0;
  a.cos = p.cos;
  a.sin = p.sin;
  a.cs_stride = p.cs_row_stride;
  a.q_heads = static_cast<int>(p.q_heads);
  a.heads = static_cast<int>(heads);
  a.rotary_dim = static_cast<int>(p.rotary_dim);
  a.half = static_cast<int>(half);

  const int vec = vec_ok ? kVec : (p.neox ? 1 : 2);
  a.units = static_cast<int>(p.neox ? half / vec : p.rotary_dim / vec);
  const bool copy = p.q_out != p.q || (has_k && p.k_out != p.k);
  a.rest = copy ? static_cast<int>((p.head_dim - p.rotary_dim) / (vec_ok ? kVec : 1)) : 0;

  const KernelFn fn = KernelSet<T>::kKernels[p.neox ? 1 : 0][vec_ok ? 1 : 0];
  const LaunchConfig c = rope_config(a.units, heads, p.tokens);
  const dim3 block(static_cast<unsigned>(c.unit_threads), static_cast<unsigned>(c.groups),
                   static_cast<unsigned>(c.tokens));
  const int64_t pos_bytes = p.positions_int64 ? 8 : 4;
  // One token slab per blockDim.z; more than kMaxTokensPerLaunch tokens (grid.x
  // limit) are split into several launches on the same stream.
  for (int64_t done = 0; done < p.tokens; done += kMaxTokensPerLaunch) {
    KernelArgs part = a;
    part.tokens = min64(p.tokens - done, kMaxTokensPerLaunch);
    part.q = static_cast<const T*>(a.q) + done * a.q_ts;
    part.q_out = static_cast<T*>(a.q_out) + done * a.qo_ts;
    part.k = static_cast<const T*>(a.k) + done * a.k_ts;
    part.k_out = static_cast<T*>(a.k_out) + done * a.ko_ts;
    if (a.positions != nullptr) {
      part.positions = static_cast<const char*>(a.positions) + done * a.pos_stride * pos_bytes;
    } else {
      part.pos_offset = a.pos_offset + done;
    }
    const dim3 grid(static_cast<unsigned>(ceil_div(part.tokens, c.tokens)));
    fn<<<grid, block, 0, stream>>>(part);
    const cudaError_t err = launch_error();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace rope_detail

// Rotary embedding for element type T (float, __half, __nv_bfloat16). Enqueues
// on `stream`; returns cudaErrorInvalidValue for an odd or out-of-range
// rotary_dim or negative sizes, else the launch status. Never throws or syncs.
template <typename T>
cudaError_t launch_rope(const RopeParams& p, cudaStream_t stream) {
  if (p.tokens < 0 || p.q_heads < 0 || p.k_heads < 0 || p.head_dim < 0) return cudaErrorInvalidValue;
  if (p.rotary_dim < 2 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim) return cudaErrorInvalidValue;
  // Per-token element counts are kept in 32-bit integers on the device.
  if (p.head_dim > (int64_t{1} << 30) || (p.q_heads + p.k_heads) * p.head_dim >= (int64_t{1} << 31)) {
    return cudaErrorInvalidValue;
  }
  if (p.tokens == 0) return cudaSuccess;
  return rope_detail::launch_typed<T>(p, stream);
}

template <typename T>
int rope_num_kernels() {
  return rope_detail::KernelSet<T>::count();
}

}  // namespace fray
