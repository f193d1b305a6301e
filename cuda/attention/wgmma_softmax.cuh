// Fray: what the tensor-core attention kernels (prefill_sm90.cuh, mla_sm90.cuh) share: exp2 on the
// MUFU unit, the wgmma accumulator fragment seen as (rows, columns), one step of the online
// softmax over it, and the fragment as the register A operand of the next product.
#pragma once

#include "cute/tensor.hpp"

namespace fray {
namespace attention {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The accumulator fragment ((2, 2, N/8), MMA_M, MMA_N) as (rows, cols): rows ((2), MMA_M) are the
// fragment's two row halves, cols ((2, N/8), MMA_N) its column pairs (cols 2k and 2k + 1 adjacent).
template <class L>
CUTE_HOST_DEVICE constexpr auto rows_cols(L l) {
  auto v = cute::get<0>(l);
  return cute::make_layout(cute::make_layout(cute::get<1>(v), cute::get<1>(l)),
                           cute::make_layout(cute::get<0>(v), cute::get<2>(v), cute::get<2>(l)));
}

// One key tile of the online softmax (fp32, exp2 with the scale folded in) over S seen as (rows,
// cols) (rows_cols; a row's values sit in the 4 threads of a quad, combined by two shuffles): S
// becomes its exponentials against the rows' new maximum, row_sum moves to that maximum and adds
// them, and corr[i] is what row i of O must be multiplied by to move there. A row that has seen
// only -inf keeps maximum -inf and subtracts 0, so exp2(-inf - -inf) never makes a NaN.
template <class TensorS, int R>
__device__ __forceinline__ void online_softmax(TensorS& S, float (&row_max)[R], float (&row_sum)[R],
                                               float (&corr)[R], float scale_log2) {
  CUTE_UNROLL
  for (int i = 0; i < R; ++i) {
    float mx = row_max[i];
    CUTE_UNROLL
    for (int j = 0; j < cute::size<1>(S); ++j) mx = fmaxf(mx, S(i, j));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
    const float base = mx == -INFINITY ? 0.f : mx * scale_log2;
    corr[i] = row_max[i] == -INFINITY ? 0.f : fast_exp2(row_max[i] * scale_log2 - base);
    row_max[i] = mx;
    float sum = 0.f;
    CUTE_UNROLL
    for (int j = 0; j < cute::size<1>(S); ++j) {
      const float e = fast_exp2(S(i, j) * scale_log2 - base);
      S(i, j) = e;
      sum += e;
    }
    row_sum[i] = row_sum[i] * corr[i] + sum;
  }
}

// The same fragment as the A operand of the next wgmma (k = 16 per step): ((2, 2, 2), MMA_M,
// MMA_K = N/16 * MMA_N). Each 16 columns of the m64nN accumulator hold exactly the values a
// thread supplies for a m64k16 register A operand.
template <class L>
__device__ __forceinline__ constexpr auto acc_as_a(L l) {
  auto v = cute::get<0>(l);
  auto pairs = cute::logical_divide(cute::get<2>(v), cute::Layout<cute::_2>{});  // (2, N/16)
  return cute::make_layout(cute::make_layout(cute::get<0>(v), cute::get<1>(v), cute::get<0>(pairs)),
                           cute::get<1>(l), cute::coalesce(cute::make_layout(cute::get<1>(pairs), cute::get<2>(l))));
}

}  // namespace attention
}  // namespace fray
