// Fray softmax family: non-template entry points. The kernels are compiled by
// the per-input-dtype units softmax_{f32,f16,bf16}.cu.
#include "cuda/softmax/softmax.h"

#include "cuda/common/dtype_entry.h"
#include "cuda/softmax/softmax.cuh"

namespace fray {

FRAY_DTYPE_ENTRY(softmax_by_dtype, launch_softmax, SoftmaxParams)

cudaError_t softmax(const SoftmaxParams& p, cudaStream_t stream) { return softmax_by_dtype(p.x_dtype, p, stream); }

FRAY_DTYPE_KERNEL_COUNT(softmax_num_kernel_instances, softmax_num_kernels)

}  // namespace fray
