// Fray activation family: gated activations out = act(gate) * up (SiLU, GELU
// erf / tanh) and their launcher template. Torch-free: raw pointers, sizes and
// a stream. See README.md for the design.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/activation/activation.h"
#include "cuda/common/dtype.h"
#include "cuda/common/launch.h"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"

namespace fray {
namespace act_detail {

constexpr int kThreads = 256;   // threads per block (blockDim.x * blockDim.y)
// Vectors of gate (and of up) per thread. Measured on the H200 (silu_mul 16384 x 8192 bf16,
// bench/micro/act_mul_variants.cu): 1 vector per thread 189.0 us, 2: 190.8, 4: 190.7. One vector
// keeps 2048 threads per SM resident (8 blocks, 32 registers) with 64 KB of loads in flight, and
// 4x more, smaller blocks shorten the last partial wave.
constexpr int kMaxItems = 1;
constexpr int kMaxGridY = 65535;

struct KernelArgs {
  const void* gate;
  const void* up;
  void* out;
  int64_t gate_stride;  // row strides in elements
  int64_t up_stride;
  int64_t out_stride;
  int64_t rows;
  int64_t nv;          // vectors per row = d / VEC
  int64_t row_blocks;  // ceil(rows / blockDim.y)
};

// ---------------------------------------------------------------------------
// Activations, fp32 in and out. Two flavours, picked by the output type:
//
// kFast (fp16 / bf16 outputs, whose rounding alone is 2^-11 / 2^-9 relative):
// ex2.approx.ftz and rcp.approx.ftz (1-2 ulp, one MUFU op each), and for the
// exact GELU a closed-form Phi (below): relative errors ~1e-6 (SiLU, tanh
// GELU; mostly the rounding of the exp argument) and <= 3e-7 absolute in Phi,
// far inside the 16-bit tolerances. An element then costs ~13-23 instructions,
// so the kernel stays memory-bound: at 4.3 TB/s the SMs have ~45 issue slots
// per bf16 element, and libdevice's erff alone takes ~28 of them.
// Otherwise (fp32 outputs, rtol 1e-5): expf, IEEE division and erff.
//
// The tanh GELU uses the identity 0.5 (1 + tanh(z)) = 1 / (1 + exp(-2z)): the
// same function, without the cancellation of 1 + tanh(z) for negative z
// (tanhf is exact to ~1 ulp of 1, a large relative error of 1 + tanh(z) once
// that is ~1e-3), and one exp + one division instead of a tanhf.
//
// Fast exact GELU: g * Phi(g), Phi(g) = 0.5 erfc(-g / sqrt(2)), with erfc(t),
// t >= 0, from Abramowitz & Stegun 7.1.26:
//   erfc(t) = (a1 s + a2 s^2 + a3 s^3 + a4 s^4 + a5 s^5) exp(-t^2),  s = 1 / (1 + p t)
// (|error| <= 1.5e-7), and Phi(g) = 1 - 0.5 erfc(|g|/sqrt2) for g >= 0. No
// 1 + erf cancellation for negative g; one ex2, one rcp, ~15 FP ops.
// (Measured in fp32 emulation over [-12, 12]: |Phi error| <= 3e-7.)
// ---------------------------------------------------------------------------
__device__ __forceinline__ float exp2_approx(float x) {  // 2^x; 2^-126 and below flush to 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp_approx(float x) {  // 1/x; 1/inf = 0
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

constexpr float kLog2e = 1.4426950408889634f;

// num / (1 + e^t), t = t2 * ln 2 (the fast form takes t in base 2). e^t = inf
// gives +-0, the limit.
template <bool kFast>
__device__ __forceinline__ float div_one_plus_exp(float num, float t2) {
  if constexpr (kFast) {
    return num * rcp_approx(1.0f + exp2_approx(t2));
  } else {
    return num / (1.0f + exp2f(t2));
  }
}

template <Activation A, bool kFast>
__device__ __forceinline__ float activate(float g) {
  if constexpr (A == Activation::kSilu) {
    if constexpr (kFast) return div_one_plus_exp<true>(g, g * -kLog2e);
    return g / (1.0f + expf(-g));
  } else if constexpr (A == Activation::kGeluTanh) {
    // -2z = g * (-2 sqrt(2/pi) - 2 sqrt(2/pi) 0.044715 g^2), times log2(e) for the fast form
    if constexpr (kFast) {
      return div_one_plus_exp<true>(g, g * fmaf(-0.1029432395800235f, g * g, -2.302208198144325f));
    }
    return g / (1.0f + expf(g * fmaf(-0.07135481627260025f, g * g, -1.5957691216057308f)));
  } else if constexpr (kFast) {
    // A&S 7.1.26 at t = |g| / sqrt(2): s = 1 / (1 + (p / sqrt2) |g|); a_i / 2 so q = 0.5 erfc(t).
    const float s = rcp_approx(fmaf(0.2316418882663604f, fabsf(g), 1.0f));
    float poly = fmaf(0.5307027145f, s, -0.7265760135f);
    poly = fmaf(poly, s, 0.7107068705f);
    poly = fmaf(poly, s, -0.142248368f);
    poly = fmaf(poly, s, 0.127414796f);
    const float q = poly * s * exp2_approx(g * g * -0.7213475204444817f);  // exp(-t^2) = 2^(-g^2 log2e / 2)
    return g * (g >= 0.0f ? 1.0f - q : q);
  } else {
    const float h = 0.5f * g;
    return fmaf(h, erff(g * 0.7071067811865475f), h);
  }
}

// gv = T(act(gv) * uv), in place (the loaded gate registers hold the result).
template <Activation A, typename T, int VEC>
__device__ __forceinline__ void act_mul_vec(AlignedVec<T, VEC>& gv, const AlignedVec<T, VEC>& uv) {
  constexpr bool kFast = !std::is_same_v<T, float>;
  float g[VEC], u[VEC];
  vec_to_float(gv, g);
  vec_to_float(uv, u);
#pragma unroll
  for (int k = 0; k < VEC; ++k) g[k] = activate<A, kFast>(g[k]) * u[k];
  vec_from_float(gv, g);
}

// Minimum resident 256-thread blocks per SM, i.e. register caps: 64 (4 items),
// 40 (2), 32 (1) for 16-bit types; fp32 (expf, IEEE division) 64 / 64 / 40.
// The tightest caps that compile without spills (checked with -Xptxas -v). The
// launcher uses 1 item (kMaxItems); the kernel template takes more.
constexpr int min_blocks(int items, bool fp32) {
  return items == 4 ? 4 : items == 2 ? (fp32 ? 4 : 6) : (fp32 ? 6 : 8);
}

// ---------------------------------------------------------------------------
// One block covers blockDim.y rows x (blockDim.x * ITEMS) vectors of a row:
// thread x holds vectors x, x + tpr, ..., x + (ITEMS-1) * tpr of its row, so
// every item is a fully coalesced warp access, and issues all 2 * ITEMS loads
// before the first use. The grid is sized to the work (x: column chunks,
// y: row blocks); the loops only run more than once past the grid limits.
// No __restrict__: out may alias gate or up exactly (each element is read and
// then written by the same thread).
// ---------------------------------------------------------------------------
template <typename T, Activation A, int VEC, int ITEMS>
__global__ void __launch_bounds__(kThreads, min_blocks(ITEMS, std::is_same_v<T, float>)) act_mul_kernel(const KernelArgs a) {
  using V = AlignedVec<T, VEC>;
  const int tpr = static_cast<int>(blockDim.x);
  const int64_t step = static_cast<int64_t>(tpr) * VEC;  // elements between a thread's items
  const int64_t span = static_cast<int64_t>(tpr) * ITEMS;  // vectors per block and row
  for (int64_t rb = blockIdx.y; rb < a.row_blocks; rb += gridDim.y) {
    const int64_t row = rb * blockDim.y + threadIdx.y;
    if (row >= a.rows) break;
    for (int64_t v0 = blockIdx.x * span + threadIdx.x; v0 < a.nv; v0 += gridDim.x * span) {
      const T* gp = static_cast<const T*>(a.gate) + row * a.gate_stride + v0 * VEC;
      const T* up = static_cast<const T*>(a.up) + row * a.up_stride + v0 * VEC;
      T* op = static_cast<T*>(a.out) + row * a.out_stride + v0 * VEC;
      V g[ITEMS], u[ITEMS];
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        if (v0 + i * tpr < a.nv) {
          load_vec(g[i], gp + i * step);
          load_vec(u[i], up + i * step);
        } else {
          zero_vec(g[i]);
          zero_vec(u[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        if (v0 + i * tpr < a.nv) {
          act_mul_vec<A>(g[i], u[i]);
          store_vec_asm(op + i * step, g[i]);  // one STG.128 (see vec.cuh)
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------
using KernelFn = void (*)(KernelArgs);

constexpr int kNumSlots = 1;  // items 1
constexpr int kernel_slot(int items) { return items == 1 ? 0 : -1; }

// All kernels of one (T, A, VEC), indexed by kernel_slot(). The only place
// kernels are instantiated.
template <typename T, Activation A, int VEC>
struct KernelSet {
  static constexpr KernelFn kKernels[kNumSlots] = {&act_mul_kernel<T, A, VEC, 1>};
};

struct LaunchConfig {
  int items;  // vectors of gate / up per thread
  int tpr;    // threads along a row (blockDim.x)
  int rpb;    // rows per block (blockDim.y)
};

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int next_pow2(int64_t n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// The config table (nv = vectors per row, VEC = 16 / sizeof(T) when
// vectorised, so it folds in the dtype):
//  * items: kMaxItems (1) vector of gate and 1 of up per thread: the most
//    threads, so every SM has warps to overlap the activation math with the
//    loads (see kMaxItems for the measurement).
//  * tpr: a row is split into the fewest 256-thread chunks, balanced (no
//    mostly-empty last chunk), rounded to whole warps; short rows
//    (<= 32 threads) take a power of two and 256 / tpr rows share a block.
constexpr LaunchConfig act_config(int64_t nv) {
  const int items = kMaxItems;
  const int64_t groups = ceil_div(nv, items);  // threads a row needs
  int tpr = 0;
  if (groups > kThreads) {
    const int64_t chunks = ceil_div(groups, kThreads);
    tpr = static_cast<int>(ceil_div(ceil_div(groups, chunks), kWarpSize) * kWarpSize);
  } else if (groups > kWarpSize) {
    tpr = static_cast<int>(ceil_div(groups, kWarpSize) * kWarpSize);
  } else {
    tpr = next_pow2(groups);
  }
  const int rpb = tpr >= kThreads ? 1 : kThreads / tpr;
  return {items, tpr, rpb};
}

constexpr bool act_config_table_ok() {
  for (int64_t nv = 1; nv <= 20000; nv += (nv < 600 ? 1 : 97)) {
    const LaunchConfig c = act_config(nv);
    if (c.tpr < 1 || c.tpr > kThreads || c.tpr * c.rpb > kThreads) return false;
    if (kernel_slot(c.items) < 0) return false;
    if (c.tpr > kWarpSize && c.tpr % kWarpSize != 0) return false;
    if ((c.tpr * c.rpb) % kWarpSize != 0) return false;  // whole warps
  }
  return true;
}
static_assert(act_config_table_ok(), "activation config table violates a kernel constraint");

template <typename T, Activation A, int VEC>
cudaError_t launch_kernel(const KernelArgs& a, const LaunchConfig& c, cudaStream_t stream) {
  const KernelFn fn = KernelSet<T, A, VEC>::kKernels[kernel_slot(c.items)];
  const int64_t chunks = ceil_div(a.nv, static_cast<int64_t>(c.tpr) * c.items);
  const dim3 block(static_cast<unsigned>(c.tpr), static_cast<unsigned>(c.rpb));
  const dim3 grid(static_cast<unsigned>(chunks < 0x7fffffff ? chunks : 0x7fffffff),
                  static_cast<unsigned>(a.row_blocks < kMaxGridY ? a.row_blocks : kMaxGridY));
  fn<<<grid, block, 0, stream>>>(a);
  return launch_error();
}

template <typename T, Activation A>
cudaError_t launch_typed(const ActMulParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr unsigned kAlign = 16;
  // 128-bit path: all three pointers 16-byte aligned, d and every used row
  // stride a multiple of VEC (strides ignored for a single row); else scalar.
  bool vec_ok = p.d % kVec == 0 && is_aligned(p.gate, kAlign) && is_aligned(p.up, kAlign) &&
                is_aligned(p.out, kAlign);
  if (p.rows > 1) {
    vec_ok = vec_ok && p.gate_row_stride % kVec == 0 && p.up_row_stride % kVec == 0 &&
             p.out_row_stride % kVec == 0;
  }
  const int vec = vec_ok ? kVec : 1;

  KernelArgs a{};
  a.gate = p.gate;
  a.up = p.up;
  a.out = p.out;
  a.gate_stride = p.gate_row_stride;
  a.up_stride = p.up_row_stride;
  a.out_stride = p.out_row_stride;
  a.rows = p.rows;
  a.nv = p.d / vec;
  const LaunchConfig c = act_config(a.nv);
  a.row_blocks = ceil_div(a.rows, c.rpb);
  return vec_ok ? launch_kernel<T, A, kVec>(a, c, stream) : launch_kernel<T, A, 1>(a, c, stream);
}

}  // namespace act_detail

// out = act(gate) * up for element type T (float, __half, __nv_bfloat16).
// Enqueues on `stream`; returns cudaErrorInvalidValue for an unknown
// activation, else the launch status. Never throws, never synchronises.
template <typename T>
cudaError_t launch_act_mul(const ActMulParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.d <= 0) return cudaSuccess;
  switch (p.act) {
    case Activation::kSilu: return act_detail::launch_typed<T, Activation::kSilu>(p, stream);
    case Activation::kGeluErf: return act_detail::launch_typed<T, Activation::kGeluErf>(p, stream);
    case Activation::kGeluTanh: return act_detail::launch_typed<T, Activation::kGeluTanh>(p, stream);
    default: return cudaErrorInvalidValue;  // relu / tanh / sigmoid: unary only
  }
}

// Number of kernels launch_act_mul<T> can launch: 3 activations x
// {VEC, scalar} (1 item).
template <typename T>
int act_mul_num_kernels() {
  return 3 * 2 * act_detail::kNumSlots;
}

}  // namespace fray
