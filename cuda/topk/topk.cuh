// Fray topk family: radix-select top-k (one CTA or one thread-block cluster per row)
// and its launcher. Torch-free: raw pointers, sizes and a stream. See README.md.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/common/vec.cuh"
#include "cuda/topk/order_key.cuh"
#include "cuda/topk/topk.h"
#include "cuda/topk/topk_device.cuh"
#include "cuda/topk/topk_plan.h"
#include "cuda/topk/topk_stream.cuh"

namespace fray {
namespace topk_detail {

struct Scratch {
  uint32_t scan[kWarp];
  uint32_t warp_gt[kWarp];
  uint32_t warp_eq[kWarp];
  uint32_t slice_total;
  uint32_t cta_gt, cta_eq;
  uint32_t base_gt, base_eq;
  uint32_t sel_slice, sel_above;
  uint32_t res_bin, res_above, res_cnt;
};
static_assert(sizeof(Scratch) <= kStaticSmemBound, "topk_kernel: static shared memory above the plan's bound");

// ---------------------------------------------------------------------------
// The kernel. One row per CTA (CLUSTER = false) or per cluster of C CTAs, CTA
// r holding elements [r * slice, (r + 1) * slice) of the row as keys in shared
// memory: the row is read from global memory once.
//
// 1. Read the slice, turn each element into its key (order_key.cuh) and build
//    the histogram of the top RB key bits on the way.
// 2. Radix select, most significant digit first: the merged histogram gives the
//    digit of the k-th largest key; the next pass counts only keys with the
//    digits found so far. Stops as soon as the chosen bin holds exactly the
//    remaining count (every key with that prefix is in the top k), usually
//    after two passes on real data. Cluster merge per pass: every CTA sums one
//    1/C share of the bins over all CTAs' histograms (distributed shared
//    memory), then every CTA reads the C share totals and scans the share that
//    holds the k-th key. Two cluster barriers per pass.
// 3. Gather: keys above the threshold prefix plus the first `need` keys equal
//    to it, in index order (warp ballots over contiguous chunks, exclusive
//    counts per warp, per CTA and per cluster rank), so the selected set obeys
//    the lower-index tie rule and every winner knows its position.
// 4. Index-ordered output is written straight to global memory (or as int64
//    rank keys, for callers that sort k > kTopkMaxSortK themselves). Rank-ordered
//    output: every winner writes (key << 32 | ~index) to CTA 0's buffer, which
//    CTA 0 bitonic-sorts (decreasing) and writes out; values are read back
//    from x by index, so their bits (NaN payloads, -0.0) are x's.
// ---------------------------------------------------------------------------
template <typename T, int VEC, int RB, bool CLUSTER>
__global__ void __launch_bounds__(kMaxThreads, 2) topk_kernel(const TopkArgs a) {
  using OK = OrderKey<T>;
  using Bits = typename OK::Bits;
  using Key = typename OK::Key;
  constexpr int kKeyBits = OK::kBits;
  constexpr int kKeyBytes = static_cast<int>(sizeof(Key));
  constexpr int kKeysPerVec = 16 / kKeyBytes;
  constexpr int kPasses = (kKeyBits + RB - 1) / RB;
  constexpr int kShift0 = kKeyBits - RB;
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "topk_kernel: VEC is one element or 16 bytes");
  static_assert(sizeof(Key) == sizeof(T), "topk_kernel: keys are as wide as the elements");

  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Scratch sh;

  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int lane = tid % kWarp;
  const int warp = tid / kWarp;
  const int nwarps = nthreads / kWarp;

  int nctas = 1;
  int rank = 0;
  int64_t row = blockIdx.x;
  if constexpr (CLUSTER) {
    const cg::cluster_group cl = cg::this_cluster();
    nctas = static_cast<int>(cl.num_blocks());
    rank = static_cast<int>(cl.block_rank());
    row = blockIdx.x / nctas;
  }
  const int start = rank * a.slice;
  const int len = max(0, min(a.slice, a.width - start));
  Key* keys = reinterpret_cast<Key*>(smem);
  uint32_t* hist = reinterpret_cast<uint32_t*>(smem + static_cast<size_t>(a.slice) * kKeyBytes);
  uint32_t* merged = hist + (1 << RB);                     // this CTA's share of the merged bins
  uint64_t* sortbuf = reinterpret_cast<uint64_t*>(hist);  // aliases the histograms (used after them)
  const Bits* xrow = static_cast<const Bits*>(a.x) + row * a.x_stride;

  for (int i = tid; i < (1 << RB); i += nthreads) hist[i] = 0u;
  __syncthreads();

  // ---- 1. read the slice once: keys to shared memory, first-digit histogram ----
  {
    const Bits* src = xrow + start;
    const int nvec = (len + VEC - 1) / VEC;
    const int nfull = len / VEC;
    for (int base = 0; base < nvec; base += nthreads * kLoadUnroll) {
      uint4 w[kLoadUnroll];
      load_vectors<VEC>(src, len, nfull, base, nthreads, tid, w);
#pragma unroll
      for (int u = 0; u < kLoadUnroll; ++u) {
        const int vi = base + u * nthreads + tid;
        uint32_t kv[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const uint32_t bits = VEC > 1 ? item_of<static_cast<int>(sizeof(T))>(w[u], j) : w[u].x;
          kv[j] = OK::of(bits) ^ a.flip;
          hist_add(hist, vi * VEC + j < len, kv[j] >> kShift0, lane);
        }
        if (vi < nvec) {
          if constexpr (VEC > 1) {
            *reinterpret_cast<uint4*>(keys + vi * VEC) = pack_items<kKeyBytes>(kv);
          } else {
            keys[vi] = static_cast<Key>(kv[0]);
          }
        }
      }
    }
  }

  // ---- 2. radix select ----
  uint32_t prefix = 0u;  // digits of the k-th key found so far
  uint32_t mask = 0u;    // the key bits they cover
  uint32_t rem = static_cast<uint32_t>(a.k);  // winners still to find among keys matching prefix
  for (int p = 0; p < kPasses; ++p) {
    const int shift = kKeyBits - (p + 1) * RB > 0 ? kKeyBits - (p + 1) * RB : 0;
    const int nb = 1 << (kKeyBits - p * RB - shift);
    if (p > 0) {
      for (int i = tid; i < nb; i += nthreads) hist[i] = 0u;
      __syncthreads();
      const int nkv = (len + kKeysPerVec - 1) / kKeysPerVec;
      for (int base = 0; base < nkv; base += nthreads) {
        const int vi = base + tid;
        const uint4 q = vi < nkv ? *reinterpret_cast<const uint4*>(keys + vi * kKeysPerVec) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < kKeysPerVec; ++j) {
          const uint32_t key = item_of<kKeyBytes>(q, j);
          const bool match = vi * kKeysPerVec + j < len && (key & mask) == prefix;
          hist_add(hist, match, (key >> shift) & static_cast<uint32_t>(nb - 1), lane);
        }
      }
    }

    const uint32_t* cnt = hist;
    int n = nb;
    uint32_t base_above = 0u;
    int bin_offset = 0;
    if constexpr (CLUSTER) {
      const cg::cluster_group cl = cg::this_cluster();
      cl.sync();  // every CTA's histogram is complete (and every CTA has started)
      const int nbs = nb / nctas;
      uint32_t part = 0u;
      for (int j = tid; j < nbs; j += nthreads) {
        // All kMaxCluster remote loads issued back to back (ranks past the cluster re-read
        // this CTA's bin and add nothing): one distributed-shared-memory latency, not C.
        uint32_t v[kMaxCluster];
#pragma unroll
        for (int c = 0; c < kMaxCluster; ++c) v[c] = cl.map_shared_rank(hist, c < nctas ? c : rank)[rank * nbs + j];
        uint32_t s = 0u;
#pragma unroll
        for (int c = 0; c < kMaxCluster; ++c) s += c < nctas ? v[c] : 0u;
        merged[j] = s;
        part += s;
      }
      part = block_sum(part, sh.scan);
      if (tid == 0) sh.slice_total = part;
      cl.sync();  // every share and share total is merged
      select_share(sh, nctas, rem, warp, lane);
      const int s = static_cast<int>(sh.sel_slice);
      cnt = cl.map_shared_rank(merged, s);
      n = nbs;
      base_above = sh.sel_above;
      bin_offset = s * nbs;
    } else {
      __syncthreads();
    }
    find_bin(cnt, n, base_above, rem, sh);
    const uint32_t bin = static_cast<uint32_t>(bin_offset) + sh.res_bin;
    const uint32_t eq = sh.res_cnt;
    rem -= sh.res_above;
    prefix |= bin << shift;
    mask |= static_cast<uint32_t>(nb - 1) << shift;
    if (eq == rem) break;  // the whole bin is in: same decision in every thread and CTA
  }

  // ---- 3. gather, in index order ----
  const uint32_t need = rem;  // winners among the keys equal to prefix (on mask)
  const int chunk = ((len + nwarps - 1) / nwarps + kWarp - 1) / kWarp * kWarp;
  const int wbeg = min(len, warp * chunk);
  const int wend = min(len, wbeg + chunk);
  {
    uint32_t n_gt = 0u;
    uint32_t n_eq = 0u;
    for (int e0 = wbeg; e0 < wend; e0 += kWarp) {
      const int e = e0 + lane;
      const uint32_t mk = (e < wend ? static_cast<uint32_t>(keys[e]) : 0u) & mask;
      n_gt += __popc(__ballot_sync(kFullMask, e < wend && mk > prefix));
      n_eq += __popc(__ballot_sync(kFullMask, e < wend && mk == prefix));
    }
    if (lane == 0) {
      sh.warp_gt[warp] = n_gt;
      sh.warp_eq[warp] = n_eq;
    }
  }
  __syncthreads();
  if (warp == 0) {
    const uint32_t g = lane < nwarps ? sh.warp_gt[lane] : 0u;
    const uint32_t q = lane < nwarps ? sh.warp_eq[lane] : 0u;
    const uint32_t gi = warp_prefix_incl(g, lane);
    const uint32_t qi = warp_prefix_incl(q, lane);
    if (lane < nwarps) {
      sh.warp_gt[lane] = gi - g;
      sh.warp_eq[lane] = qi - q;
    }
    if (lane == kWarp - 1) {
      sh.cta_gt = gi;
      sh.cta_eq = qi;
    }
  }
  const bool rank_order = a.sort_size > 0;
  if constexpr (CLUSTER) {
    const cg::cluster_group cl = cg::this_cluster();
    cl.sync();  // CTA counts published; no CTA reads another's histograms any more
    if (warp == 0) {
      uint32_t g = 0u;
      uint32_t q = 0u;
      if (lane < rank) {
        g = *cl.map_shared_rank(&sh.cta_gt, lane);
        q = *cl.map_shared_rank(&sh.cta_eq, lane);
      }
      g = warp_sum_u32(g);
      q = warp_sum_u32(q);
      if (lane == 0) {
        sh.base_gt = g;
        sh.base_eq = q;
      }
    }
    // Index order: this CTA's last remote reads are done; it may exit once all have arrived.
    if (!rank_order) cl.barrier_arrive();
  } else {
    if (tid == 0) {
      sh.base_gt = 0u;
      sh.base_eq = 0u;
    }
  }
  __syncthreads();

  Bits* vals = static_cast<Bits*>(a.values) + row * a.k;
  int64_t* inds = a.indices + row * a.k;
  uint64_t* dst = sortbuf;
  if constexpr (CLUSTER) {
    if (rank_order) dst = cg::this_cluster().map_shared_rank(sortbuf, 0);
  }
  {
    uint32_t gt_base = sh.base_gt + sh.warp_gt[warp];
    uint32_t eq_base = sh.base_eq + sh.warp_eq[warp];
    const uint32_t lt = lanemask_lt();
    for (int e0 = wbeg; e0 < wend; e0 += kWarp) {
      const int e = e0 + lane;
      const bool valid = e < wend;
      const uint32_t key = valid ? static_cast<uint32_t>(keys[e]) : 0u;
      const uint32_t mk = key & mask;
      const bool is_gt = valid && mk > prefix;
      const bool is_eq = valid && mk == prefix;
      const unsigned bg = __ballot_sync(kFullMask, is_gt);
      const unsigned be = __ballot_sync(kFullMask, is_eq);
      const uint32_t eq_rank = eq_base + __popc(be & lt);  // equal keys before this one
      if (is_gt || (is_eq && eq_rank < need)) {
        const uint32_t pos = gt_base + __popc(bg & lt) + min(eq_rank, need);
        const int idx = start + e;
        if (rank_order) {
          dst[pos] = (static_cast<uint64_t>(key) << 32) | static_cast<uint32_t>(~idx);
        } else if (a.rank_keys != nullptr) {
          a.rank_keys[row * a.k + pos] = static_cast<int64_t>((static_cast<uint64_t>(key) << kRankKeyIndexBits) |
                                                              (kRankKeyIndexMask - static_cast<uint32_t>(idx)));
        } else {
          inds[pos] = idx;
          vals[pos] = xrow[idx];
        }
      }
      gt_base += __popc(bg);
      eq_base += __popc(be);
    }
  }

  if (!rank_order) {
    if constexpr (CLUSTER) cg::this_cluster().barrier_wait();
    return;
  }

  // ---- 4. rank order: CTA 0 sorts the k winners ----
  if (rank == 0) {
    for (int j = a.k + tid; j < a.sort_size; j += nthreads) sortbuf[j] = 0ull;  // below every real entry
  }
  if constexpr (CLUSTER) {
    cg::this_cluster().sync();  // every winner has landed in CTA 0
  } else {
    __syncthreads();
  }
  if (rank != 0) return;
  bitonic_sort_desc(sortbuf, a.sort_size);
  // kOutUnroll gathers from x in flight per thread: loads first, then the stores
  // (which may alias x as far as the compiler knows and would serialise them).
  for (int j0 = tid; j0 < a.k; j0 += kOutUnroll * nthreads) {
    uint32_t idx[kOutUnroll];
    Bits v[kOutUnroll];
#pragma unroll
    for (int u = 0; u < kOutUnroll; ++u) {
      const int j = j0 + u * nthreads;
      idx[u] = j < a.k ? ~static_cast<uint32_t>(sortbuf[j]) : 0u;
      v[u] = j < a.k ? xrow[idx[u]] : Bits{};
    }
#pragma unroll
    for (int u = 0; u < kOutUnroll; ++u) {
      const int j = j0 + u * nthreads;
      if (j < a.k) {
        inds[j] = idx[u];
        vals[j] = v[u];
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------
using TopkKernelFn = void (*)(TopkArgs);

// TopkConfig and topk_config: topk_plan.h (host-only, checked by the CPU tests).

template <typename T, int VEC>
constexpr TopkKernelFn topk_kernel_for(bool big_radix, bool cluster) {
  return big_radix ? (cluster ? &topk_kernel<T, VEC, kBigRadix, true> : &topk_kernel<T, VEC, kBigRadix, false>)
                   : (cluster ? &topk_kernel<T, VEC, kSmallRadix, true> : &topk_kernel<T, VEC, kSmallRadix, false>);
}

template <typename T, int VEC>
constexpr TopkKernelFn topk_stream_kernel_for(bool cluster) {
  return cluster ? &topk_stream_kernel<T, VEC, true> : &topk_stream_kernel<T, VEC, false>;
}

// Resident clusters of the streaming kernel (16-byte loads) per cluster size
// (cudaOccupancyMaxActiveClusters, with the load-balancing policy it launches with), queried once
// per device on `stream`; entries stay 0 (the plan's estimate) where a query fails. The
// element-load variant has the same launch bounds, threads and shared memory. While `stream` is
// capturing a CUDA graph nothing is queried (null until a call outside capture has queried): the
// capture stays free of calls it may not allow, and the plan falls back to its estimate.
template <typename T>
const StreamFit* stream_fit(int device, cudaStream_t stream) {
  struct Cache {
    std::atomic<bool> ready{false};
    std::mutex mu;
    StreamFit fit{};
  };
  static Cache cache[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return nullptr;
  Cache& c = cache[device];
  if (c.ready.load(std::memory_order_acquire)) return &c.fit;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (status != cudaStreamCaptureStatusNone) return nullptr;
  const std::lock_guard<std::mutex> lock(c.mu);
  if (!c.ready.load(std::memory_order_relaxed)) {
    const TopkKernelFn fn = topk_stream_kernel_for<T, 16 / static_cast<int>(sizeof(T))>(true);
    for (int lg = 1; lg <= 4; ++lg) {
      const int cl = 1 << lg;
      if (prepare_kernel(reinterpret_cast<const void*>(fn), device, stream_smem(cl), cl) != cudaSuccess) break;
      cudaLaunchAttribute attr[2];
      const cudaLaunchConfig_t cfg =
          cluster_config(attr, dim3(static_cast<unsigned>(cl)), dim3(kStreamThreads), stream_smem(cl), cl, true, stream);
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, fn, &cfg) == cudaSuccess) c.fit.max_clusters[lg] = n;
    }
    (void)cudaGetLastError();  // a failed query leaves no error for the caller
    c.ready.store(true, std::memory_order_release);
  }
  return &c.fit;
}

template <typename T>
cudaError_t launch_topk_typed(const TopkParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const TopkConfig c = topk_config(p.rows, p.width, p.k, p.sorted, static_cast<int>(sizeof(T)), sm_count(device),
                                   stream_fit<T>(device, stream));
  // 16-byte loads need every row start 16-byte aligned (slices are multiples of 8 elements).
  const bool vec_ok =
      is_aligned(p.x, 16) && (p.rows <= 1 || (p.x_row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0);
  const TopkKernelFn fn = c.stream ? (vec_ok ? topk_stream_kernel_for<T, kVec>(c.cluster > 1)
                                             : topk_stream_kernel_for<T, 1>(c.cluster > 1))
                         : vec_ok ? topk_kernel_for<T, kVec>(c.big_radix, c.cluster > 1)
                                  : topk_kernel_for<T, 1>(c.big_radix, c.cluster > 1);
  err = prepare_kernel(reinterpret_cast<const void*>(fn), device, c.smem, c.cluster);
  if (err != cudaSuccess) return err;

  TopkArgs a{};
  a.x_stride = p.x_row_stride;
  a.width = static_cast<int>(p.width);
  a.k = static_cast<int>(p.k);
  a.slice = c.slice;
  a.sort_size = c.sort_size;
  a.flip = p.largest ? 0u : OrderKey<T>::kAll;
  a.prefilter = c.stream && stream_prefilter(p.width, p.k, vec_ok) ? 1 : 0;
  const int64_t rows_per_launch = kMaxBlocksPerLaunch / c.cluster;
  for (int64_t done = 0; done < p.rows; done += rows_per_launch) {
    a.rows = p.rows - done < rows_per_launch ? p.rows - done : rows_per_launch;
    a.x = static_cast<const T*>(p.x) + done * p.x_row_stride;
    a.values = static_cast<T*>(p.values) + done * p.k;
    a.indices = p.indices + done * p.k;
    a.rank_keys = p.rank_keys != nullptr ? p.rank_keys + done * p.k : nullptr;
    const dim3 grid(static_cast<unsigned>(a.rows * c.cluster));
    // The streaming kernel's clusters with the load-balancing policy: the H200 then holds 81
    // clusters of 8 instead of 77, and 64 x 131072 k 50 took 51.7 instead of 57.2 us
    // (bench/micro/topk_stream_clusters.cu).
    err = launch_clustered(fn, a, grid, dim3(static_cast<unsigned>(c.threads)), c.smem, c.cluster, stream, c.stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace topk_detail

// Top-k of rows of T; see TopkParams. Enqueues on `stream`; never throws or synchronises.
template <typename T>
cudaError_t launch_topk(const TopkParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  return topk_detail::launch_topk_typed<T>(p, stream);
}

// Kernels launch_topk<T> can launch: 2 load widths x 2 digit widths x {CTA, cluster}, and the
// streaming kernel: 2 load widths x {CTA, cluster}.
template <typename T>
constexpr int topk_num_kernels() {
  return 12;
}

}  // namespace fray
