"""Copies the topk kernel headers into OUT/cuda/topk with the few CUDA-only constructs replaced by
the emulator's (emu.h): the cooperative_groups include, the two shared-memory declarations of the
streaming kernel, and its inline-asm helpers (lanemask_lt, mapa, ld.shared::cluster).
Usage: python3 gen.py OUT"""
import sys

from emu_gen import copy_header, replace_func, stage

out = sys.argv[1]
stage(out, "topk")


def edit(name):
    def f(s):
        if name == "topk_device.cuh":
            s = replace_func(s, "__device__ __forceinline__ uint32_t lanemask_lt() {",
                             " return ::emu_impl::lanemask_lt(); }\n")
        if name == "topk_stream.cuh":
            for a, b in (("extern __shared__ __align__(16) unsigned char smem[];",
                          "unsigned char* smem = ::emu::dynamic_shared();"),
                         ("__shared__ StreamScratch sh;", "StreamScratch& sh = *::emu::static_shared<StreamScratch>();")):
                assert a in s, a
                s = s.replace(a, b)
            s = replace_func(s, "__device__ __forceinline__ uint32_t map_cluster(uint32_t addr, int rank) {",
                             " return ::emu_impl::map_cluster(addr, rank); }\n")
            s = replace_func(s, "__device__ __forceinline__ uint32_t ld_cluster_u32(uint32_t addr) {",
                             " return ::emu_impl::ld_cluster_u32(addr); }\n")
        return s
    return f


for name in ("order_key.cuh", "topk_plan.h", "topk.h", "topk_device.cuh", "topk_stream.cuh"):
    copy_header(out, "topk", name, edit(name))
