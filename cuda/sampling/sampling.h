// Fray sampling family: host-only API (plain C++; no CUDA compiler needed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/dtype.h"
#include "cuda/common/launch_abi.h"

namespace fray {

// Filtered sampling of one token per row of logits [rows, cols] (row stride in elements, last
// dim contiguous; fp32 or bf16), with the semantics of fray.reference.sampling:
//   temperature 0: argmax (NaN is the maximum, ties -> lowest index), logprob 0;
//   else w = exp((l - max) / T); top-k (0 < k < cols; ties at the threshold kept) -> top-p
//   (0 < p < 1; keep l iff the mass of the kept tokens above l is < p * S) -> min-p (keep
//   w >= min_p) -> one Philox-4x32-10 uniform u from (seed, offset) -> the first kept index
//   (in index order) whose running kept mass exceeds u * total; logprob = log(w / total).
// Every per-row parameter is a pointer to [rows] values or, when the pointer is null, the
// scalar next to it. Masses are summed as 64-bit fixed point (w * 2^31, rounded), so every
// decision is exact and order independent (deterministic for any cluster size); a token whose
// w is below 2^-32 has mass 0 and is never drawn.
struct SampleParams {
  const void* logits = nullptr;
  int64_t row_stride = 0;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  const float* temperature = nullptr;
  float temperature_value = 1.0f;
  const int64_t* top_k = nullptr;
  int64_t top_k_value = 0;
  const float* top_p = nullptr;
  float top_p_value = 1.0f;
  const float* min_p = nullptr;
  float min_p_value = 0.0f;
  const int64_t* seeds = nullptr;
  int64_t seed_value = 0;
  const int64_t* offsets = nullptr;
  int64_t offset_value = 0;
  int64_t* tokens = nullptr;   // [rows]
  float* logprobs = nullptr;   // [rows]
};

// Repetition / presence / frequency penalties in place on logits [rows, cols] (fp32, fp16 or
// bf16): for each distinct id of row b's history token_ids[token_offsets[b]:token_offsets[b+1]]
// (CSR; ids and offsets int32 or int64) seen n times: l = l > 0 ? l / rep : l * rep;
// l = (l - presence) - n * frequency; fp32 math, one rounding. Ids outside [0, cols) are
// ignored; offsets are clamped to [0, num_ids] (memory-safe for any device values).
struct PenaltyParams {
  void* logits = nullptr;
  int64_t row_stride = 0;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* token_ids = nullptr;
  bool ids_int64 = true;
  int64_t num_ids = 0;
  const void* token_offsets = nullptr;  // [rows + 1]
  bool offsets_int64 = true;
  const float* repetition = nullptr;
  float repetition_value = 1.0f;
  const float* presence = nullptr;
  float presence_value = 0.0f;
  const float* frequency = nullptr;
  float frequency_value = 0.0f;
};

// Enqueue on `stream` (the caller has made the stream's device current). Never synchronise,
// allocate or throw; return the launch status. sample: cudaErrorInvalidValue when cols exceeds
// sample_max_width (the row would not fit in one cluster's shared memory).
cudaError_t sample(const SampleParams& p, cudaStream_t stream);
cudaError_t apply_penalties(const PenaltyParams& p, cudaStream_t stream);
// Two launches: the penalties kernel, then the sampling kernel.
cudaError_t decode_step(const PenaltyParams& pen, const SampleParams& p, cudaStream_t stream);

// Widest row sample() takes for a dtype (fp32 393216, bf16 786432); 0 for other dtypes.
int64_t sample_max_width(DType dtype);
int sampling_num_kernel_instances();

// Philox-4x32-10 (host; the kernels use the same function): 4 counter and 2 key words.
void philox4x32_10_host(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

// The launchers (sampling_api.cc), called through the generic binder (cuda/common/binder.h) as
// ext.<name>(ptrs, ints, floats, device, stream). A per-row parameter is a pointer slot (a [rows]
// tensor) or, when that pointer is 0, the value slot of the same name. dtype codes 0 fp32, 1 fp16,
// 2 bf16; bools as 0 / 1. Throw std::invalid_argument for bad arguments and std::runtime_error for
// CUDA errors.
namespace sampling_api {

// sample:
//   ptrs   logits, temperature, top_k, top_p, min_p, seeds, offsets, tokens, logprobs
//   ints   row_stride, dtype, rows, cols, top_k_value, seed_value, offset_value
//   floats temperature_value, top_p_value, min_p_value
void sample(const FrayArgs& a);

// apply_penalties (token_ids / token_offsets int64 when ids_int64 / offsets_int64, else int32):
//   ptrs   logits, token_ids, token_offsets, repetition, presence, frequency
//   ints   row_stride, dtype, rows, cols, ids_int64, num_ids, offsets_int64
//   floats repetition_value, presence_value, frequency_value
void apply_penalties(const FrayArgs& a);

// decode_step: apply_penalties' slots, then sample's after its shared ones:
//   ptrs   logits, token_ids, token_offsets, repetition, presence, frequency,
//          temperature, top_k, top_p, min_p, seeds, offsets, tokens, logprobs
//   ints   row_stride, dtype, rows, cols, ids_int64, num_ids, offsets_int64,
//          top_k_value, seed_value, offset_value
//   floats repetition_value, presence_value, frequency_value, temperature_value, top_p_value, min_p_value
void decode_step(const FrayArgs& a);

int64_t sample_max_width(int dtype);
std::vector<uint32_t> philox(std::vector<uint32_t> counter, std::vector<uint32_t> key);
int num_kernel_instances();

}  // namespace sampling_api
}  // namespace fray
