// Fray topk family: the streaming top-k kernel, for rows the row-in-shared-memory kernel
// (topk.cuh) cannot run in one wave. Torch-free. See README.md ("Streaming path").
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/topk/order_key.cuh"
#include "cuda/topk/topk_device.cuh"
#include "cuda/topk/topk_plan.h"

namespace fray {
namespace topk_detail {

static_assert((kStreamCap & (kStreamCap - 1)) == 0, "topk_stream: the entry buffer is sorted in place (power of two)");
static_assert(kStreamMaxK <= kStreamCap, "topk_stream: every CTA must be able to hold all k winners");
static_assert(kStreamMaxK <= kTopkMaxSortK, "topk_stream: serves only k the kernels rank themselves");
static_assert(kStreamRadix == 11, "topk_stream: the digit schedule assumes 11-bit digits");
static_assert(int64_t{1} << 19 > kTopkMaxWidth, "topk_stream: index fields of <= 19 bits");

// Prefilter path: when the compaction admitted at most this many elements over the whole row,
// the cluster's first CTA gathers them and finishes the row alone (one sort on chip) instead of
// further cluster-wide radix digits and the cross-CTA rank merge.
constexpr int kGatherMax = 1024;
static_assert(kGatherMax <= kStreamCap, "topk_stream: the gathered entries fit one CTA's buffer");

struct StreamScratch {
  uint32_t scan[kWarp];
  uint32_t runs[kMaxCluster];  // winners held by every CTA of the cluster (final step)
  uint32_t slice_total;
  uint32_t sel_slice, sel_above;
  uint32_t res_bin, res_above, res_cnt;
  uint32_t entries;   // entries the current pass appended (more than kStreamCap: they did not fit)
  uint32_t flag;      // this CTA's entries did not fit (read by the whole cluster)
  uint32_t any_flag;  // some CTA's entries did not fit
  uint32_t winners;   // winners this CTA holds (read by the whole cluster)
  // Radix state (kept here, not in registers, across the passes): the decided digits
  // prefix = composite >> shift of the k-th element, rem winners still to find among the
  // elements matching them, cnt of those, the next digit, done = (cnt == rem).
  uint64_t prefix;
  uint32_t shift, rem, cnt, digit, done;
};
static_assert(sizeof(StreamScratch) <= kStreamStaticSmemBound, "topk_stream: static shared memory above the plan's bound");
static_assert(kStreamThreads % kWarp == 0 && kStreamThreads / kWarp <= kWarp, "topk_stream: whole warps, at most 32");

// Composite keys: comp = key << ib | (2^ib - 1 - index), ib = bit length of the width (so the
// low field is >= 1 and comp > 0). Distinct within a row, and comp order = rank order (key
// decreasing, then lower index first), so the k-th largest comp is a threshold that admits
// exactly k elements: ties at the k-th key are resolved by radix digits of the index field.
// Digits, most significant first: key digits of <= 11 bits (fp32 11/11/10, 16-bit 11/5), then
// index digits (11 and ib - 11, or ib alone); no digit straddles the key and the index.
struct Digit {
  int shift;  // lowest composite bit of the digit
  int bits;
};

template <int KB>
__device__ __forceinline__ Digit stream_digit(int d, int ib) {
  constexpr int kKeyDigits = (KB + kStreamRadix - 1) / kStreamRadix;
  if (d < kKeyDigits) {
    const int hi = KB - d * kStreamRadix;
    const int bits = min(hi, kStreamRadix);
    return {ib + hi - bits, bits};
  }
  const int hi = ib - (d - kKeyDigits) * kStreamRadix;
  const int bits = min(hi, kStreamRadix);
  return {hi - bits, bits};
}

constexpr int kMergeBatch = 8;  // remote histogram loads in flight per thread in stream_select

// The shared::cluster address of shared-memory address `addr` (this CTA's) in CTA `rank`.
__device__ __forceinline__ uint32_t map_cluster(uint32_t addr, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

__device__ __forceinline__ uint32_t ld_cluster_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// Entries of run[0, n) (sorted decreasing, distinct) greater than v.
__device__ __forceinline__ uint32_t count_greater(const uint64_t* run, uint32_t n, uint64_t v) {
  uint32_t lo = 0u;
  uint32_t hi = n;
  while (lo < hi) {
    const uint32_t mid = (lo + hi) >> 1;
    if (run[mid] > v) {
      lo = mid + 1u;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Key j of a loaded vector (VEC > 1: 16 bytes of elements; VEC == 1: the element in w.x).
template <typename T, int VEC>
__device__ __forceinline__ uint32_t vec_key(const uint4& w, int j, uint32_t flip) {
  if constexpr (VEC > 1) {
    return OrderKey<T>::of(item_of<static_cast<int>(sizeof(T))>(w, j)) ^ flip;
  } else {
    return OrderKey<T>::of(w.x) ^ flip;
  }
}

// Reads the CTA's slice src[0, len) once, kLoadUnroll loads in flight per thread (16-byte loads
// for VEC > 1, element loads otherwise), and calls visit(w, e0) with the elements at slice
// offsets e0 .. e0 + VEC - 1 (keys: vec_key<T, VEC>(w, j, flip); offsets >= len are
// meaningless: visit checks). Keys are made from the packed vector when needed, not held in
// registers VEC at a time. Every thread makes the same number of calls (warp-uniform ballots inside visit are
// safe). reverse: blocks of the slice in decreasing order (a re-read then meets the most
// recently loaded lines first, the likeliest L2 hits).
template <typename T, int VEC, typename Visit>
__device__ __forceinline__ void stream_slice(const typename OrderKey<T>::Bits* src, int len, bool reverse,
                                             Visit&& visit) {
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int nthreads = kStreamThreads;  // the launch's block size (topk_config)
  const int nvec = (len + VEC - 1) / VEC;
  const int nfull = len / VEC;
  const int step = nthreads * kLoadUnroll;
  const int nsteps = (nvec + step - 1) / step;
  const int delta = reverse ? -step : step;
  int base = reverse ? (nsteps - 1) * step : 0;
  for (int it = 0; it < nsteps; ++it, base += delta) {
    uint4 w[kLoadUnroll];
    load_vectors<VEC>(src, len, nfull, base, nthreads, tid, w);
#pragma unroll
    for (int u = 0; u < kLoadUnroll; ++u) {
      const int vi = base + u * nthreads + tid;
      visit(w[u], VEC > 1 ? vi * VEC : vi);
    }
  }
}

// Merges the histograms hist[0, nb) of the cluster's CTAs (or takes this CTA's) and finds the
// bin holding the rem-th largest counted element; also ORs the CTAs' sh.flag into sh.any_flag.
// Call after this CTA's histogram and sh.flag are complete, from every thread of every CTA.
// Returns the first bin of the share searched: the bin is that + sh.res_bin (with sh.res_above,
// sh.res_cnt as find_bin leaves them). Ends with a barrier. As in topk_kernel: two cluster
// barriers; every CTA sums a 1/C share of the bins over all C histograms (distributed shared
// memory), then every CTA picks the share holding the rem-th element from the C share totals
// and searches it (remote). The next call's first barrier protects the shares.
template <bool CLUSTER>
__device__ __forceinline__ int stream_select(const uint32_t* hist, uint32_t* merged, int nb, uint32_t rem,
                                             int nctas, int rank, StreamScratch& sh) {
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int nthreads = kStreamThreads;  // the launch's block size (topk_config)
  const int lane = tid % kWarp;
  const int warp = tid / kWarp;
  if constexpr (CLUSTER) {
    const cg::cluster_group cl = cg::this_cluster();
    cl.sync();  // every CTA's histogram and flag are complete
    const int nbs = nb >= nctas ? nb / nctas : 1;
    const int lo = min(nb, rank * nbs);
    const int n = min(nbs, nb - lo);
    uint32_t part = 0u;
    const uint32_t hist_addr = static_cast<uint32_t>(__cvta_generic_to_shared(hist + lo));
    for (int j = tid; j < n; j += nthreads) {
      // kMergeBatch remote loads back to back (32-bit cluster addresses; ranks past the
      // cluster re-read this CTA's bin and add nothing): one distributed-shared-memory latency
      // per batch, not per CTA.
      uint32_t s = 0u;
      for (int c0 = 0; c0 < nctas; c0 += kMergeBatch) {
        uint32_t v[kMergeBatch];
#pragma unroll
        for (int u = 0; u < kMergeBatch; ++u) {
          v[u] = ld_cluster_u32(map_cluster(hist_addr + 4u * static_cast<uint32_t>(j), c0 + u < nctas ? c0 + u : rank));
        }
#pragma unroll
        for (int u = 0; u < kMergeBatch; ++u) s += c0 + u < nctas ? v[u] : 0u;
      }
      merged[j] = s;
      part += s;
    }
    part = block_sum(part, sh.scan);
    if (warp == 0) {
      const uint32_t f = lane < nctas ? *cl.map_shared_rank(&sh.flag, lane) : 0u;
      const bool any = __any_sync(kFullMask, f != 0u);
      if (lane == 0) {
        sh.slice_total = part;
        sh.any_flag = any ? 1u : 0u;
      }
    }
    cl.sync();  // every share and share total is merged
    select_share(sh, nctas, rem, warp, lane);
    const int s = static_cast<int>(sh.sel_slice);
    const int slo = min(nb, s * nbs);
    find_bin(cl.map_shared_rank(merged, s), min(nbs, nb - slo), sh.sel_above, rem, sh);
    return slo;
  } else {
    __syncthreads();
    if (tid == 0) sh.any_flag = sh.flag;
    find_bin(hist, nb, 0u, rem, sh);  // its barriers publish any_flag
    return 0;
  }
}

// After stream_select found digit nd's bin (off + sh.res_bin): thread 0 extends the radix
// state, a barrier publishes it.
__device__ __forceinline__ void stream_advance(StreamScratch& sh, int off, Digit nd) {
  if (threadIdx.x == 0) {
    sh.prefix = (sh.prefix << nd.bits) | (static_cast<uint64_t>(off) + sh.res_bin);
    sh.shift = static_cast<uint32_t>(nd.shift);
    sh.rem -= sh.res_above;
    sh.cnt = sh.res_cnt;
    sh.done = sh.res_cnt == sh.rem ? 1u : 0u;
    ++sh.digit;
  }
  __syncthreads();
}

// ---------------------------------------------------------------------------
// The streaming kernel. One row per CTA (CLUSTER = false) or per cluster of C CTAs; CTA r
// streams elements [r * slice, (r + 1) * slice) of the row from global memory. On chip: a
// 2048-bin histogram, the merged share, and ent[kStreamCap] of 8-byte composite keys.
//
// Radix select over composite keys (see Digit), most significant digit first. State (sh): the
// decided digits P = composite >> s of the k-th element, rem = winners still to find among the
// elements whose composite >> s equals P ("candidates"; those above P are sure winners), cnt =
// the candidates, done = (cnt == rem): then the elements with composite >> s >= P are exactly
// the k winners.
// 1. Global pass 1 (HBM): histogram of the top key digit of every element; the cluster merge
//    (as in topk_kernel) picks the digit of the k-th element.
// 2. If the admitted elements (k - rem + cnt over the row) can fit C x kStreamCap: compaction
//    pass (re-read, mostly from L2): append every element with composite >> s >= P to ent (one
//    warp scan and one shared atomic per warp and vector). Then, on chip, the histogram of the
//    next digit over the candidates in ent and the merge, which also tells every CTA whether
//    any CTA's entries did not fit kStreamCap. Fitted: go to 3. Otherwise (or when they cannot
//    fit at all: all-equal rows, -inf-masked rows, many NaNs): histogram pass from global
//    memory for the next digit, merge, and back to 2 with one more digit decided. Once done,
//    the compaction admits exactly the k winners (<= k <= kStreamCap per CTA): no overflow.
// 3. Refine on chip: further digits over the entries (histogram + merge per digit) until done;
//    the composites being distinct, the last digit always is. Winners: entries with
//    composite >> s >= P, exactly k over the row.
// 4. Output: each CTA turns its winners into sort keys (rank order: the composite; index
//    order: the index field above the key), zeroes the rest, and bitonic-sorts its buffer
//    decreasing. Index order: a winner's position = its local position + the winners of lower
//    ranks (slices are in index order). Rank order: every CTA copies the other CTAs' sorted
//    winners behind its own (k <= kStreamCap entries in all) and a winner's position = its
//    local position + the entries greater than it in every other run (binary searches).
//    Values are read from x by index (bits preserved); rank_keys as in topk_kernel.
// No global workspace; ent never takes more than kStreamCap entries.
// ---------------------------------------------------------------------------
template <typename T, int VEC, bool CLUSTER>
__global__ void __launch_bounds__(kStreamThreads, kStreamMinBlocks) topk_stream_kernel(const TopkArgs a) {
  using OK = OrderKey<T>;
  using Bits = typename OK::Bits;
  constexpr int kKeyBits = OK::kBits;
  constexpr int kKeyDigits = (kKeyBits + kStreamRadix - 1) / kStreamRadix;
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "topk_stream_kernel: VEC is one element or 16 bytes");

  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ StreamScratch sh;

  const int tid = static_cast<int>(threadIdx.x);
  constexpr int nthreads = kStreamThreads;  // the launch's block size (topk_config)
  const int lane = tid % kWarp;

  int nctas = 1;
  int rank = 0;
  int64_t row = blockIdx.x;
  if constexpr (CLUSTER) {
    const cg::cluster_group cl = cg::this_cluster();
    nctas = static_cast<int>(cl.num_blocks());
    rank = static_cast<int>(cl.block_rank());
    row = blockIdx.x / nctas;
  }
  const int start = rank * a.slice;
  const int len = max(0, min(a.slice, a.width - start));
  uint64_t* ent = reinterpret_cast<uint64_t*>(smem);
  uint32_t* hist = reinterpret_cast<uint32_t*>(ent + kStreamCap);
  uint32_t* merged = hist + (1 << kStreamRadix);
  const Bits* src = static_cast<const Bits*>(a.x) + row * a.x_stride + start;

  const int ib = 32 - __clz(a.width);  // 2^ib > width: the index field 2^ib - 1 - index is >= 1
  const uint32_t imask = (1u << ib) - 1u;
  const uint32_t low0 = imask - static_cast<uint32_t>(start);  // index field of slice offset 0
  const int ndigits = kKeyDigits + (ib + kStreamRadix - 1) / kStreamRadix;

  // ---- 2. global passes; 3. refine on chip (helpers) ----
  // Per-element tests of a global pass: composite >> s vs P as (key >> ks, low >> sl) vs
  // (PK, PL), no 64-bit work per element (s >= ib: only key bits are decided, PL = 0).
  struct Cmp {
    int ks, sl;
    uint32_t PK, PL;
  };
  auto cmp_of = [&](int s, uint64_t P) {
    Cmp c;
    c.ks = s > ib ? s - ib : 0;
    c.sl = s < ib ? s : ib;
    c.PK = static_cast<uint32_t>(P >> (ib - c.sl));
    c.PL = static_cast<uint32_t>(P & ((uint64_t{1} << (ib - c.sl)) - 1u));
    return c;
  };
  // Compaction pass: append every element with composite >> s >= P to ent (one warp scan and
  // one shared atomic per warp and vector; slots past kStreamCap are counted only). While only
  // key bits are decided (sl == ib, PL == 0) the test is key >> ks >= PK alone.
  auto compact = [&](const Cmp& cm, bool rev) {
    if (tid == 0) sh.entries = 0u;
    __syncthreads();
    const bool key_only = cm.sl == ib;
    stream_slice<T, VEC>(src, len, rev, [&](const uint4& w, int e0) {
      uint32_t ge = 0u;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const uint32_t hk = vec_key<T, VEC>(w, j, a.flip) >> cm.ks;
        bool in;
        if (key_only) {
          in = hk >= cm.PK;
        } else {
          const uint32_t hl = (low0 - static_cast<uint32_t>(e0 + j)) >> cm.sl;
          in = hk > cm.PK || (hk == cm.PK && hl >= cm.PL);
        }
        if (e0 + j < len && in) ge |= 1u << j;
      }
      if (!__any_sync(kFullMask, ge != 0u)) return;  // most vectors: nothing admitted in the warp
      const uint32_t n = static_cast<uint32_t>(__popc(ge));
      const uint32_t incl = warp_prefix_incl(n, lane);
      uint32_t slot = 0u;
      if (lane == kWarp - 1) slot = atomicAdd(&sh.entries, incl);
      slot = __shfl_sync(kFullMask, slot, kWarp - 1) + incl - n;
      for (uint32_t m = ge; m != 0u; m &= m - 1u, ++slot) {
        const int j = __ffs(static_cast<int>(m)) - 1;
        const uint64_t c = (static_cast<uint64_t>(vec_key<T, VEC>(w, j, a.flip)) << ib) |
                           (low0 - static_cast<uint32_t>(e0 + j));
        if (slot < static_cast<uint32_t>(kStreamCap)) ent[slot] = c;
      }
    });
    __syncthreads();
  };
  // Histogram of digit nd over the entries matching the decided digits, then the merge (which
  // also ORs the CTAs' flags: sh.flag must be set). Returns the bin offset for stream_advance.
  auto refine_select = [&](Digit nd) {
    const int nb = 1 << nd.bits;
    const int n_e = static_cast<int>(min(sh.entries, static_cast<uint32_t>(kStreamCap)));
    const int s = static_cast<int>(sh.shift);
    const uint64_t P = sh.prefix;
    for (int i = tid; i < nb; i += nthreads) hist[i] = 0u;
    __syncthreads();
    for (int base = 0; base < n_e; base += nthreads) {
      const int i = base + tid;
      const uint64_t c = i < n_e ? ent[i] : 0ull;
      hist_add(hist, i < n_e && (c >> s) == P, static_cast<uint32_t>(c >> nd.shift) & static_cast<uint32_t>(nb - 1),
               lane);
    }
    return stream_select<CLUSTER>(hist, merged, nb, sh.rem, nctas, rank, sh);
  };

  auto init_state = [&]() {
    for (int i = tid; i < (1 << kStreamRadix); i += nthreads) hist[i] = 0u;
    if (tid == 0) {
      sh.prefix = 0ull;
      sh.shift = static_cast<uint32_t>(ib + kKeyBits);
      sh.rem = static_cast<uint32_t>(a.k);
      sh.digit = 0u;
      sh.flag = 0u;
    }
    __syncthreads();
  };
  bool held = false;  // every CTA holds its entries (composite >> s >= P) in ent
  int gathered = 0;   // > 0: this CTA alone holds the row's `gathered` admitted entries (1a)
  bool reverse = true;  // alternate directions: each re-read starts where the last one ended

  // ---- 1a. Prefilter (small k, 16-byte vectors): global pass 1 counts the top digit of each
  // vector's largest key only (one shared atomic per vector, not per element). The bin b
  // holding the k-th largest vector maximum bounds the k-th largest element from below (k
  // vectors have an element with digit >= b), so the compaction of every element with digit
  // >= b holds all k winners; the exact top-digit histogram over those entries then continues
  // the radix select on chip. Entries past kStreamCap in some CTA (heavy ties, skewed rows):
  // start over with 1b.
  if (VEC > 1 && a.prefilter) {
    init_state();
    stream_slice<T, VEC>(src, len, false, [&](const uint4& w, int e0) {
      uint32_t mx = 0u;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const uint32_t key = vec_key<T, VEC>(w, j, a.flip);
        mx = e0 + j < len && key > mx ? key : mx;
      }
      hist_add(hist, e0 < len, mx >> (kKeyBits - kStreamRadix), lane);
    });
    const int off = stream_select<CLUSTER>(hist, merged, 1 << kStreamRadix, sh.rem, nctas, rank, sh);
    const Digit d0 = stream_digit<kKeyBits>(0, ib);
    compact(cmp_of(d0.shift, static_cast<uint64_t>(off) + sh.res_bin), reverse);
    reverse = !reverse;
    // Few admitted over the row (the usual case): the first CTA gathers them all.
    uint32_t n_all = sh.entries;
    bool fit = n_all <= static_cast<uint32_t>(kGatherMax);
    if constexpr (CLUSTER) {
      const cg::cluster_group cl = cg::this_cluster();
      cl.sync();  // every CTA's entries and count are complete
      const uint32_t e = lane < nctas ? *cl.map_shared_rank(&sh.entries, lane) : 0u;
      n_all = warp_sum_u32(e);
      fit = !__any_sync(kFullMask, e > static_cast<uint32_t>(kStreamCap)) && n_all <= static_cast<uint32_t>(kGatherMax);
      if (fit) {
        if (rank == 0) {
          uint32_t at = __shfl_sync(kFullMask, e, 0);
          for (int r = 1; r < nctas; ++r) {
            const uint32_t nr = __shfl_sync(kFullMask, e, r);
            const uint64_t* run = cl.map_shared_rank(ent, r);
            for (int j = tid; j < static_cast<int>(nr); j += nthreads) ent[at + j] = run[j];
            at += nr;
          }
        }
        cl.sync();  // the first CTA's remote reads are done
        if (rank != 0) return;
      }
    }
    if (fit) {
      gathered = static_cast<int>(n_all);  // >= k: the admitted elements hold the k winners
      held = true;
    } else {
      if (tid == 0) sh.flag = sh.entries > static_cast<uint32_t>(kStreamCap) ? 1u : 0u;
      const int off0 = refine_select(d0);  // state as at the start: every entry counts
      if (sh.any_flag == 0u) {
        stream_advance(sh, off0, d0);
        held = true;
      }
    }
  }

  // ---- 1b. global pass 1: histogram of the top key digit ----
  if (!held) {
    init_state();
    stream_slice<T, VEC>(src, len, false, [&](const uint4& w, int e0) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        hist_add(hist, e0 + j < len, vec_key<T, VEC>(w, j, a.flip) >> (kKeyBits - kStreamRadix), lane);
      }
    });
    const int off = stream_select<CLUSTER>(hist, merged, 1 << kStreamRadix, sh.rem, nctas, rank, sh);
    stream_advance(sh, off, stream_digit<kKeyBits>(0, ib));
  }

  // ---- 2. global passes ----
  for (int pass = 0; pass < ndigits && !held; ++pass) {
    const Cmp cm = cmp_of(static_cast<int>(sh.shift), sh.prefix);
    // Admitted over the cluster: k - rem sure winners + cnt candidates; more than C x
    // kStreamCap cannot fit.
    const uint64_t admitted = static_cast<uint64_t>(static_cast<uint32_t>(a.k) - sh.rem) + sh.cnt;
    if (sh.done != 0u || admitted <= static_cast<uint64_t>(nctas) * kStreamCap) {
      compact(cm, reverse);
      reverse = !reverse;
      if (sh.done != 0u) {  // exactly the k winners were admitted: <= k <= kStreamCap per CTA
        held = true;
        break;
      }
      if (tid == 0) sh.flag = sh.entries > static_cast<uint32_t>(kStreamCap) ? 1u : 0u;
      const Digit nd = stream_digit<kKeyBits>(static_cast<int>(sh.digit), ib);
      const int off = refine_select(nd);
      if (sh.any_flag == 0u) {
        stream_advance(sh, off, nd);
        held = true;
        break;
      }
      // Some CTA's entries did not fit (a skewed row): count the digit from global memory.
    }
    // Histogram pass: digit nd of the elements matching the decided digits.
    if (static_cast<int>(sh.digit) >= ndigits) break;  // never: the last digit leaves done set
    const Digit nd = stream_digit<kKeyBits>(static_cast<int>(sh.digit), ib);
    const int nb = 1 << nd.bits;
    const uint32_t dmask = static_cast<uint32_t>(nb - 1);
    const bool dkey = nd.shift >= ib;
    const int dsh = dkey ? nd.shift - ib : nd.shift;
    for (int i = tid; i < nb; i += nthreads) hist[i] = 0u;
    if (tid == 0) sh.flag = 0u;
    __syncthreads();
    stream_slice<T, VEC>(src, len, reverse, [&](const uint4& w, int e0) {
      uint32_t eq = 0u;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const uint32_t hk = vec_key<T, VEC>(w, j, a.flip) >> cm.ks;
        const uint32_t hl = (low0 - static_cast<uint32_t>(e0 + j)) >> cm.sl;
        if (e0 + j < len && hk == cm.PK && hl == cm.PL) eq |= 1u << j;
      }
      if (!__any_sync(kFullMask, eq != 0u)) return;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const uint32_t low = low0 - static_cast<uint32_t>(e0 + j);
        const uint32_t key = vec_key<T, VEC>(w, j, a.flip);
        hist_add(hist, (eq >> j) & 1u, ((dkey ? key : low) >> dsh) & dmask, lane);
      }
    });
    reverse = !reverse;
    const int off = stream_select<CLUSTER>(hist, merged, nb, sh.rem, nctas, rank, sh);
    stream_advance(sh, off, nd);
  }
  // (held is always true here: after the last digit the admitted elements are the k winners.)
  if (!held && tid == 0) sh.entries = 0u;  // never: output nothing rather than garbage
  __syncthreads();
  while (gathered == 0 && held && sh.done == 0u && static_cast<int>(sh.digit) < ndigits) {
    const Digit nd = stream_digit<kKeyBits>(static_cast<int>(sh.digit), ib);
    if (tid == 0) sh.flag = 0u;
    const int off = refine_select(nd);
    stream_advance(sh, off, nd);
  }

  // ---- 4. output ----
  const bool rank_order = a.sort_size > 0;
  const int k = a.k;
  Bits* vals = static_cast<Bits*>(a.values) + row * k;
  int64_t* inds = a.indices + row * k;
  int64_t* rkeys = a.rank_keys != nullptr ? a.rank_keys + row * k : nullptr;
  auto emit = [&](uint32_t pos, uint64_t v) {
    if (pos >= static_cast<uint32_t>(k)) return;  // never (exactly k winners); no write out of bounds
    const uint32_t low = rank_order ? static_cast<uint32_t>(v) & imask : static_cast<uint32_t>(v >> 32);
    const uint32_t key = rank_order ? static_cast<uint32_t>(v >> ib) : static_cast<uint32_t>(v);
    const uint32_t idx = imask - low;
    if (rkeys != nullptr) {
      rkeys[pos] = static_cast<int64_t>((static_cast<uint64_t>(key) << kRankKeyIndexBits) | (kRankKeyIndexMask - idx));
    } else {
      inds[pos] = idx;
      vals[pos] = src[static_cast<int>(idx) - start];
    }
  };

  if (gathered > 0) {
    // The gathered entries (composites, distinct) sorted decreasing: the first k are the
    // winners in rank order; index order re-sorts those k by their index field.
    const int ns = static_cast<int>(next_pow2(gathered));
    for (int i = gathered + tid; i < ns; i += nthreads) ent[i] = 0ull;  // below every composite
    __syncthreads();
    bitonic_sort_desc(ent, ns);
    if (!rank_order) {
      const int nk = static_cast<int>(next_pow2(k));
      for (int i = tid; i < nk; i += nthreads) {
        const uint64_t c = ent[i];
        ent[i] = i < k ? ((c & imask) << 32) | (c >> ib) : 0ull;
      }
      __syncthreads();
      bitonic_sort_desc(ent, nk);
    }
    for (int j = tid; j < k; j += nthreads) emit(static_cast<uint32_t>(j), ent[j]);
    return;
  }
  const int n_e = static_cast<int>(min(sh.entries, static_cast<uint32_t>(kStreamCap)));
  const int s = static_cast<int>(sh.shift);
  const uint64_t P = sh.prefix;
  // Winners packed to the front of ent, in place (a chunk is read whole before any of it is
  // written, and writes land at or below the chunk's own positions), so that the sort spans
  // next_pow2(winners) keys, not next_pow2(entries).
  uint32_t nwin = 0u;
  {
    const int lane = tid % kWarp;
    const int warp = tid / kWarp;
    constexpr int kWarpsPerCta = nthreads / kWarp;
    for (int base = 0; base < n_e; base += nthreads) {
      const int i = base + tid;
      uint64_t v = 0ull;
      bool win = false;
      if (i < n_e) {
        const uint64_t c = ent[i];
        win = (c >> s) >= P;
        v = rank_order ? c : ((c & imask) << 32) | (c >> ib);  // index order: decreasing index field
      }
      const unsigned bal = __ballot_sync(kFullMask, win);
      if (lane == 0) sh.scan[warp] = static_cast<uint32_t>(__popc(bal));
      __syncthreads();  // the chunk is read; per-warp counts published
      uint32_t before = nwin;
      for (int w = 0; w < warp; ++w) before += sh.scan[w];
      uint32_t total = 0u;
#pragma unroll
      for (int w = 0; w < kWarpsPerCta; ++w) total += sh.scan[w];
      if (win) ent[before + static_cast<uint32_t>(__popc(bal & lanemask_lt()))] = v;
      nwin += total;
      __syncthreads();  // sh.scan is reused by the next chunk
    }
  }
  const int n_sort = nwin <= 1u ? static_cast<int>(nwin) : 1 << (32 - __clz(static_cast<int>(nwin) - 1));
  for (int i = static_cast<int>(nwin) + tid; i < n_sort; i += nthreads) ent[i] = 0ull;  // below every sort key
  __syncthreads();
  bitonic_sort_desc(ent, n_sort);

  if constexpr (!CLUSTER) {
    for (int j = tid; j < static_cast<int>(nwin); j += nthreads) emit(static_cast<uint32_t>(j), ent[j]);
    return;
  } else {
    const cg::cluster_group cl = cg::this_cluster();
    if (tid == 0) sh.winners = nwin;
    cl.sync();  // every CTA's winners are sorted and counted
    if (tid < kWarp) {
      const uint32_t w = tid < nctas ? *cl.map_shared_rank(&sh.winners, tid) : 0u;
      if (tid < kMaxCluster) sh.runs[tid] = w;
    }
    __syncthreads();
    if (!rank_order) {
      cl.barrier_arrive();  // this CTA's remote reads are done
      uint32_t base = 0u;
      for (int r = 0; r < rank; ++r) base += sh.runs[r];
      for (int j = tid; j < static_cast<int>(nwin); j += nthreads) emit(base + static_cast<uint32_t>(j), ent[j]);
      cl.barrier_wait();  // no CTA exits while another may still read its counts
      return;
    }
    // Rank order: the other CTAs' runs behind this CTA's (k <= kStreamCap entries in all),
    // kOutUnroll remote loads in flight per thread.
    constexpr uint32_t kCap = kStreamCap;
    {
      uint32_t off = nwin;
      for (int r = 0; r < nctas; ++r) {
        if (r == rank) continue;
        const uint64_t* run = cl.map_shared_rank(ent, r);
        const int n = static_cast<int>(min(sh.runs[r], kCap - min(off, kCap)));  // (never clipped)
        for (int j0 = tid; j0 < n; j0 += kOutUnroll * nthreads) {
          uint64_t v[kOutUnroll];
#pragma unroll
          for (int u = 0; u < kOutUnroll; ++u) {
            const int j = j0 + u * nthreads;
            v[u] = j < n ? run[j] : 0ull;
          }
#pragma unroll
          for (int u = 0; u < kOutUnroll; ++u) {
            const int j = j0 + u * nthreads;
            if (j < n) ent[off + j] = v[u];
          }
        }
        off += sh.runs[r];
      }
    }
    cl.barrier_arrive();  // this CTA's remote reads are done
    __syncthreads();
    for (int i = tid; i < static_cast<int>(nwin); i += nthreads) {
      const uint64_t v = ent[i];
      uint32_t pos = static_cast<uint32_t>(i);
      uint32_t off = nwin;
      for (int r = 0; r < nctas; ++r) {
        if (r == rank) continue;
        pos += count_greater(ent + min(off, kCap), min(sh.runs[r], kCap - min(off, kCap)), v);
        off += sh.runs[r];
      }
      emit(pos, v);
    }
    cl.barrier_wait();  // no CTA exits while another may still read its runs
  }
}

}  // namespace topk_detail
}  // namespace fray
