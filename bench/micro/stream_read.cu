// Decode-attention loader ceiling: how fast can 128-thread CTAs stream [tokens, 128] bf16 K and V
// tiles (64 tokens = 16 KB each) from HBM into shared memory, with no attention math?
// Variants: the kernel's cp.async ring (16-byte copies, swizzled rows) with S stages, and a
// bulk-copy ring (cp.async.bulk, one 16 KB copy per tile and tensor, mbarrier completion).
// Shapes: B32 Hkv8 T4096 (256 CTAs x 4096 tokens) and B64 Hkv8 T8192 split in 2 (1024 CTAs x 4096).
// With an argument (`/tmp/sr flush`): a few loaders, with and without the evict-first L2 policy,
// after a write flush (the benchmarks' do_bench: 256 MB written, the L2 full of dirty lines), a
// read flush (clean lines) and none.
// Build + run on the GPU machine:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/sr bench/micro/stream_read.cu && /tmp/sr [flush]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench/micro/micro.h"


constexpr int kThreads = 128;
constexpr int kTile = 64;
constexpr int kRowBytes = 256;
constexpr int kStageBytes = kTile * kRowBytes;  // one of K, V

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ int swz(int row, int chunk) { return row * kRowBytes + ((chunk ^ (row & 7)) << 4); }

// Light consumption: each thread xors 2 x 16 B of K and V of the stage (keeps the copies live).
__device__ __forceinline__ uint32_t consume(const unsigned char* st, int tid) {
  const uint4 a = *reinterpret_cast<const uint4*>(st + tid * 16);
  const uint4 c = *reinterpret_cast<const uint4*>(st + kStageBytes + tid * 16);
  return a.x ^ a.y ^ c.z ^ c.w;
}

template <int S, int MINB>
__global__ void __launch_bounds__(kThreads, MINB) ring_cpasync(const unsigned char* k, const unsigned char* v,
                                                               int tokens, uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x;
  const int chunk = tid % 16, row0 = tid / 16;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * tokens * kRowBytes;
  const int n_tiles = tokens / kTile;
  const uint32_t ring = smem_addr(smem);
  auto issue = [&](int tile) {
    if (tile < n_tiles) {
      const uint32_t st = ring + (tile % S) * 2 * kStageBytes;
#pragma unroll
      for (int j = 0; j < kTile / 8; ++j) {
        const int row = row0 + j * 8;
        const int64_t off = base + (static_cast<int64_t>(tile) * kTile + row) * kRowBytes + chunk * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(st + swz(row, chunk)), "l"(k + off) : "memory");
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(st + kStageBytes + swz(row, chunk)),
                     "l"(v + off)
                     : "memory");
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);
  uint32_t acc = 0;
  for (int it = 0; it < n_tiles; ++it) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 2) : "memory");
    __syncthreads();
    issue(it + S - 1);
    acc ^= consume(smem + (it % S) * 2 * kStageBytes, tid);
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t phase) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n" ::"r"(bar),
      "r"(phase)
      : "memory");
}
// EF: with the evict-first L2 policy (createpolicy; cp.async (LDGSTS) with a cache hint is
// miscompiled by ptxas 13.0 -- an illegal-instruction trap -- while the bulk copy and ld forms work).
template <bool EF = false>
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  if constexpr (EF) {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(pol)
        : "memory");
  } else {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
  }
}

// ROWS = 0: one 16 KB bulk copy per tile and tensor (thread 0); ROWS = 1: one 256-byte copy per
// row (64 threads for K, 64 for V), the form a paged or NHD cache needs.
template <int S, int MINB, int ROWS, bool EF = false>
__global__ void __launch_bounds__(kThreads, MINB) ring_bulk(const unsigned char* k, const unsigned char* v,
                                                            int tokens, uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[S];
  const int tid = threadIdx.x;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * tokens * kRowBytes;
  const int n_tiles = tokens / kTile;
  const uint32_t ring = smem_addr(smem);
  if (tid == 0) {
    for (int s = 0; s < S; ++s) mbar_init(smem_addr(&bars[s]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int tile) {
    if (tile >= n_tiles) return;
    const int s = tile % S;
    const uint32_t bar = smem_addr(&bars[s]);
    const uint32_t st = ring + s * 2 * kStageBytes;
    const int64_t off = base + static_cast<int64_t>(tile) * kTile * kRowBytes;
    if (ROWS == 0) {
      if (tid == 0) {
        mbar_expect_tx(bar, 2 * kStageBytes);
        bulk_g2s<EF>(st, k + off, kStageBytes, bar);
        bulk_g2s<EF>(st + kStageBytes, v + off, kStageBytes, bar);
      }
    } else {
      if (tid == 0) mbar_expect_tx(bar, 2 * kStageBytes);
      __syncwarp();
      const int r = tid % 64;
      const unsigned char* src = (tid < 64 ? k : v) + off + r * kRowBytes;
      bulk_g2s<EF>(st + (tid < 64 ? 0 : kStageBytes) + r * kRowBytes, src, kRowBytes, bar);
    }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);
  uint32_t acc = 0;
  for (int it = 0; it < n_tiles; ++it) {
    mbar_wait(smem_addr(&bars[it % S]), (it / S) & 1);
    __syncthreads();  // everyone is done with stage (it - 1) % S
    issue(it + S - 1);
    acc ^= consume(smem + (it % S) * 2 * kStageBytes, tid);
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

// 16-byte load, L1 not allocated, under the L2 policy `pol`.
__device__ __forceinline__ uint4 ldg_policy(const uint4* p, uint64_t pol) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(pol));
  return r;
}

// Plain 16-byte loads, 8 per thread in flight, no shared memory (EF: under the evict-first policy).
template <bool EF = false>
__global__ void __launch_bounds__(kThreads) plain_ldg(const uint4* k, const uint4* v, int tokens, uint32_t* sink) {
  uint64_t pol = 0;
  if constexpr (EF) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  const int64_t n = static_cast<int64_t>(tokens) * kRowBytes / 16;
  const uint4* kb = k + blockIdx.x * n;
  const uint4* vb = v + blockIdx.x * n;
  uint32_t acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads * 4) {
    uint4 a[4], c[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if constexpr (EF) {
        a[u] = ldg_policy(kb + i + u * kThreads, pol);
        c[u] = ldg_policy(vb + i + u * kThreads, pol);
      } else {
        a[u] = __ldcs(kb + i + u * kThreads);
        c[u] = __ldcs(vb + i + u * kThreads);
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= a[u].x ^ a[u].w ^ c[u].y ^ c[u].z;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

// The read flush: every 16-byte vector of `src` summed (the L2 ends full of clean lines).
__global__ void read_flush(const uint4* src, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 x = src[i];
    acc += x.x ^ x.y ^ x.z ^ x.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// Median of 30 launches after 3 warm-up launches. flush_mode 0: none (the data is 10x the L2);
// 1: 256 MB written before each launch (the benchmarks' do_bench flush: the L2 full of dirty
// lines); 2: 256 MB read before each launch (clean lines).
int flush_mode = 0;
char* flush_buf = nullptr;
unsigned* flush_sink = nullptr;
template <typename F>
float time_us(F launch) {
  for (int i = 0; i < 3; ++i) launch();
  CK(cudaGetLastError());
  const std::vector<float> t = event_times_us_after(launch, 30, [](int r) {
    if (flush_mode == 1) CK(cudaMemsetAsync(flush_buf, r, 256 << 20));
    if (flush_mode == 2) read_flush<<<1024, 256>>>(reinterpret_cast<const uint4*>(flush_buf), (256 << 20) / 16, flush_sink);
  });
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  (void)argv;
  const int64_t bytes = int64_t{1} << 31;  // 2 GiB each of K and V: room for both shapes
  unsigned char *k, *v;
  uint32_t* sink;
  CK(cudaMalloc(&k, bytes));
  CK(cudaMalloc(&v, bytes));
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(k, 1, bytes));
  CK(cudaMemset(v, 2, bytes));
  CK(cudaMalloc(&flush_buf, 256 << 20));
  CK(cudaMalloc(&flush_sink, 4));
  CK(cudaMemset(flush_buf, 0, 256 << 20));
  struct Shape { const char* name; int ctas; int tokens; };
  const Shape shapes[] = {{"B32T4096 (256 x 4096)", 256, 4096}, {"B64T8192 (1024 x 4096)", 1024, 4096},
                          {"B64T8192 (512 x 8192)", 512, 8192}};
  printf("%-26s %-34s %9s %8s\n", "shape", "variant", "us", "TB/s");
  for (const Shape& sh : shapes) {
    const double moved = 2.0 * sh.ctas * sh.tokens * kRowBytes;
    auto report = [&](const char* name, float us) { printf("%-26s %-34s %9.1f %8.2f\n", sh.name, name, us, moved / us * 1e-6); };
#define RUN_CPASYNC(S, MINB)                                                                                   \
  {                                                                                                             \
    const int sm = S * 2 * kStageBytes;                                                                         \
    CK(cudaFuncSetAttribute(ring_cpasync<S, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));           \
    report("cp.async S=" #S " minB=" #MINB,                                                                     \
           time_us([&] { ring_cpasync<S, MINB><<<sh.ctas, kThreads, sm>>>(k, v, sh.tokens, sink); }));        \
  }
#define RUN_BULK(S, MINB, ROWS, EF)                                                                            \
  {                                                                                                             \
    const int sm = S * 2 * kStageBytes;                                                                         \
    CK(cudaFuncSetAttribute(ring_bulk<S, MINB, ROWS, EF>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));    \
    report(EF ? "bulk S=" #S " minB=" #MINB " rows=" #ROWS " evict-first" : "bulk S=" #S " minB=" #MINB " rows=" #ROWS, \
           time_us([&] { ring_bulk<S, MINB, ROWS, EF><<<sh.ctas, kThreads, sm>>>(k, v, sh.tokens, sink); }));  \
  }
    if (argc < 2) {
      RUN_CPASYNC(3, 2)
      RUN_CPASYNC(2, 3)
      RUN_CPASYNC(4, 1)
      RUN_CPASYNC(6, 1)
      RUN_BULK(3, 2, 0, false)
      RUN_BULK(2, 3, 0, false)
      RUN_BULK(4, 1, 0, false)
      RUN_BULK(6, 1, 0, false)
      RUN_BULK(3, 2, 1, false)
      RUN_BULK(4, 1, 1, false)
      report("plain ldg x4", time_us([&] { plain_ldg<<<sh.ctas, kThreads>>>(reinterpret_cast<const uint4*>(k),
                                                                            reinterpret_cast<const uint4*>(v), sh.tokens, sink); }));
      continue;
    }
    // `stream_read flush`: each L2 state before the launch, with and without the evict-first policy
    for (int mode : {1, 2, 0}) {
      flush_mode = mode;
      printf("-- %s\n", flush_mode == 1 ? "write flush" : flush_mode == 2 ? "read flush" : "no flush");
      RUN_CPASYNC(3, 2)
      RUN_BULK(3, 2, 0, false)
      RUN_BULK(3, 2, 0, true)
      RUN_BULK(3, 2, 1, false)
      RUN_BULK(3, 2, 1, true)
      RUN_BULK(5, 1, 1, true)
      report("plain ldg x4", time_us([&] { plain_ldg<<<sh.ctas, kThreads>>>(reinterpret_cast<const uint4*>(k),
                                                                            reinterpret_cast<const uint4*>(v), sh.tokens, sink); }));
      report("plain ldg x4 evict-first", time_us([&] { plain_ldg<true><<<sh.ctas, kThreads>>>(reinterpret_cast<const uint4*>(k),
                                                                            reinterpret_cast<const uint4*>(v), sh.tokens, sink); }));
    }
    flush_mode = 0;
  }
  // Copy ceiling (read + write counted).
  const int64_t cb = int64_t{1} << 30;
  const float us = time_us([&] { CK(cudaMemcpyAsync(v, k, cb, cudaMemcpyDeviceToDevice)); });
  printf("%-26s %-28s %9.1f %8.2f\n", "1 GiB", "cudaMemcpy D2D (r+w)", us, 2.0 * cb / us * 1e-6);
  return 0;
}
