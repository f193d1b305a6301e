// B = 1 decode, paged against contiguous (bf16, D = 128, Hq 32, Hkv 8, T 4096, 16 splits of 256
// tokens, as the production plan picks): graph replays of split + combine, one call per graph with
// the L2 flushed before each replay, and 20 calls per graph with it warm (the benchmark's :graph
// rows). Variants: the production launcher (contiguous HND and, timing only, NHD; paged P16 / P64,
// the pages shuffled in a pool of twice the blocks, and P16 with the pages in order, whose
// addresses are the NHD cache's) and the same kernels launched without programmatic dependent
// launch; every paged output must be bit-equal to contiguous.
// Build + run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/dp bench/micro/decode_paged_b1.cu && /tmp/dp
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "bench/micro/decode_b1.h"

using namespace b1;

int main() {
  char* flush;
  CK(cudaMalloc(&flush, 256 << 20));
  Setup su(2);  // a pool of twice the blocks, shuffled
  const DecodeParams& p = su.p;
  T* out = su.out;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<uint16_t> ref(n_out), got(n_out);
  CK(launch_decode<T>(p, st));
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(ref.data(), out, n_out * 2, cudaMemcpyDeviceToHost));

  // Times `launch` (split + combine on stream st) replayed from CUDA graphs: one call per graph
  // with the L2 flushed before each replay, and 20 calls per graph without a flush (the
  // benchmark's ":graph" rows: table and K/V stay in L2, and under programmatic dependent launch
  // each call's split kernel launches while the previous call's combine runs).
  auto graph_time = [&](const char* name, auto launch) {
    float med[2];
    for (int mode = 0; mode < 2; ++mode) {
      const std::vector<float> t = graph_times_us(st, mode == 0 ? 1 : 20, 120, launch, [&](int r) {
        if (mode == 0) CK(cudaMemsetAsync(flush, r, 256 << 20, st));
      });
      med[mode] = t[t.size() / 2];
    }
    printf("%-44s flushed, 1 call/graph %6.2f us   L2 warm, 20 calls/graph %6.2f us\n", name, med[0], med[1]);
  };
  auto check = [&](const char* name) {
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(got.data(), out, n_out * 2, cudaMemcpyDeviceToHost));
    printf("%-44s bit-equal to contiguous: %s\n", name, got == ref ? "yes" : "NO");
  };
  // Plain launches (no programmatic dependent launch) of a split kernel and the combine.
  auto plain = [&](auto split_kernel, const DecodeArgs& da, int smem) {
    CK(cudaFuncSetAttribute(split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    split_kernel<<<Hkv * splits, kThreads, smem, st>>>(da);
    CK(cudaGetLastError());
    decode_combine_kernel<T, 128><<<B * Hq, kThreads, 0, st>>>(da);
    CK(cudaGetLastError());
  };
  const DecodeArgs ac = args_of(p);
  for (int round = 0; round < 2; ++round) {
    graph_time("contiguous, production", [&] { CK(launch_decode<T>(p, st)); });
    graph_time("contiguous, no PDL", [&] {
      plain(decode_split_mma_kernel<T, 128, false>, ac, MmaConfig<128>::kSmemBytes);
    });
    {
      // The same buffers read as an NHD cache [B, T, Hkv, D] (tokens 2 KB apart, as in a page):
      // timing only (other data, so no bit-equality check).
      DecodeParams pn = p;
      pn.k_sh = D; pn.k_st = size_t(Hkv) * D;
      pn.v_sh = D; pn.v_st = size_t(Hkv) * D;
      graph_time("contiguous NHD (timing only), production", [&] { CK(launch_decode<T>(pn, st)); });
    }
    for (int P : {16, 64, -16}) {
      // P < 0: block i holds tokens i|P|..: the pages in order (their addresses are the
      // contiguous NHD cache's), which separates the page lookups from the scattering
      const bool in_order = P < 0;
      P = in_order ? -P : P;
      const int nb = Tcap / P;
      std::vector<int> perm(2 * nb);
      std::iota(perm.begin(), perm.end(), 0);
      if (!in_order) std::shuffle(perm.begin(), perm.end(), std::mt19937(P));
      const DecodeParams pp = su.paged(P, perm);
      const DecodeArgs a = args_of(pp);
      char name[64];
      auto variant = [&](const char* what, auto launch) {
        snprintf(name, sizeof name, "paged P%d%s, %s", P, in_order ? " in order" : "", what);
        CK(cudaMemset(out, 0, n_out * 2));
        launch();
        check(name);
        graph_time(name, launch);
      };
      variant("production", [&] { CK(launch_decode<T>(pp, st)); });
      variant("no PDL", [&] { plain(decode_split_mma_kernel<T, 128, true>, a, MmaConfig<128>::kSmemBytes); });
    }
  }
  return 0;
}
