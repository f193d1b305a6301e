// softmax [16384 x 8192] bf16 -> bf16: the shipped register kernel against the shared-memory
// (bulk-copy) kernel on the same rows, and the register kernel's launch shapes. Medians of 40
// launches, a 256 MB buffer written before each (L2 flushed).
// Build + run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/sv bench/micro/softmax_variants.cu && /tmp/sv
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/micro/micro.h"
#include "cuda/softmax/softmax.cuh"


using T = __nv_bfloat16;
using namespace fray::softmax_detail;

int main() {
  const int64_t rows = 16384, cols = 8192;
  T *x, *y;
  char* flush;
  CK(cudaMalloc(&x, rows * cols * sizeof(T)));
  CK(cudaMalloc(&y, rows * cols * sizeof(T)));
  CK(cudaMalloc(&flush, 256 << 20));
  std::vector<T> h(rows * cols);
  for (size_t i = 0; i < h.size(); ++i) h[i] = __float2bfloat16(((i * 2654435761u) % 4001) / 500.0f - 4.0f);
  CK(cudaMemcpy(x, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  const double bytes = rows * cols * 4.0;
  KernelArgs a{};
  a.x = x;
  a.y = y;
  a.x_stride = cols;
  a.y_stride = cols;
  a.rows = rows;
  a.nv = cols / 8;
  a.scale = static_cast<float>(kLog2e);
  a.inv_temperature = 1.0f;
  std::vector<T> ref(rows * cols), got(rows * cols);
  const LaunchConfig shipped = softmax_config(a.nv, 8);
  printf("shipped config: items %d tpr %d rpb %d cluster %d slice %lld\n", shipped.items, shipped.tpr, shipped.rpb,
         shipped.cluster, static_cast<long long>(shipped.slice));
  auto run = [&](const LaunchConfig& c) {
    KernelArgs k = a;
    k.slice = c.slice;
    const cudaError_t err = launch_kernel<T, T, 8>(k, c, nullptr);
    CK(err);
  };
  run(shipped);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(ref.data(), y, ref.size() * sizeof(T), cudaMemcpyDeviceToHost));
  auto timeit = [&](const char* name, const LaunchConfig& c) {
    run(c);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got.data(), y, got.size() * sizeof(T), cudaMemcpyDeviceToHost));
    double md = 0;
    for (size_t i = 0; i < got.size(); ++i) md = std::max(md, (double)std::fabs(__bfloat162float(got[i]) - __bfloat162float(ref[i])));
    const std::vector<float> t = event_times_us([&] { run(c); }, 40, flush, 256 << 20);
    printf("%-36s %8.1f us  %6.3f TB/s  (p10 %.1f p90 %.1f)  max |diff| vs shipped %.3g\n", name, t[20],
           bytes / t[20] * 1e-6, t[4], t[36], md);
  };
  for (int round = 0; round < 2; ++round) {
    timeit("shipped (register kernel)", shipped);
    timeit("smem kernel, 1 block per row", LaunchConfig{0, kSmemThreads, 1, 1, a.nv});
    timeit("register items 4 tpr 256 (explicit)", LaunchConfig{4, 256, 1, 1, 0});
  }
  return 0;
}
