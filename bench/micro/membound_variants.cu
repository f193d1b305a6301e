// Memory-bound bf16 micro-experiment (bench/NOTES.md, "Memory-bound families (issue 3)"):
// softmax [rows x cols] bf16 -> bf16 and silu_mul (x = [rows, 2 d] gate | up -> out [rows, d])
// kernel variants, built as a shared library and driven from Python
// (bench/micro/membound_variants.py) so that they are timed in the same process and with the same
// method (triton.testing.do_bench, L2 flushed) as the peers (Liger, torch.compile, fray).
//
// Build (repo root): bash bench/micro/build_membound.sh [OUT.so]
//
// C ABI (all sizes and strides in elements; stream = a raw cudaStream_t, may be null):
//   int mb_softmax_count(void);  const char* mb_softmax_name(int v);
//   int mb_softmax(int v, const void* x, void* y, long long rows, long long cols,
//                  long long x_stride, long long y_stride, int blocks_per_sm, void* stream);
//   int mb_silu_count(void);     const char* mb_silu_name(int v);
//   int mb_silu(int v, const void* x, void* out, long long rows, long long d,
//               long long x_stride, long long out_stride, int blocks_per_sm, void* stream);
//     (gate = x[r, 0:d], up = x[r, d:2d])
//   int mb_softmax_attr(int v, int* regs, int* local_bytes, int* threads, int* blocks_per_sm);
//   int mb_silu_attr(int v, int* regs, int* local_bytes, int* threads, int* blocks_per_sm);
// blocks_per_sm: persistent variants only (<= 0: the occupancy maximum); ignored otherwise.
// Return codes: 0 ok, 1 shape the variant does not support, 2 misaligned pointer / stride,
// 3 unknown variant, 100 + cudaError_t for CUDA errors.
//
// All variants: bf16 in, bf16 out, fp32 math, exp as ex2.approx.ftz, one rounding to bf16.
// Inputs are only read (x and y must not alias: the .nc loads assume x is not written).
//
// Measured on the H200 (membound_variants.py, do_bench medians of 3 interleaved rounds, L2 flushed):
// softmax 16384x8192: Liger 132.4-133.0 us, fray.cuda 132.0-132.8; in this library (output
// allocated right after x) the shipped kernel 133.4-134.0, a.512x2.ld.st.2red 133.8-133.9,
// c.128x8.ld.st 134.3-134.9, b.256x4.ld.st 135.1-135.8, d.warp.ld.st 136.1-136.9; st.global.cs
// stores cost 1-2 us, .nc loads 7-13 us (LDG...CONSTANT), .ca / .cg loads nothing, persistent
// grids 9-24 us. Output placement alone: the shipped kernel 134.0 us into the default output,
// 131.5-132.4 into a separately allocated buffer (Liger 133.0 in the same rounds).
// silu_mul 16384x8192: every 1-vector-per-thread variant, torch.compile, fray.cuda and Liger within
// 188.3-189.7 us (4.25-4.28 TB/s); 2 vectors per thread +2 us, .nc loads +10 us, persistent +14 us.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

// The shipped kernels, as controls inside the same library (bf16 -> bf16 instances only).
#include "cuda/activation/act_mul.cuh"
#include "cuda/softmax/softmax.cuh"

namespace mb {

// ---------------------------------------------------------------------------------------------
// Primitives
// ---------------------------------------------------------------------------------------------
constexpr float kLog2e = 1.4426950408889634f;
constexpr uint32_t kNegInfBf2 = 0xff80ff80u;  // two bf16 -inf

// Load flavours (SASS they become on sm_90a, nvcc 13.0):
//   kLdPlain  C++ uint4 load                          LDG.E.128 (weak)
//   kLdNc     ld.global.nc.L1::no_allocate            LDG.E.NA.128.CONSTANT (read-only path)
//   kLdNc256  kLdNc + .L2::256B prefetch              LDG.E.NA.LTC256B.128.CONSTANT
//   kLdCa     ld.global.ca (Triton's / Liger's ".ca") LDG.E.128.STRONG.SM
//   kLdCg     ld.global.cg                            LDG.E.128.STRONG.GPU
//   kLdNa     ld.global.L1::no_allocate (coherent)    LDG.E.NA.128
//   kLdCa256  kLdCa + .L2::256B                       LDG.E.LTC256B.128.STRONG.SM
enum Ld { kLdPlain = 0, kLdNc = 1, kLdNc256 = 2, kLdCa = 3, kLdCg = 4, kLdNa = 5, kLdCa256 = 6 };
enum St { kStPlain = 0, kStCs = 1 };                 // st.global | st.global.cs

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float ninf() { return __int_as_float(0xff800000); }
// The exponent shift of a max: 0 while the max is -inf (a thread / row with only masked values),
// so that exp2(-inf - shift) = 0 instead of NaN.
__device__ __forceinline__ float shift_of(float m) { return m == ninf() ? 0.0f : m; }

// bf16 pair (low element in the low half) -> floats; exact.
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
// The same through PRMT, for a second pass over packed registers: a different instruction, so no
// compiler merges it with the first pass's unpack and keeps all the unpacked floats live.
__device__ __forceinline__ float bf_lo_p(uint32_t w) {
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, 0x1044;" : "=r"(r) : "r"(w));
  return __uint_as_float(r);
}
__device__ __forceinline__ float bf_hi_p(uint32_t w) {
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, 0x3244;" : "=r"(r) : "r"(w));
  return __uint_as_float(r);
}
// Two floats -> bf16 pair, round to nearest even (one cvt.rn.bf16x2.f32).
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ uint32_t word(const uint4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

template <int LD>
__device__ __forceinline__ uint4 ld16(const void* p) {
  uint4 r;
  if constexpr (LD == kLdPlain) {
    r = *static_cast<const uint4*>(p);
  } else if constexpr (LD == kLdNc) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
  } else if constexpr (LD == kLdNc256) {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
  } else if constexpr (LD == kLdCa) {
    asm volatile("ld.global.ca.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  } else if constexpr (LD == kLdCg) {
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  } else if constexpr (LD == kLdNa) {
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  } else {
    static_assert(LD == kLdCa256, "ld16: unknown load flavour");
    asm volatile("ld.global.ca.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  }
  return r;
}

// Inline-PTX vector stores (one STG.128, never split).
template <int ST>
__device__ __forceinline__ void st16(void* p, uint4 v) {
  if constexpr (ST == kStPlain) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  } else {
    asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
}

__device__ __forceinline__ float warp_max(float v, int width = 32) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (o < width) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  return v;
}
__device__ __forceinline__ float warp_sum(float v, int width = 32) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (o < width) v += __shfl_xor_sync(0xffffffffu, v, o);
  }
  return v;
}
// (max, sum of exp2((x - shift(max)) * scale)) states merged over aligned groups of `width` lanes.
__device__ __forceinline__ void warp_merge(float& m, float& s, float scale, int width = 32) {
  const float g = warp_max(m, width);
  s = warp_sum(s * ex2((m - shift_of(g)) * scale), width);
  m = g;
}

// Block-wide reductions for blocks of NW warps (NW a power of two <= 32). One __syncthreads each;
// every thread gets the result. The buffers are read after the barrier, so consecutive calls
// must use different buffers (or have a barrier in between).
template <int NW>
__device__ __forceinline__ void block_merge(float& m, float& s, float scale, float* rm, float* rs) {
  warp_merge(m, s, scale);
  if constexpr (NW > 1) {
    const int lane = threadIdx.x & 31;
    if (lane == 0) {
      rm[threadIdx.x >> 5] = m;
      rs[threadIdx.x >> 5] = s;
    }
    __syncthreads();
    m = rm[lane & (NW - 1)];  // every aligned group of NW lanes holds all NW states
    s = rs[lane & (NW - 1)];
    warp_merge(m, s, scale, NW);
  }
}
// Block max (kMax) or sum of v over NW warps; r: NW floats of shared memory.
template <int NW, bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* r) {
  v = kMax ? warp_max(v) : warp_sum(v);
  if constexpr (NW > 1) {
    if ((threadIdx.x & 31) == 0) r[threadIdx.x >> 5] = v;
    __syncthreads();
    const float w = r[threadIdx.x & (NW - 1)];
    v = kMax ? warp_max(w, NW) : warp_sum(w, NW);
  }
  return v;
}
template <int NW>
__device__ __forceinline__ float block_max(float m, float* r) {
  return block_reduce<NW, true>(m, r);
}
template <int NW>
__device__ __forceinline__ float block_sum(float s, float* r) {
  return block_reduce<NW, false>(s, r);
}

// ---------------------------------------------------------------------------------------------
// Softmax
// ---------------------------------------------------------------------------------------------
struct SmArgs {
  const uint16_t* x;
  uint16_t* y;
  long long rows;
  long long nv;  // 16-byte vectors per row = cols / 8
  long long xs;  // row strides in elements
  long long ys;
  float scale;   // log2(e)
};

// Loads the ITEMS vectors tid + i * T of `row` (masked ones: -inf).
template <int T, int ITEMS, int LD>
__device__ __forceinline__ void load_row(uint4 (&v)[ITEMS], const SmArgs& a, long long row, int tid) {
  const uint16_t* xp = a.x + row * a.xs;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int j = tid + i * T;
    if (j < a.nv) {
      v[i] = ld16<LD>(xp + static_cast<long long>(j) * 8);
    } else {
      v[i] = make_uint4(kNegInfBf2, kNegInfBf2, kNegInfBf2, kNegInfBf2);
    }
  }
}

// Unpacks the thread's ITEMS vectors into f (fp32); returns their max.
template <int ITEMS>
__device__ __forceinline__ float unpack_max(const uint4 (&v)[ITEMS], float (&f)[ITEMS][8]) {
  float m0 = ninf(), m1 = ninf();
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f[i][2 * k] = bf_lo(word(v[i], k));
      f[i][2 * k + 1] = bf_hi(word(v[i], k));
      m0 = fmaxf(m0, f[i][2 * k]);
      m1 = fmaxf(m1, f[i][2 * k + 1]);
    }
  }
  return fmaxf(m0, m1);
}

// f = exp2((f - shift(m)) * scale) in place; returns their sum.
template <int ITEMS>
__device__ __forceinline__ float exp_sum(float (&f)[ITEMS][8], float m, float scale) {
  const float nsh = -shift_of(m) * scale;
  float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
      f[i][k] = ex2(fmaf(f[i][k], scale, nsh));
      f[i][k + 1] = ex2(fmaf(f[i][k + 1], scale, nsh));
      s0 += f[i][k];
      s1 += f[i][k + 1];
    }
  }
  return s0 + s1;
}

// Own-max exponentials (the shipped kernel's scheme): f = exp2((x - shift(m_own)) * scale) kept as
// fp32, s = their sum; returns m_own.
template <int ITEMS>
__device__ __forceinline__ float own_exp(const uint4 (&v)[ITEMS], float (&f)[ITEMS][8], float& s, float scale) {
  const float m = unpack_max<ITEMS>(v, f);
  s = exp_sum<ITEMS>(f, m, scale);
  return m;
}

template <int T, int ITEMS, int ST>
__device__ __forceinline__ void store_row(const float (&f)[ITEMS][8], float factor, const SmArgs& a, long long row,
                                          int tid) {
  uint16_t* yp = a.y + row * a.ys;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int j = tid + i * T;
    if (j < a.nv) {
      uint4 o;
      o.x = pack_bf2(f[i][0] * factor, f[i][1] * factor);
      o.y = pack_bf2(f[i][2] * factor, f[i][3] * factor);
      o.z = pack_bf2(f[i][4] * factor, f[i][5] * factor);
      o.w = pack_bf2(f[i][6] * factor, f[i][7] * factor);
      st16<ST>(yp + static_cast<long long>(j) * 8, o);
    }
  }
}

// (a), (b), (c): one row per block of T threads, thread tid holding vectors tid + i * T.
// TRICK: each thread exponentiates against its own max, one merged (max, sum) reduction and one
// rescale (the shipped scheme). Otherwise (Liger-like): block max, then exponentials against the
// row max, then block sum (two barriers).
template <int T, int ITEMS, int LD, int ST, bool TRICK, int MINB>
__global__ void __launch_bounds__(T, MINB) sm_block_kernel(const SmArgs a) {
  constexpr int NW = T / 32;
  __shared__ float red0[NW];
  __shared__ float red1[NW];
  const long long row = blockIdx.x;
  if (row >= a.rows) return;  // block-uniform
  const int tid = static_cast<int>(threadIdx.x);
  uint4 v[ITEMS];
  load_row<T, ITEMS, LD>(v, a, row, tid);
  float f[ITEMS][8];
  float factor;
  if constexpr (TRICK) {
    float s;
    const float m_own = own_exp<ITEMS>(v, f, s, a.scale);
    float m = m_own;
    block_merge<NW>(m, s, a.scale, red0, red1);
    factor = ex2((m_own - shift_of(m)) * a.scale) / s;
  } else {
    const float m = block_max<NW>(unpack_max<ITEMS>(v, f), red0);
    factor = 1.0f / block_sum<NW>(exp_sum<ITEMS>(f, m, a.scale), red1);
  }
  store_row<T, ITEMS, ST>(f, factor, a, row, tid);
}

// (d) warp per row: lane l holds vectors l + 32 i (i < KV) as packed bf16 (4 registers each).
// Pass 1: packed max (max.bf16x2); pass 2: sum of exp2 against the row max; pass 3 recomputes
// y = exp2(x * scale - max * scale - log2(sum)) (the division folded into the exponent) from
// the packed registers. Warp shuffles only, no barrier.
template <int WPB, int KV, int LD, int ST, int MINB>
__global__ void __launch_bounds__(WPB * 32, MINB) sm_warp_kernel(const SmArgs a) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const long long row = static_cast<long long>(blockIdx.x) * WPB + (threadIdx.x >> 5);
  if (row >= a.rows) return;  // warp-uniform
  uint4 v[KV];
  load_row<32, KV, LD>(v, a, row, lane);

  __nv_bfloat162 mx[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t w = kNegInfBf2;
    mx[k] = *reinterpret_cast<const __nv_bfloat162*>(&w);
  }
#pragma unroll
  for (int i = 0; i < KV; ++i) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t w = word(v[i], k);
      mx[k] = __hmax2(mx[k], *reinterpret_cast<const __nv_bfloat162*>(&w));
    }
  }
  mx[0] = __hmax2(__hmax2(mx[0], mx[1]), __hmax2(mx[2], mx[3]));
  const uint32_t mw = *reinterpret_cast<const uint32_t*>(&mx[0]);
  const float m = warp_max(fmaxf(bf_lo(mw), bf_hi(mw)));
  const float scale = a.scale;
  const float nsh = -shift_of(m) * scale;

  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < KV; ++i) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t w = word(v[i], k);
      s[k] += ex2(fmaf(bf_lo(w), scale, nsh)) + ex2(fmaf(bf_hi(w), scale, nsh));
    }
  }
  const float sum = warp_sum((s[0] + s[1]) + (s[2] + s[3]));
  const float nsh2 = nsh - lg2(sum);

  uint16_t* yp = a.y + row * a.ys;
#pragma unroll
  for (int i = 0; i < KV; ++i) {
    const int j = lane + i * 32;
    if (j < a.nv) {
      uint4 o;
      o.x = pack_bf2(ex2(fmaf(bf_lo_p(v[i].x), scale, nsh2)), ex2(fmaf(bf_hi_p(v[i].x), scale, nsh2)));
      o.y = pack_bf2(ex2(fmaf(bf_lo_p(v[i].y), scale, nsh2)), ex2(fmaf(bf_hi_p(v[i].y), scale, nsh2)));
      o.z = pack_bf2(ex2(fmaf(bf_lo_p(v[i].z), scale, nsh2)), ex2(fmaf(bf_hi_p(v[i].z), scale, nsh2)));
      o.w = pack_bf2(ex2(fmaf(bf_lo_p(v[i].w), scale, nsh2)), ex2(fmaf(bf_hi_p(v[i].w), scale, nsh2)));
      st16<ST>(yp + static_cast<long long>(j) * 8, o);
    }
  }
}

// (e) persistent: gridDim.x blocks walk rows blockIdx.x, + gridDim.x, ...; the next row's loads
// are issued (into registers) before the current row is reduced and stored. Own-max scheme;
// ping-pong reduction buffers (one barrier per row).
template <int T, int ITEMS, int LD, int ST, int MINB>
__global__ void __launch_bounds__(T, MINB) sm_persist_kernel(const SmArgs a) {
  constexpr int NW = T / 32;
  __shared__ float rm[2][NW];
  __shared__ float rs[2][NW];
  const int tid = static_cast<int>(threadIdx.x);
  long long row = blockIdx.x;
  if (row >= a.rows) return;
  uint4 cur[ITEMS];
  load_row<T, ITEMS, LD>(cur, a, row, tid);
  int par = 0;
  for (; row < a.rows; row += gridDim.x) {
    const long long next = row + gridDim.x;
    uint4 nxt[ITEMS];
    if (next < a.rows) {
      load_row<T, ITEMS, LD>(nxt, a, next, tid);
    } else {
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) nxt[i] = cur[i];
    }
    float f[ITEMS][8];
    float s;
    const float m_own = own_exp<ITEMS>(cur, f, s, a.scale);
    float m = m_own;
    block_merge<NW>(m, s, a.scale, rm[par], rs[par]);
    const float factor = ex2((m_own - shift_of(m)) * a.scale) / s;
    store_row<T, ITEMS, ST>(f, factor, a, row, tid);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) cur[i] = nxt[i];
    par ^= 1;
  }
}

// ---------------------------------------------------------------------------------------------
// silu_mul: out = bf16(silu(gate) * up), silu(g) = g / (1 + 2^(-g log2 e)) (ex2 + rcp approx)
// ---------------------------------------------------------------------------------------------
struct SiluArgs {
  const uint16_t* x;
  uint16_t* y;
  long long rows;
  long long nv;      // vectors per output row = d / 8
  long long xs;      // row strides in elements
  long long ys;
  long long up_off;  // elements from gate to up (= d)
};

__device__ __forceinline__ float silu_mul1(float g, float u) { return g * rcp(1.0f + ex2(g * -kLog2e)) * u; }

__device__ __forceinline__ uint4 silu_vec(const uint4& g, const uint4& u) {
  uint4 o;
  o.x = pack_bf2(silu_mul1(bf_lo(g.x), bf_lo(u.x)), silu_mul1(bf_hi(g.x), bf_hi(u.x)));
  o.y = pack_bf2(silu_mul1(bf_lo(g.y), bf_lo(u.y)), silu_mul1(bf_hi(g.y), bf_hi(u.y)));
  o.z = pack_bf2(silu_mul1(bf_lo(g.z), bf_lo(u.z)), silu_mul1(bf_hi(g.z), bf_hi(u.z)));
  o.w = pack_bf2(silu_mul1(bf_lo(g.w), bf_lo(u.w)), silu_mul1(bf_hi(g.w), bf_hi(u.w)));
  return o;
}

// (a)-(d): grid (ceil(nv / (T * ITEMS)), min(rows, 65535)); thread handles vectors
// blockIdx.x * T * ITEMS + tid + i * T of row blockIdx.y (+ gridDim.y ... past the grid limit).
// Vectors v0, v0 + T, ..., v0 + (U - 1) T of one row: all 2 * U loads issued before the first use.
template <int T, int U, int LD, int ST>
__device__ __forceinline__ void silu_tile(const SiluArgs& a, long long row, long long v0) {
  const uint16_t* gp = a.x + row * a.xs;
  const uint16_t* up = gp + a.up_off;
  uint16_t* op = a.y + row * a.ys;
  uint4 g[U], u[U];
#pragma unroll
  for (int i = 0; i < U; ++i) {
    const long long j = v0 + i * T;
    if (j < a.nv) {
      g[i] = ld16<LD>(gp + j * 8);
      u[i] = ld16<LD>(up + j * 8);
    } else {
      g[i] = make_uint4(0, 0, 0, 0);
      u[i] = g[i];
    }
  }
#pragma unroll
  for (int i = 0; i < U; ++i) {
    const long long j = v0 + i * T;
    if (j < a.nv) st16<ST>(op + j * 8, silu_vec(g[i], u[i]));
  }
}

// All 2 * ITEMS loads are issued before the first use.
template <int T, int ITEMS, int LD, int ST, int MINB>
__global__ void __launch_bounds__(T, MINB) silu_kernel(const SiluArgs a) {
  const long long v0 = static_cast<long long>(blockIdx.x) * (T * ITEMS) + threadIdx.x;
  for (long long row = blockIdx.y; row < a.rows; row += gridDim.y) {
    silu_tile<T, ITEMS, LD, ST>(a, row, v0);
  }
}

// (e) persistent grid-stride loop: work unit = (row, chunk of T * U vectors of that row); block b
// takes units b, b + gridDim.x, ...; U gate + U up loads in flight per thread.
template <int T, int U, int LD, int ST, int MINB>
__global__ void __launch_bounds__(T, MINB) silu_persist_kernel(const SiluArgs a, long long chunks_per_row) {
  // units < 2^32 (checked by the launcher): 32-bit division, once per unit (block-uniform)
  const unsigned units = static_cast<unsigned>(a.rows * chunks_per_row);
  const unsigned cpr = static_cast<unsigned>(chunks_per_row);
  for (unsigned w = blockIdx.x; w < units; w += gridDim.x) {
    const unsigned rw = cpr == 1 ? w : w / cpr;
    const long long row = rw;
    const long long v0 = static_cast<long long>(w - rw * cpr) * (T * U) + threadIdx.x;
    silu_tile<T, U, LD, ST>(a, row, v0);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------
constexpr int kOk = 0, kErrShape = 1, kErrAlign = 2, kErrVariant = 3, kErrCuda = 100;

inline int rc_of(cudaError_t e) { return e == cudaSuccess ? kOk : kErrCuda + static_cast<int>(e); }

inline int num_sms() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
  return n;
}

inline int occupancy(const void* fn, int threads) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, 0) != cudaSuccess) return 0;
  return n;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

using SmLaunch = int (*)(const SmArgs&, int, cudaStream_t);
using SiluLaunch = int (*)(const SiluArgs&, int, cudaStream_t);

struct SmVariant {
  const char* name;
  SmLaunch launch;
  const void* kernel;  // for attributes
  int threads;
  bool persistent;
};
struct SiluVariant {
  const char* name;
  SiluLaunch launch;
  const void* kernel;
  int threads;
  bool persistent;
};

template <int T, int ITEMS, int LD, int ST, bool TRICK, int MINB>
int launch_sm_block(const SmArgs& a, int, cudaStream_t s) {
  if (a.nv > T * ITEMS || a.rows > 0x7fffffffLL) return kErrShape;
  sm_block_kernel<T, ITEMS, LD, ST, TRICK, MINB><<<static_cast<unsigned>(a.rows), T, 0, s>>>(a);
  return rc_of(cudaGetLastError());
}

template <int WPB, int KV, int LD, int ST, int MINB>
int launch_sm_warp(const SmArgs& a, int, cudaStream_t s) {
  if (a.nv > 32 * KV) return kErrShape;
  const long long blocks = (a.rows + WPB - 1) / WPB;
  if (blocks > 0x7fffffffLL) return kErrShape;
  sm_warp_kernel<WPB, KV, LD, ST, MINB><<<static_cast<unsigned>(blocks), WPB * 32, 0, s>>>(a);
  return rc_of(cudaGetLastError());
}

template <int T, int ITEMS, int LD, int ST, int MINB>
int launch_sm_persist(const SmArgs& a, int blocks_per_sm, cudaStream_t s) {
  if (a.nv > T * ITEMS) return kErrShape;
  const auto fn = sm_persist_kernel<T, ITEMS, LD, ST, MINB>;
  static const int occ = occupancy(reinterpret_cast<const void*>(fn), T);
  static const int sms = num_sms();
  const int k = blocks_per_sm > 0 ? blocks_per_sm : occ;
  if (k <= 0 || sms <= 0) return kErrCuda + static_cast<int>(cudaErrorInvalidConfiguration);
  long long grid = static_cast<long long>(k) * sms;
  if (grid > a.rows) grid = a.rows;
  fn<<<static_cast<unsigned>(grid), T, 0, s>>>(a);
  return rc_of(cudaGetLastError());
}

// The shipped register kernel (cuda/softmax/softmax.cuh), bf16 -> bf16, vector path.
int launch_sm_shipped(const SmArgs& a, int, cudaStream_t s) {
  using namespace fray::softmax_detail;
  KernelArgs k{};
  k.x = a.x;
  k.y = a.y;
  k.x_stride = a.xs;
  k.y_stride = a.ys;
  k.rows = a.rows;
  k.nv = a.nv;
  k.scale = static_cast<float>(kLog2e);
  k.inv_temperature = 1.0f;
  const LaunchConfig c = softmax_config(a.nv, 8);
  k.slice = c.slice;
  return rc_of(launch_kernel<__nv_bfloat16, __nv_bfloat16, 8>(k, c, s));
}
const void* shipped_sm_kernel_8192() {
  using namespace fray::softmax_detail;
  const LaunchConfig c = softmax_config(1024, 8);
  return reinterpret_cast<const void*>(KernelSet<__nv_bfloat16, __nv_bfloat16, 8>::kKernels[kernel_slot(c)]);
}

template <int T, int ITEMS, int LD, int ST, int MINB>
int launch_silu(const SiluArgs& a, int, cudaStream_t s) {
  const long long gx = (a.nv + T * ITEMS - 1) / (T * ITEMS);
  if (gx > 0x7fffffffLL) return kErrShape;
  const unsigned gy = static_cast<unsigned>(a.rows < 65535 ? a.rows : 65535);
  silu_kernel<T, ITEMS, LD, ST, MINB><<<dim3(static_cast<unsigned>(gx), gy), T, 0, s>>>(a);
  return rc_of(cudaGetLastError());
}

template <int T, int U, int LD, int ST, int MINB>
int launch_silu_persist(const SiluArgs& a, int blocks_per_sm, cudaStream_t s) {
  const auto fn = silu_persist_kernel<T, U, LD, ST, MINB>;
  static const int occ = occupancy(reinterpret_cast<const void*>(fn), T);
  static const int sms = num_sms();
  const int k = blocks_per_sm > 0 ? blocks_per_sm : occ;
  if (k <= 0 || sms <= 0) return kErrCuda + static_cast<int>(cudaErrorInvalidConfiguration);
  const long long cpr = (a.nv + T * U - 1) / (T * U);
  const long long units = a.rows * cpr;
  if (units >= (1LL << 32) - (1LL << 24)) return kErrShape;  // 32-bit unit index (+ grid stride) in the kernel
  long long grid = static_cast<long long>(k) * sms;
  if (grid > units) grid = units;
  fn<<<static_cast<unsigned>(grid), T, 0, s>>>(a, cpr);
  return rc_of(cudaGetLastError());
}

// The shipped act_mul kernel (cuda/activation/act_mul.cuh), silu, bf16.
int launch_silu_shipped(const SiluArgs& a, int, cudaStream_t s) {
  fray::ActMulParams p;
  p.act = fray::Activation::kSilu;
  p.gate = a.x;
  p.gate_row_stride = a.xs;
  p.up = a.x + a.up_off;
  p.up_row_stride = a.xs;
  p.out = a.y;
  p.out_row_stride = a.ys;
  p.rows = a.rows;
  p.d = a.nv * 8;
  return rc_of(fray::launch_act_mul<__nv_bfloat16>(p, s));
}

#define MB_SM_BLOCK(name, T, I, LD, ST, TR, MB) \
  {name, &launch_sm_block<T, I, LD, ST, TR, MB>, reinterpret_cast<const void*>(&sm_block_kernel<T, I, LD, ST, TR, MB>), T, false}
#define MB_SM_WARP(name, W, KV, LD, ST, MB) \
  {name, &launch_sm_warp<W, KV, LD, ST, MB>, reinterpret_cast<const void*>(&sm_warp_kernel<W, KV, LD, ST, MB>), W * 32, false}
#define MB_SM_PERSIST(name, T, I, LD, ST, MB) \
  {name, &launch_sm_persist<T, I, LD, ST, MB>, reinterpret_cast<const void*>(&sm_persist_kernel<T, I, LD, ST, MB>), T, true}

// Names: <shape>.<loads>.<stores>[.2red]: loads ld (plain) | nc (ld.global.nc.L1::no_allocate) |
// nc256 (+ .L2::256B prefetch) | ca (ld.global.ca) | cg | na (ld.global.L1::no_allocate) | ca256;
// stores st (plain) | cs (st.global.cs). .2red: Liger-like max then sum reductions; else own-max.
const SmVariant kSm[] = {
    {"shipped(softmax.cuh)", &launch_sm_shipped, nullptr, 256, false},
    // (a) Liger-like: 512 threads x 2 vectors, max then sum reductions
    MB_SM_BLOCK("a.512x2.ld.st.2red", 512, 2, kLdPlain, kStPlain, false, 3),
    MB_SM_BLOCK("a.512x2.ld.cs.2red", 512, 2, kLdPlain, kStCs, false, 3),
    MB_SM_BLOCK("a.512x2.ld.cs", 512, 2, kLdPlain, kStCs, true, 3),
    MB_SM_BLOCK("a.512x2.nc.cs", 512, 2, kLdNc, kStCs, true, 3),
    MB_SM_BLOCK("a.512x2.ca.cs.2red", 512, 2, kLdCa, kStCs, false, 3),  // Liger's loads / stores exactly
    MB_SM_BLOCK("a.512x2.ca.st.2red", 512, 2, kLdCa, kStPlain, false, 3),
    MB_SM_BLOCK("a.512x2.ca.st", 512, 2, kLdCa, kStPlain, true, 3),
    MB_SM_BLOCK("a.512x2.ca.cs", 512, 2, kLdCa, kStCs, true, 3),
    // (b) the shipped shape, 256 threads x 4 vectors, own-max scheme
    MB_SM_BLOCK("b.256x4.ld.st", 256, 4, kLdPlain, kStPlain, true, 4),
    MB_SM_BLOCK("b.256x4.ld.cs", 256, 4, kLdPlain, kStCs, true, 4),
    MB_SM_BLOCK("b.256x4.nc.st", 256, 4, kLdNc, kStPlain, true, 4),
    MB_SM_BLOCK("b.256x4.nc.cs", 256, 4, kLdNc, kStCs, true, 4),
    MB_SM_BLOCK("b.256x4.nc256.cs", 256, 4, kLdNc256, kStCs, true, 4),
    MB_SM_BLOCK("b.256x4.ca.st", 256, 4, kLdCa, kStPlain, true, 4),
    MB_SM_BLOCK("b.256x4.ca.cs", 256, 4, kLdCa, kStCs, true, 4),
    MB_SM_BLOCK("b.256x4.cg.st", 256, 4, kLdCg, kStPlain, true, 4),
    MB_SM_BLOCK("b.256x4.na.st", 256, 4, kLdNa, kStPlain, true, 4),
    MB_SM_BLOCK("b.256x4.ca256.st", 256, 4, kLdCa256, kStPlain, true, 4),
    // (c) 128 threads x 8 vectors
    MB_SM_BLOCK("c.128x8.ld.st", 128, 8, kLdPlain, kStPlain, true, 5),
    MB_SM_BLOCK("c.128x8.ld.cs", 128, 8, kLdPlain, kStCs, true, 5),
    MB_SM_BLOCK("c.128x8.nc.cs", 128, 8, kLdNc, kStCs, true, 5),
    MB_SM_BLOCK("c.128x8.ca.st", 128, 8, kLdCa, kStPlain, true, 5),
    // (d) warp per row, 4 warps (rows) per block, 32 packed vectors per lane
    MB_SM_WARP("d.warp.ld.st", 4, 32, kLdPlain, kStPlain, 3),
    MB_SM_WARP("d.warp.ld.cs", 4, 32, kLdPlain, kStCs, 3),
    MB_SM_WARP("d.warp.nc.cs", 4, 32, kLdNc, kStCs, 3),
    MB_SM_WARP("d.warp.nc.cs.minb2", 4, 32, kLdNc, kStCs, 2),
    MB_SM_WARP("d.warp.ca.st", 4, 32, kLdCa, kStPlain, 3),
    // (e) persistent, next row's loads in flight during the current row
    MB_SM_PERSIST("e.persist.512x2.ld.cs", 512, 2, kLdPlain, kStCs, 2),
    MB_SM_PERSIST("e.persist.512x2.nc.cs", 512, 2, kLdNc, kStCs, 2),
    MB_SM_PERSIST("e.persist.256x4.nc.cs", 256, 4, kLdNc, kStCs, 2),
    MB_SM_PERSIST("e.persist.512x2.ca.st", 512, 2, kLdCa, kStPlain, 2),
};
constexpr int kNumSm = static_cast<int>(sizeof(kSm) / sizeof(kSm[0]));

#define MB_SILU(name, T, I, LD, ST, MB) \
  {name, &launch_silu<T, I, LD, ST, MB>, reinterpret_cast<const void*>(&silu_kernel<T, I, LD, ST, MB>), T, false}
#define MB_SILU_PERSIST(name, T, U, LD, ST, MB) \
  {name, &launch_silu_persist<T, U, LD, ST, MB>, reinterpret_cast<const void*>(&silu_persist_kernel<T, U, LD, ST, MB>), T, true}

const SiluVariant kSilu[] = {
    {"shipped(act_mul.cuh)", &launch_silu_shipped, nullptr, 256, false},
    MB_SILU("a.256x1.ld.st", 256, 1, kLdPlain, kStPlain, 8),
    MB_SILU("a.512x1.ld.st", 512, 1, kLdPlain, kStPlain, 4),
    MB_SILU("b.256x2.ld.st", 256, 2, kLdPlain, kStPlain, 6),
    MB_SILU("c.256x1.ld.cs", 256, 1, kLdPlain, kStCs, 8),
    MB_SILU("c.256x2.ld.cs", 256, 2, kLdPlain, kStCs, 6),
    MB_SILU("d.256x1.nc.st", 256, 1, kLdNc, kStPlain, 8),
    MB_SILU("d.256x1.nc256.st", 256, 1, kLdNc256, kStPlain, 8),
    MB_SILU("cd.256x1.nc.cs", 256, 1, kLdNc, kStCs, 8),
    MB_SILU("cd.256x2.nc.cs", 256, 2, kLdNc, kStCs, 6),
    MB_SILU("a.256x1.ca.st", 256, 1, kLdCa, kStPlain, 8),
    MB_SILU("a.256x1.ca.cs", 256, 1, kLdCa, kStCs, 8),
    MB_SILU("a.256x1.cg.st", 256, 1, kLdCg, kStPlain, 8),
    MB_SILU("a.256x1.na.st", 256, 1, kLdNa, kStPlain, 8),
    MB_SILU("a.256x1.ca256.st", 256, 1, kLdCa256, kStPlain, 8),
    MB_SILU("b.256x2.ca.st", 256, 2, kLdCa, kStPlain, 6),
    MB_SILU_PERSIST("e.persist.256x4.ld.st", 256, 4, kLdPlain, kStPlain, 4),
    MB_SILU_PERSIST("e.persist.256x4.ld.cs", 256, 4, kLdPlain, kStCs, 4),
    MB_SILU_PERSIST("e.persist.256x4.nc.cs", 256, 4, kLdNc, kStCs, 4),
};
constexpr int kNumSilu = static_cast<int>(sizeof(kSilu) / sizeof(kSilu[0]));

inline int attrs(const void* fn, int threads, bool persistent, int* regs, int* local_bytes, int* thr, int* bps) {
  cudaFuncAttributes fa{};
  const cudaError_t e = cudaFuncGetAttributes(&fa, fn);
  if (e != cudaSuccess) return rc_of(e);
  if (regs) *regs = fa.numRegs;
  if (local_bytes) *local_bytes = static_cast<int>(fa.localSizeBytes);
  if (thr) *thr = threads;
  if (bps) *bps = occupancy(fn, threads);
  (void)persistent;
  return kOk;
}

// The C entry points' shape checks: kOk for an empty problem, kErrShape / kErrAlign, else kProceed
// (n: output columns, a multiple of the 8-element vector; both rows 16-byte aligned).
constexpr int kProceed = -1;
inline int precheck(const void* x, const void* y, long long rows, long long n, long long xs, long long ys) {
  if (rows <= 0 || n <= 0) return kOk;
  if (n % 8 != 0) return kErrShape;
  if (!aligned16(x) || !aligned16(y) || (rows > 1 && (xs % 8 != 0 || ys % 8 != 0))) return kErrAlign;
  return kProceed;
}

}  // namespace mb

extern "C" {

int mb_softmax_count(void) { return mb::kNumSm; }
const char* mb_softmax_name(int v) { return v >= 0 && v < mb::kNumSm ? mb::kSm[v].name : nullptr; }
int mb_softmax_persistent(int v) { return v >= 0 && v < mb::kNumSm && mb::kSm[v].persistent ? 1 : 0; }

int mb_softmax(int v, const void* x, void* y, long long rows, long long cols, long long x_stride, long long y_stride,
               int blocks_per_sm, void* stream) {
  if (v < 0 || v >= mb::kNumSm) return mb::kErrVariant;
  const int pre = mb::precheck(x, y, rows, cols, x_stride, y_stride);
  if (pre != mb::kProceed) return pre;
  mb::SmArgs a{static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y), rows, cols / 8, x_stride, y_stride,
               mb::kLog2e};
  return mb::kSm[v].launch(a, blocks_per_sm, static_cast<cudaStream_t>(stream));
}

int mb_softmax_attr(int v, int* regs, int* local_bytes, int* threads, int* blocks_per_sm) {
  if (v < 0 || v >= mb::kNumSm) return mb::kErrVariant;
  const void* fn = mb::kSm[v].kernel != nullptr ? mb::kSm[v].kernel : mb::shipped_sm_kernel_8192();
  return mb::attrs(fn, mb::kSm[v].threads, mb::kSm[v].persistent, regs, local_bytes, threads, blocks_per_sm);
}

int mb_silu_count(void) { return mb::kNumSilu; }
const char* mb_silu_name(int v) { return v >= 0 && v < mb::kNumSilu ? mb::kSilu[v].name : nullptr; }
int mb_silu_persistent(int v) { return v >= 0 && v < mb::kNumSilu && mb::kSilu[v].persistent ? 1 : 0; }

int mb_silu(int v, const void* x, void* out, long long rows, long long d, long long x_stride, long long out_stride,
            int blocks_per_sm, void* stream) {
  if (v < 0 || v >= mb::kNumSilu) return mb::kErrVariant;
  const int pre = mb::precheck(x, out, rows, d, x_stride, out_stride);
  if (pre != mb::kProceed) return pre;
  mb::SiluArgs a{static_cast<const uint16_t*>(x), static_cast<uint16_t*>(out), rows, d / 8, x_stride, out_stride, d};
  return mb::kSilu[v].launch(a, blocks_per_sm, static_cast<cudaStream_t>(stream));
}

int mb_silu_attr(int v, int* regs, int* local_bytes, int* threads, int* blocks_per_sm) {
  if (v < 0 || v >= mb::kNumSilu) return mb::kErrVariant;
  const void* fn = mb::kSilu[v].kernel != nullptr
                       ? mb::kSilu[v].kernel
                       : reinterpret_cast<const void*>(
                             fray::act_detail::KernelSet<__nv_bfloat16, fray::Activation::kSilu, 8>::kKernels[0]);
  return mb::attrs(fn, mb::kSilu[v].threads, mb::kSilu[v].persistent, regs, local_bytes, threads, blocks_per_sm);
}

}  // extern "C"
