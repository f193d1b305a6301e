// Fray: prefill attention on Hopper tensor cores (fray.prefill_attention, backend "cuda").
//
// One CTA computes one 128-row query tile of one (sequence, query head) against every key tile
// it can see, FlashAttention-style (online softmax in fp32), in three warpgroups:
//   - warpgroup 0, the producer: one elected thread issues the TMA loads (the Q tile once, then K
//     and V tiles through two multi-stage shared-memory rings, last key tile first) and keeps
//     only 24 registers a thread (setmaxnreg);
//   - warpgroups 1 and 2, the consumers (240 registers each): each owns 64 of the 128 query rows.
//     Per key tile: S = Q K^T by wgmma from shared memory, masking (the sequence's end; causal,
//     aligned bottom-right), the online softmax in registers, P rounded to the input type and
//     kept in registers, O += P V by wgmma with P as the register operand and V (row-major [keys,
//     D], so N-major for this product) from shared memory.
// K and V have separate rings so that S can start while V is still landing. The epilogue
// divides by the row sums and writes O (and the natural-log LSE) straight from registers, rows
// past the sequence's end masked.
//
// Layouts. Every tensor is addressed as [batch, token, head, D] with element strides (the
// varlen form is batch 1 with cu_seqlens offsets into the token dimension), D contiguous. TMA
// needs 16-byte aligned bases and strides that are multiples of 16 bytes, which the entry
// checks. Query rows past the sequence (or past q's rows) are read (TMA fills zeros past the
// tensor) but never written. Key rows past the sequence are masked in S; in V they are zeroed in
// shared memory before P V when the sequence ends inside the tile, so that another sequence's
// rows (or a buffer's uninitialised tail, NaN included) never reach the output.
//
// Paged K / V (Page > 0): k and v are page pools [num_blocks, Page, Hkv, D] (addressed as
// [page, token in page, head, D]) read through an int32 block table [B, max_blocks]: key t of
// sequence b is row t % Page of page block_table[b, t / Page]. Sequence b has
// cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys, clamped to [0, max_blocks * Page]. A key tile is
// loaded as BlockN / min(Page, BlockN) TMA boxes, one per page it spans; boxes past the
// sequence's last key reload its last page (they are masked, and V's rows zeroed, like any key
// past the end). Table entries are used as given: TMA fills a page outside the pool with zeros.
//
// Persistent (kPersistent): one CTA per SM instead of one per query tile. The CTAs walk the tiles
// in one order, CTA i taking tiles i, i + grid, i + 2 grid, ...: the query tiles of one (sequence,
// head) side by side, the last first (causal: the ones that see the most keys), then the next
// head's, sequence by sequence, as the non-persistent grid orders them: the CTAs at work at one
// time read the K / V of a few heads, which stay in L2. (Heads fastest instead, the last query
// tiles of every head first, ran 1-10% slower at B2 Hq32 S8192-16384 on an H100, 2026-12-07: the
// K / V of 16 heads at a time do not stay in L2; bench/NOTES.md.) The producer starts
// a tile's loads as soon as the ring has room and the consumers are done with the previous tile's
// Q (barrier bar_q_empty), so they overlap the previous tile's last products and epilogue.
//
// Template parameters: PrefillConfig<Element (cutlass::bfloat16_t / cutlass::half_t), HeadDim
// (64, 128, 256), BlockN (key tile), Stages (ring depth), Causal, Overlap, PingPong, Page (0:
// contiguous K / V; 16, 32, 64 or 128: paged), Persistent>.
//
// Slots: ptrs = (q, k, v, out, lse, cu_seqlens_q or 0, cu_seqlens_k or 0, block_table or 0);
// ints = (batch, Hq, Hkv, rows_q, rows_k, max_seqlen_q, seqlen_q, seqlen_k,
//         q_batch, q_token, q_head, k_batch, k_token, k_head, v_batch, v_token, v_head,
//         o_batch, o_token, o_head, lse_batch, lse_head, bt_row, max_blocks, num_blocks);
// floats = (scale,).
// rows_q / rows_k: the token extent of q / k (total rows in the varlen form, S in the batched
// one, Page for pools); seqlen_q / seqlen_k: the batched form's lengths (ignored when cu_seqlens
// are given, where a sequence's queries are cut at max_seqlen_q and its offsets clamped into the
// rows). Paged: k_batch / v_batch are the pools' page strides, bt_row the block table's row
// stride, num_blocks the pools' page count (bt_row, max_blocks, num_blocks are 0 otherwise).
// The varlen form ignores o_batch and lse_batch (a sequence is its rows of one packed batch).
// lse[b * lse_batch + h * lse_head + token] (the token within the sequence for the batched form,
// the packed row for varlen).
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
#include "cuda/common/launch.h"
#include "cuda/common/launch_abi.h"

namespace fray {
namespace attention {

template <class Element_, int kHeadDim_, int kBlockN_, int kStages_, bool kCausal_, bool kOverlap_ = false,
          bool kPingPong_ = false, int kPage_ = 0, bool kPersistent_ = false>
struct PrefillConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kCausal = kCausal_;
  static constexpr bool kOverlap = kOverlap_;  // tile n's softmax under tile n+1's P V
  static constexpr bool kPingPong = kPingPong_;  // the consumer warpgroups take turns (needs kOverlap)
  static constexpr int kPage = kPage_;  // 0: contiguous K / V; else the pools' page size
  static constexpr bool kPersistent = kPersistent_;  // one CTA per SM walking the tiles
  static constexpr int kBoxN = kPage == 0 || kPage >= kBlockN_ ? kBlockN_ : kPage;  // key rows per TMA box
  static constexpr int kConsumers = kBlockM / 64;  // warpgroups, 64 query rows each
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dim 64, 128 or 256");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256, "key tile: a multiple of 16, 16..256");
  static_assert(!kPingPong || (kOverlap && kConsumers == 2), "ping-pong: two consumer warpgroups, with kOverlap");
  static_assert(kPage == 0 || (kPage >= 16 && kPage <= 128 && (kPage & (kPage - 1)) == 0),
                "page size: 16, 32, 64 or 128 (whole 8-row swizzle atoms per box)");
  static_assert(kPage == 0 || (kBlockN_ % kBoxN == 0 && kPage % kBoxN == 0),
                "paged: a key tile is whole pages or lies within one");

  using TileQK = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using TilePV = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kBlockN>>;
  using WarpGroups = cute::Layout<cute::Shape<cute::Int<kConsumers>, cute::_1, cute::_1>>;
  using MmaQK = decltype(cute::make_tiled_mma(cute::GMMA::ss_op_selector<Element, Element, float, TileQK>(),
                                              WarpGroups{}));
  using MmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, TilePV, cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      WarpGroups{}));

  // Q and K K-major ([rows, D], D contiguous); V as the PV product's B operand: [D, keys] with D
  // contiguous (N-major), which is V's row-major [keys, D] in memory.
  using SmemQ = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                             cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemK = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                             cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  using SmemV = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<Element>{},
                                             cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>, cute::Int<kStages>>{},
                                             cute::Step<cute::_2, cute::_1, cute::_3>{}));

  // One TMA box of a stage: kBoxN key rows of the K tile, kBoxN key columns of the V tile (the
  // whole tile when contiguous). A box's rows keep the tile's strides (a sub-block of it).
  using SmemKBox = decltype(cute::composition(
      cute::take<0, 2>(SmemK{}),
      cute::make_layout(cute::Shape<cute::Int<kBoxN>, cute::Int<kHeadDim>>{},
                        cute::make_stride(cute::_1{}, cute::Int<kBlockN>{}))));
  using SmemVBox = decltype(cute::composition(
      cute::take<0, 2>(SmemV{}),
      cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBoxN>>{},
                        cute::make_stride(cute::_1{}, cute::Int<kHeadDim>{}))));

  using PipelineK = cutlass::PipelineTmaAsync<kStages>;
  using PipelineV = cutlass::PipelineTmaAsync<kStages>;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemQ>> q;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemK>> k;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemV>> v;
    typename PipelineK::SharedStorage pipe_k;
    typename PipelineV::SharedStorage pipe_v;
    cutlass::arch::ClusterTransactionBarrier bar_q;
    cutlass::arch::ClusterBarrier bar_q_empty;  // persistent: the consumers are done with Q
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "tiles exceed the SM's shared memory");

  static void describe(char* buf, int n) {
    char page[24] = "";
    if (kPage) snprintf(page, sizeof(page), " paged %d", kPage);
    snprintf(buf, n, "prefill_sm90 %s D%d tile %dx%d stages %d %s%s%s%s%s",
             cute::is_same_v<Element, cutlass::bfloat16_t> ? "bf16" : "fp16", kHeadDim, kBlockM, kBlockN,
             kStages, kCausal ? "causal" : "full", kOverlap ? " overlap" : "", kPingPong ? " pingpong" : "", page,
             kPersistent ? " persistent" : "");
  }
};

namespace detail {

using namespace cute;

// [token, D, head, batch] for Q and K (token- and D-tile TMA boxes); [D, token, head, batch] for V.
using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
using GmemStrideV = Stride<_1, int64_t, int64_t, int64_t>;

template <class Config>
struct TmaTypes {
  using E = typename Config::Element;
  using Q = decltype(make_tma_copy(SM90_TMA_LOAD{},
                                   make_tensor(make_gmem_ptr(static_cast<E const*>(nullptr)), GmemShape{}, GmemStride{}),
                                   typename Config::SmemQ{},
                                   Shape<Int<Config::kBlockM>, Int<Config::kHeadDim>>{}, _1{}));
  // (contiguous: the whole tile, exactly as the box layouts would give it)
  using SmemKBox = conditional_t<Config::kPage == 0, decltype(take<0, 2>(typename Config::SmemK{})),
                                 typename Config::SmemKBox>;
  using SmemVBox = conditional_t<Config::kPage == 0, decltype(take<0, 2>(typename Config::SmemV{})),
                                 typename Config::SmemVBox>;
  using K = decltype(make_tma_copy(SM90_TMA_LOAD{},
                                   make_tensor(make_gmem_ptr(static_cast<E const*>(nullptr)), GmemShape{}, GmemStride{}),
                                   SmemKBox{}, Shape<Int<Config::kBoxN>, Int<Config::kHeadDim>>{}, _1{}));
  using V = decltype(make_tma_copy(SM90_TMA_LOAD{},
                                   make_tensor(make_gmem_ptr(static_cast<E const*>(nullptr)), GmemShape{}, GmemStrideV{}),
                                   SmemVBox{}, Shape<Int<Config::kHeadDim>, Int<Config::kBoxN>>{}, _1{}));
};

template <class Config>
struct Params {
  typename TmaTypes<Config>::Q tma_q;
  typename TmaTypes<Config>::K tma_k;
  typename TmaTypes<Config>::V tma_v;
  GmemShape shape_q, shape_k, shape_v;
  typename Config::Element* out;
  float* lse;
  const int32_t* cu_q;
  const int32_t* cu_k;
  const int32_t* block_table;  // paged only
  int64_t bt_row;
  int32_t max_blocks;
  int32_t hq, group;  // group = Hq / Hkv
  int32_t batch, m_blocks, tiles;  // persistent: tiles = m_blocks * hq * batch
  int32_t rows_q, rows_k, max_seqlen_q, seqlen_q, seqlen_k;
  int64_t o_batch, o_token, o_head, lse_batch, lse_head;
  float scale_log2;  // softmax scale * log2(e)
  float scale;
};

// The mask of key tile key0 for query `row` (within its sequence) as one bound on the column
// offsets col - col0 of the thread's elements in that row (col0: the thread's first column): keys
// past the sequence (key >= seqlen_k) and, causal, past the row's diagonal (key > row + diag).
CUTE_HOST_DEVICE int mask_bound(bool causal, int row, int key0, int col0, int seqlen_k, int diag) {
  const int past_end = seqlen_k - key0 - col0;
  return causal ? cute::min(past_end, row + diag + 1 - key0 - col0) : past_end;
}

// Which key tiles a query tile sees: [0, n_max); n_max <= 0 means none.
template <class Config>
__device__ __forceinline__ int key_tiles(int m_block, int seqlen_q, int seqlen_k) {
  int n_max = (seqlen_k + Config::kBlockN - 1) / Config::kBlockN;
  if (Config::kCausal) {
    const int last_key = (m_block + 1) * Config::kBlockM + seqlen_k - seqlen_q;  // exclusive
    n_max = min(n_max, last_key <= 0 ? 0 : (last_key + Config::kBlockN - 1) / Config::kBlockN);
  }
  return n_max;
}

// One work tile: query tile m_block of sequence b, query head h.
struct Tile {
  int m_block, h, b;
};

// The persistent order's tile t of m_blocks x hq x batch: query tiles fastest, the last first,
// then heads, then sequences.
CUTE_HOST_DEVICE Tile persistent_tile(int t, int m_blocks, int hq, int batch) {
  const int r = t / m_blocks;
  return {m_blocks - 1 - t % m_blocks, r % hq, r / hq};
}

// Tile t of the grid's order: persistent_tile; otherwise the CTA's own, causal ones in reverse so
// that the longest start first.
template <class Config>
__device__ __forceinline__ Tile tile_of(const Params<Config>& p, int t) {
  if constexpr (Config::kPersistent) {
    return persistent_tile(t, p.m_blocks, p.hq, p.batch);
  } else {
    return {Config::kCausal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x), int(blockIdx.y),
            int(blockIdx.z)};
  }
}

// Sequence b's rows: varlen offsets clamped into the packed rows, queries cut at max_seqlen_q.
struct Sequence {
  int q_start, k_start, seqlen_q, seqlen_k, tma_b;
};

template <class Config>
__device__ __forceinline__ Sequence sequence_of(const Params<Config>& p, int b) {
  Sequence s{0, 0, p.seqlen_q, p.seqlen_k, b};
  if (p.cu_q != nullptr) {  // (the paged kernel takes only this form)
    s.q_start = min(max(p.cu_q[b], 0), p.rows_q);
    const int q_end = min(max(p.cu_q[b + 1], s.q_start), p.rows_q);
    s.seqlen_q = min(q_end - s.q_start, p.max_seqlen_q);
    if constexpr (Config::kPage == 0) {
      s.k_start = min(max(p.cu_k[b], 0), p.rows_k);
      const int k_end = min(max(p.cu_k[b + 1], s.k_start), p.rows_k);
      s.seqlen_k = k_end - s.k_start;
    } else {  // keys through the block table: cu_seqlens_k only counts them
      s.seqlen_k =
          int(min(max(int64_t(p.cu_k[b + 1]) - p.cu_k[b], int64_t(0)), int64_t(p.max_blocks) * Config::kPage));
    }
    s.tma_b = 0;
  }
  return s;
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1) prefill_kernel(const __grid_constant__ Params<Config> p) {
  using E = typename Config::Element;
  constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN, kD = Config::kHeadDim;
  using Storage = typename Config::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  Storage& st = *reinterpret_cast<Storage*>(smem_raw);

  // The CTA's tiles: persistent, t = blockIdx.x, + gridDim.x, ... below p.tiles; otherwise its one.
  const int t_first = Config::kPersistent ? int(blockIdx.x) : 0;
  const int t_end = Config::kPersistent ? p.tiles : 1;
  const int t_step = Config::kPersistent ? int(gridDim.x) : 1;
  // The first tile's coordinates, read once (the grid's CTA has no other).
  const Tile first = tile_of(p, t_first);
  const Sequence first_seq = sequence_of(p, first.b);
  if (!Config::kPersistent && first.m_block * kBlockM >= first_seq.seqlen_q) return;  // before any barrier
  auto tile_at = [&](int t) { return t == t_first ? first : tile_of(p, t); };
  auto sequence_at = [&](int t, int b) { return t == t_first ? first_seq : sequence_of(p, b); };

  const int warp = cutlass::canonical_warp_idx_sync();
  const int wg = cutlass::canonical_warp_group_idx();
  const bool leader = warp == 0 && cute::elect_one_sync();

  using PipeK = typename Config::PipelineK;
  using PipeV = typename Config::PipelineV;
  typename PipeK::Params pk;
  pk.transaction_bytes = kBlockN * kD * int(sizeof(E));
  pk.role = wg == 0 ? PipeK::ThreadCategory::Producer : PipeK::ThreadCategory::Consumer;
  pk.is_leader = leader;
  pk.num_consumers = 128 * Config::kConsumers;
  PipeK pipe_k(st.pipe_k, pk, Shape<_1, _1, _1>{});
  PipeV pipe_v(st.pipe_v, pk, Shape<_1, _1, _1>{});
  if (warp == 0 && cute::elect_one_sync()) {
    st.bar_q.init(1);
    if constexpr (Config::kPersistent) st.bar_q_empty.init(128 * Config::kConsumers);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Config::SmemQ{});
  Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Config::SmemK{});
  Tensor sV = make_tensor(make_smem_ptr(st.v.data()), typename Config::SmemV{});

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (!leader) return;
    auto write = cutlass::make_producer_start_state<PipeK>();
    int q_loads = 0;  // tiles whose Q was loaded (bar_q's phase; persistent: bar_q_empty's)
    for (int t = t_first; t < t_end; t += t_step) {
    const auto [m_block, h, b] = tile_at(t);
    const auto [q_start, k_start, seqlen_q, seqlen_k, tma_b] = sequence_at(t, b);
    const int hk = h / p.group;
    const int n_max = m_block * kBlockM < seqlen_q ? key_tiles<Config>(m_block, seqlen_q, seqlen_k) : 0;
    if (n_max <= 0) continue;
    if (Config::kPersistent && q_loads > 0) st.bar_q_empty.wait((q_loads - 1) & 1);
    ++q_loads;
    Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q)(_, _, h, tma_b);
    Tensor gQ = local_tile(domain_offset(make_coord(q_start, _0{}), mQ), Shape<Int<kBlockM>, Int<kD>>{},
                           make_coord(m_block, _0{}));
    auto [tQg, tQs] = tma_partition(p.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    st.bar_q.arrive_and_expect_tx(kBlockM * kD * int(sizeof(E)));
    copy(p.tma_q.with(reinterpret_cast<uint64_t&>(st.bar_q), 0), tQg, tQs);
    if constexpr (Config::kPage == 0) {
      Tensor mK = p.tma_k.get_tma_tensor(p.shape_k)(_, _, hk, tma_b);
      Tensor mV = p.tma_v.get_tma_tensor(p.shape_v)(_, _, hk, tma_b);
      Tensor gK = local_tile(domain_offset(make_coord(k_start, _0{}), mK), Shape<Int<kBlockN>, Int<kD>>{},
                             make_coord(_, _0{}));  // (BlockN, D, tiles)
      Tensor gV = local_tile(domain_offset(make_coord(_0{}, k_start), mV), Shape<Int<kD>, Int<kBlockN>>{},
                             make_coord(_0{}, _));  // (D, BlockN, tiles)
      auto [tKg, tKs] = tma_partition(p.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      auto [tVg, tVs] = tma_partition(p.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
      for (int n = n_max - 1; n >= 0; --n) {
        pipe_k.producer_acquire(write);
        copy(p.tma_k.with(*pipe_k.producer_get_barrier(write), 0), tKg(_, n), tKs(_, write.index()));
        pipe_v.producer_acquire(write);
        copy(p.tma_v.with(*pipe_v.producer_get_barrier(write), 0), tVg(_, n), tVs(_, write.index()));
        ++write;
      }
    } else {
      // One box per page a tile spans (a page holding several tiles: the tile's rows of it).
      constexpr int kBoxN = Config::kBoxN, kPage = Config::kPage, kBoxes = kBlockN / kBoxN;
      Tensor mK = p.tma_k.get_tma_tensor(p.shape_k)(_, _, hk, _);  // (Page, D, pages)
      Tensor mV = p.tma_v.get_tma_tensor(p.shape_v)(_, _, hk, _);  // (D, Page, pages)
      const int32_t* table = p.block_table + int64_t(b) * p.bt_row;
      const int last = (seqlen_k - 1) / kPage;  // n_max > 0: seqlen_k >= 1
      for (int n = n_max - 1; n >= 0; --n) {
        int page[kBoxes], box[kBoxes];
        CUTE_UNROLL
        for (int i = 0; i < kBoxes; ++i) {
          const int t0 = n * kBlockN + i * kBoxN;
          page[i] = table[min(t0 / kPage, last)];
          box[i] = (t0 % kPage) / kBoxN;
        }
        pipe_k.producer_acquire(write);
        CUTE_UNROLL
        for (int i = 0; i < kBoxes; ++i) {
          Tensor gK = local_tile(mK(_, _, page[i]), Shape<Int<kBoxN>, Int<kD>>{}, make_coord(box[i], _0{}));
          Tensor sKb = local_tile(sK(_, _, write.index()), Shape<Int<kBoxN>, Int<kD>>{}, make_coord(i, _0{}));
          auto [tKg, tKs] = tma_partition(p.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sKb),
                                          group_modes<0, 2>(gK));
          copy(p.tma_k.with(*pipe_k.producer_get_barrier(write), 0), tKg, tKs);
        }
        pipe_v.producer_acquire(write);
        CUTE_UNROLL
        for (int i = 0; i < kBoxes; ++i) {
          Tensor gV = local_tile(mV(_, _, page[i]), Shape<Int<kD>, Int<kBoxN>>{}, make_coord(_0{}, box[i]));
          Tensor sVb = local_tile(sV(_, _, write.index()), Shape<Int<kD>, Int<kBoxN>>{}, make_coord(_0{}, i));
          auto [tVg, tVs] = tma_partition(p.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sVb),
                                          group_modes<0, 2>(gV));
          copy(p.tma_v.with(*pipe_v.producer_get_barrier(write), 0), tVg, tVs);
        }
        ++write;
      }
    }
    }  // tiles
    return;
  }

  // ---- consumers ----
  cutlass::arch::warpgroup_reg_alloc<240>();
  const int tid = int(threadIdx.x) - 128;
  typename Config::MmaQK mma_qk;
  typename Config::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, MMA_M, MMA_K): descriptors
  Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, stages)
  Tensor tOrV = thr_pv.partition_fragment_B(sV);  // (MMA, MMA_N, MMA_K, stages)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kD>>{});
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kD>>{}));
  Tensor S = make_tensor(tSrS.data(), rows_cols(tSrS.layout()));
  Tensor cS = make_tensor(tScS.data(), rows_cols(tScS.layout()));
  Tensor O = make_tensor(tOrO.data(), rows_cols(tOrO.layout()));
  Tensor cO = make_tensor(tOcO.data(), rows_cols(tOcO.layout()));
  constexpr int kRows = decltype(size<0>(S))::value;  // 2
  static_assert(kRows == decltype(size<0>(O))::value, "one row split for S and O");

  float row_max[kRows], row_sum[kRows];
  // The tile's coordinates (set per tile below; the steps' lambdas read them).
  int m_block = 0, h = 0, b = 0, q_start = 0, seqlen_q = 0, seqlen_k = 0, n_max = 0;
  int diag = 0;  // causal: key j visible from query i iff j <= i + diag

  // The steps of one key tile, shared by both schedules below.
  auto issue_qk = [&](int stage) {  // S = Q K^T, issued (the caller waits)
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tSrQ); ++kb) {
      gemm(mma_qk, tSrQ(_, _, kb), tSrK(_, _, kb, stage), tSrS);
      mma_qk.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };
  auto issue_pv = [&](int stage, auto& p_operand) {  // O += P V, issued
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    gemm(mma_pv, p_operand, tOrV(_, _, _, stage), tOrO);
    warpgroup_commit_batch();
  };
  // Keys past the sequence, and causal keys past each row's diagonal, to -inf.
  auto mask = [&](int n) {
    const int key0 = n * kBlockN;
    const bool tail = key0 + kBlockN > seqlen_k;
    const bool crosses = Config::kCausal && key0 + kBlockN - 1 > m_block * kBlockM + diag;
    if (tail || crosses) {
      // One bound per row against each element's column offset from the thread's first column
      // (a constant of the unrolled loop), rather than a (row, key) pair per element.
      const int col0 = get<1>(cS(0, 0));
      CUTE_UNROLL
      for (int i = 0; i < size<0>(S); ++i) {
        const int row = m_block * kBlockM + get<0>(cS(i, 0));
        const int limit = mask_bound(Config::kCausal, row, key0, col0, seqlen_k, diag);
        CUTE_UNROLL
        for (int j = 0; j < size<1>(S); ++j) {
          if (get<1>(cS(i, j)) - col0 >= limit) S(i, j) = -INFINITY;
        }
      }
    }
  };
  // Online softmax of S in place (a row's values sit in the 4 threads of a quad); corr[i]: what
  // O's row i must be multiplied by to move to the new maximum.
  auto softmax = [&](float (&corr)[kRows]) { online_softmax(S, row_max, row_sum, corr, p.scale_log2); };
  auto rescale = [&](const float (&corr)[kRows]) {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(O); ++j) O(i, j) *= corr[i];
    }
  };
  // P in registers, in the input type, as the A operand of O += P V.
  Tensor rP = make_tensor<E>(tSrS.layout());
  Tensor tOrP = make_tensor(rP.data(), acc_as_a(rP.layout()));
  auto convert_p = [&]() {
    constexpr int kN = decltype(size(tSrS))::value;
    cutlass::NumericArrayConverter<E, float, kN> convert;
    *reinterpret_cast<cutlass::Array<E, kN>*>(rP.data()) =
        convert(*reinterpret_cast<const cutlass::Array<float, kN>*>(tSrS.data()));
  };
  // V rows past the sequence's end: zeros, so that whatever lies there (another sequence's rows,
  // a buffer's uninitialised tail) cannot reach O as 0 * NaN. Only the sequence's last key tile.
  auto zero_tail = [&](int n, int stage) {
    const int valid = seqlen_k - n * kBlockN;
    if (valid >= kBlockN) return;
    Tensor sVs = sV(_, _, stage);  // (D, BlockN)
    for (int idx = tid; idx < kD * kBlockN; idx += 128 * Config::kConsumers) {
      const int d = idx % kD, key = idx / kD;
      if (key >= valid) sVs(d, key) = E(0.f);
    }
    cutlass::arch::fence_view_async_shared();
    asm volatile("bar.sync 1, %0;" ::"r"(128 * Config::kConsumers));
  };

  typename PipeK::PipelineState read;
  float corr[kRows];
  int q_loads = 0;  // tiles whose Q was loaded: bar_q's phase
  for (int t = t_first; t < t_end; t += t_step) {
  {
    const Tile tile = tile_at(t);
    m_block = tile.m_block, h = tile.h, b = tile.b;
  }
  {
    const Sequence sq = sequence_at(t, b);
    q_start = sq.q_start, seqlen_q = sq.seqlen_q, seqlen_k = sq.seqlen_k;
  }
  if (m_block * kBlockM >= seqlen_q) continue;  // (persistent only: the grid's own tile exists)
  n_max = key_tiles<Config>(m_block, seqlen_q, seqlen_k);
  diag = seqlen_k - seqlen_q;
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.f;
  }
  clear(tOrO);
  if (n_max > 0) st.bar_q.wait(q_loads & 1);
  if constexpr (!Config::kOverlap) {
    for (int n = n_max - 1; n >= 0; --n) {
      pipe_k.consumer_wait(read);
      issue_qk(read.index());
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      pipe_k.consumer_release(read);
      mask(n);
      softmax(corr);
      rescale(corr);
      convert_p();
      pipe_v.consumer_wait(read);
      zero_tail(n, read.index());
      issue_pv(read.index(), tOrP);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      pipe_v.consumer_release(read);
      ++read;
    }
  } else if (n_max > 0) {
    // Intra-warpgroup overlap: tile n's S = Q K^T and tile n+1's O += P V are issued together,
    // so the softmax of tile n runs while the tensor cores do the P V product. With kPingPong the
    // two consumer warpgroups also take turns issuing (named barriers 2 and 3): one's softmax
    // runs while the other's products occupy the tensor cores. The first warpgroup skips its
    // first wait and the last one its last signal, so that every signal is consumed.
    const int cw = wg - 1;  // consumer warpgroup 0 or 1
    auto turn_begin = [&](bool first) {
      if constexpr (Config::kPingPong) {
        if (!(first && cw == 0)) asm volatile("bar.sync %0, 256;" ::"r"(2 + cw));
      }
    };
    auto turn_end = [&](bool last) {
      if constexpr (Config::kPingPong) {
        if (!(last && cw == 1)) asm volatile("bar.arrive %0, 256;" ::"r"(3 - cw));
      }
    };
    typename PipeK::PipelineState read_v = read;
    int n = n_max - 1;
    pipe_k.consumer_wait(read);
    turn_begin(true);
    issue_qk(read.index());
    turn_end(false);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    pipe_k.consumer_release(read);
    ++read;
    mask(n);
    softmax(corr);
    convert_p();
    for (--n; n >= 0; --n) {
      pipe_k.consumer_wait(read);
      pipe_v.consumer_wait(read_v);
      zero_tail(n + 1, read_v.index());  // both warpgroups, outside the turns (barrier 1)
      turn_begin(false);
      issue_qk(read.index());
      issue_pv(read_v.index(), tOrP);
      turn_end(false);
      warpgroup_wait<1>();  // S done; P V still running
      warpgroup_fence_operand(tSrS);
      pipe_k.consumer_release(read);
      ++read;
      mask(n);
      softmax(corr);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      pipe_v.consumer_release(read_v);
      ++read_v;
      rescale(corr);
      convert_p();
    }
    pipe_v.consumer_wait(read_v);
    zero_tail(0, read_v.index());
    turn_begin(false);
    issue_pv(read_v.index(), tOrP);
    turn_end(true);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    pipe_v.consumer_release(read_v);
  }
  if (n_max > 0) {  // every product that reads Q is done: the producer may load the next tile's
    ++q_loads;
    if constexpr (Config::kPersistent) st.bar_q_empty.arrive();
  }

  // Epilogue: O / sum, rows past the sequence not written; lse = ln(sum) + max * scale.
  float inv[kRows];
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    float s = row_sum[i];
    s += __shfl_xor_sync(0xffffffff, s, 1);
    s += __shfl_xor_sync(0xffffffff, s, 2);
    row_sum[i] = s;
    inv[i] = s > 0.f ? 1.f / s : 0.f;
  }
  // Varlen: the sequence's rows start at q_start of one packed batch (o_batch is not used).
  const int64_t o_base =
      (p.cu_q != nullptr ? 0 : int64_t(b) * p.o_batch) + int64_t(q_start) * p.o_token + int64_t(h) * p.o_head;
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const int row = m_block * kBlockM + get<0>(cO(i, 0));
    if (row < seqlen_q) {
      E* dst = p.out + o_base + int64_t(row) * p.o_token;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(O); j += 2) {
        const int col = get<1>(cO(i, j));  // even; col + 1 is the pair's other value
        cutlass::Array<float, 2> pair;
        pair[0] = O(i, j) * inv[i];
        pair[1] = O(i, j + 1) * inv[i];
        cutlass::NumericArrayConverter<E, float, 2> convert;
        *reinterpret_cast<cutlass::Array<E, 2>*>(dst + col) = convert(pair);
      }
      if ((threadIdx.x & 3) == 0) {
        const float l = row_sum[i] > 0.f ? logf(row_sum[i]) + row_max[i] * p.scale : -INFINITY;
        p.lse[(p.cu_q != nullptr ? 0 : int64_t(b) * p.lse_batch) + int64_t(h) * p.lse_head + (q_start + row)] = l;
      }
    }
  }
  }  // tiles
}

template <class Config>
int launch(const FrayArgs* args, char* err, int32_t err_len) {
  using E = typename Config::Element;
  constexpr int kE = int(sizeof(E));
  if (args->num_ptrs != 8 || args->num_ints != 25 || args->num_floats != 1) {
    jit_set_err(err, err_len, "prefill_sm90: expected 8 pointers, 25 ints, 1 float, got %d, %d, %d", args->num_ptrs,
                args->num_ints, args->num_floats);
    return 1;
  }
  const uint64_t* ptr = args->ptrs;
  const int64_t* in = args->ints;
  const int batch = int(in[0]), hq = int(in[1]), hkv = int(in[2]);
  const int rows_q = int(in[3]), rows_k = int(in[4]), max_seqlen_q = int(in[5]);
  const int seqlen_q = int(in[6]), seqlen_k = int(in[7]);
  const int64_t qb = in[8], qt = in[9], qh = in[10], kb = in[11], kt = in[12], kh = in[13];
  const int64_t vb = in[14], vt = in[15], vh = in[16];
  const bool varlen = ptr[5] != 0;
  const int64_t bt_row = in[22], max_blocks = in[23], num_blocks = in[24];
  if (Config::kPage != 0 && (!varlen || ptr[7] == 0 || max_blocks < 0 || num_blocks < 0 ||
                             max_blocks * Config::kPage > INT32_MAX || rows_k != Config::kPage)) {
    jit_set_err(err, err_len, "prefill_sm90: the paged kernel (page %d) takes the varlen form, a block table and "
                "pools of that page size (got page rows %d)", Config::kPage, rows_k);
    return 1;
  }
  if (hkv <= 0 || hq % hkv != 0) {
    jit_set_err(err, err_len, "prefill_sm90: Hq=%d is not a multiple of Hkv=%d", hq, hkv);
    return 1;
  }
  // TMA: 16-byte aligned bases, strides multiples of 16 bytes (a size-1 dimension's stride is free).
  const int64_t strides[9] = {qb, qt, qh, kb, kt, kh, vb, vt, vh};
  for (int i = 0; i < 3; ++i) {
    if (ptr[i] % 16 != 0) {
      jit_set_err(err, err_len, "prefill_sm90: %s is not 16-byte aligned", "q\0k\0v" + 2 * i);
      return 1;
    }
  }
  if (ptr[3] % 4 != 0 || in[18] % 2 != 0 || in[19] % 2 != 0 || in[17] % 2 != 0) {
    jit_set_err(err, err_len, "prefill_sm90: out must be 4-byte aligned with even strides (pairs are stored)");
    return 1;
  }
  for (int i = 0; i < 9; ++i) {
    if ((strides[i] * kE) % 16 != 0 || strides[i] < 0) {
      jit_set_err(err, err_len, "prefill_sm90: stride %lld (elements) of %s is not a multiple of 16 bytes",
                  static_cast<long long>(strides[i]), "q\0k\0v" + 2 * (i / 3));
      return 1;
    }
  }
  const int tb = varlen ? 1 : batch;  // the TMA batch extent of q (and of contiguous k, v)
  const int tbk = Config::kPage != 0 ? int(num_blocks) : tb;  // paged: the pools' pages
  Params<Config> p{};
  p.shape_q = GmemShape(rows_q, Config::kHeadDim, hq, tb);
  p.shape_k = GmemShape(rows_k, Config::kHeadDim, hkv, tbk);
  p.shape_v = GmemShape(Config::kHeadDim, rows_k, hkv, tbk);
  // A size-1 batch dimension still needs a TMA-legal stride: reuse the token stride's.
  auto bstride = [&](int extent, int64_t s, int64_t tok) { return extent == 1 ? tok * 16 : s; };
  auto gq = make_tensor(make_gmem_ptr(reinterpret_cast<E const*>(ptr[0])), p.shape_q,
                        GmemStride(qt, _1{}, qh, bstride(tb, qb, qt)));
  auto gk = make_tensor(make_gmem_ptr(reinterpret_cast<E const*>(ptr[1])), p.shape_k,
                        GmemStride(kt, _1{}, kh, bstride(tbk, kb, kt)));
  auto gv = make_tensor(make_gmem_ptr(reinterpret_cast<E const*>(ptr[2])), p.shape_v,
                        GmemStrideV(_1{}, vt, vh, bstride(tbk, vb, vt)));
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gq, typename Config::SmemQ{},
                          Shape<Int<Config::kBlockM>, Int<Config::kHeadDim>>{}, _1{});
  p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gk, typename TmaTypes<Config>::SmemKBox{},
                          Shape<Int<Config::kBoxN>, Int<Config::kHeadDim>>{}, _1{});
  p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gv, typename TmaTypes<Config>::SmemVBox{},
                          Shape<Int<Config::kHeadDim>, Int<Config::kBoxN>>{}, _1{});
  p.block_table = reinterpret_cast<const int32_t*>(ptr[7]);
  p.bt_row = bt_row;
  p.max_blocks = int32_t(max_blocks);
  p.out = reinterpret_cast<E*>(ptr[3]);
  p.lse = reinterpret_cast<float*>(ptr[4]);
  p.cu_q = reinterpret_cast<const int32_t*>(ptr[5]);
  p.cu_k = reinterpret_cast<const int32_t*>(ptr[6]);
  p.hq = hq;
  p.group = hq / hkv;
  p.rows_q = rows_q;
  p.rows_k = rows_k;
  p.max_seqlen_q = max_seqlen_q;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.o_batch = in[17];
  p.o_token = in[18];
  p.o_head = in[19];
  p.lse_batch = in[20];
  p.lse_head = in[21];
  p.scale = float(args->floats[0]);
  p.scale_log2 = float(args->floats[0] * 1.4426950408889634);

  const int q_len = varlen ? max_seqlen_q : seqlen_q;
  const int m_blocks = (q_len + Config::kBlockM - 1) / Config::kBlockM;
  if (batch == 0 || hq == 0 || m_blocks == 0) return 0;
  const int64_t tiles = int64_t(m_blocks) * hq * batch;
  if (Config::kPersistent ? tiles > INT32_MAX : (batch > 65535 || hq > 65535)) {
    jit_set_err(err, err_len, "prefill_sm90: batch %d x heads %d x %d query tiles exceed the grid", batch, hq,
                m_blocks);
    return 1;
  }
  p.batch = batch;
  p.m_blocks = m_blocks;
  p.tiles = int32_t(tiles);
  int device = args->device;
  if (device < 0) cudaGetDevice(&device);
  auto kernel = prefill_kernel<Config>;
  if (jit_opt_in_smem<Config>(kernel, Config::kSmemBytes, device, err, err_len, "prefill_sm90")) return 1;
  const dim3 grid = Config::kPersistent ? dim3(unsigned(min<int64_t>(tiles, sm_count(device))))
                                        : dim3(m_blocks, hq, batch);
  kernel<<<grid, Config::kThreads, Config::kSmemBytes, reinterpret_cast<cudaStream_t>(args->stream)>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    jit_set_err(err, err_len, "prefill_sm90: launch failed: %s", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

template <class Config>
int64_t workspace_bytes(const FrayArgs*) {
  return 0;
}

}  // namespace detail
}  // namespace attention
}  // namespace fray

#define FRAY_PREFILL_ENTRY(CONFIG) FRAY_SM90_ENTRY(CONFIG, ::fray::attention::detail, "prefill_sm90")
