// Fray quant family: non-template entry points. The kernels are compiled by the per-dtype units
// quantize_{f32,f16,bf16}.cu.
#include "cuda/common/dtype_entry.h"
#include "cuda/quant/quant.h"
#include "cuda/quant/quantize.cuh"

namespace fray {

FRAY_DTYPE_ENTRY(quantize, launch_quantize, QuantizeParams)
FRAY_DTYPE_KERNEL_COUNT(quantize_num_kernel_instances, quantize_num_kernels)

}  // namespace fray
