"""Single-token (decode) attention with split-KV (flash decoding), and KV-cache appends, in Triton.

Semantics match fray.reference.attention: out[b, h] = softmax(scale * q k^T) v over the first
lens[b] positions of sequence b, fp32 softmax math, lse in natural log, lens[b] = 0 gives a zero
row and lse = -inf.

Why split-KV: a decode step has only B * Hkv independent (sequence, kv head) pairs, often fewer
than the 132 SMs, while each pair may stream megabytes of K/V. Cutting the sequence into
`num_splits` chunks gives B * Hkv * num_splits programs; each writes a partial output normalised
within its chunk plus the chunk's log-sum-exp, and a small second kernel merges the partials in a
fixed order (deterministic: no atomics). The split count is a host decision from the capacity T,
never from lens (reading lens would need a host sync and would break CUDA-graph replay with new
lengths); a split that starts at or past lens[b] does nothing, and the combine ignores it.

Why one program per (b, kv head, split) holding the whole GQA group: the Hq / Hkv query heads that
share a kv head are the rows of one [GROUP_PAD, D] tile, so K and V are read from memory once per
kv head, not once per query head. GROUP_PAD is at least 16 because tl.dot needs 16 rows.

One kernel serves every cache layout: contiguous caches in HND [B, Hkv, T, D] or NHD
[B, T, Hkv, D] differ only in strides, and paged NHD caches [num_blocks, block_size, Hkv, D] add one
block-table lookup per token (any block size; BLOCK_N tokens may span several pages).
"""
import os

import torch
import triton
import triton.language as tl

from fray_triton._host import cdiv, next_power_of_2

from fray_triton.norm import _round

LOG2E = 1.4426950408889634
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# Tokens per inner step: a [BLOCK_N, D] tile of K and of V, 64 x 128 x 2 B = 16 KB each in bf16,
# enough bytes in flight per program without spilling the [GROUP_PAD, D] fp32 accumulator.
BLOCK_N = 64
# A split shorter than this spends more on its partial write + combine than it saves.
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 64


@triton.jit
def _decode_split_kernel(
    Q, K, V, LENS, BT, PO, PL,
    stride_qb, stride_qh,
    stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt,
    stride_btb,
    n_kv_heads, num_splits, capacity, split_size, sm_scale_log2,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, IEEE: tl.constexpr,
    ROUND_P: tl.constexpr,
):
    # Contiguous: K[b, kvh, t] = K + b * stride_kb + kvh * stride_kh + t * stride_kt.
    # Paged: stride_kb is the page stride and stride_kt the token-in-page stride; token t of
    # sequence b lives in page BT[b, t // PAGE_SIZE].
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // n_kv_heads
    kvh = pid % n_kv_heads
    # Clamped so that a bad length can only read inside the cache (FRAY_CHECK_INDICES=1 reports it).
    seqlen = tl.minimum(tl.maximum(tl.load(LENS + b), 0), capacity)
    start = split * split_size
    if start < seqlen:
        end = tl.minimum(start + split_size, seqlen)
        b64 = b.to(tl.int64)
        rows = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, HEAD_DIM)
        offs_n = tl.arange(0, BLOCK_N)
        heads = kvh * GROUP + rows
        row_ok = rows < GROUP
        # Padding rows load zeros: their scores are 0, finite, and they are never stored.
        q = tl.load(Q + b64 * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                    mask=row_ok[:, None], other=0.0)
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        for t0 in range(start, end, BLOCK_N):
            t = t0 + offs_n
            t_ok = t < end
            if PAGED:
                page = tl.load(BT + b64 * stride_btb + t // PAGE_SIZE, mask=t_ok, other=0).to(tl.int64)
                slot = t % PAGE_SIZE
                k_off = page * stride_kb + slot * stride_kt + kvh * stride_kh
                v_off = page * stride_vb + slot * stride_vt + kvh * stride_vh
            else:
                t64 = t.to(tl.int64)
                k_off = b64 * stride_kb + kvh * stride_kh + t64 * stride_kt
                v_off = b64 * stride_vb + kvh * stride_vh + t64 * stride_vt
            k = tl.load(K + k_off[:, None] + dims[None, :], mask=t_ok[:, None], other=0.0)
            v = tl.load(V + v_off[:, None] + dims[None, :], mask=t_ok[:, None], other=0.0)
            # fp32 caches: IEEE products (TF32 would cost ~1e-3 relative). 16-bit caches: the
            # tensor cores' native inputs; p is rounded to the cache dtype for P @ V as every
            # flash kernel does (an error of 2^-9 (bf16) of the terms, within the tolerance).
            # Triton's CPU interpreter computes bf16 tl.dot wrongly, so there (IEEE with a bf16
            # cache) the same products run in fp32 with p rounded to bf16 exactly as on the GPU.
            if IEEE:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(t_ok[None, :], s * sm_scale_log2, float("-inf"))
            # Every tile has at least one valid token (t0 < end), so m_new is finite.
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                if ROUND_P:  # interpreter stand-in for a bf16 cache: the same rounding of p
                    p_v = _round(p, V.dtype.element_ty).to(tl.float32)
                else:
                    p_v = p
                acc = acc * alpha[:, None] + tl.dot(p_v, v.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        # The partial: this split's output normalised over its own tokens, and its natural lse.
        part = (b64 * n_kv_heads * GROUP + heads) * num_splits + split
        tl.store(PO + part[:, None] * HEAD_DIM + dims[None, :], acc / l_i[:, None], mask=row_ok[:, None])
        tl.store(PL + part, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=row_ok)



@triton.jit
def _combine_kernel(
    PO, PL, LENS, OUT, LSE,
    stride_ob, stride_oh, stride_lb,
    n_heads, num_splits, capacity, split_size,
    HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    # One program per (b, query head): only the splits that started below lens[b] wrote a
    # partial; they are merged with weights exp(lse_s - max lse) in a fixed tree order, so the
    # result does not depend on which split finished first.
    pid = tl.program_id(0)
    b = pid // n_heads
    h = pid % n_heads
    seqlen = tl.minimum(tl.maximum(tl.load(LENS + b), 0), capacity)
    n_active = (seqlen + split_size - 1) // split_size
    s = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    s_ok = s < n_active
    part = pid.to(tl.int64) * num_splits + s
    lse = tl.load(PL + part, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # no active split: every weight is exp(-inf) = 0
    w = tl.exp(lse - m)
    total = tl.sum(w, 0)
    o = tl.load(PO + part[:, None] * HEAD_DIM + dims[None, :], mask=s_ok[:, None], other=0.0)
    acc = tl.sum(w[:, None] * o, 0)
    has = total > 0
    out = tl.where(has, acc / tl.where(has, total, 1.0), 0.0)
    b64 = b.to(tl.int64)
    tl.store(OUT + b64 * stride_ob + h * stride_oh + dims, _round(out, OUT.dtype.element_ty))
    tl.store(LSE + b64 * stride_lb + h, tl.where(has, m + tl.log(tl.where(has, total, 1.0)), float("-inf")))


def num_splits_for(capacity, pairs, num_sms):
    """Host-side split count: about two waves of programs over the SMs, no split shorter than
    MIN_SPLIT_TOKENS, at most MAX_SPLITS (the combine's tile)."""
    if capacity <= 0:
        return 1
    want = cdiv(2 * num_sms, max(1, pairs))
    return max(1, min(want, cdiv(capacity, MIN_SPLIT_TOKENS), MAX_SPLITS))


def decode(q, k, v, lens, block_table, out, lse, scale, *, q_strides, k_strides, v_strides, bt_stride,
           out_strides, lse_stride, n_kv_heads, capacity, page_size, num_splits, num_sms, block_n=BLOCK_N):
    """Launch split + combine on the current stream; returns the split count used.

    q_strides (b, h); k_strides / v_strides (b or page, kv head, token or token-in-page); the last
    dim of every tensor is contiguous. block_table None: contiguous caches. num_splits None: the
    host heuristic. block_n: tokens per inner step (tests shrink it to exercise several splits).
    """
    batch, n_heads, head_dim = q.shape[0], q.shape[1], q.shape[-1]
    group = n_heads // n_kv_heads
    if num_splits is None:
        num_splits = num_splits_for(capacity, batch * n_kv_heads, num_sms)
    # Splits are whole BLOCK_N tiles (full-width loads); rounding may leave fewer splits.
    split_size = cdiv(cdiv(capacity, num_splits), block_n) * block_n
    num_splits = cdiv(capacity, split_size)
    po = q.new_empty((batch, n_heads, num_splits, head_dim), dtype=torch.float32)
    pl = q.new_empty((batch, n_heads, num_splits), dtype=torch.float32)
    ieee = k.dtype == torch.float32 or (k.dtype == torch.bfloat16 and _INTERPRET)
    paged = block_table is not None
    _decode_split_kernel[(batch * n_kv_heads, num_splits)](
        q, k, v, lens, block_table if paged else lens, po, pl,
        q_strides[0], q_strides[1], k_strides[0], k_strides[1], k_strides[2],
        v_strides[0], v_strides[1], v_strides[2], bt_stride if paged else 0,
        n_kv_heads, num_splits, capacity, split_size, float(scale) * LOG2E,
        GROUP=group, GROUP_PAD=max(16, next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_N=block_n, PAGED=paged, PAGE_SIZE=page_size if paged else 1, IEEE=ieee,
        ROUND_P=ieee and k.dtype != torch.float32,
        num_warps=4 if head_dim <= 128 else 8,
        # fp32 caches at D=256: Triton's default 3 stages of [BLOCK_N, D] K and V tiles need 276 KB of
        # shared memory (the sm_90 limit is 227 KB) and the launch fails; one stage needs 144 KB.
        num_stages=1 if k.element_size() * head_dim > 512 else 3)
    _combine_kernel[(batch * n_heads,)](
        po, pl, lens, out, lse, out_strides[0], out_strides[1], lse_stride,
        n_heads, num_splits, capacity, split_size,
        HEAD_DIM=head_dim, SPLITS_PAD=max(2, next_power_of_2(num_splits)), num_warps=4)
    return num_splits


# ---------------------------------------------------------------------------------------------
# KV append: cache[b, kvh, lens[b]] = new[b, kvh] for every (b, kvh); one program per pair moves
# one D-vector of K and of V. lens is read on the device, so the launch is graph-capturable; a
# position outside [0, capacity) is not written (never a stray store; FRAY_CHECK_INDICES=1 raises).

@triton.jit
def _append_kernel(
    K, V, KN, VN, LENS, BT,
    stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    stride_knb, stride_knh, stride_vnb, stride_vnh, stride_btb,
    capacity, head_dim,
    BLOCK_D: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pos = tl.load(LENS + b)
    if (pos >= 0) & (pos < capacity):
        if PAGED:
            page = tl.load(BT + b * stride_btb + pos // PAGE_SIZE).to(tl.int64)
            slot = (pos % PAGE_SIZE).to(tl.int64)
            k_off = page * stride_kb + h * stride_kh + slot * stride_kt
            v_off = page * stride_vb + h * stride_vh + slot * stride_vt
        else:
            p64 = pos.to(tl.int64)
            k_off = b * stride_kb + h * stride_kh + p64 * stride_kt
            v_off = b * stride_vb + h * stride_vh + p64 * stride_vt
        d = tl.arange(0, BLOCK_D)
        ok = d < head_dim
        tl.store(K + k_off + d, tl.load(KN + b * stride_knb + h * stride_knh + d, mask=ok), mask=ok)
        tl.store(V + v_off + d, tl.load(VN + b * stride_vnb + h * stride_vnh + d, mask=ok), mask=ok)


def append(k, v, k_new, v_new, lens, block_table, *, k_strides, v_strides, bt_stride, capacity, page_size):
    """Launch on the current stream. k_strides / v_strides as in decode(); k_new, v_new [B, Hkv, D]
    with a contiguous last dim, in the caches' dtype."""
    batch, n_kv_heads, head_dim = k_new.shape
    paged = block_table is not None
    _append_kernel[(batch, n_kv_heads)](
        k, v, k_new, v_new, lens, block_table if paged else lens,
        k_strides[0], k_strides[1], k_strides[2], v_strides[0], v_strides[1], v_strides[2],
        k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1), bt_stride if paged else 0,
        capacity, head_dim,
        BLOCK_D=next_power_of_2(head_dim), PAGED=paged, PAGE_SIZE=page_size if paged else 1,
        num_warps=1 if head_dim <= 128 else 2)
