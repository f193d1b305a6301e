// Fray sampling family: repetition / presence / frequency penalties, in place, one block per
// row. Torch-free: raw pointers, sizes and a stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/common/vec.cuh"
#include "cuda/sampling/sampling.h"

namespace fray {
namespace sampling_detail {

constexpr int kPenaltyThreads = 256;
// Distinct ids of a row are counted in a shared-memory hash table (open addressing, linear
// probing) of 4096 (id, count) slots, 32 KB: rows of up to 2048 history entries (load factor
// <= 1/2) need O(history) work, and the penalised logits are written once per distinct id.
// Longer histories count the ids of 8192-wide id ranges in turn (one pass over the history per
// range): O(history x vocab / 8192), no capacity limit and no workspace.
constexpr int kHashSlots = 4096;
constexpr int kRangeIds = 2 * kHashSlots;
constexpr uint32_t kEmptySlot = 0xffffffffu;  // never an id: ids are < cols < 2^31

struct PenaltyArgs {
  void* logits;
  int64_t stride;
  int64_t cols;
  const void* ids;
  const void* offsets;
  int64_t num_ids;
  const float* repetition;
  const float* presence;
  const float* frequency;
  float repetition_value;
  float presence_value;
  float frequency_value;
  int ids_int64;
  int offsets_int64;
};

__device__ __forceinline__ int64_t load_index(const void* p, int64_t i, int is64) {
  return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

template <typename T>
__global__ void __launch_bounds__(kPenaltyThreads) penalty_kernel(const PenaltyArgs a) {
  __shared__ uint32_t table[2 * kHashSlots];
  const int64_t row = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  // Offsets live on the device and are not validated (that would need a host sync): clamped
  // to the id buffer so no value can make the kernel read outside it.
  int64_t start = load_index(a.offsets, row, a.offsets_int64);
  int64_t end = load_index(a.offsets, row + 1, a.offsets_int64);
  start = min(max(start, int64_t{0}), a.num_ids);
  end = min(max(end, start), a.num_ids);
  const int64_t len = end - start;
  if (len == 0) return;
  const float rep = a.repetition ? a.repetition[row] : a.repetition_value;
  const float pres = a.presence ? a.presence[row] : a.presence_value;
  const float freq = a.frequency ? a.frequency[row] : a.frequency_value;
  T* x = static_cast<T*>(a.logits) + row * a.stride;
  // The documented rule, (rep(l) - presence) - n * frequency, each step rounded in fp32 (the
  // products through __fmul_rn, which nvcc never contracts into an FMA with the subtraction after
  // it: a contracted l * rep - presence or (..) - n * frequency differs from the rule by an ulp).
  auto apply = [&](int64_t id, uint32_t count) {
    float l = to_float(x[id]);
    l = l > 0.0f ? l / rep : __fmul_rn(l, rep);
    l = (l - pres) - __fmul_rn(static_cast<float>(count), freq);
    x[id] = from_float<T>(l);
  };

  if (len <= kHashSlots / 2) {
    uint32_t* keys = table;
    uint32_t* counts = table + kHashSlots;
    for (int i = tid; i < kHashSlots; i += kPenaltyThreads) {
      keys[i] = kEmptySlot;
      counts[i] = 0u;
    }
    __syncthreads();
    for (int64_t i = tid; i < len; i += kPenaltyThreads) {
      const int64_t id = load_index(a.ids, start + i, a.ids_int64);
      if (id < 0 || id >= a.cols) continue;
      const uint32_t key = static_cast<uint32_t>(id);
      uint32_t s = (key * 2654435761u) >> (32 - 12);  // Knuth's multiplicative hash, 12 bits
      static_assert(kHashSlots == 1 << 12, "hash width");
      while (true) {
        const uint32_t prev = atomicCAS(&keys[s], kEmptySlot, key);
        if (prev == kEmptySlot || prev == key) {
          atomicAdd(&counts[s], 1u);
          break;
        }
        s = (s + 1u) & (kHashSlots - 1);
      }
    }
    __syncthreads();
    for (int i = tid; i < kHashSlots; i += kPenaltyThreads) {
      const uint32_t key = keys[i];
      if (key != kEmptySlot) apply(key, counts[i]);
    }
    return;
  }

  for (int64_t base = 0; base < a.cols; base += kRangeIds) {
    for (int i = tid; i < kRangeIds; i += kPenaltyThreads) table[i] = 0u;
    __syncthreads();
    for (int64_t i = tid; i < len; i += kPenaltyThreads) {
      const int64_t id = load_index(a.ids, start + i, a.ids_int64);
      if (id >= base && id < base + kRangeIds && id < a.cols) atomicAdd(&table[id - base], 1u);
    }
    __syncthreads();
    for (int i = tid; i < kRangeIds; i += kPenaltyThreads) {
      const uint32_t count = table[i];
      if (count) apply(base + i, count);
    }
    __syncthreads();
  }
}

template <typename T>
cudaError_t launch_penalties_typed(const PenaltyParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.cols <= 0 || p.num_ids <= 0) return cudaSuccess;
  PenaltyArgs a{};
  a.logits = p.logits;
  a.stride = p.row_stride;
  a.cols = p.cols;
  a.ids = p.token_ids;
  a.offsets = p.token_offsets;
  a.num_ids = p.num_ids;
  a.repetition = p.repetition;
  a.presence = p.presence;
  a.frequency = p.frequency;
  a.repetition_value = p.repetition_value;
  a.presence_value = p.presence_value;
  a.frequency_value = p.frequency_value;
  a.ids_int64 = p.ids_int64 ? 1 : 0;
  a.offsets_int64 = p.offsets_int64 ? 1 : 0;
  constexpr int64_t kMaxGrid = (int64_t{1} << 31) - 1;
  for (int64_t done = 0; done < p.rows; done += kMaxGrid) {
    const int64_t rows = p.rows - done < kMaxGrid ? p.rows - done : kMaxGrid;
    PenaltyArgs part = a;
    part.logits = static_cast<T*>(p.logits) + done * p.row_stride;
    part.offsets = static_cast<const char*>(p.token_offsets) + done * (p.offsets_int64 ? 8 : 4);
    part.repetition = p.repetition ? p.repetition + done : nullptr;
    part.presence = p.presence ? p.presence + done : nullptr;
    part.frequency = p.frequency ? p.frequency + done : nullptr;
    penalty_kernel<T><<<dim3(static_cast<unsigned>(rows)), dim3(kPenaltyThreads), 0, stream>>>(part);
    const cudaError_t err = launch_error();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace sampling_detail

template <typename T>
cudaError_t launch_penalties(const PenaltyParams& p, cudaStream_t stream) {
  return sampling_detail::launch_penalties_typed<T>(p, stream);
}

}  // namespace fray
