// Fray sampling family: non-template entry points (dtype dispatch). The kernels are compiled by
// sample_{f32,bf16}.cu and penalties.cu (declared extern here).
#include "cuda/sampling/sampling.h"

#include "cuda/common/dtype.h"
#include "cuda/sampling/penalties.cuh"
#include "cuda/sampling/philox.cuh"
#include "cuda/sampling/sample.cuh"

namespace fray {

extern template cudaError_t launch_sample<float>(const SampleParams&, cudaStream_t);
extern template cudaError_t launch_sample<__nv_bfloat16>(const SampleParams&, cudaStream_t);
extern template cudaError_t launch_penalties<float>(const PenaltyParams&, cudaStream_t);
extern template cudaError_t launch_penalties<__half>(const PenaltyParams&, cudaStream_t);
extern template cudaError_t launch_penalties<__nv_bfloat16>(const PenaltyParams&, cudaStream_t);

cudaError_t sample(const SampleParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kFloat32: return launch_sample<float>(p, stream);
    case DType::kBFloat16: return launch_sample<__nv_bfloat16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t apply_penalties(const PenaltyParams& p, cudaStream_t stream) {
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_penalties<T>(p, stream);
  });
}

cudaError_t decode_step(const PenaltyParams& pen, const SampleParams& p, cudaStream_t stream) {
  const cudaError_t err = apply_penalties(pen, stream);
  if (err != cudaSuccess) return err;
  return sample(p, stream);
}

int64_t sample_max_width(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return sampling_detail::max_width(4);
    case DType::kBFloat16: return sampling_detail::max_width(2);
    default: return 0;
  }
}

// sample_kernel x {fp32, bf16} + penalty_kernel x {fp32, fp16, bf16}.
int sampling_num_kernel_instances() { return 5; }

void philox4x32_10_host(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
  sampling_detail::philox4x32_10(c, key[0], key[1]);
  for (int i = 0; i < 4; ++i) out[i] = c[i];
}

}  // namespace fray
