// Fray quant family: dynamic and static quantizers per row ("token") and per (1, 128) block, x in
// fp32 / fp16 / bf16 to int8 or float8_e4m3fn with fp32 scales (semantics: cuda/quant/quant.h).
//
// Each thread moves 8 consecutive elements of a row (one 16-byte load of a 16-bit x, two of fp32;
// 8 bytes of q), element by element where a row's base or stride is not aligned or at a row's end.
//   block (1, 128): 16 lanes own a group (8 x 16 = 128 columns), so a warp does two groups, each
//     read once: the amax is a 16-lane butterfly, then every lane quantizes what it holds.
//   token: a CTA of kRowThreads owns a row; a thread keeps its first kKeep chunks (kKeep x 8
//     values: rows up to 8192 elements) in registers and re-reads the rest (L2) after the CTA's
//     amax.
// Exact semantics need IEEE fp32 divisions (nvcc's default for '/'; the scale amax / qmax and
// every x / scale) and no contraction; round to nearest even by cvt.rni (int8) or the e4m3
// conversion (after an explicit clamp to +-448, NaN kept).
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/quant/quant.h"

namespace fray {
namespace quant_detail {

constexpr int kChunk = 8;         // elements a thread moves at once
constexpr int kGroupLanes = 16;   // lanes of a (1, 128) group
constexpr int kBlockThreads = 256;
constexpr int kRowThreads = 256;
constexpr int kKeep = 4;          // chunks a token thread keeps in registers (8192-element rows)

__device__ __forceinline__ float finite_abs(float v) {
  const float a = fabsf(v);
  return a < INFINITY ? a : 0.0f;  // +-inf and NaN (a false compare) are left out of the amax
}

template <bool kFp8>
__device__ __forceinline__ uint8_t to_q(float y) {
  if constexpr (kFp8) {
    if (!(y != y)) y = fminf(fmaxf(y, -448.0f), 448.0f);  // fminf would turn a NaN into 448
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
  } else {
    if (y != y) return 0;
    y = fminf(fmaxf(y, -127.0f), 127.0f);
    return static_cast<uint8_t>(static_cast<int8_t>(__float2int_rn(y)));
  }
}

template <typename T>
__device__ __forceinline__ void load_chunk(const T* row, int64_t col, int64_t cols, bool vec, float (&f)[kChunk]) {
  if (vec && col + kChunk <= cols) {
    AlignedVec<T, kChunk> v;
    load_vec(v, row + col);
    vec_to_float(v, f);
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) f[i] = col + i < cols ? to_float(row[col + i]) : 0.0f;
  }
}

template <bool kFp8>
__device__ __forceinline__ void store_chunk(uint8_t* row, int64_t col, int64_t cols, bool vec, float s,
                                            const float (&f)[kChunk]) {
  uint8_t b[kChunk];
#pragma unroll
  for (int i = 0; i < kChunk; ++i) b[i] = to_q<kFp8>(__fdiv_rn(f[i], s));
  if (vec && col + kChunk <= cols) {
    uint2 w;
    w.x = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
    w.y = b[4] | (b[5] << 8) | (b[6] << 16) | (static_cast<uint32_t>(b[7]) << 24);
    *reinterpret_cast<uint2*>(row + col) = w;
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (col + i < cols) row[col + i] = b[i];
    }
  }
}

template <bool kFp8>
__device__ __forceinline__ float scale_of(float amax) {
  const float s = __fdiv_rn(amax, kFp8 ? 448.0f : 127.0f);
  return s == 0.0f ? 1.0f : s;
}

template <typename T>
__device__ __forceinline__ bool aligned16(const T* row, int64_t stride) {
  return (reinterpret_cast<uintptr_t>(row) & 15) == 0 && (stride * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

// (1, 128) blocks: warp-granular grid-stride loop (both half-warps of a warp iterate together, so
// the 16-lane shuffles always have all 32 lanes).
template <typename T, bool kFp8, bool kStatic>
__global__ void __launch_bounds__(kBlockThreads) quantize_block_kernel(const QuantizeParams p) {
  const T* x = static_cast<const T*>(p.x);
  uint8_t* q = static_cast<uint8_t*>(p.q);
  const int64_t groups = (p.cols + 127) / 128;
  const int64_t total = p.rows * groups;  // groups of the whole tensor
  const bool xvec = aligned16(x, p.x_row_stride);
  const bool qvec = (reinterpret_cast<uintptr_t>(q) & 7) == 0 && p.q_row_stride % 8 == 0;
  const int lane = threadIdx.x % kGroupLanes;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kBlockThreads / kWarpSize);
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * (kBlockThreads / kWarpSize) + threadIdx.x / kWarpSize;
       w * 2 < total; w += warps) {
    const int64_t g = w * 2 + (threadIdx.x % kWarpSize) / kGroupLanes;
    const bool valid = g < total;
    const int64_t row = valid ? g / groups : 0;
    const int64_t gk = valid ? g % groups : 0;
    const int64_t col = gk * 128 + lane * kChunk;
    const T* xr = x + row * p.x_row_stride;
    float f[kChunk];
    if (valid) {
      load_chunk(xr, col, p.cols, xvec, f);
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) f[i] = 0.0f;
    }
    float* sp = p.scale + row * p.scale_row_stride + gk * p.scale_group_stride;
    float s;
    if constexpr (kStatic) {
      s = valid ? *sp : 1.0f;
    } else {
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) a = fmaxf(a, finite_abs(f[i]));
      s = scale_of<kFp8>(warp_max(a, kGroupLanes));
      if (valid && lane == 0) *sp = s;
    }
    if (valid) store_chunk<kFp8>(q + row * p.q_row_stride, col, p.cols, qvec, s, f);
  }
}

// Rows ("token"): one CTA a row, grid-stride over rows (uniform per CTA: the barriers are safe).
template <typename T, bool kFp8, bool kStatic>
__global__ void __launch_bounds__(kRowThreads) quantize_row_kernel(const QuantizeParams p) {
  __shared__ float red[kRowThreads / kWarpSize];
  const T* x = static_cast<const T*>(p.x);
  uint8_t* q = static_cast<uint8_t*>(p.q);
  const bool xvec = aligned16(x, p.x_row_stride);
  const bool qvec = (reinterpret_cast<uintptr_t>(q) & 7) == 0 && p.q_row_stride % 8 == 0;
  const int tid = threadIdx.x;
  constexpr int64_t kStep = static_cast<int64_t>(kRowThreads) * kChunk;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* xr = x + row * p.x_row_stride;
    uint8_t* qr = q + row * p.q_row_stride;
    float keep[kKeep][kChunk];
    float s;
    if constexpr (kStatic) {
      s = p.scale[row * p.scale_row_stride];
#pragma unroll
      for (int c = 0; c < kKeep; ++c) load_chunk(xr, c * kStep + tid * kChunk, p.cols, xvec, keep[c]);
    } else {
      float a = 0.0f;
#pragma unroll
      for (int c = 0; c < kKeep; ++c) {
        load_chunk(xr, c * kStep + tid * kChunk, p.cols, xvec, keep[c]);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) a = fmaxf(a, finite_abs(keep[c][i]));
      }
      for (int64_t col = kKeep * kStep + tid * kChunk; col < p.cols; col += kStep) {
        float f[kChunk];
        load_chunk(xr, col, p.cols, xvec, f);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) a = fmaxf(a, finite_abs(f[i]));
      }
      a = warp_max(a);
      if (tid % kWarpSize == 0) red[tid / kWarpSize] = a;
      __syncthreads();
      a = tid % kWarpSize < kRowThreads / kWarpSize ? red[tid % kWarpSize] : 0.0f;
      s = scale_of<kFp8>(warp_max(a));
      if (tid == 0) p.scale[row * p.scale_row_stride] = s;
      __syncthreads();  // red is rewritten by the next row
    }
#pragma unroll
    for (int c = 0; c < kKeep; ++c) {
      const int64_t col = c * kStep + tid * kChunk;
      if (col < p.cols) store_chunk<kFp8>(qr, col, p.cols, qvec, s, keep[c]);
    }
    for (int64_t col = kKeep * kStep + tid * kChunk; col < p.cols; col += kStep) {
      float f[kChunk];
      load_chunk(xr, col, p.cols, xvec, f);
      store_chunk<kFp8>(qr, col, p.cols, qvec, s, f);
    }
  }
}

template <typename T, bool kFp8, bool kStatic>
cudaError_t launch(const QuantizeParams& p, cudaStream_t stream) {
  constexpr int64_t kMaxBlocks = 1 << 20;  // grid-stride loops beyond this
  if (p.group == 128) {
    const int64_t warps = (p.rows * ((p.cols + 127) / 128) + 1) / 2;
    int64_t blocks = (warps + kBlockThreads / kWarpSize - 1) / (kBlockThreads / kWarpSize);
    blocks = blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
    quantize_block_kernel<T, kFp8, kStatic><<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(p);
  } else {
    const int64_t blocks = p.rows > kMaxBlocks ? kMaxBlocks : p.rows;
    quantize_row_kernel<T, kFp8, kStatic><<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace quant_detail

template <typename T>
cudaError_t launch_quantize(const QuantizeParams& p, cudaStream_t stream) {
  using quant_detail::launch;
  if (p.group != 0 && p.group != 128) return cudaErrorInvalidValue;
  if (p.rows <= 0 || p.cols <= 0) return cudaSuccess;
  if (p.fp8) return p.is_static ? launch<T, true, true>(p, stream) : launch<T, true, false>(p, stream);
  return p.is_static ? launch<T, false, true>(p, stream) : launch<T, false, false>(p, stream);
}

// {int8, e4m3} x {dynamic, static} x {row, block}.
template <typename T>
int quantize_num_kernels() {
  return 8;
}

}  // namespace fray
