// Fray activation family: non-template entry points. The kernels are compiled
// by the per-dtype units act_mul_{f32,f16,bf16}.cu and unary_{f32,f16,bf16}.cu.
#include "cuda/activation/activation.h"

#include "cuda/activation/act_mul.cuh"
#include "cuda/activation/unary.cuh"
#include "cuda/common/dtype_entry.h"

namespace fray {

FRAY_DTYPE_ENTRY(act_mul, launch_act_mul, ActMulParams)
FRAY_DTYPE_KERNEL_COUNT(act_mul_num_kernel_instances, act_mul_num_kernels)
FRAY_DTYPE_ENTRY(unary, launch_unary, UnaryParams)
FRAY_DTYPE_KERNEL_COUNT(unary_num_kernel_instances, unary_num_kernels)

}  // namespace fray
