// Fray topk family: the launchers behind the generic binder (FrayArgs in; no torch, no pybind11)
// and the planner's queries. Host-only; compiled by the C++ compiler. Every argument check of the
// family happens here (the kernels trust their inputs). Slot order: cuda/topk/topk.h.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/topk/topk.h"
#include "cuda/topk/topk_plan.h"

namespace fray {
namespace topk_api {
namespace {

void check_rows(int64_t rows, int64_t width, int64_t x_row_stride, const char* op) {
  if (rows < 0) {
    throw std::invalid_argument(std::string("fray: ") + op + ": rows must be >= 0, got " + std::to_string(rows));
  }
  if (rows > 1 && x_row_stride < 0) {
    throw std::invalid_argument(std::string("fray: ") + op + ": x_row_stride must be >= 0, got " +
                                std::to_string(x_row_stride));
  }
  if (width < 1) {
    throw std::invalid_argument(std::string("fray: ") + op + ": width must be >= 1, got " + std::to_string(width));
  }
}

}  // namespace

void topk(const FrayArgs& a) {
  require_slots(a, 4, 7, 0, "topk");
  const uint64_t x = a.ptrs[0], values = a.ptrs[1], indices = a.ptrs[2], rank_keys = a.ptrs[3];
  const int64_t x_row_stride = a.ints[0], rows = a.ints[2], width = a.ints[3], k = a.ints[4];
  const int dtype = static_cast<int>(a.ints[1]);
  const bool largest = a.ints[5] != 0, sorted = a.ints[6] != 0;
  check_rows(rows, width, x_row_stride, "topk");
  if (width > kTopkMaxWidth) {
    throw std::invalid_argument("fray: topk: width must be <= " + std::to_string(kTopkMaxWidth) + ", got " +
                                std::to_string(width));
  }
  if (k < 1 || k > width) {
    throw std::invalid_argument("fray: topk: k must be in [1, width = " + std::to_string(width) + "], got " +
                                std::to_string(k));
  }
  if (sorted && k > kTopkMaxSortK) {
    throw std::invalid_argument("fray: topk: sorted output needs k <= " + std::to_string(kTopkMaxSortK) + ", got " +
                                std::to_string(k) + " (sort the index-ordered result instead)");
  }
  if (rank_keys != 0 && sorted) {
    throw std::invalid_argument("fray: topk: rank_keys are written in index order only (sorted must be false)");
  }
  TopkParams p;
  p.x = reinterpret_cast<const void*>(x);
  p.x_row_stride = x_row_stride;
  p.dtype = dtype_from_code(dtype, "x");
  p.rows = rows;
  p.width = width;
  p.k = k;
  p.largest = largest;
  p.sorted = sorted;
  p.values = reinterpret_cast<void*>(values);
  p.indices = reinterpret_cast<int64_t*>(indices);
  p.rank_keys = reinterpret_cast<int64_t*>(rank_keys);
  DeviceGuard guard(a.device);
  check_cuda(fray::topk(p, reinterpret_cast<cudaStream_t>(a.stream)), "topk");
}

void argmax(const FrayArgs& a) {
  require_slots(a, 2, 4, 0, "argmax");
  const uint64_t x = a.ptrs[0], out = a.ptrs[1];
  const int64_t x_row_stride = a.ints[0], rows = a.ints[2], width = a.ints[3];
  const int dtype = static_cast<int>(a.ints[1]);
  check_rows(rows, width, x_row_stride, "argmax");
  if (width > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("fray: argmax: width must be < 2^31, got " + std::to_string(width));
  }
  ArgmaxParams p;
  p.x = reinterpret_cast<const void*>(x);
  p.x_row_stride = x_row_stride;
  p.dtype = dtype_from_code(dtype, "x");
  p.rows = rows;
  p.width = width;
  p.out = reinterpret_cast<int64_t*>(out);
  DeviceGuard guard(a.device);
  check_cuda(fray::argmax(p, reinterpret_cast<cudaStream_t>(a.stream)), "argmax");
}

std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool> topk_plan(int64_t rows, int64_t width,
                                                                                     int64_t k, bool sorted,
                                                                                     int dtype, int num_sms,
                                                                                     const std::vector<int>& max_clusters) {
  const int key_bytes = dtype_from_code(dtype, "x") == DType::kFloat32 ? 4 : 2;
  if (!max_clusters.empty() && max_clusters.size() != 5) {
    throw std::invalid_argument("fray: topk_plan: max_clusters must list 5 counts (cluster sizes 1, 2, 4, 8, 16) or "
                                "none, got " + std::to_string(max_clusters.size()));
  }
  topk_detail::StreamFit fit{};
  for (size_t i = 0; i < max_clusters.size(); ++i) fit.max_clusters[i] = max_clusters[i];
  const topk_detail::TopkConfig c = topk_detail::topk_config(rows, width, k, sorted, key_bytes, num_sms,
                                                             max_clusters.empty() ? nullptr : &fit);
  const int bits = c.stream      ? topk_detail::kStreamRadix
                   : c.big_radix ? topk_detail::kBigRadix
                                 : topk_detail::kSmallRadix;
  return {c.cluster,   c.slice, c.threads, bits, c.sort_size, static_cast<int64_t>(c.smem),
          topk_detail::needs_smem_optin(c.smem), c.stream};
}

std::vector<int> stream_fit(int device_index) {
  DeviceGuard guard(device_index);
  return topk_stream_fit(device_index);
}

std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t> stream_limits() {
  using namespace topk_detail;
  return {kStreamThreads, kStreamMinBlocks,       kStreamCap, static_cast<int64_t>(kSmemPerSm),
          static_cast<int64_t>(kSmemReservedPerBlock), kMaxRegsPerThread,
          static_cast<int64_t>(kStreamStaticSmemBound)};
}

std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t> launch_limits() {
  using namespace topk_detail;
  return {kMaxCluster, kPortableCluster, static_cast<int64_t>(kDefaultSmem), static_cast<int64_t>(kMaxSmemPerBlock),
          static_cast<int64_t>(kStaticSmemBound), kMaxBlocksPerLaunch};
}

int64_t max_width() { return kTopkMaxWidth; }

int64_t max_sort_k() { return kTopkMaxSortK; }

int num_kernel_instances() { return topk_num_kernel_instances(); }

}  // namespace topk_api
}  // namespace fray
