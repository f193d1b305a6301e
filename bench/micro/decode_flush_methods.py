"""How the L2 flush before each call moves the decode-attention figures (standalone; not a Bazel target).

The benchmark (fray.bench.time_us, triton's do_bench) zeroes a 256 MB buffer before each call: the
L2 is then full of dirty lines, which the timed kernel's reads must write back to HBM as they evict
them. This times, on the issue's B32 and B64-Hq64 decode shapes, SDPA, fray.decode_attention (CUDA)
and a plain read of the same K and V bytes (a Triton kernel, no math; also with its loads marked
evict-first in the L2, as Fray's K/V copies were in the reverted 5a45683-dirty experiment of
2026-11-30) under three methods:
  write-flush  do_bench as the benchmark (256 MB zeroed before each call)
  read-flush   a 256 MB buffer read (summed) before each call: the L2 holds clean lines
  no-flush     back-to-back calls (the caches hold whatever the previous call left)
Each: median over 200 calls of CUDA-event time around the call alone, three interleaved rounds.

    python3 bench/micro/decode_flush_methods.py     # on the GPU machine, the bundle's PYTHONPATH
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import fray
from fray.bench import median, time_us


@triton.jit
def _read_kernel(k_ptr, v_ptr, out_ptr, n, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(k_ptr + offs, mask=m, other=0, eviction_policy=EVICT)
    b = tl.load(v_ptr + offs, mask=m, other=0, eviction_policy=EVICT)
    s = tl.sum((a ^ b).to(tl.int32), axis=0)
    tl.store(out_ptr + pid, s)  # keeps the loads live


def plain_read(k, v, evict=""):
    kk = k.view(torch.int32).reshape(-1)
    vv = v.view(torch.int32).reshape(-1)
    block = 4096  # 16 KB of each tensor per program
    grid = triton.cdiv(kk.numel(), block)
    out = torch.empty(grid, device=k.device, dtype=torch.int32)
    return lambda: _read_kernel[(grid,)](kk, vv, out, kk.numel(), BLOCK=block, EVICT=evict,
                                         num_warps=8)


def event_us(fn, flush, calls=200):
    times = []
    for _ in range(10):
        fn()
    for _ in range(calls):
        if flush is not None:
            flush()
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        times.append((s, e))
    torch.cuda.synchronize()
    return median([1000.0 * s.elapsed_time(e) for s, e in times])


def flush_methods(dev, event_write_flush=True):
    """{method: timer(fn) -> us}: the write flush (do_bench, and the same by events), the read flush
    (a 256 MB buffer summed: clean L2 lines) and none."""
    scratch = torch.empty(64 * 2**20, device=dev, dtype=torch.int32)
    scratch.fill_(1)
    sink = torch.empty((), device=dev, dtype=torch.int64)
    methods = {"write-flush": lambda fn: time_us(fn)}
    if event_write_flush:
        methods["write-flush(ev)"] = lambda fn: event_us(fn, scratch.zero_)
    methods["read-flush"] = lambda fn: event_us(fn, lambda: torch.sum(scratch, dim=0, dtype=torch.int64, out=sink))
    methods["no-flush"] = lambda fn: event_us(fn, None)
    return methods


def main():
    dev = "cuda"
    methods = flush_methods(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    for batch, hq, hkv, t in ((32, 32, 8, 4096), (64, 64, 8, 8192)):
        q = torch.randn(batch, hq, 128, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(batch, hkv, t, 128, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(batch, hkv, t, 128, device=dev, dtype=torch.bfloat16, generator=g)
        lens = torch.full((batch,), t, device=dev, dtype=torch.int32)
        o = torch.empty_like(q)
        q4 = q[:, :, None, :]
        impls = {
            "sdpa": lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True),
            "fray.cuda": lambda: fray.decode_attention(q, k, v, lens, kv_layout="HND", out=o, backend="cuda"),
            "plain read": plain_read(k, v),
            "read evict-first": plain_read(k, v, "evict_first"),
        }
        gb = 2 * k.numel() * k.element_size() / 1e3
        name = "B%dHq%dHkv%dT%dD128" % (batch, hq, hkv, t)
        res = {(m, i): [] for m in methods for i in impls}
        for _ in range(3):
            for m, timer in methods.items():
                for i, fn in impls.items():
                    res[(m, i)].append(timer(fn))
        print("\n%s (%.0f MB of K+V): us (TB/s), median of 3 rounds" % (name, gb / 1e3))
        print("%-16s" % "method" + "".join("%22s" % i for i in impls) + "   fray/sdpa")
        for m in methods:
            cells = []
            for i in impls:
                us = median(res[(m, i)])
                cells.append("%12.1f (%5.2f)" % (us, gb / us / 1e3))
            ratio = median(res[(m, "sdpa")]) / median(res[(m, "fray.cuda")])
            print("%-16s" % m + "".join("%22s" % c for c in cells) + "   %.3fx" % ratio, flush=True)


if __name__ == "__main__":
    main()
