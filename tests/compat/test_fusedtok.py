"""fray.compat.fusedtok: every name of fusedtok's published API, on numpy (the reference path)
against independent numpy math, and (GPU) on CUDA tensors and with cuda=True against the numpy
path; the not-yet-available names raise NotImplementedError naming their issue."""
import inspect
import math

import numpy as np
import pytest
import torch

import fray.compat.fusedtok as ft

# fusedtok 1.x's published __init__.pyi __all__
PUBLISHED = [
    "cuda_available", "axpy", "rmsnorm", "layernorm", "softmax", "rope", "swiglu", "silu", "gelu", "gelu_tanh",
    "relu", "tanh", "sigmoid", "add", "mul", "temperature", "repetition_penalty", "argmax", "topk", "topp",
    "sample_topp", "sample_topk", "sample_minp", "sample_topp_batched", "sample_topk_batched",
    "sample_minp_batched", "quantize_int8", "dequantize_int8", "qadd_int8", "qgemm", "qgemm_perchannel",
    "decode_step", "attention_decode", "kv_append", "attention_decode_paged", "attention_prefill",
    "kv_append_paged",
]

# (name, positional parameters, keyword-only parameters with defaults) from that __init__.pyi
SIGNATURES = {
    "axpy": ("x a b", dict(cuda=False)),
    "rmsnorm": ("x weight", dict(residual=None, eps=1e-6, cuda=False)),
    "layernorm": ("x weight bias", dict(eps=1e-6, cuda=False)),
    "rope": ("q k", dict(theta=10000.0, pos_offset=0, neox=False, cuda=False)),
    "temperature": ("x t", dict(cuda=False)),
    "repetition_penalty": ("logits token_ids penalty", dict(cuda=False)),
    "topk": ("x k", dict(cuda=False)),
    "topp": ("probs p", dict(cuda=False)),
    "sample_topp": ("logits p", dict(temperature=1.0, seed=0, cuda=False)),
    "sample_topk_batched": ("logits k", dict(temperature=1.0, seeds=None, cuda=False)),
    "decode_step": ("logits sampled_ids penalty", dict(p=0.9, temperature=1.0, seed=0, cuda=False)),
    "attention_decode": ("q k_cache v_cache lens", dict(cuda=False)),
    "kv_append_paged": ("k_pool v_pool block_table k_new v_new lens", dict(cuda=False)),
    "attention_prefill": ("q k v causal", dict(cuda=False)),
    "quantize_int8": ("x", {}),
    "qadd_int8": ("qa sa qb sb", {}),
    "qgemm": ("a_q a_scale b_q b_scale", dict(cuda=False)),
    "qgemm_perchannel": ("a_q a_scale b_q b_scales", dict(cuda=False)),
}

RNG = np.random.default_rng(0)


def _f32(*shape, scale=1.0):
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


def test_every_published_name_is_there():
    assert ft.__all__ == PUBLISHED
    for name in PUBLISHED:
        assert callable(getattr(ft, name)), name


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_match_fusedtok(name):
    positional, keywords = SIGNATURES[name]
    params = inspect.signature(getattr(ft, name)).parameters.values()
    assert [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD] == positional.split()
    assert {p.name: p.default for p in params if p.kind == p.KEYWORD_ONLY} == keywords


def test_cuda_available_is_a_bool():
    assert ft.cuda_available() is torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------
# numpy in -> float32 numpy out, against numpy math

def _close(y, want, rtol=2e-6, atol=1e-6):
    assert isinstance(y, np.ndarray) and y.dtype == np.float32, (type(y), getattr(y, "dtype", None))
    np.testing.assert_allclose(y, want, rtol=rtol, atol=atol)


def _erf(x):
    return np.vectorize(math.erf)(x)


UNARY_NUMPY = {
    "silu": lambda x: x / (1 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


@pytest.mark.parametrize("name", sorted(UNARY_NUMPY))
def test_unary_numpy(name):
    x = _f32(3, 50, scale=3)
    _close(getattr(ft, name)(x), UNARY_NUMPY[name](x.astype(np.float64)))
    # float64 input is converted to float32, as fusedtok does
    _close(getattr(ft, name)(x.astype(np.float64)), UNARY_NUMPY[name](x.astype(np.float64)))


def test_elementwise_numpy():
    a, b = _f32(4, 33), _f32(4, 33)
    _close(ft.add(a, b), a.astype(np.float64) + b)
    _close(ft.mul(a, b), a.astype(np.float64) * b)
    _close(ft.axpy(a, 2.5, -1.0), 2.5 * a.astype(np.float64) - 1.0)
    _close(ft.axpy(a), a)
    _close(ft.swiglu(a, b), a / (1 + np.exp(-a.astype(np.float64))) * b)
    _close(ft.temperature(a, 0.7), a / 0.7)
    with pytest.raises(ValueError, match="t: expected a temperature > 0"):
        ft.temperature(a, 0.0)
    with pytest.raises(ValueError, match="b: expected shape"):
        ft.add(a, b[:, :3])


def test_cpu_torch_in_cpu_torch_out():
    x = torch.randn(2, 8)
    y = ft.silu(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.device.type == "cpu"
    np.testing.assert_allclose(y.numpy(), UNARY_NUMPY["silu"](x.double().numpy()), rtol=2e-6, atol=1e-6)
    vals, idx = ft.topk(torch.tensor([1.0, 3.0, 2.0]), 2)
    assert isinstance(vals, torch.Tensor) and idx.dtype == torch.int64 and idx.tolist() == [1, 2]


def test_norms_and_softmax_numpy():
    x, r, w, b = _f32(3, 64), _f32(3, 64), _f32(64) + 1, _f32(64)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w
    _close(ft.rmsnorm(x, w), want, rtol=1e-5, atol=1e-5)
    s = (x + r).astype(np.float64)  # fp32 inputs: x + r rounded to fp32 is what Fray normalises
    _close(ft.rmsnorm(x, w, residual=r), s / np.sqrt((s ** 2).mean(-1, keepdims=True) + 1e-6) * w, rtol=1e-5, atol=1e-5)
    mu, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    _close(ft.layernorm(x, w, b), (x64 - mu) / np.sqrt(var + 1e-6) * w + b, rtol=1e-5, atol=1e-5)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    _close(ft.softmax(x), e / e.sum(-1, keepdims=True))
    _close(ft.softmax(x[0]), e[0] / e[0].sum())  # 1-D: one row
    with pytest.raises(ValueError, match="x: expected a 1-D or 2-D array"):
        ft.softmax(_f32(2, 2, 2))


def _rope_numpy(x, theta, pos_offset, neox):
    seq, dim = x.shape
    x = x.astype(np.float64)
    half = dim // 2
    inv = theta ** (-2.0 * np.arange(half) / dim)
    ang = (pos_offset + np.arange(seq))[:, None] * inv[None, :]
    c, s = np.cos(ang), np.sin(ang)
    if neox:
        a, b = x[:, :half], x[:, half:]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=1)
    a, b = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = a * c - b * s, b * c + a * s
    return out


@pytest.mark.parametrize("neox", [False, True])
def test_rope_numpy(neox):
    q, k = _f32(5, 16), _f32(5, 16)
    qo, ko = ft.rope(q, k, theta=500.0, pos_offset=7, neox=neox)
    _close(qo, _rope_numpy(q, 500.0, 7, neox), rtol=1e-5, atol=1e-5)
    _close(ko, _rope_numpy(k, 500.0, 7, neox), rtol=1e-5, atol=1e-5)
    qo, ko = ft.rope(q, neox=neox)
    assert ko is None
    _close(qo, _rope_numpy(q, 10000.0, 0, neox), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="pos_offset: expected >= 0"):
        ft.rope(q, pos_offset=-1)
    with pytest.raises(ValueError, match="q: expected an even dim"):
        ft.rope(_f32(2, 5))


def test_selection_numpy():
    x = np.array([0.5, 2.0, -1.0, 2.0, 0.1], dtype=np.float32)
    a = ft.argmax(x)
    assert type(a) is int and a == 1  # earliest index on ties
    vals, idx = ft.topk(x, 3)
    np.testing.assert_array_equal(vals, [2.0, 2.0, 0.5])
    np.testing.assert_array_equal(idx, [1, 3, 0])
    assert idx.dtype == np.int64 and vals.dtype == np.float32
    v0, i0 = ft.topk(x, 0)
    assert v0.shape == (0,) and i0.shape == (0,)
    with pytest.raises(ValueError, match=r"k: expected a value in \[0, 5\], got 6"):
        ft.topk(x, 6)
    probs = np.array([0.1, 0.4, 0.05, 0.3, 0.15], dtype=np.float32)
    vals, idx = ft.topp(probs, 0.7)  # 0.4 + 0.3 = 0.7 reaches p: the crossing element included
    np.testing.assert_array_equal(idx, [1, 3])
    np.testing.assert_array_equal(vals, probs[[1, 3]])
    vals, idx = ft.topp(probs, 0.71)
    np.testing.assert_array_equal(idx, [1, 3, 4])
    vals, idx = ft.topp(probs, 1.0)
    np.testing.assert_array_equal(idx, [1, 3, 4, 0, 2])
    with pytest.raises(ValueError, match=r"p: expected a value in \(0, 1\]"):
        ft.topp(probs, 0.0)


def test_repetition_penalty_numpy():
    logits = np.array([2.0, -1.0, 0.5, 3.0], dtype=np.float32)
    keep = logits.copy()
    y = ft.repetition_penalty(logits, np.array([0, 1, 1]), 2.0)
    np.testing.assert_array_equal(y, [1.0, -2.0, 0.5, 3.0])  # each id once, however often it repeats
    np.testing.assert_array_equal(logits, keep)  # the input is not modified
    with pytest.raises(ValueError, match=r"token_ids: expected values in \[0, 4\)"):
        ft.repetition_penalty(logits, np.array([4]), 2.0)
    with pytest.raises(TypeError, match="token_ids: expected integer values"):
        ft.repetition_penalty(logits, np.array([0.5]), 2.0)
    with pytest.raises(ValueError, match="penalty: expected a value > 0"):
        ft.repetition_penalty(logits, np.array([0]), 0.0)


def test_samplers_numpy():
    logits = np.array([0.0, 5.0, 1.0, 4.9, -3.0], dtype=np.float32)
    # deterministic per seed; filters that leave one token make the result certain
    for seed in range(4):
        assert ft.sample_topk(logits, 1, seed=seed) == 1
        assert ft.sample_topp(logits, 1e-6, seed=seed) == 1
        assert ft.sample_minp(logits, 1.0, seed=seed) == 1
        t = ft.sample_topk(logits, 2, temperature=0.5, seed=seed)
        assert type(t) is int and t in (1, 3) and t == ft.sample_topk(logits, 2, temperature=0.5, seed=seed)
        assert ft.sample_topp(logits, 0.9, seed=seed) in (1, 3, 2)
    assert ft.sample_topk(logits, 99, seed=3) in range(5)  # k >= vocab: the whole distribution
    # the draws follow the distribution: two near-equal logits both come up over many seeds
    seen = {ft.sample_topk(logits, 2, seed=s) for s in range(64)}
    assert seen == {1, 3}
    batch = np.stack([logits, logits[::-1].copy()])
    out = ft.sample_topk_batched(batch, 1)
    assert out.dtype == np.int64 and out.tolist() == [1, 3]
    assert ft.sample_topp_batched(batch, 1e-6, seeds=np.array([5, 6])).tolist() == [1, 3]
    assert ft.sample_minp_batched(batch, 1.0, temperature=2.0).tolist() == [1, 3]
    s1 = ft.sample_topp_batched(np.repeat(logits[None], 3, 0), 0.95, seeds=np.array([7, 7, 8]))
    assert s1[0] == s1[1]  # one seed, one token
    with pytest.raises(ValueError, match="seeds: expected one seed per row"):
        ft.sample_topk_batched(batch, 1, seeds=np.array([1]))
    with pytest.raises(ValueError, match="temperature: expected a value > 0"):
        ft.sample_topp(logits, 0.5, temperature=0.0)
    with pytest.raises(ValueError, match=r"min_p: expected a value in \(0, 1\]"):
        ft.sample_minp(logits, 1.5)
    with pytest.raises(ValueError, match="logits: expected a 1-D array"):
        ft.sample_topk(batch, 1)


def test_decode_step_numpy():
    logits = np.array([0.0, 5.0, 1.0, 4.99, -3.0], dtype=np.float32)
    keep = logits.copy()
    # p tiny: greedy after the penalty; the penalty moves the winner from 1 to 3
    assert ft.decode_step(logits, np.array([], dtype=np.int64), 1.0, p=1e-6) == 1
    assert ft.decode_step(logits, np.array([1]), 1.5, p=1e-6) == 3
    np.testing.assert_array_equal(logits, keep)
    t = ft.decode_step(logits, np.array([2]), 1.2, p=0.9, temperature=0.8, seed=11)
    assert type(t) is int and t == ft.decode_step(logits, np.array([2]), 1.2, p=0.9, temperature=0.8, seed=11)


def _attention_numpy(q, k, v, lens):
    b, hq, d = q.shape
    hkv = k.shape[1]
    out = np.zeros((b, hq, d))
    for i in range(b):
        for h in range(hq):
            n = lens[i]
            if n == 0:
                continue
            kk, vv = k[i, h // (hq // hkv), :n].astype(np.float64), v[i, h // (hq // hkv), :n].astype(np.float64)
            s = kk @ q[i, h].astype(np.float64) / math.sqrt(d)
            p = np.exp(s - s.max())
            out[i, h] = p @ vv / p.sum()
    return out


def test_attention_decode_and_kv_append_numpy():
    b, hq, hkv, t, d = 2, 4, 2, 9, 64
    q, k, v = _f32(b, hq, d), _f32(b, hkv, t, d), _f32(b, hkv, t, d)
    _close(ft.attention_decode(q, k, v), _attention_numpy(q, k, v, [t, t]), rtol=1e-5, atol=1e-5)
    lens = np.array([3, 0])
    _close(ft.attention_decode(q, k, v, lens), _attention_numpy(q, k, v, lens), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"lens: expected values in \[0, 9\]"):
        ft.attention_decode(q, k, v, np.array([10, 1]))
    kn, vn = _f32(b, hkv, d), _f32(b, hkv, d)
    k2, v2 = k.copy(), v.copy()
    assert ft.kv_append(k2, v2, kn, vn, np.array([3, 8])) is None
    want_k, want_v = k.copy(), v.copy()
    want_k[0, :, 3], want_k[1, :, 8], want_v[0, :, 3], want_v[1, :, 8] = kn[0], kn[1], vn[0], vn[1]
    np.testing.assert_array_equal(k2, want_k)
    np.testing.assert_array_equal(v2, want_v)
    with pytest.raises(ValueError, match=r"lens: expected values in \[0, 9\)"):
        ft.kv_append(k2, v2, kn, vn, np.array([9, 0]))
    with pytest.raises(TypeError, match="k_cache: expected a float32 C-contiguous array"):
        ft.kv_append(k2.astype(np.float64), v2, kn, vn, np.array([0, 0]))


def test_paged_numpy():
    b, hq, hkv, page, d, nb = 2, 2, 1, 16, 64, 5
    q = _f32(b, hq, d)
    kp, vp = _f32(nb, hkv, page, d), _f32(nb, hkv, page, d)  # fusedtok's [Nb, Hkv, P, D] pools
    table = np.array([[3, 0], [4, 1]])
    lens = np.array([20, 7])

    def gathered(pool, row):
        return np.concatenate([pool[blk] for blk in table[row]], axis=1)  # [Hkv, S * P, D]
    kc = np.stack([gathered(kp, i) for i in range(b)])
    vc = np.stack([gathered(vp, i) for i in range(b)])
    _close(ft.attention_decode_paged(q, kp, vp, table, lens), _attention_numpy(q, kc, vc, lens), rtol=1e-5, atol=1e-5)
    _close(ft.attention_decode_paged(q, kp, vp, table), _attention_numpy(q, kc, vc, [32, 32]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"block_table: expected values in \[0, 5\)"):
        ft.attention_decode_paged(q, kp, vp, np.array([[5, 0], [1, 2]]), lens)
    kn, vn = _f32(b, hkv, d), _f32(b, hkv, d)
    k2, v2 = kp.copy(), vp.copy()
    assert ft.kv_append_paged(k2, v2, table, kn, vn, np.array([20, 7])) is None
    want_k, want_v = kp.copy(), vp.copy()
    want_k[0, :, 4], want_v[0, :, 4] = kn[0], vn[0]  # token 20: table[0, 1] = block 0, slot 4
    want_k[4, :, 7], want_v[4, :, 7] = kn[1], vn[1]  # token 7: table[1, 0] = block 4, slot 7
    np.testing.assert_array_equal(k2, want_k)
    np.testing.assert_array_equal(v2, want_v)


@pytest.mark.parametrize("name,issue", [("attention_prefill", "prefill-attention")])
def test_missing_operators_name_their_issue(name, issue):
    fn = getattr(ft, name)
    nargs = sum(1 for p in inspect.signature(fn).parameters.values()
                if p.kind == p.POSITIONAL_OR_KEYWORD and p.default is inspect.Parameter.empty)
    with pytest.raises(NotImplementedError, match=issue):
        fn(*([np.zeros(4, np.int8)] * nargs))
    assert issue in fn.__doc__ and issue in ft.__doc__


def test_quantize_int8_round_trip():
    x = np.array([[1.0, 3.0, -254.0], [0.0, 5.0, 127.0]], np.float32)  # scale 2: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2
    q, s = ft.quantize_int8(x)
    assert isinstance(s, float) and s == 2.0
    assert q.dtype == np.int8 and q.tolist() == [[0, 2, -127], [0, 2, 64]]
    np.testing.assert_array_equal(ft.dequantize_int8(q, s), q.astype(np.float32) * 2)
    q3, s3 = ft.quantize_int8(_f32(2, 3, 5))
    assert q3.shape == (2, 3, 5) and ft.dequantize_int8(q3, s3).shape == (2, 3, 5)
    with pytest.raises(ValueError, match="x:"):
        ft.quantize_int8(np.float32(1.0))


def _i8(*shape):
    return RNG.integers(-127, 128, shape).astype(np.int8)


def test_qgemm_is_exact_int_math_times_the_composed_scale():
    a, b = _i8(5, 300), _i8(7, 300)
    acc = a.astype(np.int64) @ b.astype(np.int64).T
    y = ft.qgemm(a, 0.02, b, 0.3)
    assert y.dtype == np.float32 and y.shape == (5, 7)
    np.testing.assert_array_equal(y, (acc * np.float64(np.float32(0.02) * np.float32(0.3))).astype(np.float32))
    sb = (RNG.random(7) + 0.5).astype(np.float32) / 100
    y = ft.qgemm_perchannel(a, 0.05, b, sb)
    np.testing.assert_array_equal(y, (acc * (sb * np.float32(0.05)).astype(np.float64)).astype(np.float32))
    yt = ft.qgemm(torch.from_numpy(a), 0.02, torch.from_numpy(b), 0.3)  # CPU tensors in, CPU tensor out
    assert isinstance(yt, torch.Tensor) and yt.dtype == torch.float32
    np.testing.assert_array_equal(yt.numpy(), ft.qgemm(a, 0.02, b, 0.3))
    with pytest.raises(TypeError, match="a_q: expected int8"):
        ft.qgemm(a.astype(np.float32), 1.0, b, 1.0)
    with pytest.raises(ValueError, match=r"b_q: expected \[N, 300\]"):
        ft.qgemm(a, 1.0, _i8(7, 299), 1.0)
    with pytest.raises(ValueError, match="b_scales: expected one scale per output channel"):
        ft.qgemm_perchannel(a, 1.0, b, sb[:6])
    with pytest.raises(ValueError, match="a_q: expected 2 dimensions"):
        ft.qgemm(_i8(300), 1.0, b, 1.0)


def test_qadd_int8_requantizes_the_float_sum():
    qa, qb = _i8(3, 40), _i8(3, 40)
    qy, s = ft.qadd_int8(qa, 0.5, qb, 0.25)
    y = qa.astype(np.float32) * np.float32(0.5) + qb.astype(np.float32) * np.float32(0.25)
    want_q, want_s = ft.quantize_int8(y)
    assert isinstance(s, float) and s == want_s == np.float32(np.abs(y).max() / np.float32(127))
    np.testing.assert_array_equal(qy, want_q)
    with pytest.raises(ValueError, match="qb: expected the shape of qa"):
        ft.qadd_int8(qa, 1.0, qb[:2], 1.0)
    with pytest.raises(TypeError, match="qb: expected int8"):
        ft.qadd_int8(qa, 1.0, qb.astype(np.int16), 1.0)


def test_docstring_names_the_semantic_differences():
    for phrase in ("Philox", "splitmix", "Ties", "topp(probs, p)", "temperature(x, t)", "rope", "NotImplementedError"):
        assert phrase in ft.__doc__, phrase


def test_staged_without_a_gpu_is_a_runtime_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the staged path runs (the gpu tests cover it)")
    with pytest.raises(RuntimeError, match="cuda=True: expected a CUDA device"):
        ft.silu(_f32(4), cuda=True)


# ---------------------------------------------------------------------------------------------
# GPU: CUDA tensors in -> CUDA tensors out, and cuda=True (staged), against the numpy path

def _cases():
    x, y = _f32(4, 256, scale=2), _f32(4, 256)
    w, b = _f32(256) + 1, _f32(256)
    probs = np.abs(_f32(300)) + 1e-3
    probs /= probs.sum()
    cases = {name: ((x,), {}) for name in UNARY_NUMPY}
    cases.update({
        "axpy": ((x, 1.5, 0.25), {}), "add": ((x, y), {}), "mul": ((x, y), {}), "swiglu": ((x, y), {}),
        "temperature": ((x, 0.6), {}), "softmax": ((x,), {}), "rmsnorm": ((x, w), {}),
        "rmsnorm_residual": ((x, w), {"residual": y}), "layernorm": ((x, w, b), {}),
        "rope": ((x[:, :128].copy(), y[:, :128].copy()), {"pos_offset": 3, "neox": True}),
        "topk": ((x[0].copy(), 9), {}), "topp": ((probs.astype(np.float32), 0.5), {}),
    })
    return cases


def _to_cuda(v):
    return torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v


def _np(v):
    if isinstance(v, tuple):
        return tuple(_np(u) for u in v)
    if isinstance(v, torch.Tensor):
        assert v.is_cuda
        return v.cpu().numpy()
    return v


def _compare(got, want):
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            _compare(g, w)
    elif want is None:
        assert got is None
    else:
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(_cases()))
def test_gpu_cuda_tensors_and_staged(cuda, case):
    args, kw = _cases()[case]
    fn = getattr(ft, "rmsnorm" if case == "rmsnorm_residual" else case)
    want = fn(*args, **kw)
    got = fn(*[_to_cuda(a) for a in args], **{k: _to_cuda(v) for k, v in kw.items()})
    _compare(_np(got), want)
    staged = fn(*args, cuda=True, **kw)
    _compare(staged, want)
    for v in (staged if isinstance(staged, tuple) else (staged,)):
        assert v is None or isinstance(v, np.ndarray)


@pytest.mark.gpu
def test_gpu_bf16_stays_bf16(cuda):
    x = torch.randn(4, 256, device=cuda, dtype=torch.bfloat16)
    for name in ("silu", "gelu", "relu", "tanh", "sigmoid", "gelu_tanh"):
        y = getattr(ft, name)(x)
        assert y.dtype == torch.bfloat16 and y.is_cuda
    assert ft.mul(x, x).dtype == torch.bfloat16


@pytest.mark.gpu
def test_gpu_selection_and_samplers(cuda):
    logits = _f32(200)
    logits[17], logits[42] = 10.0, 9.9  # a unique maximum, and the runner-up once 17 is penalised
    lt = torch.from_numpy(logits).cuda()
    assert ft.argmax(lt) == ft.argmax(logits) == ft.argmax(logits, cuda=True) == 17
    for sampler, arg in ((ft.sample_topk, 1), (ft.sample_topp, 1e-6), (ft.sample_minp, 1.0)):
        assert sampler(lt, arg, seed=3) == sampler(logits, arg, seed=3, cuda=True) == 17
    t = ft.sample_topp(lt, 0.9, temperature=0.7, seed=5)
    assert type(t) is int and t == ft.sample_topp(lt, 0.9, temperature=0.7, seed=5)
    batch = np.stack([logits, logits[::-1].copy()])
    out = ft.sample_topk_batched(torch.from_numpy(batch).cuda(), 1)
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu" and out.tolist() == [17, 182]
    assert ft.sample_minp_batched(batch, 1.0, cuda=True).tolist() == [17, 182]
    assert ft.decode_step(lt, torch.tensor([17], device=cuda), 1.5, p=1e-6) == 42
    assert ft.decode_step(logits, np.array([17]), 1.5, p=1e-6, cuda=True) == 42
    pen = ft.repetition_penalty(lt, np.array([0, 17]), 2.0)
    assert pen.is_cuda
    np.testing.assert_array_equal(pen.cpu().numpy(), ft.repetition_penalty(logits, np.array([0, 17]), 2.0))


@pytest.mark.gpu
def test_gpu_attention_and_kv(cuda):
    b, hq, hkv, t, d = 2, 4, 2, 40, 128
    q, k, v = _f32(b, hq, d), _f32(b, hkv, t, d), _f32(b, hkv, t, d)
    lens = np.array([33, 5])
    want = ft.attention_decode(q, k, v, lens)
    got = ft.attention_decode(*map(_to_cuda, (q, k, v)), lens)
    _compare(got.cpu().numpy(), want)
    _compare(ft.attention_decode(q, k, v, lens, cuda=True), want)
    kn, vn = _f32(b, hkv, d), _f32(b, hkv, d)
    pos = np.array([33, 5])
    kh, vh = k.copy(), v.copy()
    ft.kv_append(kh, vh, kn, vn, pos)
    ks, vs = k.copy(), v.copy()
    ft.kv_append(ks, vs, kn, vn, pos, cuda=True)
    np.testing.assert_array_equal(ks, kh)
    np.testing.assert_array_equal(vs, vh)
    kd, vd = _to_cuda(k.copy()), _to_cuda(v.copy())
    ft.kv_append(kd, vd, _to_cuda(kn), _to_cuda(vn), torch.from_numpy(pos).cuda())
    np.testing.assert_array_equal(kd.cpu().numpy(), kh)
    # paged: fusedtok's [Nb, Hkv, P, D] pools
    nb, page = 6, 16
    kp, vp = _f32(nb, hkv, page, d), _f32(nb, hkv, page, d)
    table = np.array([[3, 0, 5], [4, 1, 2]])
    want = ft.attention_decode_paged(q, kp, vp, table, lens)
    _compare(ft.attention_decode_paged(*map(_to_cuda, (q, kp, vp)), table, lens).cpu().numpy(), want)
    _compare(ft.attention_decode_paged(q, kp, vp, table, lens, cuda=True), want)
    kh, vh = kp.copy(), vp.copy()
    ft.kv_append_paged(kh, vh, table, kn, vn, pos)
    kd, vd = _to_cuda(kp.copy()), _to_cuda(vp.copy())
    ft.kv_append_paged(kd, vd, table, _to_cuda(kn), _to_cuda(vn), pos)
    np.testing.assert_array_equal(kd.cpu().numpy(), kh)
    np.testing.assert_array_equal(vd.cpu().numpy(), vh)


@pytest.mark.gpu
def test_gpu_int8_operators(cuda):
    """qgemm / qgemm_perchannel on CUDA tensors and staged equal the numpy path bit for bit (exact
    int32 accumulation, one rounding of the composed scale), at a decode M and a tiled M; qadd_int8
    on CUDA tensors."""
    for m in (1, 37):
        a, b = _i8(m, 512), _i8(96, 512)
        sb = (RNG.random(96) + 0.5).astype(np.float32) / 100
        want = ft.qgemm(a, 0.02, b, 0.3)
        got = ft.qgemm(_to_cuda(a), 0.02, _to_cuda(b), 0.3)
        assert got.is_cuda and got.dtype == torch.float32
        np.testing.assert_array_equal(got.cpu().numpy(), want)
        np.testing.assert_array_equal(ft.qgemm(a, 0.02, b, 0.3, cuda=True), want)
        want = ft.qgemm_perchannel(a, 0.05, b, sb)
        np.testing.assert_array_equal(ft.qgemm_perchannel(_to_cuda(a), 0.05, _to_cuda(b), sb).cpu().numpy(), want)
        np.testing.assert_array_equal(ft.qgemm_perchannel(a, 0.05, b, sb, cuda=True), want)
    qa, qb = _i8(4, 300), _i8(4, 300)
    qy, s = ft.qadd_int8(_to_cuda(qa), 0.5, _to_cuda(qb), 0.25)
    want_q, want_s = ft.qadd_int8(qa, 0.5, qb, 0.25)
    assert qy.is_cuda and s == want_s
    np.testing.assert_array_equal(qy.cpu().numpy(), want_q)
    with pytest.raises(TypeError, match="b_q: expected a CUDA tensor"):
        ft.qgemm(_to_cuda(a), 1.0, b, 1.0)


@pytest.mark.gpu
def test_gpu_mixed_devices_are_type_errors(cuda):
    x = torch.randn(8, device=cuda)
    with pytest.raises(TypeError, match="b: expected a CUDA tensor"):
        ft.add(x, np.ones(8, np.float32))
    with pytest.raises(TypeError, match="b: expected a host array"):
        ft.add(np.ones(8, np.float32), x)
