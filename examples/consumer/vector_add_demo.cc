// Calls Fray's vector_add launcher from a plain C++ program: out = a + b over n floats, checked
// against the host sum. Exit status 0 on success, 1 on a wrong result or a CUDA error, 2 when
// the machine has no CUDA device.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include "cuda/elementwise/elementwise.h"

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: built and linked, not run\n");
    return 2;
  }
  // Odd, not a multiple of any vector width: the kernel's tail is exercised too.
  const int64_t n = (1 << 20) + 3;
  std::vector<float> a(n), b(n), out(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.5f * static_cast<float>(i % 1000);
    b[i] = -0.25f * static_cast<float>(i % 7);
  }
  void *da = nullptr, *db = nullptr, *dout = nullptr;
  const size_t bytes = n * sizeof(float);
  if (!ok(cudaMalloc(&da, bytes), "cudaMalloc a") || !ok(cudaMalloc(&db, bytes), "cudaMalloc b") ||
      !ok(cudaMalloc(&dout, bytes), "cudaMalloc out") ||
      !ok(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice), "copy a") ||
      !ok(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice), "copy b")) {
    return 1;
  }
  fray::VectorAddParams p;
  p.a = da;
  p.b = db;
  p.out = dout;
  p.n = n;
  if (!ok(fray::vector_add(fray::DType::kFloat32, p, /*stream=*/nullptr), "fray::vector_add") ||
      !ok(cudaDeviceSynchronize(), "kernel") ||
      !ok(cudaMemcpy(out.data(), dout, bytes, cudaMemcpyDeviceToHost), "copy out")) {
    return 1;
  }
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += out[i] != a[i] + b[i];  // one fp32 add: exact
  std::printf("fray::vector_add over %lld floats: %lld wrong\n", static_cast<long long>(n),
              static_cast<long long>(wrong));
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
  return wrong == 0 ? 0 : 1;
}
