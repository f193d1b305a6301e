// Fray norm family: RMSNorm / fused add + RMSNorm kernels and launcher templates.
// Torch-free: raw pointers, sizes and a stream. See README.md for the design.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/norm/norm.h"

namespace fray {
namespace rmsnorm_detail {

constexpr int kMaxItems = 8;                 // vectors per thread kept in registers
constexpr int kMaxThreadsPerRow = 1024;      // largest row group (one block)
constexpr int kSmallBlockThreads = 256;      // block size used to pack small rows
constexpr int kTwoPassItems = 4;             // vectors in flight per thread, two-pass path
constexpr int kTwoPassThreads = 512;         // block (= row group) of the two-pass path
constexpr int64_t kMaxRowsPerLaunch = int64_t{1} << 30;  // keeps grid.x < 2^31 - 1

// Kernel arguments (passed by value in the param space). Strides in elements.
struct KernelArgs {
  const void* x;
  const void* residual;
  const void* weight;
  void* y;
  void* sum_out;
  int64_t x_stride;
  int64_t r_stride;
  int64_t y_stride;
  int64_t s_stride;
  int64_t rows;
  int64_t hidden;
  int64_t nv;  // vectors per row = hidden / VEC
  float inv_hidden;  // 1 / hidden, rounded to fp32 (mean = sum * inv_hidden)
  float eps;
  float weight_offset;
  unsigned int opaque_zero;  // always 0; see reg_barrier()
};

// s = T(x + r) in place in `xv` (the rounded value is what gets normalised).
template <typename T, int VEC>
__device__ __forceinline__ void add_round(AlignedVec<T, VEC>& xv, const AlignedVec<T, VEC>& rv) {
  float f[VEC], g[VEC];
  vec_to_float(xv, f);
  vec_to_float(rv, g);
#pragma unroll
  for (int k = 0; k < VEC; ++k) f[k] += g[k];
  vec_from_float(xv, f);
}

template <typename T, int VEC>
__device__ __forceinline__ float sum_squares(const AlignedVec<T, VEC>& v, float acc) {
  float f[VEC];
  vec_to_float(v, f);
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc = fmaf(f[k], f[k], acc);
  return acc;
}

// out = T(float(v) * rstd * (float(w) + offset)), one rounding.
template <typename T, typename W, int VEC>
__device__ __forceinline__ AlignedVec<T, VEC> normalize(const AlignedVec<T, VEC>& v, const AlignedVec<W, VEC>& w,
                                                        float rstd, float offset) {
  float f[VEC], g[VEC];
  vec_to_float(v, f);
  vec_to_float(w, g);
#pragma unroll
  for (int k = 0; k < VEC; ++k) f[k] = f[k] * rstd * (g[k] + offset);
  AlignedVec<T, VEC> out;
  vec_from_float(out, f);
  return out;
}

// Row-group sum: width-limited shuffles for tpr <= 32, shared memory otherwise
// (groups are whole warps then; group index = threadIdx.y). `tpr` is
// block-uniform, so the barrier inside group_sum is reached by all threads.
__device__ __forceinline__ float row_sum(float v, int tpr, float* smem) {
  if (tpr <= kWarpSize) return warp_sum(v, tpr);
  return group_sum(v, smem, static_cast<int>(threadIdx.y), tpr / kWarpSize);
}

// Launch bounds of the register kernels: ITEMS <= 4 runs with <= 256-thread
// blocks, ITEMS == 8 with row groups of up to 1024 threads.
constexpr int reg_kernel_max_threads(int items) {
  return items == kMaxItems ? kMaxThreadsPerRow : kSmallBlockThreads;
}
// Minimum resident 256-thread blocks per SM, i.e. register caps of 64 (4 items),
// 40 / 48 (2 items, plain / fused), 32 / 40 (1 item): the tightest caps that
// compile without spills, for occupancy. 8 items: 1024 threads -> 64 registers.
constexpr int reg_kernel_min_blocks(int items, bool res) {
  return items == kMaxItems ? 1 : items == 4 ? 4 : items == 2 ? (res ? 5 : 6) : (res ? 6 : 8);
}

// ---------------------------------------------------------------------------
// Register-resident kernel: a group of blockDim.x threads (tpr) per row,
// blockDim.y rows per block. Thread t of a group holds vectors t, t+tpr, ...,
// t+(ITEMS-1)*tpr of its row in registers: all loads are issued before the
// reduction, the normalised row is stored from registers.
//
// Aliasing: y may alias x and sum_out may alias residual; every element is read
// and later written by the same thread, reads first, so no __restrict__ on them.
// ---------------------------------------------------------------------------
template <typename T, typename W, int VEC, int ITEMS, bool RES>
__global__ void __launch_bounds__(reg_kernel_max_threads(ITEMS), reg_kernel_min_blocks(ITEMS, RES))
    rmsnorm_reg_kernel(const KernelArgs a) {
  using VT = AlignedVec<T, VEC>;
  using VW = AlignedVec<W, VEC>;
  // Weights are loaded with x when that costs <= 16 registers (<= 8 with the
  // residual), else item by item after the reduction (L1/L2 hits; other warps
  // hide the latency).
  constexpr bool kEarlyWeight = ITEMS * VEC * sizeof(W) <= (RES ? 32 : 64);
  // Fused add with 8 items: the residual is loaded 2 items at a time (after
  // all of x) so its registers are reused: keeps the 1024-thread instance
  // within 64 registers without spills.
  constexpr int kChunk = ITEMS > 4 ? 2 : ITEMS;
  __shared__ float red[kWarpSize];

  const int tpr = static_cast<int>(blockDim.x);
  const int rpb = static_cast<int>(blockDim.y);
  const int t = static_cast<int>(threadIdx.x);
  const int nv = static_cast<int>(a.nv);
  const int step = tpr * VEC;  // elements between a thread's consecutive items
  const W* __restrict__ wp = static_cast<const W*>(a.weight) + t * VEC;
  // Items of this thread inside the row: item i is valid iff i < my_items.
  // (One integer instead of ITEMS predicates kept live across the row.)
  const int my_items = t < nv ? min(ITEMS, (nv - t + tpr - 1) / tpr) : 0;

  {
    // One row group per block: the host splits launches so that the grid
    // covers all rows (no grid-stride loop: fewer registers held across it).
    const int64_t row = static_cast<int64_t>(blockIdx.x) * rpb + threadIdx.y;
    const int n_ok = row < a.rows ? my_items : 0;  // valid items of this row
    const T* xp = static_cast<const T*>(a.x) + row * a.x_stride + t * VEC;

    // Phase 1: issue every load of the row (masked items are zero) and
    // accumulate the sum of squares of s (= x, or T(x + residual)).
    VT v[ITEMS];
    VW w[ITEMS];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (i < n_ok) {
        load_vec(v[i], xp + i * step);
      } else {
        zero_vec(v[i]);
      }
    }
    if constexpr (RES) {
      const T* rp = static_cast<const T*>(a.residual) + row * a.r_stride + t * VEC;
      T* sp = static_cast<T*>(a.sum_out) + row * a.s_stride + t * VEC;
#pragma unroll
      for (int c = 0; c < ITEMS; c += kChunk) {
        VT r[kChunk];
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          if (c + j < n_ok) {
            load_vec(r[j], rp + (c + j) * step);
          } else {
            zero_vec(r[j]);
          }
        }
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          const int i = c + j;
          add_round(v[i], r[j]);  // s = T(x + r): what is stored and normalised
          if (i < n_ok) store_vec(sp + i * step, v[i]);
          ss = sum_squares(v[i], ss);
          // Keep only the packed s live from here on (see reg_barrier).
          if constexpr (!std::is_same_v<T, float>) reg_barrier(v[i], a.opaque_zero);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        ss = sum_squares(v[i], ss);
        // Keep 16-bit rows packed across the reduction (re-convert afterwards
        // instead of holding ITEMS * VEC floats live): halves register use.
        if constexpr (!std::is_same_v<T, float>) reg_barrier(v[i], a.opaque_zero);
      }
    }
    if constexpr (kEarlyWeight) {
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        if (i < my_items) load_vec_ro(w[i], wp + i * step);
      }
    }

    // Phase 2: row reduction.
    ss = row_sum(ss, tpr, red);
    const float rstd = rsqrtf(ss * a.inv_hidden + a.eps);

    // Phase 3: normalise from registers and store.
    T* yp = static_cast<T*>(a.y) + row * a.y_stride + t * VEC;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (i < my_items) {
        if constexpr (!kEarlyWeight) load_vec_ro(w[i], wp + i * step);
        if (i < n_ok) store_vec(yp + i * step, normalize(v[i], w[i], rstd, a.weight_offset));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Two-pass kernel for rows too long for registers (nv > 8 * 1024): one block
// (blockDim.x = 512 threads, blockDim.y == 1) per row. Pass 1 reads x (+ residual,
// writing s to sum_out) and accumulates sum(s^2); pass 2 re-reads s (from
// sum_out when fused, from x otherwise; mostly L2 hits) and writes y. Thread t
// touches the same elements in both passes, so in-place aliasing is safe and
// pass 2 sees its own pass-1 stores.
// ---------------------------------------------------------------------------
template <typename T, typename W, int VEC, bool RES>
__global__ void __launch_bounds__(kTwoPassThreads) rmsnorm_twopass_kernel(const KernelArgs a) {
  using VT = AlignedVec<T, VEC>;
  using VW = AlignedVec<W, VEC>;
  constexpr int U = kTwoPassItems;  // vectors in flight per thread and pass
  __shared__ float red[kWarpSize];

  const int64_t tpr = blockDim.x;
  const int64_t nv = a.nv;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * VEC;  // element offset of the first vector
  const int64_t step = tpr * VEC;                                  // elements between items

  {
    const int64_t row = blockIdx.x;  // one row per block (host splits launches)
    const T* xp = static_cast<const T*>(a.x) + row * a.x_stride + first;
    [[maybe_unused]] const T* rp = nullptr;
    [[maybe_unused]] T* sp = nullptr;
    if constexpr (RES) {
      rp = static_cast<const T*>(a.residual) + row * a.r_stride + first;
      sp = static_cast<T*>(a.sum_out) + row * a.s_stride + first;
    }

    // Pass 1: s (= x, or T(x + r) stored to sum_out) and its sum of squares.
    float ss = 0.0f;
    for (int64_t vi = threadIdx.x, off = 0; vi < nv; vi += U * tpr, off += U * step) {
      VT v[U];
      [[maybe_unused]] VT r[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (vi + u * tpr < nv) {
          load_vec(v[u], xp + off + u * step);
          if constexpr (RES) load_vec(r[u], rp + off + u * step);
        } else {
          zero_vec(v[u]);
          if constexpr (RES) zero_vec(r[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if constexpr (RES) {
          add_round(v[u], r[u]);
          if (vi + u * tpr < nv) store_vec(sp + off + u * step, v[u]);
          if constexpr (!std::is_same_v<T, float>) reg_barrier(v[u], a.opaque_zero);
        }
        ss = sum_squares(v[u], ss);
      }
    }
    ss = group_sum(ss, red, 0, static_cast<int>(tpr / kWarpSize));
    const float rstd = rsqrtf(ss * a.inv_hidden + a.eps);

    // Pass 2: re-read s (this thread's own elements) and write y.
    const T* src = xp;
    if constexpr (RES) src = sp;
    T* yp = static_cast<T*>(a.y) + row * a.y_stride + first;
    const W* wp = static_cast<const W*>(a.weight) + first;
    for (int64_t vi = threadIdx.x, off = 0; vi < nv; vi += U * tpr, off += U * step) {
      VT v[U];
      VW w[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (vi + u * tpr < nv) {
          load_vec(v[u], src + off + u * step);
          load_vec_ro(w[u], wp + off + u * step);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (vi + u * tpr < nv) store_vec(yp + off + u * step, normalize(v[u], w[u], rstd, a.weight_offset));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------
using KernelFn = void (*)(KernelArgs);

// The non-null entries of a kernel table: the kernels a KernelSet instantiates.
template <typename Fn, int N>
constexpr int count_kernels_in(const Fn (&table)[N]) {
  int n = 0;
  for (const Fn k : table) n += k != nullptr ? 1 : 0;
  return n;
}

constexpr int kNumSlots = 5;  // items 1, 2, 4, 8, two-pass

// The 8-item kernel exists only for the vectorised path: a scalar row that
// long (> 1024 elements) goes to the two-pass kernel (8 scalar items need 8
// separate 64-bit addresses per array and do not fit 64 registers).
template <typename T, typename W, int VEC, bool RES>
constexpr KernelFn items8_kernel() {
  if constexpr (VEC > 1) {
    return &rmsnorm_reg_kernel<T, W, VEC, kMaxItems, RES>;
  } else {
    return nullptr;
  }
}

// All kernels of one (T, W, VEC, RES) combination, indexed by kernel_slot().
// This table is the only place kernels are instantiated, so its non-null
// entries are exactly the compiled kernels (see rmsnorm_num_kernels).
template <typename T, typename W, int VEC, bool RES>
struct KernelSet {
  static constexpr KernelFn kKernels[kNumSlots] = {
      &rmsnorm_reg_kernel<T, W, VEC, 1, RES>, &rmsnorm_reg_kernel<T, W, VEC, 2, RES>,
      &rmsnorm_reg_kernel<T, W, VEC, 4, RES>, items8_kernel<T, W, VEC, RES>(),
      &rmsnorm_twopass_kernel<T, W, VEC, RES>};
  static constexpr int count() { return count_kernels_in(kKernels); }
};

// items == 0 selects the two-pass kernel.
struct LaunchConfig {
  int items;  // vectors per thread held in registers
  int tpr;    // threads per row (blockDim.x)
  int rpb;    // rows per block (blockDim.y)
};

constexpr int kernel_slot(int items) {  // 0..kNumSlots-1
  return items == 1 ? 0 : items == 2 ? 1 : items == 4 ? 2 : items == 8 ? 3 : 4;
}

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Host launch helpers shared by the norm family (layernorm.cuh uses them too).

// No row pointers besides x and y.
struct NoOtherRows {
  template <typename Args>
  void operator()(Args&, int64_t) const {}
};

// Enqueues fn over a.rows rows, c.rpb rows per block and at most kMaxRowsPerLaunch rows per
// launch (the grid.x limit): each launch's x and y (of element type T) start `done` rows down,
// and others(part, done) moves the call's other row pointers (rmsnorm's residual and sum).
template <typename T, typename Args, typename Others = NoOtherRows>
cudaError_t launch_rows(void (*fn)(Args), const Args& a, const LaunchConfig& c, cudaStream_t stream,
                        Others others = {}) {
  const dim3 block(static_cast<unsigned>(c.tpr), static_cast<unsigned>(c.rpb));
  for (int64_t done = 0; done < a.rows; done += kMaxRowsPerLaunch) {
    Args part = a;
    part.rows = a.rows - done < kMaxRowsPerLaunch ? a.rows - done : kMaxRowsPerLaunch;
    part.x = static_cast<const T*>(a.x) + done * a.x_stride;
    part.y = static_cast<T*>(a.y) + done * a.y_stride;
    others(part, done);
    const dim3 grid(static_cast<unsigned>(ceil_div(part.rows, c.rpb)));
    fn<<<grid, block, 0, stream>>>(part);
    const cudaError_t err = launch_error();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// The four kernel variants of one (T, W) pair: 16-byte vectors or scalars, x a flag (rmsnorm's
// fused residual, layernorm's bias). f(VEC, FLAG) is called with std::integral_constant tags.
template <int kVec, class F>
cudaError_t dispatch_variant(bool vec_ok, bool flag, F&& f) {
  using On = std::true_type;
  using Off = std::false_type;
  if (vec_ok) {
    return flag ? f(std::integral_constant<int, kVec>{}, On{}) : f(std::integral_constant<int, kVec>{}, Off{});
  }
  return flag ? f(std::integral_constant<int, 1>{}, On{}) : f(std::integral_constant<int, 1>{}, Off{});
}

// Kernels compiled for x of type T: the four variants of weights of type T and, for 16-bit x,
// of fp32 weights. Set<T, W, VEC, FLAG>::count() is one variant's count.
template <template <typename, typename, int, bool> class Set, typename T>
constexpr int count_variants() {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  auto four = [](auto w) {
    using W = typename decltype(w)::type;
    return Set<T, W, kVec, false>::count() + Set<T, W, kVec, true>::count() + Set<T, W, 1, false>::count() +
           Set<T, W, 1, true>::count();
  };
  int n = four(TypeTag<T>{});
  if constexpr (!std::is_same_v<T, float>) n += four(TypeTag<float>{});
  return n;
}

// A norm launch for x of type T (rmsnorm's and layernorm's): nothing for an empty tensor; else,
// for the weight dtype W (T's own or fp32; cudaErrorInvalidValue for any other) and the variant
// chosen (16-byte vectors when vec_ok, the norm's flag), launch(TypeTag<W>, VEC, FLAG) with
// std::integral_constant tags.
template <typename T, class Params, class Launch>
cudaError_t launch_norm(const Params& p, bool vec_ok, bool flag, Launch&& launch) {
  if (p.rows <= 0 || p.hidden <= 0) return cudaSuccess;
  return dispatch_weight_dtype<T>(p.weight_dtype, [&](auto w) {
    return dispatch_variant<16 / static_cast<int>(sizeof(T))>(vec_ok, flag,
                                                               [&](auto vec, auto f) { return launch(w, vec, f); });
  });
}

// Whether one more row operand allows the 16-byte-vector kernels: its pointer 16-byte aligned
// and, with more than one row, its row stride a multiple of kVec.
template <int kVec>
bool vec_operand_ok(const void* ptr, int64_t row_stride, int64_t rows) {
  return is_aligned(ptr, 16u) && (rows <= 1 || row_stride % kVec == 0);
}

// The 16-byte-vector condition both norms share (hidden a multiple of kVec; x, y and the weight
// aligned; x's and y's row strides multiples of kVec); fp32 weights with 16-bit x are read as two
// 16-byte halves. Each norm adds its own operands (residual and sum, bias) with vec_operand_ok.
template <int kVec, class Params>
bool vec_rows_ok(const Params& p) {
  return p.hidden % kVec == 0 && is_aligned(p.weight, 16u) && vec_operand_ok<kVec>(p.x, p.x_row_stride, p.rows) &&
         vec_operand_ok<kVec>(p.y, p.y_row_stride, p.rows);
}

// The kernel-argument fields both norms share, from their Params (vec: the vector width chosen).
template <class Args, class Params>
void fill_row_args(Args& a, const Params& p, int vec) {
  a.x = p.x;
  a.weight = p.weight;
  a.y = p.y;
  a.x_stride = p.x_row_stride;
  a.y_stride = p.y_row_stride;
  a.rows = p.rows;
  a.hidden = p.hidden;
  a.nv = p.hidden / vec;
  a.inv_hidden = static_cast<float>(1.0 / static_cast<double>(p.hidden));
  a.eps = p.eps;
  a.opaque_zero = 0;
}

constexpr int next_pow2(int64_t n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// The config table: a function of nv = vectors per row (VEC = 16 / sizeof(T)
// elements when vectorised, so nv folds in the dtype), of whether the row is
// vectorised (else VEC = 1) and of whether the residual is fused.
// Measured on H200: a thread should have >= 2 vectors (32 B) of loads in
// flight; plain rmsnorm therefore starts at 2 items, fused add (x and residual
// per item) at 1 item.
constexpr LaunchConfig rmsnorm_config(int64_t nv, bool vectorized, bool res) {
  const int min_items = res ? 1 : 2;
  if (nv <= static_cast<int64_t>(kWarpSize) * min_items) {
    // Tiny rows: sub-warp groups (width-limited shuffles, no smem), 256/tpr
    // rows packed per 256-thread block so every thread has work.
    const int items = nv >= min_items ? min_items : 1;
    const int tpr = next_pow2(ceil_div(nv, items));
    return {items, tpr, kSmallBlockThreads / tpr};
  }
  for (int items = min_items; items <= kMaxItems / 2; items *= 2) {
    // Medium rows: fewest items that keep the group <= 256 threads (several
    // blocks per SM, cheap reduction); groups are whole warps.
    const int64_t groups = ceil_div(nv, items);
    if (groups <= kSmallBlockThreads) {
      const int tpr = static_cast<int>(ceil_div(groups, kWarpSize) * kWarpSize);
      // Pack several rows per 256-thread block while a row is <= 128 threads.
      const int rpb = tpr <= kSmallBlockThreads / 2 ? kSmallBlockThreads / tpr : 1;
      return {items, tpr, rpb};
    }
  }
  if (vectorized && nv <= static_cast<int64_t>(kMaxItems) * kMaxThreadsPerRow) {
    // Large rows (1025..8192 vectors): 8 items, grow the group up to 1024 threads.
    const int tpr = static_cast<int>(ceil_div(ceil_div(nv, kMaxItems), kWarpSize) * kWarpSize);
    return {kMaxItems, tpr, 1};
  }
  // Rows that do not fit in registers (and scalar rows > 1024 elements):
  // two-pass, one 512-thread block per row (up to 128 registers).
  return {0, kTwoPassThreads, 1};
}

// Compile-time check of the table: every config fits its kernel's launch
// bounds, covers the row, and uses whole warps (full-mask shuffles).
constexpr bool rmsnorm_config_table_ok() {
  for (int64_t nv = 1; nv <= 3 * kMaxItems * kMaxThreadsPerRow; nv += (nv < 4096 ? 1 : 61)) {
    for (int f = 0; f < 4; ++f) {
      const bool vectorized = (f & 1) != 0;
      const LaunchConfig c = rmsnorm_config(nv, vectorized, (f & 2) != 0);
      const int max_threads = c.items == 0 ? kTwoPassThreads : reg_kernel_max_threads(c.items);
      if (c.tpr * c.rpb > max_threads || (c.tpr * c.rpb) % kWarpSize != 0) return false;
      if (c.tpr < kWarpSize ? (c.tpr & (c.tpr - 1)) != 0 : c.tpr % kWarpSize != 0) return false;
      if (c.items != 0 && static_cast<int64_t>(c.items) * c.tpr < nv) return false;
      if (c.items == kMaxItems && !vectorized) return false;
    }
  }
  return true;
}
static_assert(rmsnorm_config_table_ok(), "rmsnorm config table violates a kernel constraint");

template <typename T, typename W, int VEC, bool RES>
cudaError_t launch_kernel(const KernelArgs& a, const LaunchConfig& c, cudaStream_t stream) {
  return launch_rows<T>(KernelSet<T, W, VEC, RES>::kKernels[kernel_slot(c.items)], a, c, stream,
                        [](KernelArgs& part, int64_t done) {
                          if constexpr (RES) {
                            part.residual = static_cast<const T*>(part.residual) + done * part.r_stride;
                            part.sum_out = static_cast<T*>(part.sum_out) + done * part.s_stride;
                          }
                        });
}

}  // namespace rmsnorm_detail

// RMSNorm / fused add + RMSNorm for x of element type T (float, __half,
// __nv_bfloat16); weight of type T or fp32. Enqueues on `stream`; returns
// cudaErrorInvalidValue for an unsupported weight dtype, else the launch status.
// Never throws, never synchronises.
template <typename T>
cudaError_t launch_rmsnorm(const RmsNormParams& p, cudaStream_t stream) {
  using namespace rmsnorm_detail;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const bool res = p.residual != nullptr;
  const bool vec_ok = vec_rows_ok<kVec>(p) && (!res || (vec_operand_ok<kVec>(p.residual, p.residual_row_stride, p.rows) &&
                                                         vec_operand_ok<kVec>(p.sum_out, p.sum_row_stride, p.rows)));
  KernelArgs a{};
  fill_row_args(a, p, vec_ok ? kVec : 1);
  a.residual = p.residual;
  a.sum_out = p.sum_out;
  a.r_stride = p.residual_row_stride;
  a.s_stride = p.sum_row_stride;
  a.weight_offset = p.weight_offset;
  const LaunchConfig c = rmsnorm_config(a.nv, vec_ok, res);
  return launch_norm<T>(p, vec_ok, res, [&](auto w, auto vec, auto flag) {
    return launch_kernel<T, typename decltype(w)::type, decltype(vec)::value, decltype(flag)::value>(a, c, stream);
  });
}

// Number of kernels launch_rmsnorm<T> can launch (all compiled with it).
template <typename T>
int rmsnorm_num_kernels() {
  return rmsnorm_detail::count_variants<rmsnorm_detail::KernelSet, T>();
}

}  // namespace fray
