"""fray.sample: Philox known answer, each filter's kept set by hand, the inverse-CDF pick,
determinism, a chi-square test of the reference sampler, Triton (interpreter) vs reference,
errors, the CUDA extension's Philox (host); GPU, for the cuda and triton backends: agreement with the
reference over vocab sizes, exact kept sets after each filter, determinism and batch independence, a
chi-square test over seeds, greedy/sampled rows mixed, CUDA-graph replay with bumped offsets,
streams, torch.compile."""
import math
import os

import numpy as np
import pytest
import torch

import fray
from fray.reference import sampling as ref

INTERP = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
RANDOM123_KAT = [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


# ---------------------------------------------------------------------------------------------
# Philox-4x32-10

def test_philox_known_answer_reference():
    assert [int(v) for v in ref.philox4x32_10((0, 0, 0, 0), (0, 0))] == RANDOM123_KAT
    # Random123's second known answer: all-ones counter and key.
    out = ref.philox4x32_10((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2)
    assert [int(v) for v in out] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


@INTERP
def test_philox_known_answer_triton():
    from fray_triton import sampling as ts
    out = torch.zeros(4, dtype=torch.int64)
    ts.philox(torch.zeros(4, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), out)
    assert out.tolist() == RANDOM123_KAT
    ctr = torch.tensor([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344])
    key = torch.tensor([0xA4093822, 0x299F31D0])
    ts.philox(ctr, key, out)
    assert out.tolist() == [int(v) for v in ref.philox4x32_10(ctr.tolist(), key.tolist())]


def test_uniform_is_24_bit_and_split_into_seed_and_offset_words():
    u = ref.uniform([1, 1, 2, -1], [0, 1 << 32, 0, 5])
    assert np.all((u >= 0) & (u < 1)) and np.all(u * 2 ** 24 == np.floor(u * 2 ** 24))
    assert len(set(u.tolist())) == 4  # the high words of seed and offset matter
    x = ref.philox4x32_10((0, 1, 0, 0), (1, 0))[0]
    assert u[1] == (int(x) >> 8) * 2.0 ** -24


# ---------------------------------------------------------------------------------------------
# the filters' kept sets, by hand

def _kept(l, t=1.0, k=0, p=1.0, m=0.0):
    s = ref.kept_sets(np.log(np.asarray(l, dtype=np.float64)), t, k, p, m)
    return {name: np.nonzero(s[name])[0].tolist() for name in ("top_k", "top_p", "min_p")}


def test_top_k_keeps_ties_at_the_threshold():
    assert _kept([4, 3, 3, 2], k=2)["top_k"] == [0, 1, 2]
    assert _kept([4, 3, 3, 2], k=1)["top_k"] == [0]
    assert _kept([4, 3, 3, 2], k=4)["top_k"] == [0, 1, 2, 3]  # k = width: off
    assert _kept([4, 3, 3, 2], k=0)["top_k"] == [0, 1, 2, 3]


def test_top_p_threshold_ties_kept():
    # probabilities 1/3, 1/4, 1/4, 1/6: the sum reaches 0.5 at the second token, whose tie stays.
    assert _kept([4, 3, 3, 2], p=0.5)["top_p"] == [0, 1, 2]
    assert _kept([4, 3, 3, 2], p=0.3)["top_p"] == [0]
    assert _kept([4, 3, 3, 2], p=0.9)["top_p"] == [0, 1, 2, 3]
    # index order does not matter: the tie sits before the max
    assert _kept([3, 2, 4, 3], p=0.5)["top_p"] == [0, 2, 3]


def test_filters_apply_in_order_top_k_then_top_p_then_min_p():
    # top-k=2 keeps [4, 3, 3] (tie); renormalised 0.4, 0.3, 0.3: p=0.35 keeps the max only,
    # p=0.65 all three (tie at the threshold).
    assert _kept([4, 3, 3, 2], k=2, p=0.35)["top_p"] == [0]
    assert _kept([4, 3, 3, 2], k=2, p=0.65)["top_p"] == [0, 1, 2]
    # min-p is relative to the max: 0.6 keeps w >= 0.6 -> the 4 and both 3s (0.75), not the 2.
    s = _kept([4, 3, 3, 2], m=0.6)
    assert s["min_p"] == [0, 1, 2]
    assert _kept([4, 3, 3, 2], m=0.8)["min_p"] == [0]
    # temperature flattens before top-p: at T = 100 all four are nearly equal, p=0.5 -> 2 tokens
    s = ref.kept_sets(np.log([4.0, 3.0, 3.0, 2.0]), 100.0, 0, 0.5, 0.0)
    assert np.nonzero(s["top_p"])[0].tolist() == [0, 1, 2]


def test_inverse_cdf_pick_by_hand():
    # w = [0.5, 0.5, 1], S = 2, c = [0.5, 1, 2]: token = first c > 2u.
    logits = np.log(np.array([[1.0, 1.0, 2.0]]))
    for seed in range(40):
        u = ref.uniform([seed], [3])[0]
        tok, lp = ref.sample(logits, [1.0], [0], [1.0], [0.0], [seed], [3])
        expect = 0 if 2 * u < 0.5 else (1 if 2 * u < 1 else 2)
        assert tok[0] == expect
        assert lp[0] == pytest.approx(math.log([0.25, 0.25, 0.5][expect]))


def test_greedy_rows_and_determinism():
    l = torch.tensor([[1.0, 5.0, 5.0, 2.0], [0.0, 1.0, 2.0, 3.0]])
    tok, lp = fray.sample(l, temperature=torch.tensor([0.0, 1.0]), seeds=7, offsets=torch.tensor([1, 2]),
                          return_logprobs=True)
    assert tok[0] == 1 and lp[0] == 0.0  # greedy: tie -> lower index, point mass
    again = fray.sample(l, temperature=torch.tensor([0.0, 1.0]), seeds=7, offsets=torch.tensor([1, 2]))
    assert torch.equal(tok, again)
    x = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    toks = {int(fray.sample(x, temperature=1.0, seeds=3, offsets=o)[0]) for o in range(20)}
    assert len(toks) > 10  # bumping the offset gives fresh draws
    assert all(int(fray.sample(x, temperature=1.0, seeds=3, offsets=o)[0]) ==
               int(fray.sample(x, temperature=1.0, seeds=3, offsets=o)[0]) for o in (0, 1))


def test_scalars_equal_per_row_tensors():
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    a = fray.sample(x, temperature=0.7, top_k=10, top_p=0.8, min_p=0.05, seeds=11, offsets=4)
    b = fray.sample(x, temperature=torch.full((3,), 0.7), top_k=torch.full((3,), 10),
                    top_p=torch.full((3,), 0.8), min_p=torch.full((3,), 0.05),
                    seeds=torch.full((3,), 11), offsets=torch.full((3,), 4))
    assert torch.equal(a, b)


def test_chi_square_reference_sampler():
    # 6 tokens, 12000 draws over seeds 0..11999 at one offset; df = 5, critical value at
    # alpha = 0.001 is 20.515 (a fixed table value: scipy is not assumed).
    p = np.array([0.05, 0.1, 0.15, 0.2, 0.2, 0.3])
    n = 12000
    logits = np.tile(np.log(p), (n, 1))
    ones = np.ones(n)
    tok, _ = ref.sample(logits, ones, np.zeros(n, np.int64), ones, np.zeros(n), np.arange(n), np.full(n, 9))
    counts = np.bincount(tok, minlength=6)
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 20.515, (counts, chi2)
    # with top_k = 3 (0.2, 0.2, 0.3 kept): renormalised 2/7, 2/7, 3/7; df = 2, critical 13.816
    tok, _ = ref.sample(logits, ones, np.full(n, 3), ones, np.zeros(n), np.arange(n), np.full(n, 10))
    counts = np.bincount(tok, minlength=6)
    assert counts[:3].sum() == 0
    q = np.array([2, 2, 3]) / 7.0
    chi2 = float(((counts[3:] - n * q) ** 2 / (n * q)).sum())
    assert chi2 < 13.816, (counts, chi2)


# ---------------------------------------------------------------------------------------------
# Triton under the interpreter: the same tokens as the reference

def _params(rows, g):
    temp = torch.tensor([0.0, 1.0, 0.6, 1.5, 0.9, 1.0, 2.0, 0.3])[:rows]
    tk = torch.tensor([0, 0, 5, 40, 1, 3, 0, 7])[:rows]
    tp = torch.tensor([1.0, 0.9, 1.0, 0.5, 1.0, 0.95, 0.7, 0.2])[:rows]
    mp = torch.tensor([0.0, 0.0, 0.1, 0.0, 0.0, 0.02, 0.05, 0.0])[:rows]
    seeds = torch.randint(-2 ** 62, 2 ** 62, (rows,), generator=g)
    offs = torch.randint(0, 2 ** 40, (rows,), generator=g)
    return temp, tk, tp, mp, seeds, offs


@INTERP
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 37, 1500])
def test_triton_interpreter_vs_reference(dtype, width):
    from fray_triton import sampling as ts
    g = torch.Generator().manual_seed(width)
    rows = 8
    x = (torch.randn(rows, width, generator=g) * 3).to(dtype)
    if width > 10:
        x[5, 2] = x[5, 9] = x[5].max()  # tied maxima
        x[6, :4] = float("-inf")
    params = _params(rows, g)
    tok = torch.full((rows,), -1, dtype=torch.int64)
    lp = torch.full((rows,), float("nan"))
    ts.sample(x, tok, lp, *params, x.stride(0), rows, width)
    etok, elp = ref.sample(x.double().numpy(), *(p.double().numpy() if p.dtype.is_floating_point else p.numpy()
                                                   for p in params))
    np.testing.assert_array_equal(tok.numpy(), etok)
    np.testing.assert_allclose(lp.numpy(), elp, rtol=1e-4, atol=1e-5)


# Temperatures at the bottom of fp32: below 2^-126 (0 and the subnormals, where 1 / T overflows) a
# row is greedy; from 2^-126 up it samples. x's maxima are far enough apart that a normal tiny
# temperature leaves the argmax alone in the kept set, so every row draws the argmax, logprob 0.
TINY_TEMPS = [0.0, 1e-45, 2.9e-39, 3.0e-39, 1.1754942e-38, 2.0 ** -126, 1.2e-38, 1e-30, 1e-4]


def _tiny_temp_rows(width, dtype):
    g = torch.Generator().manual_seed(width)
    rows = len(TINY_TEMPS)
    x = (torch.randn(rows, width, generator=g) * 3).to(dtype)
    x[:, width // 2] = 20.0
    temp = torch.tensor(TINY_TEMPS, dtype=torch.float32)
    return x, (temp, torch.zeros(rows, dtype=torch.int64), torch.ones(rows), torch.zeros(rows),
               torch.arange(rows) + 3, torch.arange(rows) * 7)


def test_tiny_temperatures_reference():
    x, params = _tiny_temp_rows(40, torch.float32)
    assert torch.tensor(TINY_TEMPS, dtype=torch.float32)[4] < 2.0 ** -126  # a subnormal in fp32
    tok, lp = ref.sample(x.double().numpy(), *(p.double().numpy() if p.dtype.is_floating_point else p.numpy()
                                               for p in params))
    np.testing.assert_array_equal(tok, np.full(len(TINY_TEMPS), 20))
    np.testing.assert_array_equal(lp, np.zeros(len(TINY_TEMPS)))
    # NaN temperature in a tensor (never range-checked on the device) is greedy, as in the kernels
    t, _ = ref.sample(x[:1].double().numpy(), np.array([np.nan]), *(p[:1].numpy() for p in params[1:]))
    assert t[0] == 20


@INTERP
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_interpreter_tiny_temperatures(dtype):
    from fray_triton import sampling as ts
    x, params = _tiny_temp_rows(40, dtype)
    rows = x.shape[0]
    tok = torch.full((rows,), -1, dtype=torch.int64)
    lp = torch.full((rows,), float("nan"))
    ts.sample(x, tok, lp, *params, x.stride(0), rows, x.shape[1])
    assert tok.tolist() == [20] * rows
    assert (lp == 0).all(), lp


# ---------------------------------------------------------------------------------------------
# errors

def test_errors_name_the_argument():
    x = torch.randn(2, 10)
    ok = dict(temperature=1.0, seeds=0, offsets=0)
    for name, bad, exc in (("temperature", -1.0, ValueError), ("temperature", float("inf"), ValueError),
                           ("top_k", -1, ValueError), ("top_k", 2.5, TypeError), ("top_p", 0.0, ValueError),
                           ("top_p", 1.5, ValueError), ("min_p", 1.5, ValueError), ("seeds", 1.0, TypeError),
                           ("offsets", torch.zeros(3, dtype=torch.int64), ValueError),
                           ("offsets", torch.zeros(2), TypeError), ("temperature", "hot", TypeError)):
        kwargs = dict(ok, **{name: bad})
        with pytest.raises(exc, match=name + ":"):
            fray.sample(x, **kwargs)
    with pytest.raises(TypeError, match="logits:"):
        fray.sample(x.half(), **ok)
    with pytest.raises(ValueError, match="logits:"):
        fray.sample(torch.randn(10), **ok)
    with pytest.raises(TypeError, match="return_logprobs:"):
        fray.sample(x, return_logprobs=1, **ok)
    with pytest.raises(ValueError, match="backend:"):
        fray.sample(x, backend="triton", **ok)


# ---------------------------------------------------------------------------------------------
# CUDA extension, host side (no GPU needed): its Philox is the kernels' code

def _extension():
    from fray import backend as B
    ext = B.load_extension("sampling")
    if isinstance(ext, ImportError):
        pytest.skip("fray._C._sampling is not built here: %s" % ext)
    return ext


def test_philox_known_answer_cuda_code():
    ext = _extension()
    assert ext.philox([0, 0, 0, 0], [0, 0]) == RANDOM123_KAT
    assert ext.philox([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    ctr, key = [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]
    assert ext.philox(ctr, key) == [int(v) for v in ref.philox4x32_10(ctr, key)]


def test_row_strides_sample_reads_repeated_rows_penalties_refuse_them():
    # sample only reads logits: any row stride >= 0 (0: expand()ed rows) passes the adapter's
    # shape check and reaches the buffer check after it (no launch: pointers are 0). Penalties
    # and decode_step write logits in place: a row stride < cols is refused.
    from fray import _validate as V
    ext = _extension()
    rows, cols = 4, 32000
    # slots: cuda/sampling/sampling.h; every pointer 0 (no launch), scalars temperature 1, top_p 1
    sp, sf = (0,) * 9, (1.0, 1.0, 0.0)
    si = lambda stride: (stride, 0, rows, cols, 0, 0, 0)  # noqa: E731
    for stride in (0, 1, cols, cols + 3):
        with pytest.raises(ValueError, match="tokens and logprobs"):
            ext.sample(sp, si(stride), sf, 0, 0)
    with pytest.raises(ValueError, match="row_stride >= 0"):
        ext.sample(sp, si(-1), sf, 0, 0)
    pp, pf = (0,) * 6, (1.0, 0.0, 0.0)
    pi = lambda stride: (stride, 0, rows, cols, 1, 0, 1)  # noqa: E731
    for stride in (0, cols - 1):
        with pytest.raises(ValueError, match="row_stride >= cols"):
            ext.apply_penalties(pp, pi(stride), pf, 0, 0)
        with pytest.raises(ValueError, match="row_stride >= cols"):
            ext.decode_step((0,) * 14, pi(stride) + (0, 0, 0), pf + sf, 0, 0)
    with pytest.raises(ValueError, match="needs token_offsets"):  # the stride passed
        ext.apply_penalties(pp, pi(cols), pf, 0, 0)
    with pytest.raises(ValueError, match="decode_step expects 14 ptrs, 10 ints, 6 floats"):
        ext.decode_step(sp, si(cols), sf, 0, 0)
    # The Python layer: the same split.
    x = torch.randn(1, 64).expand(3, 64)
    assert V.row_stride("logits", x) == 0
    with pytest.raises(ValueError, match="logits: rows overlap"):
        V.row_stride("logits", x, writable=True)


def test_cpu_sample_takes_expanded_rows():
    row = torch.randn(1, 100, generator=torch.Generator().manual_seed(3))
    kw = dict(temperature=0.8, top_k=20, top_p=0.9, seeds=torch.arange(5), offsets=1, return_logprobs=True)
    tok, lp = fray.sample(row.expand(5, 100), **kw)
    tok2, lp2 = fray.sample(row.repeat(5, 1), **kw)
    assert torch.equal(tok, tok2) and torch.equal(lp, lp2)


def test_cuda_max_width_is_the_extensions():
    from fray.ops import sampling as ops
    ext = _extension()
    assert ext.sample_max_width(0) == ops.CUDA_SAMPLE_MAX_WIDTH[torch.float32]
    assert ext.sample_max_width(2) == ops.CUDA_SAMPLE_MAX_WIDTH[torch.bfloat16]


def test_scalar_parameters_round_trip_through_the_custom_op_form():
    from fray.ops import sampling as ops
    t = torch.zeros(3)
    params = (0.5, t, 0.9, 0.0, -2 ** 62, 7)
    tensors, fvals, ivals = ops._split_params(params, ops._SAMPLE_KINDS)
    assert tensors[1] is t and tensors.count(None) == 5
    assert fvals == [0.5, 0.9, 0.0] and ivals == [0, -2 ** 62, 7]
    back = ops._join_params(tensors, fvals, ivals, ops._SAMPLE_KINDS)
    assert back[1] is t and back[:1] + back[2:] == (0.5, 0.9, 0.0, -2 ** 62, 7)


# ---------------------------------------------------------------------------------------------
# GPU (H200): every backend against the reference

BACKENDS = ["cuda", "triton"]


def _ref_tokens(x, params):
    return ref.sample(x.double().cpu().numpy(), *((p.double() if p.dtype.is_floating_point else p).cpu().numpy()
                                                  for p in params))


def _kw(params):
    return dict(zip(("temperature", "top_k", "top_p", "min_p", "seeds", "offsets"), params))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 3, 37, 1000, 4097, 32000, 50021, 131072, 152064, 262144])
def test_gpu_vs_reference(cuda, backend, dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    x = (torch.randn(8, vocab, generator=g) * 4).to(dtype)
    if vocab > 10:
        x[5, 2] = x[5, 9] = x[5].max()  # tied maxima
        x[6, :4] = float("-inf")
    x = x.to(cuda)
    params = [p.to(cuda) for p in _params(8, g)]
    tok, lp = fray.sample(x, **_kw(params), return_logprobs=True, backend=backend)
    etok, elp = _ref_tokens(x, params)
    np.testing.assert_array_equal(tok.cpu().numpy(), etok, err_msg="%s %s %d" % (backend, dtype, vocab))
    np.testing.assert_allclose(lp.cpu().numpy(), elp, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_many_rows_and_strided_unaligned_rows(cuda, backend):
    # 300 contiguous rows (more than one wave of clusters), and rows that start 4 or 12 bytes past
    # a 16-byte boundary with an odd row stride (the CUDA kernel's scalar-load path).
    g = torch.Generator().manual_seed(11)
    for rows, vocab, cut in ((300, 32000, 0), (8, 32000, 1), (5, 152064, 3)):
        base = (torch.randn(rows, vocab + (3 if cut else 0), generator=g) * 3).to(cuda)
        x = base[:, cut:cut + vocab]
        params = [p.to(cuda) for p in _params(8, g)]
        params = [p.repeat((rows + 7) // 8)[:rows] for p in params]
        params[4] = torch.arange(rows, device=cuda) * 7919  # distinct seeds
        tok = fray.sample(x, **_kw(params), backend=backend)
        etok, _ = _ref_tokens(x, params)
        np.testing.assert_array_equal(tok.cpu().numpy(), etok, err_msg="%s %dx%d+%d" % (backend, rows, vocab, cut))


def _ranked(l):
    return np.lexsort((np.arange(l.size), -l))


def _kept_cases(vocab, rng):
    """(name, logits row, temperature, top_k, top_p, min_p): every threshold sits >= 1e-3 (in mass
    fraction, or relative weight for min-p) away from the nearest token, ties included."""
    base = -0.05 * rng.permutation(vocab).astype(np.float64)  # distinct, 0.05 apart
    cases = []
    for name, T, k, j in (("top-p", 1.0, 0, 45), ("top-k+top-p", 0.7, 50, 10), ("top-p ties", 1.0, 0, 20)):
        l = base.copy()
        order = _ranked(l)
        if name == "top-p ties":  # tokens of ranks 21..24 tie with rank 20, the threshold token
            l[order[21:25]] = l[order[20]]
            order = _ranked(l)
        keep = ref.kept_sets(l, T, k)["top_k"]
        w = np.exp((l - l.max()) / T)
        o = order[keep[order]]
        c = np.cumsum(w[o])
        p = ((c[j - 1] if j else 0.0) + c[j]) / 2 / c[-1]
        assert w[o[j]] / c[-1] > 2e-3
        cases.append((name, l, T, k, float(p), 0.0))
    l = base.copy()
    order = _ranked(l)
    l[order[21:26]] = l[order[19]]  # 5 more tokens tie with the 20th largest
    cases.append(("top-k ties", l, 1.0, 20, 1.0, 0.0))
    T = 1.3
    w = np.exp((base - base.max()) / T)
    o = _ranked(base)
    cases.append(("min-p", base, T, 200, 1.0, float((w[o[30]] + w[o[31]]) / 2)))
    cases.append(("all", base, 0.9, 100, 0.95, float(np.exp(-0.05 * 40.5 / 0.9))))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vocab", [4097, 32000, 131072])
def test_gpu_kept_sets_match_the_reference(cuda, backend, vocab):
    # 256 draws per case: every token drawn must be in the reference's kept set, and its logprob
    # log(w / sum of the kept w) pins the kept mass, so a single token kept or dropped wrongly
    # (mass >= 1e-3 of the total here) moves it by far more than the tolerance.
    rng = np.random.default_rng(vocab)
    n = 256
    for name, l, T, k, p, m in _kept_cases(vocab, rng):
        s = ref.kept_sets(l, T, k, p, m)
        kept, w = s["min_p"], s["w"]
        x = torch.tensor(l, dtype=torch.float32, device=cuda).expand(n, vocab)  # stride-0 rows
        seeds = torch.arange(n, device=cuda) + 1000
        tok, lp = fray.sample(x, temperature=T, top_k=k, top_p=p, min_p=m, seeds=seeds, offsets=3,
                              return_logprobs=True, backend=backend)
        tok = tok.cpu().numpy()
        assert kept[tok].all(), (name, sorted(set(tok[~kept[tok]].tolist())))
        expect = np.log(w[tok] / w[kept].sum())
        np.testing.assert_allclose(lp.cpu().numpy(), expect, rtol=1e-4, atol=1e-4, err_msg=name)
        if kept.sum() <= 8:  # small kept sets are drawn completely in 256 tries
            assert set(tok.tolist()) == set(np.nonzero(kept)[0].tolist()), name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_cuda_top_k_survivor_path_and_its_fallback(cuda, dtype):
    # The CUDA kernel finishes a row in one block when top-k leaves <= 1024 survivors (k plus the
    # ties at the k-th value) and otherwise stays on the cluster-wide path: rows on both sides of
    # that line, with top-p and min-p after top-k, must draw the reference's tokens.
    g = torch.Generator().manual_seed(31)
    vocab = 131072
    rows = 12
    x = (torch.randn(rows, vocab, generator=g) * 2).to(dtype)
    x[2] = 1.5                                   # all equal: every token survives top-k 5
    x[3, :1500] = 20.0                           # 1500 tied at the top: top-k 10 keeps them all
    x[4, 1000:2000] = 20.0                       # 1000 tied maxima: exactly 1000 survivors
    x[5, ::128] = 20.0                           # 1024 tied maxima, spread over the whole row
    x[6, 100:5000] = float("-inf")               # masked tokens (mass 0) below the survivors
    x[7, -40:] = 25.0                            # survivors at the end of the last slice
    temp = torch.tensor([0.8, 1.0, 0.7, 1.0, 1.3, 0.9, 1.0, 0.6, 1.0, 2.0, 0.5, 1.0])
    tk = torch.tensor([1024, 1025, 5, 10, 1000, 3, 50, 45, 1, 4096, 200, 50])
    tp = torch.tensor([0.9, 0.9, 0.5, 0.3, 1.0, 0.95, 0.9, 0.8, 0.9, 0.99, 0.6, 1.0])
    mp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.2, 0.0, 0.0, 0.1, 0.0, 0.0, 0.05, 0.3])
    seeds = torch.randint(0, 2 ** 40, (rows,), generator=g)
    params = [p.to(cuda) for p in (temp, tk, tp, mp, seeds, torch.arange(rows) * 3)]
    xs = x.to(cuda)
    etok, elp = _ref_tokens(xs, params)
    for batch in (slice(0, rows), slice(5, 6)):  # a 12-row batch and a lone row (larger cluster)
        tok, lp = fray.sample(xs[batch], **_kw([p[batch] for p in params]), return_logprobs=True, backend="cuda")
        np.testing.assert_array_equal(tok.cpu().numpy(), etok[batch], err_msg=str(dtype))
        np.testing.assert_allclose(lp.cpu().numpy(), elp[batch], rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_top_p_on_narrow_and_constant_rows(cuda, dtype):
    # The CUDA kernel's first-level mass bins follow the row's span (max - min) / T: near-flat
    # rows (span << 1 nat), constant rows (span 0), a -inf token (span inf) and wide rows. Here
    # every token holds ~1e-5 of the mass, so fp32 weights may legitimately move the top-p
    # threshold or the draw by a token against the float64 reference: CUDA and Triton (the same
    # fp32 weights and integer masses) must draw the same token, on or above the reference's
    # threshold, with the reference's logprob for it.
    g = torch.Generator().manual_seed(41)
    rows, vocab = 8, 131072
    x = torch.randn(rows, vocab, generator=g) * torch.tensor([0.1, 0.01, 0.0, 1.0, 0.1, 30.0, 1e-3, 0.1])[:, None]
    x[2] = 0.25                       # constant
    x[4, 77] = float("-inf")          # one masked token in a flat row
    x[7] += 1000.0                    # far from 0: the span is still small
    x = x.to(dtype).to(cuda)
    temp = [0.8, 1.0, 1.0, 0.8, 0.8, 2.0, 0.05, 1.0]
    tp = [0.9, 0.5, 0.3, 0.9, 0.95, 0.9, 0.7, 0.99]
    mp = [0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0, 0.5]
    kw = dict(temperature=torch.tensor(temp, device=cuda), top_k=0, top_p=torch.tensor(tp, device=cuda),
              min_p=torch.tensor(mp, device=cuda), seeds=torch.arange(rows, device=cuda) * 1234567 + 3, offsets=5)
    tok, lp = fray.sample(x, return_logprobs=True, backend="cuda", **kw)
    ttok, tlp = fray.sample(x, return_logprobs=True, backend="triton", **kw)
    assert torch.equal(tok, ttok), (tok, ttok)
    x64 = x.double().cpu().numpy()
    for b, t in enumerate(tok.cpu().numpy()):
        s = ref.kept_sets(x64[b], temp[b], 0, tp[b], mp[b])
        kept, w = s["min_p"], s["w"]
        assert w[t] >= w[kept].min() * (1 - 1e-5), (dtype, b, t)
        np.testing.assert_allclose(float(lp[b]), np.log(w[t] / w[kept].sum()), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_same_seed_and_offset_same_token(cuda, backend):
    # Determinism, and independence of the batch a row sits in (the CUDA kernel spreads a lone
    # row over a larger cluster than a batch of 64: its fixed-point sums must not care).
    g = torch.Generator().manual_seed(21)
    x = (torch.randn(64, 131072, generator=g) * 2).to(cuda)
    seeds = torch.randint(0, 2 ** 40, (64,), generator=g).to(cuda)
    offs = torch.randint(0, 2 ** 20, (64,), generator=g).to(cuda)
    kw = dict(temperature=0.9, top_k=0, top_p=0.9, min_p=0.0)
    a = fray.sample(x, seeds=seeds, offsets=offs, backend=backend, **kw)
    assert torch.equal(a, fray.sample(x, seeds=seeds, offsets=offs, backend=backend, **kw))
    for i in (0, 17, 63):
        one = fray.sample(x[i:i + 1], seeds=seeds[i:i + 1], offsets=offs[i:i + 1], backend=backend, **kw)
        assert int(one[0]) == int(a[i]), i
    bumped = fray.sample(x, seeds=seeds, offsets=offs + 1, backend=backend, **kw)
    assert (bumped != a).sum() > 32  # fresh draws


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_chi_square_over_seeds(cuda, backend):
    # One row repeated (stride 0) n times with seeds 0..n-1: the draws must follow the filtered,
    # renormalised distribution. Critical values at alpha = 0.001: df 5 -> 20.515, df 2 -> 13.816.
    n = 12000
    vocab = 131072 if backend == "cuda" else 1000  # the Triton kernel's ~70 passes per row: keep it small
    g = torch.Generator().manual_seed(8)
    row = torch.randn(vocab, generator=g) - 20.0
    p = np.array([0.05, 0.1, 0.15, 0.2, 0.2, 0.3])
    pos = np.array([7, 100, vocab // 3, vocab // 2, vocab - 1, 2 * vocab // 3])
    row[torch.from_numpy(pos)] = torch.from_numpy(np.log(p)).float()
    x = row.to(cuda).expand(n, vocab)
    seeds = torch.arange(n, device=cuda)
    tok = fray.sample(x, temperature=1.0, top_k=6, seeds=seeds, offsets=9, backend=backend).cpu().numpy()
    assert np.isin(tok, pos).all()
    counts = np.array([(tok == q).sum() for q in pos])
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 20.515, (counts, chi2)
    # top-p 0.6: masses 0.3, then the tied 0.2s (both kept), renormalised 3/7, 2/7, 2/7
    tok = fray.sample(x, temperature=1.0, top_p=0.6, seeds=seeds, offsets=10, backend=backend).cpu().numpy()
    assert np.isin(tok, pos[3:]).all()
    q = np.array([2, 2, 3]) / 7.0
    counts = np.array([(tok == t).sum() for t in pos[3:]])
    chi2 = float(((counts - n * q) ** 2 / (n * q)).sum())
    assert chi2 < 13.816, (counts, chi2)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_greedy_and_sampled_rows_mix(cuda, backend, dtype):
    g = torch.Generator().manual_seed(4)
    rows, vocab = 12, 50021
    x = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
    x[0, 10] = x[0, 20000] = 50.0            # tied maxima: the lower index
    x[2, 333] = float("nan")                 # NaN is the maximum (greedy rows only)
    x[4] = float("-inf")                     # all -inf: index 0
    x[6, -1] = 40.0                          # the last index
    temp = torch.tensor([0.0, 0.8] * (rows // 2))
    params = [temp, torch.full((rows,), 30), torch.full((rows,), 0.95), torch.zeros(rows),
              torch.arange(rows) * 31 + 5, torch.arange(rows)]
    params = [p.to(cuda) for p in params]
    tok, lp = fray.sample(x.to(cuda), **_kw(params), return_logprobs=True, backend=backend)
    tok, lp = tok.cpu(), lp.cpu()
    greedy = temp == 0
    assert torch.equal(tok[greedy], torch.argmax(x.float(), dim=-1)[greedy])
    assert tok[0] == 10 and tok[2] == 333 and tok[4] == 0 and tok[6] == vocab - 1
    assert (lp[greedy] == 0).all()
    etok, elp = _ref_tokens(x, params)
    np.testing.assert_array_equal(tok.numpy(), etok)
    np.testing.assert_allclose(lp.numpy(), elp, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_tiny_temperatures_are_greedy_or_exact(cuda, backend, dtype):
    x, params = _tiny_temp_rows(50021, dtype)
    params = [p.to(cuda) for p in params]
    tok, lp = fray.sample(x.to(cuda), **_kw(params), return_logprobs=True, backend=backend)
    assert tok.cpu().tolist() == [50021 // 2] * len(TINY_TEMPS)
    assert lp.cpu().abs().max() < 1e-6, lp  # greedy rows exactly 0; sampled ones log(1 / 1) in fp32

@pytest.mark.gpu
def test_gpu_cuda_width_limit(cuda):
    from fray.ops import sampling as ops
    vocab = ops.CUDA_SAMPLE_MAX_WIDTH[torch.float32] + 1
    x = torch.randn(2, vocab, device=cuda)
    kw = dict(temperature=1.0, top_p=0.9, seeds=torch.arange(2, device=cuda), offsets=0)
    with pytest.raises(ValueError, match="logits:"):
        fray.sample(x, backend="cuda", **kw)
    tok = fray.sample(x, **kw)  # auto: Triton takes the wide rows
    assert torch.equal(tok, fray.sample(x, backend="triton", **kw))
    at = torch.randn(2, vocab - 1, device=cuda)
    assert torch.equal(fray.sample(at, backend="cuda", **kw), fray.sample(at, backend="triton", **kw))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_scalars_equal_per_row_tensors(cuda, backend):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(6, 32000, generator=g).to(cuda)
    a = fray.sample(x, temperature=0.7, top_k=40, top_p=0.8, min_p=0.01, seeds=11, offsets=4, backend=backend)
    f = lambda v, dt=torch.float64: torch.full((6,), v, dtype=dt, device=cuda)  # noqa: E731
    b = fray.sample(x, temperature=f(0.7), top_k=f(40, torch.int32), top_p=f(0.8, torch.float32),
                    min_p=f(0.01), seeds=f(11, torch.int64), offsets=f(4, torch.int64), backend=backend)
    assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_cuda_graph_replay_with_bumped_offsets(cuda, backend):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 32000, generator=g).to(cuda)
    temp, tk, tp, mp, seeds, offs = (p.to(cuda) for p in _params(4, g))
    kw = dict(temperature=temp, top_k=tk, top_p=tp, min_p=mp, seeds=seeds, offsets=offs, backend=backend)
    fray.sample(x, **kw)  # compile outside the capture
    scalar_kw = dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.0, seeds=seeds, offsets=offs, backend=backend)
    fray.sample(x, **scalar_kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tok = fray.sample(x, **kw)
        tok2 = fray.sample(x, **scalar_kw)
    n = len(seeds)
    for _ in range(3):
        offs += 1
        graph.replay()
        torch.cuda.synchronize()
        etok, _ = _ref_tokens(x, (temp, tk, tp, mp, seeds, offs))
        np.testing.assert_array_equal(tok.cpu().numpy(), etok)
        etok2, _ = ref.sample(x.double().cpu().numpy(), np.full(n, 0.8), np.full(n, 50), np.full(n, 0.9),
                              np.zeros(n), seeds.cpu().numpy(), offs.cpu().numpy())
        np.testing.assert_array_equal(tok2.cpu().numpy(), etok2)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_non_default_stream(cuda, backend):
    g = torch.Generator().manual_seed(12)
    x = torch.randn(16, 131072, generator=g).to(cuda)
    kw = dict(temperature=0.8, top_p=0.9, seeds=torch.arange(16, device=cuda), offsets=1, backend=backend)
    expect = fray.sample(x, **kw)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tok = fray.sample(x, **kw)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(tok, expect)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_torch_compile(cuda, backend):
    x = torch.randn(4, 5000, device=cuda)
    seeds, offs = torch.arange(4, device=cuda), torch.zeros(4, dtype=torch.int64, device=cuda)
    kw = dict(temperature=0.8, top_k=50, top_p=0.9, backend=backend)
    f = torch.compile(lambda t, s, o: fray.sample(t, seeds=s, offsets=o, **kw), fullgraph=True)
    eager = fray.sample(x, seeds=seeds, offsets=offs, **kw)
    assert torch.equal(f(x, seeds, offs), eager)
    g = torch.compile(lambda t, s, o: fray.sample(t, temperature=torch.full((4,), 0.5, device=cuda), seeds=s,
                                                  offsets=o, return_logprobs=True, backend=backend), fullgraph=True)
    tok, lp = g(x, seeds, offs)
    etok, elp = fray.sample(x, temperature=0.5, seeds=seeds, offsets=offs, return_logprobs=True, backend=backend)
    assert torch.equal(tok, etok) and torch.equal(lp, elp)
