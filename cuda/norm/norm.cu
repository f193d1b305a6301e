// Fray norm family: non-template entry points. The kernels are compiled by the
// per-dtype units rmsnorm_{f32,f16,bf16}.cu and layernorm_{f32,f16,bf16}.cu.
#include "cuda/norm/norm.h"

#include "cuda/common/dtype_entry.h"
#include "cuda/norm/layernorm.cuh"
#include "cuda/norm/rmsnorm.cuh"

namespace fray {

FRAY_DTYPE_ENTRY(rmsnorm, launch_rmsnorm, RmsNormParams)
FRAY_DTYPE_KERNEL_COUNT(rmsnorm_num_kernel_instances, rmsnorm_num_kernels)
FRAY_DTYPE_ENTRY(layernorm, launch_layernorm, LayerNormParams)
FRAY_DTYPE_KERNEL_COUNT(layernorm_num_kernel_instances, layernorm_num_kernels)

}  // namespace fray
