"""RMSNorm (optionally after a residual add) writing 8-bit outputs and their per-token scales, in
one pass, in Triton.

Semantics are fray.reference.quant.rmsnorm_quant's: y = rmsnorm(s) as fray.rmsnorm computes it
(fp32 math), rounded to x's dtype (the value the unfused rmsnorm would store), then quantized per
row as fray.quantize(granularity="token") does (or by a static scale); with a residual, s =
round(x + residual) is written back into residual (vLLM's fused_add_rms_norm data flow) and s is
what gets normalised. fray.ops.quant validates; these launchers trust their inputs.

Rows up to fray_triton.norm.MAX_SINGLE_BLOCK elements stay in registers between the sum of
squares, the amax and the quantization: one read of x (and residual), one write of q (and the
sum). Wider rows loop three times over the row (sum of squares, amax, quantize); the re-reads are
of the row just read, mostly from L2.
"""
import triton
import triton.language as tl

from fray_triton._host import cdiv, next_power_of_2
from fray_triton.norm import MAX_SINGLE_BLOCK, LOOP_BLOCK, ROW_PACK_ELEMS, _num_warps, _round, loop_rstd, tile_normed
from fray_triton.quant import finite_abs, quant_rows, row_scales, scale_of, to_q


@triton.jit
def _tile_kernel(
    X, R, W, Q, S,
    stride_x, stride_r, stride_q, stride_s,
    n_rows, n_cols, eps, w_offset, qmax,
    HAS_RESIDUAL: tl.constexpr, STATIC: tl.constexpr, FP8: tl.constexpr, BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    y = tile_normed(X, R, W, R, rows64, cols, col_ok, mask, stride_x, stride_r, stride_r, n_cols, eps, w_offset,
                    HAS_RESIDUAL)
    y = _round(y, X.dtype.element_ty).to(tl.float32)
    sc = row_scales(y, S, rows64, row_ok, stride_s, qmax, STATIC)
    tl.store(Q + rows64[:, None] * stride_q + cols[None, :], quant_rows(y, sc, qmax, FP8), mask=mask)


@triton.jit
def _loop_kernel(
    X, R, W, Q, S,
    stride_x, stride_r, stride_q, stride_s,
    n_rows, n_cols, eps, w_offset, qmax,
    HAS_RESIDUAL: tl.constexpr, STATIC: tl.constexpr, FP8: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    # Pass 1: sum of squares (and the rounded sum, written back into R: passes 2 and 3 read it there).
    rstd = loop_rstd(X, R, R, row, stride_x, stride_r, stride_r, n_cols, eps, HAS_RESIDUAL, BLOCK_N)
    if HAS_RESIDUAL:
        src = R + row * stride_r
    else:
        src = X + row * stride_x
    # Pass 2: the row's amax (dynamic scales).
    if STATIC:
        sc = tl.load(S + row * stride_s)
    else:
        a = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            m = c < n_cols
            xf = tl.load(src + c, mask=m, other=0.0).to(tl.float32)
            w = tl.load(W + c, mask=m, other=0.0).to(tl.float32) + w_offset
            y = _round(xf * rstd * w, X.dtype.element_ty).to(tl.float32)
            a = tl.maximum(a, finite_abs(y))
        sc = scale_of(tl.max(a, axis=0), qmax)
        tl.store(S + row * stride_s, sc)
    # Pass 3: quantize.
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        m = c < n_cols
        xf = tl.load(src + c, mask=m, other=0.0).to(tl.float32)
        w = tl.load(W + c, mask=m, other=0.0).to(tl.float32) + w_offset
        y = _round(xf * rstd * w, X.dtype.element_ty).to(tl.float32)
        tl.store(Q + row * stride_q + c, to_q(tl.math.div_rn(y, sc), qmax, FP8), mask=m)


def rmsnorm_quant(x, residual, weight, q, scale, eps, weight_offset, qmax, fp8, static,
                  stride_x, stride_r, stride_q, stride_s, n_rows, n_cols):
    """Launch on the current stream. x / residual / q: row-strided [n_rows, n_cols] (last dim
    contiguous); residual (or None) is updated in place to round(x + residual); scale: fp32, one
    per row `stride_s` apart (stride 0: one static scale for every row), written unless static."""
    if n_rows == 0:
        return
    has_res = residual is not None
    r = residual if has_res else x
    args = (x, r, weight, q, scale, stride_x, stride_r if has_res else 0, stride_q, stride_s, n_rows, n_cols,
            float(eps), float(weight_offset), float(qmax))
    if n_cols <= MAX_SINGLE_BLOCK:
        block = next_power_of_2(n_cols)
        rows = min(max(1, min(64, ROW_PACK_ELEMS // block)), next_power_of_2(n_rows))
        _tile_kernel[(cdiv(n_rows, rows),)](*args, HAS_RESIDUAL=has_res, STATIC=static, FP8=fp8, BLOCK_N=block,
                                            ROWS=rows, num_warps=_num_warps(block * rows))
    else:
        _loop_kernel[(n_rows,)](*args, HAS_RESIDUAL=has_res, STATIC=static, FP8=fp8, BLOCK_N=LOOP_BLOCK,
                                num_warps=_num_warps(LOOP_BLOCK))
