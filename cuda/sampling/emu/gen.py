"""Copies the sampling kernel headers (and cuda/common) into OUT with the few CUDA-only constructs
replaced for the SIMT emulator (cuda/topk/emu/emu.h): the cooperative_groups include, the dynamic
shared-memory declaration, and fast_exp2's ex2.approx (exp2f here: the emulated kernel and the
reference in emu_test.cc use the same weights, so tokens must match exactly).
Usage: python3 gen.py OUT"""
import os
import re
import shutil
import sys

root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
out = sys.argv[1]
shutil.rmtree(os.path.join(out, "cuda"), ignore_errors=True)
os.makedirs(os.path.join(out, "cuda", "sampling"))
shutil.copytree(os.path.join(root, "cuda", "common"), os.path.join(out, "cuda", "common"))


def replace_func(s, sig, body):
    i = s.index(sig)
    j = s.index("\n}\n", i)
    return s[:i] + sig + body + s[j + 3:]


# The host launch helpers (the emulator never launches): a triple-chevron launch is not C++,
# and blockDim is the emulator's macro.
p = os.path.join(out, "cuda", "common", "cluster_launch.cuh")
s = open(p).read()
a = "fn<<<grid, block, smem, stream>>>(args);"
assert a in s, a
s = s.replace(a, "(void)fn;")
a = "cfg.blockDim = block;"  # blockDim is the emulator's macro
assert a in s, a
open(p, "w").write(s.replace(a, "(void)block;"))

for name in ("sample.cuh", "philox.cuh", "sampling.h"):
    s = open(os.path.join(root, "cuda", "sampling", name)).read()
    s = s.replace("#include <cooperative_groups.h>\n", "")
    if name == "sample.cuh":
        a = "extern __shared__ __align__(16) unsigned char smem[];"
        assert a in s, a
        s = s.replace(a, "unsigned char* smem = ::emu::dynamic_shared();")
        s = replace_func(s, "__device__ __forceinline__ float fast_exp2(float x) {", " return exp2f(x); }\n")
    assert "asm" not in re.sub(r"//.*", "", s), "%s: inline asm left for the emulator" % name
    open(os.path.join(out, "cuda", "sampling", name), "w").write(s)
