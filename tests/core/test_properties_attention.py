"""Property-based tests (hypothesis) of the attention family's and rope's Triton kernels under
Triton's CPU interpreter against the float64 references: rope, kv_append, kv_append_paged,
decode_attention, paged_decode_attention, prefill_attention (varlen, batched and paged) and
mla_decode.

Shapes are drawn small (the interpreter runs every program in Python) but off every tile: batch
1-3, GQA groups 1-16 (3, 5, 7 included), every head dim the kernels take, lengths of 0, 1, odd
ones, the capacity itself and non-multiples of the 16 / 32 / 64-token tiles and of the pages,
every page size, shuffled block tables, split counts 1-6 and the host heuristic (splits that
start past lens included), lens below 0 and above T where the kernels clamp them, strided views
of larger buffers (heads, tokens and rows wider than the data, K and V interleaved in one
buffer) and every dtype.
Values are N(0, 1) * 10^e with e per tensor, +-0, subnormals and ties (repeated keys, zero
queries: equal scores) sprinkled in; rope also takes inf, -inf, NaN, +-1e30 and the dtype's
largest value. Attention scores are kept within the range where fp32 softmax math can meet the
dtype's tolerance (the score sums' rounding grows with their terms).

Oracles, the ops' documented rules:
  rope: the float64 reference rounded once to the dtype, within fray.testing's tolerance of the
    dtype relative to max(|expected|, |a c| + |b s|) (a rotated value is a difference that can
    cancel), with NaN where the reference has NaN and the same infinities; the dims past
    rotary_dim pass through bit for bit.
  kv_append(_paged): the reference's writes bit for bit (NaN payloads included) and nothing else:
    the whole buffers holding the caches, K and V alike, equal the expected ones bitwise; a
    position outside [0, T) writes nothing.
  decode, paged decode, prefill, MLA: out within the dtype's tolerance relative to the reference's
    magnitude sum_t p_t |v_t| (fray.testing.assert_close's scale; fp16 adds the kernels' rounding
    of p for P @ V, see _out_scale), lse -inf exactly on the rows that see nothing and elsewhere
    within fp32's tolerance relative to the score terms scale * max_t sum_i |q_i| |k_ti|. What
    lies past lens[b] (cache rows, block-table entries, pages: NaN, inf, 1e30, entries outside the
    pool) and past cu_seqlens is never read, and nothing outside out / lse is written.
Under the interpreter the kernels convert bf16 subnormals to zeros of their sign when they load
them (tests/core/test_properties.py holds it); the GPU converts them exactly: the oracles take the
inputs as the kernel sees them on each device (sees()).

Each property is one body taking (device, backend), run by a CPU test (test_triton_*: the Triton
kernels under the interpreter, the CI profile "ci", derandomised: the same examples on every run)
and by a GPU test per backend (test_gpu_*, marked gpu, failing where torch sees no CUDA device;
"triton": the same kernel entry points compiled, "cuda": the public op with backend="cuda"; the
derandomised profile "gpu"), as in tests/core/test_properties.py. With backend="cuda" the ops
write out and return lse as the public API does (what the test compares is copied into its
buffers), outputs written around the views are then checked for out only, and the draws stay
inside what the CUDA kernels take, as their docstrings give it: decode and paged decode caches
with 16-byte aligned strides (their padding in 16-byte units), prefill and mla_decode bf16 with
strides multiples of 8 elements and even out strides (JIT: one nvcc translation unit per dtype,
head dim, causal and block size, seconds to minutes each, so the GPU examples keep to D 128 and
pages of 16 / 32 keys for prefill, pages of 64 for MLA: a few translation units in all).
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fray.reference import attention as ref
from fray.reference import rope as rrope
from fray.testing import TOLERANCES, assert_close

from property_support import gpu, interpreter_load, on, sees, triton_mode

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---------------------------------------------------------------------------------------------
# where a property runs

@pytest.fixture(autouse=True)
def _triton_mode(request, monkeypatch):
    triton_mode(request, monkeypatch)


def _fray():
    import fray
    return fray


# ---------------------------------------------------------------------------------------------
# inputs

def _specials(dtype):
    fi = torch.finfo(dtype)
    return [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e30, -1e30, fi.max, -fi.max,
            fi.tiny / 4, -fi.tiny / 4, fi.tiny, 1.0, -1.0]


def _finite_specials(dtype, exp):
    """What may sit among the attended values of a tensor of N(0, 1) * 10^exp: signed zeros,
    subnormals, +-10^exp (not larger: a score's size is what the exponents bound)."""
    fi = torch.finfo(dtype)
    return [0.0, -0.0, fi.tiny / 4, -fi.tiny / 4, fi.tiny, 10.0 ** exp, -10.0 ** exp]


GARBAGE = (float("nan"), float("inf"), float("-inf"), 1e30)


def _f64(x, load):
    """x as the kernel sees it (load: sees(device)), in float64."""
    return load(x).double()


def _generator(data):
    return torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1), label="seed"))


def _values(data, g, shape, exp, pool, most=8):
    """float64 N(0, 1) * 10^exp of `shape` with up to `most` values of `pool` at drawn places."""
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 10.0 ** exp
    flat = x.view(-1)
    for _ in range(data.draw(st.integers(0, min(flat.numel(), most)))):
        flat[data.draw(st.integers(0, flat.numel() - 1))] = pool[data.draw(st.integers(0, len(pool) - 1))]
    return x


def _bits(t):
    return t.contiguous().view(_BITS[t.element_size()])


def _same_bits(got, want, what):
    assert got.shape == want.shape and got.dtype == want.dtype, what
    g, w = _bits(got), _bits(want)
    if not torch.equal(g, w):
        i = tuple(int(j) for j in (g != w).nonzero()[0])
        raise AssertionError("%s: %d elements differ bitwise; first at %s: %r, expected %r"
                             % (what, int((g != w).sum()), i, float(got[i]), float(want[i])))


def _sentinel(shape, dtype):
    """An output buffer of NaN: whatever the kernel does not write keeps these bits."""
    return torch.full(shape, float("nan"), dtype=dtype)


def _filled(shape, value, dtype):
    """torch.full of a value the dtype may round to inf (1e30 in fp16)."""
    return torch.full(shape, value, dtype=torch.float64).to(dtype)


def _pad(data, most=3, unit=1):
    """0..most units of padding (unit: elements, e.g. those of 16 bytes where a kernel needs aligned
    strides)."""
    return data.draw(st.integers(0, most)) * unit


def _score_exponents(data, dtype, top=None):
    """(e_q, e_k) in [-3, 3]: q and k as N(0, 1) * 10^e each, e_q + e_k in [-6, top] (per dtype:
    fp32 softmax math meets fp32's 1e-5 only for scores of a few units, the 16-bit tolerances
    for larger ones)."""
    if top is None:
        top = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dtype]
    total = data.draw(st.integers(-6, top), label="e_q + e_k")
    eq = data.draw(st.integers(max(-3, total - 3), min(3, total + 3)), label="e_q")
    return eq, total - eq


def _value_exponent(data, dtype):
    return data.draw(st.integers(-1, 3) if dtype == torch.float16 else st.integers(-1, 20), label="e_v")


def _lens_tensor(data, lens, capacity):
    """int32 lens for a kernel that clamps lens[b] to [0, T]: a 0 may be passed as a negative
    value and a T as a larger one (outside the trust boundary, read as 0 and T)."""
    out = []
    for n in lens:
        if n == 0 and data.draw(st.booleans(), label="lens below 0"):
            n = data.draw(st.sampled_from((-1, -100, -2 ** 31)))
        elif n == capacity and data.draw(st.booleans(), label="lens above T"):
            n = data.draw(st.sampled_from((capacity + 1, capacity + 64, 2 ** 31 - 1)))
        out.append(n)
    return torch.tensor(out, dtype=torch.int32)


def _out_scale(mag, vsum, dtype):
    """The `scale` of an attention output for assert_close: the reference's magnitude
    sum_t p_t |v_t|, and for fp16 the rounding of p for P @ V. The kernels round p = exp(s - the
    running max) <= 1 to the cache dtype for that product, as flash kernels do; below 2^-14 fp16's
    spacing is 2^-24, so a term p_t v_t may be off by 2^-25 |v_t| however small p_t is (bf16 keeps
    8 bits down to 1e-38): out may be off by up to 2^-25 sum_t |v_t| (vsum) beyond the dtype's
    tolerance of the magnitude, which shows where a key dominates with v = 0 and the others have
    p < 2^-14. A term of 2^-15 sum_t |v_t| in the scale is that bound."""
    mag = torch.as_tensor(np.asarray(mag))
    if dtype != torch.float16:
        return mag
    return mag + 2.0 ** -25 / TOLERANCES[dtype]["rtol"] * vsum


def _check_lse(lse, el, terms, what):
    """lse: -inf exactly where the reference has it (nothing seen), elsewhere within fp32's
    tolerance relative to max(|lse|, the score terms)."""
    lse, el, terms = lse.detach().cpu().double(), torch.as_tensor(np.asarray(el)), torch.as_tensor(np.asarray(terms))
    empty = torch.isinf(el) & (el < 0)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "%s: the lse -inf rows differ" % what
    assert_close(lse[~empty], el[~empty], torch.float32, what + " lse", scale=terms[~empty])


def _terms(q64, k64, scale, visible=None):
    """scale * max over the visible keys of sum_i |q_i| |k_ji|: q64 [n_q, D], k64 [n_k, D]; 0 where
    nothing is visible."""
    t = scale * (q64.abs() @ k64.abs().T)
    if visible is not None:
        t = torch.where(visible, t, torch.zeros_like(t))
    return t.max(dim=1).values if t.shape[1] else torch.zeros(t.shape[0], dtype=torch.float64)


# ---------------------------------------------------------------------------------------------
# rope

def _rope_property(data, device, backend):
    """rope: any token count (1-40), q heads 1-5, k heads 0-3 (none: k None), head
    dims 2-256 (odd ones with a shorter even rotary_dim), both styles, positions as an int32 /
    int64 tensor (strided) or an offset, the built-in table, a table of random values or a
    (cos, sin) pair, q and k as views into one fused qkv buffer with padding, in place or into
    views of NaN-filled output buffers; all values of every dtype. Backend "triton":
    fray_triton.rope; "cuda": fray.rope (the built-in table built from theta on the device; out
    of place into new tensors, copied into the output views)."""
    from fray.ops import rope as orope
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    tokens = data.draw(st.one_of(st.integers(1, 6), st.integers(7, 40)), label="tokens")
    hq = data.draw(st.integers(1, 5), label="hq")
    hk = data.draw(st.integers(0, 3), label="hk")
    d = data.draw(st.sampled_from((2, 3, 7, 12, 64, 80, 128, 256)), label="head_dim")
    rd = data.draw(st.integers(1, d // 2), label="rotary_dim / 2") * 2
    neox = data.draw(st.booleans(), label="neox")
    inplace = data.draw(st.booleans(), label="inplace")
    max_position = data.draw(st.integers(tokens, 300), label="max_position")
    g = _generator(data)
    lo, hi = (-2, 4) if dtype == torch.float16 else (-2, 30)
    # q, k and v of a fused qkv projection, rows wider than the data
    width = (hq + 2 * hk) * d + _pad(data)
    qkv = torch.empty(tokens, width, dtype=dtype)
    qkv.copy_(_values(data, g, (tokens, width), data.draw(st.integers(lo, hi), label="e"), _specials(dtype), 16))
    q = qkv[:, :hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d:(hq + hk) * d].view(tokens, hk, d) if hk else None
    before = qkv.clone()
    # positions
    kind = data.draw(st.sampled_from(("int32", "int64", "strided", "offset")), label="positions")
    if kind == "offset":
        offset = data.draw(st.integers(0, max_position - tokens), label="offset")
        positions, pos = None, offset + torch.arange(tokens)
    else:
        offset = 0
        pos = torch.randint(0, max_position, (tokens,), generator=g)
        if data.draw(st.booleans()):
            pos[data.draw(st.integers(0, tokens - 1))] = max_position - 1
        if kind == "strided":
            positions = torch.zeros(2 * tokens, dtype=torch.int64)[::2]
            positions.copy_(pos)
        else:
            positions = pos.to(torch.int32 if kind == "int32" else torch.int64)
    # the cos / sin table
    half = rd // 2
    table_kind = data.draw(st.sampled_from(("builtin", "random", "pair")), label="table")
    if table_kind == "builtin":
        theta = data.draw(st.sampled_from((10000.0, 500.0, 1e6)))
        table = orope.cos_sin_cache(max_position, rd, theta, "cpu")
        cos, sin = table[:, :half], table[:, half:]
    else:  # a passed table (scaled variants): any values in [-1, 1]
        table = (torch.rand(max_position, rd, generator=g) * 2 - 1).float()
        cos, sin = table[:, :half], table[:, half:]
        if table_kind == "pair":
            cos, sin = cos.contiguous(), sin.contiguous()
    cs_stride = cos.stride(0)
    if inplace:
        q_out, k_out = q, k
    else:
        obuf = _sentinel((tokens + 1, (hq + hk) * d + 5), dtype)
        q_out = obuf[:tokens, :hq * d].view(tokens, hq, d)
        k_out = obuf[:tokens, hq * d:(hq + hk) * d].view(tokens, hk, d) if hk else None
        obefore = obuf.clone()
    style = "neox" if neox else "gptj"

    def launch(q, k, q_out, k_out, positions, table, cos, sin):
        if backend == "triton":
            from fray_triton import rope as trope
            trope.rope(q, k, q_out, k_out, positions, offset, cos, sin, cs_stride, rd, neox)
            return
        cache = {"builtin": None, "random": table, "pair": (cos, sin)}[table_kind]
        got_q, got_k = _fray().rope(q, k, offset if positions is None else positions, max_position=max_position,
                                    cos_sin_cache=cache, theta=theta if cache is None else 10000.0, rotary_dim=rd,
                                    style=style, inplace=inplace, backend=backend)
        if not inplace:
            q_out.copy_(got_q)
            if k_out is not None:
                k_out.copy_(got_k)
    on(device, launch, q, k, q_out, k_out, positions, table, cos, sin)
    c64, s64 = cos.double(), sin.double()
    load = sees(device)
    for name, x, xo in (("q", before[:, :hq * d].view(tokens, hq, d), q_out),
                        ("k", before[:, hq * d:(hq + hk) * d].view(tokens, hk, d), k_out)):
        if xo is None:
            continue
        x64 = _f64(x, load)
        want = rrope.rope(x64, pos, c64, s64, style)
        # the terms of each rotated value: |a c| + |b s|
        terms = x64.abs()
        first, second = (slice(0, half), slice(half, rd)) if neox else (slice(0, rd, 2), slice(1, rd, 2))
        a, b = x64[..., first].abs(), x64[..., second].abs()
        cc, ss = c64[pos][:, None].abs(), s64[pos][:, None].abs()
        terms[..., first], terms[..., second] = a * cc + b * ss, b * cc + a * ss
        _special_close(xo[..., :rd], want[..., :rd], dtype, terms[..., :rd], "rope %s %s" % (name, style))
        _same_bits(xo[..., rd:], x[..., rd:], "rope %s: the dims past rotary_dim" % name)
    if inplace:  # v, the padding and the dims past rotary_dim keep their bits
        rest = before.clone()
        rest[:, :(hq + hk) * d] = qkv[:, :(hq + hk) * d]
        _same_bits(qkv, rest, "rope in place: outside q and k")
    else:
        _same_bits(qkv, before, "rope: the input")
        rest = obefore.clone()
        rest[:tokens, :(hq + hk) * d] = obuf[:tokens, :(hq + hk) * d]
        _same_bits(obuf, rest, "rope: the output buffer outside q_out, k_out")


@settings(max_examples=20)
@given(data=st.data())
def test_triton_rope_matches_its_oracle(data):
    _rope_property(data, "cpu", "triton")


@gpu(max_examples=50)
def test_gpu_rope_matches_its_oracle(backend, data):
    _rope_property(data, "cuda", backend)


def _special_close(got, want64, dtype, terms, what):
    """got vs the float64 reference rounded to dtype: NaN where it is NaN, the same infinities,
    finite values within the dtype's tolerance relative to max(|expected|, terms)."""
    want = want64.to(dtype).to(torch.float64)
    got = got.to(torch.float64)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "%s: NaN positions differ (%d vs %d)" % (
        what, int(torch.isnan(got).sum()), int(nan.sum()))
    tol = TOLERANCES[dtype]
    bound = tol["atol"] + tol["rtol"] * torch.maximum(want.abs(), terms.nan_to_num(0.0, 0.0, 0.0))
    err = (got - want).abs()
    bad = ~nan & ~((err <= bound) | (got == want))
    assert not bad.any(), "%s: %d elements off; first %r vs %r" % (
        what, int(bad.sum()), float(got[bad][0]), float(want[bad][0]))


# ---------------------------------------------------------------------------------------------
# kv_append, kv_append_paged

def _positions(data, capacity, batch):
    """Append positions: the first slot, the last, any, and some outside [0, T) (not written)."""
    return [data.draw(st.one_of(st.just(0), st.just(capacity - 1), st.integers(0, capacity - 1),
                                st.sampled_from((-1, -5, capacity, capacity + 3, 2 ** 31 - 1))), label="pos")
            for _ in range(batch)]


def _new_rows(data, g, dtype, batch, hkv, d):
    """k_new / v_new [B, Hkv, D] as views of wider rows, every value of the dtype."""
    ph, pd = _pad(data), _pad(data)
    out = []
    for _ in range(2):
        big = _values(data, g, (batch, hkv + ph, d + pd), data.draw(st.integers(-30, 30)), _specials(dtype)).to(dtype)
        out.append(big[:, :hkv, :d])
    return out


def _kv_append_property(data, device, backend):
    """kv_append into contiguous caches, HND or NHD, as views of larger buffers (K and V apart or
    interleaved in one buffer), any head dim (1 included: append takes any D), positions anywhere
    in [0, T) and outside it. Backend "triton": fray_triton.attention.append; "cuda":
    fray.kv_append."""
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    layout = data.draw(st.sampled_from(("HND", "NHD")), label="layout")
    batch, hkv = data.draw(st.integers(1, 3), label="batch"), data.draw(st.integers(1, 4), label="hkv")
    d = data.draw(st.sampled_from((1, 3, 40, 64, 128, 256)), label="d")
    cap = data.draw(st.one_of(st.integers(1, 8), st.integers(9, 70)), label="T")
    shared = data.draw(st.booleans(), label="K and V in one buffer")
    ph, pt, pd = _pad(data), _pad(data), _pad(data)
    g = _generator(data)
    h0, t0 = data.draw(st.integers(0, ph)), data.draw(st.integers(0, pt))
    hnd = layout == "HND"
    inner = (hkv + ph, cap + pt) if hnd else (cap + pt, hkv + ph)
    shape = (batch,) + ((2,) if shared else ()) + inner + (d + pd,)
    n = 1 if shared else 2
    bufs = [_values(data, g, shape, 0, _specials(dtype)).to(dtype) for _ in range(n)]

    def views(bs):
        kb, vb = (bs[0][:, 0], bs[0][:, 1]) if shared else (bs[0], bs[1])
        if hnd:
            return kb[:, h0:h0 + hkv, t0:t0 + cap, :d], vb[:, h0:h0 + hkv, t0:t0 + cap, :d]
        return kb[:, t0:t0 + cap, h0:h0 + hkv, :d], vb[:, t0:t0 + cap, h0:h0 + hkv, :d]

    kc, vc = views(bufs)
    kn, vn = _new_rows(data, g, dtype, batch, hkv, d)
    pos = _positions(data, cap, batch)
    lens = torch.tensor(pos, dtype=torch.int32)
    want = [b.clone() for b in bufs]
    ek, ev = views(want)
    for b, p in enumerate(pos):
        if 0 <= p < cap:
            ref.kv_append(ek[b:b + 1], ev[b:b + 1], kn[b:b + 1], vn[b:b + 1], [p], layout)
    new_before = (kn.clone(), vn.clone())
    dims = (0, 1, 2) if hnd else (0, 2, 1)

    def launch(kc, vc, kn, vn, lens):
        if backend == "triton":
            from fray_triton import attention as tattn
            tattn.append(kc, vc, kn, vn, lens, None, k_strides=tuple(kc.stride(i) for i in dims),
                         v_strides=tuple(vc.stride(i) for i in dims), bt_stride=0, capacity=cap, page_size=1)
        else:
            _fray().kv_append(kc, vc, kn, vn, lens, kv_layout=layout, backend=backend)
    on(device, launch, kc, vc, kn, vn, lens)
    for i, (got, exp) in enumerate(zip(bufs, want)):
        _same_bits(got, exp, "kv_append %s pos=%s: buffer %d" % (layout, pos, i))
    _same_bits(kn, new_before[0], "kv_append: k_new")
    _same_bits(vn, new_before[1], "kv_append: v_new")
    assert lens.tolist() == pos


@settings(max_examples=20)
@given(data=st.data())
def test_triton_kv_append_matches_its_oracle(data):
    _kv_append_property(data, "cpu", "triton")


@gpu(max_examples=60)
def test_gpu_kv_append_matches_its_oracle(backend, data):
    _kv_append_property(data, "cuda", backend)


def _kv_append_paged_property(data, device, backend):
    """kv_append_paged into NHD pages of every block size through a shuffled block table whose
    other entries are garbage (only the entry of lens[b] is read), pages as views of a larger pool
    (K and V apart or interleaved), positions anywhere in [0, T) and outside it. Backend "triton":
    fray_triton.attention.append; "cuda": fray.kv_append_paged."""
    from fray.ops import attention as A
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    batch, hkv = data.draw(st.integers(1, 3), label="batch"), data.draw(st.integers(1, 4), label="hkv")
    d = data.draw(st.sampled_from((1, 3, 40, 64, 128)), label="d")
    page = data.draw(st.sampled_from(A.PAGE_SIZES), label="page")
    max_blocks = data.draw(st.integers(1, 4 if page >= 32 else 6), label="max_blocks")
    cap = max_blocks * page
    spare = data.draw(st.integers(0, 3))
    num_blocks = batch * max_blocks + spare
    shared = data.draw(st.booleans(), label="K and V in one buffer")
    ph, pd = _pad(data), _pad(data)
    g = _generator(data)
    shape = (num_blocks, page) + ((2,) if shared else ()) + (hkv + ph, d + pd)
    bufs = [_values(data, g, shape, 0, _specials(dtype)).to(dtype) for _ in range(1 if shared else 2)]

    def views(bs):
        if shared:
            return bs[0][:, :, 0, :hkv, :d], bs[0][:, :, 1, :hkv, :d]
        return bs[0][:, :, :hkv, :d], bs[1][:, :, :hkv, :d]

    kp, vp = views(bufs)
    bt = torch.randperm(num_blocks, generator=g)[:batch * max_blocks].view(batch, max_blocks).to(torch.int32)
    pos = _positions(data, cap, batch)
    bt_pad = _pad(data)
    bt_full = torch.full((batch, max_blocks + bt_pad), -9, dtype=torch.int32)
    for b, p in enumerate(pos):  # only the entry holding lens[b] is real
        for j in range(max_blocks):
            if not (0 <= p < cap and j == p // page):
                bt[b, j] = data.draw(st.sampled_from((-7, num_blocks, 10 ** 6, int(bt[b, j]))))
    bt_full[:, :max_blocks] = bt
    bt_view = bt_full[:, :max_blocks]
    kn, vn = _new_rows(data, g, dtype, batch, hkv, d)
    lens = torch.tensor(pos, dtype=torch.int32)
    want = [b.clone() for b in bufs]
    ek, ev = views(want)
    for b, p in enumerate(pos):
        if 0 <= p < cap:
            ref.kv_append_paged(ek, ev, bt[b:b + 1], kn[b:b + 1], vn[b:b + 1], [p])

    def launch(kp, vp, kn, vn, lens, bt_view):
        if backend == "triton":
            from fray_triton import attention as tattn
            tattn.append(kp, vp, kn, vn, lens, bt_view, k_strides=(kp.stride(0), kp.stride(2), kp.stride(1)),
                         v_strides=(vp.stride(0), vp.stride(2), vp.stride(1)), bt_stride=bt_view.stride(0),
                         capacity=cap, page_size=page)
        else:
            _fray().kv_append_paged(kp, vp, bt_view, kn, vn, lens, backend=backend)
    on(device, launch, kp, vp, kn, vn, lens, bt_view)
    for i, (got, exp) in enumerate(zip(bufs, want)):
        _same_bits(got, exp, "kv_append_paged page=%d pos=%s: buffer %d" % (page, pos, i))


@settings(max_examples=20)
@given(data=st.data())
def test_triton_kv_append_paged_matches_its_oracle(data):
    _kv_append_paged_property(data, "cpu", "triton")


@gpu(max_examples=60)
def test_gpu_kv_append_paged_matches_its_oracle(backend, data):
    _kv_append_paged_property(data, "cuda", backend)


# ---------------------------------------------------------------------------------------------
# decode_attention, paged_decode_attention

def _ties(data, q, k):
    """Equal scores: some query heads all zero (every score 0), or some key positions copies of
    another (the same score twice). q [B, Hq, D], k [B, T, Hkv, D] float64, changed in place."""
    kind = data.draw(st.sampled_from(("none", "zero q", "repeated keys")), label="ties")
    if kind == "zero q":
        for _ in range(data.draw(st.integers(1, 3))):
            b, h = data.draw(st.integers(0, q.shape[0] - 1)), data.draw(st.integers(0, q.shape[1] - 1))
            q[b, h] = data.draw(st.sampled_from((0.0, -0.0)))
    elif kind == "repeated keys" and k.shape[1] > 1:
        src = data.draw(st.integers(0, k.shape[1] - 1))
        for _ in range(data.draw(st.integers(1, 4))):
            k[:, data.draw(st.integers(0, k.shape[1] - 1))] = k[:, src]


def _decode_inputs(data, paged):
    """Everything a decode launch takes, drawn; the caches hold the tokens below lens[b] and
    garbage everywhere else."""
    from fray.ops import attention as A
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    batch = data.draw(st.integers(1, 3), label="batch")
    hkv = data.draw(st.integers(1, 3), label="hkv")
    group = data.draw(st.sampled_from((1, 2, 3, 4, 5, 7, 8, 16)), label="group")
    hq = hkv * group
    d = data.draw(st.sampled_from((64, 64, 64, 128, 256)), label="d")
    if paged:
        page = data.draw(st.sampled_from(A.PAGE_SIZES), label="page")
        max_blocks = data.draw(st.integers(1, max(1, 96 // page)), label="max_blocks")
        cap = max_blocks * page
    else:
        page, cap = 1, data.draw(st.one_of(st.integers(1, 20), st.integers(21, 100)), label="T")
    lens = [data.draw(st.one_of(st.just(0), st.just(cap), st.integers(1, cap)), label="lens") for _ in range(batch)]
    g = _generator(data)
    eq, ek = _score_exponents(data, dtype)
    ev = _value_exponent(data, dtype)
    q64 = _values(data, g, (batch, hq, d), eq, _finite_specials(dtype, eq))
    k64 = _values(data, g, (batch, cap, hkv, d), ek, _finite_specials(dtype, ek))   # [B, T, Hkv, D]
    v64 = _values(data, g, (batch, cap, hkv, d), ev, _finite_specials(dtype, ev))
    _ties(data, q64, k64)
    garbage = data.draw(st.sampled_from(GARBAGE), label="past lens")
    pq, pdq = _pad(data), _pad(data)
    q = _filled((batch, hq + pq, d + pdq), garbage, dtype)[:, :hq, :d]
    q.copy_(q64)
    return dtype, batch, hkv, hq, d, page, cap, lens, q, k64, v64, garbage


def _run_decode(data, device, backend, q, k, v, lens, bt, k_strides, v_strides, hkv, cap, page, scale, layout):
    """One decode launch (backend "triton": fray_triton.attention.decode; "cuda":
    fray.decode_attention, or fray.paged_decode_attention with a block table) into views of NaN
    buffers; checks that the inputs keep their bits and nothing outside out and lse is written."""
    batch, hq, d = q.shape
    po, pl = _pad(data), _pad(data)
    obuf = _sentinel((batch, hq + po, d + 1), q.dtype)
    lbuf = _sentinel((batch, hq + pl), torch.float32)
    out, lse = obuf[:, :hq, :d], lbuf[:, :hq]
    splits = data.draw(st.one_of(st.none(), st.integers(1, 6)), label="num_splits")
    block_n = data.draw(st.sampled_from((16, 32, 64)), label="block_n")
    num_sms = data.draw(st.sampled_from((1, 4, 132)), label="num_sms")
    ins = [t.clone() for t in (q, k, v)]

    def launch(q, k, v, lens, bt, out, lse):
        if backend == "triton":
            from fray_triton import attention as tattn
            tattn.decode(q, k, v, lens, bt, out, lse, scale, q_strides=q.stride()[:2], k_strides=k_strides,
                         v_strides=v_strides, bt_stride=bt.stride(0) if bt is not None else 0,
                         out_strides=out.stride()[:2], lse_stride=lse.stride(0), n_kv_heads=hkv, capacity=cap,
                         page_size=page, num_splits=splits, num_sms=num_sms, block_n=block_n)
            return
        if bt is None:
            _, got = _fray().decode_attention(q, k, v, lens, kv_layout=layout, scale=scale, out=out, return_lse=True,
                                              num_splits=splits, backend=backend)
        else:
            _, got = _fray().paged_decode_attention(q, k, v, bt, lens, scale=scale, out=out, return_lse=True,
                                                    num_splits=splits, backend=backend)
        lse.copy_(got)
    on(device, launch, q, k, v, lens, bt, out, lse)
    for t, before, name in zip((q, k, v), ins, ("q", "k", "v")):
        _same_bits(t, before, "decode: %s" % name)
    rest_o, rest_l = obuf.clone(), lbuf.clone()
    rest_o[:, :hq, :d], rest_l[:, :hq] = float("nan"), float("nan")
    _same_bits(rest_o, _sentinel(obuf.shape, q.dtype), "decode: out's buffer outside out")
    _same_bits(rest_l, _sentinel(lbuf.shape, torch.float32), "decode: lse's buffer outside lse")
    return out, lse, "splits=%s" % splits + (" block_n=%d" % block_n if backend == "triton" else "")


def _decode_oracle(q, k_nhd, v_nhd, lens, scale, load):
    """(out, lse, magnitude, score terms, sum_t |v_t|) of the reference over [B, T, Hkv, D]
    caches, the inputs as the kernel sees them (load)."""
    q64, k64, v64 = _f64(q, load), _f64(k_nhd, load), _f64(v_nhd, load)
    e, el, mag = ref.decode_attention(q64, k64, v64, lens, scale, "NHD")
    hq, hkv = q.shape[1], k_nhd.shape[2]
    terms = torch.zeros(el.shape, dtype=torch.float64)
    vsum = torch.zeros(e.shape, dtype=torch.float64)
    for b, n in enumerate(lens):
        for h in range(hq):
            terms[b, h] = _terms(q64[b, h:h + 1], k64[b, :n, h // (hq // hkv)], scale)[0]
            vsum[b, h] = v64[b, :n, h // (hq // hkv)].abs().sum(0)
    return e, el, mag, terms, vsum


def _decode_property(data, device, backend):
    """decode attention over contiguous caches, HND or NHD, as views of larger buffers: T 1-100,
    lens 0..T (and below 0 / above T: clamped), GQA groups 1-16, D 64 / 128 / 256, split counts
    1-6 or the host heuristic, 16 / 32 / 64-token tiles (Triton), q, out and lse as views; the
    cache past lens[b] and the buffers around the views hold NaN, inf or 1e30, never read.
    Backend "cuda": the caches' rows padded in 16-byte units (the CUDA kernels copy K / V rows in
    16-byte pieces: fray.decode_attention's docstring)."""
    dtype, batch, hkv, hq, d, _, cap, lens, q, k64, v64, garbage = _decode_inputs(data, paged=False)
    unit = 16 // dtype.itemsize if backend == "cuda" else 1
    layout = data.draw(st.sampled_from(("HND", "NHD")), label="layout")
    ph, pt = _pad(data), _pad(data)
    h0, t0 = data.draw(st.integers(0, ph)), data.draw(st.integers(0, pt))
    caches = []
    for x64 in (k64, v64):
        if layout == "HND":
            big = _filled((batch, hkv + ph, cap + pt, d + _pad(data, unit=unit)), garbage, dtype)
            view = big[:, h0:h0 + hkv, t0:t0 + cap, :d]
            view.copy_(x64.transpose(1, 2))
            nhd = view.transpose(1, 2)
        else:
            big = _filled((batch, cap + pt, hkv + ph, d + _pad(data, unit=unit)), garbage, dtype)
            view = big[:, t0:t0 + cap, h0:h0 + hkv, :d]
            view.copy_(x64)
            nhd = view
        for b, n in enumerate(lens):
            nhd[b, n:] = _filled((), garbage, dtype)
        caches.append((view, nhd))
    (k, k_nhd), (v, v_nhd) = caches
    scale = data.draw(st.sampled_from((None, 0.3)), label="scale") or 1.0 / math.sqrt(d)
    dims = (0, 1, 2) if layout == "HND" else (0, 2, 1)
    lens_t = _lens_tensor(data, lens, cap)
    load = sees(device)
    e, el, mag, terms, vsum = _decode_oracle(q, k_nhd, v_nhd, lens, scale, load)
    out, lse, how = _run_decode(data, device, backend, q, k, v, lens_t, None, tuple(k.stride(i) for i in dims),
                                tuple(v.stride(i) for i in dims), hkv, cap, 1, scale, layout)
    what = "decode %s %s B%d Hq%d Hkv%d D%d T%d lens=%s %s" % (layout, dtype, batch, hq, hkv, d, cap, lens_t.tolist(),
                                                              how)
    assert_close(out, e, dtype, what, scale=_out_scale(mag, vsum, dtype))
    _check_lse(lse, el, terms, what)


@settings(max_examples=20)
@given(data=st.data())
def test_triton_decode_attention_matches_its_oracle(data):
    _decode_property(data, "cpu", "triton")


@gpu(max_examples=30)
def test_gpu_decode_attention_matches_its_oracle(backend, data):
    _decode_property(data, "cuda", backend)


def _paged_decode_property(data, device, backend):
    """paged decode attention over NHD pages of every block size (1-128) through a shuffled block
    table: the entries past ceil(lens[b] / block_size) are garbage (negative, past the pool, or
    pages of NaN), the slots past lens[b] in the last page and the unused pages hold NaN, inf or
    1e30; pages as views of a larger pool (K and V apart or interleaved in one buffer). Backend
    "cuda": the pages' rows padded in 16-byte units, as in _decode_property."""
    dtype, batch, hkv, hq, d, page, cap, lens, q, k64, v64, garbage = _decode_inputs(data, paged=True)
    unit = 16 // dtype.itemsize if backend == "cuda" else 1
    max_blocks = cap // page
    num_blocks = batch * max_blocks + data.draw(st.integers(0, 3), label="spare pages")
    shared = data.draw(st.booleans(), label="K and V in one buffer")
    ph, pd = _pad(data), _pad(data, unit=unit)
    g = _generator(data)
    if shared:
        pool = _filled((num_blocks, page, 2, hkv + ph, d + pd), garbage, dtype)
        kp, vp = pool[:, :, 0, :hkv, :d], pool[:, :, 1, :hkv, :d]
    else:
        kpool = _filled((num_blocks, page, hkv + ph, d + pd), garbage, dtype)
        vpool = _filled((num_blocks, page, hkv + ph, d + pd), garbage, dtype)
        kp, vp = kpool[:, :, :hkv, :d], vpool[:, :, :hkv, :d]
    bt = torch.randperm(num_blocks, generator=g)[:batch * max_blocks].view(batch, max_blocks).to(torch.int32)
    for b, n in enumerate(lens):
        for t in range(n):
            kp[bt[b, t // page], t % page] = k64[b, t].to(dtype)
            vp[bt[b, t // page], t % page] = v64[b, t].to(dtype)
        for j in range(-(-n // page), max_blocks):   # never read
            bt[b, j] = data.draw(st.sampled_from((-7, num_blocks, 10 ** 6, int(bt[b, j]))))
    bt = torch.cat([bt, torch.full((batch, _pad(data)), -3, dtype=torch.int32)], dim=1)[:, :max_blocks]
    k_nhd = torch.stack([_gather(kp, bt[b], n, cap) for b, n in enumerate(lens)])
    v_nhd = torch.stack([_gather(vp, bt[b], n, cap) for b, n in enumerate(lens)])
    scale = data.draw(st.sampled_from((None, 0.3)), label="scale") or 1.0 / math.sqrt(d)
    lens_t = _lens_tensor(data, lens, cap)
    load = sees(device)
    e, el, mag, terms, vsum = _decode_oracle(q, k_nhd, v_nhd, lens, scale, load)
    # the paged reference on the pages themselves agrees with the contiguous one
    ep = ref.paged_decode_attention(_f64(q, load), _f64(kp, load), _f64(vp, load), bt, lens, scale)
    torch.testing.assert_close(ep[0], e, rtol=1e-12, atol=0)
    strides = (kp.stride(0), kp.stride(2), kp.stride(1))
    out, lse, how = _run_decode(data, device, backend, q, kp, vp, lens_t, bt, strides,
                                (vp.stride(0), vp.stride(2), vp.stride(1)), hkv, cap, page, scale, None)
    what = "paged decode %s B%d Hq%d Hkv%d D%d page%d T%d lens=%s %s" % (dtype, batch, hq, hkv, d, page, cap,
                                                                        lens_t.tolist(), how)
    assert_close(out, e, dtype, what, scale=_out_scale(mag, vsum, dtype))
    _check_lse(lse, el, terms, what)


@settings(max_examples=20)
@given(data=st.data())
def test_triton_paged_decode_attention_matches_its_oracle(data):
    _paged_decode_property(data, "cpu", "triton")


@gpu(max_examples=25)
def test_gpu_paged_decode_attention_matches_its_oracle(backend, data):
    _paged_decode_property(data, "cuda", backend)


def _gather(pages, bt_row, n, cap):
    """[T, Hkv, D]: the first n tokens of a sequence from its pages, zeros after (not attended)."""
    rows = ref.gather_pages(pages, bt_row, n)
    return torch.cat([rows, rows.new_zeros((cap - n,) + tuple(rows.shape[1:]))])


# ---------------------------------------------------------------------------------------------
# prefill_attention

def _prefill_oracle(q, k, v, lens_q, lens_k, causal, scale, load):
    """Per sequence b: q [n_q, Hq, D], k, v [n_k, Hkv, D] (lists, as the kernel sees them: load) ->
    the packed reference's (out, lse [Hq, total_q], magnitude, score terms [Hq, total_q], sum_t
    |v_t| like out)."""
    q64, k64, v64 = (torch.cat([_f64(x, load) for x in xs]) for xs in (q, k, v))
    cq, ck = np.cumsum([0] + lens_q).tolist(), np.cumsum([0] + lens_k).tolist()
    e, el, mag = ref.prefill_attention(q64, k64, v64, cq, ck, causal, scale)
    hq, hkv = q64.shape[1], k64.shape[1]
    terms = torch.zeros(el.shape, dtype=torch.float64)
    vsum = torch.zeros(q64.shape, dtype=torch.float64)
    for b, (n_q, n_k) in enumerate(zip(lens_q, lens_k)):
        i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
        visible = (j <= i + n_k - n_q) if causal else torch.ones(n_q, n_k, dtype=torch.bool)
        for h in range(hq):
            terms[h, cq[b]:cq[b + 1]] = _terms(q64[cq[b]:cq[b + 1], h], k64[ck[b]:ck[b + 1], h // (hq // hkv)],
                                               scale, visible)
            vsum[cq[b]:cq[b + 1], h] = visible.double() @ v64[ck[b]:ck[b + 1], h // (hq // hkv)].abs()
    return torch.from_numpy(e), el, torch.from_numpy(mag), terms, vsum


def _prefill_property(data, device, backend):
    """prefill attention, varlen or batched: 1-3 sequences of 0-40 queries and
    0-40 keys (batched: 1-40 each), more queries than keys and fewer (chunked prefill), causal or
    not, GQA groups 1-5, D 64 / 128 / 256, 16 / 32-row tiles or the default ones, max_seqlen_q
    above the longest sequence; q, k, v, out and lse as views of larger buffers. Varlen: packed rows
    past cu_seqlens (a fixed-size buffer's padding) hold NaN, inf or 1e30 and are neither read
    (k, v) nor written (out, lse). Backend "triton": fray_triton.prefill_attention.prefill;
    "cuda": fray.prefill_attention (JIT) on what it takes (its docstring: bf16 / fp16, strides
    multiples of 8 elements, out with even strides), bf16 at D 128 (two translation units: causal
    or not; the draws of dtype and D are made and overridden)."""
    jit = backend == "cuda"
    unit = 8 if jit else 1
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    dtype = torch.bfloat16 if jit else dtype
    varlen = data.draw(st.booleans(), label="varlen")
    causal = data.draw(st.booleans(), label="causal")
    batch = data.draw(st.integers(1, 3), label="batch")
    hkv = data.draw(st.integers(1, 2), label="hkv")
    hq = hkv * data.draw(st.sampled_from((1, 2, 3, 5)), label="group")
    d = data.draw(st.sampled_from((64, 64, 128, 256)), label="d")
    d = 128 if jit else d
    n = st.one_of(st.integers(0, 3), st.integers(4, 40)) if varlen else st.integers(1, 40)
    if varlen:
        lens_q = [data.draw(n, label="n_q") for _ in range(batch)]
        lens_k = [data.draw(n, label="n_k") for _ in range(batch)]
    else:
        lens_q = [data.draw(n, label="Sq")] * batch
        lens_k = [data.draw(n, label="Sk")] * batch
    block = data.draw(st.sampled_from((None, 16, 32)), label="block")
    scale = data.draw(st.sampled_from((None, 0.3)), label="scale") or 1.0 / math.sqrt(d)
    g = _generator(data)
    eq, ek = _score_exponents(data, dtype)
    ev = _value_exponent(data, dtype)
    garbage = data.draw(st.sampled_from(GARBAGE), label="padding")
    tq, tk = sum(lens_q), sum(lens_k)
    rows_q, rows_k = (tq + _pad(data), tk + _pad(data)) if varlen else (max(lens_q), max(lens_k))
    q64 = _values(data, g, (rows_q, hq, d) if varlen else (batch, rows_q, hq, d), eq, _finite_specials(dtype, eq))
    k64 = _values(data, g, (rows_k, hkv, d) if varlen else (batch, rows_k, hkv, d), ek, _finite_specials(dtype, ek))
    v64 = _values(data, g, (rows_k, hkv, d) if varlen else (batch, rows_k, hkv, d), ev, _finite_specials(dtype, ev))
    if data.draw(st.booleans(), label="repeated keys") and k64.shape[-3] > 1:
        k64[..., data.draw(st.integers(0, k64.shape[-3] - 1)), :, :] = k64[..., 0, :, :]
    if varlen:  # the padding rows
        q64[tq:], k64[tk:], v64[tk:] = garbage, garbage, garbage

    def view(x64, heads):
        big = _filled(x64.shape[:-2] + (heads + _pad(data), d + _pad(data, unit=unit)), garbage, dtype)
        x = big[..., :heads, :d]
        x.copy_(x64)
        return x

    q, k, v = view(q64, hq), view(k64, hkv), view(v64, hkv)
    po, pl = _pad(data), _pad(data)
    obuf = _sentinel(q.shape[:-2] + (hq + po, d + (2 if jit else 1)), dtype)
    out = obuf[..., :hq, :d]
    if varlen:
        lbuf = _sentinel((hq + pl, rows_q + po), torch.float32)
        lse = lbuf[:hq, :rows_q]
        cu_q = torch.tensor(np.cumsum([0] + lens_q).tolist(), dtype=torch.int32)
        cu_k = torch.tensor(np.cumsum([0] + lens_k).tolist(), dtype=torch.int32)
        strides = [(0, t.stride(0), t.stride(1)) for t in (q, k, v, out)] + [(0, lse.stride(0))]
    else:
        lbuf = _sentinel((batch, hq + pl, rows_q + po), torch.float32)
        lse = lbuf[:, :hq, :rows_q]
        cu_q = cu_k = None
        strides = [t.stride()[:3] for t in (q, k, v, out)] + [lse.stride()[:2]]
    max_q = max(lens_q) + data.draw(st.integers(0, 20), label="max_seqlen_q - longest")
    ins = [t.clone() for t in (q, k, v)]

    def launch(q, k, v, out, lse, cu_q, cu_k):
        if backend == "triton":
            from fray_triton import prefill_attention as tp
            tp.prefill(q, k, v, out, lse, cu_q, cu_k, scale, causal=causal, batch=batch,
                       max_seqlen_q=max_q if varlen else rows_q, seqlen_k=0 if varlen else rows_k,
                       q_strides=strides[0], k_strides=strides[1], v_strides=strides[2], out_strides=strides[3],
                       lse_strides=strides[4], block_m=block, block_n=block)
        elif varlen:
            _, got = _fray().prefill_attention(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                               max_seqlen_q=max_q, max_seqlen_k=max(lens_k), scale=scale,
                                               return_lse=True, out=out, backend=backend)
            lse[:, :tq] = got[:, :tq]  # the rows past cu_seqlens_q[B] are not written
        else:
            _, got = _fray().prefill_attention(q, k, v, causal=causal, scale=scale, return_lse=True, out=out,
                                               backend=backend)
            lse.copy_(got)
    on(device, launch, q, k, v, out, lse, cu_q, cu_k)
    what = "prefill %s %s causal=%s B%d Hq%d Hkv%d D%d lens_q=%s lens_k=%s block=%s" % (
        "varlen" if varlen else "batched", dtype, causal, batch, hq, hkv, d, lens_q, lens_k, block)
    for t, before, name in zip((q, k, v), ins, ("q", "k", "v")):
        _same_bits(t, before, "%s: %s" % (what, name))
    if varlen:
        cq, ck = np.cumsum([0] + lens_q).tolist(), np.cumsum([0] + lens_k).tolist()
        seqs = [tuple(x[c[b]:c[b + 1]] for x, c in ((q, cq), (k, ck), (v, ck))) for b in range(batch)]
        got_out, got_lse = out[:tq], lse[:, :tq]
    else:
        seqs = [(q[b], k[b], v[b]) for b in range(batch)]
        got_out, got_lse = out.reshape(tq, hq, d), lse.transpose(0, 1).reshape(hq, tq)
    qs, ks, vs = zip(*seqs)
    e, el, mag, terms, vsum = _prefill_oracle(qs, ks, vs, lens_q, lens_k, causal, scale, sees(device))
    assert_close(got_out, e, dtype, what, scale=_out_scale(mag, vsum, dtype))
    _check_lse(got_lse, el, terms, what)
    # nothing written outside out[:total_q] / lse[:, :total_q] (varlen) or out / lse
    rest_o, rest_l = obuf.clone(), lbuf.clone()
    if varlen:
        rest_o[:tq, :hq, :d], rest_l[:hq, :tq] = float("nan"), float("nan")
    else:
        rest_o[..., :hq, :d], rest_l[:, :hq, :rows_q] = float("nan"), float("nan")
    _same_bits(rest_o, _sentinel(obuf.shape, dtype), what + ": out's buffer outside the rows written")
    _same_bits(rest_l, _sentinel(lbuf.shape, torch.float32), what + ": lse's buffer outside the rows written")


@settings(max_examples=20)
@given(data=st.data())
def test_triton_prefill_attention_matches_its_oracle(data):
    _prefill_property(data, "cpu", "triton")


@gpu(max_examples=30)
def test_gpu_prefill_attention_matches_its_oracle(backend, data):
    _prefill_property(data, "cuda", backend)


def _paged_prefill_property(data, device, backend):
    """prefill attention over paged K/V: 1-3 sequences of 0-40 queries over
    0-40 keys in pages of 1, 16 or 32 tokens behind a shuffled block table, causal or not, GQA
    groups 1-5, D 64 / 128, 16 / 32-row tiles or the default ones. Pool rows and pages no
    sequence uses hold NaN, inf or 1e30, block-table entries past a sequence's keys name pages
    outside the pool (-1, 10^6): none is read. Out and lse within the oracle's bounds and bit for
    bit those of the same kernel on the keys packed contiguously; nothing written outside
    out[:total_q] / lse[:, :total_q]. Backend "triton": fray_triton.prefill_attention.prefill;
    "cuda": fray.prefill_attention (JIT) over the paged K/V only (its paged and contiguous kernels
    are different translation units: no bitwise promise between them), bf16 at D 128, causal, in
    pages of 16 keys (the CUDA kernel takes block sizes 16-128): one translation unit (the draws
    of dtype, D, causal and block size are made and overridden)."""
    jit = backend == "cuda"
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    dtype = torch.bfloat16 if jit else dtype
    causal = data.draw(st.booleans(), label="causal") or jit
    batch = data.draw(st.integers(1, 3), label="batch")
    hkv = data.draw(st.integers(1, 2), label="hkv")
    hq = hkv * data.draw(st.sampled_from((1, 2, 3, 5)), label="group")
    d = data.draw(st.sampled_from((64, 128)), label="d")
    d = 128 if jit else d
    page = data.draw(st.sampled_from((1, 16, 32)), label="page")
    page = 16 if jit else page
    n = st.one_of(st.integers(0, 3), st.integers(4, 40))
    lens_q = [data.draw(n, label="n_q") for _ in range(batch)]
    lens_k = [data.draw(n, label="n_k") for _ in range(batch)]
    block = data.draw(st.sampled_from((None, 16, 32)), label="block")
    scale = 1.0 / math.sqrt(d)
    g = _generator(data)
    eq, ek = _score_exponents(data, dtype)
    ev = _value_exponent(data, dtype)
    garbage = data.draw(st.sampled_from(GARBAGE), label="garbage")
    tq, tk = sum(lens_q), sum(lens_k)
    q = _values(data, g, (tq, hq, d), eq, _finite_specials(dtype, eq)).to(dtype)
    k = _values(data, g, (tk, hkv, d), ek, _finite_specials(dtype, ek)).to(dtype)
    v = _values(data, g, (tk, hkv, d), ev, _finite_specials(dtype, ev)).to(dtype)
    # the pool: each sequence's pages, spare pages, shuffled; garbage wherever no key lies
    blocks = [-(-n_k // page) for n_k in lens_k]
    max_blocks = max(blocks + [1]) + _pad(data)
    num_pages = sum(blocks) + _pad(data) + 1
    order = torch.randperm(num_pages, generator=g)
    bt = torch.tensor([[(-1, 10 ** 6)[(b + j) % 2] for j in range(max_blocks)] for b in range(batch)],
                      dtype=torch.int32)
    kp, vp = _filled((num_pages, page, hkv, d), garbage, dtype), _filled((num_pages, page, hkv, d), garbage, dtype)
    used, start = 0, 0
    for b, n_k in enumerate(lens_k):
        for j in range(blocks[b]):
            bt[b, j] = int(order[used])
            rows = slice(start + j * page, start + min(n_k, (j + 1) * page))
            kp[bt[b, j], :rows.stop - rows.start] = k[rows]
            vp[bt[b, j], :rows.stop - rows.start] = v[rows]
            used += 1
        start += n_k
    cu_q = torch.tensor(np.cumsum([0] + lens_q).tolist(), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lens_k).tolist(), dtype=torch.int32)
    max_q = max(lens_q) + data.draw(st.integers(0, 20), label="max_seqlen_q - longest")
    results = []
    for paged in (True,) if jit else (True, False):
        obuf, lbuf = _sentinel((tq + 1, hq, d), dtype), _sentinel((hq, tq + 1), torch.float32)
        out, lse = obuf[:tq], lbuf[:, :tq]
        kk, vv = (kp, vp) if paged else (k, v)
        kv_strides = kk.stride()[:3] if paged else (0,) + kk.stride()[:2]

        def launch(q, kk, vv, out, lse, cu_q, cu_k, bt):
            if backend == "triton":
                from fray_triton import prefill_attention as tp
                tp.prefill(q, kk, vv, out, lse, cu_q, cu_k, scale, causal=causal, batch=batch, max_seqlen_q=max_q,
                           seqlen_k=0, q_strides=(0,) + q.stride()[:2], k_strides=kv_strides, v_strides=kv_strides,
                           out_strides=(0,) + out.stride()[:2], lse_strides=(0, lse.stride(0)), block_m=block,
                           block_n=block, block_table=bt if paged else None, bt_stride=bt.stride(0),
                           page_size=page if paged else 1)
                return
            _, got = _fray().prefill_attention(q, kk, vv, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                               max_seqlen_q=max_q, max_seqlen_k=max(lens_k), scale=scale,
                                               return_lse=True, out=out, backend=backend,
                                               block_table=bt if paged else None)
            lse.copy_(got)
        on(device, launch, q, kk, vv, out, lse, cu_q, cu_k, bt)
        results.append((obuf, lbuf))
    what = "paged prefill %s causal=%s B%d Hq%d Hkv%d D%d page %d lens_q=%s lens_k=%s block=%s" % (
        dtype, causal, batch, hq, hkv, d, page, lens_q, lens_k, block)
    po, pl = results[0]
    if len(results) > 1:  # Triton: the contiguous call, bit for bit
        co, cl = results[1]
        _same_bits(po, co, what + ": out against the contiguous call")
        _same_bits(pl, cl, what + ": lse against the contiguous call")
    cq, ck = np.cumsum([0] + lens_q).tolist(), np.cumsum([0] + lens_k).tolist()
    seqs = [(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]) for b in range(batch)]
    qs, ks, vs = zip(*seqs)
    e, el, mag, terms, vsum = _prefill_oracle(qs, ks, vs, lens_q, lens_k, causal, scale, sees(device))
    assert_close(po[:tq], e, dtype, what, scale=_out_scale(mag, vsum, dtype))
    _check_lse(pl[:, :tq], el, terms, what)
    _same_bits(po[tq:], _sentinel((1, hq, d), dtype), what + ": out's row past the packed rows")
    _same_bits(pl[:, tq:], _sentinel((hq, 1), torch.float32), what + ": lse's column past the packed rows")


@settings(max_examples=15)
@given(data=st.data())
def test_triton_paged_prefill_attention_matches_its_oracle_and_the_contiguous_call(data):
    _paged_prefill_property(data, "cpu", "triton")


@gpu(max_examples=25)
def test_gpu_paged_prefill_attention_matches_its_oracle(backend, data):
    _paged_prefill_property(data, "cuda", backend)


# ---------------------------------------------------------------------------------------------
# mla_decode

MLA_D, MLA_DV = 576, 512


def _mla_property(data, device, backend):
    """mla_decode: 1-3 sequences, s_q 1-4 (lens below s_q included), Hq 1-20,
    block sizes 16-128, lens 0..T, split counts 1-5 or the host heuristic, the default tile
    configuration or smaller ones (several head blocks, 16 / 32-token tiles, both MMA
    orientations), q, out and lse as views of larger buffers, a latent cache whose rows are wider
    than 576, lens below 0 / above T (clamped); what lies past lens[b] (slots, pages, block-table
    entries) is garbage. Backend "triton": fray_triton.mla_decode.decode (the tile configurations
    its own); "cuda": fray.mla_decode (JIT) on what it takes (its docstring: bf16 / fp16, q and
    cache strides multiples of 8 elements, out with even strides), bf16 in pages of 64 tokens (one
    translation unit; the draws of dtype and block size are made and overridden)."""
    from fray.ops import attention as A
    from fray_triton._host import next_power_of_2
    jit = backend == "cuda"
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    dtype = torch.bfloat16 if jit else dtype
    batch = data.draw(st.integers(1, 3), label="batch")
    s_q = data.draw(st.integers(1, 4), label="s_q")
    hq = data.draw(st.one_of(st.integers(1, 4), st.integers(5, 20)), label="hq")
    page = data.draw(st.sampled_from(A.MLA_PAGE_SIZES), label="page")
    page = 64 if jit else page
    max_blocks = data.draw(st.integers(1, max(1, 160 // page)), label="max_blocks")
    cap = max_blocks * page
    lens = [data.draw(st.one_of(st.just(0), st.just(cap), st.integers(1, min(cap, s_q)), st.integers(1, cap)),
                      label="lens") for _ in range(batch)]
    splits = data.draw(st.one_of(st.none(), st.integers(1, 5)), label="num_splits")
    cfg = None
    if data.draw(st.booleans(), label="small tiles"):
        block_h = data.draw(st.sampled_from((1, 2, 4, 8)), label="BLOCK_H")
        cfg = (block_h, max(16, next_power_of_2(s_q * block_h)), data.draw(st.sampled_from((16, 32))), 4, 1,
               data.draw(st.booleans(), label="TRANS"))
    scale = data.draw(st.sampled_from((None, 0.05)), label="scale") or 1.0 / math.sqrt(MLA_D)
    g = _generator(data)
    eq, ek = _score_exponents(data, dtype, top={torch.float32: -1, torch.float16: 0, torch.bfloat16: 1}[dtype])
    garbage = data.draw(st.sampled_from(GARBAGE), label="past lens")
    q64 = _values(data, g, (batch, s_q, hq, MLA_D), eq, _finite_specials(dtype, eq))
    tok64 = _values(data, g, (batch, cap, MLA_D), ek, _finite_specials(dtype, ek))
    if data.draw(st.booleans(), label="repeated rows") and cap > 1:
        tok64[:, data.draw(st.integers(1, cap - 1))] = tok64[:, 0]
    if data.draw(st.booleans(), label="zero q"):
        q64[data.draw(st.integers(0, batch - 1)), :, data.draw(st.integers(0, hq - 1))] = 0.0
    # q and the cache as views: heads and rows wider than the data
    qbig = _filled((batch, s_q, hq + _pad(data), MLA_D + _pad(data, 8, 8 if jit else 1)), garbage, dtype)
    q = qbig[..., :hq, :MLA_D]
    q.copy_(q64)
    num_blocks = batch * max_blocks + data.draw(st.integers(0, 3), label="spare pages")
    kvbig = _filled((num_blocks, page, 1, MLA_D + data.draw(st.sampled_from((0, 8, 64)))), garbage, dtype)
    kv = kvbig[..., :MLA_D]
    bt = torch.randperm(num_blocks, generator=g)[:batch * max_blocks].view(batch, max_blocks).to(torch.int32)
    for b, n in enumerate(lens):
        for t in range(n):
            kv[bt[b, t // page], t % page, 0] = tok64[b, t].to(dtype)
        for j in range(-(-n // page), max_blocks):   # never read
            bt[b, j] = data.draw(st.sampled_from((-7, num_blocks, 10 ** 6, int(bt[b, j]))))
    bt = torch.cat([bt, torch.full((batch, _pad(data)), -3, dtype=torch.int32)], dim=1)[:, :max_blocks]
    po = _pad(data)
    obuf = _sentinel((batch, s_q, hq + po, MLA_DV + (2 if jit else 1)), dtype)
    lbuf = _sentinel((batch, s_q + 1, hq + po), torch.float32)
    out, lse = obuf[..., :hq, :MLA_DV], lbuf[:, :s_q, :hq]
    ins = (q.clone(), kv.clone())
    lens_t = _lens_tensor(data, lens, cap)

    def launch(q, kv, bt, lens_t, out, lse):
        if backend == "triton":
            from fray_triton import mla_decode as tmla
            return tmla.decode(q, kv, bt, lens_t, out, lse, scale, q_strides=q.stride()[:3],
                               kv_strides=kv.stride()[:2], bt_stride=bt.stride(0), out_strides=out.stride()[:3],
                               lse_strides=lse.stride(), capacity=cap, page_size=page, num_splits=splits,
                               num_sms=132, cfg=cfg)
        _, got = _fray().mla_decode(q, kv, bt, lens_t, scale=scale, out=out, return_lse=True, num_splits=splits,
                                    backend=backend)
        lse.copy_(got)
        return splits
    n = on(device, launch, q, kv, bt, lens_t, out, lse)
    what = "mla_decode %s B%d s_q%d Hq%d page%d T%d lens=%s splits=%s->%s cfg=%s" % (
        dtype, batch, s_q, hq, page, cap, lens_t.tolist(), splits, n, cfg if backend == "triton" else None)
    _same_bits(q, ins[0], what + ": q")
    _same_bits(kv, ins[1], what + ": kv_cache")
    load = sees(device)
    q64, kv64 = _f64(q, load), _f64(kv, load)
    e, el, mag = ref.mla_decode(q64.numpy(), kv64.numpy(), bt, lens, MLA_DV, scale)
    terms = torch.zeros(el.shape, dtype=torch.float64)
    vsum = torch.zeros(e.shape, dtype=torch.float64)
    for b, n_b in enumerate(lens):
        rows = _f64(ref.gather_pages(kv, bt[b], n_b)[:, 0], load)
        for i in range(s_q):
            seen = n_b - s_q + 1 + i
            if seen > 0:
                terms[b, i] = _terms(q64[b, i], rows[:seen], scale)
                vsum[b, i] = rows[:seen, :MLA_DV].abs().sum(0)
    assert_close(out, e, dtype, what, scale=_out_scale(mag, vsum, dtype))
    _check_lse(lse, el, terms, what)
    rest_o, rest_l = obuf.clone(), lbuf.clone()
    rest_o[..., :hq, :MLA_DV], rest_l[:, :s_q, :hq] = float("nan"), float("nan")
    _same_bits(rest_o, _sentinel(obuf.shape, dtype), what + ": out's buffer outside out")
    _same_bits(rest_l, _sentinel(lbuf.shape, torch.float32), what + ": lse's buffer outside lse")


@settings(max_examples=15)
@given(data=st.data())
def test_triton_mla_decode_matches_its_oracle(data):
    _mla_property(data, "cpu", "triton")


@gpu(("cuda",), max_examples=25)
def test_gpu_mla_decode_matches_its_oracle(backend, data):
    _mla_property(data, "cuda", backend)


# The Triton kernels compile per draw (page size, dtype, tile configuration and stride
# alignments are all specialised, at D 576): 25 draws did not finish in 208 s on an H100 (8635d1e,
# 2026-12-07). 8 draws, to bring it near the other GPU property cases' time (not yet timed); the
# CPU profile's 15 derandomised draws go through the same strategies under the interpreter.
@gpu(("triton",), max_examples=8)
def test_gpu_mla_decode_triton_matches_its_oracle(backend, data):
    _mla_property(data, "cuda", backend)
