// A small SIMT emulator for checking kernels' logic on a CPU (no GPU here): the topk stream
// kernel (cuda/topk/emu) and the sampling kernel (cuda/sampling/emu).
// Every CUDA thread is a fiber (ucontext) of one OS thread, scheduled cooperatively in a
// random order; fibers switch only at synchronisation points (block/cluster barriers, warp
// collectives). Warp collectives check that all 32 lanes make the same collective (catches
// non-uniform ballots/shuffles), barriers detect deadlock, shared memory is per CTA with
// guard bytes after the dynamic area, and map_shared_rank / mapa address other CTAs.
// It does NOT model the memory model (no reordering, no races beyond the scheduling order).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace emu {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "EMU FAILURE: %s\n", what);
  std::abort();
}

struct Barrier {
  int expected = 0;
  int count = 0;
  uint64_t gen = 0;
};

struct Warp {
  uint64_t vals[32];
  int kind[32];
  Barrier in, out;
};

constexpr size_t kStaticArea = 4096;
constexpr size_t kGuard = 256;
constexpr uint8_t kGuardByte = 0xA5;

struct Block {
  std::vector<unsigned char> shared;  // static area, dynamic area, guard
  Barrier bar;
  std::vector<Warp> warps;
};

struct Thread {
  ucontext_t ctx;
  int block = 0;
  int tid = 0;
  bool done = false;
  bool arrived = false;
  uint64_t arrive_gen = 0;
  std::vector<char> stack;
};

struct State {
  int nthreads = 0;
  int cluster = 1;
  int block0 = 0;  // blockIdx.x of the running cluster's rank 0
  size_t dyn = 0;
  std::vector<Block> blocks;
  std::vector<Thread> threads;
  Barrier cluster_bar;
  ucontext_t sched;
  int cur = -1;
  uint64_t progress = 0;
  std::mt19937_64 rng{1};
  std::function<void()> entry;
  uint64_t switches = 0;
};

inline State& S() {
  static State s;
  return s;
}
inline Thread& me() { return S().threads[S().cur]; }
inline void yield() {
  ++S().switches;
  swapcontext(&me().ctx, &S().sched);
}

inline void wait(Barrier& b) {
  const uint64_t g = b.gen;
  ++S().progress;
  if (++b.count == b.expected) {
    b.count = 0;
    ++b.gen;
  } else {
    while (b.gen == g) yield();
  }
}

inline unsigned char* block_base(int b) { return S().blocks[b].shared.data(); }
inline unsigned char* dynamic_shared() { return block_base(me().block) + kStaticArea; }
template <class T>
T* static_shared() {
  static_assert(sizeof(T) <= kStaticArea, "static area");
  return reinterpret_cast<T*>(block_base(me().block));
}

inline size_t shared_offset(const void* p) {
  const unsigned char* b = block_base(me().block);
  const unsigned char* q = static_cast<const unsigned char*>(p);
  if (q < b || q >= b + kStaticArea + S().dyn) fail("pointer is not this CTA's shared memory");
  return static_cast<size_t>(q - b);
}

template <class V>
inline void exchange(int kind, V v, uint64_t (&out)[32]) {
  static_assert(sizeof(V) <= 8, "exchange");
  Thread& t = me();
  Warp& w = S().blocks[t.block].warps[t.tid / 32];
  const int lane = t.tid % 32;
  uint64_t x = 0;
  std::memcpy(&x, &v, sizeof(V));
  w.vals[lane] = x;
  w.kind[lane] = kind;
  wait(w.in);
  for (int l = 0; l < 32; ++l) {
    if (w.kind[l] != kind) fail("non-uniform warp collective (lanes made different collectives)");
  }
  std::memcpy(out, w.vals, sizeof(out));
  wait(w.out);
}

struct Idx {
  unsigned x, y, z;
};
inline Idx tidx() { return {static_cast<unsigned>(me().tid), 0u, 0u}; }
inline Idx bidx() { return {static_cast<unsigned>(S().block0 + me().block), 0u, 0u}; }
inline Idx bdim() { return {static_cast<unsigned>(S().nthreads), 1u, 1u}; }

inline void fiber_main() {
  S().entry();
  me().done = true;
  ++S().progress;
  swapcontext(&me().ctx, &S().sched);
  fail("finished fiber resumed");
}

// Runs fn for `cluster` CTAs of nthreads threads (blockIdx.x = block0 + rank).
inline void run_cluster(std::function<void()> fn, int block0, int cluster, int nthreads, size_t dyn) {
  State& s = S();
  s.nthreads = nthreads;
  s.cluster = cluster;
  s.block0 = block0;
  s.dyn = dyn;
  s.entry = std::move(fn);
  s.blocks.assign(cluster, Block{});
  for (auto& b : s.blocks) {
    b.shared.assign(kStaticArea + dyn + kGuard, 0);
    for (size_t i = 0; i < kStaticArea + dyn; ++i) b.shared[i] = static_cast<unsigned char>(s.rng());  // garbage
    std::memset(b.shared.data() + kStaticArea + dyn, kGuardByte, kGuard);
    b.bar.expected = nthreads;
    b.warps.assign(nthreads / 32, Warp{});
    for (auto& w : b.warps) {
      w.in.expected = 32;
      w.out.expected = 32;
    }
  }
  s.cluster_bar = Barrier{};
  s.cluster_bar.expected = cluster * nthreads;
  s.threads.clear();
  s.threads.resize(static_cast<size_t>(cluster) * nthreads);
  for (int i = 0; i < cluster * nthreads; ++i) {
    Thread& t = s.threads[i];
    t.block = i / nthreads;
    t.tid = i % nthreads;
    t.stack.resize(192 * 1024);
    getcontext(&t.ctx);
    t.ctx.uc_stack.ss_sp = t.stack.data();
    t.ctx.uc_stack.ss_size = t.stack.size();
    t.ctx.uc_link = nullptr;
    makecontext(&t.ctx, fiber_main, 0);
  }
  std::vector<int> order(s.threads.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  for (;;) {
    std::shuffle(order.begin(), order.end(), s.rng);
    const uint64_t before = s.progress;
    bool alive = false;
    for (int i : order) {
      if (s.threads[i].done) continue;
      alive = true;
      s.cur = i;
      swapcontext(&s.sched, &s.threads[i].ctx);
    }
    s.cur = -1;
    if (!alive) break;
    if (s.progress == before) fail("deadlock: a whole round without a barrier arrival");
  }
  for (auto& b : s.blocks) {
    for (size_t i = 0; i < kGuard; ++i) {
      if (b.shared[kStaticArea + dyn + i] != kGuardByte) fail("write past the dynamic shared memory");
    }
  }
  if (s.cluster_bar.count != 0) fail("cluster barrier left with arrivals");
}

}  // namespace emu

// ---- CUDA surface used by the kernels ----
#undef threadIdx
#undef blockIdx
#undef blockDim
#define threadIdx (::emu::tidx())
#define blockIdx (::emu::bidx())
#define blockDim (::emu::bdim())
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif

inline void __syncthreads() { ::emu::wait(::emu::S().blocks[::emu::me().block].bar); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) ::emu::fail("__syncwarp with a partial mask");
  uint64_t v[32];
  ::emu::exchange(6, 0u, v);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  if (mask != 0xffffffffu) ::emu::fail("partial mask");
  uint64_t v[32];
  ::emu::exchange(1, static_cast<uint32_t>(pred != 0), v);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= (v[l] != 0 ? 1u : 0u) << l;
  return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0u; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == 0xffffffffu; }
namespace emu_impl {
// A shuffle: every lane publishes v; a lane reads lane src(lane)'s value, or keeps its own v when
// src(lane) is outside the warp (shfl_up / shfl_down at the edges).
template <class V, class Src>
V shuffle(int kind, unsigned mask, V v, Src src) {
  if (mask != 0xffffffffu) ::emu::fail("partial mask");
  uint64_t x[32];
  ::emu::exchange(kind, v, x);
  const int from = src(::emu::me().tid % 32);
  if (from < 0 || from >= 32) return v;
  V r;
  std::memcpy(&r, &x[from], sizeof(V));
  return r;
}
}  // namespace emu_impl
template <class V>
V __shfl_sync(unsigned mask, V v, int src, int = 32) {
  return ::emu_impl::shuffle(2, mask, v, [src](int) { return src & 31; });
}
template <class V>
V __shfl_xor_sync(unsigned mask, V v, int m, int = 32) {
  return ::emu_impl::shuffle(3, mask, v, [m](int lane) { return lane ^ m; });
}
template <class V>
V __shfl_up_sync(unsigned mask, V v, unsigned d, int = 32) {
  return ::emu_impl::shuffle(4, mask, v, [d](int lane) { return lane - static_cast<int>(d); });
}
template <class V>
V __shfl_down_sync(unsigned mask, V v, unsigned d, int = 32) {
  return ::emu_impl::shuffle(5, mask, v, [d](int lane) { return lane + static_cast<int>(d); });
}
namespace emu_impl {
template <class Op>
unsigned reduce(int kind, unsigned mask, unsigned v, unsigned init, Op op) {
  if (mask != 0xffffffffu) ::emu::fail("partial mask");
  uint64_t x[32];
  ::emu::exchange(kind, v, x);
  unsigned r = init;
  for (int l = 0; l < 32; ++l) r = op(r, static_cast<unsigned>(x[l]));
  return r;
}
}  // namespace emu_impl
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
  return ::emu_impl::reduce(7, mask, v, 0u, [](unsigned a, unsigned b) { return a + b; });
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
  return ::emu_impl::reduce(8, mask, v, 0xffffffffu, [](unsigned a, unsigned b) { return std::min(a, b); });
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  return ::emu_impl::reduce(9, mask, v, 0u, [](unsigned a, unsigned b) { return std::max(a, b); });
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// The GPU's conversions: round to nearest even (rn) or toward zero (rz), saturating, NaN -> 0.
inline unsigned __float2uint_rn(float f) {
  if (f != f || f <= 0.0f) return 0u;
  if (f >= 4294967296.0f) return 0xffffffffu;
  return static_cast<unsigned>(std::nearbyint(static_cast<double>(f)));
}
inline int __float2int_rz(float f) {
  if (f != f) return 0;
  if (f >= 2147483648.0f) return 0x7fffffff;
  if (f <= -2147483648.0f) return static_cast<int>(0x80000000u);
  return static_cast<int>(f);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned o = *p;
  *p = o + v;
  return o;
}
template <class T>
T __ldg(const T* p) {
  return *p;
}
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffs(unsigned x) { return __builtin_ffs(static_cast<int>(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline size_t __cvta_generic_to_shared(const void* p) { return ::emu::shared_offset(p); }

namespace emu_impl {
inline uint32_t lanemask_lt() { return (1u << (::emu::me().tid % 32)) - 1u; }
inline uint32_t map_cluster(uint32_t addr, int rank) {
  if (addr >= (1u << 20) || rank < 0 || rank >= ::emu::S().cluster) ::emu::fail("mapa: bad address or rank");
  return (static_cast<uint32_t>(rank) << 20) | addr;
}
inline uint32_t ld_cluster_u32(uint32_t addr) {
  const int rank = static_cast<int>(addr >> 20);
  const uint32_t off = addr & ((1u << 20) - 1u);
  if (off + 4 > ::emu::kStaticArea + ::emu::S().dyn) ::emu::fail("ld.shared::cluster out of bounds");
  uint32_t v;
  std::memcpy(&v, ::emu::block_base(rank) + off, 4);
  return v;
}
}  // namespace emu_impl

namespace cooperative_groups {
struct cluster_group {
  unsigned num_blocks() const { return static_cast<unsigned>(::emu::S().cluster); }
  unsigned block_rank() const { return static_cast<unsigned>(::emu::me().block); }
  void barrier_arrive() const {
    ::emu::Thread& t = ::emu::me();
    if (t.arrived) ::emu::fail("barrier_arrive twice");
    t.arrived = true;
    ::emu::Barrier& b = ::emu::S().cluster_bar;
    t.arrive_gen = b.gen;
    ++::emu::S().progress;
    if (++b.count == b.expected) {
      b.count = 0;
      ++b.gen;
    }
  }
  void barrier_wait() const {
    ::emu::Thread& t = ::emu::me();
    if (!t.arrived) ::emu::fail("barrier_wait without arrive");
    t.arrived = false;
    while (::emu::S().cluster_bar.gen == t.arrive_gen) ::emu::yield();
  }
  void sync() const {
    barrier_arrive();
    barrier_wait();
  }
  template <class T>
  T* map_shared_rank(T* p, int rank) const {
    if (rank < 0 || rank >= ::emu::S().cluster) ::emu::fail("map_shared_rank: bad rank");
    const size_t off = ::emu::shared_offset(p);
    return reinterpret_cast<T*>(::emu::block_base(rank) + off);
  }
  template <class T>
  T* map_shared_rank(T* p, unsigned rank) const {
    return map_shared_rank(p, static_cast<int>(rank));
  }
};
inline cluster_group this_cluster() { return {}; }
}  // namespace cooperative_groups
