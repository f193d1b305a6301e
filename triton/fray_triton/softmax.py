"""Row softmax (with temperature) and online softmax (plus the row max and log-sum-exp) in Triton.

Semantics match cuda/softmax and fray.reference.softmax: y = softmax(x / T) over each row, fp32
math, one rounding at the end; statistics are the max and the natural-log log-sum-exp of x / T in
fp32. An all -inf row gives y = NaN (like torch.softmax) and max = lse = -inf.

exp(z / T) is computed as exp2((x - max) * log2(e) / T): one hardware ex2 per element, and the
subtraction happens before the scaling so that large inputs do not lose their low bits.

The op is memory-bound (one read of x, one write of y), so a row that fits in one program's
registers is held there as one tile between the reduction and the store: a second read would cost
as much again. Short rows are packed several to a program so that each program still moves a few
KB. Rows wider than MAX_SINGLE_BLOCK take two passes: an online (max, sum) pass kept per lane
(each lane its own running max and sum, merged once after the loop: no cross-warp reduction, so
no block barrier, inside the loop), and a normalising pass that walks the row backwards, so that
the tiles it reads first are the ones the first pass loaded last (the likeliest to still be in
L2), with L2 eviction hints that keep it there. 16-bit rows of 8193..32768 take a persistent
kernel instead: one whole row per iteration in registers, the next rows' loads pipelined through
shared memory. Measured on the H200 (bf16, 256 MiB, bench/micro/triton_softmax_persist.py):
32768 / 131072 / 262144 wide 162 / 191 / 202 us (CUDA: 144 / 170 / 176 us). Triton has no way for programs to exchange partial
results through distributed shared memory, so the CUDA backend's single-read cluster path for very
wide rows has no counterpart here.
"""
import triton
import triton.language as tl

from fray_triton._host import cdiv, next_power_of_2

from fray_triton.norm import _round

LOG2E = 1.4426950408889634
# One tile per row up to this width (above it, the two-pass kernel measured faster: 187 vs 198 us
# at 32768).
MAX_SINGLE_BLOCK = 16384
# Tiles of the two-pass kernel (measured best): 4096 elements over 16 warps up to 65536 wide,
# 8192 over 32 warps beyond (8 elements a thread).
LOOP_BLOCK = 4096
LOOP_WARPS = 16
WIDE_LOOP_BLOCK = 8192
WIDE_LOOP_WARPS = 32
WIDE_LOOP_FROM = 65537
# Target elements per program for short rows.
ROW_PACK_ELEMS = 4096
# 16-bit rows of PERSIST_FROM..PERSIST_MAX elements: the persistent kernel (one whole row per
# iteration, the next rows' loads pipelined through shared memory: num_stages 3 keeps two rows in
# flight, 2 x 64 KB at 32768), with PERSIST_WARPS warps and PERSIST_PER_SM programs per SM (2 up
# to 16384 wide, 1 above). Measured (bench/micro/triton_softmax_persist.py, bf16, 256 MiB):
# 32768 wide 162.4 us against 187.5 for the two-pass kernel (CUDA 144.3), 16384 wide 149.6 against
# 154.0 for one tile per program (CUDA 136.4). fp32 rows of 32768 would need 256 KB of buffers.
PERSIST_FROM = 8193
PERSIST_MAX = 32768
PERSIST_STAGES = 3
PERSIST_WARPS = 16


@triton.jit
def _nan_if(has_nan, m):
    """row_max of a row holding a NaN is NaN (as torch.max and the reference): tl.max and
    tl.maximum skip NaNs, so the kernels carry whether the row had one."""
    return tl.where(has_nan, float("nan"), m)


@triton.jit
def _softmax_tile_kernel(
    X, Y, MAX, LSE,
    stride_x, stride_y, n_rows, n_cols, scale, inv_t,
    STATS: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    rows64 = rows.to(tl.int64)

    # Padding reads as -inf: it takes part in the max and adds exp2(-inf) = 0 to the sum.
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=float("-inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=1)
    # Shift by 0 instead of -inf for all -inf rows: the sum is then 0 (lse = -inf), not NaN.
    shift = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp2((x - shift[:, None]) * scale)
    s = tl.sum(e, axis=1)
    inv = tl.where(m == float("-inf"), float("nan"), 1.0 / s)
    y = e * inv[:, None]
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], _round(y, Y.dtype.element_ty), mask=mask)
    if STATS:
        mt = m * inv_t
        tl.store(MAX + rows64, _nan_if(tl.max((x != x).to(tl.int32), axis=1) > 0, mt), mask=row_ok)
        tl.store(LSE + rows64, mt + tl.log(s), mask=row_ok)


@triton.jit
def _softmax_loop_kernel(
    X, Y, MAX, LSE,
    stride_x, stride_y, n_cols, scale, inv_t,
    STATS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    x_row = X + row * stride_x
    y_row = Y + row * stride_y

    # Pass 1: online (max, sum) per lane: m and s are [BLOCK_N] running maxima and sums of
    # exp2((x - shift(m)) * scale), merged across lanes once, after the loop (two exp2 per element,
    # no cross-warp reduction inside the loop).
    m_l = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s_l = tl.zeros([BLOCK_N], dtype=tl.float32)
    nan_l = tl.zeros([BLOCK_N], dtype=tl.int32)  # lanes that saw a NaN (row_max is then NaN)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=1):
        c = start + cols
        x = tl.load(x_row + c, mask=c < n_cols, other=float("-inf"), eviction_policy="evict_last").to(tl.float32)
        if STATS:
            nan_l = nan_l | (x != x).to(tl.int32)
        m_new = tl.maximum(m_l, x)
        sh = tl.where(m_new == float("-inf"), 0.0, m_new)
        s_l = s_l * tl.exp2((m_l - sh) * scale) + tl.exp2((x - sh) * scale)
        m_l = m_new
    m = tl.max(m_l, axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(s_l * tl.exp2((m_l - shift) * scale), axis=0)  # lanes at -inf add 0
    inv = tl.where(m == float("-inf"), float("nan"), 1.0 / total)

    # Pass 2, last tile first (see the module docstring). Pass 1 loads with evict_last and pass 2
    # loads and stores with evict_first, so the row stays in L2 for the re-read and nothing else
    # displaces it (131072 / 262144 wide: 201.4 / 209.8 -> 191.2 / 201.7 us).
    n_tiles = tl.cdiv(n_cols, BLOCK_N)
    for i in tl.range(0, n_tiles, num_stages=1):
        c = (n_tiles - 1 - i) * BLOCK_N + cols
        ok = c < n_cols
        x = tl.load(x_row + c, mask=ok, other=float("-inf"), eviction_policy="evict_first").to(tl.float32)
        y = tl.exp2((x - shift) * scale) * inv
        tl.store(y_row + c, _round(y, Y.dtype.element_ty), mask=ok, eviction_policy="evict_first")
    if STATS:
        mt = m * inv_t
        tl.store(MAX + row, _nan_if(tl.max(nan_l, axis=0) > 0, mt))
        tl.store(LSE + row, mt + tl.log(total))


@triton.jit
def _softmax_persist_kernel(
    X, Y, MAX, LSE,
    stride_x, stride_y, n_rows, n_cols, scale, inv_t,
    STATS: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    # Program p takes rows p, p + P, p + 2P, ...; Triton's pipeliner issues the loads of the next
    # rows while this one is reduced and stored (one row in flight per extra stage).
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for i in tl.range(0, tl.cdiv(n_rows - pid, nprog), num_stages=STAGES):
        r64 = pid.to(tl.int64) + i * nprog
        x = tl.load(X + r64 * stride_x + cols, mask=ok, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        shift = tl.where(m == float("-inf"), 0.0, m)
        e = tl.exp2((x - shift) * scale)
        s = tl.sum(e, axis=0)
        inv = tl.where(m == float("-inf"), float("nan"), 1.0 / s)
        tl.store(Y + r64 * stride_y + cols, _round(e * inv, Y.dtype.element_ty), mask=ok)
        if STATS:
            mt = m * inv_t
            tl.store(MAX + r64, _nan_if(tl.max((x != x).to(tl.int32), axis=0) > 0, mt))
            tl.store(LSE + r64, mt + tl.log(s))


def _num_warps(elems):
    # About 16 elements a thread (32 for the widest single tiles): enough independent loads in
    # flight and few registers.
    return max(4, min(32, next_power_of_2(elems) // 512))


def softmax(x, out, temperature, x_row_stride, out_row_stride, n_rows, n_cols, row_max=None, row_lse=None,
            num_sms=None):
    """Launch on the current stream. x/out: row-strided [n_rows, n_cols] views (last dim
    contiguous; out may be x). row_max/row_lse: contiguous fp32 [n_rows] or both None. num_sms:
    the device's SM count, which sizes the persistent kernel's grid (None: not used)."""
    scale = LOG2E / float(temperature)
    inv_t = 1.0 / float(temperature)
    stats = row_max is not None
    if not stats:
        row_max = row_lse = out  # never written (STATS=False)
    if num_sms is not None and PERSIST_FROM <= n_cols <= PERSIST_MAX and x.element_size() == 2:
        block = next_power_of_2(n_cols)
        per_sm = 2 if block <= 16384 else 1
        _softmax_persist_kernel[(min(n_rows, per_sm * num_sms),)](
            x, out, row_max, row_lse, x_row_stride, out_row_stride, n_rows, n_cols, scale, inv_t,
            STATS=stats, BLOCK_N=block, STAGES=PERSIST_STAGES, num_warps=PERSIST_WARPS)
    elif n_cols <= MAX_SINGLE_BLOCK:
        block = next_power_of_2(n_cols)
        rows = max(1, min(64, ROW_PACK_ELEMS // block))
        rows = min(rows, next_power_of_2(n_rows))
        grid = (cdiv(n_rows, rows),)
        _softmax_tile_kernel[grid](
            x, out, row_max, row_lse, x_row_stride, out_row_stride, n_rows, n_cols, scale, inv_t,
            STATS=stats, BLOCK_N=block, ROWS=rows, num_warps=_num_warps(block * rows))
    else:
        wide = n_cols >= WIDE_LOOP_FROM
        _softmax_loop_kernel[(n_rows,)](
            x, out, row_max, row_lse, x_row_stride, out_row_stride, n_cols, scale, inv_t,
            STATS=stats, BLOCK_N=WIDE_LOOP_BLOCK if wide else LOOP_BLOCK,
            num_warps=WIDE_LOOP_WARPS if wide else LOOP_WARPS)
