// Fray: warp / sub-warp / warp-group sum and max reductions (fp32).
#pragma once

namespace fray {

constexpr int kWarpSize = 32;

// Butterfly sum over aligned groups of `width` consecutive lanes (width a power
// of two, 1 <= width <= 32); every lane of a group gets the group's total.
// All 32 lanes of the warp must execute the call (full mask) with the same width.
__device__ __forceinline__ float warp_sum(float v, int width = kWarpSize) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    if (offset < width) v += __shfl_xor_sync(0xffffffffu, v, offset, width);
  }
  return v;
}

// Compile-time width variant.
template <int kWidth>
__device__ __forceinline__ float warp_sum(float v) {
  static_assert(kWidth >= 1 && kWidth <= kWarpSize && (kWidth & (kWidth - 1)) == 0,
                "warp_sum: width must be a power of two <= 32");
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset, kWidth);
  }
  return v;
}

// Butterfly max over aligned groups of `width` consecutive lanes (same rules as
// warp_sum). fmaxf semantics: a NaN operand loses against a number.
__device__ __forceinline__ float warp_max(float v, int width = kWarpSize) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    if (offset < width) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset, width));
  }
  return v;
}

// max(a, b) that propagates NaN (PTX max.NaN, one FMNMX on sm_80+): a NaN operand wins, as in
// torch.max. fmaxf would return the other operand.
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

// warp_max with fmax_nan: a NaN in any lane of the group gives NaN.
__device__ __forceinline__ float warp_max_nan(float v, int width = kWarpSize) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    if (offset < width) v = fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, offset, width));
  }
  return v;
}

// Sum over groups of `warps_per_group` consecutive whole warps of the block
// (1 <= warps_per_group <= 32). `group` is the calling thread's group index,
// i.e. its warp index / warps_per_group (passed in so no division is needed).
// Every thread of the group gets the group total; the summation order is
// fixed, so the result is deterministic.
//
// Contains one __syncthreads(): every thread of the block must call it.
// `smem` holds one float per warp of the block. It is read after the barrier,
// so the caller must not rewrite it before all threads are done reading: use a
// different buffer for the next call (ping-pong) or put a barrier in between.
__device__ __forceinline__ float group_sum(float v, float* smem, int group, int warps_per_group) {
  const int tid = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int lane = tid % kWarpSize;
  v = warp_sum<kWarpSize>(v);
  if (lane == 0) smem[tid / kWarpSize] = v;
  __syncthreads();
  const float t = lane < warps_per_group ? smem[group * warps_per_group + lane] : 0.0f;
  return warp_sum<kWarpSize>(t);
}

}  // namespace fray
