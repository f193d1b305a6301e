"""Gated activations out = act(gate) * up in Triton: SiLU, GELU (erf) and GELU (tanh).

Semantics match cuda/activation and fray.reference.activation: fp32 math on the loaded values, one
rounding to the output dtype. gate / up / out are row-strided [n_rows, n_cols] with a contiguous
last dim; the engines' fused layout x = [rows, 2 d] is passed as gate = x, up = x[:, d:] with x's
row stride for both, so no half is ever copied.

The op is a pure stream (read 2 elements, write 1), so the only goals are wide coalesced accesses
and enough bytes in flight. Each program takes a tile of about TILE_ELEMS outputs: one slice of a
long row, or several short rows stacked (a 128-element row alone would leave most of a warp idle).
Triton vectorises the loads to 16 bytes whenever the pointers, n_cols and the strides are
multiples of 16 (it specialises on that), and falls back to masked scalar accesses otherwise.

The tanh GELU is evaluated as g / (1 + exp(-2 z)), the same function as 0.5 g (1 + tanh(z)) without
the cancellation in 1 + tanh(z) for negative z, and with one exp instead of a tanh. tl.exp2 is
ex2.approx and the division is div.full: a relative error of about |g| * 1e-7, inside every
dtype's tolerance, fp32's rtol of 1e-5 included. The exact GELU uses erff for fp32 outputs and a
cheaper closed-form Phi for 16-bit ones (see _activate).
"""
import triton
import triton.language as tl

from fray_triton import _flat
from fray_triton._flat import flat_range
from fray_triton._host import cdiv, next_power_of_2

from fray_triton.norm import _round

# Activation codes, shared with cuda/activation/activation.h (enum Activation). act_mul takes the
# first three, unary all six.
SILU, GELU_ERF, GELU_TANH, RELU, TANH, SIGMOID = 0, 1, 2, 3, 4, 5

# Outputs per program: 16 per thread at 8 warps, i.e. two 16-byte loads of gate and two of up
# per thread for 16-bit types (four for fp32): a few KB in flight per program, and programs
# short enough that the last wave leaves little of the GPU idle.
TILE_ELEMS = 4096
# Longest row slice per program (rows longer than this are split across programs).
MAX_BLOCK_C = 4096
# Most rows stacked in one tile (tiny rows: d = 1, 3, ...).
MAX_BLOCK_R = 256


@triton.jit
def _activate(g, ACT: tl.constexpr, OUT_DTYPE: tl.constexpr):
    if ACT == 0:  # silu: g / (1 + e^-g), e^x = 2^(x log2 e)
        return g / (1.0 + tl.exp2(g * -1.4426950408889634))
    elif ACT == 3:  # relu; where, not maximum, so that NaN stays NaN (torch.relu)
        return tl.where(g < 0.0, 0.0, g)
    elif ACT == 4:
        # tanh without libdevice: (1 - e) / (1 + e), e = e^(-2|g|), with the sign put back; below
        # |g| = 1/16 the cancellation in 1 - e would cost up to 8 of fp32's 24 bits, so the odd
        # Taylor series to g^7 takes over (its truncation error there is < 1e-11 relative).
        a = tl.abs(g)
        e = tl.exp2(a * -2.8853900817779268)
        big = (1.0 - e) / (1.0 + e)
        g2 = g * g
        small = a * (1.0 + g2 * (-0.3333333333333333 + g2 * (0.13333333333333333 + g2 * -0.05396825396825397)))
        t = tl.where(a < 0.0625, small, big)
        return tl.where(g < 0.0, -t, t)
    elif ACT == 5:  # sigmoid: 1 / (1 + e^-g)
        return 1.0 / (1.0 + tl.exp2(g * -1.4426950408889634))
    elif ACT == 2:  # gelu tanh: g / (1 + e^(-2z)), -2z log2(e) = g (c0 + c1 g^2)
        return g / (1.0 + tl.exp2(g * (-2.302208198144325 - 0.1029432395800235 * g * g)))
    elif OUT_DTYPE == tl.float32:  # gelu erf, fp32 outputs: libdevice erff
        return 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
    else:
        # gelu erf for 16-bit outputs: g * Phi(g), Phi from Abramowitz & Stegun 7.1.26 (|error| <=
        # 3e-7 in fp32; see cuda/activation/act_mul.cuh): one exp2 and one division, about half
        # of erff's instructions, which would otherwise approach the memory time.
        s = 1.0 / (1.0 + 0.2316418882663604 * tl.abs(g))
        poly = 0.5307027145 * s - 0.7265760135
        poly = poly * s + 0.7107068705
        poly = poly * s - 0.142248368
        poly = poly * s + 0.127414796
        q = poly * s * tl.exp2(g * g * -0.7213475204444817)  # 0.5 erfc(|g| / sqrt(2))
        return g * tl.where(g >= 0.0, 1.0 - q, q)


# n_rows / n_cblocks only size the grid: not specialising on them (Triton would otherwise compile
# separate kernels for 1, multiples of 16 and other row counts).
@triton.jit(do_not_specialize=["n_rows", "n_cblocks"])
def _act_mul_kernel(
    G, U, O,
    stride_g, stride_u, stride_o,
    n_rows, n_cols, n_cblocks,
    ACT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    rb = pid // n_cblocks
    cb = pid % n_cblocks
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    g = tl.load(G + rows64 * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows64 * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = _activate(g, ACT, O.dtype.element_ty) * u
    tl.store(O + rows64 * stride_o + cols[None, :], _round(y, O.dtype.element_ty), mask=mask)


def _config(n_cols):
    block_c = min(next_power_of_2(n_cols), MAX_BLOCK_C)
    block_r = max(1, min(MAX_BLOCK_R, TILE_ELEMS // block_c))
    # 512 outputs per warp (16 per thread): see TILE_ELEMS.
    num_warps = max(1, min(8, block_r * block_c // 512))
    return block_r, block_c, num_warps


def act_mul(gate, up, out, act, gate_row_stride, up_row_stride, out_row_stride, n_rows, n_cols):
    """out = act(gate) * up on the current stream. act: SILU, GELU_ERF or GELU_TANH.

    gate / up / out: tensors whose data pointers start the first row (views are fine), rows
    `*_row_stride` elements apart, n_cols contiguous elements each. out may be gate or up itself."""
    if n_rows == 0 or n_cols == 0:
        return
    block_r, block_c, num_warps = _config(n_cols)
    n_cblocks = cdiv(n_cols, block_c)
    grid = (cdiv(n_rows, block_r) * n_cblocks,)
    _act_mul_kernel[grid](
        gate, up, out, gate_row_stride, up_row_stride, out_row_stride, n_rows, n_cols, n_cblocks,
        ACT=act, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=num_warps)


def silu_mul(gate, up, out, gate_row_stride, up_row_stride, out_row_stride, n_rows, n_cols):
    act_mul(gate, up, out, SILU, gate_row_stride, up_row_stride, out_row_stride, n_rows, n_cols)


def gelu_mul(gate, up, out, approximate, gate_row_stride, up_row_stride, out_row_stride, n_rows, n_cols):
    """approximate: "none" (erf) or "tanh"."""
    act = GELU_TANH if approximate == "tanh" else GELU_ERF
    act_mul(gate, up, out, act, gate_row_stride, up_row_stride, out_row_stride, n_rows, n_cols)


# The unary activations over flat, dense arrays, in fray_triton._flat's streaming shape.
@triton.jit
def _unary_kernel(X, OUT, n, ACT: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    offs, mask = flat_range(n, BLOCK, WIDE)
    g = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    y = _activate(g, ACT, OUT.dtype.element_ty)
    tl.store(OUT + offs, _round(y, OUT.dtype.element_ty), mask=mask)


def unary(x, out, act, n):
    """Launch on the current stream: out = act(x) over the n elements of the flat storage of two
    dense tensors of one layout and dtype (out may be x)."""
    _flat.launch(_unary_kernel, n, x, out, n, ACT=act)
