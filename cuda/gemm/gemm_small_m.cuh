// Fray: the small-M GEMM (M = 1..64, decode): out[M, N] = x[M, K] * w[N, K]^T + bias[N].
//
// At decode sizes the weights are the whole cost (M = 1, N = K = 4096: 32 MiB of w against 8 KiB
// of x), so the kernel is a weight stream: each weight byte is read from DRAM exactly once, with
// 16-byte non-allocating loads, and every CTA reads x (small, L2/L1-resident) many times.
//
// Tensor cores still do the arithmetic: at M = 64 the FMAs of a CUDA-core dot product (2 * M
// flops per weight element) would take longer than streaming the weights. The product is
// computed transposed, out^T[N, M] = w[N, K] * x^T, with mma.sync m16n8k16: the weights are the
// row-major A operand (16 rows of w), x the column-major B operand (8 rows of x). A dot product
// does not care in which order it visits K, so K is permuted inside each 32-wide chunk: thread
// (group g, lane-in-group t) loads w[row g][t*8 .. t*8+8) and w[row g+8][...] as two 16-byte
// loads, and x[row g][t*8 .. t*8+8) as one; those eight elements fill its fragment slots of two
// consecutive mmas (logical k {2t, 2t+1, 2t+8, 2t+9} of each) for A and B alike. Four threads of
// a group read 64 contiguous bytes of a weight row per chunk, kUnroll chunks per step: 64 *
// kUnroll contiguous bytes per row and step, with kUnroll * 2 loads per thread in flight.
//
// Bytes in flight (Little's law): ~3.5 TB/s at ~0.7 us of DRAM latency is ~2.5 MB across 132 SMs,
// ~19 KB per SM. Loaded straight into registers (kStages = 0) a thread keeps only about three
// 16-byte loads in flight, however far the step is unrolled, since ptxas places each load near
// its mma; through a cp.async ring (kStages >= 2) a CTA of 8 warps with kUnroll = 2 and 4 stages
// keeps 3 * 2 * 32 B per thread, 48 KB per CTA, in flight, and two CTAs fit per SM.
//
// Work split: a CTA owns 16 rows of w (16 outputs per row of x) over all of K; its kWarps warps
// take interleaved steps along K and their fp32 partial sums are added in shared memory in a
// fixed order (deterministic, no second kernel, no atomics). N / 16 CTAs: 256 at N = 4096, 896 at
// N = 14336.
//
// Requirements (checked by the entry point): K, lda, ldb multiples of 8, 16-byte aligned x and w;
// b layout "nk" ([N, K], nn.Linear's weight).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>

#include <type_traits>

#include <cooperative_groups.h>

#include "cuda/common/bulk_copy.cuh"
#include "cuda/common/jit_entry.h"
#include "cuda/common/launch_abi.h"

namespace fray {
namespace gemm {
namespace small_m {

constexpr int kRows = 16;   // w rows per CTA: the mma's M
constexpr int kChunk = 32;  // k per chunk: two m16n8k16 mmas

__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

template <class T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return __half2float(v);
}

template <class O>
__device__ __forceinline__ O from_float(float v) {
  if constexpr (std::is_same_v<O, float>) return v;
  else if constexpr (std::is_same_v<O, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else return __float2half_rn(v);
}

template <int kStages, int kUnroll, int kThreads>
constexpr int ring_bytes() {
  return kStages * kUnroll * 2 * 16 * kThreads;
}

// 16 bytes global -> shared, cached in L2 only (the weights are read once). No L2 cache hint:
// ptxas 13.0 miscompiles cp.async with one (see bench/NOTES.md).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

template <class T, int kMTiles>
__device__ __forceinline__ void mma_chunk(float (&acc)[kMTiles][4], const uint4& lo, const uint4& hi,
                                          const T* const (&x_row)[kMTiles], int koff) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x_row[mt] + koff));
    mma16816<T>(acc[mt], lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
    mma16816<T>(acc[mt], lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
  }
}

// x [M, K] (row stride lda), w [N, K] (row stride ldw), out [M, N] (row stride ldo).
//
// kStages = 0: the weights go straight to registers, kUnroll chunks per step. ptxas interleaves
// those loads with the mmas that use them (about three 16-byte loads in flight per thread, SASS
// of 2026-12-01), so in-flight bytes scale with threads per SM only.
// kStages >= 2: each thread streams its own weight slices through a private cp.async ring of
// kStages steps in shared memory, (kStages - 1) * kUnroll * 32 bytes in flight per thread that no
// register holds. A thread reads back only what it copied, so cp.async.wait_group alone orders
// the ring: no barrier, no cross-thread handoff.
template <class T, class O, bool kBias, int kMTiles, int kWarps, int kUnroll, int kStages>
__global__ void __launch_bounds__(kWarps * 32) small_m_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                              const T* __restrict__ bias, O* __restrict__ out,
                                                              int m, int n, int k, int64_t lda, int64_t ldw,
                                                              int64_t ldo) {
  constexpr int kThreads = kWarps * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  // The partial sums reuse the ring's bytes once every warp has left the main loop.
  auto partial = reinterpret_cast<float (*)[kRows][kMTiles * 8]>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * kRows;
  // Rows past N read row N - 1 (valid memory) and are never stored.
  const T* w_lo = w + static_cast<int64_t>(min(n0 + g, n - 1)) * ldw + t * 8;
  const T* w_hi = w + static_cast<int64_t>(min(n0 + g + 8, n - 1)) * ldw + t * 8;
  const T* x_row[kMTiles];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) x_row[mt] = x + static_cast<int64_t>(min(mt * 8 + g, m - 1)) * lda + t * 8;

  float acc[kMTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;

  constexpr int kStep = kChunk * kUnroll;
  constexpr int kStride = kWarps * kStep;  // k between a warp's consecutive steps
  const int k_first = warp * kStep;
  // This warp's whole steps: k_first + j * kStride + kStep <= k.
  const int full = k >= k_first + kStep ? (k - k_first - kStep) / kStride + 1 : 0;
  if constexpr (kStages == 0) {
    for (int j = 0; j < full; ++j) {
      const int k0 = k_first + j * kStride;
      uint4 lo[kUnroll], hi[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        lo[u] = load_stream(w_lo + k0 + u * kChunk);
        hi[u] = load_stream(w_hi + k0 + u * kChunk);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) mma_chunk<T, kMTiles>(acc, lo[u], hi[u], x_row, k0 + u * kChunk);
    }
  } else {
    // ring[slot][u][lo/hi][thread]: consecutive threads touch consecutive 16-byte words.
    uint4* ring = reinterpret_cast<uint4*>(smem);
    auto slot_ptr = [&](int slot, int u, int half) { return ring + ((slot * kUnroll + u) * 2 + half) * kThreads + threadIdx.x; };
    auto issue = [&](int j) {
      if (j < full) {
        const int k0 = k_first + j * kStride;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          cp_async16(slot_ptr(j % kStages, u, 0), w_lo + k0 + u * kChunk);
          cp_async16(slot_ptr(j % kStages, u, 1), w_hi + k0 + u * kChunk);
        }
      }
      cp_async_commit();  // empty groups too: the wait below counts groups
    };
#pragma unroll
    for (int j = 0; j < kStages - 1; ++j) issue(j);
    for (int j = 0; j < full; ++j) {
      issue(j + kStages - 1);
      cp_async_wait<kStages - 1>();
      const int k0 = k_first + j * kStride;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        mma_chunk<T, kMTiles>(acc, *slot_ptr(j % kStages, u, 0), *slot_ptr(j % kStages, u, 1), x_row, k0 + u * kChunk);
    }
    cp_async_wait<0>();
  }
  // At most one partial step per warp: chunk by chunk, zeros past K (K is a multiple of 8, so a
  // thread's 8 elements are all in or all out).
  const int k0 = k_first + full * kStride;
  if (k0 < k) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kk = k0 + u * kChunk + t * 8;
      const bool in = kk < k;
      const uint4 z = make_uint4(0, 0, 0, 0);
      const uint4 lo = in ? load_stream(w_lo + k0 + u * kChunk) : z;
      const uint4 hi = in ? load_stream(w_hi + k0 + u * kChunk) : z;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const uint4 xv = in ? __ldg(reinterpret_cast<const uint4*>(x_row[mt] + k0 + u * kChunk)) : z;
        mma16816<T>(acc[mt], lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
        mma16816<T>(acc[mt], lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
      }
    }
  }
  if constexpr (kStages > 0) __syncthreads();  // every warp is done with the ring

  // Accumulator (row r of w = output column n0 + r, column c = output row): c0 (g, 2t),
  // c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1).
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    partial[warp][g][mt * 8 + 2 * t] = acc[mt][0];
    partial[warp][g][mt * 8 + 2 * t + 1] = acc[mt][1];
    partial[warp][g + 8][mt * 8 + 2 * t] = acc[mt][2];
    partial[warp][g + 8][mt * 8 + 2 * t + 1] = acc[mt][3];
  }
  __syncthreads();
  const int m_cta = min(m, kMTiles * 8);
  for (int idx = threadIdx.x; idx < kRows * m_cta; idx += kWarps * 32) {
    const int r = idx % kRows, c = idx / kRows;
    const int col = n0 + r;
    if (col >= n) continue;
    float s = 0.f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) s += partial[wi][r][c];
    if constexpr (kBias) s += to_float(bias[col]);
    out[static_cast<int64_t>(c) * ldo + col] = from_float<O>(s);
  }
}

// ---------------------------------------------------------------------------------------------
// The bulk-copy kernel: weight tiles through a shared-memory ring filled by the copy engine.
//
// The per-thread kernels above keep at most ~3 16-byte loads (registers) or a few KB (cp.async)
// in flight per SM, and at 1x4096x4096 they stream 1.8 TB/s (H200, 2026-12-01). The copy engine
// takes one instruction per weight row and stage, so a CTA holds kStages * kRowTiles * 16 rows *
// kTileK * 2 bytes in flight (4 x 16 KB at 16 rows x 512), enough for Little's law (~4 TB/s x ~1
// us / 132 SMs = ~30 KB per SM) with one CTA per SM, and the consumer warps spend no issue slots
// on loads.
//
// Warp 0 is the producer: each lane issues cp.async.bulk copies of whole weight rows
// (w[row][k0, k0 + kTileK), contiguous in "nk"), all landing on the stage's full barrier; it
// refills a stage once its empty barrier has an arrival from every consumer warp. Consumer warp c
// owns the 16-row tile c % kRowTiles and, inside a stage, the 32-wide chunks j = c / kRowTiles +
// i * (kConsumerWarps / kRowTiles): the same K-permuted fragments as the per-thread kernels
// (thread (g, t) reads 16 bytes of rows g and g + 8 at k = j * 32 + t * 8), now from shared
// memory. Rows are padded by 64 bytes so that rows g and g + 1 fall in opposite halves of the 32
// banks: a warp's 32 16-byte reads then spread 4 to a bank group, the minimum of 4 wavefronts.
//
// x: read by every CTA, from global memory through L1 (kXSmem = false), or copied with the stage
// (kXSmem: M rows of kTileK more per stage, read with the weights' conflict-free pattern), which
// saves L1/L2 traffic where M is large (at M = 64 a 16-row CTA reads 4x its weight bytes of x).
//
// Split-K: a cluster of kSplitK CTAs shares one row tile, each reducing its range of K tiles;
// their fp32 partials are summed through distributed shared memory in rank order (deterministic,
// one kernel, no workspace). kSplitK = 1 launches without a cluster.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(::fray::smem_u32(bar)) : "memory");
}

// global -> shared, `bytes` (a multiple of 16, both ends 16-byte aligned), completing on `bar`.
// No L2 cache hint: after the harness's L2 flush an evict-first policy measured slower on the
// decode stream (bench/NOTES.md, stream_read.cu).
__device__ __forceinline__ void bulk_row(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   ::fray::smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(::fray::smem_u32(bar))
               : "memory");
}

constexpr int kRowPadBytes = 64;  // after each row of a stage

// Weights stored as 8-bit integers or e4m3 (the W8A16 decode GEMM): 16 bytes a thread holds 16
// elements, converted exactly (|q| <= 127 and every e4m3 value are bf16 / fp16 numbers) to the
// activations' type in registers before the mma. The scale is not applied to the weights (which
// would round them): per output channel it multiplies the fp32 sum in the epilogue; per group of
// 128 along K it multiplies each 64-wide chunk's fp32 partial sum as that is added to the total.
template <class W>
constexpr bool kIs8Bit = sizeof(W) == 1;

enum WeightScale : int { kScaleNone = 0, kScaleChannel = 1, kScaleGroup = 2 };
constexpr int kScaleGroupK = 128;

// Four int8 (one 32-bit word, element 0 in the low byte) -> two packed T pairs (e0, e1), (e2, e3).
// Each byte, flipped to u = q + 128, becomes the low byte of the fp32 2^23 + u; subtracting
// 2^23 + 128 leaves q exactly; the pair then rounds (exactly) to T.
template <class T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <class T, class W>
__device__ __forceinline__ void widen4(uint32_t v, uint32_t& p01, uint32_t& p23) {
  if constexpr (std::is_same_v<W, int8_t>) {
    const uint32_t u = v ^ 0x80808080u;
    constexpr float kBias = 8388736.0f;  // 2^23 + 128
    const float f0 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - kBias;
    const float f1 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - kBias;
    const float f2 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - kBias;
    const float f3 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - kBias;
    p01 = pack2<T>(f0, f1);
    p23 = pack2<T>(f2, f3);
  } else {
    // e4m3 pairs -> half2 (cvt.rn.f16x2.e4m3x2, exact), then to bf16 through fp32 where T is bf16.
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xFFFFu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v >> 16), __NV_E4M3);
    if constexpr (std::is_same_v<T, __half>) {
      p01 = *reinterpret_cast<const uint32_t*>(&lo);
      p23 = *reinterpret_cast<const uint32_t*>(&hi);
    } else {
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
      p01 = pack2<T>(a.x, a.y);
      p23 = pack2<T>(b.x, b.y);
    }
  }
}

// One 64-byte chunk of 8-bit weights: thread (g, t) holds 16 elements of rows g (lo) and g + 8
// (hi) at k = koff + t * 16 .. + 16, and the same 16 of each x row (two 16-byte loads); element
// pairs 4q..4q+3 fill the fragment slots of mma q (q = 0..3), for A and B alike.
template <class T, class W, int kMTiles>
__device__ __forceinline__ void mma_chunk_w8(float (&acc)[kMTiles][4], const uint4& lo, const uint4& hi,
                                             const uint4 (&xv)[kMTiles][2]) {
  uint32_t L[8], H[8];
  widen4<T, W>(lo.x, L[0], L[1]);
  widen4<T, W>(lo.y, L[2], L[3]);
  widen4<T, W>(lo.z, L[4], L[5]);
  widen4<T, W>(lo.w, L[6], L[7]);
  widen4<T, W>(hi.x, H[0], H[1]);
  widen4<T, W>(hi.y, H[2], H[3]);
  widen4<T, W>(hi.z, H[4], H[5]);
  widen4<T, W>(hi.w, H[6], H[7]);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    const uint32_t X[8] = {xv[mt][0].x, xv[mt][0].y, xv[mt][0].z, xv[mt][0].w,
                           xv[mt][1].x, xv[mt][1].y, xv[mt][1].z, xv[mt][1].w};
#pragma unroll
    for (int q = 0; q < 4; ++q) mma16816<T>(acc[mt], L[2 * q], H[2 * q], L[2 * q + 1], H[2 * q + 1], X[2 * q], X[2 * q + 1]);
  }
}

// Bytes of one row of a stage: kTileK elements of W (weights; x rows, kXSmem, where W is T) and the pad.
template <class W, int kTileK>
constexpr int bulk_ld_bytes() {
  return kTileK * static_cast<int>(sizeof(W)) + kRowPadBytes;
}

// A stage: kRowTiles * 16 weight rows, then (kXSmem) the kMTiles * 8 rows of x.
template <class W, int kMTiles, int kRowTiles, int kTileK, int kStages, bool kXSmem>
constexpr int bulk_ring_bytes() {
  return kStages * (kRowTiles * kRows + (kXSmem ? kMTiles * 8 : 0)) * bulk_ld_bytes<W, kTileK>();
}

// The epilogue's fp32 sums reuse the ring: per consumer warp, then per CTA.
template <int kMTiles, int kRowTiles, int kConsumerWarps>
constexpr int bulk_sum_bytes() {
  return (kConsumerWarps * kRows + kRowTiles * kRows) * kMTiles * 8 * 4;
}

// Ring or sums, whichever is larger; the stage barriers follow (kept apart from both).
template <class W, int kMTiles, int kRowTiles, int kConsumerWarps, int kTileK, int kStages, bool kXSmem>
constexpr int bulk_data_bytes() {
  return bulk_ring_bytes<W, kMTiles, kRowTiles, kTileK, kStages, kXSmem>() >
                 bulk_sum_bytes<kMTiles, kRowTiles, kConsumerWarps>()
             ? bulk_ring_bytes<W, kMTiles, kRowTiles, kTileK, kStages, kXSmem>()
             : bulk_sum_bytes<kMTiles, kRowTiles, kConsumerWarps>();
}

// W: T, or int8_t / __nv_fp8_e4m3 (W8A16); scale, lds: the fp32 weight scales and their row stride
// (kScaleChannel: scale[n * lds]; kScaleGroup: scale[n * lds + k / 128]), unused by kScaleNone.
template <class T, class O, bool kBias, int kMTiles, int kRowTiles, int kConsumerWarps, int kTileK, int kStages,
          int kSplitK, bool kXSmem, class W, int kScale>
__global__ void __launch_bounds__((kConsumerWarps + 1) * 32, 1) small_m_bulk_kernel(
    const T* __restrict__ x, const W* __restrict__ w, const T* __restrict__ bias, O* __restrict__ out, int m, int n,
    int k, int64_t lda, int64_t ldw, int64_t ldo, const float* __restrict__ scale, int64_t lds) {
  constexpr bool k8 = kIs8Bit<W>;
  static_assert(k8 || std::is_same_v<W, T>, "w: the activations' type, int8 or e4m3");
  static_assert(!(kXSmem && k8), "kXSmem: 16-bit weights only");
  static_assert(k8 || kScale == kScaleNone, "scales come with 8-bit weights");
  constexpr int kRowsCta = kRowTiles * kRows;
  constexpr int kLdB = bulk_ld_bytes<W, kTileK>();     // shared row stride, bytes
  constexpr int kXRows = kXSmem ? kMTiles * 8 : 0;     // x rows a stage has room for
  constexpr int kStageBytes = (kRowsCta + kXRows) * kLdB;
  constexpr int kGroups = kConsumerWarps / kRowTiles;  // consumer warps per row tile
  constexpr int kCh = 64 / static_cast<int>(sizeof(W));  // elements of a 64-byte chunk of a row: 32 or 64
  constexpr int kPer = kCh / 4;                          // a thread's elements per chunk: 8 or 16
  constexpr int kChunks = kTileK / kCh;                  // chunks per stage and row
  constexpr int kM8 = kMTiles * 8;
  static_assert(kConsumerWarps % kRowTiles == 0, "consumer warps split evenly over the row tiles");
  static_assert(kChunks % kGroups == 0, "a stage's chunks split evenly over a row tile's warps");
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(
      smem + bulk_data_bytes<W, kMTiles, kRowTiles, kConsumerWarps, kTileK, kStages, kXSmem>());
  uint64_t* empty = full + kStages;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = kSplitK > 1 ? static_cast<int>(blockIdx.x % kSplitK) : 0;
  const int n0 = static_cast<int>(blockIdx.x / kSplitK) * kRowsCta;
  // This CTA's K tiles: [tile_begin, tile_end) of ceil(K / kTileK), split as evenly as possible.
  const int tiles = (k + kTileK - 1) / kTileK;
  const int tile_begin = static_cast<int>(static_cast<int64_t>(tiles) * split / kSplitK);
  const int tile_end = static_cast<int>(static_cast<int64_t>(tiles) * (split + 1) / kSplitK);
  const int my_tiles = tile_end - tile_begin;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ::fray::mbar_init(&full[s], 1);
      ::fray::mbar_init(&empty[s], kConsumerWarps);
    }
    ::fray::mbar_init_fence();
  }
  __syncthreads();

  float acc[kMTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;

  if (warp == 0) {
    const int x_rows = kXSmem ? min(m, kXRows) : 0;
    for (int i = 0; i < my_tiles; ++i) {
      const int s = i % kStages;
      if (i >= kStages) ::fray::mbar_wait(&empty[s], ((i / kStages) - 1) & 1);
      const int k0 = (tile_begin + i) * kTileK;
      // K % 8 (16-bit) or K % 16 (8-bit): a multiple of 16 bytes.
      const uint32_t row_bytes = static_cast<uint32_t>(min(kTileK, k - k0)) * static_cast<uint32_t>(sizeof(W));
      if (lane == 0) ::fray::mbar_arrive_expect_tx(&full[s], row_bytes * (kRowsCta + x_rows));
      __syncwarp();
      // Rows past N copy row N - 1 (valid memory); their outputs are never stored. x rows past M
      // are not copied (the consumers read row M - 1 for them).
      for (int r = lane; r < kRowsCta + x_rows; r += 32) {
        const void* src = r < kRowsCta ? static_cast<const void*>(w + static_cast<int64_t>(min(n0 + r, n - 1)) * ldw + k0)
                                       : static_cast<const void*>(x + static_cast<int64_t>(r - kRowsCta) * lda + k0);
        bulk_row(ring + s * kStageBytes + r * kLdB, src, row_bytes, &full[s]);
      }
    }
  } else {
    const int c = warp - 1;
    const int rt = c % kRowTiles, grp = c / kRowTiles;
    const int g = lane / 4, t = lane % 4;
    const T* x_row[kMTiles];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) x_row[mt] = x + static_cast<int64_t>(min(mt * 8 + g, m - 1)) * lda + t * kPer;
    const int lo_off = (rt * kRows + g) * kLdB + t * 16, hi_off = lo_off + 8 * kLdB;
    int x_off[kMTiles];  // kXSmem: x's fragment rows in a stage
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) x_off[mt] = (kRowsCta + min(mt * 8 + g, m - 1)) * kLdB + t * 16;
    (void)x_off;
    // kScaleGroup: the scale rows of this thread's two weight rows.
    const float* s_lo = scale + static_cast<int64_t>(min(n0 + rt * kRows + g, n - 1)) * lds;
    const float* s_hi = scale + static_cast<int64_t>(min(n0 + rt * kRows + g + 8, n - 1)) * lds;
    (void)s_lo;
    (void)s_hi;
    // One 64-byte chunk of 8-bit weights at k = kc (the chunk's first element); `in`: this
    // thread's 16 elements lie inside K (else lo / hi are zeros, and so is x).
    auto chunk8 = [&](const uint4& lo, const uint4& hi, int kc, bool in) {
      const uint4 z = make_uint4(0, 0, 0, 0);
      uint4 xv[kMTiles][2];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        xv[mt][0] = in ? __ldg(reinterpret_cast<const uint4*>(x_row[mt] + kc)) : z;
        xv[mt][1] = in ? __ldg(reinterpret_cast<const uint4*>(x_row[mt] + kc + 8)) : z;
      }
      if constexpr (kScale == kScaleGroup) {
        float part[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) part[mt][0] = part[mt][1] = part[mt][2] = part[mt][3] = 0.f;
        mma_chunk_w8<T, W, kMTiles>(part, lo, hi, xv);
        const float sl = __ldg(s_lo + kc / kScaleGroupK), sh = __ldg(s_hi + kc / kScaleGroupK);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          acc[mt][0] = fmaf(sl, part[mt][0], acc[mt][0]);
          acc[mt][1] = fmaf(sl, part[mt][1], acc[mt][1]);
          acc[mt][2] = fmaf(sh, part[mt][2], acc[mt][2]);
          acc[mt][3] = fmaf(sh, part[mt][3], acc[mt][3]);
        }
      } else {
        mma_chunk_w8<T, W, kMTiles>(acc, lo, hi, xv);
      }
    };
    for (int i = 0; i < my_tiles; ++i) {
      const int s = i % kStages;
      ::fray::mbar_wait(&full[s], (i / kStages) & 1);
      const int k0 = (tile_begin + i) * kTileK;
      const int valid = min(kTileK, k - k0);
      const unsigned char* st = ring + s * kStageBytes;
      if (valid == kTileK) {
#pragma unroll
        for (int jj = 0; jj < kChunks / kGroups; ++jj) {
          const int j = grp + jj * kGroups;
          const uint4 lo = *reinterpret_cast<const uint4*>(st + lo_off + j * 64);
          const uint4 hi = *reinterpret_cast<const uint4*>(st + hi_off + j * 64);
          if constexpr (k8) {
            chunk8(lo, hi, k0 + j * kCh, true);
          } else if constexpr (kXSmem) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
              const uint4 xv = *reinterpret_cast<const uint4*>(st + x_off[mt] + j * 64);
              mma16816<T>(acc[mt], lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
              mma16816<T>(acc[mt], lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
            }
          } else {
            mma_chunk<T, kMTiles>(acc, lo, hi, x_row, k0 + j * kCh);
          }
        }
      } else {
        // The last tile of K: a thread's kPer elements are all inside or all past K (K % kPer ==
        // 0); past it the stage holds stale bytes, replaced by zeros in both operands.
        for (int jj = 0; jj < kChunks / kGroups; ++jj) {
          const int j = grp + jj * kGroups;
          if (j * kCh >= valid) break;
          const bool in = j * kCh + t * kPer < valid;
          const uint4 z = make_uint4(0, 0, 0, 0);
          const uint4 lo = in ? *reinterpret_cast<const uint4*>(st + lo_off + j * 64) : z;
          const uint4 hi = in ? *reinterpret_cast<const uint4*>(st + hi_off + j * 64) : z;
          if constexpr (k8) {
            chunk8(lo, hi, k0 + j * kCh, in);
          } else {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
              uint4 xv = z;
              if (in) {
                if constexpr (kXSmem) xv = *reinterpret_cast<const uint4*>(st + x_off[mt] + j * 64);
                else xv = __ldg(reinterpret_cast<const uint4*>(x_row[mt] + k0 + j * kCh));
              }
              mma16816<T>(acc[mt], lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
              mma16816<T>(acc[mt], lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
  // Every copy this CTA issued has landed (each full phase was waited on): the ring is free.
  __syncthreads();

  // partial[c][row of the tile][output row], then the CTA's sum cta[row][output row].
  auto partial = reinterpret_cast<float (*)[kRows][kM8]>(smem);
  float* cta = reinterpret_cast<float*>(smem) + kConsumerWarps * kRows * kM8;
  if (warp > 0) {
    const int c = warp - 1;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      partial[c][g][mt * 8 + 2 * t] = acc[mt][0];
      partial[c][g][mt * 8 + 2 * t + 1] = acc[mt][1];
      partial[c][g + 8][mt * 8 + 2 * t] = acc[mt][2];
      partial[c][g + 8][mt * 8 + 2 * t + 1] = acc[mt][3];
    }
  }
  __syncthreads();
  // The fp32 sum of one output, scaled per channel (kScaleChannel) and biased.
  auto finish = [&](float s, int col) {
    if constexpr (kScale == kScaleChannel) s *= __ldg(scale + static_cast<int64_t>(col) * lds);
    if constexpr (kBias) s += to_float(bias[col]);
    return from_float<O>(s);
  };
  const int m_cta = min(m, kM8);
  constexpr int kThreads = (kConsumerWarps + 1) * 32;
  if constexpr (kSplitK == 1) {
    for (int idx = threadIdx.x; idx < kRowsCta * m_cta; idx += kThreads) {
      const int r = idx % kRowsCta, col_m = idx / kRowsCta;
      const int col = n0 + r;
      if (col >= n) continue;
      float s = 0.f;
#pragma unroll
      for (int gi = 0; gi < kGroups; ++gi) s += partial[gi * kRowTiles + r / kRows][r % kRows][col_m];
      out[static_cast<int64_t>(col_m) * ldo + col] = finish(s, col);
    }
  } else {
    for (int idx = threadIdx.x; idx < kRowsCta * m_cta; idx += kThreads) {
      const int r = idx % kRowsCta, col_m = idx / kRowsCta;
      float s = 0.f;
#pragma unroll
      for (int gi = 0; gi < kGroups; ++gi) s += partial[gi * kRowTiles + r / kRows][r % kRows][col_m];
      cta[idx] = s;
    }
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every rank's cta[] is written
    // Rank q stores the outputs idx = q, q + kSplitK, ... (of this CTA's block), summing the
    // ranks' partials in rank order whichever rank stores.
    for (int idx = split + kSplitK * static_cast<int>(threadIdx.x); idx < kRowsCta * m_cta; idx += kSplitK * kThreads) {
      const int r = idx % kRowsCta, col_m = idx / kRowsCta;
      const int col = n0 + r;
      if (col >= n) continue;
      float s = 0.f;
#pragma unroll
      for (int q = 0; q < kSplitK; ++q) s += *cluster.map_shared_rank(cta + idx, q);
      out[static_cast<int64_t>(col_m) * ldo + col] = finish(s, col);
    }
    cluster.sync();  // no rank leaves while another still reads its shared memory
  }
}

using ::fray::jit_set_err;

template <class T>
constexpr const char* name() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return "bf16";
  else if constexpr (std::is_same_v<T, __half>) return "fp16";
  else return "fp32";
}

template <class T_, class O_, bool kBias_, int kMTiles_, int kWarps_, int kUnroll_, int kStages_ = 0>
struct SmallMConfig {
  using T = T_;
  using O = O_;
  static constexpr bool kBias = kBias_;
  using W = T_;
  static constexpr int kScale = kScaleNone;
  static constexpr int kMTiles = kMTiles_, kWarps = kWarps_, kUnroll = kUnroll_, kStages = kStages_;
  static constexpr int kPartialBytes = kWarps * kRows * kMTiles * 8 * 4;
  static constexpr int kRingBytes = ring_bytes<kStages, kUnroll, kWarps * 32>();
  static constexpr int kSmemBytes = kPartialBytes > kRingBytes ? kPartialBytes : kRingBytes;
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "x and w are bf16 or fp16");
  static_assert(std::is_same_v<O, T> || std::is_same_v<O, float>, "the output is the input dtype or fp32");
  static_assert(kMTiles >= 1 && kMTiles <= 8, "M <= 64");
  static_assert(kStages == 0 || kStages >= 2, "kStages: 0 (registers) or a ring of 2 or more steps");
  static_assert(kSmemBytes <= (227 << 10), "shared memory per CTA");

  static constexpr bool kBulk = false;
  static constexpr int kThreads = kWarps * 32;
  static dim3 grid(int64_t n) { return dim3(static_cast<unsigned>((n + kRows - 1) / kRows)); }
  static constexpr int kCluster = 1;
  static constexpr auto kernel() { return small_m_kernel<T, O, kBias, kMTiles, kWarps, kUnroll, kStages>; }

  static void describe(char* buf, size_t len) {
    snprintf(buf, len, "gemm_small_m %s b=nk out=%s%s m<=%d warps=%d unroll=%d stages=%d", name<T>(), name<O>(),
             kBias ? " bias" : "", kMTiles * 8, kWarps, kUnroll, kStages);
  }
};

// The bulk-copy kernel: kRowTiles 16-row tiles of w per CTA, kConsumerWarps mma warps (plus one
// producer warp), kTileK elements of each row per stage, kStages stages, kSplitK CTAs per row tile
// (a cluster, reduced through distributed shared memory). W8A16: W_ int8_t or __nv_fp8_e4m3 with
// kScale_ kScaleChannel or kScaleGroup.
template <class T_, class O_, bool kBias_, int kMTiles_, int kRowTiles_, int kConsumerWarps_, int kTileK_, int kStages_,
          int kSplitK_, bool kXSmem_ = false, class W_ = T_, int kScale_ = kScaleNone>
struct SmallMBulkConfig {
  using T = T_;
  using O = O_;
  using W = W_;
  static constexpr int kScale = kScale_;
  static constexpr bool kBias = kBias_;
  static constexpr int kMTiles = kMTiles_, kRowTiles = kRowTiles_, kConsumerWarps = kConsumerWarps_;
  static constexpr int kTileK = kTileK_, kStages = kStages_, kSplitK = kSplitK_;
  static constexpr bool kXSmem = kXSmem_;
  static constexpr int kSmemBytes =
      bulk_data_bytes<W, kMTiles, kRowTiles, kConsumerWarps, kTileK, kStages, kXSmem>() + 2 * kStages * 8;
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "x and w are bf16 or fp16");
  static_assert(std::is_same_v<O, T> || std::is_same_v<O, float>, "the output is the input dtype or fp32");
  static_assert(kMTiles >= 1 && kMTiles <= 8, "M <= 64");
  static_assert(kRowTiles >= 1 && kRowTiles <= 4, "16 to 64 rows of w per CTA");
  static_assert(kTileK % (64 / static_cast<int>(sizeof(W))) == 0 && kTileK * static_cast<int>(sizeof(W)) >= 128,
                "kTileK: whole 64-byte chunks, rows of 128 bytes or more");
  static_assert(kScale != kScaleGroup || kTileK % kScaleGroupK == 0, "kScaleGroup: whole groups of 128 per stage");
  static_assert((kScale != kScaleNone) == kIs8Bit<W>, "8-bit weights come with scales, 16-bit ones without");
  static_assert(kStages >= 2, "a ring of 2 or more stages");
  static_assert(kSplitK >= 1 && kSplitK <= 8, "kSplitK: a portable cluster size");
  static_assert(kSmemBytes <= (227 << 10), "shared memory per CTA");

  static constexpr bool kBulk = true;
  static constexpr int kThreads = (kConsumerWarps + 1) * 32;
  static dim3 grid(int64_t n) {
    return dim3(static_cast<unsigned>((n + kRowTiles * kRows - 1) / (kRowTiles * kRows) * kSplitK));
  }
  static constexpr int kCluster = kSplitK;
  static constexpr auto kernel() {
    return small_m_bulk_kernel<T, O, kBias, kMTiles, kRowTiles, kConsumerWarps, kTileK, kStages, kSplitK, kXSmem, W,
                               kScale>;
  }

  static void describe(char* buf, size_t len) {
    const char* w = !kIs8Bit<W> ? "" : std::is_same_v<W, int8_t> ? " w=int8" : " w=e4m3";
    const char* sc = kScale == kScaleChannel ? " scale=channel" : kScale == kScaleGroup ? " scale=group128" : "";
    snprintf(buf, len,
             "gemm_small_m bulk %s%s%s b=nk out=%s%s m<=%d rows=%d warps=1+%d tile_k=%d stages=%d split_k=%d x=%s",
             name<T>(), w, sc, name<O>(), kBias ? " bias" : "", kMTiles * 8, kRowTiles * kRows, kConsumerWarps,
             kTileK, kStages, kSplitK, kXSmem ? "shared" : "global");
  }
};

// Slots, as gemm_sm90.cuh: ptrs = (a, b, bias or 0, out); ints = (M, N, K, lda, ldb, ldc). W8A16
// configurations add the fp32 weight scales: ptrs[4] = scale, ints[6] = its row stride (elements;
// 0 broadcasts one scale to every channel).
template <class Config>
int launch(const FrayArgs* args, char* err, int32_t err_len) {
  using T = typename Config::T;
  using O = typename Config::O;
  using W = typename Config::W;
  constexpr bool kScaled = Config::kScale != kScaleNone;
  constexpr int kAlign = kIs8Bit<W> ? 16 : 8;  // K and ldb: 16-byte weight rows
  if (args == nullptr || args->num_ptrs < 4 || args->num_ints < 6) {
    jit_set_err(err, err_len, "gemm_small_m: expected ptrs (a, b, bias, out) and ints (M, N, K, lda, ldb, ldc), got %d ptrs and %d ints",
            args ? args->num_ptrs : -1, args ? args->num_ints : -1);
    return 1;
  }
  const int64_t m = args->ints[0], n = args->ints[1], k = args->ints[2];
  const int64_t lda = args->ints[3], ldb = args->ints[4], ldc = args->ints[5];
  if (m < 1 || m > Config::kMTiles * 8 || n < 1 || n > INT32_MAX || k < 1 || k > INT32_MAX) {
    jit_set_err(err, err_len, "gemm_small_m: expected 1 <= M <= %d and 1 <= N, K < 2^31, got M=%lld N=%lld K=%lld",
            Config::kMTiles * 8, (long long)m, (long long)n, (long long)k);
    return 1;
  }
  if (k % kAlign || lda % 8 || ldb % kAlign || lda < k || ldb < k || ldc < n) {
    jit_set_err(err, err_len, "gemm_small_m: expected K and ldb multiples of %d, lda of 8, with lda, ldb >= K and ldc >= N, got K=%lld lda=%lld ldb=%lld ldc=%lld N=%lld",
            kAlign, (long long)k, (long long)lda, (long long)ldb, (long long)ldc, (long long)n);
    return 1;
  }
  if (kScaled && (args->num_ptrs < 5 || args->num_ints < 7 || args->ptrs[4] == 0 || (args->ptrs[4] & 3u) ||
                  args->ints[6] < 0)) {
    jit_set_err(err, err_len, "gemm_small_m: this W8A16 kernel expects ptrs[4] = fp32 scales (4-byte aligned) and ints[6] = their row stride >= 0, got %d ptrs and %d ints",
                args->num_ptrs, args->num_ints);
    return 1;
  }
  if ((args->ptrs[0] | args->ptrs[1]) & 15u) {
    jit_set_err(err, err_len, "gemm_small_m: expected 16-byte aligned a and b, got a=0x%llx b=0x%llx",
            (unsigned long long)args->ptrs[0], (unsigned long long)args->ptrs[1]);
    return 1;
  }
  if (Config::kBias != (args->ptrs[2] != 0)) {
    jit_set_err(err, err_len, "gemm_small_m: this kernel was built %s bias, got bias=0x%llx", Config::kBias ? "with" : "without",
            (unsigned long long)args->ptrs[2]);
    return 1;
  }
  auto kernel = Config::kernel();
  constexpr int kSmem = Config::kSmemBytes;
  int device = args->device;
  if (device < 0) cudaGetDevice(&device);
  if (jit_opt_in_smem<Config>(kernel, kSmem, device, err, err_len, "gemm_small_m")) return 1;
  const T* a_p = reinterpret_cast<const T*>(args->ptrs[0]);
  const W* b_p = reinterpret_cast<const W*>(args->ptrs[1]);
  const float* s_p = kScaled ? reinterpret_cast<const float*>(args->ptrs[4]) : nullptr;
  const int64_t lds = kScaled ? args->ints[6] : 0;
  const T* bias_p = reinterpret_cast<const T*>(args->ptrs[2]);
  O* out_p = reinterpret_cast<O*>(args->ptrs[3]);
  const int m32 = static_cast<int>(m), n32 = static_cast<int>(n), k32 = static_cast<int>(k);
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(args->stream);
  cudaError_t e = cudaSuccess;
  if constexpr (!Config::kBulk) {
    kernel<<<Config::grid(n), Config::kThreads, kSmem, stream>>>(a_p, b_p, bias_p, out_p, m32, n32, k32, lda, ldb, ldc);
  } else if constexpr (Config::kCluster == 1) {
    kernel<<<Config::grid(n), Config::kThreads, kSmem, stream>>>(a_p, b_p, bias_p, out_p, m32, n32, k32, lda, ldb, ldc,
                                                                 s_p, lds);
  } else {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = Config::kCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = Config::grid(n);
    cfg.blockDim = dim3(Config::kThreads);
    cfg.dynamicSmemBytes = kSmem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    e = cudaLaunchKernelEx(&cfg, kernel, a_p, b_p, bias_p, out_p, m32, n32, k32, lda, ldb, ldc, s_p, lds);
  }
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) {
    jit_set_err(err, err_len, "gemm_small_m: launch failed: %s", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

}  // namespace small_m
}  // namespace gemm
}  // namespace fray

#define FRAY_GEMM_SMALL_M_ENTRY(CONFIG)                                                           \
  extern "C" __attribute__((visibility("default"))) int fray_jit_launch(const FrayArgs* args,    \
                                                                        char* err, int32_t len) { \
    return ::fray::gemm::small_m::launch<CONFIG>(args, err, len);                                 \
  }                                                                                               \
  extern "C" __attribute__((visibility("default"))) int64_t fray_jit_workspace_bytes(            \
      const FrayArgs*) {                                                                          \
    return 0;                                                                                     \
  }                                                                                               \
  extern "C" __attribute__((visibility("default"))) const char* fray_jit_describe(void) {        \
    static char buf[160] = {};                                                                    \
    if (buf[0] == 0) CONFIG::describe(buf, sizeof(buf));                                          \
    return buf;                                                                                   \
  }
