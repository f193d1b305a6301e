// Fray elementwise family: non-template entry points. The kernels are compiled by the
// per-dtype units vector_add_{f32,f16,bf16}.cu (declared extern here).
#include "cuda/elementwise/elementwise.h"

#include "cuda/common/dtype.h"
#include "cuda/elementwise/vector_add.cuh"

namespace fray {

extern template cudaError_t launch_vector_add<float>(const VectorAddParams&, cudaStream_t);
extern template cudaError_t launch_vector_add<__half>(const VectorAddParams&, cudaStream_t);
extern template cudaError_t launch_vector_add<__nv_bfloat16>(const VectorAddParams&, cudaStream_t);

cudaError_t vector_add(DType dtype, const VectorAddParams& p, cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_vector_add<T>(p, stream);
  });
}

}  // namespace fray
