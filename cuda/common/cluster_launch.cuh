// Fray: thread-block-cluster launches (host side of .cu files; needs the CUDA runtime's C++ API).
//
//  * cluster_config   - a cudaLaunchConfig_t for a 1-D cluster, optionally asking for the
//    load-balancing cluster scheduling policy.
//  * launch_ex        - cudaLaunchKernelEx plus the launch-error check every launcher returns.
//  * launch_clustered - a plain launch for cluster <= 1, else a cluster launch.
//  * prepare_kernel   - the function attributes a launch needs, set once per (kernel, device).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/common/launch.h"

namespace fray {

// Launch configuration of a 1-D cluster of `cluster` CTAs along x; `balance` asks for the
// load-balancing cluster scheduling policy (the hardware may place several CTAs of one cluster on
// one SM; the default spreads them over distinct SMs). attr must outlive the returned config.
inline cudaLaunchConfig_t cluster_config(cudaLaunchAttribute (&attr)[2], dim3 grid, dim3 block, size_t smem,
                                         int cluster, bool balance, cudaStream_t stream) {
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
  attr[1].val.clusterSchedulingPolicyPreference =
      balance ? cudaClusterSchedulingPolicyLoadBalancing : cudaClusterSchedulingPolicyDefault;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = balance ? 2 : 1;
  return cfg;
}

// One cudaLaunchKernelEx launch; its error, else the launch-error slot's (read either way, so no
// stale error is left for the next caller).
template <typename Args>
cudaError_t launch_ex(void (*fn)(Args), const Args& args, const cudaLaunchConfig_t& cfg) {
  const cudaError_t err = cudaLaunchKernelEx(&cfg, fn, args);
  const cudaError_t last = launch_error();
  return err != cudaSuccess ? err : last;
}

// One launch; a 1-D cluster of `cluster` CTAs along x when cluster > 1 (see cluster_config).
template <typename Args>
cudaError_t launch_clustered(void (*fn)(Args), const Args& args, dim3 grid, dim3 block, size_t smem, int cluster,
                             cudaStream_t stream, bool balance = false) {
  if (cluster <= 1) {
    fn<<<grid, block, smem, stream>>>(args);
    return launch_error();
  }
  cudaLaunchAttribute attr[2];
  return launch_ex(fn, args, cluster_config(attr, grid, block, smem, cluster, balance, stream));
}

// The function attributes a launch of `fn` on `device` needs: `smem` bytes of dynamic shared
// memory (the limit is raised, never lowered, so concurrent launchers of other sizes never undo
// each other), the max-shared carveout when `max_carveout` (all of L1 as shared memory, for
// several large CTAs per SM) and non-portable cluster sizes above 8. Each is set once per
// (kernel, device) and raised when a launch needs more: cudaFuncSetAttribute costs ~1.5-2 µs of
// host time per call on the H200 machine (profiled), and the launches of a captured graph (after
// a warm-up call) then make no attribute calls. Every launcher that needs an attribute calls this.
inline cudaError_t prepare_kernel(const void* fn, int device, size_t smem, int cluster, bool max_carveout = false) {
  if (smem == 0 && !max_carveout && cluster <= 8) return cudaSuccess;  // nothing to set: no lock either
  struct State {
    size_t smem = 0;  // dynamic bytes the attribute allows (0: never set)
    bool carveout = false;
    bool big_cluster = false;
  };
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, State> done;
  const std::lock_guard<std::mutex> lock(mu);
  State& st = done[{fn, device}];
  if (smem > st.smem) {
    const cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    st.smem = smem;
  }
  if (max_carveout && !st.carveout) {
    const cudaError_t err =
        cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) return err;
    st.carveout = true;
  }
  if (cluster > 8 && !st.big_cluster) {
    const cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return err;
    st.big_cluster = true;
  }
  return cudaSuccess;
}

}  // namespace fray
