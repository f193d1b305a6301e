"""RMSNorm, fused add+RMSNorm and LayerNorm in Triton.

Semantics match cuda/norm and fray.reference.norm exactly:
  y = x * rsqrt(mean(x^2) + eps) * (w + weight_offset), fp32 math, one rounding at the end;
  fused add: s = round(x + r) is stored to sum_out, then y = rmsnorm(s);
  layernorm: y = (x - mean) / sqrt(var + eps) * w + b (biased variance; see its section below).

The op is memory-bound (one read of x (and r), one write of y (and s)), so the row stays in
registers between the reduction and the normalisation: a second read would cost as much again.
Rows up to MAX_SINGLE_BLOCK elements take one tile; wider rows loop twice over the row (the second
read mostly hits L2, which holds the few rows in flight). Short rows are packed several to a
program so that each program still moves a few KB: one row of 128 elements per program would
leave most threads idle and make the launch grid needlessly large.
"""
import triton
import triton.language as tl

from fray_triton._host import cdiv, next_power_of_2

# One tile per row up to this width: 16K fp32 accumulators over 16 warps is 32 registers a
# thread, about what still runs without spilling.
MAX_SINGLE_BLOCK = 16384
# Loop tile for wider rows.
LOOP_BLOCK = 4096
# Target elements per program for short rows.
ROW_PACK_ELEMS = 4096


@triton.jit
def _round(v, dtype: tl.constexpr):
    """fp32 -> dtype, round to nearest even. bf16 is rounded with integer ops: a few extra ALU
    ops in a memory-bound kernel, and Triton's CPU interpreter (which CI runs) rounds ties up
    and drops the carry in its own fp32->bf16 conversion."""
    if dtype == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        # NaNs first: the GPU's canonical NaN 0x7FFFFFFF would carry into the sign bit (-0.0).
        bits = tl.where(v == v, bits, 0x7FC00000)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(dtype)


@triton.jit
def tile_normed(X, R, W, S, rows64, cols, col_ok, mask, stride_x, stride_r, stride_s, n_cols, eps, w_offset,
                HAS_RESIDUAL: tl.constexpr):
    """The fp32 RMSNorm of a [rows, cols] tile (before its rounding); fused: x = round(X + R),
    stored to S (S may be R itself: the tile is read before it is written)."""
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + rows64[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        s = _round(x.to(tl.float32) + r.to(tl.float32), S.dtype.element_ty)
        tl.store(S + rows64[:, None] * stride_s + cols[None, :], s, mask=mask)
        xf = s.to(tl.float32)
    else:
        xf = x.to(tl.float32)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) + w_offset
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / n_cols + eps)
    return xf * rstd[:, None] * w[None, :]


def _rmsnorm_tile(
    X, R, W, Y, S,
    stride_x, stride_r, stride_y, stride_s,
    n_rows, n_cols, eps, w_offset,
    HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    y = tile_normed(X, R, W, S, rows64, cols, col_ok, mask, stride_x, stride_r, stride_s, n_cols, eps, w_offset,
                    HAS_RESIDUAL)
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], _round(y, Y.dtype.element_ty), mask=mask)


@triton.jit
def loop_rstd(X, R, S, row, stride_x, stride_r, stride_s, n_cols, eps, HAS_RESIDUAL: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """Pass 1 of a looped row: rsqrt(mean(x^2) + eps), x = round(X + R) stored to S when fused
    (S may be R itself: every chunk is read before it is written)."""
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        m = c < n_cols
        x = tl.load(X + row * stride_x + c, mask=m, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(R + row * stride_r + c, mask=m, other=0.0)
            s = _round(x.to(tl.float32) + r.to(tl.float32), S.dtype.element_ty)
            tl.store(S + row * stride_s + c, s, mask=m)
            xf = s.to(tl.float32)
        else:
            xf = x.to(tl.float32)
        acc += xf * xf
    return 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)


def _rmsnorm_loop(
    X, R, W, Y, S,
    stride_x, stride_r, stride_y, stride_s,
    n_rows, n_cols, eps, w_offset,
    HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rstd = loop_rstd(X, R, S, row, stride_x, stride_r, stride_s, n_cols, eps, HAS_RESIDUAL, BLOCK_N)
    # Pass 2: re-read (the rounded sum from S when fused, since X may be overwritten in place).
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        m = c < n_cols
        if HAS_RESIDUAL:
            xf = tl.load(S + row * stride_s + c, mask=m, other=0.0).to(tl.float32)
        else:
            xf = tl.load(X + row * stride_x + c, mask=m, other=0.0).to(tl.float32)
        w = tl.load(W + c, mask=m, other=0.0).to(tl.float32) + w_offset
        tl.store(Y + row * stride_y + c, _round(xf * rstd * w, Y.dtype.element_ty), mask=m)


# Each kernel twice. Triton picks a memory op's vector width from the alignment it specialised on
# (16-byte pointers, strides that are multiples of 16), and the layout of the whole row follows
# the widest access, the stores to Y / S included; the layout fixes the order of the row's
# sum of squares. So a call whose output alone differs in alignment (add_rmsnorm in place on a
# 6-byte-offset view: Y = X) would round rstd differently from the same call out of place. Calls
# whose every pointer and row stride is aligned take the specialised kernel; any other call takes
# the variant that specialises on no alignment (scalar accesses), so its result depends on the
# values alone, never on which buffer is the output.
_ALIGN_ARGS = ["X", "R", "W", "Y", "S", "stride_x", "stride_r", "stride_y", "stride_s"]
_rmsnorm_tile_kernel = triton.jit(_rmsnorm_tile)
_rmsnorm_tile_kernel_any = triton.jit(_rmsnorm_tile, do_not_specialize_on_alignment=_ALIGN_ARGS)
_rmsnorm_loop_kernel = triton.jit(_rmsnorm_loop)
_rmsnorm_loop_kernel_any = triton.jit(_rmsnorm_loop, do_not_specialize_on_alignment=_ALIGN_ARGS)


def _aligned(tensors, strides):
    return all(t.data_ptr() % 16 == 0 for t in tensors) and all(s % 16 == 0 for s in strides)


def _num_warps(elems):
    # About 16 elements per thread: enough independent loads in flight, few registers.
    return max(4, min(16, next_power_of_2(elems) // 512))


def _launch(x, r, w, y, s, sx, sr, sy, ss, n_rows, n_cols, eps, w_offset):
    has_res = r is not None
    if r is None:
        r, s, sr, ss = x, y, 0, 0
    aligned = _aligned((x, r, w, y, s), (sx, sr, sy, ss))
    if n_cols <= MAX_SINGLE_BLOCK:
        block = next_power_of_2(n_cols)
        rows = max(1, min(64, ROW_PACK_ELEMS // block))
        rows = min(rows, next_power_of_2(n_rows))
        grid = (cdiv(n_rows, rows),)
        (_rmsnorm_tile_kernel if aligned else _rmsnorm_tile_kernel_any)[grid](
            x, r, w, y, s, sx, sr, sy, ss, n_rows, n_cols, eps, w_offset,
            HAS_RESIDUAL=has_res, BLOCK_N=block, ROWS=rows, num_warps=_num_warps(block * rows))
    else:
        (_rmsnorm_loop_kernel if aligned else _rmsnorm_loop_kernel_any)[(n_rows,)](
            x, r, w, y, s, sx, sr, sy, ss, n_rows, n_cols, eps, w_offset,
            HAS_RESIDUAL=has_res, BLOCK_N=LOOP_BLOCK, num_warps=_num_warps(LOOP_BLOCK))


def rmsnorm(x, weight, out, eps, weight_offset, x_row_stride, out_row_stride, n_rows, n_cols):
    """Launch on the current stream. x/out: row-strided [n_rows, n_cols] (last dim contiguous)."""
    _launch(x, None, weight, out, None, x_row_stride, 0, out_row_stride, 0,
            n_rows, n_cols, float(eps), float(weight_offset))


def add_rmsnorm(x, residual, weight, out, sum_out, eps, weight_offset,
                x_row_stride, residual_row_stride, out_row_stride, sum_row_stride, n_rows, n_cols):
    """sum_out = round(x + residual); out = rmsnorm(sum_out). out may be x, sum_out may be residual."""
    _launch(x, residual, weight, out, sum_out, x_row_stride, residual_row_stride, out_row_stride,
            sum_row_stride, n_rows, n_cols, float(eps), float(weight_offset))


# ---------------------------------------------------------------------------------------------
# LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b, biased variance, fp32 math, one rounding.
#
# Same shape of kernel as RMSNorm (the row stays in registers, short rows packed, wide rows
# looped), with the statistics computed so that fp32 stays accurate when the mean is large
# against the spread (100 + N(0, 1)): everything is summed relative to a pivot K = x[row, 0]
# (d = x - K is O(spread), so mean(d) is good to fp32 rounding of the spread, while an fp32
# mean(x) would be off by ulp(100) / 2 in every output), and the variance is the two-step
# mean((d - mean(d))^2) over the register-resident row rather than E[x^2] - E[x]^2.

@triton.jit
def _layernorm_tile_kernel(
    X, W, B, Y, stride_x, stride_y, n_rows, n_cols, eps,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, EVEN: tl.constexpr,
):
    # EVEN: the tile is exactly the rows and columns (n_cols == BLOCK_N, n_rows % ROWS == 0, the
    # usual power-of-two hidden sizes): no masks and no masked-lane zeroing, which matters here
    # because LayerNorm already does about twice RMSNorm's arithmetic per element.
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    rows64 = rows.to(tl.int64)
    x_ptrs = X + rows64[:, None] * stride_x + cols[None, :]
    y_ptrs = Y + rows64[:, None] * stride_y + cols[None, :]
    if EVEN:
        x = tl.load(x_ptrs).to(tl.float32)
        pivot = tl.load(X + rows64 * stride_x).to(tl.float32)
        d = x - pivot[:, None]
        mean = tl.sum(d, axis=1) / n_cols
        c = d - mean[:, None]
        w = tl.load(W + cols).to(tl.float32)
    else:
        row_ok = rows < n_rows
        col_ok = cols < n_cols
        mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
        pivot = tl.load(X + rows64 * stride_x, mask=row_ok, other=0.0).to(tl.float32)
        # Masked lanes must not count: 0 - K is not 0.
        d = tl.where(mask, x - pivot[:, None], 0.0)
        mean = tl.sum(d, axis=1) / n_cols
        c = tl.where(mask, d - mean[:, None], 0.0)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=1) / n_cols + eps)
    y = c * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        if EVEN:
            y += tl.load(B + cols).to(tl.float32)[None, :]
        else:
            y += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    y = _round(y, Y.dtype.element_ty)
    if EVEN:
        tl.store(y_ptrs, y)
    else:
        tl.store(y_ptrs, y, mask=mask)


@triton.jit
def _layernorm_loop_kernel(
    X, W, B, Y, stride_x, stride_y, n_rows, n_cols, eps,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Rows wider than MAX_SINGLE_BLOCK: three passes (sum, centred sum of squares, normalise);
    # the second and third reads mostly hit L2. Y is written only in the last pass, so it may
    # be X itself.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    pivot = tl.load(X + row * stride_x).to(tl.float32)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        m = c < n_cols
        x = tl.load(X + row * stride_x + c, mask=m, other=0.0).to(tl.float32)
        acc += tl.where(m, x - pivot, 0.0)
    mean = tl.sum(acc, axis=0) / n_cols
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        m = c < n_cols
        x = tl.load(X + row * stride_x + c, mask=m, other=0.0).to(tl.float32)
        d = tl.where(m, (x - pivot) - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        m = c < n_cols
        x = tl.load(X + row * stride_x + c, mask=m, other=0.0).to(tl.float32)
        y = ((x - pivot) - mean) * rstd * tl.load(W + c, mask=m, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(B + c, mask=m, other=0.0).to(tl.float32)
        tl.store(Y + row * stride_y + c, _round(y, Y.dtype.element_ty), mask=m)


def layernorm(x, weight, bias, out, eps, x_row_stride, out_row_stride, n_rows, n_cols):
    """Launch on the current stream. x/out: row-strided [n_rows, n_cols] (last dim contiguous);
    bias may be None; out may be x."""
    has_bias = bias is not None
    b = bias if has_bias else weight  # never read when HAS_BIAS is False
    eps = float(eps)
    if n_cols <= MAX_SINGLE_BLOCK:
        block = next_power_of_2(n_cols)
        rows = max(1, min(64, ROW_PACK_ELEMS // block))
        rows = min(rows, next_power_of_2(n_rows))
        grid = (cdiv(n_rows, rows),)
        _layernorm_tile_kernel[grid](
            x, weight, b, out, x_row_stride, out_row_stride, n_rows, n_cols, eps,
            HAS_BIAS=has_bias, BLOCK_N=block, ROWS=rows, EVEN=block == n_cols and n_rows % rows == 0,
            num_warps=_num_warps(block * rows))
    else:
        _layernorm_loop_kernel[(n_rows,)](
            x, weight, b, out, x_row_stride, out_row_stride, n_rows, n_cols, eps,
            HAS_BIAS=has_bias, BLOCK_N=LOOP_BLOCK, num_warps=_num_warps(LOOP_BLOCK))
