// silu_mul [16384 x 8192 out] bf16 launch-shape sweep: the act_mul kernel with 1 / 2 / 4 vectors
// per thread and several block shapes (finer blocks shrink the last partial wave), and a flat
// variant with plain or streaming (evict-first) loads and stores. Measured at 937cbf6 (2026-11-30): 1 vector
// 189.0 us, 2: 190.8, 4: 190.7, streaming flat variants 202-209. Times are medians of 30 launches with a 256 MB
// buffer written in between (L2 flushed), as the benchmark does.
// Build + run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/am bench/micro/act_mul_variants.cu && /tmp/am
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "bench/micro/micro.h"
#include "cuda/activation/act_mul.cuh"


using T = __nv_bfloat16;
using namespace fray;
using namespace fray::act_detail;

// Flat: thread i of the grid handles 16-byte vector i of the output (row = i / nv), ITEMS spaced
// by the grid's thread count inside one block-sized chunk; evict-first hints on all traffic.
// STREAM: 0 plain, 1 streaming loads and stores, 2 streaming stores only, 3 streaming loads only.
template <int ITEMS, int STREAM>
__global__ void __launch_bounds__(256) flat_silu(const T* x, T* out, int64_t rows, int64_t d) {
  const int64_t nv = d / 8;
  const int64_t total = rows * nv;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * 256 * ITEMS + threadIdx.x;
  uint4 g[ITEMS], u[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t v = base + i * 256;
    if (v < total) {
      const int64_t r = v / nv, c = v - r * nv;
      const uint4* gp = reinterpret_cast<const uint4*>(x + r * 2 * d) + c;
      const uint4* up = reinterpret_cast<const uint4*>(x + r * 2 * d + d) + c;
      g[i] = (STREAM & 1) ? __ldcs(gp) : *gp;
      u[i] = (STREAM & 1) ? __ldcs(up) : *up;
    }
  }
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t v = base + i * 256;
    if (v < total) {
      AlignedVec<T, 8> gv, uv;
      *reinterpret_cast<uint4*>(gv.val) = g[i];
      *reinterpret_cast<uint4*>(uv.val) = u[i];
      act_mul_vec<Activation::kSilu>(gv, uv);
      uint4* op = reinterpret_cast<uint4*>(out) + v;
      if (STREAM == 1 || STREAM == 2) {
        __stcs(op, *reinterpret_cast<uint4*>(gv.val));
      } else {
        *op = *reinterpret_cast<uint4*>(gv.val);
      }
    }
  }
}

int main() {
  const int64_t rows = 16384, d = 8192;
  T *x, *out;
  char* flush;
  CK(cudaMalloc(&x, rows * 2 * d * sizeof(T)));
  CK(cudaMalloc(&out, rows * d * sizeof(T)));
  CK(cudaMalloc(&flush, 256 << 20));
  std::vector<T> h(rows * 2 * d);
  for (size_t i = 0; i < h.size(); ++i) h[i] = __float2bfloat16(((i * 2654435761u) % 2001) / 500.0f - 2.0f);
  CK(cudaMemcpy(x, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  const double bytes = (rows * 2 * d + rows * d) * 2.0;
  std::vector<T> ref(rows * d), got(rows * d);
  auto timeit = [&](const char* name, auto launch) {
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got.data(), out, got.size() * sizeof(T), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += memcmp(&got[i], &ref[i], sizeof(T)) != 0;
    const std::vector<float> t = event_times_us(launch, 40, flush, 256 << 20);
    printf("%-34s %8.1f us  %6.3f TB/s  (p10 %.1f p90 %.1f)  mismatches vs shipped %d\n", name, t[20],
           bytes / t[20] * 1e-6, t[4], t[36], bad);
  };
  KernelArgs ka{};
  ka.gate = x;
  ka.up = x + d;
  ka.out = out;
  ka.gate_stride = 2 * d;
  ka.up_stride = 2 * d;
  ka.out_stride = d;
  ka.rows = rows;
  ka.nv = d / 8;
  ka.row_blocks = rows;
  // The act_mul kernel template at a given vectors-per-thread and block shape (grid sized to the
  // work as act_mul's launcher does).
  auto direct = [&](auto items_tag, int tpr) {
    constexpr int kItems = decltype(items_tag)::value;
    return [=] {
      KernelArgs k2 = ka;
      const int rpb = 256 / tpr;
      k2.row_blocks = (rows + rpb - 1) / rpb;
      const int64_t chunks = (k2.nv + int64_t(tpr) * kItems - 1) / (int64_t(tpr) * kItems);
      act_mul_kernel<T, Activation::kSilu, 8, kItems><<<dim3(unsigned(chunks), unsigned(k2.row_blocks)), dim3(tpr, rpb)>>>(k2);
    };
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  auto shipped = [&] {
    const cudaError_t e = launch_typed<T, Activation::kSilu>(
        ActMulParams{Activation::kSilu, x, 2 * d, x + d, 2 * d, out, d, rows, d}, nullptr);
    CK(e);
  };
  shipped();  // the reference output: the shipped launcher
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(ref.data(), out, ref.size() * sizeof(T), cudaMemcpyDeviceToHost));
  const int64_t total = rows * d / 8;
  for (int round = 0; round < 2; ++round) {
    timeit("shipped launcher (1 item, 256 x 1)", shipped);
    timeit("items4 tpr256 (previous default)", direct(I4{}, 256));
    timeit("items2 tpr256", direct(I2{}, 256));
    timeit("items1 tpr128 rpb2", direct(I1{}, 128));
    timeit("items1 tpr64 rpb4", direct(I1{}, 64));
    timeit("flat items1 plain", [&] { flat_silu<1, 0><<<(total + 255) / 256, 256>>>(x, out, rows, d); });
    timeit("flat items1 streaming stores", [&] { flat_silu<1, 2><<<(total + 255) / 256, 256>>>(x, out, rows, d); });
    timeit("flat items1 streaming loads", [&] { flat_silu<1, 3><<<(total + 255) / 256, 256>>>(x, out, rows, d); });
  }
  return 0;
}
