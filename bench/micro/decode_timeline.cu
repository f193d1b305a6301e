// Where does a B = 1 decode split kernel spend its time? decode_split_mma_kernel built with its
// timeline probe (FRAY_DECODE_STAMP): thread 0 of every CTA records clock64 and %globaltimer at
// kernel entry (0), after griddepcontrol.wait (1), once lens[b] has arrived (2), after the
// prologue's K/V copies are issued (3), when the first tile has landed (4), after the tile loop
// (5) and at the end (6). Each variant is replayed from a 20-call CUDA graph (the L2 warm, the
// benchmark's B1 :graph row); the stamps are the last call's. Printed: per-CTA medians (and
// 10th / 90th percentiles) of each interval in ns, the span of the kernel on the global timer, and
// how many SMs the CTAs occupied. bf16, D = 128, Hq 32, Hkv 8, T 4096, 16 splits of 256 tokens.
// Build + run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/dt bench/micro/decode_timeline.cu && /tmp/dt
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>

__device__ unsigned long long g_clk[1024][8];
__device__ unsigned long long g_gt[1024][8];
__device__ unsigned g_sm[1024];

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
#define FRAY_DECODE_STAMP(i)                                    \
  do {                                                          \
    if (threadIdx.x == 0) {                                     \
      g_clk[blockIdx.x][i] = clock64();                         \
      g_gt[blockIdx.x][i] = global_ns();                        \
      if ((i) == 0) g_sm[blockIdx.x] = smid();                  \
    }                                                           \
  } while (0)

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "bench/micro/decode_b1.h"

using namespace b1;

int main() {
  const int P = 16, grid = Hkv * splits;
  Setup su(1);
  std::vector<int> perm(Tcap / P);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(P));
  const DecodeArgs ap = args_of(su.paged(P, perm));
  // the contiguous kernel reads the HND buffers as an NHD cache [T, Hkv, D] (timing only)
  DecodeParams pn = su.p;
  pn.k_sh = D; pn.k_st = size_t(Hkv) * D;
  pn.v_sh = D; pn.v_st = size_t(Hkv) * D;
  const DecodeArgs ac = args_of(pn);
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  auto run = [&](const char* name, auto launch) {
    const std::vector<float> per_call = graph_times_us(st, 20, 60, launch, [](int) {});
    static unsigned long long clk[1024][8], gt[1024][8];
    static unsigned sm[1024];
    CK(cudaMemcpyFromSymbol(clk, g_clk, sizeof clk));
    CK(cudaMemcpyFromSymbol(gt, g_gt, sizeof gt));
    CK(cudaMemcpyFromSymbol(sm, g_sm, sizeof sm));
    const double ns_per_clk = 1e6 / clock_khz;  // nominal clock; see the global-timer span too
    printf("\n%s: %.2f us per call (median of 60 replays of a 20-call graph)\n", name, per_call[per_call.size() / 2]);
    static const char* kIv[] = {"entry -> wait released", "wait -> lens arrived", "lens -> prologue issued",
                                "prologue -> first tile landed", "first tile -> loop done", "loop -> end", "entry -> end"};
    for (int iv = 0; iv < 7; ++iv) {
      std::vector<double> d;
      for (int c = 0; c < grid; ++c) {
        const int a = iv == 6 ? 0 : iv, b = iv == 6 ? 6 : iv + 1;
        d.push_back(double(clk[c][b] - clk[c][a]) * ns_per_clk);
      }
      std::sort(d.begin(), d.end());
      printf("  %-30s p10 %7.0f  median %7.0f  p90 %7.0f ns (clock)\n", kIv[iv], d[grid / 10], d[grid / 2], d[grid * 9 / 10]);
    }
    unsigned long long g0 = ~0ull, g1 = 0, w0 = ~0ull, w1 = 0, e_min = ~0ull;
    for (int c = 0; c < grid; ++c) {
      g0 = std::min(g0, gt[c][0]);
      g1 = std::max(g1, gt[c][6]);
      w0 = std::min(w0, gt[c][1]);
      w1 = std::max(w1, gt[c][1]);
      e_min = std::min(e_min, gt[c][6]);
    }
    std::set<unsigned> sms(sm, sm + grid);
    printf("  global timer: first entry -> last end %.0f ns; wait released over %.0f ns; first end at +%.0f ns after the last release; %zu SMs for %d CTAs\n",
           double(g1 - g0), double(w1 - w0), double(e_min) - double(w1), sms.size(), grid);
  };
  for (int round = 0; round < 2; ++round) {
    run("contiguous NHD, 3 stages (production)", [&] {
      CK(launch_split<decode_split_mma_kernel<T, 128, false>>(ac, grid, MmaConfig<128>::kSmemBytes, st));
      CK(launch_combine<decode_combine_kernel<T, 128>>(ac, st));
    });
    run("paged P16, 3 stages (production)", [&] {
      CK(launch_split<decode_split_mma_kernel<T, 128, true>>(ap, grid, MmaConfig<128>::kSmemBytes, st));
      CK(launch_combine<decode_combine_kernel<T, 128>>(ap, st));
    });
  }
  return 0;
}
