// Fray: MLA decode on Hopper tensor cores (fray.mla_decode, backend "cuda").
//
// DeepSeek-style multi-head latent attention over a paged latent cache: every cached token is one
// row of 576 values (512 latent + 64 rotary) that is the key (all 576) and, in its first 512
// columns, the value. All query heads of a sequence share those rows, so one CTA takes 64 query
// rows, (query token, head) pairs of one sequence, and streams the sequence's cache (or one split
// of it) once for all of them:
//   - warpgroup 0, the producer: one elected thread issues the TMA loads of 64-token cache tiles
//     (one box per page a tile spans) into a two-stage ring and keeps 24 registers a thread;
//   - warpgroup 1: S = Q K^T (64 x 64, K = 576) by wgmma with Q and K in shared memory, the mask
//     and the online softmax in registers, P rounded to the input type and stored to shared
//     memory with the rows' rescale factors, then O[:, 0:256] += P V[:, 0:256];
//   - warpgroup 2: O[:, 256:512] += P V[:, 256:512] from the same P, rescaled by the same factors.
// Each warpgroup holds its half of the 64 x 512 fp32 accumulator (128 registers a thread). Tile
// n's S is issued together with tile n-1's P V, so warpgroup 1's softmax runs under that product
// and under warpgroup 2's. V is read MN-major from the same shared-memory tile as K: a K-major
// [64 tokens, 576] tile of 128-byte swizzled rows is, for its first 512 columns, exactly the
// MN-major [512, 64 tokens] operand of P V (both are 8-row x 128-byte swizzle atoms, token atoms
// first), which the host test checks element by element.
//
// Rows. Row r of a CTA is query token r / block_h and head hb * block_h + r % block_h (hb: the
// CTA's head block, block_h = min(Hq, 64 / s_q)); rows past s_q x block_h, or past Hq, are zeros
// in Q and never written. Query token i of s_q sees cache positions j < lens[b] - s_q + 1 + i.
//
// Splits. The cache positions [0, capacity) are cut into num_splits ranges of split_size (whole
// 64-token tiles); a CTA takes one (head block, split, sequence). With one split it writes out
// and lse itself; otherwise it writes its range's output normalised within the range (fp32) and
// the range's natural-log LSE to the partials, and a second kernel merges the partials of each
// (sequence, query, head) in split order (deterministic). A split starting at or past lens[b]
// exits at once (the merge skips it); lens[b] is read on the device only (clamped to [0,
// capacity]), so a launch replays under CUDA graphs with new lengths.
//
// Paged cache: kv [num_blocks, Page, 1, 576] addressed as [token in page, D, page]; a 64-token
// tile is 64 / min(Page, 64) TMA boxes, the page of each read from the block table (entries past
// the sequence's last token are never read: those boxes reload its last page, and their tokens
// are masked). Tokens past lens[b] in the last tile are masked in S and their value rows zeroed in
// shared memory before P V, so whatever lies there (NaN included) cannot reach O as 0 x NaN.
//
// A schedule in which the two consumers take the tiles in turn was tried and measured slower at
// every shape (bench/NOTES.md, MLA).
//
// Template parameters: MlaConfig<Element (cutlass::bfloat16_t / cutlass::half_t), Page (16, 32, 64
// or 128)>.
// Slots: ptrs = (q, kv, block_table, lens, out, lse, partial_o, partial_lse);
// ints = (batch, s_q, Hq, block_h, num_splits, split_size, max_blocks, num_blocks,
//         q_batch, q_token, q_head, kv_page, kv_token, bt_row,
//         o_batch, o_token, o_head, lse_batch, lse_token, lse_head);
// floats = (scale,). Partials (num_splits > 1): partial_o [B, s_q, Hq, num_splits, 512] and
// partial_lse [B, s_q, Hq, num_splits], fp32, contiguous.
#pragma once

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/numeric_types.h"
#include "cutlass/pipeline/pipeline.hpp"

#include "cuda/attention/wgmma_softmax.cuh"
#include "cuda/common/jit_entry.h"
#include "cuda/common/launch_abi.h"

namespace fray {
namespace attention {

template <class Element_, int kPage_>
struct MlaConfig {
  using Element = Element_;
  static constexpr int kD = 576;    // key: 512 latent + 64 rotary
  static constexpr int kDV = 512;   // value: the latent
  static constexpr int kRows = 64;  // query rows (token, head) per CTA
  static constexpr int kBlockN = 64;
  static constexpr int kHalf = kDV / 2;  // value columns per consumer warpgroup
  static constexpr int kStages = 2;
  static constexpr int kPage = kPage_;
  static constexpr int kBoxN = kPage >= kBlockN ? kBlockN : kPage;
  static constexpr int kThreads = 384;
  static constexpr int kTileElems = kBlockN * kD;
  static_assert(kPage >= 16 && kPage <= 128 && (kPage & (kPage - 1)) == 0, "page size: 16, 32, 64 or 128");

  using MmaQK = decltype(cute::make_tiled_mma(cute::GMMA::ss_op_selector<
                                              Element, Element, float,
                                              cute::Shape<cute::Int<kRows>, cute::Int<kBlockN>, cute::Int<kD>>>()));
  using MmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<kRows>, cute::Int<kHalf>, cute::Int<kBlockN>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));

  // Q and one cache tile K-major ([rows, 576], D contiguous); P K-major ([rows, tokens]); one
  // warpgroup's half of the value as the P V product's B operand: [256, tokens], D contiguous
  // (MN-major), at kHalf x kBlockN elements past the tile's base for the second half.
  using SmemQ = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                             cute::Shape<cute::Int<kRows>, cute::Int<kD>>{}));
  using SmemK = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                             cute::Shape<cute::Int<kBlockN>, cute::Int<kD>>{}));
  using SmemVHalf = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<Element>{},
                                                 cute::Shape<cute::Int<kHalf>, cute::Int<kBlockN>>{},
                                                 cute::Step<cute::_2, cute::_1>{}));
  static constexpr int kHalfOffset = kHalf * kBlockN;  // elements from a tile's base to its second half
  using SmemP = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                             cute::Shape<cute::Int<kRows>, cute::Int<kBlockN>>{}));
  // One TMA box: kBoxN tokens of the tile (a sub-block keeping the tile's strides).
  using SmemKBox = decltype(cute::composition(
      SmemK{}, cute::make_layout(cute::Shape<cute::Int<kBoxN>, cute::Int<kD>>{},
                                 cute::make_stride(cute::_1{}, cute::Int<kBlockN>{}))));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemQ>> q;
    alignas(1024) cute::array_aligned<Element, kStages * kTileElems> kv;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemP>> p;
    float corr[kRows];  // the rows' rescale factors of the current tile
    float inv[kRows];   // 1 / the rows' sums, for the epilogue
    typename Pipeline::SharedStorage pipe;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "tiles exceed the SM's shared memory");

  static void describe(char* buf, int n) {
    snprintf(buf, n, "mla_sm90 %s D576/512 rows %d tile %d stages %d page %d",
             cute::is_same_v<Element, cutlass::bfloat16_t> ? "bf16" : "fp16", kRows, kBlockN, kStages, kPage);
  }
};

namespace mla {

using namespace cute;

// [token in page, D, page] for the paged cache.
using GmemShape = Shape<int32_t, int32_t, int32_t>;
using GmemStride = Stride<int64_t, _1, int64_t>;

template <class Config>
struct TmaTypes {
  using E = typename Config::Element;
  using K = decltype(make_tma_copy(SM90_TMA_LOAD{},
                                   make_tensor(make_gmem_ptr(static_cast<E const*>(nullptr)), GmemShape{}, GmemStride{}),
                                   typename Config::SmemKBox{}, Shape<Int<Config::kBoxN>, Int<Config::kD>>{}, _1{}));
};

template <class Config>
struct Params {
  typename TmaTypes<Config>::K tma_k;
  GmemShape shape_k;
  const typename Config::Element* q;
  typename Config::Element* out;
  float* lse;
  float* part_o;
  float* part_lse;
  const int32_t* block_table;
  const int32_t* lens;
  int64_t q_batch, q_token, q_head, bt_row;
  int64_t o_batch, o_token, o_head, l_batch, l_token, l_head;
  int32_t s_q, hq, block_h, num_splits, split_size, capacity;
  float scale_log2, scale;
};

// The mask of the tile at position t0 for CTA row `row` as one bound on the column offsets
// col - col0 of a thread's elements in that row (col0: the thread's first column): row r's query
// (token r / block_h of s_q) sees positions j < seqlen - s_q + 1 + r / block_h, and none past
// seqlen (padding rows included).
CUTE_HOST_DEVICE int mla_mask_bound(int row, int t0, int col0, int block_h, int s_q, int seqlen) {
  return cute::min(seqlen - s_q + 1 + row / block_h, seqlen) - t0 - col0;
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1) mla_kernel(const __grid_constant__ Params<Config> p) {
  using E = typename Config::Element;
  constexpr int kRows = Config::kRows, kBlockN = Config::kBlockN, kD = Config::kD, kHalf = Config::kHalf;
  using Storage = typename Config::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  Storage& st = *reinterpret_cast<Storage*>(smem_raw);

  const int hb = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int seqlen = min(max(p.lens[b], 0), p.capacity);
  const int start = split * p.split_size;
  const int end = min(start + p.split_size, seqlen);
  const int n_tiles = end > start ? (end - start + kBlockN - 1) / kBlockN : 0;
  const bool single = p.num_splits == 1;
  const int tid = int(threadIdx.x) % 128;
  const int wg = cutlass::canonical_warp_group_idx();

  // (query token, head) of row r; valid rows are stored.
  auto row_q = [&](int r) { return r / p.block_h; };
  auto row_h = [&](int r) { return hb * p.block_h + r % p.block_h; };
  auto row_ok = [&](int r) { return row_q(r) < p.s_q && row_h(r) < p.hq; };

  if (n_tiles == 0) {  // the whole CTA, before any barrier
    if (!single) return;  // the merge skips this split
    // one split over an empty sequence: zero rows, lse -inf
    for (int idx = threadIdx.x; idx < kRows * (Config::kDV / 2); idx += Config::kThreads) {
      const int r = idx / (Config::kDV / 2), c = 2 * (idx % (Config::kDV / 2));
      if (!row_ok(r)) continue;
      E* dst = p.out + int64_t(b) * p.o_batch + int64_t(row_q(r)) * p.o_token + int64_t(row_h(r)) * p.o_head + c;
      dst[0] = E(0.f);
      dst[1] = E(0.f);
      if (c == 0)
        p.lse[int64_t(b) * p.l_batch + int64_t(row_q(r)) * p.l_token + int64_t(row_h(r)) * p.l_head] = -INFINITY;
    }
    return;
  }

  const int warp = cutlass::canonical_warp_idx_sync();
  const bool leader = warp == 0 && cute::elect_one_sync();
  using Pipe = typename Config::Pipeline;
  typename Pipe::Params pp;
  pp.transaction_bytes = kBlockN * kD * int(sizeof(E));
  pp.role = wg == 0 ? Pipe::ThreadCategory::Producer : Pipe::ThreadCategory::Consumer;
  pp.is_leader = leader;
  pp.num_consumers = 256;
  Pipe pipe(st.pipe, pp, Shape<_1, _1, _1>{});
  __syncthreads();

  E* kv_base = st.kv.data();
  auto stage_k = [&](int stage) {
    return make_tensor(make_smem_ptr(kv_base + stage * Config::kTileElems), typename Config::SmemK{});
  };

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (!leader) return;
    constexpr int kBoxN = Config::kBoxN, kPage = Config::kPage, kBoxes = kBlockN / kBoxN;
    Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);  // (Page, D, pages)
    const int32_t* table = p.block_table + int64_t(b) * p.bt_row;
    const int last = (seqlen - 1) / kPage;  // n_tiles > 0: seqlen >= 1
    auto write = cutlass::make_producer_start_state<Pipe>();
    for (int n = 0; n < n_tiles; ++n) {
      int page[kBoxes], box[kBoxes];
      CUTE_UNROLL
      for (int i = 0; i < kBoxes; ++i) {
        const int t0 = start + n * kBlockN + i * kBoxN;
        page[i] = table[min(t0 / kPage, last)];
        box[i] = (t0 % kPage) / kBoxN;
      }
      pipe.producer_acquire(write);
      Tensor sK = stage_k(write.index());
      CUTE_UNROLL
      for (int i = 0; i < kBoxes; ++i) {
        Tensor gK = local_tile(mK(_, _, page[i]), Shape<Int<kBoxN>, Int<kD>>{}, make_coord(box[i], _0{}));
        Tensor sKb = local_tile(sK, Shape<Int<kBoxN>, Int<kD>>{}, make_coord(i, _0{}));
        auto [tKg, tKs] = tma_partition(p.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sKb),
                                        group_modes<0, 2>(gK));
        copy(p.tma_k.with(*pipe.producer_get_barrier(write), 0), tKg, tKs);
      }
      ++write;
    }
    return;
  }

  // ---- consumers: Q into shared memory (both warpgroups), zeros in the rows not stored ----
  cutlass::arch::warpgroup_reg_alloc<240>();
  Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Config::SmemQ{});
  Tensor sP = make_tensor(make_smem_ptr(st.p.data()), typename Config::SmemP{});
  {
    constexpr int kChunks = kD / 8;  // 16-byte chunks a row
    for (int idx = int(threadIdx.x) - 128; idx < kRows * kChunks; idx += 256) {
      const int r = idx / kChunks, c = 8 * (idx % kChunks);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row_ok(r)) {
        v = *reinterpret_cast<const uint4*>(p.q + int64_t(b) * p.q_batch + int64_t(row_q(r)) * p.q_token +
                                            int64_t(row_h(r)) * p.q_head + c);
      }
      *reinterpret_cast<uint4*>(&sQ(r, c)) = v;
    }
    cutlass::arch::fence_view_async_shared();
    asm volatile("bar.sync 1, 256;");
  }

  // Rows of this thread's fragments: the same for S (64 x 64) and each O half (64 x 256).
  typename Config::MmaPV mma_pv;
  auto thr_pv = mma_pv.get_thread_slice(tid);
  Tensor tOrP = thr_pv.partition_fragment_A(sP);
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kRows>, Int<kHalf>>{});
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kHalf>>{}));
  Tensor O = make_tensor(tOrO.data(), rows_cols(tOrO.layout()));
  Tensor cO = make_tensor(tOcO.data(), rows_cols(tOcO.layout()));
  constexpr int kR = decltype(size<0>(O))::value;  // 2
  clear(tOrO);
  const int half = wg - 1;
  auto issue_pv = [&](int stage) {  // O[:, half] += P V[:, half], issued
    Tensor sV = make_tensor(make_smem_ptr(kv_base + stage * Config::kTileElems + half * Config::kHalfOffset),
                            typename Config::SmemVHalf{});
    Tensor tOrV = thr_pv.partition_fragment_B(sV);
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    gemm(mma_pv, tOrP, tOrV, tOrO);
    warpgroup_commit_batch();
  };
  auto rescale = [&](const float (&corr)[kR]) {
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(O); ++j) O(i, j) *= corr[i];
    }
  };
  typename Pipe::PipelineState read;
  float row_sum[kR], row_max[kR];

  // S = Q K^T and its mask (warpgroup 1).
  typename Config::MmaQK mma_qk;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kRows>, Int<kBlockN>>{});
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kBlockN>>{}));
  Tensor S = make_tensor(tSrS.data(), rows_cols(tSrS.layout()));
  Tensor cS = make_tensor(tScS.data(), rows_cols(tScS.layout()));
  static_assert(decltype(size<0>(S))::value == kR, "one row split for S and O");
  auto issue_qk = [&](int stage) {  // S = Q K^T, issued
    Tensor tSrK = thr_qk.partition_fragment_B(stage_k(stage));
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
    // 36 k-steps: fully unrolled, the loop-invariant Q descriptors (two registers each) are
    // hoisted out of the tile loop and spill; by 9 they are not.
#pragma unroll 9
    for (int kb = 0; kb < size<2>(tSrQ); ++kb) {
      gemm(mma_qk, tSrQ(_, _, kb), tSrK(_, _, kb), tSrS);
      mma_qk.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };
  // Positions past each row's visible end to -inf (only tiles reaching past the first row's).
  auto mask = [&](int n) {
    const int t0 = start + n * kBlockN;
    if (t0 + kBlockN <= seqlen - p.s_q + 1) return;
    const int col0 = get<1>(cS(0, 0));
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      const int limit = mla_mask_bound(get<0>(cS(i, 0)), t0, col0, p.block_h, p.s_q, seqlen);
      CUTE_UNROLL
      for (int j = 0; j < size<1>(S); ++j) {
        if (get<1>(cS(i, j)) - col0 >= limit) S(i, j) = -INFINITY;
      }
    }
  };
  // Value rows past the sequence zeroed in tile n's stage (the last tile; QK^T is done reading it).
  auto zero_tail = [&](int n, int stage) {
    const int valid = seqlen - (start + n * kBlockN);
    if (valid < kBlockN) {
      Tensor sK = stage_k(stage);
      for (int idx = tid; idx < (kBlockN - valid) * (Config::kDV / 8); idx += 128) {
        const int t = valid + idx / (Config::kDV / 8), c = 8 * (idx % (Config::kDV / 8));
        *reinterpret_cast<uint4*>(&sK(t, c)) = make_uint4(0, 0, 0, 0);
      }
    }
  };
  // Row r's sum s (all of its tiles) and maximum mx: 1 / s for the epilogue and the LSE.
  auto finish_row = [&](int r, float s, float mx) {
    st.inv[r] = s > 0.f ? 1.f / s : 0.f;
    if (row_ok(r)) {
      const float l = s > 0.f ? logf(s) + mx * p.scale : -INFINITY;
      if (single) {
        p.lse[int64_t(b) * p.l_batch + int64_t(row_q(r)) * p.l_token + int64_t(row_h(r)) * p.l_head] = l;
      } else {
        p.part_lse[((int64_t(b) * p.s_q + row_q(r)) * p.hq + row_h(r)) * p.num_splits + split] = l;
      }
    }
  };

  if (wg == 1) {
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      row_max[i] = -INFINITY;
      row_sum[i] = 0.f;
    }
    auto softmax = [&](float (&corr)[kR]) { online_softmax(S, row_max, row_sum, corr, p.scale_log2); };
    // P (rounded to E) and the rescale factors into shared memory for both warpgroups; value rows
    // past the sequence zeroed in the last tile's stage (QK^T is done reading it).
    auto publish = [&](int n, int stage, const float (&corr)[kR]) {
      zero_tail(n, stage);
      CUTE_UNROLL
      for (int i = 0; i < kR; ++i) {
        const int r = get<0>(cS(i, 0));
        CUTE_UNROLL
        for (int j = 0; j < size<1>(S); j += 2) {
          cutlass::Array<float, 2> pair;
          pair[0] = S(i, j);
          pair[1] = S(i, j + 1);
          cutlass::NumericArrayConverter<E, float, 2> convert;
          *reinterpret_cast<cutlass::Array<E, 2>*>(&sP(r, get<1>(cS(i, j)))) = convert(pair);
        }
        if ((tid & 3) == 0) st.corr[r] = corr[i];
      }
      cutlass::arch::fence_view_async_shared();
      asm volatile("bar.arrive 2, 256;");  // P ready
    };

    float corr[kR];
    typename Pipe::PipelineState read_v;
    pipe.consumer_wait(read);
    issue_qk(read.index());
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    mask(0);
    softmax(corr);
    publish(0, read.index(), corr);
    ++read;
    for (int n = 1; n < n_tiles; ++n) {
      pipe.consumer_wait(read);
      issue_qk(read.index());
      issue_pv(read_v.index());
      warpgroup_wait<1>();  // S done; P V still running
      warpgroup_fence_operand(tSrS);
      mask(n);
      softmax(corr);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      pipe.consumer_release(read_v);
      ++read_v;
      rescale(corr);
      asm volatile("barrier.sync 3, 256;");  // warpgroup 2 is done with the previous P
      publish(n, read.index(), corr);
      ++read;
    }
    issue_pv(read_v.index());
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    pipe.consumer_release(read_v);

    // The rows' sums (a row's 4 threads), 1 / sum for warpgroup 2, and the LSE.
    CUTE_UNROLL
    for (int i = 0; i < kR; ++i) {
      float s = row_sum[i];
      s += __shfl_xor_sync(0xffffffff, s, 1);
      s += __shfl_xor_sync(0xffffffff, s, 2);
      row_sum[i] = s;
      const int r = get<0>(cS(i, 0));
      if ((tid & 3) == 0) finish_row(r, s, row_max[i]);
    }
  } else {
    for (int n = 0; n < n_tiles; ++n) {
      pipe.consumer_wait(read);
      asm volatile("bar.sync 2, 256;");  // P ready
      float corr[kR];
      CUTE_UNROLL
      for (int i = 0; i < kR; ++i) corr[i] = st.corr[get<0>(cO(i, 0))];
      rescale(corr);
      issue_pv(read.index());
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      pipe.consumer_release(read);
      ++read;
      // P and corr may be overwritten. A sync, not an arrive: warpgroup 1 reaches this barrier
      // before it publishes the next P, which this warpgroup waits for next in any case, so
      // waiting here delays it by nothing. With bar.arrive (correct by PTX's barrier semantics),
      // racecheck reported the reads of corr above and warpgroup 1's writes of the next tile's
      // as WAR hazards in every case of more than one tile a CTA (an H100, 2026-12-07).
      // barrier.sync, the unaligned form, on both sides: the two warpgroups block on barrier 3
      // at different instructions, which bar.sync (= barrier.sync.aligned) does not allow;
      // synccheck reported it as divergent threads (1674101, an H100, 2026-12-07).
      if (n + 1 < n_tiles) asm volatile("barrier.sync 3, 256;");
    }
  }
  asm volatile("bar.sync 4, 256;");  // st.inv written

  // Epilogue: each warpgroup stores its 256 columns of the rows it may write.
  CUTE_UNROLL
  for (int i = 0; i < kR; ++i) {
    const int r = get<0>(cO(i, 0));
    if (!row_ok(r)) continue;
    const float inv = st.inv[r];
    const int64_t row = (int64_t(b) * p.s_q + row_q(r)) * p.hq + row_h(r);
    if (single) {
      E* dst = p.out + int64_t(b) * p.o_batch + int64_t(row_q(r)) * p.o_token + int64_t(row_h(r)) * p.o_head +
               half * kHalf;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(O); j += 2) {
        cutlass::Array<float, 2> pair;
        pair[0] = O(i, j) * inv;
        pair[1] = O(i, j + 1) * inv;
        cutlass::NumericArrayConverter<E, float, 2> convert;
        *reinterpret_cast<cutlass::Array<E, 2>*>(dst + get<1>(cO(i, j))) = convert(pair);
      }
    } else {
      float* dst = p.part_o + (row * p.num_splits + split) * Config::kDV + half * kHalf;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(O); j += 2) {
        *reinterpret_cast<float2*>(dst + get<1>(cO(i, j))) = make_float2(O(i, j) * inv, O(i, j + 1) * inv);
      }
    }
  }
}

// The merge of the splits' partials: one CTA of 128 threads per (sequence, query, head), 4 value
// columns a thread. Splits that started at or past lens[b] wrote nothing and are skipped; the
// others are summed in split order with weights exp(lse_s - max lse) (a split in which the query
// saw nothing wrote lse -inf: weight 0).
template <class E>
__global__ void __launch_bounds__(128) mla_merge_kernel(const float* __restrict__ part_o,
                                                         const float* __restrict__ part_lse,
                                                         const int32_t* __restrict__ lens, E* out, float* lse,
                                                         int s_q, int hq, int num_splits, int split_size, int capacity,
                                                         int64_t o_batch, int64_t o_token, int64_t o_head,
                                                         int64_t l_batch, int64_t l_token, int64_t l_head) {
  const int h = blockIdx.x % hq, qi = (blockIdx.x / hq) % s_q, b = blockIdx.x / (hq * s_q);
  const int seqlen = min(max(lens[b], 0), capacity);
  const int active = (seqlen + split_size - 1) / split_size;
  const int64_t base = int64_t(blockIdx.x) * num_splits;
  float m = -INFINITY;
  for (int s = 0; s < active; ++s) m = fmaxf(m, part_lse[base + s]);
  const float shift = m == -INFINITY ? 0.f : m;
  float total = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < active; ++s) {
    const float w = expf(part_lse[base + s] - shift);
    const float4 v = reinterpret_cast<const float4*>(part_o + (base + s) * 512)[threadIdx.x];
    total += w;
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  E* dst = out + int64_t(b) * o_batch + int64_t(qi) * o_token + int64_t(h) * o_head + 4 * threadIdx.x;
  cutlass::Array<float, 4> vals;
  vals[0] = acc.x * inv;
  vals[1] = acc.y * inv;
  vals[2] = acc.z * inv;
  vals[3] = acc.w * inv;
  cutlass::NumericArrayConverter<E, float, 4> convert;
  const cutlass::Array<E, 4> o = convert(vals);
  *reinterpret_cast<cutlass::Array<E, 2>*>(dst) = *reinterpret_cast<const cutlass::Array<E, 2>*>(o.data());
  *reinterpret_cast<cutlass::Array<E, 2>*>(dst + 2) = *reinterpret_cast<const cutlass::Array<E, 2>*>(o.data() + 2);
  if (threadIdx.x == 0) {
    lse[int64_t(b) * l_batch + int64_t(qi) * l_token + int64_t(h) * l_head] =
        total > 0.f ? shift + logf(total) : -INFINITY;
  }
}

template <class Config>
int launch(const FrayArgs* args, char* err, int32_t err_len) {
  using E = typename Config::Element;
  if (args->num_ptrs != 8 || args->num_ints != 20 || args->num_floats != 1) {
    jit_set_err(err, err_len, "mla_sm90: expected 8 pointers, 20 ints, 1 float, got %d, %d, %d", args->num_ptrs,
                args->num_ints, args->num_floats);
    return 1;
  }
  const uint64_t* ptr = args->ptrs;
  const int64_t* in = args->ints;
  const int batch = int(in[0]), s_q = int(in[1]), hq = int(in[2]), block_h = int(in[3]);
  const int num_splits = int(in[4]), split_size = int(in[5]);
  const int64_t max_blocks = in[6], num_blocks = in[7];
  if (batch <= 0 || hq <= 0) return 0;
  if (s_q < 1 || block_h < 1 || block_h * s_q > Config::kRows || num_splits < 1 || split_size < 1 ||
      split_size % Config::kBlockN != 0 || max_blocks < 1 || max_blocks * Config::kPage > INT32_MAX ||
      num_blocks < 1 || num_blocks > INT32_MAX) {
    jit_set_err(err, err_len, "mla_sm90: bad plan (s_q %d, block_h %d, splits %d of %d, max_blocks %lld, pages %lld)",
                s_q, block_h, num_splits, split_size, static_cast<long long>(max_blocks),
                static_cast<long long>(num_blocks));
    return 1;
  }
  // q by 16-byte loads, the cache by TMA: 16-byte aligned bases and strides multiples of 8 elements.
  const int64_t qs[3] = {in[8], in[9], in[10]};
  if (ptr[0] % 16 != 0 || ptr[1] % 16 != 0 || ptr[4] % 4 != 0 || qs[0] % 8 || qs[1] % 8 || qs[2] % 8 ||
      in[11] % 8 || in[12] % 8 || in[14] % 2 || in[15] % 2 || in[16] % 2) {
    jit_set_err(err, err_len, "mla_sm90: q and kv_cache need 16-byte aligned pointers and strides of multiples of 8 "
                "elements, out a 4-byte aligned pointer and even strides");
    return 1;
  }
  const int head_blocks = (hq + block_h - 1) / block_h;
  if (head_blocks > 65535 || num_splits > 65535 || batch > 65535) {
    jit_set_err(err, err_len, "mla_sm90: grid (%d, %d, %d) exceeds 65535", head_blocks, num_splits, batch);
    return 1;
  }
  Params<Config> p{};
  p.shape_k = GmemShape(Config::kPage, Config::kD, int32_t(num_blocks));
  auto gk = make_tensor(make_gmem_ptr(reinterpret_cast<E const*>(ptr[1])), p.shape_k,
                        GmemStride(in[12], _1{}, num_blocks == 1 ? in[12] * Config::kPage : in[11]));
  p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gk, typename Config::SmemKBox{},
                          Shape<Int<Config::kBoxN>, Int<Config::kD>>{}, _1{});
  p.q = reinterpret_cast<const E*>(ptr[0]);
  p.block_table = reinterpret_cast<const int32_t*>(ptr[2]);
  p.lens = reinterpret_cast<const int32_t*>(ptr[3]);
  p.out = reinterpret_cast<E*>(ptr[4]);
  p.lse = reinterpret_cast<float*>(ptr[5]);
  p.part_o = reinterpret_cast<float*>(ptr[6]);
  p.part_lse = reinterpret_cast<float*>(ptr[7]);
  p.q_batch = in[8];
  p.q_token = in[9];
  p.q_head = in[10];
  p.bt_row = in[13];
  p.o_batch = in[14];
  p.o_token = in[15];
  p.o_head = in[16];
  p.l_batch = in[17];
  p.l_token = in[18];
  p.l_head = in[19];
  p.s_q = s_q;
  p.hq = hq;
  p.block_h = block_h;
  p.num_splits = num_splits;
  p.split_size = split_size;
  p.capacity = int32_t(max_blocks * Config::kPage);
  p.scale = float(args->floats[0]);
  p.scale_log2 = float(args->floats[0] * 1.4426950408889634);
  if (num_splits > 1 && (ptr[6] == 0 || ptr[7] == 0 || ptr[6] % 16 != 0)) {
    jit_set_err(err, err_len, "mla_sm90: %d splits need the partials (16-byte aligned)", num_splits);
    return 1;
  }

  int device = args->device;
  if (device < 0) cudaGetDevice(&device);
  auto kernel = mla_kernel<Config>;
  if (jit_opt_in_smem<Config>(kernel, Config::kSmemBytes, device, err, err_len, "mla_sm90")) return 1;
  auto stream = reinterpret_cast<cudaStream_t>(args->stream);
  kernel<<<dim3(head_blocks, num_splits, batch), Config::kThreads, Config::kSmemBytes, stream>>>(p);
  if (num_splits > 1) {
    mla_merge_kernel<E><<<batch * s_q * hq, 128, 0, stream>>>(p.part_o, p.part_lse, p.lens, p.out, p.lse, s_q, hq,
                                                             num_splits, split_size, p.capacity, p.o_batch, p.o_token,
                                                             p.o_head, p.l_batch, p.l_token, p.l_head);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    jit_set_err(err, err_len, "mla_sm90: launch failed: %s", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

template <class Config>
int64_t workspace_bytes(const FrayArgs*) {
  return 0;
}

}  // namespace mla
}  // namespace attention
}  // namespace fray

#define FRAY_MLA_ENTRY(CONFIG) FRAY_SM90_ENTRY(CONFIG, ::fray::attention::mla, "mla_sm90")
