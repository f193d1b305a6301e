// The sampling kernel (cuda/sampling/sample.cuh) launched with each cluster scheduling policy
// preference: Spread (the default: a cluster's CTAs on distinct SMs) or LoadBalancing (the hardware
// may put two CTAs of one cluster on one SM). With Spread the H200 holds 30 clusters of 8 of this
// kernel (2 CTAs per SM), so 64 rows take three waves (30 + 30 + 4). Top-p 0.9, temperature 0.8,
// fp32 standard-normal logits, L2 flushed before each launch; the tokens must match the
// production launcher's. Runs at 9e10afd..fa0d44d (2026-11-30): 30 clusters under every policy;
// load-balancing was slower (64x131072 127.9 vs 120.8 us, 64x152064 140.4 vs 132.0, 256x152064 442.8 vs 429.1): not taken.
// Build + run on the GPU machine (repo root):
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/sp bench/micro/sample_cluster_policy.cu && /tmp/sp
#include <cstdint>
#include <vector>

#include "bench/micro/micro.h"
#include "cuda/sampling/sample.cuh"

using namespace fray;
using namespace fray::sampling_detail;

int main() {
  char* flush;
  CK(cudaMalloc(&flush, 256 << 20));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const char* names[3] = {"default", "spread", "load-balancing"};
  struct Shape { int rows, cols; };
  for (int round = 0; round < 2; ++round) {
    for (const Shape s : {Shape{64, 131072}, Shape{64, 152064}, Shape{256, 152064}}) {
      float* x;
      int64_t* tok;
      float* lp;
      CK(cudaMalloc(&x, size_t(s.rows) * s.cols * 4));
      CK(cudaMalloc(&tok, s.rows * 8));
      CK(cudaMalloc(&lp, s.rows * 4));
      fill_hash_normal<<<1024, 256>>>(x, size_t(s.rows) * s.cols, 11);
      SampleParams p;
      p.logits = x; p.row_stride = s.cols; p.rows = s.rows; p.cols = s.cols;
      p.temperature_value = 0.8f; p.top_p_value = 0.9f; p.seed_value = 1234; p.tokens = tok; p.logprobs = lp;
      CK(launch_sample<float>(p, nullptr));
      CK(cudaDeviceSynchronize());
      std::vector<int64_t> ref(s.rows), got(s.rows);
      CK(cudaMemcpy(ref.data(), tok, s.rows * 8, cudaMemcpyDeviceToHost));
      std::vector<float> t = event_times_us([&] { CK(launch_sample<float>(p, nullptr)); }, 20, flush, 256 << 20);
      printf("%dx%d production launcher            %8.1f us\n", s.rows, s.cols, t[10]);
      const Plan plan = sample_plan(s.cols, 4, s.rows, sms);
      SampleArgs a{};
      a.logits = x; a.stride = s.cols; a.cols = s.cols; a.temperature_value = 0.8f; a.top_p_value = 0.9f;
      a.min_p_value = 0.0f; a.top_k_value = 0; a.seed_value = 1234; a.offset_value = 0; a.tokens = tok; a.logprobs = lp;
      a.slice = static_cast<int>(plan.slice); a.vec_ok = true; a.row0 = 0;
      const size_t smem = static_cast<size_t>(plan.slice) * 4 + kAuxBytes;
      for (int pol = 0; pol < 3; ++pol) {
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = static_cast<unsigned>(plan.cluster);
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        attr[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
        attr[1].val.clusterSchedulingPolicyPreference = static_cast<cudaClusterSchedulingPolicy>(pol);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(static_cast<unsigned>(s.rows * plan.cluster));
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = attr;
        cfg.numAttrs = 2;
        int maxc = -1;
        CK(cudaOccupancyMaxActiveClusters(&maxc, sample_kernel<float>, &cfg));
        CK(cudaMemset(tok, 0xff, s.rows * 8));
        auto launch = [&] { CK(cudaLaunchKernelEx(&cfg, sample_kernel<float>, a)); };
        launch();
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got.data(), tok, s.rows * 8, cudaMemcpyDeviceToHost));
        t = event_times_us(launch, 20, flush, 256 << 20);
        printf("%dx%d C %d policy %-15s clusters %3d %8.1f us  tokens as production: %s\n", s.rows, s.cols,
               int(plan.cluster), names[pol], maxc, t[10], got == ref ? "yes" : "NO");
      }
      cudaFree(x); cudaFree(tok); cudaFree(lp);
    }
  }
  return 0;
}
