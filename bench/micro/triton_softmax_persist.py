"""Persistent Triton softmax at 32768-wide rows (bf16, 256 MiB, L2 flushed per call): one whole
row per iteration held in registers, with the next row's load issued before the current row's
reductions (manual prefetch), or left to Triton's pipeliner (tl.range num_stages), next to the
shipped Triton and CUDA backends in one process.
The 9e10afd..fa0d44d (2026-11-30) sweep of L2 eviction hints on the wide two-pass kernel (131072 / 262144) lived here
with a copy of that kernel; the chosen hints are now in triton/fray_triton/softmax.py
(_softmax_loop_kernel) and the sweep's figures in bench/NOTES.md (git history has the copy).
Those runs also timed the two-pass kernel walking rows persistently (grids of 1-4
programs per SM): slower at every grid (bench/NOTES.md), not kept here.
Run on the GPU machine with the bundle's PYTHONPATH:  python3 bench/micro/triton_softmax_persist.py
"""
import torch
import triton
import triton.language as tl

import fray
from fray.bench import time_us
from fray_triton.norm import _round

LOG2E = 1.4426950408889634


@triton.jit
def _row_softmax(x, scale):
    """Softmax of one whole row held as fp32 (the shipped kernels' -inf-row rule: NaN)."""
    m = tl.max(x, axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp2((x - shift) * scale)
    inv = tl.where(m == float("-inf"), float("nan"), 1.0 / tl.sum(e, axis=0))
    return e * inv


@triton.jit
def _prefetch_kernel(X, Y, stride_x, stride_y, n_rows, n_cols, scale, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    x_next = tl.load(X + pid.to(tl.int64) * stride_x + cols, mask=ok & (pid < n_rows), other=float("-inf"))
    for r in range(pid, n_rows, nprog):
        x = x_next.to(tl.float32)
        nr = r + nprog
        x_next = tl.load(X + nr.to(tl.int64) * stride_x + cols, mask=ok & (nr < n_rows), other=float("-inf"))
        tl.store(Y + r.to(tl.int64) * stride_y + cols, _round(_row_softmax(x, scale), Y.dtype.element_ty), mask=ok)


@triton.jit
def _pipelined_kernel(X, Y, stride_x, stride_y, n_rows, n_cols, scale, BLOCK_N: tl.constexpr,
                      STAGES: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    for r in tl.range(pid, n_rows, nprog, num_stages=STAGES):
        x = tl.load(X + r.to(tl.int64) * stride_x + cols, mask=ok, other=float("-inf")).to(tl.float32)
        tl.store(Y + r.to(tl.int64) * stride_y + cols, _round(_row_softmax(x, scale), Y.dtype.element_ty), mask=ok)


def _sweep(widths, variants):
    """For each width (bf16 rows, 256 MiB): the shipped backends, then variants(x, y, rows, width, sms)
    -> [(name, fn)]; every fn is checked against torch.softmax and timed (L2 flushed)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("%-8s %-40s %9s %8s %10s" % ("width", "impl", "us", "TB/s", "max|err|"))
    for width in widths:
        rows = 128 * 1024 * 1024 // width
        x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        ref = torch.softmax(x.float(), -1)
        nbytes = 2 * x.numel() * 2
        impls = [("fray.cuda", lambda: fray.softmax(x, out=y, backend="cuda")),
                 ("fray.triton (shipped)", lambda: fray.softmax(x, out=y, backend="triton"))]
        for name, fn in impls + variants(x, y, rows, width, sms):
            try:
                y.zero_()
                fn()
                err = (y.float() - ref).abs().max().item()
                us = min(time_us(fn) for _ in range(2))
                print("%-8d %-40s %9.1f %8.2f %10.2e" % (width, name, us, nbytes / us / 1e6, err), flush=True)
            except Exception as exc:  # a config that fails to compile or launch
                print("%-8d %-40s failed: %s" % (width, name, str(exc)[:120]), flush=True)
        del x, y, ref
        torch.cuda.empty_cache()


def _row_variants(x, y, rows, width, sms):
    out = []
    for warps in (16, 32):
        for per_sm in (1, 2):
            grid = (min(rows, sms * per_sm),)
            out.append(("prefetch w%d grid %dxSM" % (warps, per_sm),
                        lambda warps=warps, grid=grid: _prefetch_kernel[grid](
                            x, y, width, width, rows, width, LOG2E, BLOCK_N=width, num_warps=warps)))
            for stages in (2, 3):
                out.append(("pipelined s%d w%d grid %dxSM" % (stages, warps, per_sm),
                            lambda warps=warps, grid=grid, stages=stages: _pipelined_kernel[grid](
                                x, y, width, width, rows, width, LOG2E, BLOCK_N=width, STAGES=stages,
                                num_warps=warps)))
    return out


if __name__ == "__main__":
    _sweep((32768, 16384, 65536), _row_variants)
