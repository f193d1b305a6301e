// Fray topk family: device helpers shared by the top-k kernels (topk.cuh, topk_stream.cuh):
// kernel arguments, warp/block scans, the warp-aggregated histogram add, the radix bin search
// and the bitonic sort of 64-bit keys. See README.md.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/topk/topk.h"
#include "cuda/topk/topk_plan.h"

namespace fray {
namespace topk_detail {

namespace cg = cooperative_groups;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
constexpr int kLoadUnroll = 4;        // 16-byte loads in flight per thread while reading the row
constexpr int kOutUnroll = 4;         // x gathers in flight per thread while writing ranked winners
constexpr int kRankKeyIndexBits = 24;  // widths <= 2^24: key << 24 stays below 2^56 (non-negative int64)
constexpr uint32_t kRankKeyIndexMask = (1u << kRankKeyIndexBits) - 1u;
static_assert(kTopkMaxWidth <= (int64_t{1} << kRankKeyIndexBits), "rank keys hold indices in 24 bits");

// Kernel arguments (param space). Strides and lengths in elements.
struct TopkArgs {
  const void* x;
  int64_t x_stride;
  void* values;      // [rows, k], x's element type
  int64_t* indices;  // [rows, k]
  int64_t* rank_keys;  // [rows, k] or null: index-ordered rank keys instead of values/indices
  int64_t rows;
  int width;
  int k;
  int slice;      // elements per CTA (multiple of kSliceAlign); CTA r holds [r * slice, ...)
  int sort_size;  // next_pow2(k) for rank-ordered output, 0 for index-ordered output
  uint32_t flip;  // 0 (largest) or the key mask (smallest)
  int prefilter;  // streaming kernel: pass 1 counts vector maxima (stream_prefilter)
};

__device__ __forceinline__ uint32_t lanemask_lt() {
  uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

__device__ __forceinline__ uint32_t warp_sum_u32(uint32_t v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Sum over lanes <= lane.
__device__ __forceinline__ uint32_t warp_prefix_incl(uint32_t v, int lane) {
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const uint32_t y = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += y;
  }
  return v;
}

// Sum over lanes >= lane.
__device__ __forceinline__ uint32_t warp_suffix_incl(uint32_t v, int lane) {
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const uint32_t y = __shfl_down_sync(kFullMask, v, o);
    if (lane + o < kWarp) v += y;
  }
  return v;
}

// Block-wide sum, returned to every thread. Two barriers (buf is reusable after).
__device__ __forceinline__ uint32_t block_sum(uint32_t v, uint32_t* buf) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int nwarps = blockDim.x / kWarp;
  v = warp_sum_u32(v);
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  const uint32_t t = warp_sum_u32(lane < nwarps ? buf[lane] : 0u);
  __syncthreads();
  return t;
}

// Sum of v over threads >= this one (thread order). Two barriers.
__device__ __forceinline__ uint32_t block_suffix_incl(uint32_t v, uint32_t* buf) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int nwarps = blockDim.x / kWarp;
  v = warp_suffix_incl(v, lane);
  if (lane == 0) buf[warp] = v;  // lane 0 holds its warp's total
  __syncthreads();
  uint32_t add = 0u;
  for (int w = warp + 1; w < nwarps; ++w) add += buf[w];
  __syncthreads();
  return v + add;
}

// hist[digit] += 1 for the active lanes. Warp-uniform call. When every active
// lane has the same digit (runs of equal values, -inf-masked vocabularies) one
// lane adds the count: same-address shared atomics serialise per lane.
__device__ __forceinline__ void hist_add(uint32_t* hist, bool active, uint32_t digit, int lane) {
  const unsigned act = __ballot_sync(kFullMask, active);
  if (act == 0u) return;
  const int leader = __ffs(act) - 1;
  const uint32_t d0 = __shfl_sync(kFullMask, digit, leader);
  if (__all_sync(kFullMask, !active || digit == d0)) {
    if (lane == leader) atomicAdd(hist + d0, static_cast<uint32_t>(__popc(act)));
  } else if (active) {
    atomicAdd(hist + digit, 1u);
  }
}

// Cluster merge, after the barrier that published every CTA's share total (sh.slice_total):
// warp 0 finds the share s holding the rem-th largest element (shares in decreasing key order,
// so totals are summed from the top) and what lies above it: sh.sel_slice, sh.sel_above (sh: a
// kernel's scratch with those fields; warp, lane: the calling thread's). Ends with a barrier.
template <typename S>
__device__ __forceinline__ void select_share(S& sh, int nctas, uint32_t rem, int warp, int lane) {
  if (warp == 0) {
    const cg::cluster_group cl = cg::this_cluster();
    const uint32_t t = lane < nctas ? *cl.map_shared_rank(&sh.slice_total, lane) : 0u;
    const uint32_t incl = warp_suffix_incl(t, lane);
    const uint32_t excl = incl - t;
    const unsigned hit = __ballot_sync(kFullMask, lane < nctas && excl < rem && rem <= incl);
    const int s = hit != 0u ? __ffs(hit) - 1 : 0;
    const uint32_t above = __shfl_sync(kFullMask, excl, s);
    if (lane == 0) {
      sh.sel_slice = static_cast<uint32_t>(s);
      sh.sel_above = above;
    }
  }
  __syncthreads();
}

// The bin b of cnt[0, n) (bins in increasing key order) holding the rem-th
// largest element: base + above(b) < rem <= base + above(b) + cnt[b], where
// above(b) = sum of cnt[j > b]. Requires base < rem <= base + sum(cnt). cnt may
// be another CTA's shared memory. Results in sh.res_* (sh: a kernel's scratch with scan[kWarp],
// res_bin, res_above, res_cnt); ends with a barrier.
template <typename S>
__device__ __forceinline__ void find_bin(const uint32_t* cnt, int n, uint32_t base, uint32_t rem, S& sh) {
  const int per = (n + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
  const int lo = min(n, static_cast<int>(threadIdx.x) * per);
  const int hi = min(n, lo + per);
  uint32_t s = 0u;
  for (int j = lo; j < hi; ++j) s += cnt[j];
  const uint32_t incl = block_suffix_incl(s, sh.scan);
  const uint32_t excl = incl - s;
  if (base + excl < rem && rem <= base + incl) {  // exactly one thread
    uint32_t acc = base + excl;
    for (int j = hi - 1; j >= lo; --j) {
      const uint32_t c = cnt[j];
      if (acc + c >= rem) {
        sh.res_bin = static_cast<uint32_t>(j);
        sh.res_above = acc;
        sh.res_cnt = c;
        break;
      }
      acc += c;
    }
  }
  __syncthreads();
}

__device__ __forceinline__ void compare_swap_desc(uint64_t* buf, int i, int stride, int size) {
  const int lo = 2 * i - (i & (stride - 1));
  const int hi = lo + stride;
  const uint64_t x = buf[lo];
  const uint64_t y = buf[hi];
  if ((lo & size) == 0 ? x < y : x > y) {
    buf[lo] = y;
    buf[hi] = x;
  }
}

// Bitonic stages of stride <= 32 for merge sizes size_lo..size_hi (powers of two)
// on every aligned 64-key segment of buf[0, n): one warp per segment, keys in
// registers (lane holds positions base + lane and base + 32 + lane), shuffles
// instead of a shared-memory round trip and a block barrier per stage.
// Position p keeps the larger key of its pair iff it is the pair's lower
// position and (p & size) == 0, or the upper one and (p & size) != 0
// (compare_swap_desc's rule). Warp-uniform loop; the caller adds the barriers.
__device__ __forceinline__ void bitonic_segment_stages(uint64_t* buf, int n, int size_lo, int size_hi) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int nwarps = static_cast<int>(blockDim.x) / kWarp;
  for (int seg = static_cast<int>(threadIdx.x) / kWarp; seg < n / (2 * kWarp); seg += nwarps) {
    const int p0 = seg * 2 * kWarp + lane;
    const int p1 = p0 + kWarp;
    uint64_t v0 = buf[p0];
    uint64_t v1 = buf[p1];
    for (int size = size_lo; size <= size_hi; size <<= 1) {
      for (int stride = min(size >> 1, kWarp); stride > 0; stride >>= 1) {
        if (stride == kWarp) {  // the pair (p0, p1) sits in this lane; size >= 64 gives both one direction
          const bool desc = (p0 & size) == 0;
          const uint64_t big = v0 > v1 ? v0 : v1;
          const uint64_t small = v0 > v1 ? v1 : v0;
          v0 = desc ? big : small;
          v1 = desc ? small : big;
        } else {
          const bool low = (lane & stride) == 0;
          const uint64_t o0 = __shfl_xor_sync(kFullMask, v0, stride);
          const uint64_t o1 = __shfl_xor_sync(kFullMask, v1, stride);
          const bool keep_big0 = low == ((p0 & size) == 0);
          const bool keep_big1 = low == ((p1 & size) == 0);
          v0 = keep_big0 == (o0 > v0) ? o0 : v0;
          v1 = keep_big1 == (o1 > v1) ? o1 : v1;
        }
      }
    }
    buf[p0] = v0;
    buf[p1] = v1;
  }
}

// Bitonic sort of buf[0, n) (n a power of two) into decreasing order. Up to 64
// keys one warp sorts alone (no block barriers). Above, only strides >= 64 go
// through shared memory with a block barrier each; every run of strides 32..1
// is one register pass per 64-key segment (4096 keys: 28 shared-memory passes
// and barriers instead of 78). Ends with a barrier.
__device__ __forceinline__ void bitonic_sort_desc(uint64_t* buf, int n) {
  const int tid = static_cast<int>(threadIdx.x);
  if (n <= 2 * kWarp) {
    if (tid < kWarp) {
      for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
          if (tid < n / 2) compare_swap_desc(buf, tid, stride, size);
          __syncwarp();
        }
      }
    }
  } else {
    bitonic_segment_stages(buf, n, 2, 2 * kWarp);
    __syncthreads();
    for (int size = 4 * kWarp; size <= n; size <<= 1) {
      for (int stride = size >> 1; stride > kWarp; stride >>= 1) {
        for (int i = tid; i < n / 2; i += static_cast<int>(blockDim.x)) compare_swap_desc(buf, i, stride, size);
        __syncthreads();
      }
      bitonic_segment_stages(buf, n, size, size);
      __syncthreads();
    }
  }
  __syncthreads();
}

}  // namespace topk_detail
}  // namespace fray
