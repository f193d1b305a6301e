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
constexpr int kStreamThreads = 256;
constexpr int kStreamMinBlocks = 4;   // __launch_bounds__(256, 4): 64 registers, 4 CTAs per SM
constexpr int kStreamRadix = 11;      // digit bits (2048-bin histograms)
constexpr int kStreamCap = 4096;      // entries per CTA (power of two, >= every k it serves)
constexpr int kStreamMaxK = kStreamCap;

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
constexpr int blocks_per_sm(int threads, int regs, size_t dynamic_smem) {
  int b = kMaxBlocksPerSm;
  if (kMaxThreadsPerSm / threads < b) b = kMaxThreadsPerSm / threads;
  if (kRegsPerSm / (threads * regs) < b) b = kRegsPerSm / (threads * regs);
  const int by_smem = static_cast<int>(kSmemPerSm / (dynamic_smem + kStaticSmemBound + kSmemReservedPerBlock));
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
static_assert(kRegsPerSm / (kStreamThreads * kStreamMinBlocks) == kMaxRegsPerThread,
              "topk_stream_kernel: __launch_bounds__(kStreamThreads, kStreamMinBlocks)");
static_assert(blocks_per_sm(kStreamThreads, kMaxRegsPerThread, stream_smem(2)) == kStreamMinBlocks,
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

// Cluster size: the fewest CTAs whose 64 KB key slices hold the row, doubled
// while rows x CTAs leave SMs idle and slices stay >= 2048 elements (one row of
// 131072 takes 16 SMs instead of 8). Threads: one per 16 slice elements, 32 to
// 512. Histograms: 2048 bins (11-bit digits) from 4096-element slices, 256
// bins below that (zeroing 2048 bins per pass would dominate short rows).
inline TopkConfig topk_config(int64_t rows, int64_t width, int64_t k, bool sorted, int key_bytes, int num_sms) {
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
  // 2048) with rows x C within one wave of stream CTAs (4 per SM); 1 when the rows alone exceed it.
  const int64_t slots = static_cast<int64_t>(num_sms) * blocks_per_sm(c.threads, kMaxRegsPerThread, c.smem);
  if (rows * c.cluster > slots && width * key_bytes > kSliceBytes && k <= kStreamMaxK) {
    const int64_t stream_slots =
        static_cast<int64_t>(num_sms) * blocks_per_sm(kStreamThreads, kMaxRegsPerThread, stream_smem(2));
    int64_t sc = 1;
    while (sc < kMaxCluster && rows * 2 * sc <= stream_slots && ceil_div(width, 2 * sc) >= kMinSplitSlice) sc *= 2;
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
