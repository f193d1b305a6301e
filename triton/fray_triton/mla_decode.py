"""DeepSeek-style multi-head latent attention (MLA) decode over a paged latent cache, in Triton.

Semantics match fray.reference.attention.mla_decode. Every cached token is one row of D = 576
values (the 512-wide compressed latent followed by 64 rotary dims); it is the key (all 576) and
its first D_V = 512 columns are the value. q [B, s_q, Hq, 576] holds s_q query tokens per sequence
(s_q > 1: speculative decoding); query i sees cache positions j <= lens[b] - s_q + i (the last
query sees all lens[b] tokens). Scores scale * q.k in fp32, softmax in fp32, lse in natural log;
a query that sees nothing gets a zero row and lse = -inf.

Why many heads per program: MLA is multi-query attention with one shared latent KV row, so every
query head of a sequence reads the same [BLOCK_N, 576] tile. A program takes BLOCK_H heads x s_q
queries as the M rows of its tl.dot (up to 64: the fp32 output accumulator [64, 512] is 128 KB,
half the register file with 8 warps, which is what one program per SM can hold), so each K tile
is loaded once and feeds 64 rows of tensor-core work instead of one. The same tile is then the V
operand of P @ V (its first 512 columns): the value is never loaded twice.

Why split-KV: a decode batch has B * ceil(Hq / BLOCK_H) programs, often fewer than the 132 SMs
(Hq = 16, B = 32: 32 programs), each streaming up to tens of MB. Cutting every sequence's
capacity into num_splits ranges multiplies the programs; each writes its partial output
normalised within its range plus the range's log-sum-exp (fp32), and a second kernel merges the
partials of each (sequence, query, head) in split order (deterministic: no atomics). The split
count comes from shapes alone (num_splits_for), never from lens: lens stays on the device, so a
launch is CUDA-graph capturable and replays with new lengths. A split whose range starts at or
past lens[b] exits at once and the combine skips it; with one split the first kernel writes the
final output itself and the combine is not launched.

Paged layout: kv_cache [num_blocks, block_size, 1, 576] (FlashMLA's, block size 64), token t of
sequence b in page block_table[b, t // block_size], slot t % block_size. Tiles never cross a
page (BLOCK_N is at most the block size, 16 or more): one block-table read per tile, and one base
address per tile, so the [BLOCK_N, 576] load needs no per-row address arithmetic (a per-token
page lookup made ptxas spill at 64 rows).
"""
import os

import torch
import triton
import triton.language as tl

from fray_triton._host import cdiv, next_power_of_2
from fray_triton.norm import _round

LOG2E = 1.4426950408889634
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK_N = 64
# A split shorter than this writes (and the combine reads) partials of 2 KB per row for less
# than 4 tiles of cache reads: more bookkeeping than the extra parallelism buys.
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 128
# M rows (heads x queries) per program on the GPU: see config().
MAX_ROWS = 64


@triton.jit
def _dot(a, b, acc, DOT_F32: tl.constexpr):
    # 16-bit caches on the GPU: the tensor cores' native inputs. fp32 caches (and the CPU
    # interpreter, which computes 16-bit tl.dot wrongly): IEEE fp32 products, exact for 16-bit
    # inputs, so the interpreter reproduces the GPU's products.
    if DOT_F32:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _p_operand(p, dtype: tl.constexpr, ROUND_P: tl.constexpr, DOT_F32: tl.constexpr):
    """p as the P @ V operand: rounded to the cache dtype as every flash kernel does (2^-9 of each
    term in bf16, within the tolerance); under the interpreter the same rounding, kept in fp32."""
    if DOT_F32:
        if ROUND_P:
            return _round(p, dtype).to(tl.float32)
        return p
    return p.to(dtype)


@triton.jit
def _mla_split_kernel(
    Q, KV, BT, LENS, OUT, LSE, PO, PL,
    stride_qb, stride_qs, stride_qh,
    stride_kvp, stride_kvt, stride_btb,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_ls, stride_lh,
    n_heads, n_head_blocks, num_splits, capacity, split_size, sm_scale_log2,
    S_Q: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr, D_V: tl.constexpr, D_R: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, SINGLE: tl.constexpr, DOT_F32: tl.constexpr,
    ROUND_P: tl.constexpr, TRANS: tl.constexpr,
):
    # Head blocks of one sequence are adjacent program ids: they run together and share the
    # sequence's K tiles in L2.
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // n_head_blocks
    hb = pid % n_head_blocks
    b64 = b.to(tl.int64)
    # Clamped so that a bad length can only read inside the cache (FRAY_CHECK_INDICES=1 reports it).
    seqlen = tl.minimum(tl.maximum(tl.load(LENS + b), 0), capacity)
    # One split too (split_size >= capacity: the range is [0, seqlen)); a separate SINGLE range
    # starting at a constant 0 made ptxas spill at 64 rows.
    start = split * split_size
    end = tl.minimum(start + split_size, seqlen)
    # SINGLE always runs (it writes the zero rows of an empty sequence itself); a split past
    # lens[b] writes nothing and the combine never reads it.
    if SINGLE or start < end:
        # Row r of the tile is (query r // BLOCK_H, head hb * BLOCK_H + r % BLOCK_H); ROWS is
        # S_Q * BLOCK_H rounded up to a power of two (the padding rows are never stored).
        r = tl.arange(0, ROWS)
        qi = r // BLOCK_H
        h = hb * BLOCK_H + r % BLOCK_H
        row_ok = (qi < S_Q) & (h < n_heads)
        # Query qi sees positions j < lim: the last query all seqlen tokens, each earlier one
        # token fewer (causal among the s_q new tokens, which are the sequence's last ones).
        lim = tl.maximum(seqlen - S_Q + 1 + qi, 0)
        dv = tl.arange(0, D_V)
        dr = tl.arange(0, D_R)
        offs_n = tl.arange(0, BLOCK_N)
        q_row = Q + b64 * stride_qb + qi.to(tl.int64) * stride_qs + h.to(tl.int64) * stride_qh
        q_v = tl.load(q_row[:, None] + dv[None, :], mask=row_ok[:, None], other=0.0)
        q_r = tl.load(q_row[:, None] + D_V + dr[None, :], mask=row_ok[:, None], other=0.0)
        if DOT_F32:
            q_v = q_v.to(tl.float32)
            q_r = q_r.to(tl.float32)
        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        if TRANS:
            acc = tl.zeros([D_V, ROWS], tl.float32)
        else:
            acc = tl.zeros([ROWS, D_V], tl.float32)
        bt_row = BT + b64 * stride_btb
        for t0 in range(start, end, BLOCK_N):
            t = t0 + offs_n
            t_ok = t < end
            # BLOCK_N <= PAGE_SIZE (both powers of two) and split_size, t0 are multiples of
            # BLOCK_N: the tile lies in one page, whose entry is below lens[b] (t0 < end)
            page = tl.load(bt_row + t0 // PAGE_SIZE).to(tl.int64)
            rows = page * stride_kvp + (t0 % PAGE_SIZE + offs_n) * stride_kvt
            kv = tl.load(KV + rows[:, None] + dv[None, :], mask=t_ok[:, None], other=0.0)
            kr = tl.load(KV + rows[:, None] + D_V + dr[None, :], mask=t_ok[:, None], other=0.0)
            if DOT_F32:
                kv = kv.to(tl.float32)
                kr = kr.to(tl.float32)
            if TRANS:
                # scores as [tokens, rows]: the 64-token tile is the M side of the MMA (wgmma
                # needs M = 64 per warpgroup; the rows may be only 16)
                s = _dot(kv, tl.trans(q_v), None, DOT_F32)
                s = _dot(kr, tl.trans(q_r), s, DOT_F32)
                ok = t[:, None] < lim[None, :]
                s = tl.where(ok, s * sm_scale_log2, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 0))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_use)
                p = tl.exp2(s - m_use[None, :])
                l_i = l_i * alpha + tl.sum(p, 0)
                acc = _dot(tl.trans(kv), _p_operand(p, KV.dtype.element_ty, ROUND_P, DOT_F32), acc * alpha[None, :],
                           DOT_F32)
            else:
                s = _dot(q_v, tl.trans(kv), None, DOT_F32)
                s = _dot(q_r, tl.trans(kr), s, DOT_F32)
                # lim <= seqlen, and a tile never reaches past its split (whole-tile splits)
                ok = t[None, :] < lim[:, None]
                s = tl.where(ok, s * sm_scale_log2, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                # A row that has seen no token yet (an early query at a split's start) keeps
                # m = -inf: subtract 0 instead, so exp2(-inf - -inf) never makes a NaN.
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_use)
                p = tl.exp2(s - m_use[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = _dot(_p_operand(p, KV.dtype.element_ty, ROUND_P, DOT_F32), kv, acc * alpha[:, None], DOT_F32)
            m_i = m_new
        if TRANS:
            acc = tl.trans(acc)
        has = l_i > 0
        o = acc / tl.where(has, l_i, 1.0)[:, None]  # no visible token: acc = 0, a zero row
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        if SINGLE:
            o_row = OUT + b64 * stride_ob + qi.to(tl.int64) * stride_os + h.to(tl.int64) * stride_oh
            tl.store(o_row[:, None] + dv[None, :], _round(o, OUT.dtype.element_ty), mask=row_ok[:, None])
            tl.store(LSE + b64 * stride_lb + qi * stride_ls + h * stride_lh, lse, mask=row_ok)
        else:
            # partials [B, S_Q, Hq, num_splits, (D_V)] in fp32
            part = ((b64 * S_Q + qi) * n_heads + h) * num_splits + split
            tl.store(PO + part[:, None] * D_V + dv[None, :], o, mask=row_ok[:, None])
            tl.store(PL + part, lse, mask=row_ok)


@triton.jit
def _mla_combine_kernel(
    PO, PL, LENS, OUT, LSE,
    stride_ob, stride_os, stride_oh, stride_lb, stride_ls, stride_lh,
    n_heads, num_splits, capacity, split_size,
    S_Q: tl.constexpr, D_V: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    # One program per (sequence, query, head). Only the splits that started below lens[b] wrote
    # partials; they are summed in split order with weights exp(lse_s - max lse), so the result
    # does not depend on which split finished first. A split that ran but in which this query
    # saw nothing wrote lse = -inf and a zero row: weight 0.
    pid = tl.program_id(0)
    h = pid % n_heads
    qi = (pid // n_heads) % S_Q
    b = pid // (n_heads * S_Q)
    seqlen = tl.minimum(tl.maximum(tl.load(LENS + b), 0), capacity)
    n_active = (seqlen + split_size - 1) // split_size
    base = pid.to(tl.int64) * num_splits
    s = tl.arange(0, SPLITS_PAD)
    lses = tl.load(PL + base + s, mask=s < n_active, other=float("-inf"))
    m = tl.max(lses, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # nothing seen at all: every weight is exp(-inf) = 0
    total = tl.sum(tl.exp(lses - m), 0)
    dv = tl.arange(0, D_V)
    acc = tl.zeros([D_V], tl.float32)
    for i in range(0, n_active):
        w = tl.exp(tl.load(PL + base + i) - m)
        acc += w * tl.load(PO + (base + i) * D_V + dv)
    has = total > 0
    out = tl.where(has, acc / tl.where(has, total, 1.0), 0.0)
    b64 = b.to(tl.int64)
    tl.store(OUT + b64 * stride_ob + qi * stride_os + h * stride_oh + dv, _round(out, OUT.dtype.element_ty))
    tl.store(LSE + b64 * stride_lb + qi * stride_ls + h * stride_lh,
             tl.where(has, m + tl.log(tl.where(has, total, 1.0)), float("-inf")))


def config(n_heads, s_q, dtype):
    """(BLOCK_H, ROWS, BLOCK_N, num_warps, num_stages, TRANS) on the GPU, each checked for sm_90a
    without register spills (tests/attention/test_mla_decode.py).

    16-bit caches: up to MAX_ROWS = 64 rows (heads x queries) per program; K tiles of 64 tokens x
    576 (72 KB), two stages. 64 rows: 8 warps, two warpgroups each holding half of the [64, 512]
    fp32 accumulator (128 registers a thread); Q, 72 KB, stays in shared memory beside the two K
    stages (216 KB of the 227 KB). Fewer rows (Hq = 16): TRANS, scores as [tokens, rows] and the
    accumulator as [512, rows], so the 64 tokens (and the 512 value dims) are the M side of the
    MMA: wgmma needs M = 64 per warpgroup, and the untransposed [16, 576] Q operand of mma.sync
    sits in every warp's registers and spills. fp32 caches (IEEE products on the CUDA cores: for
    completeness, not speed): 16 rows, 32-token tiles (72 KB), one stage, 8 warps."""
    if dtype == torch.float32:
        block_h = min(next_power_of_2(n_heads), max(1, 16 // next_power_of_2(s_q)))
        return block_h, max(16, next_power_of_2(s_q * block_h)), 32, 8, 1, False
    block_h = min(next_power_of_2(n_heads), max(1, MAX_ROWS // next_power_of_2(s_q)))
    # tl.dot needs at least 16 rows: few heads x few queries are padded up
    rows = max(16, next_power_of_2(s_q * block_h))
    return block_h, rows, BLOCK_N, 4 if rows == 16 else 8, 2, rows < MAX_ROWS


def num_splits_for(batch, head_blocks, rows, capacity, num_sms, block_n=BLOCK_N, token_bytes=576 * 2,
                   partial_bytes=512 * 4):
    """Host-side split count from shapes alone (never lens: it stays on the device), for
    sequences as long as the capacity.

    A model of the time in units of one cache tile's read (block_n * token_bytes), with one
    program per SM at a time (two stages of [64, 576] K tiles fill most of shared memory):
    a grid of P programs runs ceil(P / num_sms) waves, each as long as one program's tiles, its
    Q rows' read and, with more than one split, its partial write (rows x partial_bytes); the
    combine reads every partial once more, spread over all SMs. The cheapest count wins, the
    smaller on a tie (within 2 %). Whole waves decide small batches (B = 32, Hq = 16: 4 splits
    fill 128 of 132 SMs); the partials' cost keeps splits long (at 64 rows a partial costs ~1.8
    tiles, the Q rows one more).
    Split sizes are whole tiles of at least MIN_SPLIT_TOKENS, at most MAX_SPLITS of them."""
    if capacity <= 0:
        return 1
    programs = max(1, batch * head_blocks)
    tiles = cdiv(capacity, block_n)
    tile_bytes = block_n * token_bytes
    part = rows * partial_bytes / tile_bytes
    q_tiles = rows * token_bytes / tile_bytes
    best, best_cost = 1, None
    for s in range(1, max(1, min(MAX_SPLITS, tiles, capacity // MIN_SPLIT_TOKENS)) + 1):
        per_split = cdiv(tiles, s)
        if cdiv(tiles, per_split) != s:  # not a count that whole-tile splits produce
            continue
        cost = cdiv(programs * s, num_sms) * (per_split + q_tiles)
        if s > 1:
            cost += cdiv(programs * s, num_sms) * part + programs * s * part / num_sms
        if best_cost is None or cost < 0.98 * best_cost:
            best, best_cost = s, cost
    return best


def plan(batch, s_q, n_heads, dtype, capacity, page_size, num_splits, num_sms, head_dim=576, head_dim_v=512,
         cfg=None):
    """(cfg, num_splits, split_size) of one launch: config() (or cfg) with BLOCK_N cut to the
    block size (16..128: a tile never crosses a page), and num_splits (None: num_splits_for; at
    most MAX_SPLITS) rounded so that every split is a whole number of tiles (which may leave
    fewer splits than asked). The ops layer calls this once per call signature."""
    cfg = list(cfg or config(n_heads, s_q, dtype))
    cfg[2] = min(cfg[2], page_size)
    cfg = tuple(cfg)
    block_h, rows, block_n = cfg[:3]
    if num_splits is None:
        num_splits = num_splits_for(batch, cdiv(n_heads, block_h), rows, capacity, num_sms, block_n,
                                    head_dim * dtype.itemsize, head_dim_v * 4)
    # at most MAX_SPLITS: the combine holds every split's lse in one tile
    split_size = cdiv(cdiv(max(capacity, 1), min(num_splits, MAX_SPLITS)), block_n) * block_n
    return cfg, cdiv(max(capacity, 1), split_size), split_size


def decode(q, kv, block_table, lens, out, lse, scale, *, q_strides, kv_strides, bt_stride, out_strides,
           lse_strides, capacity, page_size, launch=None, num_splits=None, num_sms=132, cfg=None):
    """Launch split (+ combine) on the current stream; returns the split count used.

    q [B, s_q, Hq, D_V + D_R] with q_strides (b, s, h); kv the paged cache with kv_strides
    (page, slot); out [B, s_q, Hq, D_V] with out_strides (b, s, h); lse [B, s_q, Hq] fp32 with
    lse_strides (b, s, h); last dims contiguous; capacity = max_blocks * page_size >= 1.
    launch: plan()'s result; without it plan(num_splits, num_sms, cfg) is computed here (tests
    shrink cfg, (BLOCK_H, ROWS, BLOCK_N, num_warps, num_stages, TRANS), to exercise several
    tiles, head blocks and both MMA orientations).
    """
    batch, s_q, n_heads = q.shape[0], q.shape[1], q.shape[2]
    d_v = out.shape[-1]
    if launch is None:
        launch = plan(batch, s_q, n_heads, kv.dtype, capacity, page_size, num_splits, num_sms, q.shape[-1], d_v, cfg)
    (block_h, rows, block_n, warps, stages, trans), num_splits, split_size = launch
    head_blocks = cdiv(n_heads, block_h)
    single = num_splits == 1
    if single:
        po = pl = lse  # not read
    else:
        po = q.new_empty((batch, s_q, n_heads, num_splits, d_v), dtype=torch.float32)
        pl = q.new_empty((batch, s_q, n_heads, num_splits), dtype=torch.float32)
    dot_f32 = kv.dtype == torch.float32 or _INTERPRET
    _mla_split_kernel[(batch * head_blocks, num_splits)](
        q, kv, block_table, lens, out, lse, po, pl,
        q_strides[0], q_strides[1], q_strides[2], kv_strides[0], kv_strides[1], bt_stride,
        out_strides[0], out_strides[1], out_strides[2], lse_strides[0], lse_strides[1], lse_strides[2],
        n_heads, head_blocks, num_splits, capacity, split_size, float(scale) * LOG2E,
        S_Q=s_q, BLOCK_H=block_h, ROWS=rows, D_V=d_v, D_R=q.shape[-1] - d_v, BLOCK_N=block_n,
        PAGE_SIZE=page_size, SINGLE=single, DOT_F32=dot_f32, ROUND_P=dot_f32 and kv.dtype != torch.float32,
        TRANS=trans, num_warps=warps, num_stages=stages)
    if not single:
        _mla_combine_kernel[(batch * s_q * n_heads,)](
            po, pl, lens, out, lse, out_strides[0], out_strides[1], out_strides[2],
            lse_strides[0], lse_strides[1], lse_strides[2], n_heads, num_splits, capacity, split_size,
            S_Q=s_q, D_V=d_v, SPLITS_PAD=max(2, next_power_of_2(num_splits)), num_warps=4)
    return num_splits
