// Fray elementwise family: non-template entry points. The kernels are compiled by the
// per-dtype units {vector_add,mul,axpy}_{f32,f16,bf16}.cu.
#include "cuda/elementwise/elementwise.h"

#include "cuda/common/dtype_entry.h"
#include "cuda/elementwise/axpy.cuh"
#include "cuda/elementwise/mul.cuh"
#include "cuda/elementwise/vector_add.cuh"

namespace fray {

FRAY_DTYPE_ENTRY(vector_add, launch_vector_add, VectorAddParams)
FRAY_DTYPE_ENTRY(mul, launch_mul, MulParams)
FRAY_DTYPE_ENTRY(axpy, launch_axpy, AxpyParams)

}  // namespace fray
