// Fray: thread-block-cluster launches (host side of .cu files; needs the CUDA runtime's C++ API).
//
//  * cluster_config   - a cudaLaunchConfig_t for a 1-D cluster, optionally asking for the
//    load-balancing cluster scheduling policy.
//  * launch_ex        - cudaLaunchKernelEx plus the launch-error check every launcher returns.
//  * launch_clustered - a plain launch for cluster <= 1, else a cluster launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

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

}  // namespace fray
