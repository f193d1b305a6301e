// Fray softmax family: row softmax / online softmax kernels and launcher templates.
// Torch-free: raw pointers, sizes and a stream. See README.md for the design.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/dtype.h"
#include "cuda/common/bulk_copy.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/softmax/softmax.h"

namespace fray {
namespace softmax_detail {

constexpr int kMaxElems = 32;           // fp32 values a thread keeps in registers (vector rows)
constexpr int kScalarMaxItems = 4;      // elements a thread keeps for scalar (VEC = 1) rows
constexpr int kMinItems = 2;            // >= 32 B of loads in flight per thread on vector rows
constexpr int kSmallBlockThreads = 256; // block size used to pack short and medium rows
constexpr int kRowThreads = 512;        // largest block of the register kernels: 2 per SM
constexpr int kPortableCluster = 8;     // larger clusters need the non-portable opt-in
constexpr int kMaxCluster = 16;         // sm_90 limit
constexpr int kStreamThreads = 512;     // block (= one row) of the streaming kernel
constexpr int kStreamItems = 4;         // vectors in flight per thread, streaming kernel
constexpr int64_t kMaxBlocksPerLaunch = int64_t{1} << 30;  // keeps grid.x < 2^31 - 1
// Shared-memory kernel (wide vector rows; vectors are always 16 bytes there).
constexpr int kSmemThreads = 256;                               // block size
constexpr int kSmemUnroll = 4;                                  // 16-byte vectors per thread per chunk
constexpr int kSmemChunkVecs = kSmemThreads * kSmemUnroll;      // 16 KB: one bulk copy, one mbarrier
constexpr int kSmemMaxChunks = 14;                              // 224 KB slice (227 KB opt-in limit)
constexpr int64_t kSmemMaxVecs = int64_t{kSmemMaxChunks} * kSmemChunkVecs;
constexpr int64_t kSmemTargetVecs = 4096;                       // 64 KB slice: 3 blocks per SM
constexpr int kSmemMinBlocks = 4;                               // 64 registers a thread
constexpr double kLog2e = 1.4426950408889634;

// Kernel arguments (passed by value in the param space). Strides in elements.
struct KernelArgs {
  const void* x;
  void* y;
  float* row_max;  // nullptr: no statistics (then row_lse is nullptr too)
  float* row_lse;
  int64_t x_stride;
  int64_t y_stride;
  int64_t rows;
  int64_t nv;             // vectors per row = cols / VEC
  float scale;            // log2(e) / temperature: exp(z / T) = exp2(z * scale)
  float inv_temperature;  // 1 / temperature (statistics are of x / T)
  int64_t slice;          // shared-memory kernels: vectors per block (the last block may hold fewer)
};

constexpr int max_items(int vec) { return vec > 1 ? kMaxElems / vec : kScalarMaxItems; }

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }
__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fffffff); }

// 2^x as one MUFU.EX2 (relative error ~2^-22, far inside fp32's 1e-5 budget); 2^-inf = 0,
// NaN stays NaN, results below 2^-126 flush to 0 (they are below every output's atol).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Running softmax state of a set of elements: m = their max, s = sum of
// exp2((x - shift_of(m)) * scale). The shift is the max, or 0 while the max is
// -inf (only -inf elements so far): exp2(-inf - 0) = 0 where exp2(-inf + inf)
// would be NaN, so an all -inf row ends with s = 0 and lse = -inf. Every max
// here is fmax_nan: a NaN element makes m NaN, so the row's outputs, row_max
// and row_lse are NaN (as torch.max and the reference; fmaxf skipped it).
__device__ __forceinline__ float shift_of(float m) { return m == neg_inf() ? 0.0f : m; }

// Merges the states of aligned groups of `width` lanes (power of two <= 32);
// every lane gets its group's state. A state is rescaled to the group max
// before summing: m <= g, so the factor is <= 1 (no overflow); m = -inf gives 0.
__device__ __forceinline__ void warp_merge(float& m, float& s, float scale, int width) {
  const float g = warp_max_nan(m, width);
  s = warp_sum(s * fast_exp2((m - shift_of(g)) * scale), width);
  m = g;
}

// Merges the states of a row group: blockDim.x = tpr threads per row, rows of
// the block along threadIdx.y. tpr <= 32: width-limited shuffles, no barrier.
// Otherwise tpr is a multiple of 32 and the per-warp states meet in shared
// memory (one __syncthreads; tpr is block-uniform, so every thread reaches it).
__device__ __forceinline__ void group_merge(float& m, float& s, float scale, int tpr, float* red_m,
                                            float* red_s) {
  if (tpr <= kWarpSize) {
    warp_merge(m, s, scale, tpr);
    return;
  }
  warp_merge(m, s, scale, kWarpSize);
  const int tid = static_cast<int>(threadIdx.x + blockDim.x * threadIdx.y);
  const int lane = tid % kWarpSize;
  if (lane == 0) {
    red_m[tid / kWarpSize] = m;
    red_s[tid / kWarpSize] = s;
  }
  __syncthreads();
  const int wpg = tpr / kWarpSize;
  const int first = static_cast<int>(threadIdx.y) * wpg;
  m = lane < wpg ? red_m[first + lane] : neg_inf();
  s = lane < wpg ? red_s[first + lane] : 0.0f;
  warp_merge(m, s, scale, kWarpSize);
}

// Merges the block states of a cluster through distributed shared memory:
// each block publishes its state in `slot`, the cluster barrier makes the
// slots visible (and guarantees every block has started), then lane r of every
// warp reads block r's slot and the warp merges them. Ends with the arrive half
// of a second cluster barrier; the caller waits on it (cluster_done) just
// before exiting, so that no block's shared memory disappears while another
// block may still read it; the row's stores happen in between.
__device__ __forceinline__ void cluster_merge(float& m, float& s, float scale, float2* slot) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) *slot = make_float2(m, s);
  cluster.sync();
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  float2 p = make_float2(neg_inf(), 0.0f);
  if (lane < static_cast<int>(cluster.num_blocks())) p = *cluster.map_shared_rank(slot, lane);
  m = p.x;
  s = p.y;
  warp_merge(m, s, scale, kWarpSize);
  cluster.barrier_arrive();
}

__device__ __forceinline__ void cluster_done() { cooperative_groups::this_cluster().barrier_wait(); }

// A vector of -inf: masked-off items then take part in the max and the sum
// without a branch (exp2(-inf) = 0), and every register is defined on every
// path (predicated partial definitions make ptxas spill).
template <typename T, int N>
__device__ __forceinline__ void fill_neg_inf(AlignedVec<T, N>& v) {
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = from_float<T>(neg_inf());
}

// Folds U loaded vectors into the running state (m, s): one max over the items, one rescale of
// s to the new shift, then the items' terms. Masked-off items hold -inf (fill_neg_inf).
template <int U, typename T, int VEC>
__device__ __forceinline__ void online_update(float& m, float& s, const AlignedVec<T, VEC> (&v)[U], float scale) {
  float f[U][VEC];
  float cm = neg_inf();
#pragma unroll
  for (int u = 0; u < U; ++u) {
    vec_to_float(v[u], f[u]);
#pragma unroll
    for (int k = 0; k < VEC; ++k) cm = fmax_nan(cm, f[u][k]);
  }
  const float nm = fmax_nan(m, cm);
  const float sh = shift_of(nm);
  s *= fast_exp2((m - sh) * scale);  // m <= nm: factor <= 1; m = -inf: s was 0
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) s += fast_exp2((f[u][k] - sh) * scale);
  }
  m = nm;
}

// Writes the row statistics of x / T (one thread per row).
__device__ __forceinline__ void write_stats(const KernelArgs& a, int64_t row, float m, float s) {
  const float mt = m * a.inv_temperature;
  a.row_max[row] = mt;
  a.row_lse[row] = mt + logf(s);  // all -inf row: -inf + log(0) = -inf
}

// ---------------------------------------------------------------------------
// Launch bounds of the register kernel. The max-item kernel of a vector width
// also serves whole rows of up to 512 threads and cluster slices; 2 x 512
// threads per SM give it 64 registers for its 32 fp32 values. Smaller-item
// kernels run <= 256-thread blocks with tighter caps, for occupancy.
// ---------------------------------------------------------------------------
constexpr int reg_max_threads(int vec, int items) {
  return items == max_items(vec) ? kRowThreads : kSmallBlockThreads;
}
constexpr int reg_min_blocks(int vec, int items) {
  return items == max_items(vec) ? 2 : vec * items >= 8 ? 6 : 8;
}

// ---------------------------------------------------------------------------
// Register kernel: the row is read once and kept on chip.
//
// CLUSTER == false: a group of blockDim.x = tpr threads per row, blockDim.y rows
// per block. CLUSTER == true: a cluster of n blocks (blockDim.y == 1) per row;
// the row's group is all n * tpr threads of the cluster, block r holding group
// threads r * tpr ... Group thread g holds vectors g, g + G, ..., g + (ITEMS-1)*G
// of its row (G = group size) as fp32 exponentials in registers.
//
// Each thread exponentiates its elements against its own max (one exp2 per
// element), the (max, sum) states are merged once per row (shuffles, one
// block barrier, and for clusters one DSMEM exchange), and every thread then
// rescales its values by exp2(own max - row max) / row sum and stores them.
//
// Aliasing: y may alias x; each element is read and later written by the same
// thread, so there is no __restrict__ and x is read with coherent loads.
// ---------------------------------------------------------------------------
template <typename TI, typename TO, int VEC, int ITEMS, bool CLUSTER>
__global__ void __launch_bounds__(reg_max_threads(VEC, ITEMS), reg_min_blocks(VEC, ITEMS))
    softmax_reg_kernel(const KernelArgs a) {
  static_assert(ITEMS <= max_items(VEC), "softmax_reg_kernel: too many items");
  using VI = AlignedVec<TI, VEC>;
  using VO = AlignedVec<TO, VEC>;
  __shared__ float red_m[kWarpSize];
  __shared__ float red_s[kWarpSize];

  const int tpr = static_cast<int>(blockDim.x);
  int64_t row;
  int g;      // thread index inside the row's group
  int group;  // threads per row
  if constexpr (CLUSTER) {
    const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int n = static_cast<int>(cluster.num_blocks());
    row = blockIdx.x / n;
    g = static_cast<int>(cluster.block_rank()) * tpr + static_cast<int>(threadIdx.x);
    group = n * tpr;
  } else {
    row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
    g = static_cast<int>(threadIdx.x);
    group = tpr;
  }
  const int nv = static_cast<int>(a.nv);
  const int step = group * VEC;  // elements between a thread's consecutive items
  // Items of this thread inside the row: item i is valid iff i < n_ok (one
  // integer instead of ITEMS predicates kept live).
  const int my_items = g < nv ? min(ITEMS, (nv - g + group - 1) / group) : 0;
  const int n_ok = row < a.rows ? my_items : 0;

  // Phase 1: issue every load of the row, then the thread's own max.
  const TI* xp = static_cast<const TI*>(a.x) + row * a.x_stride + g * VEC;
  VI v[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (i < n_ok) {
      load_vec(v[i], xp + i * step);
    } else {
      fill_neg_inf(v[i]);
    }
  }
  float f[ITEMS][VEC];
  float m = neg_inf();
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    vec_to_float(v[i], f[i]);
#pragma unroll
    for (int k = 0; k < VEC; ++k) m = fmax_nan(m, f[i][k]);
  }

  // Phase 2: exponentials against the own max, kept in registers; own sum.
  const float m_own = m;
  const float sh = shift_of(m);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      f[i][k] = fast_exp2((f[i][k] - sh) * a.scale);
      s += f[i][k];
    }
  }

  // Phase 3: the row's (max, sum).
  group_merge(m, s, a.scale, tpr, red_m, red_s);
  if constexpr (CLUSTER) {
    __shared__ float2 slot;
    cluster_merge(m, s, a.scale, &slot);
  }

  // Phase 4: rescale and store. An all -inf row (m = -inf) gives NaN like
  // torch; a thread whose elements are all -inf gets factor 0 (m_own = -inf),
  // never exp2(+large) * 0.
  const float inv = m == neg_inf() ? quiet_nan() : 1.0f / s;
  const float factor = fast_exp2((m_own - shift_of(m)) * a.scale) * inv;
  TO* yp = static_cast<TO*>(a.y) + row * a.y_stride + g * VEC;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (i < n_ok) {
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = f[i][k] * factor;
      VO out;
      vec_from_float(out, o);
      store_vec(yp + i * step, out);
    }
  }
  if (a.row_max != nullptr && g == 0 && row < a.rows) write_stats(a, row, m, s);
  if constexpr (CLUSTER) cluster_done();
}

// ---------------------------------------------------------------------------
// Streaming kernel for rows that do not fit on chip (and scalar rows wider
// than a cluster holds): one 512-thread block per row. Pass 1 reads the row
// once and keeps an online (max, sum) per thread, rescaling the sum once per
// chunk of kStreamItems vectors when the max grows; pass 2 re-reads the row
// (its own elements, mostly L2 hits) and writes y. Each thread touches the
// same elements in both passes, so y may alias x.
// ---------------------------------------------------------------------------
template <typename TI, typename TO, int VEC>
__global__ void __launch_bounds__(kStreamThreads, 2) softmax_stream_kernel(const KernelArgs a) {
  using VI = AlignedVec<TI, VEC>;
  using VO = AlignedVec<TO, VEC>;
  constexpr int U = kStreamItems;
  __shared__ float red_m[kWarpSize];
  __shared__ float red_s[kWarpSize];

  const int64_t row = blockIdx.x;  // one row per block (the host splits launches)
  const int64_t nv = a.nv;
  const int64_t tpr = blockDim.x;
  const int64_t step = tpr * VEC;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * VEC;
  const TI* xp = static_cast<const TI*>(a.x) + row * a.x_stride + first;

  // Pass 1: online (max, sum).
  float m = neg_inf();
  float s = 0.0f;
  for (int64_t vi = threadIdx.x, off = 0; vi < nv; vi += U * tpr, off += U * step) {
    VI v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (vi + u * tpr < nv) {
        load_vec(v[u], xp + off + u * step);
      } else {
        fill_neg_inf(v[u]);
      }
    }
    online_update<U>(m, s, v, a.scale);
  }
  group_merge(m, s, a.scale, static_cast<int>(tpr), red_m, red_s);

  // Pass 2: re-read and write y = exp2((x - max) * scale) / sum.
  const float inv = m == neg_inf() ? quiet_nan() : 1.0f / s;
  const float sh = shift_of(m);
  TO* yp = static_cast<TO*>(a.y) + row * a.y_stride + first;
  for (int64_t vi = threadIdx.x, off = 0; vi < nv; vi += U * tpr, off += U * step) {
    VI v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (vi + u * tpr < nv) load_vec(v[u], xp + off + u * step);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (vi + u * tpr < nv) {
        float f[VEC];
        vec_to_float(v[u], f);
#pragma unroll
        for (int k = 0; k < VEC; ++k) f[k] = fast_exp2((f[k] - sh) * a.scale) * inv;
        VO out;
        vec_from_float(out, f);
        store_vec(yp + off + u * step, out);
      }
    }
  }
  if (a.row_max != nullptr && threadIdx.x == 0) write_stats(a, row, m, s);
}

// ---------------------------------------------------------------------------
// Shared-memory kernel for wide vector rows: x is read from HBM once, into
// shared memory, and y is written from there. Block r of a row (cluster of n
// blocks, or n = 1) holds vectors [r * slice, (r + 1) * slice) of the row.
//
// Register rows stop at 512 threads x 32 values; beyond that the register
// cluster path held half a 32768-wide bf16 row per 512-thread block, 2 blocks
// per SM, and each block loaded, reduced, merged across the cluster and stored
// in turn (2.82 TB/s at 4096x32768). Here one thread issues the whole slice as
// 16 KB bulk copies, each completing on its own mbarrier, so the whole slice
// (64 KB) is in flight at once and the (max, sum) pass starts on the first
// chunk while the rest land; 64 KB slices leave room for 3 blocks per SM, so
// one block's loads overlap the others' reductions and stores.
//
// Pass 1: online (max, sum) over the thread's vectors of each chunk, one
// rescale per chunk (as the streaming kernel). The states meet in the block
// (group_merge) and the cluster (cluster_merge). Pass 2 re-reads shared memory
// (~8x HBM's bandwidth per SM) and stores y = exp2((x - max) * scale) / sum.
//
// Aliasing: y may alias x; a block reads all of its slice (every thread waits
// on every chunk) before any of its stores, and writes only its slice.
// ---------------------------------------------------------------------------
template <typename TI, typename TO, bool CLUSTER>
__global__ void __launch_bounds__(kSmemThreads, kSmemMinBlocks) softmax_smem_kernel(const KernelArgs a) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(TI));
  constexpr int U = kSmemUnroll;
  constexpr int T = kSmemThreads;
  using VI = AlignedVec<TI, VEC>;
  using VO = AlignedVec<TO, VEC>;
  static_assert(sizeof(VI) == 16, "softmax_smem_kernel: 16-byte vectors only");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bar[kSmemMaxChunks];
  __shared__ float red_m[kWarpSize];
  __shared__ float red_s[kWarpSize];
  const VI* sx = reinterpret_cast<const VI*>(smem_raw);

  int rank = 0;
  int n = 1;
  if constexpr (CLUSTER) {
    const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    rank = static_cast<int>(cluster.block_rank());
    n = static_cast<int>(cluster.num_blocks());
  }
  const int64_t row = blockIdx.x / n;
  const int tid = static_cast<int>(threadIdx.x);
  const int slice = static_cast<int>(a.slice);
  const int first = rank * slice;
  const int count = max(0, min(slice, static_cast<int>(a.nv) - first));
  const int chunks = (count + kSmemChunkVecs - 1) / kSmemChunkVecs;
  const int64_t offset = static_cast<int64_t>(first) * VEC;

  if (tid == 0) bulk_load_chunks(smem_raw, static_cast<const TI*>(a.x) + row * a.x_stride + offset, count, kSmemChunkVecs, bar);
  __syncthreads();  // the barriers are initialised before anyone waits on them

  // Pass 1: each barrier completes its first phase (parity 0) once.
  float m = neg_inf();
  float s = 0.0f;
  for (int k = 0; k < chunks; ++k) {
    mbar_wait(&bar[k], 0);
    VI v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = k * kSmemChunkVecs + u * T + tid;
      if (j < count) {
        v[u] = sx[j];
      } else {
        fill_neg_inf(v[u]);
      }
    }
    online_update<U>(m, s, v, a.scale);
  }
  group_merge(m, s, a.scale, T, red_m, red_s);
  if constexpr (CLUSTER) {
    __shared__ float2 slot;
    cluster_merge(m, s, a.scale, &slot);
  }

  // Pass 2: all -inf row: m = -inf, exp2(x * scale) = 0 times NaN gives NaN (torch).
  const float inv = m == neg_inf() ? quiet_nan() : 1.0f / s;
  const float sh = shift_of(m);
  TO* ys = static_cast<TO*>(a.y) + row * a.y_stride + offset;
  for (int base = tid; base < count; base += kSmemChunkVecs) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = base + u * T;
      if (j < count) {
        float f[VEC];
        vec_to_float(sx[j], f);
#pragma unroll
        for (int e = 0; e < VEC; ++e) f[e] = fast_exp2((f[e] - sh) * a.scale) * inv;
        VO out;
        vec_from_float(out, f);
        store_vec_asm(ys + static_cast<int64_t>(j) * VEC, out);
      }
    }
  }
  if (a.row_max != nullptr && rank == 0 && tid == 0) write_stats(a, row, m, s);
  if constexpr (CLUSTER) cluster_done();
}

// ---------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------
using KernelFn = void (*)(KernelArgs);

// Slots: register kernel with 1, 2, 4, 8 items, register cluster kernel (scalar
// rows), streaming kernel, shared-memory kernel (vector rows) alone and in clusters.
constexpr int kNumSlots = 8;
constexpr int kClusterSlot = 4;
constexpr int kStreamSlot = 5;
constexpr int kSmemSlot = 6;
constexpr int kSmemClusterSlot = 7;

template <typename TI, typename TO, int VEC, int ITEMS>
constexpr KernelFn reg_kernel() {
  if constexpr (ITEMS <= max_items(VEC)) {
    return &softmax_reg_kernel<TI, TO, VEC, ITEMS, false>;
  } else {
    return nullptr;
  }
}

// Wide rows: vector rows take the shared-memory kernel, scalar rows (no bulk
// copies: unaligned) the register cluster kernel.
template <typename TI, typename TO, int VEC>
constexpr KernelFn reg_cluster_kernel() {
  if constexpr (VEC == 1) {
    return &softmax_reg_kernel<TI, TO, VEC, max_items(VEC), true>;
  } else {
    return nullptr;
  }
}

template <typename TI, typename TO, int VEC, bool CLUSTER>
constexpr KernelFn smem_kernel() {
  if constexpr (VEC > 1) {
    return &softmax_smem_kernel<TI, TO, CLUSTER>;
  } else {
    return nullptr;
  }
}

// All kernels of one (TI, TO, VEC) combination, indexed by kernel_slot(). This
// table is the only place kernels are instantiated, so its non-null entries are
// exactly the compiled kernels (see softmax_num_kernels).
template <typename TI, typename TO, int VEC>
struct KernelSet {
  static constexpr KernelFn kKernels[kNumSlots] = {
      reg_kernel<TI, TO, VEC, 1>(),
      reg_kernel<TI, TO, VEC, 2>(),
      reg_kernel<TI, TO, VEC, 4>(),
      reg_kernel<TI, TO, VEC, 8>(),
      reg_cluster_kernel<TI, TO, VEC>(),
      &softmax_stream_kernel<TI, TO, VEC>,
      smem_kernel<TI, TO, VEC, false>(),
      smem_kernel<TI, TO, VEC, true>(),
  };
  static constexpr int count() {
    int n = 0;
    for (const KernelFn k : kKernels) n += k != nullptr ? 1 : 0;
    return n;
  }
};

// slice > 0 selects the shared-memory kernel (items == 0, one row per block or
// cluster); otherwise items == 0 selects the streaming kernel and cluster > 1
// the register cluster kernel (items == max_items(vec) then).
struct LaunchConfig {
  int items;      // vectors per thread held in registers
  int tpr;        // threads per row and block (blockDim.x)
  int rpb;        // rows per block (blockDim.y)
  int cluster;    // blocks per row (cluster size)
  int64_t slice;  // shared-memory kernel: 16-byte vectors per block
};

constexpr int kernel_slot(const LaunchConfig& c) {
  return c.slice > 0 ? (c.cluster > 1 ? kSmemClusterSlot : kSmemSlot)
         : c.items == 0 ? kStreamSlot
         : c.cluster > 1 ? kClusterSlot
         : c.items == 1 ? 0
         : c.items == 2 ? 1
         : c.items == 4 ? 2
                        : 3;
}

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int next_pow2(int64_t n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

constexpr int round_up_warp(int64_t n) { return static_cast<int>(ceil_div(n, kWarpSize) * kWarpSize); }

// The config table: a function of nv = vectors per row and of the vector
// width (16 / sizeof(x) elements, or 1 for rows that cannot be vectorised).
//   tiny rows:   sub-warp groups (width-limited shuffles, no smem), 256-thread blocks.
//   medium rows: fewest items (from 2) that keep the group <= 256 threads.
//   long rows:   max items, one block of up to 512 threads per row.
//   wider vector rows: the shared-memory kernel, the smallest cluster (1, 2, 4
//                or 8 blocks) whose slices are <= 64 KB, else 8 blocks with
//                slices up to 224 KB (fewer blocks per SM).
//   wider scalar rows: a cluster of 2..16 blocks of up to 512 threads per row,
//                the row split across their registers (read once).
//   beyond:      the streaming kernel (two reads).
constexpr LaunchConfig softmax_config(int64_t nv, int vec) {
  const int max_it = max_items(vec);
  if (nv <= static_cast<int64_t>(kWarpSize) * kMinItems) {
    const int items = nv >= kMinItems ? kMinItems : 1;
    const int tpr = next_pow2(ceil_div(nv, items));
    return {items, tpr, kSmallBlockThreads / tpr, 1, 0};
  }
  for (int items = kMinItems; items <= max_it; items *= 2) {
    const int64_t groups = ceil_div(nv, items);
    if (groups <= kSmallBlockThreads) {
      const int tpr = round_up_warp(groups);
      return {items, tpr, tpr <= kSmallBlockThreads / 2 ? kSmallBlockThreads / tpr : 1, 1, 0};
    }
  }
  if (nv <= static_cast<int64_t>(kRowThreads) * max_it) return {max_it, round_up_warp(ceil_div(nv, max_it)), 1, 1, 0};
  if (vec > 1) {
    for (int c = 1; c <= kPortableCluster; c *= 2) {
      if (ceil_div(nv, c) <= kSmemTargetVecs) return {0, kSmemThreads, 1, c, ceil_div(nv, c)};
    }
    const int64_t slice = ceil_div(nv, kPortableCluster);
    if (slice <= kSmemMaxVecs) return {0, kSmemThreads, 1, kPortableCluster, slice};
  } else {
    for (int c = 2; c <= kMaxCluster; c *= 2) {
      const int64_t per_block = ceil_div(nv, static_cast<int64_t>(c) * max_it);
      if (per_block <= kRowThreads) return {max_it, round_up_warp(per_block), 1, c, 0};
    }
  }
  return {0, kStreamThreads, 1, 1, 0};
}

// Compile-time check of the table: every config fits its kernel's launch
// bounds, covers the row, uses whole warps (full-mask shuffles) or a power-of-
// two sub-warp group, and names a compiled kernel.
constexpr bool softmax_config_table_ok() {
  const int vecs[3] = {1, 4, 8};
  for (const int vec : vecs) {
    for (int64_t nv = 1; nv <= 20 * 8 * 1024; nv += (nv < 4096 ? 1 : 97)) {
      const LaunchConfig c = softmax_config(nv, vec);
      const int threads = c.tpr * c.rpb;
      if (c.slice > 0) {  // shared-memory kernel: 16-byte vectors, portable clusters
        if (vec == 1 || c.items != 0 || c.tpr != kSmemThreads || c.rpb != 1) return false;
        if (c.cluster > kPortableCluster || (c.cluster & (c.cluster - 1)) != 0) return false;
        if (c.slice > kSmemMaxVecs || c.slice * c.cluster < nv) return false;
        continue;
      }
      if (c.items == 0) {
        if (c.tpr != kStreamThreads || c.rpb != 1 || c.cluster != 1) return false;
        continue;
      }
      if (c.items > max_items(vec) || (c.items & (c.items - 1)) != 0) return false;
      if (threads > reg_max_threads(vec, c.items) || threads % kWarpSize != 0) return false;
      if (c.tpr < kWarpSize ? (c.tpr & (c.tpr - 1)) != 0 : c.tpr % kWarpSize != 0) return false;
      if (static_cast<int64_t>(c.items) * c.tpr * c.cluster < nv) return false;
      if (c.cluster > 1 && (vec != 1 || c.rpb != 1 || c.items != max_items(vec) || c.cluster > kMaxCluster)) {
        return false;
      }
    }
  }
  return true;
}
static_assert(softmax_config_table_ok(), "softmax config table violates a kernel constraint");

template <typename TI, typename TO, int VEC>
cudaError_t launch_kernel(const KernelArgs& a, const LaunchConfig& c, cudaStream_t stream) {
  const KernelFn fn = KernelSet<TI, TO, VEC>::kKernels[kernel_slot(c)];
  if (fn == nullptr) return cudaErrorInvalidDeviceFunction;  // excluded by softmax_config_table_ok
  // Shared-memory kernel: the slice is dynamic shared memory. The limit is set to the largest
  // slice (not this launch's) and the carveout asks for all of L1 as shared memory, so that 3
  // blocks of 64 KB fit an SM; clusters above 8 CTAs need the non-portable size (set once per
  // kernel and device: prepare_kernel).
  const size_t smem = static_cast<size_t>(c.slice) * 16;
  if (c.slice > 0 || c.cluster > kPortableCluster) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
      err = prepare_kernel(reinterpret_cast<const void*>(fn), device, c.slice > 0 ? kSmemMaxVecs * 16 : 0, c.cluster,
                           c.slice > 0);
    }
    if (err != cudaSuccess) return err;
  }
  const dim3 block(static_cast<unsigned>(c.tpr), static_cast<unsigned>(c.rpb));
  // Kernels handle one row group (block or cluster) per block index; more rows
  // than one grid holds are split into several launches on the same stream.
  const int64_t rows_per_launch = kMaxBlocksPerLaunch / c.cluster * c.rpb;
  for (int64_t done = 0; done < a.rows; done += rows_per_launch) {
    KernelArgs part = a;
    part.rows = a.rows - done < rows_per_launch ? a.rows - done : rows_per_launch;
    part.x = static_cast<const TI*>(a.x) + done * a.x_stride;
    part.y = static_cast<TO*>(a.y) + done * a.y_stride;
    if (a.row_max != nullptr) {
      part.row_max = a.row_max + done;
      part.row_lse = a.row_lse + done;
    }
    const dim3 grid(static_cast<unsigned>(c.cluster > 1 ? part.rows * c.cluster : ceil_div(part.rows, c.rpb)));
    const cudaError_t err = launch_clustered(fn, part, grid, block, smem, c.cluster, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename TI, typename TO>
cudaError_t launch_typed(const SoftmaxParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(TI));
  constexpr unsigned kOutAlign = kVec * sizeof(TO) < 16 ? kVec * sizeof(TO) : 16;

  // Vector path: x 16-byte aligned, y aligned to its vector (<= 16 bytes), cols
  // and every used row stride a multiple of VEC = 16 / sizeof(x).
  bool vec_ok = p.cols % kVec == 0 && is_aligned(p.x, 16) && is_aligned(p.y, kOutAlign);
  if (p.rows > 1) vec_ok = vec_ok && p.x_row_stride % kVec == 0 && p.y_row_stride % kVec == 0;
  const int vec = vec_ok ? kVec : 1;

  KernelArgs a{};
  a.x = p.x;
  a.y = p.y;
  a.row_max = p.row_max;
  a.row_lse = p.row_max != nullptr ? p.row_lse : nullptr;
  a.x_stride = p.x_row_stride;
  a.y_stride = p.y_row_stride;
  a.rows = p.rows;
  a.nv = p.cols / vec;
  a.scale = static_cast<float>(kLog2e / p.temperature);
  a.inv_temperature = static_cast<float>(1.0 / p.temperature);
  const LaunchConfig c = softmax_config(a.nv, vec);
  a.slice = c.slice;
  return vec_ok ? launch_kernel<TI, TO, kVec>(a, c, stream) : launch_kernel<TI, TO, 1>(a, c, stream);
}

template <typename TI, typename TO>
constexpr int count_kernels() {
  constexpr int kVec = 16 / static_cast<int>(sizeof(TI));
  return KernelSet<TI, TO, kVec>::count() + KernelSet<TI, TO, 1>::count();
}

}  // namespace softmax_detail

// Softmax of x (element type TI) into y (element type TO); see SoftmaxParams.
// Enqueues on `stream`; returns the launch status. Never throws, never synchronises.
template <typename TI>
cudaError_t launch_softmax(const SoftmaxParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.cols <= 0) return cudaSuccess;
  return dispatch_dtype(p.y_dtype, [&](auto tag) {
    using TO = typename decltype(tag)::type;
    return softmax_detail::launch_typed<TI, TO>(p, stream);
  });
}

// Number of kernels launch_softmax<TI> can launch (all compiled with it).
template <typename TI>
int softmax_num_kernels() {
  using namespace softmax_detail;
  return count_kernels<TI, float>() + count_kernels<TI, __half>() + count_kernels<TI, __nv_bfloat16>();
}

}  // namespace fray
