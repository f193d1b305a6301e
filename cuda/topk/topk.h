// Fray topk family: host-only API (plain C++; no CUDA compiler needed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/common/dtype.h"
#include "cuda/common/launch_abi.h"

namespace fray {

// Widest row topk takes: a row is held on chip by one thread-block cluster
// (16 CTAs x 64 KB of keys for fp32).
constexpr int64_t kTopkMaxWidth = 262144;
// Largest k the kernel sorts itself (one CTA's shared-memory bitonic sort of
// next_pow2(k) 64-bit keys); larger k with sorted output is the caller's sort.
constexpr int64_t kTopkMaxSortK = 4096;

// Top-k along each of `rows` rows of `width` elements (row stride in elements,
// last dim contiguous; stride 0 repeats one row). Order: NaN above every number
// (first for largest, last for smallest), -0.0 == +0.0, equal values by lower
// index first. values [rows, k] (x's dtype, bits copied from x) and indices
// [rows, k] (int64) are contiguous. sorted: rank order (needs k <= kTopkMaxSortK);
// otherwise the same k entries in increasing index order. rank_keys (optional,
// unsorted only): instead of values and indices, write the int64 rank key
// key << 24 | (2^24 - 1 - index) of each winner (index order); the keys are
// distinct and non-negative, so sorting them in decreasing order gives the rank
// order (how the caller sorts k > kTopkMaxSortK).
struct TopkParams {
  const void* x = nullptr;
  int64_t x_row_stride = 0;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t width = 0;  // 1 .. kTopkMaxWidth
  int64_t k = 0;      // 1 .. width
  bool largest = true;
  bool sorted = true;
  void* values = nullptr;
  int64_t* indices = nullptr;
  int64_t* rank_keys = nullptr;
};

// out[r] = index of the maximum of row r (NaN is the maximum, the first NaN
// wins; ties -> lowest index; -0.0 == +0.0), int64 [rows].
struct ArgmaxParams {
  const void* x = nullptr;
  int64_t x_row_stride = 0;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t width = 0;  // 1 .. 2^31 - 1
  int64_t* out = nullptr;
};

// Enqueue on `stream` (the caller has made the stream's device current). Never
// synchronise, allocate or throw; need no workspace. Return the launch status.
cudaError_t topk(const TopkParams& p, cudaStream_t stream);
cudaError_t argmax(const ArgmaxParams& p, cudaStream_t stream);

// Number of distinct kernels compiled into the library.
int topk_num_kernel_instances();
// Clusters of the streaming kernel the device holds at once, for cluster sizes 1, 2, 4, 8, 16 (0:
// not queried or failed); the plan's StreamFit (topk_plan.h).
std::vector<int> topk_stream_fit(int device);

// The launchers (topk_api.cc), called through the generic binder (cuda/common/binder.h) as
// ext.<name>(ptrs, ints, floats, device, stream); dtype codes 0 fp32, 1 fp16, 2 bf16, bools as
// 0 / 1. Throw std::invalid_argument for bad arguments and std::runtime_error for CUDA errors.
// The planner's queries after them stay ordinary pybind11 functions (not on the launch path).
namespace topk_api {

// topk (rank_keys 0: values and indices; else the rank keys only, sorted must be 0):
//   ptrs   x, values, indices, rank_keys (int64 [rows, k] or 0)
//   ints   x_row_stride, dtype, rows, width, k, largest, sorted
//   floats (none)
void topk(const FrayArgs& a);

// argmax:
//   ptrs   x, out (int64 [rows])
//   ints   x_row_stride, dtype, rows, width
//   floats (none)
void argmax(const FrayArgs& a);

// The launch plan of topk for these arguments (CPU tests check every plan is launchable):
// (cluster CTAs per row, slice elements per CTA, threads per CTA, digit bits, sort size,
// dynamic shared memory bytes, whether the shared-memory opt-in is set before launching,
// whether the streaming kernel runs).
std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool> topk_plan(int64_t rows, int64_t width,
                                                                                     int64_t k, bool sorted,
                                                                                     int dtype, int num_sms,
                                                                                     const std::vector<int>& max_clusters);
// The streaming kernel's constants: (threads per CTA, CTAs per SM its launch bounds and plan
// assume, entries per CTA (also its largest k), shared memory per SM, shared memory the runtime
// reserves per CTA, registers per thread at the launch-bounds cap).
std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t> stream_limits();
// topk_stream_fit on device `device_index`: what the launcher's plan uses.
std::vector<int> stream_fit(int device_index);
// (largest cluster, largest portable cluster, shared memory per block without the opt-in,
// opt-in limit per block (static + dynamic), bound of the kernels' static shared memory,
// most blocks per launch): the limits the plans are checked against.
std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t> launch_limits();
int64_t max_width();
int64_t max_sort_k();
int num_kernel_instances();

}  // namespace topk_api
}  // namespace fray
