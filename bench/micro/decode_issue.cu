// How long does a B = 1 decode CTA take to get its K/V tiles into shared memory? 128 CTAs (one per
// SM) each copy 4 tiles of 64 rows x 256 B of K and of V (128 KB, the 16-split B1 plan's share)
// into a 5-stage ring, all in flight at once, the data warm in L2 (16.8 MB, read over and over),
// timed inside the kernel with clock64 (thread 0: from entry to all copies issued, and to all
// landed). Loaders: the decode kernel's cp.async (16 B per thread and copy, swizzled rows), bulk
// copies of one 256-byte row each (one per thread and tile; rows padded to 272 B, which keeps
// ldmatrix conflict-free without a swizzle), and bulk copies of a whole 16 KB tile (contiguous
// caches only). Layouts: HND (a tile's rows contiguous) and paged NHD (rows 2 KB apart within
// 16-token pages, the pages shuffled). Prints per-CTA medians in ns at the nominal clock.
// Build + run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/di bench/micro/decode_issue.cu && /tmp/di
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "bench/micro/micro.h"
#include "cuda/common/bulk_copy.cuh"

using fray::mbar_arrive_expect_tx;
using fray::mbar_init;
using fray::mbar_init_fence;
using fray::mbar_wait;
using fray::smem_u32;

constexpr int kThreads = 128, kTile = 64, kRow = 256, kTiles = 4, kHkv = 8, kT = 4096, kSplits = 16, kP = 16;

// 16-byte cp.async (L2 only) and a bulk copy completing on `bar`, both with no cache hint.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// Source row `t` of kv head h: HND (h * T + t) * 256 B, or paged NHD ((page * P + t % P) * Hkv + h)
// * 256 B with page = the block-table entry of t (looked up before any copy is issued).
template <bool PAGED>
__device__ __forceinline__ const unsigned char* row_ptr(const unsigned char* base, int page, int h, int t) {
  if constexpr (PAGED) {
    return base + ((static_cast<int64_t>(page) * kP + t % kP) * kHkv + h) * kRow;
  } else {
    return base + (static_cast<int64_t>(h) * kT + t) * kRow;
  }
}

// MODE 0: cp.async 16 B; 1: bulk row copies (272-byte pitch); 2: bulk 16 KB tiles (HND only).
template <int MODE, bool PAGED>
__global__ void __launch_bounds__(kThreads, 1) load_tiles(const unsigned char* k, const unsigned char* v, const int* bt,
                                                          unsigned long long* cyc, uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bar;
  const int tid = threadIdx.x;
  const int h = blockIdx.x / kSplits, split = blockIdx.x % kSplits;
  const int t_start = split * kTiles * kTile;
  const long long c0 = clock64();
  constexpr int kPitch = MODE == 1 ? 272 : kRow;
  constexpr int kStage = kTile * kPitch;  // one of K, V
  if (MODE != 0) {
    if (tid == 0) {
      mbar_init(&bar, 1);
      mbar_init_fence();
    }
    __syncthreads();
    if (tid == 0) mbar_arrive_expect_tx(&bar, kTiles * 2 * kTile * kRow);
    __syncthreads();
  }
  // paged: this thread's rows' page ids, all requested before the first copy
  int pg[kTiles][8];
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int r = MODE == 0 ? tid / 16 + 8 * j : tid % 64;
      pg[tile][j] = PAGED && (MODE == 0 || j == 0) ? __ldg(bt + (t_start + tile * kTile + r) / kP) : 0;
    }
  }
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    unsigned char* ks = smem + tile * 2 * kStage;
    unsigned char* vs = ks + kStage;
    const int t0 = t_start + tile * kTile;
    if constexpr (MODE == 0) {
      const int chunk = tid % 16, r0 = tid / 16;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int r = r0 + 8 * j;
        const int off = r * kRow + ((chunk ^ (r & 7)) << 4);
        cp_async_16(ks + off, row_ptr<PAGED>(k, pg[tile][j], h, t0 + r) + chunk * 16);
        cp_async_16(vs + off, row_ptr<PAGED>(v, pg[tile][j], h, t0 + r) + chunk * 16);
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    } else if constexpr (MODE == 1) {
      const int r = tid % 64;
      const unsigned char* src = row_ptr<PAGED>(tid < 64 ? k : v, pg[tile][0], h, t0 + r);
      bulk_copy((tid < 64 ? ks : vs) + r * kPitch, src, kRow, &bar);
    } else {
      if (tid == 0) {
        bulk_copy(ks, row_ptr<false>(k, 0, h, t0), kTile * kRow, &bar);
        bulk_copy(vs, row_ptr<false>(v, 0, h, t0), kTile * kRow, &bar);
      }
    }
  }
  const long long c1 = clock64();
  if constexpr (MODE == 0) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  } else {
    mbar_wait(&bar, 0);
  }
  __syncthreads();
  const long long c2 = clock64();
  if (tid == 0) {
    cyc[blockIdx.x * 2] = c1 - c0;
    cyc[blockIdx.x * 2 + 1] = c2 - c0;
  }
  if (smem[tid * 97] == 0x5a && smem[tid * 13 + 5] == 0xa5) sink[0] = 1;  // keeps the copies live
}

int main() {
  const size_t bytes = size_t(kHkv) * kT * kRow;
  unsigned char *k, *v, *kp, *vp;
  int* bt;
  unsigned long long* cyc;
  uint32_t* sink;
  CK(cudaMalloc(&k, bytes));
  CK(cudaMalloc(&v, bytes));
  CK(cudaMalloc(&kp, bytes));
  CK(cudaMalloc(&vp, bytes));
  CK(cudaMalloc(&bt, kT / kP * 4));
  CK(cudaMalloc(&cyc, 128 * 2 * 8));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(k, 1, bytes));
  CK(cudaMemset(v, 2, bytes));
  CK(cudaMemset(kp, 1, bytes));
  CK(cudaMemset(vp, 2, bytes));
  std::vector<int> perm(kT / kP);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(16));
  CK(cudaMemcpy(bt, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  auto run = [&](const char* name, auto kernel, bool paged, int smem) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    std::vector<double> issued, landed;
    for (int r = 0; r < 50; ++r) {
      kernel<<<kHkv * kSplits, kThreads, smem>>>(paged ? kp : k, paged ? vp : v, bt, cyc, sink);
      CK(cudaGetLastError());
      if (r < 10) continue;  // warm-up: the data settles in L2
      std::vector<unsigned long long> h(256);
      CK(cudaMemcpy(h.data(), cyc, 256 * 8, cudaMemcpyDeviceToHost));
      for (int c = 0; c < 128; ++c) {
        issued.push_back(h[2 * c] * 1e6 / khz);
        landed.push_back(h[2 * c + 1] * 1e6 / khz);
      }
    }
    std::sort(issued.begin(), issued.end());
    std::sort(landed.begin(), landed.end());
    const size_t n = issued.size();
    printf("%-40s issued: median %6.0f ns   landed: p10 %6.0f  median %6.0f  p90 %6.0f ns\n", name, issued[n / 2],
           landed[n / 10], landed[n / 2], landed[n * 9 / 10]);
  };
  for (int round = 0; round < 2; ++round) {
    run("HND, cp.async 16 B", load_tiles<0, false>, false, kTiles * 2 * kTile * kRow);
    run("HND, bulk rows (272 B pitch)", load_tiles<1, false>, false, kTiles * 2 * kTile * 272);
    run("HND, bulk 16 KB tiles", load_tiles<2, false>, false, kTiles * 2 * kTile * kRow);
    run("paged NHD P16, cp.async 16 B", load_tiles<0, true>, true, kTiles * 2 * kTile * kRow);
    run("paged NHD P16, bulk rows (272 B pitch)", load_tiles<1, true>, true, kTiles * 2 * kTile * 272);
  }
  return 0;
}
