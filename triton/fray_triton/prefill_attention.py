"""Multi-token (prefill) attention in Triton: a FlashAttention-2-style forward pass.

Semantics match fray.reference.attention.prefill_attention: for sequence b with n_q queries and
n_k keys, query i sees every key (causal=False) or keys j <= i + n_k - n_q (causal, aligned
bottom-right: the queries are the sequence's last n_q positions, as in chunked prefill); fp32
softmax; lse in natural log; a query with no visible key gets a zero row and lse = -inf.

One program per (BLOCK_M queries, query head, sequence). It keeps its [BLOCK_M, D] tile of Q in
registers and streams K and V of the query head's kv head (h // (Hq / Hkv): GQA and MQA map
several query heads onto one kv head, nothing is copied) in [BLOCK_N, D] tiles, folding each
tile into a running max m, a running sum l and an unnormalised fp32 accumulator (the online
softmax); the output is divided by l once at the end. Scores are scaled by scale * log2(e) so
that every exponential is an exp2, the native instruction.

Causal blocks: keys j <= m0 + n_k - n_q (m0 the block's first query) are visible to every query
of the block, so the key loop runs in two parts: whole BLOCK_N tiles below that diagonal with no
masks at all, then the few tiles that cross it (or the end of the sequence) with a mask; tiles
entirely past the block's last query's diagonal are never loaded. Non-causal attention is the
same loop with the diagonal moved past the end.

Layouts: the varlen form packs every sequence's tokens into q [total_q, Hq, D] and k, v
[total_k, Hkv, D] with int32 cu_seqlens [B + 1] read here on the device (never on the host: the
launch is CUDA-graph capturable with new lengths per replay; the grid comes from the caller's
max_seqlen_q). The batched form [B, S, H, D] is the same kernel with a batch stride and fixed
lengths. Offsets are clamped so that bad cu_seqlens values can only read and write inside the
tensors (FRAY_CHECK_INDICES=1 in the ops layer reports them).

Paged K/V (PAGED, varlen only: prefix caching, chunked prefill over a paged cache): k and v are
pools of NHD pages [num_blocks, PAGE_SIZE, Hkv, D] and key j of sequence b is row j % PAGE_SIZE
of page BT[b, j // PAGE_SIZE]. The loop is the same; each K / V tile gathers its rows, one page
lookup per row (4 bytes of table per row of 2 * D * 2 bytes of K and V, and neighbouring rows
share the line), so a tile may span several pages (PAGE_SIZE < BLOCK_N) or lie inside one.
cu_seqlens_k gives only the key counts; a count is clamped to the table's capacity max_blocks *
PAGE_SIZE, so the table is never read past its row, and the entries themselves are used as given,
as in the paged decode kernel.
"""
import os

import torch
import triton
import triton.language as tl

from fray_triton._host import cdiv
from fray_triton.norm import _round

LOG2E = 1.4426950408889634
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _tiles(q, m_i, l_i, acc, k_base, v_base, bt_row, stride_kp, stride_kt, stride_vp, stride_vt, offs_m, n_lo, n_hi,
           n_k, diag, sm_scale_log2, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
           CAUSAL: tl.constexpr, IEEE: tl.constexpr, ROUND_P: tl.constexpr, PAGED: tl.constexpr,
           PAGE_SIZE: tl.constexpr):
    """Fold the key tiles [n_lo, n_hi) into the online softmax state (m_i, l_i, acc). MASKED:
    tiles that cross the causal diagonal or the end of the sequence; otherwise whole tiles every
    query of the block sees, loaded and scored without masks. PAGED: key j is row j % PAGE_SIZE
    of page bt_row[j // PAGE_SIZE] (stride_kp / stride_vp: the pages' strides); otherwise row j
    of the sequence's contiguous keys."""
    offs_n = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    for n0 in range(n_lo, n_hi, BLOCK_N):
        offs = n0 + offs_n
        if MASKED:
            n_ok = offs < n_k
        if PAGED:
            # rows below n_k <= capacity: their block index lies inside the table's row
            if MASKED:
                page = tl.load(bt_row + offs // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
            else:
                page = tl.load(bt_row + offs // PAGE_SIZE).to(tl.int64)
            slot = offs % PAGE_SIZE
            k_rows = page * stride_kp + slot * stride_kt
            v_rows = page * stride_vp + slot * stride_vt
        else:
            rows = offs.to(tl.int64)
            k_rows = rows * stride_kt
            v_rows = rows * stride_vt
        if MASKED:
            k = tl.load(k_base + k_rows[:, None] + dims[None, :], mask=n_ok[:, None], other=0.0)
            v = tl.load(v_base + v_rows[:, None] + dims[None, :], mask=n_ok[:, None], other=0.0)
        else:
            k = tl.load(k_base + k_rows[:, None] + dims[None, :])
            v = tl.load(v_base + v_rows[:, None] + dims[None, :])
        # fp32 inputs: IEEE products (TF32 would cost ~1e-3 relative). 16-bit inputs: the tensor
        # cores' native inputs, p rounded to the input dtype for P @ V as every flash kernel does.
        # Triton's CPU interpreter computes bf16 tl.dot wrongly, so there (IEEE with bf16 inputs)
        # the same products run in fp32 with p rounded to bf16 exactly as on the GPU.
        if IEEE:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * sm_scale_log2
        if MASKED:
            ok = offs[None, :] < n_k
            if CAUSAL:
                ok = ok & (offs[None, :] <= offs_m[:, None] + diag)
            s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A query that has seen no key yet keeps m = -inf: subtract 0 instead, so that
        # exp2(-inf - -inf) never makes a NaN (its alpha and p are exp2(-inf) = 0).
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            if ROUND_P:
                p_v = _round(p, v.dtype).to(tl.float32)
            else:
                p_v = p
            acc = acc * alpha[:, None] + tl.dot(p_v, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["total_q", "total_k", "seqlen_q", "seqlen_k", "capacity"])
def _prefill_kernel(
    Q, K, V, OUT, LSE, CU_Q, CU_K, BT,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ob, stride_ot, stride_oh,
    stride_lb, stride_lh, stride_btb,
    total_q, total_k, seqlen_q, seqlen_k, capacity, sm_scale_log2,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, IEEE: tl.constexpr, ROUND_P: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
):
    # Paged (VARLEN only): stride_kb / stride_vb step pages and stride_kt / stride_vt tokens within
    # a page; total_k is unused (cu_seqlens_k holds key counts, not rows of k).
    # Causal: the last query blocks see the most keys; launching them first (programs start in
    # id order) keeps a long block from starting last and running alone at the end.
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    if VARLEN:
        # Clamped to [0, total]: a bad cu_seqlens entry cannot move a tile outside the tensors.
        q_start = tl.minimum(tl.maximum(tl.load(CU_Q + b), 0), total_q)
        q_end = tl.minimum(tl.maximum(tl.load(CU_Q + b + 1), q_start), total_q)
        n_q = q_end - q_start
        q_row0 = q_start.to(tl.int64)
        if PAGED:
            # Clamped to [0, capacity]: a bad count cannot read the block table past its row.
            k_start = tl.maximum(tl.load(CU_K + b), 0)
            n_k = tl.minimum(tl.maximum(tl.load(CU_K + b + 1), k_start) - k_start, capacity)
        else:
            k_start = tl.minimum(tl.maximum(tl.load(CU_K + b), 0), total_k)
            k_end = tl.minimum(tl.maximum(tl.load(CU_K + b + 1), k_start), total_k)
            n_k = k_end - k_start
            k_row0 = k_start.to(tl.int64)
    else:
        n_q = seqlen_q + 0 * b
        n_k = seqlen_k + 0 * b
        q_row0 = 0 * b64
        k_row0 = 0 * b64
    m0 = pid_m * BLOCK_M
    if m0 < n_q:
        kvh = h // GROUP
        offs_m = m0 + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        m_ok = offs_m < n_q
        q_rows = q_row0 + offs_m
        q = tl.load(Q + b64 * stride_qb + q_rows[:, None] * stride_qt + h * stride_qh + dims[None, :],
                    mask=m_ok[:, None], other=0.0)
        if PAGED:
            k_base = K + kvh * stride_kh
            v_base = V + kvh * stride_vh
        else:
            k_base = K + b64 * stride_kb + kvh * stride_kh + k_row0 * stride_kt
            v_base = V + b64 * stride_vb + kvh * stride_vh + k_row0 * stride_vt
        bt_row = BT + b64 * stride_btb
        diag = n_k - n_q  # query i sees keys j <= i + diag
        if CAUSAL:
            # every query of the block sees keys below m0 + diag + 1; its last one, keys below hi
            full_end = tl.minimum(m0 + diag + 1, n_k)
            hi = tl.minimum(m0 + BLOCK_M + diag, n_k)
        else:
            full_end = n_k
            hi = n_k
        full_end = tl.maximum(full_end, 0) // BLOCK_N * BLOCK_N
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        m_i, l_i, acc = _tiles(q, m_i, l_i, acc, k_base, v_base, bt_row, stride_kb, stride_kt, stride_vb, stride_vt,
                               offs_m, 0, full_end, n_k, diag, sm_scale_log2, HEAD_DIM, BLOCK_N, False, CAUSAL,
                               IEEE, ROUND_P, PAGED, PAGE_SIZE)
        m_i, l_i, acc = _tiles(q, m_i, l_i, acc, k_base, v_base, bt_row, stride_kb, stride_kt, stride_vb, stride_vt,
                               offs_m, full_end, hi, n_k, diag, sm_scale_log2, HEAD_DIM, BLOCK_N, True, CAUSAL,
                               IEEE, ROUND_P, PAGED, PAGE_SIZE)
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]   # no visible key: acc = 0, a zero row
        tl.store(OUT + b64 * stride_ob + q_rows[:, None] * stride_ot + h * stride_oh + dims[None, :],
                 _round(out, OUT.dtype.element_ty), mask=m_ok[:, None])
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + b64 * stride_lb + h * stride_lh + q_rows, lse, mask=m_ok)


def blocks_for(head_dim, dtype):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) on the GPU. 16-bit inputs: 128 queries x 64 keys
    for D <= 128 (the Q tile and the fp32 accumulator, 128 x 128 x 4 B = 64 KB, fit the register
    file of 8 warps; K and V tiles of 16 KB each leave room for 2-3 stages in shared memory), half
    the keys at D = 256. fp32 inputs take half of each (twice the bytes per element, IEEE dots)."""
    if dtype == torch.float32:
        return (64, 32, 4, 2) if head_dim <= 128 else (32, 32, 4, 1)
    if head_dim <= 128:
        return (128, 64, 8 if head_dim == 128 else 4, 3)
    return (64, 32, 8, 2)


def prefill(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, scale, *, causal, batch, max_seqlen_q, seqlen_k,
            q_strides, k_strides, v_strides, out_strides, lse_strides, block_table=None, bt_stride=0, page_size=1,
            block_m=None, block_n=None):
    """Launch on the current stream.

    Varlen (cu_seqlens_q given): q [total_q, Hq, D], k, v [total_k, Hkv, D], out like q, lse
    [Hq, total_q]; batch is B (cu_seqlens has B + 1 entries), max_seqlen_q an upper bound of the
    query lengths (it sizes the grid; seqlen_k is unused). Batched (cu_seqlens None): q
    [B, Sq, Hq, D], k, v [B, Sk, Hkv, D], lse [B, Hq, Sq]; max_seqlen_q = Sq, seqlen_k = Sk.
    Paged (varlen with block_table, int32 [B, max_blocks], row stride bt_stride): k, v are pools
    [num_blocks, page_size, Hkv, D] and sequence b's cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys
    (clamped to max_blocks * page_size) are read through its block-table row.
    *_strides: (batch, token, head) in elements (batch 0 for varlen; for paged k / v: (page,
    token in page, head)), lse_strides (batch, head); every last dim contiguous. block_m /
    block_n: powers of two >= 16 (tests shrink them to exercise several tiles).
    """
    n_heads, head_dim = q.shape[-2], q.shape[-1]
    group = n_heads // k.shape[-2]
    bm, bn, warps, stages = blocks_for(head_dim, q.dtype)
    bm, bn = block_m or bm, block_n or bn
    if batch == 0 or max_seqlen_q == 0 or n_heads == 0:
        return
    varlen = cu_seqlens_q is not None
    paged = block_table is not None
    ieee = q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and _INTERPRET)
    total_q = q.shape[0] if varlen else 0
    total_k = k.shape[0] if varlen and not paged else 0
    _prefill_kernel[(cdiv(max_seqlen_q, bm), n_heads, batch)](
        q, k, v, out, lse, cu_seqlens_q if varlen else lse, cu_seqlens_k if varlen else lse,
        block_table if paged else lse,
        q_strides[0], q_strides[1], q_strides[2], k_strides[0], k_strides[1], k_strides[2],
        v_strides[0], v_strides[1], v_strides[2], out_strides[0], out_strides[1], out_strides[2],
        lse_strides[0], lse_strides[1], bt_stride if paged else 0,
        total_q, total_k, 0 if varlen else max_seqlen_q, 0 if varlen else seqlen_k,
        block_table.shape[1] * page_size if paged else 0, float(scale) * LOG2E,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=bool(causal), VARLEN=varlen,
        IEEE=ieee, ROUND_P=ieee and q.dtype != torch.float32, PAGED=paged, PAGE_SIZE=page_size if paged else 1,
        num_warps=warps, num_stages=stages)
