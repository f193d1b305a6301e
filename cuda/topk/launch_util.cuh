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

using ::fray::kMaxDevices;

// The SM count (read once per device): fray::sm_count (cuda/common/launch.h).
using ::fray::sm_count;

// Function attributes: fray::prepare_kernel (cuda/common/cluster_launch.cuh). The opt-in counts
// the static part too (needs_smem_optin: exactly 48 KB of dynamic memory already needs it); the
// common helper sets the limit for any dynamic size, which covers it.
using ::fray::prepare_kernel;

}  // namespace topk_detail
}  // namespace fray
