"""Attention-family benchmarks: Fray's backends and the peers a user would pick, in one process.

Decode shapes "B<batch>Hq<q heads>Hkv<kv heads>T<capacity>D<head dim>", bf16, one query token per
sequence: B32Hq32Hkv8T4096D128, B1Hq32Hkv8T4096D128, B64Hq64Hkv8T8192D128 (every lens[b] = T) and
B64Hq32Hkv8Tvar8192D128 (lens uniform in [1, 8192] from a fixed-seed CPU generator, moved to the
device). paged_decode_attention takes the same shapes with "P16" / "P64" appended (block size):
NHD pages [B·T/P, P, Hkv, D], the block table a fixed-seed random permutation of all pages.
kv_append / kv_append_paged: "B64Hkv8D128" (one new token per sequence into a T=4096 cache; HND
[B, Hkv, T, D] for kv_append, P16 pages for kv_append_paged; lens uniform in [0, 4096)).

decode bytes: the K and V rows read = 2 · sum(lens) · Hkv · D · s (q, out and lse not counted;
              sum(lens) = B·T for the fixed shapes). Varlen rows also carry padded_bytes, the
              2 · B · T · Hkv · D · s that SDPA's padded cache holds, and kv_tokens = sum(lens).
append bytes: read k_new and v_new + write them into the cache = 4 · B · Hkv · D · s (lens and
              block-table reads not counted).
prefill_attention: "B<batch>Hq<q heads>Hkv<kv heads>S<seq>D<head dim>", batched [B, S, H, D], bf16:
B2Hq32Hkv8S{1024, 4096, 8192, 16384}D128 and B2Hq32Hkv8S8192D{64, 256}, each non-causal and
":causal"; the varlen batch B16Hq32Hkv8Svar8192D128 (16 packed sequences, lengths uniform in
[128, 8192], fixed seed), both ways; chunked prefill B1Hq32Hkv8S2048K16384D128:causal (2048
queries at the end of 16384 keys; the keys contiguous, not paged) and the same over a paged prefix,
B1Hq32Hkv8S2048K16384D128P64:causal (prefix caching: the 14336 cached keys and the 2048 new ones in
64-token NHD pages [256, 64, Hkv, D] behind a random page permutation, seed SEED + 2; q packed
[2048, Hq, D] with cu_seqlens, the varlen form's block_table). flops = 4 · Hq · D per visible
(query, key) pair (QK^T and PV; causal: the masked pairs are never computed and not counted);
bytes not reported. Impls: fray.cuda (the TMA + wgmma kernel), fray.triton; peers
torch.builtin:flash / :efficient / :cudnn = F.scaled_dot_product_attention(enable_gqa=True,
is_causal; causal_lower_right for the chunked shape) under sdpa_kernel(<backend>) on the
[B, H, S, D] transposed views of the same tensors (no copy); varlen: torch.builtin:padded (SDPA
on the zero-padded batch with a boolean mask, the default backend choice) and
torch.builtin:per_sequence (SDPA flash once per sequence); a backend that cannot run the shape
leaves an error row. Paged prefill: fray.cuda and fray.triton against the same SDPA peers on the keys
gathered into a contiguous [B, Hkv, S_k, D] view (causal_lower_right), the gather outside the timing.
Decode impls: fray.cuda / fray.triton (public API, HND caches, preallocated out); on B32 also
fray.cuda:NHD / fray.triton:NHD (kv_layout="NHD", same data transposed). Peers: torch.builtin =
F.scaled_dot_product_attention(q[:, :, None, :], k, v, enable_gqa=True) on the HND cache; varlen
shapes give it the padded cache with a boolean mask [B, 1, 1, T] (torch.builtin) and with an
additive 0 / -inf mask in bf16 (torch.builtin:additive), built from lens outside the timing.
paged_decode_attention: torch.builtin is SDPA on the same tokens in a contiguous HND cache (what
the paged kernel would be without pages), torch.eager gathers the pages by the block table into
[B, Hkv, T, D] and then calls SDPA (varlen: boolean mask). Appends: torch.eager is the indexing
composite, k_cache[arange(B), :, lens] = k_new (paged: k_pages[block_table[arange(B), lens // P],
lens % P] = k_new), the same for v.
mla_decode (DeepSeek's latent attention, issue 21): "B<batch>Hq<heads>Sq<s_q>T<len>", bf16, for
B {1, 32, 128} x Hq {16, 128} x T {1024, 4096, 16384} x s_q {1, 2}: q [B, s_q, Hq, 576], a paged
latent cache [B·T/64, 64, 1, 576] (FlashMLA's block size) behind a random page permutation (seed
SEED + 2), every lens[b] = T, default scale. gbps counts the latent bytes read, sum(lens) · 576 ·
s (each cached row once: its 576 columns are the key and its first 512 the value); tflops the
MLA FLOPs, 2 · Hq · (576 + 512) · sum over sequences and queries of the tokens the query sees
(QK^T over 576, PV over 512; causal among the s_q). Bars: >= 3.6 TB/s at B128Hq16Sq1T16384
(memory-bound), >= 550 TFLOP/s at B128Hq128Sq2T4096 (compute-bound). Impls: fray.triton, fray.cuda
once it exists (no CUDA MLA kernel yet: no row), and torch.eager, the absorbed-MLA composite:
gather the latent rows through the block table ([B, T, 576]), scores = one bmm per batch over
576 columns, the causal mask, softmax in fp32, P (in bf16) @ the first 512 columns. Its
torch.compile is not timed: a compile per shape (36 shapes) would take longer than the whole
table (the lease budgets ~3 minutes for it).
"""
import collections
import itertools
import re

import torch
import torch.nn.functional as F

import fray

SEED = 0
DTYPE = torch.bfloat16

Decode = collections.namedtuple("Decode", "batch hq hkv capacity head_dim varlen page")
Append = collections.namedtuple("Append", "batch hkv capacity head_dim page")
# seq_k: the keys' length when it differs from the queries' (chunked prefill: the queries are the
# last seq positions of seq_k); varlen: `batch` sequences with lengths drawn in [128, seq] (seq the
# longest), packed; page: the keys in pages of that many tokens (fray's paged varlen form).
Prefill = collections.namedtuple("Prefill", "batch hq hkv seq head_dim causal seq_k varlen page",
                                 defaults=(None, False, None))
Mla = collections.namedtuple("Mla", "batch hq s_q seq")

_DECODE = [
    Decode(32, 32, 8, 4096, 128, False, None),
    Decode(1, 32, 8, 4096, 128, False, None),
    Decode(64, 64, 8, 8192, 128, False, None),
    Decode(64, 32, 8, 8192, 128, True, None),
]
SHAPES = {
    "decode_attention": [(s, DTYPE) for s in _DECODE],
    "paged_decode_attention": [(s._replace(page=p), DTYPE) for s in _DECODE for p in (16, 64)],
    "kv_append": [(Append(64, 8, 4096, 128, None), DTYPE)],
    "kv_append_paged": [(Append(64, 8, 4096, 128, 16), DTYPE)],
    "prefill_attention": [(Prefill(2, 32, 8, s, d, c), DTYPE)
                          for s, d in ((1024, 128), (4096, 128), (8192, 128), (16384, 128), (8192, 64), (8192, 256))
                          for c in (False, True)]
                         + [(Prefill(16, 32, 8, 8192, 128, c, varlen=True), DTYPE) for c in (False, True)]
                         + [(Prefill(1, 32, 8, 2048, 128, True, seq_k=16384, page=p), DTYPE) for p in (None, 64)],
    "mla_decode": [(Mla(b, h, s, t), DTYPE) for b in (1, 32, 128) for h in (16, 128) for t in (1024, 4096, 16384)
                   for s in (1, 2)],
}
MLA_DIM, MLA_DIM_V, MLA_PAGE = 576, 512, 64
SDPA_BACKENDS = ("flash", "efficient", "cudnn")
OPS = tuple(SHAPES)
NHD_BATCH = 32  # the decode shape that also gets the NHD-layout rows


def shape_name(spec):
    if isinstance(spec, Mla):
        return "B%dHq%dSq%dT%d" % spec
    if isinstance(spec, Prefill):
        return "B%dHq%dHkv%dS%s%d%sD%d%s%s" % (
            spec.batch, spec.hq, spec.hkv, "var" if spec.varlen else "", spec.seq,
            "K%d" % spec.seq_k if spec.seq_k else "", spec.head_dim, "P%d" % spec.page if spec.page else "",
            ":causal" if spec.causal else "")
    page = "P%d" % spec.page if spec.page else ""
    if isinstance(spec, Append):
        return "B%dHkv%dD%d%s" % (spec.batch, spec.hkv, spec.head_dim, page)
    return "B%dHq%dHkv%dT%s%dD%d%s" % (spec.batch, spec.hq, spec.hkv, "var" if spec.varlen else "",
                                        spec.capacity, spec.head_dim, page)


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_DECODE_RE = re.compile(r"B(\d+)Hq(\d+)Hkv(\d+)T(var)?(\d+)D(\d+)(?:P(\d+))?$")
_APPEND_RE = re.compile(r"B(\d+)Hkv(\d+)(?:T(\d+))?D(\d+)(?:P(\d+))?$")
_PREFILL_RE = re.compile(r"B(\d+)Hq(\d+)Hkv(\d+)S(var)?(\d+)(?:K(\d+))?D(\d+)(?:P(\d+))?$")
_MLA_RE = re.compile(r"B(\d+)Hq(\d+)Sq(\d+)T(\d+)$")


def parse_shapes(op, text):
    """--shapes for this family: a comma list of shape names as recorded, each optionally
    ":bf16" / ":fp16" / ":fp32"; appends also take "T<capacity>" (default 4096)."""
    out = []
    if op == "prefill_attention":
        return [_parse_prefill(item) for item in text.split(",")]
    if op == "mla_decode":
        return [_parse_mla(item) for item in text.split(",")]
    for item in text.split(","):
        name, _, dt = item.strip().partition(":")
        if dt and dt not in _DTYPES:
            raise ValueError("shapes: unknown dtype %r in %r (expected bf16, fp16 or fp32)" % (dt, item))
        if op in ("kv_append", "kv_append_paged"):
            m = _APPEND_RE.match(name)
            if not m:
                raise ValueError("shapes: expected B<b>Hkv<h>[T<t>]D<d>[P<page>] for %s, got %r" % (op, item))
            b, h, t, d, p = m.groups()
            spec = Append(int(b), int(h), int(t or 4096), int(d), int(p) if p else None)
        else:
            m = _DECODE_RE.match(name)
            if not m:
                raise ValueError("shapes: expected B<b>Hq<hq>Hkv<hkv>T[var]<t>D<d>[P<page>] for %s, got %r"
                                 % (op, item))
            b, hq, hkv, var, t, d, p = m.groups()
            spec = Decode(int(b), int(hq), int(hkv), int(t), int(d), bool(var), int(p) if p else None)
        paged = op in ("paged_decode_attention", "kv_append_paged")
        if paged != (spec.page is not None):
            raise ValueError("shapes: %s %s a P<page> suffix, got %r" % (op, "needs" if paged else "takes no", item))
        out.append((spec, _DTYPES[dt or "bf16"]))
    return out


def _parse_prefill(item):
    """B<b>Hq<hq>Hkv<hkv>S[var]<s>[K<s_k>]D<d>[P<page>], then optionally ":causal" and a dtype
    (":bf16" ...): Svar<s> packs b sequences of lengths in [128, s]; K<s_k> gives the keys a longer
    length (chunked prefill, batched only); P<page> puts the keys in pages of that size (not with
    var)."""
    name, *tags = item.strip().split(":")
    m = _PREFILL_RE.match(name)
    if not m or any(t not in _DTYPES and t != "causal" for t in tags) or (m.group(4) and (m.group(6) or m.group(8))):
        raise ValueError("shapes: expected B<b>Hq<hq>Hkv<hkv>S[var]<s>[K<s_k>]D<d>[P<page>][:causal]"
                         "[:bf16|fp16|fp32] (var with neither K nor P) for prefill_attention, got %r" % (item,))
    dts = [t for t in tags if t in _DTYPES]
    b, hq, hkv, var, seq, seq_k, d, page = m.groups()
    return (Prefill(int(b), int(hq), int(hkv), int(seq), int(d), "causal" in tags, int(seq_k) if seq_k else None,
                    bool(var), int(page) if page else None), _DTYPES[dts[-1] if dts else "bf16"])


def _parse_mla(item):
    """B<b>Hq<hq>Sq<s_q>T<len>, optionally ":bf16" / ":fp16"; T a multiple of the block size 64."""
    name, _, dt = item.strip().partition(":")
    m = _MLA_RE.match(name)
    if not m or (dt and dt not in ("bf16", "fp16")) or int(m.group(4)) % MLA_PAGE:
        raise ValueError("shapes: expected B<b>Hq<hq>Sq<s_q>T<len>[:bf16|fp16] with len a multiple of %d for "
                         "mla_decode, got %r" % (MLA_PAGE, item))
    return Mla(*(int(g) for g in m.groups())), _DTYPES[dt or "bf16"]


# ---------------------------------------------------------------------------------------------
# peers

def _sdpa(q4, k, v, mask=None):
    return F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, enable_gqa=True)


def _pages_to_hnd(pages, block_table):
    """[num_blocks, P, Hkv, D] pages -> the [B, Hkv, T, D] view of each sequence's tokens."""
    b, nb = block_table.shape
    _, page, hkv, d = pages.shape
    return pages[block_table].view(b, nb * page, hkv, d).transpose(1, 2)


def _eager_paged_sdpa(q4, k_pages, v_pages, block_table, mask=None):
    return _sdpa(q4, _pages_to_hnd(k_pages, block_table), _pages_to_hnd(v_pages, block_table), mask)


def _eager_append(k_cache, v_cache, k_new, v_new, bidx, lens):
    k_cache[bidx, :, lens] = k_new
    v_cache[bidx, :, lens] = v_new


def _eager_append_paged(k_pages, v_pages, block_table, k_new, v_new, bidx, lens):
    page = k_pages.shape[1]
    blocks = block_table[bidx, torch.div(lens, page, rounding_mode="floor")]
    slots = lens % page
    k_pages[blocks, slots] = k_new
    v_pages[blocks, slots] = v_new


def eager_mla(q, kv_cache, block_table, lens, scale):
    """Absorbed MLA as a user would write it in torch: every head attends over the same gathered
    latent rows. q [B, s_q, Hq, 576] -> [B, s_q, Hq, 512] in q's dtype (a query that sees no
    token gives NaN: softmax of nothing)."""
    batch, s_q, hq, d = q.shape
    rows = kv_cache[block_table].view(batch, -1, d)                              # [B, T, 576]
    t = torch.arange(rows.shape[1], device=q.device)
    seen = lens[:, None] - s_q + 1 + torch.arange(s_q, device=q.device)          # [B, s_q]
    mask = t[None, None, None, :] < seen[:, :, None, None]                       # [B, s_q, 1, T]
    scores = torch.bmm(q.reshape(batch, s_q * hq, d), rows.transpose(1, 2)).float() * scale
    scores = scores.view(batch, s_q, hq, -1).masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1).to(q.dtype).view(batch, s_q * hq, -1)
    return torch.bmm(p, rows[:, :, :MLA_DIM_V]).view(batch, s_q, hq, MLA_DIM_V)


# ---------------------------------------------------------------------------------------------
# inputs

def _lens(spec, append=False):
    """int32 [B] on the CPU (moved to the device by the caller): fixed seed, device-independent."""
    g = torch.Generator().manual_seed(SEED + 1)
    if append:
        return torch.randint(0, spec.capacity, (spec.batch,), generator=g, dtype=torch.int32)
    if spec.varlen:
        return torch.randint(1, spec.capacity + 1, (spec.batch,), generator=g, dtype=torch.int32)
    return torch.full((spec.batch,), spec.capacity, dtype=torch.int32)


def _block_table(batch, blocks):
    """int32 [batch, blocks] on the CPU: a fixed-seed random permutation of all batch · blocks pages."""
    g = torch.Generator().manual_seed(SEED + 2)
    return torch.randperm(batch * blocks, generator=g).view(batch, blocks).to(torch.int32)


def _randn(shape, dtype, device, g):
    return torch.randn(shape, dtype=dtype, device=device, generator=g)


def decode_inputs(spec, dtype, device):
    """q, caches, lens (and block table, masks) for one decode shape on `device`."""
    if spec.page is not None and spec.capacity % spec.page:
        raise ValueError("shapes: T=%d is not a multiple of the block size %d" % (spec.capacity, spec.page))
    g = torch.Generator(device=device).manual_seed(SEED)
    lens_cpu = _lens(spec)
    inp = {"q": _randn((spec.batch, spec.hq, spec.head_dim), dtype, device, g),
           "lens": lens_cpu.to(device), "kv_tokens": int(lens_cpu.sum())}
    if spec.page is None:
        shape = (spec.batch, spec.hkv, spec.capacity, spec.head_dim)
        inp["k"], inp["v"] = _randn(shape, dtype, device, g), _randn(shape, dtype, device, g)
    else:
        shape = (spec.batch * spec.capacity // spec.page, spec.page, spec.hkv, spec.head_dim)
        inp["k_pages"], inp["v_pages"] = _randn(shape, dtype, device, g), _randn(shape, dtype, device, g)
        inp["block_table"] = _block_table(spec.batch, spec.capacity // spec.page).to(device)
        # The same tokens in a contiguous HND cache, for the SDPA peer.
        inp["k"] = _pages_to_hnd(inp["k_pages"], inp["block_table"]).contiguous()
        inp["v"] = _pages_to_hnd(inp["v_pages"], inp["block_table"]).contiguous()
    if spec.varlen:
        keep = torch.arange(spec.capacity, device=device)[None, :] < inp["lens"][:, None]
        inp["mask"] = keep[:, None, None, :]
        inp["additive_mask"] = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(
            ~keep, float("-inf"))[:, None, None, :]
    return inp


def prefill_lens(spec):
    """A varlen shape's sequence lengths: uniform in [128, seq], fixed seed (SEED + 3)."""
    g = torch.Generator().manual_seed(SEED + 3)
    return torch.randint(128, spec.seq + 1, (spec.batch,), generator=g).tolist()


def prefill_inputs(spec, dtype, device):
    """Batched q [B, S, Hq, D], k, v [B, S_k, Hkv, D] on `device`, and their [B, H, S, D] views.
    Varlen: packed q [total, Hq, D], k, v [total, Hkv, D] with cu_seqlens, plus what the peers take:
    the same tokens padded into [B, H, S, D] with a boolean mask [B, 1, S, S] (padding keys hidden,
    and the causal triangle), and per-sequence [1, H, L, D] views."""
    g = torch.Generator(device=device).manual_seed(SEED)
    if spec.varlen:
        lens = prefill_lens(spec)
        total, s = sum(lens), spec.seq
        inp = {"q": _randn((total, spec.hq, spec.head_dim), dtype, device, g),
               "k": _randn((total, spec.hkv, spec.head_dim), dtype, device, g),
               "v": _randn((total, spec.hkv, spec.head_dim), dtype, device, g), "lens": lens,
               "cu": torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=device)}
        starts = inp["cu"].tolist()[:-1]
        for n in ("q", "k", "v"):
            t = inp[n]
            padded = torch.zeros((spec.batch, s) + tuple(t.shape[1:]), dtype=dtype, device=device)
            for b, (st, ln) in enumerate(zip(starts, lens)):
                padded[b, :ln] = t[st:st + ln]
            inp[n + "_bhsd"] = padded.transpose(1, 2)
            inp[n + "_seqs"] = [t[st:st + ln].unsqueeze(0).transpose(1, 2) for st, ln in zip(starts, lens)]
        idx = torch.arange(s, device=device)
        keep = idx[None, None, :] < torch.tensor(lens, device=device)[:, None, None]  # [B, 1(q), S(k)]
        if spec.causal:
            keep = keep & (idx[None, :, None] >= idx[None, None, :])
        inp["mask"] = keep[:, None]  # [B, 1, S, S]
        return inp
    seq_k = spec.seq_k or spec.seq
    if spec.page:
        # q packed [B·S, Hq, D] (the varlen form), every sequence S queries over seq_k paged keys; the
        # SDPA peers get the same keys gathered into a contiguous [B, Hkv, seq_k, D] view.
        blocks = -(-seq_k // spec.page)
        inp = {"q": _randn((spec.batch * spec.seq, spec.hq, spec.head_dim), dtype, device, g),
               "k_pages": _randn((spec.batch * blocks, spec.page, spec.hkv, spec.head_dim), dtype, device, g),
               "v_pages": _randn((spec.batch * blocks, spec.page, spec.hkv, spec.head_dim), dtype, device, g),
               "block_table": _block_table(spec.batch, blocks).to(device),
               "cu_q": torch.arange(spec.batch + 1, dtype=torch.int32, device=device) * spec.seq,
               "cu_k": torch.arange(spec.batch + 1, dtype=torch.int32, device=device) * seq_k}
        inp["q_bhsd"] = inp["q"].view(spec.batch, spec.seq, spec.hq, spec.head_dim).transpose(1, 2)
        for n in ("k", "v"):
            inp[n + "_bhsd"] = _pages_to_hnd(inp[n + "_pages"], inp["block_table"])[:, :, :seq_k]
        return inp
    inp = {"q": _randn((spec.batch, spec.seq, spec.hq, spec.head_dim), dtype, device, g),
           "k": _randn((spec.batch, seq_k, spec.hkv, spec.head_dim), dtype, device, g),
           "v": _randn((spec.batch, seq_k, spec.hkv, spec.head_dim), dtype, device, g)}
    for n in ("q", "k", "v"):
        inp[n + "_bhsd"] = inp[n].transpose(1, 2)
    return inp


def mla_inputs(spec, dtype, device):
    """q, the paged latent cache, its block table (a fixed-seed page permutation) and lens = T."""
    g = torch.Generator(device=device).manual_seed(SEED)
    blocks = spec.seq // MLA_PAGE
    inp = {"q": _randn((spec.batch, spec.s_q, spec.hq, MLA_DIM), dtype, device, g),
           "kv_cache": _randn((spec.batch * blocks, MLA_PAGE, 1, MLA_DIM), dtype, device, g),
           "block_table": _block_table(spec.batch, blocks).to(device),
           "lens": torch.full((spec.batch,), spec.seq, dtype=torch.int32, device=device)}
    inp["kv_tokens"] = spec.batch * spec.seq
    return inp


def mla_work(spec, dtype):
    """(latent bytes read, MLA FLOPs) of one shape with every lens[b] = T."""
    s = torch.tensor([], dtype=dtype).element_size()
    seen = sum(max(0, spec.seq - spec.s_q + 1 + i) for i in range(spec.s_q))
    return spec.batch * spec.seq * MLA_DIM * s, 2.0 * spec.hq * (MLA_DIM + MLA_DIM_V) * spec.batch * seen


def _sdpa_with(backend, q, k, v, causal):
    """SDPA under one backend; causal with fewer queries than keys (chunked prefill) is aligned
    bottom-right through torch's causal_lower_right bias, as Fray aligns it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    mask = None
    if causal and q.shape[-2] != k.shape[-2]:
        from torch.nn.attention.bias import causal_lower_right
        mask, causal = causal_lower_right(q.shape[-2], k.shape[-2]), False
    with sdpa_kernel(getattr(SDPBackend, {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                                          "cudnn": "CUDNN_ATTENTION"}[backend])):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)


def prefill_flops(spec):
    """4 Hq D per visible (query, key) pair: QK^T and PV; causal counts the visible triangle only
    (chunked: the q x (s_k - s_q) prefix block plus the triangle)."""
    if spec.varlen:
        lens = prefill_lens(spec)
        pairs = sum(n * (n + 1) / 2 if spec.causal else n * n for n in lens)
        return 4.0 * spec.hq * spec.head_dim * pairs
    sk = spec.seq_k or spec.seq
    pairs = spec.seq * sk
    if spec.causal:
        pairs = spec.seq * (sk - spec.seq) + spec.seq * spec.seq / 2 if sk > spec.seq else spec.seq * spec.seq / 2
    return 4.0 * spec.batch * spec.hq * spec.head_dim * pairs


def append_inputs(spec, dtype, device):
    g = torch.Generator(device=device).manual_seed(SEED)
    inp = {"lens": _lens(spec, append=True).to(device), "bidx": torch.arange(spec.batch, device=device)}
    if spec.page is None:
        shape = (spec.batch, spec.hkv, spec.capacity, spec.head_dim)
    else:
        if spec.capacity % spec.page:
            raise ValueError("shapes: T=%d is not a multiple of the block size %d" % (spec.capacity, spec.page))
        shape = (spec.batch * spec.capacity // spec.page, spec.page, spec.hkv, spec.head_dim)
        inp["block_table"] = _block_table(spec.batch, spec.capacity // spec.page).to(device)
    inp["k_cache"], inp["v_cache"] = _randn(shape, dtype, device, g), _randn(shape, dtype, device, g)
    new = (spec.batch, spec.hkv, spec.head_dim)
    inp["k_new"], inp["v_new"] = _randn(new, dtype, device, g), _randn(new, dtype, device, g)
    return inp


# ---------------------------------------------------------------------------------------------
# impls

def impls(op, spec, inp):
    """{impl name: zero-argument callable} for one shape."""
    out = {}
    if op == "mla_decode":
        q, kv, bt, lens = inp["q"], inp["kv_cache"], inp["block_table"], inp["lens"]
        o = torch.empty(q.shape[:3] + (MLA_DIM_V,), dtype=q.dtype, device=q.device)
        for backend in ("cuda", "triton"):
            out["fray." + backend] = lambda b=backend: fray.mla_decode(q, kv, bt, lens, out=o, backend=b)
        scale = 1.0 / MLA_DIM ** 0.5
        out["torch.eager"] = lambda: eager_mla(q, kv, bt, lens, scale)
        return out
    if op == "prefill_attention":
        o = torch.empty_like(inp["q"])
        kw = {}
        if spec.varlen:
            m = max(inp["lens"])
            kw = dict(cu_seqlens_q=inp["cu"], cu_seqlens_k=inp["cu"], max_seqlen_q=m, max_seqlen_k=m)
        backends = ("cuda", "triton")
        if spec.page:
            kw = dict(cu_seqlens_q=inp["cu_q"], cu_seqlens_k=inp["cu_k"], block_table=inp["block_table"],
                      max_seqlen_q=spec.seq, max_seqlen_k=spec.seq_k or spec.seq)
        k, v = (inp["k_pages"], inp["v_pages"]) if spec.page else (inp["k"], inp["v"])
        for backend in backends:
            out["fray." + backend] = lambda b=backend: fray.prefill_attention(inp["q"], k, v, causal=spec.causal,
                                                                              out=o, backend=b, **kw)
        if spec.varlen:
            out["torch.builtin:padded"] = lambda: F.scaled_dot_product_attention(
                inp["q_bhsd"], inp["k_bhsd"], inp["v_bhsd"], attn_mask=inp["mask"], enable_gqa=True)
            out["torch.builtin:per_sequence"] = lambda: [
                _sdpa_with("flash", q, k, v, spec.causal) for q, k, v in zip(inp["q_seqs"], inp["k_seqs"],
                                                                            inp["v_seqs"])]
            return out
        for backend in SDPA_BACKENDS:
            out["torch.builtin:" + backend] = lambda b=backend: _sdpa_with(
                b, inp["q_bhsd"], inp["k_bhsd"], inp["v_bhsd"], spec.causal)
        return out
    if op in ("decode_attention", "paged_decode_attention"):
        q, lens = inp["q"], inp["lens"]
        q4 = q[:, :, None, :]
        o = torch.empty_like(q)
        mask = inp.get("mask")
        for backend in ("cuda", "triton"):
            if op == "decode_attention":
                out["fray." + backend] = lambda b=backend: fray.decode_attention(
                    q, inp["k"], inp["v"], lens, kv_layout="HND", out=o, backend=b)
            else:
                out["fray." + backend] = lambda b=backend: fray.paged_decode_attention(
                    q, inp["k_pages"], inp["v_pages"], inp["block_table"], lens, out=o, backend=b)
        if op == "decode_attention" and spec.batch == NHD_BATCH and not spec.varlen:
            k_nhd, v_nhd = inp["k"].transpose(1, 2).contiguous(), inp["v"].transpose(1, 2).contiguous()
            for backend in ("cuda", "triton"):
                out["fray.%s:NHD" % backend] = lambda b=backend: fray.decode_attention(
                    q, k_nhd, v_nhd, lens, kv_layout="NHD", out=o, backend=b)
        out["torch.builtin"] = lambda: _sdpa(q4, inp["k"], inp["v"], mask)
        if op == "decode_attention" and spec.varlen:
            out["torch.builtin:additive"] = lambda: _sdpa(q4, inp["k"], inp["v"], inp["additive_mask"])
        if op == "paged_decode_attention":
            out["torch.eager"] = lambda: _eager_paged_sdpa(q4, inp["k_pages"], inp["v_pages"],
                                                           inp["block_table"], mask)
        return out
    kc, vc, kn, vn, lens = (inp[n] for n in ("k_cache", "v_cache", "k_new", "v_new", "lens"))
    for backend in ("cuda", "triton"):
        if op == "kv_append":
            out["fray." + backend] = lambda b=backend: fray.kv_append(kc, vc, kn, vn, lens, kv_layout="HND",
                                                                      backend=b)
        else:
            out["fray." + backend] = lambda b=backend: fray.kv_append_paged(kc, vc, inp["block_table"], kn, vn,
                                                                            lens, backend=b)
    if op == "kv_append":
        out["torch.eager"] = lambda: _eager_append(kc, vc, kn, vn, inp["bidx"], lens)
    else:
        out["torch.eager"] = lambda: _eager_append_paged(kc, vc, inp["block_table"], kn, vn, inp["bidx"], lens)
    return out


def nbytes(op, spec, dtype, inp):
    """(bytes for gbps, extra record fields)."""
    s = torch.tensor([], dtype=dtype).element_size()
    if op in ("kv_append", "kv_append_paged"):
        return 4 * spec.batch * spec.hkv * spec.head_dim * s, {}
    row = spec.hkv * spec.head_dim * s
    extra = {}
    if spec.varlen:
        extra = {"kv_tokens": inp["kv_tokens"], "padded_bytes": 2 * spec.batch * spec.capacity * row}
    return 2 * inp["kv_tokens"] * row, extra


def _notes(op, spec):
    if op == "mla_decode":
        return ("lens = T; block size %d, block table a random page permutation seed %d; default scale; fray out "
                "preallocated; gbps: latent bytes read, tflops: 2 Hq (576 + 512) per visible token"
                % (MLA_PAGE, SEED + 2))
    if op == "prefill_attention":
        kind = "causal (masked pairs not counted)" if spec.causal else "non-causal"
        if spec.varlen:
            return ("varlen: %d sequences, lengths uniform in [128, %d] seed %d (%s), packed; %s; default scale; "
                    "torch.builtin:padded = SDPA on the zero-padded [B, H, S, D] batch with a boolean mask, "
                    ":per_sequence = SDPA flash once per sequence" % (spec.batch, spec.seq, SEED + 3,
                                                                      ",".join(map(str, prefill_lens(spec))), kind))
        chunk = (" chunked: %d queries as the last positions of %d keys (SDPA with causal_lower_right);"
                 % (spec.seq, spec.seq_k)) if spec.seq_k else ""
        if spec.page:
            return ("paged: q packed [B·S, Hq, D] with cu_seqlens, the keys in P%d NHD pages behind a random page "
                    "permutation seed %d (block_table), %s;%s default scale; fray out preallocated; SDPA on the keys "
                    "gathered into [B, H, S, D] (outside the timing)" % (spec.page, SEED + 2, kind, chunk))
        return "batched [B, S, H, D], %s;%s default scale; fray out preallocated; SDPA on [B, H, S, D] views" % (
            kind, chunk)
    if op in ("kv_append", "kv_append_paged"):
        return "cache T=%d %s; lens uniform in [0, T) seed %d" % (
            spec.capacity, "P%d pages" % spec.page if spec.page else "HND", SEED + 1)
    lens = "lens uniform in [1, T] seed %d" % (SEED + 1) if spec.varlen else "lens = T"
    pages = "; block table a random page permutation seed %d" % (SEED + 2) if spec.page else ""
    return "%s%s; default scale; fray out preallocated" % (lens, pages)


def run(op, recorder, shapes=None, graph=True, device="cuda"):
    if op not in SHAPES:
        raise ValueError("op: expected one of %s, got %r" % (", ".join(OPS), op))
    from fray import bench
    for spec, dtype in shapes or SHAPES[op]:
        if isinstance(spec, Mla):
            inp = mla_inputs(spec, dtype, device)
            fns = impls(op, spec, inp)
            n, flops = mla_work(spec, dtype)
            bench.bench_impls(recorder, op, shape_name(spec), dtype, fns, n, flops, graph=graph,
                              notes=_notes(op, spec), kv_tokens=inp["kv_tokens"])
            del fns, inp
            if device == "cuda":
                torch.cuda.empty_cache()
            continue
        if isinstance(spec, Prefill):
            inp = prefill_inputs(spec, dtype, device)
            fns = impls(op, spec, inp)
            bench.bench_impls(recorder, op, shape_name(spec), dtype, fns, None, prefill_flops(spec), graph=graph,
                              notes=_notes(op, spec))
            del fns, inp
            if device == "cuda":
                torch.cuda.empty_cache()
            continue
        maker = append_inputs if isinstance(spec, Append) else decode_inputs
        inp = maker(spec, dtype, device)
        n, extra = nbytes(op, spec, dtype, inp)
        fns = impls(op, spec, inp)
        bench.bench_impls(recorder, op, shape_name(spec), dtype, fns, n, graph=graph, notes=_notes(op, spec),
                          **extra)
        del fns, inp
        if device == "cuda":
            torch.cuda.empty_cache()
