// Fray: what the tensor-core attention kernels (prefill_sm90.cuh, mla_sm90.cuh) share: exp2 on the
// MUFU unit, the wgmma accumulator fragment seen as (rows, columns) for the online softmax and as
// the register A operand of the next product.
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
