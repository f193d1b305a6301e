"""Persistent Triton softmax at 32768-wide rows (bf16, 256 MiB, L2 flushed per call): one whole
row per iteration held in registers, with the next row's load issued before the current row's
reductions (manual prefetch), or left to Triton's pipeliner (tl.range num_stages), next to the
shipped Triton and CUDA backends in one process.
With the argument `wide`: the 131072 / 262144 wide two-pass kernel with L2 eviction hints
(evict_last on the first pass's loads, evict_first on the second pass's loads and stores: the one
now shipped) and walking rows persistently (grids of 1-4 programs per SM: slower).
Run on the GPU machine with the bundle's PYTHONPATH:  python3 bench/micro/triton_softmax_persist.py [wide]
"""
import torch
import triton
import triton.language as tl

import fray
from fray.bench import time_us
from fray_triton.norm import _round

LOG2E = 1.4426950408889634


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
        m = tl.max(x, axis=0)
        shift = tl.where(m == float("-inf"), 0.0, m)
        e = tl.exp2((x - shift) * scale)
        s = tl.sum(e, axis=0)
        inv = tl.where(m == float("-inf"), float("nan"), 1.0 / s)
        tl.store(Y + r.to(tl.int64) * stride_y + cols, _round(e * inv, Y.dtype.element_ty), mask=ok)


@triton.jit
def _pipelined_kernel(X, Y, stride_x, stride_y, n_rows, n_cols, scale, BLOCK_N: tl.constexpr,
                      STAGES: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    for r in tl.range(pid, n_rows, nprog, num_stages=STAGES):
        x = tl.load(X + r.to(tl.int64) * stride_x + cols, mask=ok, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        shift = tl.where(m == float("-inf"), 0.0, m)
        e = tl.exp2((x - shift) * scale)
        s = tl.sum(e, axis=0)
        inv = tl.where(m == float("-inf"), float("nan"), 1.0 / s)
        tl.store(Y + r.to(tl.int64) * stride_y + cols, _round(e * inv, Y.dtype.element_ty), mask=ok)


@triton.jit
def _loop_persist_kernel(X, Y, stride_x, stride_y, n_rows, n_cols, scale, BLOCK_N: tl.constexpr):
    # The shipped two-pass kernel (per-lane online pass, then the row backwards) walking rows
    # persistently: with few programs resident, the rows in flight fit the L2, so the second pass
    # re-reads from L2 instead of HBM.
    cols = tl.arange(0, BLOCK_N)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for i in range(0, tl.cdiv(n_rows - pid, nprog)):
        row = pid.to(tl.int64) + i * nprog
        x_row = X + row * stride_x
        y_row = Y + row * stride_y
        m_l = tl.full([BLOCK_N], float("-inf"), tl.float32)
        s_l = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in tl.range(0, n_cols, BLOCK_N, num_stages=1):
            c = start + cols
            x = tl.load(x_row + c, mask=c < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m_l, x)
            sh = tl.where(m_new == float("-inf"), 0.0, m_new)
            s_l = s_l * tl.exp2((m_l - sh) * scale) + tl.exp2((x - sh) * scale)
            m_l = m_new
        m = tl.max(m_l, axis=0)
        shift = tl.where(m == float("-inf"), 0.0, m)
        total = tl.sum(s_l * tl.exp2((m_l - shift) * scale), axis=0)
        inv = tl.where(m == float("-inf"), float("nan"), 1.0 / total)
        n_tiles = tl.cdiv(n_cols, BLOCK_N)
        for j in tl.range(0, n_tiles, num_stages=1):
            c = (n_tiles - 1 - j) * BLOCK_N + cols
            ok = c < n_cols
            x = tl.load(x_row + c, mask=ok, other=float("-inf")).to(tl.float32)
            y = tl.exp2((x - shift) * scale) * inv
            tl.store(y_row + c, _round(y, Y.dtype.element_ty), mask=ok)


@triton.jit
def _loop_evict_kernel(X, Y, stride_x, n_cols, scale, BLOCK_N: tl.constexpr, EV1: tl.constexpr,
                       EV2: tl.constexpr, EVS: tl.constexpr):
    # The shipped two-pass kernel with L2 eviction hints: the first pass's loads kept (evict_last)
    # so the second pass re-reads them from L2; the second pass's loads and the stores streamed.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    x_row = X + row * stride_x
    y_row = Y + row * stride_x
    m_l = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s_l = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=1):
        c = start + cols
        x = tl.load(x_row + c, mask=c < n_cols, other=float("-inf"), eviction_policy=EV1).to(tl.float32)
        m_new = tl.maximum(m_l, x)
        sh = tl.where(m_new == float("-inf"), 0.0, m_new)
        s_l = s_l * tl.exp2((m_l - sh) * scale) + tl.exp2((x - sh) * scale)
        m_l = m_new
    m = tl.max(m_l, axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(s_l * tl.exp2((m_l - shift) * scale), axis=0)
    inv = tl.where(m == float("-inf"), float("nan"), 1.0 / total)
    n_tiles = tl.cdiv(n_cols, BLOCK_N)
    for i in tl.range(0, n_tiles, num_stages=1):
        c = (n_tiles - 1 - i) * BLOCK_N + cols
        ok = c < n_cols
        x = tl.load(x_row + c, mask=ok, other=float("-inf"), eviction_policy=EV2).to(tl.float32)
        y = tl.exp2((x - shift) * scale) * inv
        tl.store(y_row + c, _round(y, Y.dtype.element_ty), mask=ok, eviction_policy=EVS)


def main_wide():
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    total = 128 * 1024 * 1024
    for width in (131072, 262144):
        rows = total // width
        x = torch.randn(rows, width, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        ref = torch.softmax(x.float(), -1)
        nbytes = 2 * x.numel() * 2

        def report(name, fn):
            y.zero_()
            fn()
            err = (y.float() - ref).abs().max().item()
            us = min(time_us(fn) for _ in range(2))
            print("%-8d %-40s %9.1f %8.2f %10.2e" % (width, name, us, nbytes / us / 1e6, err), flush=True)

        report("fray.cuda", lambda: fray.softmax(x, out=y, backend="cuda"))
        report("fray.triton (shipped)", lambda: fray.softmax(x, out=y, backend="triton"))
        for ev1, ev2, evs in (("", "", ""), ("evict_last", "evict_first", "evict_first"),
                              ("evict_last", "", ""), ("", "evict_first", "evict_first"),
                              ("evict_last", "evict_first", ""), ("", "", "evict_first")):
            for block, warps in ((8192, 32), (4096, 16)):
                def fn(block=block, warps=warps, ev1=ev1, ev2=ev2, evs=evs):
                    _loop_evict_kernel[(rows,)](x, y, width, width, LOG2E, BLOCK_N=block, EV1=ev1, EV2=ev2, EVS=evs,
                                                num_warps=warps)
                report("evict %s/%s/%s B%d w%d" % (ev1 or "-", ev2 or "-", evs or "-", block, warps), fn)
        for block, warps in ((8192, 16),):
            for per_sm in (2, 4):
                grid = (min(rows, sms * per_sm),)

                def fn(block=block, warps=warps, grid=grid):
                    _loop_persist_kernel[grid](x, y, width, width, rows, width, LOG2E, BLOCK_N=block, num_warps=warps)
                try:
                    report("loop-persist B%d w%d grid %dxSM" % (block, warps, per_sm), fn)
                except Exception as exc:
                    print("%-8d loop-persist B%d w%d x%d failed: %s" % (width, block, warps, per_sm, str(exc)[:120]))
        del x, y, ref
        torch.cuda.empty_cache()


def main():
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    total = 128 * 1024 * 1024
    print("%-8s %-40s %9s %8s %10s" % ("width", "impl", "us", "TB/s", "max|err|"))
    for width in (32768, 16384, 65536):
        rows = total // width
        x = torch.randn(rows, width, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        ref = torch.softmax(x.float(), -1)
        nbytes = 2 * x.numel() * 2

        def report(name, fn):
            y.zero_()
            fn()
            err = (y.float() - ref).abs().max().item()
            us = min(time_us(fn) for _ in range(2))
            print("%-8d %-40s %9.1f %8.2f %10.2e" % (width, name, us, nbytes / us / 1e6, err), flush=True)

        report("fray.cuda", lambda: fray.softmax(x, out=y, backend="cuda"))
        report("fray.triton (shipped)", lambda: fray.softmax(x, out=y, backend="triton"))
        for warps in (16, 32):
            for per_sm in (1, 2):
                grid = (min(rows, sms * per_sm),)

                def fn(warps=warps, grid=grid):
                    _prefetch_kernel[grid](x, y, width, width, rows, width, LOG2E, BLOCK_N=width, num_warps=warps)
                try:
                    report("prefetch w%d grid %dxSM" % (warps, per_sm), fn)
                except Exception as exc:
                    print("%-8d prefetch w%d x%d failed: %s" % (width, warps, per_sm, str(exc)[:120]))
                for stages in (2, 3):
                    def fn2(warps=warps, grid=grid, stages=stages):
                        _pipelined_kernel[grid](x, y, width, width, rows, width, LOG2E, BLOCK_N=width,
                                                STAGES=stages, num_warps=warps)
                    try:
                        report("pipelined s%d w%d grid %dxSM" % (stages, warps, per_sm), fn2)
                    except Exception as exc:
                        print("%-8d pipelined s%d w%d x%d failed: %s" % (width, stages, warps, per_sm, str(exc)[:120]))
        del x, y, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    import sys
    main_wide() if "wide" in sys.argv[1:] else main()
