"""Copies the sampling kernel headers (and cuda/common) into OUT with the few CUDA-only constructs
replaced for the SIMT emulator (cuda/topk/emu/emu.h): the cooperative_groups include, the dynamic
shared-memory declaration, and fast_exp2's ex2.approx (exp2f here: the emulated kernel and the
reference in emu_test.cc use the same weights, so tokens must match exactly).
Usage: python3 gen.py OUT"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "topk", "emu"))
from emu_gen import copy_header, replace_func, stage  # noqa: E402

out = sys.argv[1]
cuda = stage(out, "sampling")

# The host launch helpers (the emulator never launches): a triple-chevron launch is not C++,
# and blockDim is the emulator's macro.
p = os.path.join(cuda, "common", "cluster_launch.cuh")
s = open(p).read()
for a, b in (("fn<<<grid, block, smem, stream>>>(args);", "(void)fn;"), ("cfg.blockDim = block;", "(void)block;")):
    assert a in s, a
    s = s.replace(a, b)
open(p, "w").write(s)


# The bulk copies (TMA) and their mbarriers: thread 0 copies the slice itself before the block
# barrier that follows it in the kernel, and the per-chunk waits have nothing to wait for.
p = os.path.join(cuda, "common", "bulk_copy.cuh")
open(p, "w").write("// bulk copies: emulated in sample.cuh (gen.py)\n#pragma once\n")


def edit_sample(s):
    a = "extern __shared__ __align__(16) unsigned char smem[];"
    assert a in s, a
    s = s.replace(a, "unsigned char* smem = ::emu::dynamic_shared();")
    s = replace_func(s, "__device__ __forceinline__ void slice_load_issue(void* dst, const void* src, int full, uint64_t* bars) {",
                     "\n  (void)bars;\n  for (int i = 0; i < full * 16; ++i) static_cast<char*>(dst)[i] = static_cast<const char*>(src)[i];\n}\n")
    s = replace_func(s, "__device__ __forceinline__ void slice_chunk_wait(uint64_t* bars, int k) {",
                     " (void)bars; (void)k; }\n")
    s = replace_func(s, "__device__ __forceinline__ void cluster_arrive_relaxed() {",
                     " cg::this_cluster().barrier_arrive(); }\n")
    # Pushed exchanges: the mbarrier word holds an arrived flag (bit 63) and the signed count of
    # bytes still to land (low 32 bits); a push writes the receiver's slot, then counts its bytes.
    s = replace_func(s, "__device__ __forceinline__ void xchg_init(uint64_t* bars) {",
                     "\n  for (int i = 0; i < kXchgs; ++i) bars[i] = 0;\n}\n")
    s = replace_func(s, "__device__ __forceinline__ void xchg_expect(uint64_t* bar, uint32_t bytes) {",
                     "\n  if (*bar >> 63) ::emu::fail(\"xchg_expect twice in one phase\");\n"
                     "  *bar = (1ull << 63) | static_cast<uint32_t>(static_cast<int32_t>(*bar) + static_cast<int32_t>(bytes));\n}\n")
    s = replace_func(s, "__device__ __forceinline__ void xchg_push(uint64_t* slot, uint64_t v, uint64_t* bar, int rank) {",
                     "\n  const cg::cluster_group c = cg::this_cluster();\n"
                     "  if (c.num_blocks() < 2) ::emu::fail(\"st.async push in a cluster of one block (no peer)\");\n"
                     "  *c.map_shared_rank(slot, rank) = v;\n"
                     "  uint64_t* b = c.map_shared_rank(bar, rank);\n"
                     "  *b = (*b & (1ull << 63)) | static_cast<uint32_t>(static_cast<int32_t>(*b) - 8);\n"
                     "  ++::emu::S().progress;  // (a waiting block may now complete: not a deadlock)\n}\n")
    # An mbarrier wait orders only the waiting thread: past it, a warp may run many rounds ahead of
    # another (each warp resumes 0-255 scheduling rounds late, drawn per warp and wait), so a
    # phase that reuses a buffer a slower warp still reads after its wait fails here unless a
    # block barrier separates them (select_bin_push's staging at C = 2 is cand[0, 4)).
    s = replace_func(s, "__device__ __forceinline__ void xchg_wait(uint64_t* bar) {",
                     "\n  while (!((*bar >> 63) && static_cast<int32_t>(*bar) == 0)) ::emu::yield();\n"
                     "  unsigned long long d = (threadIdx.x & 31) == 0 ? ::emu::S().rng() & 255 : 0;\n"
                     "  d = __shfl_sync(0xffffffffu, d, 0);  // one delay per warp\n"
                     "  for (; d > 0; --d) { ++::emu::S().progress; ::emu::yield(); }\n}\n")
    return replace_func(s, "__device__ __forceinline__ float fast_exp2(float x) {", " return exp2f(x); }\n")


copy_header(out, "sampling", "sample.cuh", edit_sample)
copy_header(out, "sampling", "philox.cuh")
copy_header(out, "sampling", "sampling.h")
