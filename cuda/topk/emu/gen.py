"""Copies the topk kernel headers into OUT/cuda/topk with the few CUDA-only constructs replaced by
the emulator's (emu.h): the cooperative_groups include, the two shared-memory declarations of the
streaming kernel, and its inline-asm helpers (lanemask_lt, mapa, ld.shared::cluster).
Usage: python3 gen.py OUT"""
import os
import re
import shutil
import sys

root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
out = sys.argv[1]
shutil.rmtree(os.path.join(out, "cuda"), ignore_errors=True)
os.makedirs(os.path.join(out, "cuda", "topk"))
shutil.copytree(os.path.join(root, "cuda", "common"), os.path.join(out, "cuda", "common"))


def replace_func(s, sig, body):
    i = s.index(sig)
    j = s.index("\n}\n", i)
    return s[:i] + sig + body + s[j + 3:]


for name in ("order_key.cuh", "topk_plan.h", "topk.h", "topk_device.cuh", "topk_stream.cuh"):
    s = open(os.path.join(root, "cuda", "topk", name)).read()
    s = s.replace("#include <cooperative_groups.h>\n", "")
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
    assert "asm" not in re.sub(r"//.*", "", s), "%s: inline asm left for the emulator" % name
    open(os.path.join(out, "cuda", "topk", name), "w").write(s)
