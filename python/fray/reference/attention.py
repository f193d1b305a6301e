"""Single-token (decode) attention, KV-cache appends, multi-token (prefill) attention and latent (MLA)
decode attention in float64.

decode_attention: for each sequence b and query head h (kv head h // (Hq / Hkv), GQA),
    s_t = scale * <q[b, h], k[b, kvh, t]>   for t < lens[b]
    out[b, h] = sum_t softmax(s)_t v[b, kvh, t],  lse[b, h] = log(sum_t exp(s_t))  (natural log)
    lens[b] = 0 gives out = 0 and lse = -inf.
Caches are HND [B, Hkv, T, D] or NHD [B, T, Hkv, D]; paged caches are NHD pages
[num_blocks, block_size, Hkv, D] addressed through block_table[b, t // block_size].
`magnitude` is sum_t softmax(s)_t |v_t|: the size of the terms the output sums, which is what
rounding errors are relative to (an output that cancels to ~0 still carries errors of that size).

Inputs are float64 numpy arrays, or float64 torch tensors on any device (the GPU tests compute the
reference next to the data); lens and block_table are read on the host, which is fine here.
prefill_attention and mla_decode take anything np.asarray converts (numpy arrays, CPU tensors) and
return numpy.
"""
import math

import numpy as np


def _lib(a):
    if isinstance(a, np.ndarray):
        return np
    import torch
    return torch


def _host_ints(a):
    return [int(v) for v in (a.tolist() if hasattr(a, "tolist") else a)]


def to_nhd(cache, kv_layout):
    """[B, T, Hkv, D] view of a cache in either layout."""
    if kv_layout == "NHD":
        return cache
    return cache.transpose(0, 2, 1, 3) if isinstance(cache, np.ndarray) else cache.transpose(1, 2)


def gather_pages(pages, block_table_row, n):
    """The first n tokens of one sequence from NHD pages: [n, Hkv, D]."""
    bs = pages.shape[1]
    blocks = _host_ints(block_table_row)[: (n + bs - 1) // bs]
    if not blocks:
        return pages[:0, 0]
    parts = [pages[b] for b in blocks]
    xp = _lib(pages)
    cat = np.concatenate(parts, axis=0) if xp is np else xp.cat(parts, dim=0)
    return cat[:n]


def _attend(q_b, k_seq, v_seq, scale):
    """q_b [Hq, D]; k_seq, v_seq [n, Hkv, D] -> (out [Hq, D], lse [Hq], magnitude [Hq, D])."""
    xp = _lib(q_b)
    hq, d = q_b.shape
    n, hkv = k_seq.shape[0], k_seq.shape[1]
    group = hq // hkv
    if n == 0:
        zeros = q_b * 0.0
        lse = zeros[:, 0] - math.inf
        return zeros, lse, zeros
    out, lse, mag = [], [], []
    for h in range(hq):
        kvh = h // group
        k = k_seq[:, kvh, :]                     # [n, D]
        v = v_seq[:, kvh, :]
        s = (k @ q_b[h]) * scale                 # [n]
        m = s.max()
        p = xp.exp(s - m)
        total = p.sum()
        out.append((p @ v) / total)
        mag.append((p @ xp.abs(v)) / total)
        lse.append(m + xp.log(total))
    stack = np.stack if xp is np else xp.stack
    return stack(out), stack(lse), stack(mag)


def _finish(results):
    xp = _lib(results[0][0])
    stack = np.stack if xp is np else xp.stack
    return tuple(stack([r[i] for r in results]) for i in range(3))


def decode_attention(q, k_cache, v_cache, lens, scale=None, kv_layout="HND"):
    """q [B, Hq, D]; caches per kv_layout; lens [B] -> (out [B, Hq, D], lse [B, Hq], magnitude)."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k, v = to_nhd(k_cache, kv_layout), to_nhd(v_cache, kv_layout)
    results = [_attend(q[b], k[b, :n], v[b, :n], scale) for b, n in enumerate(_host_ints(lens))]
    if not results:
        return q * 0.0, q[:, :, 0] * 0.0, q * 0.0
    return _finish(results)


def paged_decode_attention(q, k_pages, v_pages, block_table, lens, scale=None):
    """q [B, Hq, D]; pages [num_blocks, block_size, Hkv, D]; block_table [B, max_blocks]."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    results = []
    for b, n in enumerate(_host_ints(lens)):
        results.append(_attend(q[b], gather_pages(k_pages, block_table[b], n),
                               gather_pages(v_pages, block_table[b], n), scale))
    if not results:
        return q * 0.0, q[:, :, 0] * 0.0, q * 0.0
    return _finish(results)


def kv_append(k_cache, v_cache, k_new, v_new, lens, kv_layout="HND"):
    """In place: cache[b, :, lens[b]] = new[b] (HND; [b, lens[b]] for NHD). Any array dtype."""
    for b, pos in enumerate(_host_ints(lens)):
        if kv_layout == "HND":
            k_cache[b, :, pos] = k_new[b]
            v_cache[b, :, pos] = v_new[b]
        else:
            k_cache[b, pos] = k_new[b]
            v_cache[b, pos] = v_new[b]


def kv_append_paged(k_pages, v_pages, block_table, k_new, v_new, lens):
    """In place: page block_table[b, pos // bs], slot pos % bs, gets new[b] (pos = lens[b])."""
    bs = k_pages.shape[1]
    for b, pos in enumerate(_host_ints(lens)):
        blk = int(block_table[b][pos // bs])
        k_pages[blk, pos % bs] = k_new[b]
        v_pages[blk, pos % bs] = v_new[b]


def prefill_attention(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, causal=True, scale=None, block_table=None):
    """Multi-token (prefill) attention, one sequence at a time.

    Varlen (cu_seqlens given): q [total_q, Hq, D], k, v [total_k, Hkv, D]; sequence b holds q rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] and k/v rows cu_seqlens_k[b]:cu_seqlens_k[b + 1].
    Paged (varlen with block_table [B, max_blocks]): k, v are NHD pages [num_blocks, block_size,
    Hkv, D]; sequence b's n_k = cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys are its first n_k
    tokens through block_table[b] (gather_pages), then everything is as in the varlen form.
    Batched (cu_seqlens None): q [B, Sq, Hq, D], k, v [B, Sk, Hkv, D].
    For sequence b with n_q queries and n_k keys, query i of head h (kv head h // (Hq / Hkv)) sees
    key j when causal is False, or when j <= i + n_k - n_q (causal, aligned bottom-right: the
    queries are the last n_q positions of the sequence). Over the visible keys,
        s_j = scale * <q_i, k_j>,  out_i = sum_j softmax(s)_j v_j,  lse_i = log(sum_j exp(s_j));
    a query with no visible key gets out_i = 0 and lse_i = -inf.
    Returns (out like q, lse, magnitude like q): lse [Hq, total_q] (varlen) or [B, Hq, Sq].
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    batched = cu_seqlens_q is None
    if batched:
        nb, sq, sk = q.shape[0], q.shape[1], k.shape[1]
        cq, ck = [b * sq for b in range(nb + 1)], [b * sk for b in range(nb + 1)]
        q, k, v = q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
    else:
        cq, ck = _host_ints(cu_seqlens_q), _host_ints(cu_seqlens_k)
    if block_table is not None:
        counts = [ck[b + 1] - ck[b] for b in range(len(ck) - 1)]
        k, v = (np.concatenate([gather_pages(pages, block_table[b], n) for b, n in enumerate(counts)]
                               + [pages[:0, 0]]) for pages in (k, v))
        ck = [0] + np.cumsum(counts, dtype=np.int64).tolist()
    total_q, hq = q.shape[0], q.shape[1]
    group = hq // k.shape[1]
    out = np.zeros_like(q)
    mag = np.zeros_like(q)
    lse = np.full((hq, total_q), -math.inf)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        n_q, n_k = q1 - q0, k1 - k0
        i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
        visible = (j <= i + (n_k - n_q)) if causal else np.ones((n_q, n_k), dtype=bool)
        rows = visible.any(axis=1)                  # queries with at least one visible key
        if not rows.any():
            continue
        for h in range(hq):
            kvh = h // group
            kk, vv = k[k0:k1, kvh], v[k0:k1, kvh]   # [n_k, D]
            s = np.where(visible, (q[q0:q1, h] @ kk.T) * scale, -np.inf)[rows]   # [rows, n_k]
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)                       # exp(-inf) = 0 for the hidden keys
            total = p.sum(axis=1, keepdims=True)
            idx = q0 + np.nonzero(rows)[0]
            out[idx, h] = (p @ vv) / total
            mag[idx, h] = (p @ np.abs(vv)) / total
            lse[h, idx] = (m + np.log(total))[:, 0]
    if batched:
        out, mag = out.reshape(nb, sq, hq, d), mag.reshape(nb, sq, hq, d)
        lse = lse.reshape(hq, nb, sq).transpose(1, 0, 2).copy()
    return out, lse, mag


def mla_decode(q, kv_cache, block_table, lens, head_dim_v=512, scale=None):
    """Multi-head latent attention decode (DeepSeek's MLA with the up-projections absorbed).

    q [B, s_q, Hq, D]; kv_cache [num_blocks, block_size, 1, D] paged latent rows (D = 576: the
    512-wide latent then 64 rotary dims), addressed through block_table [B, max_blocks]; lens [B].
    Every head reads the one latent row per token: the key is the whole row, the value its first
    head_dim_v columns. Query i of sequence b (0-based, s_q new tokens that are the sequence's
    last ones) sees positions j < n_i = lens[b] - s_q + 1 + i:
        s_j = scale * <q[b, i, h], row_j>,  out[b, i, h] = sum_j softmax(s)_j row_j[:head_dim_v],
        lse[b, i, h] = log(sum_j exp(s_j));
    n_i <= 0 gives out = 0 and lse = -inf. scale: default 1/sqrt(D).
    Returns (out [B, s_q, Hq, head_dim_v], lse [B, s_q, Hq], magnitude like out) as numpy float64;
    takes anything np.asarray converts.
    """
    q, kv = np.asarray(q, dtype=np.float64), np.asarray(kv_cache, dtype=np.float64)
    batch, s_q, hq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((batch, s_q, hq, head_dim_v))
    mag = np.zeros_like(out)
    lse = np.full((batch, s_q, hq), -math.inf)
    for b, n in enumerate(_host_ints(lens)):
        rows = gather_pages(kv, block_table[b], n)[:, 0]               # [n, D]
        v = rows[:, :head_dim_v]
        s = (q[b] @ rows.T) * scale                                     # [s_q, Hq, n]
        for i in range(s_q):
            seen = n - s_q + 1 + i
            if seen <= 0:
                continue
            si = s[i, :, :seen]
            m = si.max(axis=1, keepdims=True)
            p = np.exp(si - m)
            total = p.sum(axis=1, keepdims=True)
            out[b, i] = (p @ v[:seen]) / total
            mag[b, i] = (p @ np.abs(v[:seen])) / total
            lse[b, i] = (m + np.log(total))[:, 0]
    return out, lse, mag
