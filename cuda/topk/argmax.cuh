// Fray topk family: batched argmax (torch.argmax semantics) and its launcher.
// Torch-free: raw pointers, sizes and a stream. See README.md.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/common/vec.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/topk/order_key.cuh"
#include "cuda/topk/topk.h"
#include "cuda/topk/topk_plan.h"

namespace fray {
namespace argmax_detail {

namespace cg = cooperative_groups;
using topk_detail::ceil_div;
using topk_detail::kMaxCluster;
using topk_detail::next_pow2;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
constexpr int kMaxThreads = 512;
constexpr int kUnroll = 4;            // 16-byte loads in flight per thread
constexpr int kVecsPerThread = 8;     // sizes the block: rows of <= 256 vectors take one warp
constexpr int kRowsPerWarpBlock = 8;  // warp-per-row blocks hold 8 rows (256 threads)
constexpr int kMinClusterVecs = 4;    // a cluster split keeps >= 4 vectors per thread
constexpr int kSliceAlign = 8;

struct ArgmaxArgs {
  const void* x;
  int64_t x_stride;
  int64_t* out;
  int64_t rows;
  int width;
  int slice;  // elements per CTA of a cluster (the whole width otherwise)
};

// Max over the warp of (key << 32 | ~index): the largest key, then the lowest index.
__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const uint64_t y = __shfl_xor_sync(kFullMask, v, o);
    v = y > v ? y : v;
  }
  return v;
}

// One row per group of blockDim.x threads: blockDim.y rows per block (only with
// blockDim.x == 32: warp-only reductions), or one row per cluster of CTAs whose
// bests meet in CTA 0's shared memory. Each thread walks its vectors in index
// order keeping the best (key, ~index) pair, so ties keep the earliest index.
template <typename T, int VEC, bool CLUSTER>
__global__ void __launch_bounds__(kMaxThreads) argmax_kernel(const ArgmaxArgs a) {
  using OK = topk_detail::OrderKey<T>;
  using Bits = typename OK::Bits;
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "argmax_kernel: VEC is one element or 16 bytes");
  __shared__ uint64_t warp_best[kMaxThreads / kWarp];
  __shared__ uint64_t cta_best[kMaxCluster];
  static_assert(sizeof(warp_best) + sizeof(cta_best) <= topk_detail::kStaticSmemBound,
                "argmax_kernel: static shared memory above the plan's bound");

  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int lane = tid % kWarp;
  const int warp = tid / kWarp;
  int rank = 0;
  int nctas = 1;
  int64_t row;
  if constexpr (CLUSTER) {
    const cg::cluster_group cl = cg::this_cluster();
    nctas = static_cast<int>(cl.num_blocks());
    rank = static_cast<int>(cl.block_rank());
    row = blockIdx.x / nctas;
    cl.barrier_arrive();  // waited on before the first remote store: every CTA has started
  } else {
    row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
    if (row >= a.rows) return;  // whole warps (blockDim.x == 32 when blockDim.y > 1)
  }
  const int start = rank * a.slice;
  const int len = max(0, min(a.slice, a.width - start));
  const Bits* src = static_cast<const Bits*>(a.x) + row * a.x_stride + start;

  uint64_t best = 0ull;  // below every real entry (its low word ~index is > 0)
  const int nvec = (len + VEC - 1) / VEC;
  const int nfull = len / VEC;
  for (int base = 0; base < nvec; base += nthreads * kUnroll) {
    uint4 w[kUnroll];
    topk_detail::load_vectors<VEC>(src, len, nfull, base, nthreads, tid, w);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int vi = base + u * nthreads + tid;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const uint32_t bits = VEC > 1 ? topk_detail::item_of<static_cast<int>(sizeof(T))>(w[u], j) : w[u].x;
        const int e = vi * VEC + j;
        const uint64_t c = (static_cast<uint64_t>(OK::of(bits)) << 32) | static_cast<uint32_t>(~(start + e));
        if (e < len && c > best) best = c;
      }
    }
  }

  best = warp_max_u64(best);
  if (nthreads > kWarp) {
    if (lane == 0) warp_best[warp] = best;
    __syncthreads();
    if (warp == 0) best = warp_max_u64(lane < nthreads / kWarp ? warp_best[lane] : 0ull);
  }
  if constexpr (CLUSTER) {
    const cg::cluster_group cl = cg::this_cluster();
    cl.barrier_wait();
    if (tid == 0) *cl.map_shared_rank(&cta_best[rank], 0) = best;
    cl.sync();  // every CTA's best is in CTA 0; nothing reads the others' memory afterwards
    if (rank == 0 && warp == 0) {
      const uint64_t b = warp_max_u64(lane < nctas ? cta_best[lane] : 0ull);
      if (lane == 0) a.out[row] = static_cast<int64_t>(~static_cast<uint32_t>(b));
    }
  } else {
    if (tid == 0) a.out[row] = static_cast<int64_t>(~static_cast<uint32_t>(best));
  }
}

using ArgmaxKernelFn = void (*)(ArgmaxArgs);

struct ArgmaxConfig {
  int threads;         // blockDim.x: threads per row and CTA
  int rows_per_block;  // blockDim.y
  int cluster;         // CTAs per row
  int slice;           // elements per CTA
};

// Rows of <= 256 vectors: one warp each, 8 rows per block. Longer rows: one CTA
// of next_pow2(vectors / 8) threads (<= 512); while rows x CTAs stay under two
// per SM, the row is split over a cluster of up to 16 CTAs as long as every
// thread keeps >= 4 vectors (1 x 131072 fp32: 16 CTAs x 512 threads x 4).
inline ArgmaxConfig argmax_config(int64_t rows, int64_t width, int vec, int num_sms) {
  const int64_t nvec = ceil_div(width, vec);
  if (nvec <= int64_t{kWarp} * kVecsPerThread) {
    return {kWarp, kRowsPerWarpBlock, 1, static_cast<int>(width)};
  }
  const int64_t t = next_pow2(ceil_div(nvec, kVecsPerThread));
  const int threads = static_cast<int>(t > kMaxThreads ? kMaxThreads : t);
  int64_t cl = 1;
  while (cl < kMaxCluster && rows * cl < 2 * int64_t{num_sms} &&
         nvec >= int64_t{threads} * kMinClusterVecs * 2 * cl) {
    cl *= 2;
  }
  const int slice = cl == 1 ? static_cast<int>(width)
                            : static_cast<int>(ceil_div(ceil_div(width, cl), kSliceAlign) * kSliceAlign);
  return {threads, 1, static_cast<int>(cl), slice};
}

template <typename T, int VEC>
constexpr ArgmaxKernelFn argmax_kernel_for(bool cluster) {
  return cluster ? &argmax_kernel<T, VEC, true> : &argmax_kernel<T, VEC, false>;
}

template <typename T>
cudaError_t launch_argmax_typed(const ArgmaxParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool vec_ok =
      is_aligned(p.x, 16) && (p.rows <= 1 || (p.x_row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0);
  const ArgmaxConfig c = argmax_config(p.rows, p.width, vec_ok ? kVec : 1, sm_count(device));
  const ArgmaxKernelFn fn = vec_ok ? argmax_kernel_for<T, kVec>(c.cluster > 1) : argmax_kernel_for<T, 1>(c.cluster > 1);
  err = prepare_kernel(reinterpret_cast<const void*>(fn), device, 0, c.cluster);
  if (err != cudaSuccess) return err;

  ArgmaxArgs a{};
  a.x_stride = p.x_row_stride;
  a.width = static_cast<int>(p.width);
  a.slice = c.slice;
  const int64_t rows_per_block = c.rows_per_block;
  const int64_t rows_per_launch = topk_detail::kMaxBlocksPerLaunch / c.cluster * rows_per_block;
  for (int64_t done = 0; done < p.rows; done += rows_per_launch) {
    a.rows = p.rows - done < rows_per_launch ? p.rows - done : rows_per_launch;
    a.x = static_cast<const T*>(p.x) + done * p.x_row_stride;
    a.out = p.out + done;
    const int64_t blocks = ceil_div(a.rows, rows_per_block) * c.cluster;
    err = launch_clustered(fn, a, dim3(static_cast<unsigned>(blocks)),
                                        dim3(static_cast<unsigned>(c.threads), static_cast<unsigned>(c.rows_per_block)),
                                        0, c.cluster, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace argmax_detail

// Argmax of rows of T; see ArgmaxParams. Enqueues on `stream`; never throws or synchronises.
template <typename T>
cudaError_t launch_argmax(const ArgmaxParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  return argmax_detail::launch_argmax_typed<T>(p, stream);
}

// Kernels launch_argmax<T> can launch: 2 load widths x {CTA, cluster}.
template <typename T>
constexpr int argmax_num_kernels() {
  return 4;
}

}  // namespace fray
