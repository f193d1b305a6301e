// Explicit instantiation of the topk family (topk and argmax) for element type float.
#include "cuda/topk/argmax.cuh"
#include "cuda/topk/topk.cuh"

namespace fray {
template cudaError_t launch_topk<float>(const TopkParams& p, cudaStream_t stream);
template cudaError_t launch_argmax<float>(const ArgmaxParams& p, cudaStream_t stream);

std::vector<int> topk_stream_fit(int device) {
  const topk_detail::StreamFit* f = topk_detail::stream_fit<float>(device, nullptr);
  if (f == nullptr) return {};
  return std::vector<int>(f->max_clusters, f->max_clusters + 5);
}
}  // namespace fray
