"""fray.sample: Philox known answer, each filter's kept set by hand, the inverse-CDF pick,
determinism, a chi-square test of the reference sampler, Triton (interpreter) vs reference,
errors; GPU: vocab-size agreement, CUDA-graph replay with bumped offsets, torch.compile."""
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
# GPU (next session, H200)

def _ref_tokens(x, params):
    return ref.sample(x.double().cpu().numpy(), *((p.double() if p.dtype.is_floating_point else p).cpu().numpy()
                                                  for p in params))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [32000, 131072, 152064])
def test_gpu_vs_reference(cuda, dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    x = (torch.randn(8, vocab, generator=g) * 4).to(dtype).to(cuda)
    params = [p.to(cuda) for p in _params(8, g)]
    tok, lp = fray.sample(x, temperature=params[0], top_k=params[1], top_p=params[2], min_p=params[3],
                          seeds=params[4], offsets=params[5], return_logprobs=True)
    etok, elp = _ref_tokens(x, params)
    np.testing.assert_array_equal(tok.cpu().numpy(), etok)
    np.testing.assert_allclose(lp.cpu().numpy(), elp, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_with_bumped_offsets(cuda):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 32000, generator=g).to(cuda)
    temp, tk, tp, mp, seeds, offs = (p.to(cuda) for p in _params(4, g))
    kw = dict(temperature=temp, top_k=tk, top_p=tp, min_p=mp, seeds=seeds, offsets=offs)
    fray.sample(x, **kw)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tok = fray.sample(x, **kw)
    for _ in range(3):
        offs += 1
        graph.replay()
        torch.cuda.synchronize()
        etok, _ = _ref_tokens(x, (temp, tk, tp, mp, seeds, offs))
        np.testing.assert_array_equal(tok.cpu().numpy(), etok)


@pytest.mark.gpu
def test_gpu_torch_compile(cuda):
    x = torch.randn(4, 5000, device=cuda)
    seeds, offs = torch.arange(4, device=cuda), torch.zeros(4, dtype=torch.int64, device=cuda)
    f = torch.compile(lambda t, s, o: fray.sample(t, temperature=0.8, top_k=50, top_p=0.9, seeds=s, offsets=o),
                      fullgraph=True)
    eager = fray.sample(x, temperature=0.8, top_k=50, top_p=0.9, seeds=seeds, offsets=offs)
    assert torch.equal(f(x, seeds, offs), eager)
