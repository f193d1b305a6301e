"""SiLU-and-mul writing 8-bit outputs and their per-token scales, in one pass, in Triton.

Semantics are fray.reference.quant.silu_mul_quant's: y = silu(gate) * up as fray.silu_mul
computes it (fp32 math on the loaded values, fray_triton.activation's SiLU), rounded to the input
dtype (the value the unfused silu_mul would store), then quantized per row as
fray.quantize(granularity="token") does (or by a static scale). fray.ops.quant validates; these
launchers trust their inputs.

A per-token scale needs the whole row before the first store, so a program owns whole rows: up to
MAX_SINGLE_BLOCK outputs a row stay in registers (one read of gate and up, one write of q); wider
rows loop twice (amax, then quantize: the second read is of the row just read, mostly from L2).
"""
import triton
import triton.language as tl

from fray_triton._host import cdiv, next_power_of_2
from fray_triton.activation import SILU, _activate
from fray_triton.norm import MAX_SINGLE_BLOCK, LOOP_BLOCK, ROW_PACK_ELEMS, _num_warps, _round
from fray_triton.quant import finite_abs, quant_rows, row_scales, scale_of, to_q

# A compiled kernel may read a module global only as a tl.constexpr (the interpreter reads any:
# the plain int passed every CPU test and failed every compile on the GPU, 2026-12-07).
_SILU = tl.constexpr(SILU)


@triton.jit
def _tile_kernel(
    G, U, Q, S, stride_g, stride_u, stride_q, stride_s, n_rows, n_cols, qmax,
    STATIC: tl.constexpr, FP8: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    rows64 = rows.to(tl.int64)
    g = tl.load(G + rows64[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows64[:, None] * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dt = G.dtype.element_ty
    y = _round(_activate(g, _SILU, dt) * u, dt).to(tl.float32)
    sc = row_scales(y, S, rows64, row_ok, stride_s, qmax, STATIC)
    tl.store(Q + rows64[:, None] * stride_q + cols[None, :], quant_rows(y, sc, qmax, FP8), mask=mask)


@triton.jit
def _loop_kernel(
    G, U, Q, S, stride_g, stride_u, stride_q, stride_s, n_rows, n_cols, qmax,
    STATIC: tl.constexpr, FP8: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    dt = G.dtype.element_ty
    if STATIC:
        sc = tl.load(S + row * stride_s)
    else:
        a = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            m = c < n_cols
            g = tl.load(G + row * stride_g + c, mask=m, other=0.0).to(tl.float32)
            u = tl.load(U + row * stride_u + c, mask=m, other=0.0).to(tl.float32)
            a = tl.maximum(a, finite_abs(_round(_activate(g, _SILU, dt) * u, dt).to(tl.float32)))
        sc = scale_of(tl.max(a, axis=0), qmax)
        tl.store(S + row * stride_s, sc)
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        m = c < n_cols
        g = tl.load(G + row * stride_g + c, mask=m, other=0.0).to(tl.float32)
        u = tl.load(U + row * stride_u + c, mask=m, other=0.0).to(tl.float32)
        y = _round(_activate(g, _SILU, dt) * u, dt).to(tl.float32)
        tl.store(Q + row * stride_q + c, to_q(tl.math.div_rn(y, sc), qmax, FP8), mask=m)


def silu_mul_quant(gate, up, q, scale, qmax, fp8, static, stride_g, stride_u, stride_q, stride_s, n_rows, n_cols):
    """Launch on the current stream. gate / up / q: row-strided [n_rows, n_cols] (last dim
    contiguous; the fused [rows, 2 d] layout is gate = x, up = x[:, d:] with x's row stride);
    scale: fp32, one per row `stride_s` apart (stride 0: one static scale), written unless static."""
    if n_rows == 0 or n_cols == 0:
        return
    args = (gate, up, q, scale, stride_g, stride_u, stride_q, stride_s, n_rows, n_cols, float(qmax))
    if n_cols <= MAX_SINGLE_BLOCK:
        block = next_power_of_2(n_cols)
        rows = min(max(1, min(64, ROW_PACK_ELEMS // block)), next_power_of_2(n_rows))
        _tile_kernel[(cdiv(n_rows, rows),)](*args, STATIC=static, FP8=fp8, BLOCK_N=block, ROWS=rows,
                                            num_warps=_num_warps(block * rows))
    else:
        _loop_kernel[(n_rows,)](*args, STATIC=static, FP8=fp8, BLOCK_N=LOOP_BLOCK, num_warps=_num_warps(LOOP_BLOCK))
