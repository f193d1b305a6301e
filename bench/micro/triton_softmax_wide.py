"""Wide-row Triton softmax variants (bf16, 256 MiB per tensor, L2 flushed per call) next to the
shipped Triton and CUDA backends, in one process: the shipped two-pass kernel
(fray_triton.softmax._softmax_loop_kernel, per-lane online first pass) swept over its tile and
num_warps, and a whole-row single tile held as loaded 16-bit values. The runs at
937cbf6..c152ab8 (2026-11-30) also swept num_stages 3 on the per-lane kernel (slower at most
widths) and a per-tile-reduction loop (the kernel before): bench/NOTES.md has the figures.
Run on the GPU machine with the bundle's PYTHONPATH:  python3 bench/micro/triton_softmax_wide.py
"""
import itertools

import torch
import triton
import triton.language as tl

import fray
from fray.bench import time_us
from fray_triton.norm import _round
from fray_triton.softmax import _softmax_loop_kernel

LOG2E = 1.4426950408889634


@triton.jit
def _tile_packed_kernel(X, Y, stride_x, stride_y, n_cols, scale, BLOCK_N: tl.constexpr):
    # The whole row in registers as loaded (16-bit, two per register): the max, then the sum of
    # exp2, then the output recomputes exp2 from x with the log2 of the sum folded into the
    # exponent (a different expression, so the fp32 exponentials need not stay live).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=ok, other=float("-inf"))
    m = tl.max(x.to(tl.float32), axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.exp2((x.to(tl.float32) - shift) * scale), axis=0)
    bias = tl.where(m == float("-inf"), float("nan"), -shift * scale - tl.log2(s))
    y = tl.exp2(x.to(tl.float32) * scale + bias)
    tl.store(Y + row * stride_y + cols, _round(y, Y.dtype.element_ty), mask=ok)


def main():
    dev = "cuda"
    total = 128 * 1024 * 1024  # elements: 256 MiB of bf16
    print("%-8s %-34s %9s %8s %10s" % ("width", "impl", "us", "TB/s", "max|err|"))
    for width in (32768, 131072, 262144):
        rows = total // width
        x = torch.randn(rows, width, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        ref = torch.softmax(x.float(), -1)
        nbytes = 2 * x.numel() * 2

        def report(name, fn):
            fn()
            err = (y.float() - ref).abs().max().item()
            us = min(time_us(fn) for _ in range(2))
            print("%-8d %-34s %9.1f %8.2f %10.2e" % (width, name, us, nbytes / us / 1e6, err), flush=True)

        report("fray.cuda", lambda: fray.softmax(x, out=y, backend="cuda"))
        report("fray.triton (shipped)", lambda: fray.softmax(x, out=y, backend="triton"))
        if width <= 32768:
            for warps in (8, 16, 32):
                def fn(warps=warps):
                    _tile_packed_kernel[(rows,)](x, y, width, width, width, LOG2E, BLOCK_N=width, num_warps=warps)
                try:
                    report("tile-packed w%d" % warps, fn)
                except Exception as exc:
                    print("%-8d tile-packed w%d failed: %s" % (width, warps, str(exc)[:100]))
        for block, warps in itertools.product((4096, 8192, 16384), (8, 16, 32)):
            if block // (32 * warps) < 8:
                continue

            def fn(block=block, warps=warps):
                _softmax_loop_kernel[(rows,)](x, y, y, y, width, width, width, LOG2E, 1.0, STATS=False,
                                              BLOCK_N=block, num_warps=warps)
            try:
                report("two-pass B%d w%d" % (block, warps), fn)
            except Exception as exc:  # a config that fails to compile or launch
                print("%-8d two-pass B%d w%d failed: %s" % (width, block, warps, str(exc)[:100]))
        del x, y, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
