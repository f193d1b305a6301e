// What one all-to-all exchange of a few bytes costs inside a cluster of 8 blocks of 512 threads at
// 2 blocks per SM (the sampling kernel's shape): R rounds per block, each publishing one 8-byte
// value per block and reading all 8. Variants:
//   sync_read: cluster.sync() (barrier.cluster.arrive = release: MEMBAR.ALL.GPU, then wait) and a
//              remote (DSMEM) load of every block's value, as the sampling kernel does today;
//   sync_only: cluster.sync() alone (no remote load);
//   relaxed_read: __syncthreads + barrier.cluster.arrive.relaxed + wait + remote loads (no fence;
//              outside the PTX memory model, timing only);
//   push:      every block st.async's its value into each block's slot array, completing on the
//              receiver's mbarrier (expect_tx 64 bytes); every thread waits on its own mbarrier and
//              reads the 8 values locally (no cluster barrier, no fence).
// Build + run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/cx bench/micro/cluster_xchg.cu && /tmp/cx
#include <cooperative_groups.h>

#include <cstdint>
#include <cstdio>

#include "bench/micro/micro.h"
#include "cuda/common/bulk_copy.cuh"

namespace cg = cooperative_groups;
using namespace fray;
constexpr int kR = 64;
constexpr int kC = 8;

struct Smem {
  uint64_t slot[kR][kC];
  uint64_t bar[kR];
  uint64_t mine[kR];
};

// Block `rank`'s copy of the local shared-memory address a (shared::cluster window).
__device__ __forceinline__ uint32_t mapa_u32(const void* a, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(a)), "r"(rank));
  return r;
}

// v into block `rank`'s copy of slot, completing 8 bytes on its copy of bar.
__device__ __forceinline__ void push_u64(uint64_t* slot, uint64_t v, uint64_t* bar, int rank) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u64 [%0], %1, [%2];" ::"r"(mapa_u32(slot, rank)),
               "l"(v), "r"(mapa_u32(bar, rank))
               : "memory");
}

template <int V>
__global__ void __launch_bounds__(512, 2) xchg(uint64_t* out, int rounds) {
  extern __shared__ __align__(16) unsigned char smem[];
  Smem* s = reinterpret_cast<Smem*>(smem);
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int lane = threadIdx.x & 31;
  uint64_t acc = 0;
  if (V == 3) {
    if (threadIdx.x < kR) mbar_init(&s->bar[threadIdx.x], 1);
    mbar_init_fence();
  }
  cluster.sync();
  for (int r = 0; r < rounds; ++r) {
    const uint64_t v = (static_cast<uint64_t>(r) << 8) | rank;
    if (V == 0 || V == 1) {
      if (threadIdx.x == 0) s->mine[r] = v;
      cluster.sync();
      if (V == 0) acc += lane < kC ? *cluster.map_shared_rank(&s->mine[r], lane) : 0;
    } else if (V == 2) {
      if (threadIdx.x == 0) s->mine[r] = v;
      __syncthreads();
      asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
      asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
      acc += lane < kC ? *cluster.map_shared_rank(&s->mine[r], lane) : 0;
    } else {
      if (threadIdx.x == 0) mbar_arrive_expect_tx(&s->bar[r], kC * 8);
      if (threadIdx.x < kC) {
        push_u64(&s->slot[r][rank], v, &s->bar[r], static_cast<int>(threadIdx.x));
      }
      mbar_wait(&s->bar[r], 0);
      acc += lane < kC ? s->slot[r][lane] : 0;
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  }
  cluster.sync();
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

template <int V>
float run(uint64_t* out, int clusters, int rounds) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kC;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(clusters * kC);
  cfg.blockDim = dim3(512);
  cfg.dynamicSmemBytes = 100 * 1024;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaFuncSetAttribute(xchg<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
  auto t = event_times_us([&] { CK(cudaLaunchKernelEx(&cfg, xchg<V>, out, rounds)); }, 30);
  return t[t.size() / 2];
}

int main() {
  uint64_t* out;
  CK(cudaMalloc(&out, 8192 * 8));
  const char* names[4] = {"sync_read", "sync_only", "relaxed_read", "push"};
  for (int clusters : {1, 30}) {
    for (int rep = 0; rep < 2; ++rep) {
      float t[4][2];
      t[0][0] = run<0>(out, clusters, 1); t[0][1] = run<0>(out, clusters, kR);
      t[1][0] = run<1>(out, clusters, 1); t[1][1] = run<1>(out, clusters, kR);
      t[2][0] = run<2>(out, clusters, 1); t[2][1] = run<2>(out, clusters, kR);
      t[3][0] = run<3>(out, clusters, 1); t[3][1] = run<3>(out, clusters, kR);
      for (int v = 0; v < 4; ++v) {
        printf("clusters %2d  %-13s %7.2f us per exchange (1 round %6.2f us, %d rounds %7.2f us)\n", clusters,
               names[v], (t[v][1] - t[v][0]) / (kR - 1), t[v][0], kR, t[v][1]);
      }
    }
  }
  return 0;
}
