// The streaming top-k kernel (cuda/topk/topk_stream.cuh) at the 64-row benchmark shapes, launched
// with cluster sizes 2..16, next to the occupancy API's count of clusters that can be resident at
// once (cudaOccupancyMaxActiveClusters): the plan assumed rows x C CTAs fit one wave when
// rows x C <= SMs x 4, but whole clusters must fit inside one GPC, so fewer are resident. fp32
// standard-normal rows (Box-Muller on a hash), L2 flushed before each launch; every cluster size
// must give the same values and indices as C = 8.
// Runs at 9e10afd..fa0d44d, 2026-11-30 (bench/NOTES.md): with 256 threads x 4 CTAs per SM the
// H200 held 62 clusters of 8, so 64 rows ran as two waves (64x131072 k50: 68.2 us; 62 rows: 46.6); C 4 fit (58.8). 192 threads x
// 5 CTAs per SM (now the kernel's shape) hold 77: 57.7 us at C 8. Pass 1's histogram adds grouped
// by __match_any_sync (one atomic per distinct digit of a warp) measured 101 us against 57.5:
// not kept. run_policies: the cluster scheduling policy preference; load-balancing (several CTAs of
// a cluster may share an SM) held 81 clusters of 8 and took 51.7 us at 64x131072 k50 (spread /
// default: 77, 57.2), k4096 89.2 (97.1), 64x262144 78.7 (88.6), bf16 54.6 (62.5): now the
// launcher's policy for the streaming kernel.
// Build + run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/tc bench/micro/topk_stream_clusters.cu && /tmp/tc
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "bench/micro/micro.h"
#include "cuda/topk/topk.cuh"

using namespace fray;
using namespace fray::topk_detail;

struct Shape { int rows, width, k; };

// One clustered launch with a cluster scheduling policy preference (Default: as launch_clustered).
template <typename Args>
cudaError_t launch_policy(void (*fn)(Args), const Args& args, dim3 grid, size_t smem, int cluster,
                          cudaClusterSchedulingPolicy policy, int* max_clusters) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
  attr[1].val.clusterSchedulingPolicyPreference = policy;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kStreamThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  if (max_clusters != nullptr) return cudaOccupancyMaxActiveClusters(max_clusters, fn, &cfg);
  return cudaLaunchKernelEx(&cfg, fn, args);
}

// Standard-normal rows [rows, width] and the outputs of one shape, freed with the object.
template <typename T>
struct Bufs {
  T* x = nullptr;
  T* vals = nullptr;
  int64_t* inds = nullptr;
  explicit Bufs(const Shape& s) {
    CK(cudaMalloc(&x, size_t(s.rows) * s.width * sizeof(T)));
    CK(cudaMalloc(&vals, size_t(s.rows) * s.k * sizeof(T)));
    CK(cudaMalloc(&inds, size_t(s.rows) * s.k * 8));
    fill_hash_normal<<<1024, 256>>>(x, size_t(s.rows) * s.width, 7);
  }
  ~Bufs() { cudaFree(x); cudaFree(vals); cudaFree(inds); }
  // Sorted top-k args of the stream kernel at cluster size C (its shared memory prepared).
  TopkArgs args(const Shape& s, int C, TopkKernelFn fn) const {
    CK(prepare_kernel(reinterpret_cast<const void*>(fn), 0, stream_smem(C), C));
    TopkArgs a{};
    a.x = x; a.x_stride = s.width; a.values = vals; a.indices = inds; a.rank_keys = nullptr;
    a.rows = s.rows; a.width = s.width; a.k = s.k; a.sort_size = int(next_pow2(s.k)); a.flip = 0;
    a.slice = int(ceil_div(ceil_div(s.width, C), kSliceAlign) * kSliceAlign);
    return a;
  }
};

template <typename T>
void run_policies(const char* dt, const Shape& s, char* flush) {
  const TopkKernelFn fn = topk_stream_kernel_for<T, 16 / int(sizeof(T))>(true);
  const Bufs<T> b(s);
  const char* names[3] = {"default", "spread", "load-balancing"};
  for (int C : {8, 4}) {
    const size_t smem = stream_smem(C);
    const TopkArgs a = b.args(s, C, fn);
    for (int pol = 0; pol < 3; ++pol) {
      const auto policy = static_cast<cudaClusterSchedulingPolicy>(pol);
      int maxc = -1;
      CK(launch_policy(fn, a, dim3(s.rows * C), smem, C, policy, &maxc));
      auto launch = [&] { CK(launch_policy(fn, a, dim3(s.rows * C), smem, C, policy, nullptr)); };
      launch();
      CK(cudaDeviceSynchronize());
      const std::vector<float> t = event_times_us(launch, 30, flush, 256 << 20);
      printf("%dx%dk%d %s C %d policy %-15s max clusters %4d  %8.1f us\n", s.rows, s.width, s.k, dt, C, names[pol],
             maxc, t[15]);
    }
  }
}

template <typename T>
void run_shapes(const char* dt, const std::vector<Shape>& shapes, char* flush, std::vector<int> cls = {8, 2, 4, 16}) {
  const TopkKernelFn fn = topk_stream_kernel_for<T, 16 / int(sizeof(T))>(true);
  for (const Shape& s : shapes) {
    const Bufs<T> b(s);
    std::vector<T> v8;
    std::vector<int64_t> i8;
    for (int C : cls) {
      const TopkArgs a = b.args(s, C, fn);
      if (a.slice < 2048) continue;
      const size_t smem = stream_smem(C);
      int maxc = -1;
      CK(launch_policy(fn, a, dim3(s.rows * C), smem, C, cudaClusterSchedulingPolicyDefault, &maxc));
      auto launch = [&] { CK(launch_clustered(fn, a, dim3(s.rows * C), dim3(kStreamThreads), smem, C, nullptr)); };
      CK(cudaMemset(b.vals, 0, size_t(s.rows) * s.k * sizeof(T)));
      launch();
      CK(cudaDeviceSynchronize());
      std::vector<T> v(size_t(s.rows) * s.k);
      std::vector<int64_t> ix(size_t(s.rows) * s.k);
      CK(cudaMemcpy(v.data(), b.vals, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(ix.data(), b.inds, ix.size() * 8, cudaMemcpyDeviceToHost));
      if (C == 8) { v8 = v; i8 = ix; }
      const std::vector<float> t = event_times_us(launch, 30, flush, 256 << 20);
      char name[40];
      snprintf(name, sizeof name, "%dx%dk%d %s", s.rows, s.width, s.k, dt);
      const bool same = ix == i8 && memcmp(v.data(), v8.data(), v.size() * sizeof(T)) == 0;
      printf("%-24s %3d %8d %6d %9s %9.1f %s\n", name, C, a.slice, maxc, s.rows <= maxc ? "one wave" : "waves", t[15],
             same ? "yes" : "NO");
    }
  }
}

int main() {
  char* flush;
  CK(cudaMalloc(&flush, 256 << 20));
  printf("threads per CTA %d, CTAs per SM (launch bounds) %d\n", kStreamThreads, kStreamMinBlocks);
  printf("%-24s %3s %8s %6s %9s %9s %s\n", "shape", "C", "slice", "maxclu", "fits", "us", "same as C8");
  run_shapes<float>("fp32", {{64, 131072, 50}, {62, 131072, 50}, {64, 131072, 1024}, {64, 131072, 4096},
                             {64, 262144, 50}, {60, 262144, 50}}, flush);
  run_shapes<__nv_bfloat16>("bf16", {{64, 131072, 50}}, flush);
  for (int round = 0; round < 2; ++round) {
    run_policies<float>("fp32", {64, 131072, 50}, flush);
    run_policies<float>("fp32", {64, 131072, 4096}, flush);
    run_policies<float>("fp32", {64, 262144, 50}, flush);
    run_policies<__nv_bfloat16>("bf16", {64, 131072, 50}, flush);
  }
  return 0;
}
