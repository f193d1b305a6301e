// Fray norm family: LayerNorm kernels and launcher templates (torch-free).
//
// Same structure as rmsnorm.cuh (row in registers, 128-bit vectors, the same config table and
// two-pass fallback); see README.md. What differs is the statistics:
//
//   * A pivot K = x[row, 0] is subtracted before anything is summed. With data such as
//     100 + N(0,1), an fp32 mean is only good to ulp(100)/2 = 4e-6, which shifts every output by
//     that much (outputs near 0 then miss an fp32 rtol of 1e-5). Sums of d = x - K are sums of
//     O(spread) values, so m = mean(d) is accurate to fp32 rounding of the spread, and
//     mean(x) = K + m is carried as that exact pair, never added up.
//   * Variance is two-step on the register-resident row: var = mean((x - mean)^2), a second
//     reduction over the same registers (no cancellation, unlike E[x^2] - E[x]^2). Rows kept
//     in fp32 centre d = x - K by m; packed 16-bit rows and the multi-pass kernel centre x by
//     c = fp32(K + m), one subtraction per element: c is off the mean by at most ulp(K) / 2,
//     which changes the variance only by that squared (1e-11 relative for 100 + N(0,1)).
//     The kernel for rows that do not fit in registers reads the row a third time for it.
//   * y = ((x - K) * rstd - m * rstd) * w + b: fp32 math, one rounding. Here the mean must be
//     the exact pair K + m (an error in it shifts every output).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/norm/norm.h"
#include "cuda/norm/rmsnorm.cuh"  // config table, row_sum and launch constants are shared

namespace fray {
namespace layernorm_detail {

using rmsnorm_detail::ceil_div;
using rmsnorm_detail::count_kernels_in;
using rmsnorm_detail::fill_row_args;
using rmsnorm_detail::launch_rows;
using rmsnorm_detail::kernel_slot;
using rmsnorm_detail::kMaxItems;
using rmsnorm_detail::kMaxRowsPerLaunch;
using rmsnorm_detail::kNumSlots;
using rmsnorm_detail::kTwoPassItems;
using rmsnorm_detail::kTwoPassThreads;
using rmsnorm_detail::LaunchConfig;
using rmsnorm_detail::reg_kernel_max_threads;
using rmsnorm_detail::row_sum;
using rmsnorm_detail::vec_rows_ok;

// Kernel arguments (passed by value in the param space). Strides in elements.
struct KernelArgs {
  const void* x;
  const void* weight;
  const void* bias;  // ignored by the BIAS = false kernels
  void* y;
  int64_t x_stride;
  int64_t y_stride;
  int64_t rows;
  int64_t hidden;
  int64_t nv;        // vectors per row = hidden / VEC
  float inv_hidden;  // 1 / hidden rounded to fp32 (means are sums times this)
  float eps;
  unsigned int opaque_zero;  // always 0; see reg_barrier()
};

// d = v - pivot in fp32; returns acc + sum(d).
template <typename T, int VEC>
__device__ __forceinline__ float shift_sum(const AlignedVec<T, VEC>& v, float pivot, float (&d)[VEC], float acc) {
  vec_to_float(v, d);
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    d[k] -= pivot;
    acc += d[k];
  }
  return acc;
}

// acc + sum((d - mean)^2) for d = x - K held in fp32.
template <int VEC>
__device__ __forceinline__ float sum_sq_centered(const float (&d)[VEC], float mean, float acc) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const float c = d[k] - mean;
    acc = fmaf(c, c, acc);
  }
  return acc;
}

// acc + sum((v - center)^2) for a packed vector, center = fp32(K + m) (see the top of the file).
template <typename T, int VEC>
__device__ __forceinline__ float sum_sq_centered(const AlignedVec<T, VEC>& v, float center, float acc) {
  float f[VEC];
  vec_to_float(v, f);
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const float c = f[k] - center;
    acc = fmaf(c, c, acc);
  }
  return acc;
}

// out = T((d * rstd + shift) * w [+ b]) with d = x - K, shift = -mean * rstd; one rounding.
template <typename T, typename W, int VEC, bool BIAS>
__device__ __forceinline__ AlignedVec<T, VEC> affine(const float (&d)[VEC], const AlignedVec<W, VEC>& w,
                                                     const AlignedVec<W, VEC>& b, float rstd, float shift) {
  float f[VEC], g[VEC];
  vec_to_float(w, g);
  if constexpr (BIAS) {
    float h[VEC];
    vec_to_float(b, h);
#pragma unroll
    for (int k = 0; k < VEC; ++k) f[k] = fmaf(fmaf(d[k], rstd, shift), g[k], h[k]);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) f[k] = fmaf(d[k], rstd, shift) * g[k];
  }
  AlignedVec<T, VEC> out;
  vec_from_float(out, f);
  return out;
}

// The same from a packed vector (d recomputed as v - pivot).
template <typename T, typename W, int VEC, bool BIAS>
__device__ __forceinline__ AlignedVec<T, VEC> affine(const AlignedVec<T, VEC>& v, const AlignedVec<W, VEC>& w,
                                                     const AlignedVec<W, VEC>& b, float pivot, float rstd,
                                                     float shift) {
  float d[VEC];
  vec_to_float(v, d);
#pragma unroll
  for (int k = 0; k < VEC; ++k) d[k] -= pivot;
  return affine<T, W, VEC, BIAS>(d, w, b, rstd, shift);
}

// 0, computed from `v` and the runtime zero `opaque_zero` (so not foldable).
__device__ __forceinline__ unsigned int zero_after(float v, unsigned int opaque_zero) {
  return __float_as_uint(v) & opaque_zero;
}

// Weight (and bias) vectors of a thread's items (read-only: ld.global.nc).
template <bool BIAS, bool FULL, typename W, int VEC, int ITEMS>
__device__ __forceinline__ void load_params(AlignedVec<W, VEC> (&w)[ITEMS], AlignedVec<W, VEC> (&b)[ITEMS],
                                            const W* wp, const W* bp, int step, int my_items) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (FULL || i < my_items) {
      load_vec_ro(w[i], wp + i * step);
      if constexpr (BIAS) load_vec_ro(b[i], bp + i * step);
    }
  }
}

// Minimum resident 256-thread blocks per SM, i.e. register caps: 64 (4 items, as rmsnorm),
// 40 (1 and 2 items; rmsnorm's 32 for 1 item spills the fp32-weight + bias kernel: the pivot,
// the mean and the bias cost registers). 8 items: one 1024-thread block, 64 registers.
constexpr int reg_kernel_min_blocks(int items) {
  return items == kMaxItems ? 1 : items == 4 ? 4 : items == 2 ? 5 : 6;
}

// ---------------------------------------------------------------------------
// Register-resident kernel: as rmsnorm_reg_kernel (tpr = blockDim.x threads per
// row, rpb = blockDim.y rows per block, thread t holds vectors t, t+tpr, ...).
// Two reductions over the registers: sum(x - K), then the centred sum of squares.
//
// LayerNorm does about twice rmsnorm's arithmetic per element, which at 8192
// bf16 would make a straight copy of the rmsnorm kernel issue-bound. So:
//  * FLOAT_ROW: while a thread's row is <= 32 elements (bf16/fp16 up to 4 items,
//    fp32 always), it is kept as d = x - K in fp32 after phase 1: phases 2 and 3
//    need no conversions or pivot subtractions (2 and 4.5 operations per element
//    instead of 3 and 6.5). Longer 16-bit rows stay packed (reg_barrier) and are
//    re-converted in each phase, as in rmsnorm.
//  * FULL: the row is exactly ITEMS * tpr vectors (nv == ITEMS * tpr), so every
//    thread holds ITEMS valid vectors: no per-item predicates, branches or item
//    count, and the only mask is the row's (a skipped row has zeros and K = 0,
//    which sum to 0). The common hidden sizes (multiples of 32 * ITEMS vectors)
//    take this path.
//
// Aliasing: y may alias x. Every element is read and later written by the same
// thread, reads first; the pivot x[row, 0] is read by every thread of the row
// before the first reduction, and thread 0 writes y[row, 0] only after it.
// ---------------------------------------------------------------------------
template <typename T, typename W, int VEC, int ITEMS, bool BIAS, bool FULL>
__global__ void __launch_bounds__(reg_kernel_max_threads(ITEMS), reg_kernel_min_blocks(ITEMS))
    layernorm_reg_kernel(const KernelArgs a) {
  using VT = AlignedVec<T, VEC>;
  using VW = AlignedVec<W, VEC>;
  constexpr bool kFloatRow = std::is_same_v<T, float> || ITEMS * VEC <= 32;
  // Weight (and bias) are loaded with x while they cost <= 8 registers, else item
  // by item before each store (L1/L2 hits; other warps hide the latency): with
  // more of them live at once the 64-register kernels spill.
  constexpr bool kEarlyParams = ITEMS * VEC * static_cast<int>(sizeof(W)) * (BIAS ? 2 : 1) <= 32;
  // One buffer per reduction (group_sum reads its buffer after the barrier).
  __shared__ float red[2][kWarpSize];

  const int tpr = static_cast<int>(blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  const int step = tpr * VEC;
  const W* __restrict__ wp = static_cast<const W*>(a.weight) + t * VEC;
  const W* __restrict__ bp = static_cast<const W*>(a.bias) + t * VEC;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool row_ok = row < a.rows;
  // Valid items of this thread (item i is valid iff i < n): my_items for the
  // parameters, n_ok for the row. FULL: all of them.
  int my_items = ITEMS;
  if constexpr (!FULL) {
    const int nv = static_cast<int>(a.nv);
    my_items = t < nv ? min(ITEMS, (nv - t + tpr - 1) / tpr) : 0;
  }
  const int n_ok = row_ok ? my_items : 0;
  const T* xrow = static_cast<const T*>(a.x) + row * a.x_stride;
  const T* xp = xrow + t * VEC;

  // Phase 1: issue every load of the row, then sum(x - K) over the valid items
  // (masked items are zero-filled, but 0 - K is not zero: they are skipped).
  VT v[ITEMS];
  [[maybe_unused]] float d[kFloatRow ? ITEMS : 1][VEC];
  VW w[ITEMS];
  [[maybe_unused]] VW b[ITEMS];
  const float pivot = n_ok > 0 ? to_float(xrow[0]) : 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (i < n_ok) {
      load_vec(v[i], xp + i * step);
    } else {
      zero_vec(v[i]);
    }
  }
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if constexpr (kFloatRow) {
      float e[VEC];
      const float si = shift_sum(v[i], pivot, e, 0.0f);
#pragma unroll
      for (int k = 0; k < VEC; ++k) d[i][k] = e[k];
      if (FULL || i < n_ok) s += si;
    } else {
      float e[VEC];
      if (FULL || i < n_ok) s = shift_sum(v[i], pivot, e, s);
      // Keep 16-bit rows packed across the reduction (see rmsnorm.cuh).
      reg_barrier(v[i], a.opaque_zero);
    }
  }
  if constexpr (kEarlyParams) load_params<BIAS, FULL>(w, b, wp, bp, step, my_items);
  const float mean = row_sum(s, tpr, red[0]) * a.inv_hidden;  // mean of x - K

  // Phase 2: centred sum of squares from the registers. (Packed rows: the second
  // barrier needs a zero the compiler cannot relate to the first one, since
  // v ^ z ^ z folds back to v.)
  [[maybe_unused]] const float center = pivot + mean;
  [[maybe_unused]] const unsigned int zero2 = zero_after(center, a.opaque_zero);
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if constexpr (kFloatRow) {
      if (FULL || i < n_ok) ss = sum_sq_centered(d[i], mean, ss);
    } else {
      if (FULL || i < n_ok) ss = sum_sq_centered(v[i], center, ss);
      reg_barrier(v[i], zero2);
    }
  }
  const float rstd = rsqrtf(row_sum(ss, tpr, red[1]) * a.inv_hidden + a.eps);
  const float shift = -mean * rstd;

  // Phase 3: normalise from registers and store.
  T* yp = static_cast<T*>(a.y) + row * a.y_stride + t * VEC;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (FULL || i < my_items) {
      if constexpr (!kEarlyParams) {
        load_vec_ro(w[i], wp + i * step);
        if constexpr (BIAS) load_vec_ro(b[i], bp + i * step);
      }
      if (FULL ? row_ok : i < n_ok) {
        if constexpr (kFloatRow) {
          store_vec(yp + i * step, affine<T, W, VEC, BIAS>(d[i], w[i], b[i], rstd, shift));
        } else {
          store_vec(yp + i * step, affine<T, W, VEC, BIAS>(v[i], w[i], b[i], pivot, rstd, shift));
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Rows too long for registers: one 512-thread block per row, three passes over
// the row (sum(x - K); sum((x - K - m)^2); normalise and store). Passes 2 and 3
// mostly hit L2. Thread t touches the same elements in every pass and writes
// only in the last one, so y may alias x.
// ---------------------------------------------------------------------------
template <typename T, typename W, int VEC, bool BIAS>
__global__ void __launch_bounds__(kTwoPassThreads) layernorm_twopass_kernel(const KernelArgs a) {
  using VT = AlignedVec<T, VEC>;
  using VW = AlignedVec<W, VEC>;
  constexpr int U = kTwoPassItems;  // vectors in flight per thread and pass
  __shared__ float red[2][kWarpSize];

  const int64_t tpr = blockDim.x;
  const int64_t nv = a.nv;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * VEC;
  const int64_t step = tpr * VEC;
  const int warps = static_cast<int>(tpr / kWarpSize);

  const int64_t row = blockIdx.x;  // one row per block (host splits launches)
  const T* xrow = static_cast<const T*>(a.x) + row * a.x_stride;
  const T* xp = xrow + first;
  const float pivot = to_float(xrow[0]);

  // Pass 1: sum(x - K).
  float s = 0.0f;
  for (int64_t vi = threadIdx.x, off = 0; vi < nv; vi += U * tpr, off += U * step) {
    VT v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (vi + u * tpr < nv) load_vec(v[u], xp + off + u * step);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float e[VEC];
      if (vi + u * tpr < nv) s = shift_sum(v[u], pivot, e, s);
    }
  }
  const float mean = group_sum(s, red[0], 0, warps) * a.inv_hidden;
  const float center = pivot + mean;

  // Pass 2: centred sum of squares.
  float ss = 0.0f;
  for (int64_t vi = threadIdx.x, off = 0; vi < nv; vi += U * tpr, off += U * step) {
    VT v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (vi + u * tpr < nv) load_vec(v[u], xp + off + u * step);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (vi + u * tpr < nv) ss = sum_sq_centered(v[u], center, ss);
    }
  }
  const float rstd = rsqrtf(group_sum(ss, red[1], 0, warps) * a.inv_hidden + a.eps);
  const float shift = -mean * rstd;

  // Pass 3: normalise and store.
  T* yp = static_cast<T*>(a.y) + row * a.y_stride + first;
  const W* wp = static_cast<const W*>(a.weight) + first;
  [[maybe_unused]] const W* bp = static_cast<const W*>(a.bias) + first;
  for (int64_t vi = threadIdx.x, off = 0; vi < nv; vi += U * tpr, off += U * step) {
    VT v[U];
    VW w[U];
    VW b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (vi + u * tpr < nv) {
        load_vec(v[u], xp + off + u * step);
        load_vec_ro(w[u], wp + off + u * step);
        if constexpr (BIAS) load_vec_ro(b[u], bp + off + u * step);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (vi + u * tpr < nv) {
        store_vec(yp + off + u * step, affine<T, W, VEC, BIAS>(v[u], w[u], b[u], pivot, rstd, shift));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------
using KernelFn = void (*)(KernelArgs);

template <typename T, typename W, int VEC, bool BIAS, bool FULL>
constexpr KernelFn items8_kernel() {
  if constexpr (VEC > 1) {
    return &layernorm_reg_kernel<T, W, VEC, kMaxItems, BIAS, FULL>;
  } else {
    return nullptr;  // scalar rows > 1024 elements take the two-pass kernel (as rmsnorm)
  }
}

// Slots: rmsnorm's kernel_slot(items) (items 1, 2, 4, 8, two-pass) for the general register
// kernels and the two-pass kernel, then the FULL register kernels of 1, 2, 4, 8 items.
constexpr int kNumLnSlots = kNumSlots + 4;
constexpr int ln_kernel_slot(int items, bool full) {
  return full ? kNumSlots + kernel_slot(items) : kernel_slot(items);
}

// All kernels of one (T, W, VEC, BIAS) combination, indexed by ln_kernel_slot(); the only
// place kernels are instantiated.
template <typename T, typename W, int VEC, bool BIAS>
struct KernelSet {
  static constexpr KernelFn kKernels[kNumLnSlots] = {
      &layernorm_reg_kernel<T, W, VEC, 1, BIAS, false>,
      &layernorm_reg_kernel<T, W, VEC, 2, BIAS, false>,
      &layernorm_reg_kernel<T, W, VEC, 4, BIAS, false>,
      items8_kernel<T, W, VEC, BIAS, false>(),
      &layernorm_twopass_kernel<T, W, VEC, BIAS>,
      &layernorm_reg_kernel<T, W, VEC, 1, BIAS, true>,
      &layernorm_reg_kernel<T, W, VEC, 2, BIAS, true>,
      &layernorm_reg_kernel<T, W, VEC, 4, BIAS, true>,
      items8_kernel<T, W, VEC, BIAS, true>()};
  static constexpr int count() { return count_kernels_in(kKernels); }
};

// The config table is plain rmsnorm's (rmsnorm_config(nv, vectorized, res = false), checked
// by its static_assert): both read x once and write y once, so the same bytes in flight per
// thread and the same group sizes apply.
constexpr LaunchConfig layernorm_config(int64_t nv, bool vectorized) {
  return rmsnorm_detail::rmsnorm_config(nv, vectorized, false);
}

template <typename T, typename W, int VEC, bool BIAS>
cudaError_t launch_kernel(const KernelArgs& a, const LaunchConfig& c, cudaStream_t stream) {
  const bool full = c.items != 0 && a.nv == static_cast<int64_t>(c.items) * c.tpr;
  return launch_rows<T>(KernelSet<T, W, VEC, BIAS>::kKernels[ln_kernel_slot(c.items, full)], a, c, stream);
}

}  // namespace layernorm_detail

// LayerNorm for x of element type T (float, __half, __nv_bfloat16); weight (and bias) of
// type T or fp32. Enqueues on `stream`; returns cudaErrorInvalidValue for an unsupported
// weight dtype, else the launch status. Never throws, never synchronises.
template <typename T>
cudaError_t launch_layernorm(const LayerNormParams& p, cudaStream_t stream) {
  using namespace layernorm_detail;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const bool bias = p.bias != nullptr;
  const bool vec_ok = vec_rows_ok<kVec>(p) && (!bias || is_aligned(p.bias, 16u));
  KernelArgs a{};
  fill_row_args(a, p, vec_ok ? kVec : 1);
  a.bias = p.bias;
  const LaunchConfig c = layernorm_config(a.nv, vec_ok);
  return rmsnorm_detail::launch_norm<T>(p, vec_ok, bias, [&](auto w, auto vec, auto flag) {
    return launch_kernel<T, typename decltype(w)::type, decltype(vec)::value, decltype(flag)::value>(a, c, stream);
  });
}

// Number of kernels launch_layernorm<T> can launch (all compiled with it).
template <typename T>
int layernorm_num_kernels() {
  return rmsnorm_detail::count_variants<layernorm_detail::KernelSet, T>();
}

}  // namespace fray
