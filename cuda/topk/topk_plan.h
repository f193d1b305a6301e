// Fray topk family: the top-k launch plan and the launch limits it must respect.
// Host-only plain C++ (no CUDA compiler, no CUDA headers): topk.cuh launches from
// it and topk_api.cc exposes it to the CPU tests (every plan checked launchable).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fray {
namespace topk_detail {

constexpr int kMaxCluster = 16;      // sm_90 limit (above 8 needs the non-portable opt-in)
constexpr int kPortableCluster = 8;
constexpr size_t kDefaultSmem = 48 * 1024;   // static + dynamic shared memory per block without the opt-in
constexpr size_t kMaxSmemPerBlock = 232448;  // sm_90 opt-in limit (227 KB), static + dynamic
// Upper bound of the static shared memory of every topk/argmax kernel (static_assert'ed at
// the kernels). The opt-in decision adds it: 48 KB of dynamic memory alone is already too
// much without the opt-in once a kernel declares any static shared memory.
constexpr size_t kStaticSmemBound = 1024;
constexpr int64_t kMaxBlocksPerLaunch = int64_t{1} << 30;  // keeps grid.x < 2^31 - 1

constexpr int kMaxThreads = 512;      // block size of wide slices: 2 blocks per SM (64 registers)
constexpr int kMinThreads = 32;       // one warp: short rows (4096 x 256) pack 32 blocks per SM
constexpr int kItemsPerThread = 16;   // slice elements per thread that size the block
constexpr int kSliceBytes = 64 * 1024;  // keys per CTA: 3 CTAs (plus histograms) fit an SM's 228 KB
constexpr int kMinSplitSlice = 2048;  // few rows: split a row over more CTAs down to this slice
constexpr int kSliceAlign = 8;        // slice length multiple: 16-byte key vectors, 16/32-byte loads
constexpr int kSmallRadix = 8;        // digit bits for short slices (256-bin histograms)
constexpr int kBigRadix = 11;         // digit bits for long slices: fewer passes, fewer conflicts
constexpr int kBigRadixMinSlice = 4096;
// Registers per thread the kernels may use: __launch_bounds__(kMaxThreads, 2) caps them at 64.
constexpr int kMaxRegsPerThread = 64;

// The streaming kernel (topk_stream.cuh): rows the row-in-shared-memory plan cannot run in one
// wave. Each CTA streams its slice from global memory and keeps only histograms and a buffer
// of kStreamCap composite keys (key << index bits | ~index) on chip, so several CTAs share an SM.
// 6 warps per CTA, 5 CTAs per SM (64 registers): 8 warps and 4 CTAs per SM held only 62 clusters of
// 8 on the H200 (whole clusters must fit in one GPC), so 64 rows ran as two waves.
constexpr int kStreamThreads = 192;
constexpr int kStreamMinBlocks = 5;   // __launch_bounds__(192, 5): 64 registers, 5 CTAs per SM
constexpr int kStreamRadix = 11;      // digit bits (2048-bin histograms)
// The streaming kernel's static shared memory bound (static_assert'ed there; 272 B): with the
// general 1 KB bound, 5 CTAs with 2-CTA clusters' histograms would not seem to fit an SM.
constexpr size_t kStreamStaticSmemBound = 512;
constexpr int kStreamCap = 4096;      // entries per CTA (power of two, >= every k it serves)
constexpr int kStreamMaxK = kStreamCap;
// The streaming kernel's prefilter (topk_stream.cuh, step 1a: the first pass counts each 16-byte
// vector's largest key instead of every key): for k <= 1024 and rows of >= 16 k elements, where
// the k-th largest vector maximum sits in the k-th largest element's top-digit bin or close
// below it, so the compaction it bounds stays small.
constexpr int kStreamPrefilterMaxK = 1024;
constexpr bool stream_prefilter(int64_t width, int64_t k, bool vec_loads) {
  return vec_loads && k <= kStreamPrefilterMaxK && k * 16 <= width;
}

// sm_90 per-SM resources the wave estimate uses.
constexpr int kRegsPerSm = 65536;
constexpr int kMaxThreadsPerSm = 2048;
constexpr int kMaxBlocksPerSm = 32;
constexpr size_t kSmemPerSm = 233472;        // 228 KB
constexpr size_t kSmemReservedPerBlock = 1024;  // the runtime's per-block reservation

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Whether a launch with `dynamic_smem` bytes needs cudaFuncAttributeMaxDynamicSharedMemorySize.
constexpr bool needs_smem_optin(size_t dynamic_smem) { return dynamic_smem + kStaticSmemBound > kDefaultSmem; }

// CTAs of `threads` threads, `regs` registers each and `dynamic_smem` bytes (plus the static
// bound) that one SM holds at once: the smallest of the thread, block, register and
// shared-memory limits (registers at the launch-bounds cap, an upper bound of the real use).
constexpr int blocks_per_sm(int threads, int regs, size_t dynamic_smem, size_t static_bound = kStaticSmemBound) {
  int b = kMaxBlocksPerSm;
  if (kMaxThreadsPerSm / threads < b) b = kMaxThreadsPerSm / threads;
  if (kRegsPerSm / (threads * regs) < b) b = kRegsPerSm / (threads * regs);
  const int by_smem = static_cast<int>(kSmemPerSm / (dynamic_smem + static_bound + kSmemReservedPerBlock));
  if (by_smem < b) b = by_smem;
  return b;
}

// Dynamic shared memory of the streaming kernel: the entry buffer (8-byte composite keys), the
// 2^11-bin histogram and, in a cluster, this CTA's 1/C share of the merged histogram.
constexpr size_t stream_smem(int cluster) {
  const size_t bins = size_t{1} << kStreamRadix;
  return static_cast<size_t>(kStreamCap) * sizeof(uint64_t) +
         (bins + (cluster > 1 ? bins / static_cast<size_t>(cluster) : 0)) * sizeof(uint32_t);
}

static_assert(kRegsPerSm / (kMaxThreads * 2) == kMaxRegsPerThread, "topk_kernel: __launch_bounds__(kMaxThreads, 2)");
// (the register cap of __launch_bounds__ is allocated in multiples of 8 per thread)
static_assert(kRegsPerSm / (kStreamThreads * kStreamMinBlocks) / 8 * 8 == kMaxRegsPerThread,
              "topk_stream_kernel: __launch_bounds__(kStreamThreads, kStreamMinBlocks)");
static_assert(blocks_per_sm(kStreamThreads, kMaxRegsPerThread, stream_smem(2), kStreamStaticSmemBound) ==
                  kStreamMinBlocks,
              "the stream plan's shared memory admits kStreamMinBlocks CTAs per SM");

struct TopkConfig {
  int cluster;    // CTAs per row
  int slice;      // elements per CTA
  int threads;    // per CTA
  bool big_radix;
  int sort_size;  // 0: index-ordered output
  size_t smem;    // dynamic shared memory per CTA
  bool stream;    // the streaming kernel (topk_stream.cuh) instead of the row-in-shared-memory one
};

// Clusters of the streaming kernel that the device holds at once, per cluster size 2^i (i = 0..4):
// whole clusters must fit inside one GPC, so fewer than SMs x 4 / C are resident (132-SM H200:
// 77 clusters of 8 stream CTAs, not 82). The launcher fills it from cudaOccupancyMaxActiveClusters;
// without it (null, or an entry <= 0) the plan assumes SMs x kStreamMinBlocks / C.
struct StreamFit {
  int max_clusters[5];
};

// Cluster size: the fewest CTAs whose 64 KB key slices hold the row, doubled
// while rows x CTAs leave SMs idle and slices stay >= 2048 elements (one row of
// 131072 takes 16 SMs instead of 8). Threads: one per 16 slice elements, 32 to
// 512. Histograms: 2048 bins (11-bit digits) from 4096-element slices, 256
// bins below that (zeroing 2048 bins per pass would dominate short rows).
inline TopkConfig topk_config(int64_t rows, int64_t width, int64_t k, bool sorted, int key_bytes, int num_sms,
                              const StreamFit* fit = nullptr) {
  TopkConfig c{};
  const int64_t max_slice = kSliceBytes / key_bytes;
  int64_t cl = 1;
  while (cl < kMaxCluster && ceil_div(width, cl) > max_slice) cl *= 2;
  while (cl < kMaxCluster && rows * cl < num_sms && ceil_div(width, 2 * cl) >= kMinSplitSlice) cl *= 2;
  c.cluster = static_cast<int>(cl);
  c.slice = static_cast<int>(ceil_div(ceil_div(width, cl), kSliceAlign) * kSliceAlign);
  const int64_t t = next_pow2(ceil_div(c.slice, kItemsPerThread));
  c.threads = static_cast<int>(t < kMinThreads ? kMinThreads : t > kMaxThreads ? kMaxThreads : t);
  c.big_radix = c.slice >= kBigRadixMinSlice;
  c.sort_size = sorted ? static_cast<int>(next_pow2(k)) : 0;
  const size_t bins = size_t{1} << (c.big_radix ? kBigRadix : kSmallRadix);
  const size_t hist_bytes = (bins + (c.cluster > 1 ? bins / c.cluster : 0)) * sizeof(uint32_t);
  const size_t sort_bytes = static_cast<size_t>(c.sort_size) * sizeof(uint64_t);
  c.smem = static_cast<size_t>(c.slice) * key_bytes + (hist_bytes > sort_bytes ? hist_bytes : sort_bytes);
  c.stream = false;
  // The streaming plan: when rows x C CTAs of this plan need more than one wave of resident CTAs
  // (the keys of all rows exceed the SMs' shared memory), the row does not fit one CTA's slice
  // (short rows run as plain batched CTAs, where waves are cheap), and k <= kStreamMaxK (every
  // CTA can hold all k winners). Its C: the most CTAs per row (power of two <= 16, slices >=
  // 2048) whose rows x C CTAs run in one wave: every row's cluster resident at once (`fit`, else
  // within SMs x 5 CTAs); 1 when the rows alone exceed it. (The H200 holds 81 clusters of 8 with
  // the load-balancing policy the launcher asks for, 77 without, so 64 x 131072 fp32 runs at C 8;
  // with 256-thread CTAs, 4 per SM, it held 62, and the last 2 rows' clusters ran as a second
  // wave: 68 us against 58 at C 4 and 47 for 62 rows.)
  // 16-bit rows also stream when the row-in-shared-memory plan already spreads a row over >= 4
  // CTAs and the streaming plan fills the GPU twice over (64 x 131072 bf16 k 50: 54.6 against
  // 68.8 us): they have half the bytes of fp32 rows and the same on-chip work.
  if (width * key_bytes > kSliceBytes && k <= kStreamMaxK) {
    const int64_t stream_slots =
        static_cast<int64_t>(num_sms) *
        blocks_per_sm(kStreamThreads, kMaxRegsPerThread, stream_smem(2), kStreamStaticSmemBound);
    auto resident = [&](int64_t cl, int log2_cl) {
      const int f = fit != nullptr ? fit->max_clusters[log2_cl] : 0;
      return f > 0 ? static_cast<int64_t>(f) : stream_slots / cl;
    };
    int64_t sc = 1;
    int lg = 0;
    while (sc < kMaxCluster && rows <= resident(2 * sc, lg + 1) && ceil_div(width, 2 * sc) >= kMinSplitSlice) {
      sc *= 2;
      ++lg;
    }
    const int64_t slots = static_cast<int64_t>(num_sms) * blocks_per_sm(c.threads, kMaxRegsPerThread, c.smem);
    const bool waves = rows * c.cluster > slots;
    const bool wide16 = key_bytes == 2 && c.cluster >= 4 && rows * sc >= 2 * static_cast<int64_t>(num_sms);
    if (!waves && !wide16) return c;
    c.stream = true;
    c.cluster = static_cast<int>(sc);
    c.slice = static_cast<int>(ceil_div(ceil_div(width, sc), kSliceAlign) * kSliceAlign);
    c.threads = kStreamThreads;
    c.big_radix = true;
    c.smem = stream_smem(c.cluster);
  }
  return c;
}

}  // namespace topk_detail
}  // namespace fray
