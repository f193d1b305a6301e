"""Quantize x [M, K] to int8 / float8_e4m3fn with per-group fp32 scales, and dequantize, in Triton.

Semantics are fray.reference.quant's; fray.ops.quant validates, these launchers trust their inputs.

token and block (1, 128), dynamic scales, K <= ROW_MAX: whole rows stay in registers (short rows
packed several to a program), so x is read once: the amax per row (token) or per 128 columns
(block: the tile reshaped [rows, K / 128, 128]), the scales, then q. Wider rows, and block
(128, 128): one program per group (BM rows of one column group; the group of a (128, 128) block
is the whole tile) reads its values twice, once for the amax and once to quantize. The second
read hits L2 only while the groups in flight fit it: a per-token group of 16 rows of 8192 bf16 is
256 KB, and a wave of them is more than the H200's L2, which is why short-enough rows take the
register path (bench/NOTES.md, quantize).
tensor / channel (dynamic scales): the amax spans programs, so two launches: an amax kernel with
an integer atomic max on the fp32 bits (non-negative floats order as their bit patterns do, and
an integer max does not depend on the order of the atomics), then the generic quantize kernel,
which turns the amax into the scale itself; nothing is read back on the host.
Static scales and dequantize: the generic kernel over [TM, TK] tiles, each element's scale at
(row // gm) * ss0 + (col // gk) * ss1.

x / scale is div_rn (IEEE, correctly rounded, as the reference's fp32 division; Triton's plain
fp32 '/' may be approximate). Rounding to int8: after the clamp to +-127, adding and subtracting
1.5 * 2**23 rounds an fp32 to the nearest integer, ties to even (no libdevice call, which the CPU
interpreter lacks). e4m3: the conversion rounds to nearest even; the clamp to +-448 before it
makes the saturation explicit.
"""
import triton
import triton.language as tl

from fray_triton._host import cdiv, next_power_of_2

TM, TK = 32, 128        # the generic kernels' tile (4K elements: a few registers per thread)
ROUND_MAGIC = 12582912.0  # 1.5 * 2**23


@triton.jit
def to_q(y, qmax, FP8: tl.constexpr):
    nan = y != y
    y = tl.minimum(tl.maximum(y, -qmax), qmax)
    # One return after a compile-time branch: Triton refuses a function whose returns differ in
    # type (int8 / fp8), even when a constexpr decides between them.
    if FP8:
        q = tl.where(nan, float("nan"), y).to(tl.float8e4nv)
    else:
        r = (y + 12582912.0) - 12582912.0
        q = tl.where(nan, 0.0, r).to(tl.int8)
    return q


@triton.jit
def finite_abs(x):
    a = tl.abs(x)
    return tl.where(a < float("inf"), a, 0.0)  # NaN compares false: left out as well


@triton.jit
def scale_of(a, qmax):
    s = tl.math.div_rn(a, qmax)
    return tl.where(s == 0.0, 1.0, s)


@triton.jit
def _quant_groups_kernel(
    X, Q, S, M, K, stride_x, stride_q, stride_s, stride_sg, group_k, qmax,
    FP8: tl.constexpr, SHARED: tl.constexpr, BM: tl.constexpr, CK: tl.constexpr,
):
    pr = tl.program_id(0)
    pc = tl.program_id(1)
    rows = pr.to(tl.int64) * BM + tl.arange(0, BM)
    rmask = rows < M
    k0 = pc * group_k
    k1 = tl.minimum(k0 + group_k, K)
    a = tl.zeros([BM], dtype=tl.float32)
    for c in range(k0, k1, CK):
        cols = c + tl.arange(0, CK)
        msk = rmask[:, None] & (cols[None, :] < k1)
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=msk, other=0.0).to(tl.float32)
        a = tl.maximum(a, tl.max(finite_abs(x), axis=1))
    if SHARED:
        s_one = scale_of(tl.max(a, axis=0), qmax)
        tl.store(S + pr * stride_s + pc * stride_sg, s_one)
        s = tl.zeros([BM], dtype=tl.float32) + s_one
    else:
        s = scale_of(a, qmax)
        tl.store(S + rows * stride_s + pc * stride_sg, s, mask=rmask)
    for c in range(k0, k1, CK):
        cols = c + tl.arange(0, CK)
        msk = rmask[:, None] & (cols[None, :] < k1)
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=msk, other=0.0).to(tl.float32)
        q = to_q(tl.math.div_rn(x, s[:, None]), qmax, FP8)
        tl.store(Q + rows[:, None] * stride_q + cols[None, :], q, mask=msk)


# Rows up to this many elements take the register-resident kernel (fray_triton.norm's limit: 16K
# fp32 values over 16 warps, 32 registers a thread).
ROW_MAX = 16384
ROW_PACK = 4096  # elements a program holds at least, short rows stacked


@triton.jit
def _quant_rows_kernel(
    X, Q, S, M, K, stride_x, stride_q, stride_s, stride_sg, qmax,
    FP8: tl.constexpr, GROUP: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
):
    """Dynamic per-row (GROUP = 0) or per-(1, GROUP) scales of whole rows held in registers."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    msk = row_ok[:, None] & (cols[None, :] < K)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=msk, other=0.0).to(tl.float32)
    if GROUP == 0:
        sc = scale_of(tl.max(finite_abs(x), axis=1), qmax)
        tl.store(S + rows * stride_s, sc, mask=row_ok)
        q = to_q(tl.math.div_rn(x, sc[:, None]), qmax, FP8)
    else:
        NG: tl.constexpr = BLOCK_K // GROUP
        xg = tl.reshape(x, (ROWS, NG, GROUP))
        sc = scale_of(tl.max(finite_abs(xg), axis=2), qmax)  # [ROWS, NG]
        g = tl.arange(0, NG)
        tl.store(S + rows[:, None] * stride_s + g[None, :] * stride_sg, sc, mask=row_ok[:, None] & (g[None, :] * GROUP < K))
        q = tl.reshape(to_q(tl.math.div_rn(xg, sc[:, :, None]), qmax, FP8), (ROWS, BLOCK_K))
    tl.store(Q + rows[:, None] * stride_q + cols[None, :], q, mask=msk)


def _rows_config(k, group):
    """(BLOCK_K, ROWS, num_warps) of the register-resident kernel."""
    block = max(next_power_of_2(k), group, 16)
    rows = max(1, ROW_PACK // block)
    return block, rows, max(4, min(16, block * rows // 512))


@triton.jit
def _amax_kernel(X, A, M, K, stride_x, CHANNEL: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    msk = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=msk, other=0.0).to(tl.float32)
    a = tl.max(finite_abs(x), axis=0)
    if CHANNEL:
        tl.atomic_max(A + cols, a.to(tl.int32, bitcast=True), mask=cols < K)
    else:
        tl.atomic_max(A, tl.max(a, axis=0).to(tl.int32, bitcast=True))


@triton.jit
def _quant_scaled_kernel(
    X, Q, S, A, M, K, stride_x, stride_q, gm, gk, ss0, ss1, qmax,
    FP8: tl.constexpr, FROM_AMAX: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    msk = (rows[:, None] < M) & (cols[None, :] < K)
    sidx = (rows[:, None] // gm) * ss0 + (cols[None, :] // gk) * ss1
    if FROM_AMAX:
        a = tl.load(A + sidx, mask=msk, other=0).to(tl.float32, bitcast=True)
        s = scale_of(a, qmax)
        first = (rows[:, None] % gm == 0) & (cols[None, :] % gk == 0)
        tl.store(S + sidx, s, mask=msk & first)  # one writer per group
    else:
        s = tl.load(S + sidx, mask=msk, other=1.0)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=msk, other=0.0).to(tl.float32)
    q = to_q(tl.math.div_rn(x, s), qmax, FP8)
    tl.store(Q + rows[:, None] * stride_q + cols[None, :], q, mask=msk)


@triton.jit
def _dequant_kernel(Q, S, X, M, K, stride_q, stride_x, gm, gk, ss0, ss1, BM: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    msk = (rows[:, None] < M) & (cols[None, :] < K)
    sidx = (rows[:, None] // gm) * ss0 + (cols[None, :] // gk) * ss1
    s = tl.load(S + sidx, mask=msk, other=1.0)
    q = tl.load(Q + rows[:, None] * stride_q + cols[None, :], mask=msk, other=0.0).to(tl.float32)
    tl.store(X + rows[:, None] * stride_x + cols[None, :], (q * s).to(X.dtype.element_ty), mask=msk)


def _index(granularity, m, k, block, scale):
    """(gm, gk, ss0, ss1): the group extents and the scale's strides of the generic kernels."""
    if granularity == "tensor":
        return max(m, 1), max(k, 1), 0, 0
    if granularity == "token":
        return 1, max(k, 1), scale.stride(0), 0
    if granularity == "channel":
        return max(m, 1), 1, 0, scale.stride(-1)
    return block[0], block[1], scale.stride(0), scale.stride(1)


def quantize(x, q, scale, granularity, block, qmax, fp8, static, amax=None):
    """q, scale: outputs (scale the input when static); amax: int32 zeros of scale's size for
    dynamic tensor / channel scales."""
    m, k = x.shape
    if m == 0 or k == 0:
        return
    rowwise = granularity == "token" or (granularity == "block" and block[0] == 1)
    if not static and rowwise and k <= ROW_MAX:
        group = 0 if granularity == "token" else block[1]
        bk, rows, warps = _rows_config(k, group)
        rows = min(rows, next_power_of_2(m))
        _quant_rows_kernel[(cdiv(m, rows),)](x, q, scale, m, k, x.stride(0), q.stride(0), scale.stride(0),
                                             scale.stride(1), qmax,
                                             FP8=fp8, GROUP=group, BLOCK_K=bk, ROWS=rows, num_warps=warps)
        return
    if not static and granularity in ("token", "block"):
        shared = granularity == "block" and block[0] > 1
        group_k = k if granularity == "token" else block[1]
        bm = block[0] if shared else 16
        ck = 64 if shared else min(1024, max(16, triton.next_power_of_2(group_k)))
        grid = (cdiv(m, bm), cdiv(k, group_k))
        _quant_groups_kernel[grid](x, q, scale, m, k, x.stride(0), q.stride(0), scale.stride(0), scale.stride(1),
                                   group_k, qmax,
                                   FP8=fp8, SHARED=shared, BM=bm, CK=ck, num_warps=8 if shared else 4)
        return
    grid = (cdiv(m, TM), cdiv(k, TK))
    if not static:
        _amax_kernel[grid](x, amax, m, k, x.stride(0), CHANNEL=granularity == "channel", BM=TM, BK=TK)
    gm, gk, ss0, ss1 = _index(granularity, m, k, block, scale)
    _quant_scaled_kernel[grid](x, q, scale, amax if amax is not None else scale, m, k, x.stride(0), q.stride(0),
                               gm, gk, ss0, ss1, qmax, FP8=fp8, FROM_AMAX=not static, BM=TM, BK=TK)


def dequantize(q, scale, out, granularity, block):
    m, k = q.shape
    if m == 0 or k == 0:
        return
    gm, gk, ss0, ss1 = _index(granularity, m, k, block, scale)
    _dequant_kernel[(cdiv(m, TM), cdiv(k, TK))](q, scale, out, m, k, q.stride(0), out.stride(0), gm, gk, ss0, ss1,
                                                BM=TM, BK=TK)


# ---------------------------------------------------------------------------------------------
# Per-row quantization of values already in registers: the tail the fused producers
# (fray_triton.rmsnorm_quant, fray_triton.silu_mul_quant) share. y: fp32 [R, N], its masked lanes
# 0 (they never raise an amax).

@triton.jit
def row_scales(y, S, rows64, row_ok, stride_s, qmax, STATIC: tl.constexpr):
    """Each row's scale: static (loaded from S) or dynamic (amax / qmax over the row's finite
    values, stored to S)."""
    if STATIC:
        s = tl.load(S + rows64 * stride_s, mask=row_ok, other=1.0)
    else:
        s = scale_of(tl.max(finite_abs(y), axis=1), qmax)
        tl.store(S + rows64 * stride_s, s, mask=row_ok)
    return s


@triton.jit
def quant_rows(y, s, qmax, FP8: tl.constexpr):
    """y [R, N] / s [R], rounded and saturated to int8 or e4m3."""
    return to_q(tl.math.div_rn(y, s[:, None]), qmax, FP8)

