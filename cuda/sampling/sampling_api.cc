// Fray sampling family: the launchers behind the generic binder (FrayArgs in; no torch, no
// pybind11). Host-only; compiled by the C++ compiler. Slot order: cuda/sampling/sampling.h.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/sampling/sampling.h"

namespace fray {
namespace sampling_api {
namespace {

// Read-only logits (sample) may repeat rows: any row stride >= 0 (0 is what expand() makes).
// Logits written in place (penalties, decode_step) must not overlap: row_stride >= cols.
void check_shape(int64_t rows, int64_t cols, int64_t row_stride, bool writable) {
  const int64_t min_stride = writable ? cols : 0;
  if (rows < 0 || cols < 0 || (rows > 1 && row_stride < min_stride)) {
    throw std::invalid_argument("fray: sampling expects rows >= 0, cols >= 0 and row_stride >= " +
                                std::string(writable ? "cols (logits written in place)" : "0") + ", got rows " +
                                std::to_string(rows) + ", cols " + std::to_string(cols) + ", row_stride " +
                                std::to_string(row_stride));
  }
  if (cols >= (int64_t{1} << 31)) {
    throw std::invalid_argument("fray: sampling supports rows of fewer than 2^31 elements, got " +
                                std::to_string(cols));
  }
}

SampleParams sample_params(uintptr_t logits, int64_t row_stride, int dtype, int64_t rows, int64_t cols,
                           uintptr_t temperature, double temperature_value, uintptr_t top_k, int64_t top_k_value,
                           uintptr_t top_p, double top_p_value, uintptr_t min_p, double min_p_value, uintptr_t seeds,
                           int64_t seed_value, uintptr_t offsets, int64_t offset_value, uintptr_t tokens,
                           uintptr_t logprobs) {
  check_shape(rows, cols, row_stride, /*writable=*/false);
  SampleParams p;
  p.logits = reinterpret_cast<const void*>(logits);
  p.row_stride = row_stride;
  p.dtype = dtype_from_code(dtype, "logits");
  if (p.dtype == DType::kFloat16) throw std::invalid_argument("fray: sample takes fp32 or bf16 logits, got fp16");
  p.rows = rows;
  p.cols = cols;
  if (cols > fray::sample_max_width(p.dtype)) {
    throw std::invalid_argument("fray: sample (CUDA) takes rows of up to " +
                                std::to_string(fray::sample_max_width(p.dtype)) + " " + dtype_name(p.dtype) +
                                " logits, got " + std::to_string(cols));
  }
  p.temperature = reinterpret_cast<const float*>(temperature);
  p.temperature_value = static_cast<float>(temperature_value);
  p.top_k = reinterpret_cast<const int64_t*>(top_k);
  p.top_k_value = top_k_value;
  p.top_p = reinterpret_cast<const float*>(top_p);
  p.top_p_value = static_cast<float>(top_p_value);
  p.min_p = reinterpret_cast<const float*>(min_p);
  p.min_p_value = static_cast<float>(min_p_value);
  p.seeds = reinterpret_cast<const int64_t*>(seeds);
  p.seed_value = seed_value;
  p.offsets = reinterpret_cast<const int64_t*>(offsets);
  p.offset_value = offset_value;
  p.tokens = reinterpret_cast<int64_t*>(tokens);
  p.logprobs = reinterpret_cast<float*>(logprobs);
  if (rows > 0 && (p.tokens == nullptr || p.logprobs == nullptr)) {
    throw std::invalid_argument("fray: sample needs tokens and logprobs buffers");
  }
  return p;
}

PenaltyParams penalty_params(uintptr_t logits, int64_t row_stride, int dtype, int64_t rows, int64_t cols,
                             uintptr_t token_ids, bool ids_int64, int64_t num_ids, uintptr_t token_offsets,
                             bool offsets_int64, uintptr_t repetition, double repetition_value, uintptr_t presence,
                             double presence_value, uintptr_t frequency, double frequency_value) {
  check_shape(rows, cols, row_stride, /*writable=*/true);
  if (num_ids < 0) throw std::invalid_argument("fray: apply_penalties num_ids must be >= 0");
  if (rows > 0 && token_offsets == 0) throw std::invalid_argument("fray: apply_penalties needs token_offsets");
  if (num_ids > 0 && token_ids == 0) throw std::invalid_argument("fray: apply_penalties needs token_ids");
  PenaltyParams p;
  p.logits = reinterpret_cast<void*>(logits);
  p.row_stride = row_stride;
  p.dtype = dtype_from_code(dtype, "logits");
  p.rows = rows;
  p.cols = cols;
  p.token_ids = reinterpret_cast<const void*>(token_ids);
  p.ids_int64 = ids_int64;
  p.num_ids = num_ids;
  p.token_offsets = reinterpret_cast<const void*>(token_offsets);
  p.offsets_int64 = offsets_int64;
  p.repetition = reinterpret_cast<const float*>(repetition);
  p.repetition_value = static_cast<float>(repetition_value);
  p.presence = reinterpret_cast<const float*>(presence);
  p.presence_value = static_cast<float>(presence_value);
  p.frequency = reinterpret_cast<const float*>(frequency);
  p.frequency_value = static_cast<float>(frequency_value);
  return p;
}

// The slots of SampleParams / PenaltyParams after the shared (logits, row_stride, dtype, rows,
// cols) = (ptrs[0], ints[0..3]); decode_step's record is the penalties' slots followed by the
// sampling ones (cuda/sampling/sampling.h), so both read through the same two functions.
SampleParams sample_from(const FrayArgs& a, int pi, int ii, int fi) {
  const uint64_t* q = a.ptrs + pi;
  const int64_t* n = a.ints + ii;
  const double* f = a.floats + fi;
  return sample_params(a.ptrs[0], a.ints[0], static_cast<int>(a.ints[1]), a.ints[2], a.ints[3], q[0], f[0], q[1],
                       n[0], q[2], f[1], q[3], f[2], q[4], n[1], q[5], n[2], q[6], q[7]);
}

PenaltyParams penalties_from(const FrayArgs& a) {
  const uint64_t* q = a.ptrs;
  const int64_t* n = a.ints;
  const double* f = a.floats;
  return penalty_params(q[0], n[0], static_cast<int>(n[1]), n[2], n[3], q[1], n[4] != 0, n[5], q[2], n[6] != 0, q[3],
                        f[0], q[4], f[1], q[5], f[2]);
}

}  // namespace

void sample(const FrayArgs& a) {
  require_slots(a, 9, 7, 3, "sample");
  const SampleParams p = sample_from(a, 1, 4, 0);
  DeviceGuard guard(a.device);
  check_cuda(fray::sample(p, reinterpret_cast<cudaStream_t>(a.stream)), "sample");
}

void apply_penalties(const FrayArgs& a) {
  require_slots(a, 6, 7, 3, "apply_penalties");
  const PenaltyParams p = penalties_from(a);
  DeviceGuard guard(a.device);
  check_cuda(fray::apply_penalties(p, reinterpret_cast<cudaStream_t>(a.stream)), "apply_penalties");
}

void decode_step(const FrayArgs& a) {
  require_slots(a, 14, 10, 6, "decode_step");
  // Both parameter sets are checked before anything is enqueued.
  const PenaltyParams pen = penalties_from(a);
  const SampleParams p = sample_from(a, 6, 7, 3);
  DeviceGuard guard(a.device);
  check_cuda(fray::decode_step(pen, p, reinterpret_cast<cudaStream_t>(a.stream)), "decode_step");
}

int64_t sample_max_width(int dtype) { return fray::sample_max_width(dtype_from_code(dtype, "logits")); }

std::vector<uint32_t> philox(std::vector<uint32_t> counter, std::vector<uint32_t> key) {
  if (counter.size() != 4 || key.size() != 2) {
    throw std::invalid_argument("fray: philox takes 4 counter words and 2 key words");
  }
  uint32_t out[4];
  philox4x32_10_host(counter.data(), key.data(), out);
  return std::vector<uint32_t>(out, out + 4);
}

int num_kernel_instances() { return sampling_num_kernel_instances(); }

}  // namespace sampling_api
}  // namespace fray
