// Shared by the standalone bench/micro programs: CUDA error checking.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(...)                                                                        \
  do {                                                                                 \
    cudaError_t e_ = (__VA_ARGS__);                                                    \
    if (e_ != cudaSuccess) {                                                           \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);  \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

#include <algorithm>
#include <vector>

// Per-launch times in µs, sorted: `reps` launches, each between two events on `stream` (default:
// the legacy default stream), `before(r)` enqueued ahead of launch r (outside the events).
template <typename F, typename G>
std::vector<float> event_times_us_after(F launch, int reps, G before, cudaStream_t stream = nullptr) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    before(r);
    CK(cudaEventRecord(a, stream));
    launch();
    CK(cudaEventRecord(b, stream));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t;
}

// The same with, if `flush` is set, `flush_bytes` of it written before each launch (the L2 flush
// the benchmarks do).
template <typename F>
std::vector<float> event_times_us(F launch, int reps, void* flush = nullptr, size_t flush_bytes = 0) {
  return event_times_us_after(launch, reps, [&](int r) {
    if (flush != nullptr) CK(cudaMemsetAsync(flush, r, flush_bytes));
  });
}

// Fills x[0, n) with hash-based pseudo-random values (x[i] depends on i and seed only):
// uniform in [-2, 2) (fill_hash_uniform) or standard normal by Box-Muller (fill_hash_normal).
__device__ __forceinline__ uint32_t micro_hash(uint32_t h) {
  h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
  return h;
}

template <typename T>
__global__ void fill_hash_uniform(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    x[i] = T((micro_hash(uint32_t(i) * 2654435761u ^ seed) & 0xffff) / 16384.0f - 2.0f);
  }
}

template <typename T>
__global__ void fill_hash_normal(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = micro_hash(uint32_t(i) * 2654435761u ^ seed);
    const uint32_t g = micro_hash(uint32_t(i >> 32) * 0x9E3779B9u + uint32_t(i) * 40503u + seed + 0x7feb352du);
    const float u1 = (h + 1.0f) * 2.3283064e-10f, u2 = g * 2.3283064e-10f;
    x[i] = T(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}
