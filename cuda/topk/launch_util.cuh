// Fray topk family: host-side launch helpers shared by topk.cuh and argmax.cuh
// (cluster launches, opt-in shared memory, the SM count).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.h"
#include "cuda/topk/topk_plan.h"

namespace fray {
namespace topk_detail {

constexpr int kMaxDevices = 64;

// Multiprocessor count of `device`, read once per device (a host attribute query:
// no stream work, so it is safe during graph capture).
inline int sm_count(int device) {
  static std::atomic<int> cache[kMaxDevices];
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const int v = cache[device].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || v <= 0) {
    (void)cudaGetLastError();
    v = 132;  // H100/H200 SXM: only the launch shape depends on it
  }
  if (cached) cache[device].store(v, std::memory_order_relaxed);
  return v;
}

// Function attributes a launch needs: the shared-memory opt-in when static plus
// dynamic memory may pass 48 KB (needs_smem_optin: the static part counts too, so
// exactly 48 KB of dynamic memory already needs it), and clusters above 8 CTAs.
// Set once per (kernel, device) and raised when a launch needs more, so the
// launches of a captured graph (after a warm-up call) make no attribute calls.
inline cudaError_t prepare_kernel(const void* fn, int device, size_t smem, int cluster) {
  const bool optin = needs_smem_optin(smem);
  if (!optin && cluster <= kPortableCluster) return cudaSuccess;
  struct State {
    size_t smem = 0;  // dynamic bytes the attribute allows (0: never set)
    bool big_cluster = false;
  };
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, State> done;
  const std::lock_guard<std::mutex> lock(mu);
  State& st = done[{fn, device}];
  if (optin && smem > st.smem) {
    const cudaError_t err =
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    st.smem = smem;
  }
  if (cluster > kPortableCluster && !st.big_cluster) {
    const cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return err;
    st.big_cluster = true;
  }
  return cudaSuccess;
}

}  // namespace topk_detail
}  // namespace fray
