// Fray rope family: non-template entry points. The kernels are compiled by the
// per-dtype units rope_{f32,f16,bf16}.cu.
#include "cuda/rope/rope.h"

#include "cuda/common/dtype_entry.h"
#include "cuda/rope/rope.cuh"

namespace fray {

FRAY_DTYPE_ENTRY(rope, launch_rope, RopeParams)
FRAY_DTYPE_KERNEL_COUNT(rope_num_kernel_instances, rope_num_kernels)

}  // namespace fray
