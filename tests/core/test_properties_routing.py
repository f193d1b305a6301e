"""Property-based tests (hypothesis) of the sampling, MoE routing and quantization Triton kernels
under Triton's CPU interpreter, against the float64 references and the ops' documented rules.

Inputs are drawn at random: batch / token counts from 1, widths that are 1, odd, or no multiple of
any tile (sampling's 1024-wide loop block, dispatch's 128-route blocks, the GEMMs' 32-wide tiles,
quantize's 128-wide groups and 16384-element register rows), every dtype each kernel takes, rows
inside wider buffers (row strides free), values N(0, 1) * 10^e with e per example, and special
values sprinkled in where the op documents them (inf, -inf, NaN, +-0, subnormals of the dtype,
+-1e30, the dtype's largest value, exact ties, exact rounding midpoints). Oracles:

- apply_penalties: bit for bit the documented fp32 rule (l / rep if l > 0 else l * rep, - presence,
  - n * frequency, one rounding to the dtype); float64 reference within the dtype's tolerance
  relative to the terms; ids outside the histories and the padding of the rows untouched.
- sample: greedy rows are argmax with its NaN / tie rules and logprob 0; a sampled token is always
  inside the top-k / top-p / min-p set of the reference (thresholds loosened by fp32's rounding),
  its logprob finite and <= 0, u * C inside its cumulative-mass interval; wherever no threshold or
  mass boundary lies within fp32's rounding of the decision, the token is the reference's exactly
  and the logprob within 1e-4. A repeated row (same seed and offset) draws the same token.
- decode_step: the Triton composition (penalties, then sample) with both oracles above.
- moe_route: the kernel's ids are a valid greedy top-k of the float64 selection scores (groups too)
  where scores further apart than fp32's rounding keep their order and structurally equal scores
  (the same logit and bias, or NaN) go to the lower id; weights are the float64 ones of the chosen
  ids; counts the bincount of the ids.
- moe_dispatch: all six outputs equal to the reference exactly (poisoned buffers first).
- routed_grouped_gemm: the routing as moe_route's, then the float64 routed product within
  fray.testing's MoE bound, every combine mode and layout.
- quantize (int8): q and the dynamic scales bit for bit the reference (round half to even of
  fp32(x / scale), saturation to +-127, NaN -> 0, inf -> +-127, zero / NaN-only groups scale 1);
  static scales used as given. dequantize: bit for bit fp32(q * scale) rounded to the output dtype.
- rmsnorm_quant / silu_mul_quant (int8): the residual sum bit for bit; scales and q inside the
  exact quantization of every value the float64 y can round to after fp32 math (1e-5 relative).
- w8a16_gemm (int8 weights): the float64 product within fray.testing's GEMM bound, every scale
  kind.

Not covered here (nor on the GPU, whose tests draw what the CPU tests draw): float8 outputs or
weights (Triton's interpreter converts to and from float8 wrongly, docs/families/quant.md) and
bf16 dequantize outputs (the interpreter truncates fp32 -> bf16 in a plain .to(), where the GPU
rounds to nearest even; the kernels that round through fray_triton.norm._round are covered in
bf16, and w8a16_gemm's bf16 outputs, truncated here, are still inside its GEMM bound). Under the
interpreter the bf16 inputs go through interpreter_load (it flushes bf16 subnormals when it widens
them; tests/core/test_properties.py holds it); on the GPU the oracles take them as they are
(sees()). The sampled rows' temperatures stay normal fp32 numbers (see _sample_params).

Each property is one body taking (device, backend), as in tests/core/test_properties.py: a CPU
test (test_triton_*: Triton under the interpreter, skipped without TRITON_INTERPRET=1, which the
Bazel CPU target sets; the CI profile "ci", derandomised: the same examples on every run) and GPU
tests (test_gpu_*, marked gpu, failing where torch sees no CUDA device; the derandomised profile
"gpu"): apply_penalties, sample, decode_step and w8a16_gemm once per backend ("triton": the same
kernel entry points compiled; "cuda": the public op with backend="cuda", its results copied into
the test's buffers), the MoE routing ops and the quantizers on Triton, their only backend.
w8a16_gemm's CUDA kernel is JIT-compiled (one nvcc translation unit per dtype, scale kind, bias
and M tile, seconds to minutes each): its GPU examples draw what it takes over two translation
units (see _w8a16_property).
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fray.testing import TOLERANCES

from property_support import gpu, interpreter_load, on, sees, triton_mode


# ---------------------------------------------------------------------------------------------
# where a property runs

@pytest.fixture(autouse=True)
def _triton_mode(request, monkeypatch):
    triton_mode(request, monkeypatch, require_interpreter=True)


def _fray():
    import fray
    return fray


I8 = torch.int8
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _f64(x, load):
    """x as the kernel sees it (load: sees(device)), in float64."""
    return load(x).double()


def _specials(dtype, overflow=True):
    fi = torch.finfo(dtype)
    out = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), fi.tiny / 4, -fi.tiny / 4, fi.tiny, 1.0, -1.0]
    if overflow:
        out += [1e30, -1e30, fi.max, -fi.max]
    return out


def _values(data, shape, exp_range, pool, n_specials=8):
    """float64 N(0, 1) * 10^e (e drawn once) of `shape` with up to n_specials values of `pool` at
    drawn positions."""
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 10.0 ** data.draw(st.integers(*exp_range))
    flat = x.view(-1)
    if pool and flat.numel():
        for _ in range(data.draw(st.integers(0, min(flat.numel(), n_specials)))):
            flat[data.draw(st.integers(0, flat.numel() - 1))] = pool[data.draw(st.integers(0, len(pool) - 1))]
    return x


def _padded(data, rows, cols, dtype, fill=float("nan"), unit=1):
    """A [rows, cols] view into a [rows, cols + pad] buffer of `fill` (row stride cols + pad; pad 0-3
    units of `unit` elements)."""
    pad = data.draw(st.integers(0, 3)) * unit
    buf = torch.full((rows, cols + pad), fill, dtype=dtype)
    return buf, buf[:, :cols]


def _bits(t):
    return t.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _assert_same(got, want, what):
    """Equal values (signed zeros by their bits), NaN where want is NaN."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "%s: NaN positions differ" % what
    bad = (_bits(got) != _bits(want)) & ~nan
    assert not bad.any(), "%s: %d elements differ, first at %s: %r vs %r" % (
        what, int(bad.sum()), tuple(bad.nonzero()[0].tolist()), float(got[bad][0]), float(want[bad][0]))


def _assert_close_terms(got, want64, dtype, terms, what):
    """got vs the float64 reference rounded to dtype: NaN and infinities where it has them, finite
    values within atol + rtol max(|expected|, terms) (the bound of fray.testing.assert_close with
    a scale, for results that are sums able to cancel)."""
    want = want64.to(dtype).double()
    g = got.double()
    assert torch.equal(torch.isnan(g), torch.isnan(want)), "%s: NaN positions differ" % what
    inf = torch.isinf(want)
    assert torch.equal(g[inf], want[inf]), "%s: infinities differ" % what
    ok = torch.isfinite(want)
    tol = TOLERANCES[dtype]
    bound = tol["atol"] + tol["rtol"] * torch.maximum(want.abs(), terms)
    bad = ok & ~((g - want).abs() <= bound)
    assert not bad.any(), "%s: %d elements off; first %r vs %r" % (what, int(bad.sum()), float(g[bad][0]),
                                                                  float(want[bad][0]))


# ---------------------------------------------------------------------------------------------
# sampling: apply_penalties, sample, decode_step

def _history(data, rows, width):
    """CSR history (token_ids, token_offsets): per row 0..150 ids (past the kernel's 64-entry
    tiles), from a few ids (many repeats) or from the whole row; int32 or int64."""
    lens, ids = [], []
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    for _ in range(rows):
        n = data.draw(st.one_of(st.integers(0, 5), st.integers(6, 150)))
        pool = data.draw(st.integers(1, width))
        ids.append(torch.randint(0, pool, (n,), generator=g) * (width // pool))
        lens.append(n)
    idt = data.draw(st.sampled_from((torch.int32, torch.int64)))
    offs = torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int64).to(idt)
    return torch.cat(ids).to(idt), offs


def _in_range(ids, offs, width):
    """The history without its ids outside [0, width) (which the kernel ignores), as CSR."""
    keep = (ids >= 0) & (ids < width)
    counts = [int(keep[int(offs[b]):int(offs[b + 1])].sum()) for b in range(offs.shape[0] - 1)]
    return ids[keep], torch.tensor([0] + np.cumsum(counts).tolist(), dtype=offs.dtype)


def _penalty_params(data, rows, extremes=True):
    """Per-row repetition / presence / frequency; extremes: +-1e30 and 1e-30 among them (which
    make infinities of finite logits)."""
    def per_row(choices, far, lo, hi):
        return torch.tensor([data.draw(st.one_of(st.sampled_from(choices + (far if extremes else ())),
                                                 st.floats(lo, hi))) for _ in range(rows)], dtype=FP32)
    rep = per_row((1.0, 0.5, 1.3, 2.0), (1e-30, 1e30), 0.05, 4.0)
    pres = per_row((0.0, -0.5, 0.3), (1e30, -1e-30), -3.0, 3.0)
    freq = per_row((0.0, 0.25, -0.1), (-1e30, 1e-30), -1.0, 1.0)
    return rep, pres, freq


def _penalty_rule(x, ids, offs, rep, pres, freq, load):
    """The documented rule in fp32, one rounding to x's dtype (torch's CPU fp32 arithmetic), on x
    as the kernel sees it (load)."""
    want = x.clone()
    xl = load(x).float()
    for b in range(x.shape[0]):
        h = ids[int(offs[b]):int(offs[b + 1])].long()
        if h.numel() == 0:
            continue
        uniq, counts = torch.unique(h, return_counts=True)
        l = xl[b, uniq]
        l = torch.where(l > 0, l / rep[b], l * rep[b]) - pres[b] - counts.float() * freq[b]
        want[b, uniq] = l.to(x.dtype)
    return want


def _check_penalties(before, after, ids, offs, rep, pres, freq, what, load):
    """after (the kernel's in-place result) against the fp32 rule bit for bit and the float64
    reference within the dtype's tolerance; entries outside the histories untouched; ids outside
    the row ignored. load: what the kernel sees of its inputs (sees(device))."""
    from fray.reference import sampling as rsa
    ids, offs = _in_range(ids, offs, before.shape[1])
    want = _penalty_rule(before, ids, offs, rep, pres, freq, load)
    touched = torch.zeros(before.shape, dtype=torch.bool)
    terms = torch.zeros(before.shape, dtype=torch.float64)
    for b in range(before.shape[0]):
        h = ids[int(offs[b]):int(offs[b + 1])].long()
        if h.numel():
            uniq, counts = torch.unique(h, return_counts=True)
            touched[b, uniq] = True
            l = _f64(before, load)[b, uniq]
            terms[b, uniq] = (torch.where(l > 0, l / float(rep[b]), l * float(rep[b])).abs() + abs(float(pres[b]))
                              + counts.double() * abs(float(freq[b])))
    assert torch.equal(_bits(after)[~touched], _bits(before)[~touched]), "%s: entries outside the histories " \
                                                                         "changed" % what
    _assert_same(after, want, what + " (the fp32 rule)")
    ref = rsa.apply_penalties(_f64(before, load).numpy(), ids.numpy(), offs.numpy(), rep.double().numpy(),
                              pres.double().numpy(), freq.double().numpy())
    _assert_close_terms(after, torch.from_numpy(ref), before.dtype, terms.nan_to_num(0.0, 0.0, 0.0),
                        what + " (float64 reference)")


def _apply_penalties(backend, logits, ids, offs, rep, pres, freq):
    """apply_penalties in place on logits: fray_triton.sampling (backend "triton") or
    fray.apply_penalties."""
    if backend == "triton":
        from fray_triton import sampling as ts
        ts.apply_penalties(logits, ids, offs, rep, pres, freq, logits.stride(0), *logits.shape)
    else:
        _fray().apply_penalties(logits, ids, offs, repetition=rep, presence=pres, frequency=freq, backend=backend)


def _apply_penalties_property(data, device, backend):
    """apply_penalties over 1-4 rows of 1-3000 logits (fp32 / fp16 / bf16, rows inside wider
    buffers), ragged histories of int32 or int64 ids with repeats (and ids outside the row, which
    the kernel ignores), per-row parameters, special values where the histories point."""
    dtype = data.draw(st.sampled_from((FP32, FP16, BF16)))
    rows = data.draw(st.integers(1, 4))
    width = data.draw(st.one_of(st.integers(1, 40), st.integers(41, 3000)))
    ids, offs = _history(data, rows, width)
    x = _values(data, (rows, width), (-8, 8), _specials(dtype))
    if ids.numel() and data.draw(st.booleans()):  # special values where the history points
        pool = _specials(dtype)
        for _ in range(data.draw(st.integers(1, 6))):
            r = data.draw(st.integers(0, rows - 1))
            if offs[r + 1] > offs[r]:
                x[r, ids[data.draw(st.integers(int(offs[r]), int(offs[r + 1]) - 1))]] = pool[
                    data.draw(st.integers(0, len(pool) - 1))]
    if ids.numel() and data.draw(st.booleans()):  # ids outside [0, V): ignored by the kernel
        for _ in range(data.draw(st.integers(1, 4))):
            ids[data.draw(st.integers(0, ids.numel() - 1))] = data.draw(st.sampled_from((-1, -7, width, width + 5)))
    rep, pres, freq = _penalty_params(data, rows)
    buf, logits = _padded(data, rows, width, dtype)
    logits.copy_(x.to(dtype))
    before = buf.clone()
    on(device, lambda *ts: _apply_penalties(backend, *ts), logits, ids, offs, rep, pres, freq)
    assert torch.equal(_bits(buf[:, width:]), _bits(before[:, width:])), "the rows' padding was written"
    _check_penalties(before[:, :width], logits, ids, offs, rep, pres, freq,
                     "penalties %dx%d %s" % (rows, width, dtype), sees(device))


@settings(max_examples=20)
@given(data=st.data())
def test_triton_apply_penalties_matches_its_oracle(data):
    _apply_penalties_property(data, "cpu", "triton")


@gpu()
def test_gpu_apply_penalties_matches_its_oracle(backend, data):
    _apply_penalties_property(data, "cuda", backend)


# A decision (a top-p / min-p threshold, the inverse CDF's boundary) within this fraction of the
# row's mass of the draw may go either way between fp32 sums and the reference's float64 ones.
NEAR = 3e-5
NEAR_MIN_P = 1e-4  # relative, for w against min_p


def _sample_params(data, rows, width):
    """Per-row parameters over their valid ranges and edges, down to fp32 subnormal temperatures
    (greedy by the documented rule: below 2^-126, 1 / temperature could overflow fp32)."""
    def per_row(off, common, edges):
        """off, a common value or (one time in five) an edge value, per row."""
        pick = st.sampled_from((off, common, common, common, edges)).flatmap(lambda strategy: strategy)
        return [data.draw(pick) for _ in range(rows)]

    temp = torch.tensor(per_row(st.just(0.0), st.floats(0.3, 3.0), st.sampled_from((1e-40, 1e-30, 1e-4, 0.05, 1e4))),
                        dtype=FP32)
    top_k = torch.tensor(per_row(st.just(0), st.integers(1, max(1, min(width - 1, 50))), st.integers(1, width + 2)))
    top_p = torch.tensor(per_row(st.just(1.0), st.floats(0.2, 0.99), st.sampled_from((1e-30, 0.01, 0.999999))),
                         dtype=FP32)
    min_p = torch.tensor(per_row(st.just(0.0), st.floats(0.01, 0.5), st.sampled_from((1e-30, 1e-3, 0.9, 1.0))),
                         dtype=FP32)
    seeds = torch.tensor([data.draw(st.integers(-2 ** 63, 2 ** 63 - 1)) for _ in range(rows)])
    offsets = torch.tensor([data.draw(st.integers(-2 ** 63, 2 ** 63 - 1)) for _ in range(rows)])
    return temp, top_k, top_p, min_p, seeds, offsets


def _sample_logits(data, rows, width, dtype, greedy):
    """Logits of sampled rows hold no NaN and no +inf (undefined there) and one finite value at
    least; greedy rows take every special value. Half the time a tie-heavy row (a few integers)."""
    x = _values(data, (rows, width), (-2, 1), None)
    if data.draw(st.booleans()):
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
        x = torch.randint(-2, 3, (rows, width), generator=g, dtype=torch.float64) * data.draw(
            st.sampled_from((1.0, 0.5, 3.0)))
    for r in range(rows):
        pool = _specials(dtype) if greedy[r] else [v for v in _specials(dtype, overflow=False) + [1e30, -1e30]
                                                    if not (v != v or v == float("inf"))]
        for _ in range(data.draw(st.integers(0, min(width - 1, 6)))):
            x[r, data.draw(st.integers(0, width - 1))] = pool[data.draw(st.integers(0, len(pool) - 1))]
        if not greedy[r] and not torch.isfinite(x[r]).any():
            x[r, 0] = 0.0
    return x.to(dtype)


def _greater_mass(l, w, keep):
    """For each token i: the mass of the kept tokens whose logit is above l[i] (float64)."""
    order = np.argsort(-l, kind="stable")
    lk, wk = l[order], np.where(keep[order], w[order], 0.0)
    cum = np.concatenate([[0.0], np.cumsum(wk)])
    first = np.searchsorted(-lk, -lk, side="left")  # the first sorted position of an equal logit
    out = np.empty_like(w)
    out[order] = cum[first]
    return out


def _check_sample_row(l, temp, top_k, top_p, min_p, seed, offset, tok, lp, what):
    """One row's draw against the reference (see the module docstring); returns how it was held:
    "greedy", "exact" or "near" (a decision within fp32's rounding: the loose properties only)."""
    from fray.reference import sampling as rsa
    if not temp >= rsa.GREEDY_BELOW:
        best = int(rsa.argmax(l[None])[0])
        assert tok == best, "%s: greedy token %d, argmax %d" % (what, tok, best)
        assert lp == 0.0, "%s: greedy logprob %r" % (what, lp)
        return "greedy"
    assert 0 <= tok < l.shape[0], "%s: token %d outside the row" % (what, tok)
    assert np.isfinite(lp) and lp <= 0.0, "%s: logprob %r" % (what, lp)
    s = rsa.kept_sets(l, temp, top_k, top_p, min_p)
    w, keep_k = s["w"], s["top_k"]
    near = False
    loose = keep_k.copy()
    if 0 < top_p < 1:
        total = w[keep_k].sum()
        above = _greater_mass(l, w, keep_k)
        # (a token with nothing above it is kept by any p > 0: an empty sum is 0 in fp32 too)
        near |= bool((keep_k & (above > 0) & (np.abs(above - top_p * total) <= NEAR * total)).any())
        loose &= above < top_p * total + NEAR * total
    if min_p > 0:
        near |= bool((s["top_p"] & (np.abs(w - min_p) <= NEAR_MIN_P * min_p) & (l != l.max())).any())
        loose &= w >= min_p * (1 - NEAR_MIN_P)
    assert loose[tok] and w[tok] > 0, "%s: token %d (logit %r) is outside the kept set" % (what, tok, l[tok])
    if near:
        return "near"
    keep = s["min_p"]
    assert keep[tok], "%s: token %d is outside the kept set" % (what, tok)
    wk = np.where(keep, w, 0.0)
    c = np.cumsum(wk)
    mass = c[-1]
    u = rsa.uniform([seed], [offset])[0]
    assert c[tok] - wk[tok] - 1e-3 * mass <= u * mass < c[tok] + 1e-3 * mass, \
        "%s: u * C = %r outside token %d's interval [%r, %r)" % (what, u * mass, tok, c[tok] - wk[tok], c[tok])
    if np.abs(c[keep] - u * mass).min() <= NEAR * mass:
        return "near"
    etok, elp = rsa.sample(l[None], [temp], [top_k], [top_p], [min_p], [seed], [offset])
    assert tok == etok[0], "%s: token %d, reference %d" % (what, tok, etok[0])
    assert abs(lp - elp[0]) <= 1e-5 + 1e-4 * abs(elp[0]), "%s: logprob %r, reference %r" % (what, lp, elp[0])
    return "exact"


def _sample(backend, logits, params, tok, lp):
    """One draw per row into tok and lp: fray_triton.sampling (backend "triton") or fray.sample."""
    if backend == "triton":
        from fray_triton import sampling as ts
        ts.sample(logits, tok, lp, *params, logits.stride(0), *logits.shape)
        return
    temp, top_k, top_p, min_p, seeds, offsets = params
    got_tok, got_lp = _fray().sample(logits, temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seeds=seeds,
                                     offsets=offsets, return_logprobs=True, backend=backend)
    tok.copy_(got_tok)
    lp.copy_(got_lp)


def _run_sample(device, backend, logits, params):
    rows = logits.shape[0]
    tok = torch.full((rows,), -1, dtype=torch.int64)
    lp = torch.full((rows,), float("nan"))
    on(device, lambda *ts: _sample(backend, *ts), logits, params, tok, lp)
    return tok, lp


def _check_sample(logits, params, tok, lp, what, load):
    rows = logits.shape[0]
    l64 = _f64(logits, load).numpy()
    t, k, p, m, s, o = (v.tolist() for v in params)
    return [_check_sample_row(l64[r], t[r], k[r], p[r], m[r], s[r], o[r], int(tok[r]), float(lp[r]),
                              "%s row %d" % (what, r)) for r in range(rows)]


def _with_repeat(logits, params, r):
    """The batch with row r (its logits and parameters) appended again at the end."""
    return (torch.cat([logits, logits[r:r + 1]]), tuple(torch.cat([p, p[r:r + 1]]) for p in params))


def _sample_property(data, device, backend):
    """sample over 1-4 rows of 1-3000 fp32 / bf16 logits (rows inside wider buffers; past the
    1024-wide loop block), greedy and sampled rows mixed, top_k 0..V+2, top_p, min_p and temperature
    per row, 64-bit seeds and offsets; the last row repeats one of the others."""
    dtype = data.draw(st.sampled_from((FP32, BF16)))
    rows = data.draw(st.integers(1, 4))
    width = data.draw(st.one_of(st.integers(1, 40), st.integers(41, 3000)))
    params = _sample_params(data, rows, width)
    x = _sample_logits(data, rows, width, dtype, [float(t) < 2.0 ** -126 for t in params[0]])
    r = data.draw(st.integers(0, rows - 1))
    x, params = _with_repeat(x, params, r)
    _, logits = _padded(data, rows + 1, width, dtype)
    logits.copy_(x)
    tok, lp = _run_sample(device, backend, logits, params)
    _check_sample(logits, params, tok, lp, "sample %dx%d %s" % (rows, width, dtype), sees(device))
    assert tok[-1] == tok[r] and _bits(lp[-1:]).item() == _bits(lp[r:r + 1]).item(), \
        "the same row, seed and offset drew differently: %d vs %d" % (tok[-1], tok[r])


@settings(max_examples=15)
@given(data=st.data())
def test_triton_sample_matches_its_oracle(data):
    _sample_property(data, "cpu", "triton")


@gpu()
def test_gpu_sample_matches_its_oracle(backend, data):
    _sample_property(data, "cuda", backend)


def _decode_step_property(data, device, backend):
    """decode_step over 1-3 rows of 1-2000 fp32 / bf16 logits: the penalties in place on the logits
    as apply_penalties' oracle, the draw as sample's on the penalised logits. Backend "triton": the
    Triton composition (apply_penalties, then sample); "cuda": fray.decode_step."""
    dtype = data.draw(st.sampled_from((FP32, BF16)))
    rows = data.draw(st.integers(1, 3))
    width = data.draw(st.one_of(st.integers(1, 40), st.integers(41, 2000)))
    ids, offs = _history(data, rows, width)
    pen = _penalty_params(data, rows, extremes=False)  # sampled rows must stay free of +inf
    params = _sample_params(data, rows, width)
    x = _sample_logits(data, rows, width, dtype, [float(t) < 2.0 ** -126 for t in params[0]])
    _, logits = _padded(data, rows, width, dtype)
    logits.copy_(x)
    before = logits.clone()
    load = sees(device)
    if backend == "triton":
        on(device, lambda *ts: _apply_penalties(backend, *ts), logits, ids, offs, *pen)
        tok, lp = _run_sample(device, backend, logits, params)
    else:
        def launch(logits, ids, offs, pen, params):
            temp, top_k, top_p, min_p, seeds, offsets = params
            return _fray().decode_step(logits, ids, offs, repetition=pen[0], presence=pen[1], frequency=pen[2],
                                       temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seeds=seeds,
                                       offsets=offsets, return_logprobs=True, backend=backend)
        tok, lp = on(device, launch, logits, ids, offs, pen, params)
    _check_penalties(before, logits, ids, offs, *pen, "decode_step penalties %dx%d %s" % (rows, width, dtype), load)
    _check_sample(logits, params, tok, lp, "decode_step %dx%d %s" % (rows, width, dtype), load)


@settings(max_examples=10)
@given(data=st.data())
def test_triton_decode_step_matches_its_oracle(data):
    _decode_step_property(data, "cpu", "triton")


@gpu()
def test_gpu_decode_step_matches_its_oracle(backend, data):
    _decode_step_property(data, "cuda", backend)


# ---------------------------------------------------------------------------------------------
# moe_route, moe_dispatch, routed_grouped_gemm

def _divisors(n, most):
    return [d for d in range(1, min(n, most) + 1) if n % d == 0]


@st.composite
def route_args(draw, max_experts=64, scoring=None, grouped=None):
    e = draw(st.one_of(st.integers(1, 16), st.integers(17, max_experts)))
    sigmoid = draw(st.booleans()) if scoring is None else scoring == "sigmoid"
    groups = topk_group = 0
    if (draw(st.booleans()) if grouped is None else grouped) and e > 1:
        divisors = _divisors(e, 64)
        several = [d for d in divisors if 2 <= d <= e // 2]  # several groups of two experts or more
        groups = draw(st.one_of(st.sampled_from(several), st.sampled_from(divisors)) if several else
                      st.sampled_from(divisors))
        topk_group = draw(st.one_of(st.integers(1, max(1, groups - 1)), st.integers(1, groups)))
    limit = min(e, 8) if not groups else min(8, topk_group * (e // groups))
    return dict(e=e, top_k=draw(st.integers(1, limit)), sigmoid=sigmoid, groups=groups, topk_group=topk_group,
                renorm=draw(st.booleans()), scale=draw(st.sampled_from((1.0, 2.5, 0.375))))


def _route_logits(data, t, e, dtype, specials=True):
    """[T, E] router logits: N(0, 1) * 10^e (e <= 1: fp32 scores stay normal), a grid of distinct
    values, or ties (a few integers); special values sprinkled in."""
    mode = data.draw(st.sampled_from(("randn", "grid", "ties")))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    if mode == "randn":
        x = _values(data, (t, e), (-4, 1), None)
    elif mode == "grid":
        x = torch.stack([torch.randperm(e, generator=g).double() - e / 2 for _ in range(t)]) / 8
    else:
        x = torch.randint(-2, 3, (t, e), generator=g).double()
    if specials:
        pool = _specials(dtype, overflow=False) + [1e30, -1e30]
        for _ in range(data.draw(st.integers(0, min(t * e, 6)))):
            x[data.draw(st.integers(0, t - 1)), data.draw(st.integers(0, e - 1))] = pool[
                data.draw(st.integers(0, len(pool) - 1))]
    return x.to(dtype)


def _run_route(device, x, bias, a):
    """fray_triton.moe.route (the only backend moe_route has) on `device`."""
    t, e = x.shape
    w = torch.full((t, a["top_k"]), float("nan"))
    ids = torch.full((t, a["top_k"]), -7, dtype=torch.int32)
    counts = torch.zeros(e, dtype=torch.int32)

    def launch(x, bias, w, ids, counts):
        from fray_triton import moe as tmoe
        tmoe.route(x, bias, w, ids, counts, a["top_k"], a["sigmoid"], a["renorm"], a["groups"], a["topk_group"],
                   a["scale"])
    on(device, launch, x, bias, w, ids, counts)
    return w, ids, counts


def _check_route(x, bias, a, w, ids, counts, what, load):
    """The kernel's (w, ids, counts) against moe_route's documented selection (module docstring),
    on the inputs as the kernel sees them (load)."""
    from fray.reference import moe as rmoe
    x64 = _f64(x, load).numpy()
    b64 = None if bias is None else _f64(bias, load).numpy()
    t, e = x64.shape
    groups = a["groups"]
    s = rmoe.scores(x64, "sigmoid" if a["sigmoid"] else "softmax")
    sel = s if b64 is None else s + b64[None, :]
    sel = np.where(np.isnan(sel), -np.inf, sel)
    got = ids.numpy().astype(np.int64)
    bv = np.zeros(e) if b64 is None else b64
    for r in range(t):
        row, where = sel[r], "%s token %d" % (what, r)
        # equal (logit, bias) pairs (-0.0 == +0.0) have equal fp32 scores too, and so do all the
        # -inf (NaN) ones: those go to the lower id; other scores closer than tol may go either way
        key = [(0.0, 0.0, 0.0) if row[i] == -np.inf else (1.0, float(x64[r, i]), float(bv[i])) for i in range(e)]
        fin_s = np.abs(s[r][np.isfinite(s[r])])
        fin = np.abs(row[np.isfinite(row)])
        tol = 1e-5 * (fin_s.max() if fin_s.size else 0.0) + 2.0 ** -22 * (fin.max() if fin.size else 0.0)
        eligible = np.ones(e, bool)
        if groups:
            gs = e // groups
            gv = row.reshape(groups, gs)
            top2 = np.argsort(-gv, axis=1, kind="stable")[:, :min(2, gs)]
            gscore = np.take_along_axis(gv, top2, 1).sum(axis=1)
            gkey = [tuple(sorted(key[g * gs + j] for j in top2[g])) for g in range(groups)]
            ranked = np.sort(gscore)[::-1]
            last = ranked[a["topk_group"] - 1]
            if a["topk_group"] == groups:
                definite = set(range(groups))
            else:  # above the best group left out by more than fp32's rounding
                definite = set(np.nonzero(gscore > ranked[a["topk_group"]] + 2 * tol)[0].tolist())
            kept = set((got[r] // gs).tolist()) | definite
            assert len(kept) <= a["topk_group"], "%s: experts from groups %s, %d kept" % (where, sorted(kept),
                                                                                         a["topk_group"])
            out = [g for g in kept if gscore[g] < last - 2 * tol]
            assert not out, "%s: group %s (score %r) kept below the %d best (%r)" % (where, out, gscore[out[0]],
                                                                                 a["topk_group"], last)
            if len(kept) == a["topk_group"]:  # the kernel's kept groups are known: equal ones to the lower id
                for g in kept:
                    lower = [h for h in range(g) if h not in kept and gkey[h] == gkey[g]]
                    assert not lower, "%s: group %d kept over the equal group %d" % (where, g, lower[0])
            eligible = np.repeat(np.isin(np.arange(groups), sorted(kept)), gs)
        remaining = eligible.copy()
        for rank, c in enumerate(got[r].tolist()):
            assert 0 <= c < e and remaining[c], "%s: id %d at rank %d not eligible (ids %s)" % (
                where, c, rank, got[r].tolist())
            best = row[remaining].max()
            assert row[c] >= best - tol, "%s: rank %d id %d (score %r) below the best remaining %r" % (
                where, rank, c, row[c], best)
            lower = [j for j in range(c) if remaining[j] and key[j] == key[c]]
            assert not lower, "%s: rank %d took id %d over the equal id %d" % (where, rank, c, lower[0])
            remaining[c] = False
        # weights: the float64 scores of the chosen ids
        ws = s[r, got[r]]
        with np.errstate(invalid="ignore", divide="ignore"):
            ew = (ws / ws.sum() if a["renorm"] else ws) * a["scale"]
        gw = w[r].double().numpy()
        assert np.array_equal(np.isnan(gw), np.isnan(ew)), "%s: NaN weights %s vs %s" % (where, gw, ew)
        ok = ~np.isnan(ew)
        # fp32 exp's argument rounding: 2^-24 |argument| relative for each weight (arguments past
        # 100 give weights below e^-100, inside atol) and as much again for their sum
        arg = x64[r, got[r]] - (np.nanmax(x64[r]) if not a["sigmoid"] else 0.0)
        arg = np.abs(arg[np.isfinite(arg) & (np.abs(arg) < 100)])
        rtol = 1e-5 + 2.0 ** -22 * (arg.max() if arg.size else 0.0)
        assert (np.abs(gw[ok] - ew[ok]) <= 1e-6 + rtol * np.abs(ew[ok])).all(), "%s: weights %s vs %s" % (
            where, gw, ew)
    assert np.array_equal(counts.numpy(), np.bincount(got.reshape(-1), minlength=e)), "%s: counts" % what


def _moe_route_property(data, device):
    """moe_route (Triton only) over 1-12 tokens of 1-64 experts (fp32 / fp16 / bf16 logits, rows inside wider
    buffers), softmax or sigmoid, top_k 1..min(E, 8), grouped selection over every divisor of E,
    a correction bias or none, renormalised or not, scaled; ties, grids and special values."""
    a = data.draw(route_args())
    t = data.draw(st.integers(1, 12))
    dtype = data.draw(st.sampled_from((FP32, FP16, BF16)))
    x = _route_logits(data, t, a["e"], dtype)
    bias = None
    if data.draw(st.booleans()):
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
        bias = (torch.randint(-4, 5, (a["e"],), generator=g).float() / 64).to(
            data.draw(st.sampled_from((FP32, BF16))))
    _, logits = _padded(data, t, a["e"], dtype)
    logits.copy_(x)
    w, ids, counts = _run_route(device, logits, bias, a)
    _check_route(logits, bias, a, w, ids, counts, "moe_route T%d %s %s" % (t, a, dtype), sees(device))


@settings(max_examples=20)
@given(data=st.data())
def test_triton_moe_route_matches_its_oracle(data):
    _moe_route_property(data, "cpu")


@gpu(("triton",), max_examples=50)
def test_gpu_moe_route_matches_its_oracle(backend, data):
    _moe_route_property(data, "cuda")


def _moe_dispatch_property(data, device):
    """moe_dispatch (Triton only) over 0-300 tokens, k 1-8, 1-64 experts (and a few wider), every power-of-two
    block_m up to 1024, int32 or int64 ids (distinct per token, repeated, or skewed onto a few
    experts), with or without an expert map (many-to-one and -1 entries): every output equal to the
    reference, exactly, each element written."""
    from fray.ops import moe as M
    from fray.reference import moe as rmoe
    t = data.draw(st.one_of(st.integers(0, 3), st.integers(4, 300)))
    e = data.draw(st.one_of(st.integers(1, 64), st.sampled_from((255, 1000, 4096))))
    k = data.draw(st.integers(1, 8))
    block_m = 2 ** data.draw(st.integers(0, 10))
    emap = None
    e_ids = e
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    if data.draw(st.booleans()):
        e_ids = data.draw(st.integers(1, 80))
        emap = torch.randint(-1, e, (e_ids,), generator=g, dtype=torch.int32)
    mode = data.draw(st.sampled_from(("distinct", "random", "skew")))
    if mode == "distinct" and k <= e_ids and t:
        ids = torch.stack([torch.randperm(e_ids, generator=g)[:k] for _ in range(t)])
    elif mode == "skew":
        ids = torch.randint(0, 3, (t, k), generator=g) ** 2 % e_ids
    else:
        ids = torch.randint(0, e_ids, (t, k), generator=g)
    ids = ids.to(data.draw(st.sampled_from((torch.int32, torch.int64)))).contiguous()
    outs = M._dispatch_outputs(ids, e, block_m)
    for o in outs[1:5]:
        o.fill_(-99)

    def launch(ids, emap, *outs):
        from fray_triton import moe as tmoe
        tmoe.dispatch(ids, emap, e, block_m, *outs)
    on(device, launch, ids, emap, *outs)
    want = rmoe.moe_dispatch(ids.numpy(), e, block_m, None if emap is None else emap.numpy())
    for name, got, exp in zip(M.MoeDispatch._fields, outs[:6], want):
        assert got.dtype == torch.int32 and np.array_equal(got.numpy(), exp), \
            "moe_dispatch T%d k%d E%d m%d map=%s: %s differs" % (t, k, e, block_m, emap is not None, name)


@settings(max_examples=20)
@given(data=st.data())
def test_triton_moe_dispatch_matches_its_oracle(data):
    _moe_dispatch_property(data, "cpu")


@gpu(("triton",), max_examples=15)
def test_gpu_moe_dispatch_matches_its_oracle(backend, data):
    _moe_dispatch_property(data, "cuda")


def _routed_grouped_gemm_property(data, device):
    """routed_grouped_gemm's Triton path (its only one): softmax top-k routing (moe_route's kernel, renormalised or
    not; ties, grids, -inf and +-1e30 logits) then the routed GEMM at random T (1-24), K and N (1-70,
    no multiple of the 32-wide tiles needed), E (1-16), top_k up to min(E, 8), rows of x wider than
    their data, either layout (contiguous or a transposed view), every combine mode, against the
    float64 routed product with every rounding of the unfused chain (fray.testing's MoE bound)."""
    from fray.ops import moe_gemm as MG
    t, kd, n = data.draw(st.integers(1, 24)), data.draw(st.integers(1, 70)), data.draw(st.integers(1, 70))
    e = data.draw(st.integers(1, 16))
    top_k = data.draw(st.integers(1, min(e, 8)))
    dtype = data.draw(st.sampled_from((BF16, FP16)))
    layout = data.draw(st.sampled_from(("nk", "kn")))
    combine = data.draw(st.sampled_from(("auto", "atomic", "staged", "scatter")))
    a = dict(e=e, top_k=top_k, sigmoid=False, groups=0, topk_group=0, renorm=data.draw(st.booleans()), scale=1.0)
    logits = _route_logits(data, t, e, FP32, specials=False)
    pool = [float("-inf"), 1e30, -1e30, 0.0, -0.0]
    for _ in range(data.draw(st.integers(0, 3))):
        logits[data.draw(st.integers(0, t - 1)), data.draw(st.integers(0, e - 1))] = pool[
            data.draw(st.integers(0, len(pool) - 1))]
    logits[~torch.isfinite(logits).any(1), 0] = 0.0  # a row of -inf only routes NaN weights
    w, ids, counts = _run_route(device, logits, None, a)
    _check_route(logits, None, a, w, ids, counts, "routed_grouped_gemm routing", sees(device))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    _, x = _padded(data, t, kd, dtype)
    x.copy_(torch.randn(t, kd, generator=g).to(dtype))
    b = (torch.randn(e, n, kd, generator=g) / kd ** 0.5).to(dtype)
    if layout == "kn":
        b = b.transpose(1, 2).contiguous() if data.draw(st.booleans()) else b.transpose(1, 2)
    out = torch.full((t, n), float("nan"), dtype=dtype)
    on(device, lambda *ts: MG._routed(*ts, layout, combine), x, b, w, ids, out)
    MG.check_routed(x, b, w, ids, out, "routed T%d K%d N%d E%d k%d %s %s %s" % (t, kd, n, e, top_k, dtype, layout,
                                                                              combine), layout)


@settings(max_examples=12)
@given(data=st.data())
def test_triton_routed_grouped_gemm_matches_its_oracle(data):
    _routed_grouped_gemm_property(data, "cpu")


@gpu(("triton",), max_examples=10)
def test_gpu_routed_grouped_gemm_matches_its_oracle(backend, data):
    _routed_grouped_gemm_property(data, "cuda")


# ---------------------------------------------------------------------------------------------
# quantize, dequantize, rmsnorm_quant, silu_mul_quant, w8a16_gemm (int8)

GRANULARITIES = [("tensor", None), ("token", None), ("channel", None), ("block", (1, 128)), ("block", (128, 128))]


def _quant_shape(data, wide=True):
    """(M, K): 1-70 rows, or 129-300 (past one 128-row block), of 1-600 columns; one time in ten
    past the 16384-element register rows (the per-group kernel)."""
    if wide and data.draw(st.integers(0, 9)) == 0:
        return data.draw(st.integers(1, 2)), data.draw(st.integers(16385, 16700))
    m = data.draw(st.one_of(st.integers(1, 70), st.integers(129, 300)))
    return m, data.draw(st.one_of(st.integers(1, 40), st.integers(41, 600 if m <= 70 else 200)))


def _quant_x(data, m, k, dtype):
    """x [m, k]: N(0, 1) * 10^e with special values, or exact midpoints: half-integers times 2^p
    with 127 * 2^p in every group, so that a dynamic scale is 2^p and x / scale lands on k + 0.5."""
    if data.draw(st.booleans()):
        return _values(data, (m, k), (-40, 30) if dtype == FP32 else (-6, 4), _specials(dtype)).to(dtype), None
    p = data.draw(st.integers(-8, 8))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    x = torch.randint(-254, 255, (m, k), generator=g).double() / 2
    x[:, ::128] = 127.0  # in every group: token, channel, and both block shapes
    x[0, :] = 127.0
    return (x * 2.0 ** p).to(dtype), 2.0 ** p


def _quantize_property(data, device):
    """quantize (Triton only) to int8 at every granularity, dynamic or static scales (special ones among them),
    shapes of _quant_shape, fp32 / fp16 / bf16, rows of x and q inside wider buffers: q and the
    scales equal to the reference bit for bit."""
    from fray.ops import quant as Q
    from fray.reference import quant as rq
    gran, block = data.draw(st.sampled_from(GRANULARITIES))
    dtype = data.draw(st.sampled_from((FP32, FP16, BF16)))
    m, k = _quant_shape(data)
    xv, pow2 = _quant_x(data, m, k, dtype)
    _, x = _padded(data, m, k, dtype)
    x.copy_(xv)
    scale = None
    if data.draw(st.booleans()):
        shape = rq.scale_shape(gran, m, k, block)
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
        if pow2 is not None:
            scale = torch.full(shape, pow2, dtype=FP32)
        else:
            scale = ((torch.rand(shape, generator=g) + 0.5) * 2.0 ** data.draw(st.integers(-20, 10))).float()
            pool = [0.0, 2.0 ** -140, 2.0 ** -126, 1e30]  # used as given: x / 0 saturates, 0 / 0 is NaN -> 0
            flat = scale.view(-1)
            for _ in range(data.draw(st.integers(0, min(flat.numel(), 2)))):
                flat[data.draw(st.integers(0, flat.numel() - 1))] = pool[data.draw(st.integers(0, len(pool) - 1))]
    qbuf, q = _padded(data, m, k, I8, fill=99)
    qb = qbuf.clone()
    _, s, amax = Q._quantize_outputs(x, I8, gran, block, scale, q)
    if scale is None:
        s.fill_(-1.0)
    given_scale = None if scale is None else scale.clone()

    def launch(x, q, s, amax):
        from fray_triton import quant as tq
        tq.quantize(x, q, s, gran, block, 127.0, False, scale is not None, amax)
    on(device, launch, x, q, s, amax)
    eq, es = rq.quantize(_f64(x, sees(device)).numpy(), "int8", gran, block, None if scale is None else scale.numpy())
    what = "quantize %dx%d %s %s%s %s" % (m, k, gran, block or "", " static" if scale is not None else "", dtype)
    assert np.array_equal(q.numpy().astype(np.float64), eq), "%s: %d values differ" % (
        what, int((q.numpy() != eq).sum()))
    if scale is None:
        assert np.array_equal(_bits(s).numpy(), _bits(torch.from_numpy(es.reshape(s.shape))).numpy()), \
            "%s: scales differ" % what
    else:
        assert s is scale and torch.equal(_bits(s), _bits(given_scale)), "%s: the static scale changed" % what
    assert torch.equal(qbuf[:, k:], qb[:, k:]), "%s: q's row padding was written" % what


@settings(max_examples=20)
@given(data=st.data())
def test_triton_quantize_matches_its_oracle(data):
    _quantize_property(data, "cpu")


@gpu(("triton",), max_examples=50)
def test_gpu_quantize_matches_its_oracle(backend, data):
    _quantize_property(data, "cuda")


def _dequantize_property(data, device):
    """dequantize (Triton only) int8 at every granularity to fp32 / fp16, 1-300 rows of 1-600 columns, q and the
    output inside wider buffers, scales over 60 binades with special values (0, subnormal, inf, NaN,
    negative): x = fp32(q * scale) rounded once, bit for bit."""
    from fray.reference import quant as rq
    gran, block = data.draw(st.sampled_from(GRANULARITIES))
    dtype = data.draw(st.sampled_from((FP32, FP16)))
    m, k = _quant_shape(data, wide=False)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    _, q = _padded(data, m, k, I8, fill=0)
    q.copy_(torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int32).to(I8))
    shape = rq.scale_shape(gran, m, k, block)
    s = ((torch.rand(shape, generator=g) + 0.5) * 2.0 ** data.draw(st.integers(-30, 30))).float()
    pool = [0.0, -1.0, 2.0 ** -140, float("inf"), float("nan"), 1e30, 2.0 ** -126]
    if s.numel():
        flat = s.view(-1)
        for _ in range(data.draw(st.integers(0, min(flat.numel(), 3)))):
            flat[data.draw(st.integers(0, flat.numel() - 1))] = pool[data.draw(st.integers(0, len(pool) - 1))]
    obuf, out = _padded(data, m, k, dtype)
    ob = obuf.clone()

    def launch(q, s, out):
        from fray_triton import quant as tq
        tq.dequantize(q, s, out, gran, block)
    on(device, launch, q, s, out)
    want = torch.from_numpy(rq.dequantize(q.numpy(), s.numpy(), gran, block)).to(dtype)
    _assert_same(out, want, "dequantize %dx%d %s %s %s" % (m, k, gran, block or "", dtype))
    assert torch.equal(_bits(obuf[:, k:]), _bits(ob[:, k:])), "dequantize: the output rows' padding was written"


@settings(max_examples=20)
@given(data=st.data())
def test_triton_dequantize_matches_its_oracle(data):
    _dequantize_property(data, "cpu")


@gpu(("triton",), max_examples=100)
def test_gpu_dequantize_matches_its_oracle(backend, data):
    _dequantize_property(data, "cuda")


def _round_to(v, dtype):
    """float64 numpy values rounded to dtype (to nearest even), as float64."""
    return torch.from_numpy(np.ascontiguousarray(v, np.float64)).to(dtype).double().numpy()


def _q_int8(v, sv):
    """int8 quantization of the dtype values v by the fp32 scales sv: rint(fp32(v / sv)) saturated
    to +-127, NaN -> 0 (monotone in v for sv > 0)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        y = (v.astype(np.float32) / sv.astype(np.float32)).astype(np.float64)
    return np.where(np.isnan(y), 0.0, np.rint(np.clip(y, -127.0, 127.0)))


def _check_fused_quant(q, s, y, terms, dtype, static, what):
    """q int8 [R, D] and scales [R, 1] of a fused producer against y, the float64 exact value:
    the kernel's value y_k is y after fp32 math (1e-5 relative to the terms, 1e-40 absolute)
    rounded to dtype, so it lies in [round(y - err), round(y + err)]; its row's dynamic scale is
    fp32(amax / 127) (1 for 0) of an amax inside the interval those bounds give, and q lies
    between the quantizations of the two bounds by the kernel's scale."""
    fin = np.isfinite(y)
    err = 1e-5 * np.maximum(np.where(fin, np.abs(y), 0.0), terms) + 1e-40
    lo, hi = _round_to(np.where(fin, y - err, y), dtype), _round_to(np.where(fin, y + err, y), dtype)
    big = float(torch.finfo(dtype).max)
    both = np.isfinite(lo) & np.isfinite(hi)
    straddle = (lo <= 0) & (hi >= 0)
    m_lo = np.where(both & ~straddle, np.minimum(np.abs(lo), np.abs(hi)), 0.0)
    m_hi = np.where(both, np.maximum(np.abs(lo), np.abs(hi)), np.where(np.isfinite(lo) | np.isfinite(hi), big, 0.0))
    m_lo, m_hi = np.where(np.isnan(y), 0.0, m_lo), np.where(np.isnan(y), 0.0, m_hi)
    sv = s.double().numpy().reshape(-1, 1) if static is None else np.broadcast_to(
        static.double().numpy().reshape(-1, 1), (y.shape[0], 1))
    if static is None:
        a_lo, a_hi = m_lo.max(axis=1, keepdims=True), m_hi.max(axis=1, keepdims=True)
        s_lo = (a_lo.astype(np.float32) / np.float32(127)).astype(np.float64)
        s_hi = (a_hi.astype(np.float32) / np.float32(127)).astype(np.float64)
        ok = ((sv >= s_lo) & (sv <= s_hi) & (sv > 0)) | ((s_lo == 0) & (sv == 1.0))
        assert ok.all(), "%s: row %d scale %r outside [%r, %r]" % (what, int(np.argmin(ok[:, 0])), float(
            sv[~ok][0]), float(s_lo[~ok][0]), float(s_hi[~ok][0]))
    svb = np.broadcast_to(sv, y.shape)
    qv = q.numpy().astype(np.float64)
    q_lo, q_hi = _q_int8(lo, svb), _q_int8(hi, svb)
    bad = (qv < q_lo) | (qv > q_hi)
    assert not bad.any(), "%s: %d of %d values off; first at %s: q %r, allowed [%r, %r] (y %r, scale %r)" % (
        what, int(bad.sum()), bad.size, np.unravel_index(np.argmax(bad), bad.shape), qv[bad][0], q_lo[bad][0],
        q_hi[bad][0], y[bad][0], svb[bad][0])


NORM_SPECIALS = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e-40, -1e-40, 1.0]


def _static_scale(data, rows):
    if not data.draw(st.booleans()):
        return None, 1
    e = data.draw(st.integers(-12, 2))
    if data.draw(st.booleans()):
        return torch.tensor([2.0 ** e * data.draw(st.floats(0.5, 1.5))], dtype=FP32), 0
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    return ((torch.rand(rows, 1, generator=g) + 0.5) * 2.0 ** e).float(), 1


def _fused_shape(data):
    """(rows, width): 1-9 rows of 1-700, 10-150 rows of 1-64 (several programs of packed short
    rows), or one time in eight 1-2 rows past the 16384-element register rows (the looped kernel)."""
    kind = data.draw(st.integers(0, 7))
    if kind == 0:
        return data.draw(st.integers(1, 2)), data.draw(st.integers(16385, 16600))
    if kind == 1:
        return data.draw(st.integers(10, 150)), data.draw(st.integers(1, 64))
    return data.draw(st.integers(1, 9)), data.draw(st.one_of(st.integers(1, 40), st.integers(41, 700)))


def _rmsnorm_quant_property(data, device):
    """rmsnorm_quant (Triton only) to int8 over the shapes of _fused_shape, fp32 / fp16 / bf16 values with special
    values (NaN rows, zero rows, inf), weights of x's dtype or fp32, a weight offset, an optional
    residual (its rounded sum written back, bit for bit), dynamic or static scales (one, or one per
    row), rows of x, the residual and q inside wider buffers."""
    from fray.reference import norm as rnorm
    dtype = data.draw(st.sampled_from((FP32, FP16, BF16)))
    rows, h = _fused_shape(data)
    xv = _values(data, (rows, h), (-8, 8), NORM_SPECIALS)
    if rows > 1 and data.draw(st.booleans()):
        xv[data.draw(st.integers(0, rows - 1))] = 0.0
    _, x = _padded(data, rows, h, dtype)
    x.copy_(xv.to(dtype))
    wdt = data.draw(st.sampled_from((dtype, FP32)))
    w = _values(data, (h,), (-1, 1), None).to(wdt)
    offset = data.draw(st.sampled_from((0.0, 1.0, 0.5)))
    eps = data.draw(st.sampled_from((1e-6, 1e-5)))
    residual = r0 = None
    if data.draw(st.booleans()):
        _, residual = _padded(data, rows, h, dtype)
        residual.copy_(_values(data, (rows, h), (-8, 8), NORM_SPECIALS).to(dtype))
        r0 = residual.clone()
    static, s_stride = _static_scale(data, rows)
    qbuf, q = _padded(data, rows, h, I8, fill=99)
    s = static if static is not None else torch.full((rows, 1), -1.0)

    def launch(x, residual, w, q, s):
        from fray_triton import rmsnorm_quant as tk
        tk.rmsnorm_quant(x, residual, w, q, s, eps, offset, 127.0, False, static is not None, x.stride(0),
                         0 if residual is None else residual.stride(0), q.stride(0), s_stride, rows, h)
    on(device, launch, x, residual, w, q, s)
    load = sees(device)
    what = "rmsnorm_quant %dx%d %s w %s offset %g%s%s" % (rows, h, dtype, wdt, offset, " residual" if r0 is not None
                                                          else "", " static" if static is not None else "")
    src = x
    if r0 is not None:
        want = (load(x).float() + load(r0).float()).to(dtype)
        _assert_same(residual, want, what + " sum")
        src = residual
    x64, w64 = _f64(src, load).numpy(), _f64(w, load).numpy()
    y = rnorm.rmsnorm(x64, w64, eps, offset)
    with np.errstate(invalid="ignore", over="ignore"):
        xhat = rnorm.rmsnorm(x64, np.ones_like(w64), eps)
        terms = np.nan_to_num(np.abs(xhat) * (np.abs(w64) + abs(offset)), nan=0.0, posinf=0.0)
    _check_fused_quant(q, s, y, terms, dtype, static, what)
    assert torch.equal(qbuf[:, h:], torch.full_like(qbuf[:, h:], 99)), "%s: q's row padding was written" % what


@settings(max_examples=15)
@given(data=st.data())
def test_triton_rmsnorm_quant_matches_its_oracle(data):
    _rmsnorm_quant_property(data, "cpu")


@gpu(("triton",), max_examples=50)
def test_gpu_rmsnorm_quant_matches_its_oracle(backend, data):
    _rmsnorm_quant_property(data, "cuda")


def _silu_mul_quant_property(data, device):
    """silu_mul_quant (Triton only) to int8 over the shapes of _fused_shape, the fused [gate | up] layout or
    separate gate and up (strided), fp32 / fp16 / bf16 with special values, dynamic or static
    scales (one, or one per row)."""
    from fray.reference import activation as ract
    dtype = data.draw(st.sampled_from((FP32, FP16, BF16)))
    rows, d = _fused_shape(data)
    pool = _specials(dtype, overflow=False) + [1e30, -1e30]
    fused = data.draw(st.booleans())
    if fused:
        _, x = _padded(data, rows, 2 * d, dtype)
        x.copy_(_values(data, (rows, 2 * d), (-3, 1), pool).to(dtype))
        gate, up = x[:, :d], x[:, d:]
    else:
        _, gate = _padded(data, rows, d, dtype)
        _, up = _padded(data, rows, d, dtype)
        gate.copy_(_values(data, (rows, d), (-3, 1), pool).to(dtype))
        up.copy_(_values(data, (rows, d), (-3, 1), pool).to(dtype))
    if rows > 1 and data.draw(st.booleans()):
        gate[data.draw(st.integers(0, rows - 1))] = 0.0
    static, s_stride = _static_scale(data, rows)
    qbuf, q = _padded(data, rows, d, I8, fill=99)
    s = static if static is not None else torch.full((rows, 1), -1.0)

    def launch(gate, up, q, s):
        from fray_triton import silu_mul_quant as tk
        tk.silu_mul_quant(gate, up, q, s, 127.0, False, static is not None, gate.stride(0), up.stride(0),
                          q.stride(0), s_stride, rows, d)
    on(device, launch, gate, up, q, s)
    with np.errstate(invalid="ignore", over="ignore"):
        y = ract.silu_mul(_f64(gate, sees(device)).numpy(), _f64(up, sees(device)).numpy())
    what = "silu_mul_quant %dx%d %s %s%s" % (rows, d, dtype, "fused" if fused else "split",
                                            " static" if static is not None else "")
    _check_fused_quant(q, s, y, np.zeros_like(y), dtype, static, what)
    assert torch.equal(qbuf[:, d:], torch.full_like(qbuf[:, d:], 99)), "%s: q's row padding was written" % what


@settings(max_examples=15)
@given(data=st.data())
def test_triton_silu_mul_quant_matches_its_oracle(data):
    _silu_mul_quant_property(data, "cpu")


@gpu(("triton",), max_examples=40)
def test_gpu_silu_mul_quant_matches_its_oracle(backend, data):
    _silu_mul_quant_property(data, "cuda")


def _w8a16_property(data, device, backend):
    """w8a16_gemm with int8 weights at random M (1-80: each of the three tiles by M), N (1-150),
    K (1-300: one to three 128-deep groups, no multiple needed), every scale kind and shape
    ([] / [1], [N] / [N, 1], [N, ceil(K / 128)]), scales over 24 binades, with or without bias,
    rows of x, w and out inside wider buffers, weights from the full int8 range or +-127 / 0 only,
    bf16 / fp16 activations, against the float64 product within fray.testing's GEMM bound.
    Backend "triton": fray_triton.w8a16_gemm; "cuda": fray.w8a16_gemm (JIT) on what it takes (its
    docstring: M <= 16, K a multiple of 16, 16-byte row strides of x and w: M folded into 1-8, K
    rounded up to 16, the padding in 16-byte units) over two translation units: bf16, no bias,
    per-channel (tensor and channel scales) or per-group scales (the draws of dtype and bias are
    made and overridden)."""
    from fray.ops import quant as Q
    jit = backend == "cuda"
    dtype = data.draw(st.sampled_from((BF16, FP16)))
    dtype = BF16 if jit else dtype
    m, n, k = data.draw(st.integers(1, 80)), data.draw(st.integers(1, 150)), data.draw(st.integers(1, 300))
    if jit:
        m, k = (m - 1) % 8 + 1, -(-k // 16) * 16
    kind = data.draw(st.sampled_from(("tensor", "channel", "group")))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    _, x = _padded(data, m, k, dtype, unit=8 if jit else 1)
    x.copy_((torch.randn(m, k, generator=g) * 2.0 ** data.draw(st.integers(-4, 2))).to(dtype))
    _, w = _padded(data, n, k, I8, fill=0, unit=16 if jit else 1)
    if data.draw(st.booleans()):
        w.copy_((torch.randint(-1, 2, (n, k), generator=g) * 127).to(I8))
    else:
        w.copy_(torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int32).to(I8))
    shape = {"tensor": data.draw(st.sampled_from(((), (1,)))), "channel": data.draw(st.sampled_from(((n,), (n, 1)))),
             "group": (n, -(-k // 128))}[kind]
    # fp16 out: K * 127 * |x| * scale stays under 65504
    s = ((torch.rand(shape, generator=g) + 0.5) * 2.0 ** data.draw(
        st.integers(-20, -12 if dtype == FP16 else 4))).float()
    bias = torch.randn(n, generator=g).to(dtype) if data.draw(st.booleans()) and not jit else None
    obuf, out = _padded(data, m, n, dtype)

    def launch(x, w, s, bias, out):
        if backend == "triton":
            from fray_triton import w8a16_gemm as tw
            tw.w8a16_gemm(x, w, s, Q._w8a16_lds(Q._w8a16_kind(s, n, k), s), kind == "group", bias, out,
                          tw.config_for(m))
        else:
            _fray().w8a16_gemm(x, w, s, bias=bias, out=out, backend=backend)
    on(device, launch, x, w, s, bias, out)
    Q.assert_w8a16_close(out, sees(device)(x), w, s, Q._w8a16_kind(s, n, k), bias,
                         what="w8a16 %dx%dx%d %s %s %s" % (m, n, k, kind, tuple(shape), dtype))
    assert torch.isnan(obuf[:, n:].float()).all(), "w8a16: out's row padding was written"


@settings(max_examples=15)
@given(data=st.data())
def test_triton_w8a16_gemm_matches_its_oracle(data):
    _w8a16_property(data, "cpu", "triton")


@gpu(max_examples=50)
def test_gpu_w8a16_gemm_matches_its_oracle(backend, data):
    _w8a16_property(data, "cuda", backend)

