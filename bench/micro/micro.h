// Shared by the standalone bench/micro programs: CUDA error checking.
#pragma once

#include <cuda_runtime.h>

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

// Per-launch times in µs, sorted: `reps` launches, each between two events on the default
// stream; with `flush` set, `flush_bytes` of it are written before each launch (the L2 flush the
// benchmarks do).
template <typename F>
std::vector<float> event_times_us(F launch, int reps, void* flush = nullptr, size_t flush_bytes = 0) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    if (flush != nullptr) CK(cudaMemsetAsync(flush, r, flush_bytes));
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
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
