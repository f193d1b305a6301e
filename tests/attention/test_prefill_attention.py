"""fray.prefill_attention: reference (hand values, a direct softmax formula, the paged form against
the contiguous one), the Triton kernel under the interpreter (contiguous and paged K/V), the ops
layer's wiring, the error contract; GPU: every dtype x head dim x group against the float64
reference and SDPA, paged K/V, torch.compile, CUDA-graph replay with new cu_seqlens (and new
block tables)."""
import contextlib
import inspect
import math
import os

import numpy as np
import pytest
import torch

import fray
from fray import _plan as P
from fray import backend as B
from fray.ops import attention as A
from fray.reference import attention as ref
from fray.testing import assert_close, run_host_check, stub_jit

INTERPRET = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                               reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _cu(lens, device="cpu"):
    return torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32, device=device)


def _varlen_case(dtype, lens_q, lens_k, hq, hkv, d, seed=0, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, hq, d, device=device, generator=g).to(dtype)
    k = torch.randn(tk, hkv, d, device=device, generator=g).to(dtype)
    v = torch.randn(tk, hkv, d, device=device, generator=g).to(dtype)
    return q, k, v, _cu(lens_q, device), _cu(lens_k, device)


def _paged_case(dtype, lens_q, lens_k, hq, hkv, d, page, seed=0, device="cpu"):
    """_varlen_case, plus the same keys in `page`-token pages behind a shuffled block table (the
    pool rows no sequence uses hold NaN): (q, k, v, cu_q, cu_k, k_pages, v_pages, block_table)."""
    q, k, v, cu_q, cu_k = _varlen_case(dtype, lens_q, lens_k, hq, hkv, d, seed, device)
    kp, vp, bt = A._paged_kv(k, v, lens_k, page, torch.Generator(device=device).manual_seed(seed + 1))
    return q, k, v, cu_q, cu_k, kp, vp, bt


def _expected(q, k, v, cu_q=None, cu_k=None, causal=True, scale=None):
    f64 = [t.detach().to("cpu", torch.float64).numpy() for t in (q, k, v)]
    cu = [None if c is None else c.cpu().tolist() for c in (cu_q, cu_k)]
    return ref.prefill_attention(*f64, cu[0], cu[1], causal, scale)


def _check(out, lse, expected, dtype, what, rows=None):
    """out / lse against the reference; rows: only the first `rows` packed query rows (the rest is
    padding that the GPU does not write)."""
    e, el, mag = expected
    out, lse, el = out.cpu(), lse.cpu(), torch.from_numpy(np.asarray(el))
    e, mag = torch.from_numpy(e), torch.from_numpy(mag)
    if rows is not None:
        out, e, mag, lse, el = out[:rows], e[:rows], mag[:rows], lse[:, :rows], el[:, :rows]
    assert_close(out, e, dtype, what, scale=mag)
    empty = torch.isinf(el)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "%s: lse -inf rows differ" % what
    assert_close(lse[~empty], el[~empty], torch.float32, what + " lse")


# ---------------------------------------------------------------------------------------------
# CPU: the reference against hand-computed values and a direct softmax formula

def _one_head(n_q, keys, values, d=64):
    """n_q queries of ones against keys / values whose rows are constant (one head, D = 64)."""
    q = np.ones((n_q, 1, d))
    k = np.repeat(np.asarray(keys, dtype=np.float64)[:, None, None], d, axis=2)
    v = np.repeat(np.asarray(values, dtype=np.float64)[:, None, None], d, axis=2)
    return q, k, v


def test_reference_hand_computed():
    # equal keys: each query averages the values it sees. 2 queries, 3 keys, causal bottom-right:
    # query 0 sees keys 0, 1 (mean 3), query 1 sees all three (mean 14/3).
    q, k, v = _one_head(2, [0.0, 0.0, 0.0], [2.0, 4.0, 8.0])
    out, lse, _ = ref.prefill_attention(q, k, v, [0, 2], [0, 3], causal=True)
    np.testing.assert_allclose(out[:, 0, 0], [3.0, 14.0 / 3.0], rtol=1e-15)
    np.testing.assert_allclose(lse[0], [math.log(2.0), math.log(3.0)], rtol=1e-15)
    out, lse, _ = ref.prefill_attention(q, k, v, [0, 2], [0, 3], causal=False)
    np.testing.assert_allclose(out[:, 0, 0], [14.0 / 3.0] * 2, rtol=1e-15)
    # one key with score 4 (q.k = 64 * 0.5 = 32, scale 1/8): the output is its value, lse = 4
    q, k, v = _one_head(1, [0.5], [7.0])
    out, lse, _ = ref.prefill_attention(q, k, v, [0, 1], [0, 1])
    np.testing.assert_allclose(out[0, 0], np.full(64, 7.0), rtol=1e-15)
    np.testing.assert_allclose(lse, [[4.0]], rtol=1e-15)
    # 3 queries, 1 key (more queries than keys, causal): queries 0 and 1 see nothing
    q, k, v = _one_head(3, [0.0], [5.0])
    out, lse, _ = ref.prefill_attention(q, k, v, [0, 3], [0, 1])
    assert (out[:2] == 0).all() and (lse[0, :2] == -np.inf).all()
    np.testing.assert_allclose(out[2, 0], np.full(64, 5.0), rtol=1e-15)
    assert lse[0, 2] == 0.0
    # scale: keys 0 and 1/64 per element give scores 0 and scale; weights 1 : e^scale = 1 : 3
    q, k, v = _one_head(1, [0.0, 1.0 / 64], [0.0, 1.0])
    out, lse, _ = ref.prefill_attention(q, k, v, [0, 1], [0, 2], scale=math.log(3.0))
    np.testing.assert_allclose(out[0, 0], np.full(64, 0.75), rtol=1e-14)
    np.testing.assert_allclose(lse, [[math.log(4.0)]], rtol=1e-14)


def test_reference_gqa_head_mapping():
    # Hq = 4, Hkv = 2: query heads 0, 1 read kv head 0, heads 2, 3 kv head 1
    q = np.ones((1, 4, 64))
    k = np.zeros((1, 2, 64))
    v = np.stack([np.full(64, 1.0), np.full(64, 2.0)])[None]
    out, _, _ = ref.prefill_attention(q, k, v, [0, 1], [0, 1])
    np.testing.assert_allclose(out[0, :, 0], [1.0, 1.0, 2.0, 2.0])


def _direct(q, k, v, lens_q, lens_k, causal, scale):
    """softmax(scale q k^T + mask) v per sequence with torch's softmax, GQA by repeating kv heads."""
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=q.dtype)
    group = q.shape[1] // k.shape[1]
    q0 = k0 = 0
    for n_q, n_k in zip(lens_q, lens_k):
        qs = q[q0:q0 + n_q].transpose(0, 1)                                  # [Hq, n_q, D]
        ks = k[k0:k0 + n_k].repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, n_k, D]
        vs = v[k0:k0 + n_k].repeat_interleave(group, dim=1).transpose(0, 1)
        s = scale * qs @ ks.transpose(1, 2)
        if causal:
            i = torch.arange(n_q)[:, None]
            j = torch.arange(n_k)[None, :]
            s = s.masked_fill(j > i + n_k - n_q, -math.inf)
        seen = torch.isfinite(s).any(-1)                                     # [Hq, n_q]
        p = torch.where(seen[..., None], torch.softmax(s, -1), torch.zeros_like(s))
        out[q0:q0 + n_q] = (p @ vs).transpose(0, 1)
        lse[:, q0:q0 + n_q] = torch.where(seen, torch.logsumexp(s, -1), torch.full_like(seen, -math.inf, dtype=q.dtype))
        q0, k0 = q0 + n_q, k0 + n_k
    return out, lse


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (3, 1)])
def test_reference_matches_direct_softmax(causal, hq, hkv):
    lens_q, lens_k = [3, 0, 7, 9, 1, 5], [3, 4, 7, 20, 0, 2]   # q shorter, longer, equal, empty
    q, k, v, cu_q, cu_k = _varlen_case(torch.float64, lens_q, lens_k, hq, hkv, 64, seed=hq)
    out, lse, mag = ref.prefill_attention(q.numpy(), k.numpy(), v.numpy(), cu_q, cu_k, causal, 0.2)
    want, want_lse = _direct(q, k, v, lens_q, lens_k, causal, 0.2)
    torch.testing.assert_close(torch.from_numpy(out), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.from_numpy(lse), want_lse, rtol=1e-12, atol=1e-12)
    assert (mag >= np.abs(out) - 1e-12).all()


def test_reference_batched_form_is_the_varlen_form():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 5, 4, 64, generator=g, dtype=torch.float64)
    k = torch.randn(3, 9, 2, 64, generator=g, dtype=torch.float64)
    v = torch.randn(3, 9, 2, 64, generator=g, dtype=torch.float64)
    out, lse, _ = ref.prefill_attention(q.numpy(), k.numpy(), v.numpy())
    vo, vl, _ = ref.prefill_attention(q.reshape(15, 4, 64).numpy(), k.reshape(27, 2, 64).numpy(),
                                      v.reshape(27, 2, 64).numpy(), [0, 5, 10, 15], [0, 9, 18, 27])
    assert out.shape == (3, 5, 4, 64) and lse.shape == (3, 4, 5)
    np.testing.assert_array_equal(out.reshape(15, 4, 64), vo)
    np.testing.assert_array_equal(lse, vl.reshape(4, 3, 5).transpose(1, 0, 2))


def test_reference_paged_hand_computed():
    # One sequence of 17 keys in 16-token pages behind the table [1, 0]: tokens 0..15 are page 1,
    # token 16 is slot 0 of page 0 (the rest of page 0 is NaN: never read). Equal keys, value t at
    # token t: each query averages what it sees. Two queries, causal bottom-right: query 0 sees
    # tokens 0..15 (mean 7.5), query 1 all 17 (mean 8).
    q = np.ones((2, 1, 64))
    kp = np.zeros((2, 16, 1, 64))
    vp = np.zeros((2, 16, 1, 64))
    vp[1, :, 0, :] = np.arange(16.0)[:, None]
    vp[0, 0, 0, :] = 16.0
    kp[0, 1:], vp[0, 1:] = np.nan, np.nan
    bt = np.array([[1, 0]], np.int32)
    y, lse = fray.prefill_attention(q, kp, vp, cu_seqlens_q=np.array([0, 2]), cu_seqlens_k=np.array([0, 17]),
                                    block_table=bt, return_lse=True)
    np.testing.assert_allclose(y[:, 0, 0], [7.5, 8.0], rtol=1e-15)
    np.testing.assert_allclose(lse[0], [math.log(16.0), math.log(17.0)], rtol=1e-15)
    # 16 keys: page 1 alone (the table's second entry is not used)
    y = fray.prefill_attention(q[:1], kp, vp, cu_seqlens_q=np.array([0, 1]), cu_seqlens_k=np.array([0, 16]),
                               block_table=np.array([[1, -1]], np.int32))
    np.testing.assert_allclose(y[0, 0], np.full(64, 7.5), rtol=1e-15)


# lengths around the 16- and 64-token pages (one short, whole, one over), an empty sequence; the
# queries are the last positions of the keys (chunked prefill) or all of them
PAGED_LENS_K = [1, 63, 64, 65, 127, 129, 0]
PAGED_LENS_Q = [1, 20, 64, 1, 100, 129, 0]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("page", [16, 64])
def test_reference_paged_is_the_contiguous_form(page, causal):
    q, k, v, cu_q, cu_k, kp, vp, bt = _paged_case(torch.float64, PAGED_LENS_Q, PAGED_LENS_K, 4, 2, 64, page,
                                                  seed=page)
    entries = bt.flatten().tolist()
    assert len(set(entries)) == len(entries) and entries != sorted(entries)  # distinct pages, shuffled
    assert bt.shape == (7, -(-129 // page)) and torch.isnan(kp).any()
    want = ref.prefill_attention(q.numpy(), k.numpy(), v.numpy(), cu_q, cu_k, causal, 0.1)
    got = ref.prefill_attention(q.numpy(), kp.numpy(), vp.numpy(), cu_q, cu_k, causal, 0.1, block_table=bt)
    for a, b in zip(got, want):  # the same rows in the same order: the same float64 operations
        np.testing.assert_array_equal(a, b)
    # the op's CPU path (validation, then the reference) on 16-bit tensors: the contiguous call's result
    for dtype in (torch.bfloat16, torch.float16):
        qd, kd, vd, kpd, vpd = (t.to(dtype) for t in (q, k, v, kp, vp))
        kw = dict(causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=129, max_seqlen_k=129,
                  scale=0.1, return_lse=True)
        y, lse = fray.prefill_attention(qd, kpd, vpd, block_table=bt, **kw)
        cy, clse = fray.prefill_attention(qd, kd, vd, **kw)
        assert y.dtype == dtype and torch.equal(y, cy) and torch.equal(lse, clse)


def test_public_api_numpy_and_cpu_tensors():
    q, k, v = _one_head(2, [0.0, 0.0, 0.0], [2.0, 4.0, 8.0])
    y, lse = fray.prefill_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                                    cu_seqlens_q=np.array([0, 2]), cu_seqlens_k=np.array([0, 3]), return_lse=True)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and lse.dtype == np.float32 and lse.shape == (1, 2)
    np.testing.assert_allclose(y[:, 0, 0], [3.0, 14.0 / 3.0], rtol=1e-6)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        q, k, v, cu_q, cu_k = _varlen_case(dtype, [5, 0, 3], [5, 2, 6], 4, 2, 64)
        out = torch.full_like(q, float("nan"))
        y, lse = fray.prefill_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out, return_lse=True)
        assert y is out and y.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (4, 8)
        _check(y, lse, _expected(q, k, v, cu_q, cu_k), dtype, "cpu %s" % dtype)
        # the batched form of one sequence, and max_seqlen bounds accepted on the CPU
        yb, lb = fray.prefill_attention(q[None, :5], k[None, :5], v[None, :5], causal=False, return_lse=True)
        yv = fray.prefill_attention(q[:5], k[:5], v[:5], causal=False, cu_seqlens_q=cu_q[:2], cu_seqlens_k=cu_k[:2],
                                    max_seqlen_q=5, max_seqlen_k=5)
        assert yb.shape == (1, 5, 4, 64) and lb.shape == (1, 4, 5) and torch.equal(yb[0], yv)


def test_registration():
    assert fray.OPS["prefill_attention"] == "attention" and hasattr(torch.ops.fray, "prefill_attention")
    assert B._PREFERENCE["prefill_attention"] == ("cuda", "triton")
    name, src = A.prefill_cuda_source(torch.bfloat16, 128, True)
    assert name == "prefill_sm90_bf16_d128_n128_s2_ov_pp_causal"
    assert "PrefillConfig<cutlass::bfloat16_t, 128, 128, 2, true, true, true>" in src
    assert A.prefill_cuda_source(torch.bfloat16, 128, False)[0] == "prefill_sm90_bf16_d128_n128_s2_ov_full"
    assert "FRAY_PREFILL_ENTRY(Config)" in src
    name, src = A.prefill_cuda_source(torch.float16, 256, False)
    assert name == "prefill_sm90_fp16_d256_n64_s2_ov_pp_full"
    assert "PrefillConfig<cutlass::half_t, 256, 64, 2, false, true, true>" in src
    assert "PrefillConfig<cutlass::bfloat16_t, 64, 192, 2, true, true, true>" in A.prefill_cuda_source(
        torch.bfloat16, 64, True)[1]
    # every shipped tile is whole pages or lies within one; where it is not (192 keys, 128-key
    # pages), the paged kernel takes PREFILL_CUDA_PAGED_TILE
    for (d, causal), tile in A.PREFILL_CUDA_TILES.items():
        for page in (16, 32, 64, 128):
            got = A.prefill_cuda_tile(d, causal, page)
            box = min(page, got[0])
            assert got[0] % box == 0 and page % box == 0, (d, causal, page, got)
            assert got == (tile if tile[0] % min(page, tile[0]) == 0 and page % min(page, tile[0]) == 0
                           else A.PREFILL_CUDA_PAGED_TILE)
    assert A.prefill_cuda_tile(64, True, 128) == A.PREFILL_CUDA_PAGED_TILE
    assert "PrefillConfig<cutlass::bfloat16_t, 64, 128, 2, true, true, true, 128>" in A.prefill_cuda_source(
        torch.bfloat16, 64, True, 128)[1]
    assert list(inspect.signature(fray.triton.attention_prefill).parameters) == ["q_all", "k_all", "v_all", "causal"]
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.triton.attention_prefill(*(t[None] for t in _varlen_case(torch.float16, [4], [4], 2, 2, 64)[:3]))


# ---------------------------------------------------------------------------------------------
# CPU: the error contract (validation runs before the CPU / GPU split, so CPU tensors show it)

def _args(**change):
    q, k, v, cu_q, cu_k = _varlen_case(torch.bfloat16, [5, 3], [5, 6], 4, 2, 64)
    kw = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    kw.update(change)
    return kw


def _call(kw):
    kw = dict(kw)
    return fray.prefill_attention(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


_BF = torch.bfloat16
ERRORS = [
    # dtypes
    (dict(k=torch.zeros(11, 2, 64, dtype=torch.float16)), TypeError, "k: expected dtype bfloat16"),
    (dict(v=torch.zeros(11, 2, 64)), TypeError, "v: expected dtype bfloat16"),
    (dict(q=torch.zeros(8, 4, 64, dtype=torch.int32)), TypeError, r"q: expected dtype in"),
    (dict(q=torch.zeros(8, 4, 64, dtype=torch.float64)), TypeError, r"q: expected dtype in"),
    (dict(cu_seqlens_q=torch.tensor([0, 5, 8])), TypeError, "cu_seqlens_q: expected dtype int32, got int64"),
    (dict(cu_seqlens_k=torch.tensor([0.0, 5, 11])), TypeError, "cu_seqlens_k: expected dtype int32"),
    (dict(k=[0.0]), TypeError, "k: expected a torch.Tensor"),
    # heads and head dims
    (dict(v=torch.zeros(11, 4, 64, dtype=_BF)), ValueError, r"v: expected shape \(11, 2, 64\)"),
    (dict(k=torch.zeros(11, 3, 64, dtype=_BF), v=torch.zeros(11, 3, 64, dtype=_BF)), ValueError,
     "q: the query head count Hq=4 must be a multiple of k's kv head count Hkv=3"),
    (dict(k=torch.zeros(11, 2, 128, dtype=_BF), v=torch.zeros(11, 2, 128, dtype=_BF)), ValueError,
     "k: head dim 128 differs from q's 64"),
    (dict(q=torch.zeros(8, 4, 96, dtype=_BF), k=torch.zeros(11, 2, 96, dtype=_BF), v=torch.zeros(11, 2, 96, dtype=_BF)),
     ValueError, r"q: head dim must be one of \(64, 128, 256\), got 96"),
    (dict(q=torch.zeros(8, 64, dtype=_BF)), ValueError, r"q: the varlen form .* takes q \[total_q, Hq, D\]"),
    (dict(k=torch.zeros(1, 11, 2, 64, dtype=_BF)), ValueError, r"k: the varlen form"),
    # cu_seqlens shapes and values
    (dict(cu_seqlens_q=torch.zeros(1, 3, dtype=torch.int32)), ValueError, r"cu_seqlens_q: expected shape \[B \+ 1\]"),
    (dict(cu_seqlens_q=torch.zeros(0, dtype=torch.int32)), ValueError, r"cu_seqlens_q: expected shape \[B \+ 1\]"),
    (dict(cu_seqlens_k=torch.tensor([0, 11], dtype=torch.int32)), ValueError,
     r"cu_seqlens_k: expected shape \(3,\), got \(2,\)"),
    (dict(cu_seqlens_k=None), ValueError, "cu_seqlens_k: expected a tensor with cu_seqlens_q"),
    (dict(cu_seqlens_q=None), ValueError, "cu_seqlens_q: expected a tensor with cu_seqlens_k"),
    (dict(cu_seqlens_q=torch.tensor([1, 5, 8], dtype=torch.int32)), ValueError,
     "cu_seqlens_q: expected entry 0 to be 0, got 1"),
    (dict(cu_seqlens_k=torch.tensor([0, 6, 5], dtype=torch.int32)), ValueError,
     "cu_seqlens_k: expected non-decreasing offsets; entry 2 = 5 < entry 1 = 6"),
    (dict(cu_seqlens_q=torch.tensor([0, 5, 9], dtype=torch.int32)), ValueError,
     "cu_seqlens_q: the last offset 9 lies past q's 8 rows"),
    (dict(max_seqlen_k=5), ValueError, "cu_seqlens_k: sequence 1 has 6 tokens, more than max_seqlen_k=5"),
    (dict(max_seqlen_q=5.0), TypeError, "max_seqlen_q: expected a Python int, got float"),
    (dict(max_seqlen_q=True), TypeError, "max_seqlen_q: expected a Python int, got bool"),
    (dict(max_seqlen_k=-1), ValueError, "max_seqlen_k: expected a value >= 0"),
    # devices (meta tensors stand in for a second device: validation never touches their data)
    (dict(k=torch.zeros(11, 2, 64, dtype=_BF, device="meta")), TypeError, "k: expected a tensor on cpu"),
    (dict(cu_seqlens_q=torch.zeros(3, dtype=torch.int32, device="meta")), TypeError,
     "cu_seqlens_q: expected a tensor on cpu"),
    (dict(out=torch.zeros(8, 4, 64, dtype=_BF, device="meta")), TypeError, "out: expected a tensor on cpu"),
    # layout, out, scalars, backend
    (dict(k=torch.zeros(11, 2, 128, dtype=_BF)[:, :, ::2]), ValueError, "k: the last dimension must be contiguous"),
    (dict(out=torch.zeros(8, 4, 64)), TypeError, "out: expected dtype bfloat16"),
    (dict(out=torch.zeros(8, 2, 64, dtype=_BF)), ValueError, r"out: expected shape \(8, 4, 64\)"),
    (dict(causal=1), TypeError, "causal: expected a bool, got int"),
    (dict(return_lse="yes"), TypeError, "return_lse: expected a bool, got str"),
    (dict(scale=-1.0), ValueError, "scale: expected a finite value > 0"),
    (dict(scale="0.1"), TypeError, "scale: expected a float or None"),
    (dict(backend="cuda"), ValueError, "backend: 'cuda' needs CUDA tensors"),
    (dict(backend="triton"), ValueError, "backend: 'triton' needs CUDA tensors"),
    (dict(backend="fast"), ValueError, "backend: expected one of"),
]


@pytest.mark.parametrize("change,exc,message", ERRORS, ids=[m[:40] for _, _, m in ERRORS])
def test_error_contract(change, exc, message):
    with pytest.raises(exc, match=message):
        _call(_args(**change))


def _paged_args(**change):
    """A valid paged call: sequences of 5 and 6 keys (3 queries each) in 16-token pages, a table of
    2 blocks per sequence (capacity 32) over a pool of 5 pages."""
    q, k, v, cu_q, cu_k, kp, vp, bt = _paged_case(torch.bfloat16, [3, 3], [5, 6], 4, 2, 64, 16)
    bt = torch.cat([bt, torch.tensor([[3, 4], [4, 3]], dtype=torch.int32)], dim=1)
    kw = dict(q=q, k=kp, v=vp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=bt)
    kw.update(change)
    return kw


_I32 = torch.int32
PAGED_ERRORS = [
    # forms
    (dict(q=torch.zeros(2, 3, 4, 64, dtype=_BF), cu_seqlens_q=None, cu_seqlens_k=None), ValueError,
     r"block_table: only the varlen form takes it \(q \[total_q, Hq, D\] with cu_seqlens_q and cu_seqlens_k\)"),
    (dict(cu_seqlens_k=None), ValueError,
     r"cu_seqlens_k: expected a tensor with cu_seqlens_q .* with block_table, sequence b's key count is "
     r"cu_seqlens_k\[b \+ 1\] - cu_seqlens_k\[b\]"),
    # pools
    (dict(k=torch.zeros(11, 2, 64, dtype=_BF)), ValueError, r"k: expected \[num_blocks, block_size, Hkv, D\]"),
    (dict(v=torch.zeros(5, 16, 2, 128, dtype=_BF)), ValueError, r"v: expected shape \(5, 16, 2, 64\)"),
    (dict(k=torch.zeros(5, 8, 2, 64, dtype=_BF), v=torch.zeros(5, 8, 2, 64, dtype=_BF)), ValueError,
     r"k: block size \(dim 1\) must be one of \(1, 16, 32, 64, 128\), got 8"),
    (dict(k=torch.zeros(5, 16, 3, 64, dtype=_BF), v=torch.zeros(5, 16, 3, 64, dtype=_BF)), ValueError,
     "q: the query head count Hq=4 must be a multiple of k's kv head count Hkv=3"),
    (dict(v=torch.zeros(5, 16, 2, 64, dtype=torch.float16)), TypeError, "v: expected dtype bfloat16"),
    # the block table
    (dict(block_table=torch.zeros(2, 3, dtype=torch.int64)), TypeError,
     "block_table: expected dtype int32, got int64"),
    (dict(block_table=torch.zeros(2, 3)), TypeError, "block_table: expected dtype int32, got float32"),
    (dict(block_table=torch.zeros(3, 3, dtype=_I32)), ValueError, r"block_table: expected shape \[B=2, max_blocks\], "
     r"got \(3, 3\)"),
    (dict(block_table=torch.zeros(6, dtype=_I32)), ValueError, r"block_table: expected shape \[B=2, max_blocks\]"),
    (dict(block_table=torch.zeros(2, 6, dtype=_I32)[:, ::2]), ValueError,
     "block_table: the last dimension must be contiguous"),
    (dict(block_table=torch.zeros(2, 3, dtype=_I32, device="meta")), TypeError,
     "block_table: expected a tensor on cpu"),
    (dict(block_table=[[0, 1], [2, 3]]), TypeError, "block_table: expected a torch.Tensor"),
    # capacity and entries (max_blocks 3 x block size 16 = 48 keys per sequence)
    (dict(max_seqlen_k=49), ValueError, r"max_seqlen_k: 49 is more keys than a block_table row holds "
     r"\(max_blocks \* block size = 3 \* 16 = 48\)"),
    (dict(cu_seqlens_k=torch.tensor([0, 5, 54], dtype=_I32)), ValueError,
     r"cu_seqlens_k: sequence 1 has 49 keys, more than a block_table row holds \(max_blocks \* block size = "
     r"3 \* 16 = 48\)"),
    (dict(cu_seqlens_k=torch.tensor([0, 5, 4], dtype=_I32)), ValueError,
     "cu_seqlens_k: expected non-decreasing offsets"),
    (dict(max_seqlen_k=5), ValueError, "cu_seqlens_k: sequence 1 has 6 tokens, more than max_seqlen_k=5"),
    (dict(block_table=torch.tensor([[0, 1, 2], [5, 3, 4]], dtype=_I32)), ValueError,
     r"block_table: entry \[1, 0\] = 5 lies outside \[0, num_blocks=5\) and is used \(sequence 1 has 6 keys\)"),
    (dict(block_table=torch.tensor([[-1, 1, 2], [0, 3, 4]], dtype=_I32)), ValueError,
     r"block_table: entry \[0, 0\] = -1 lies outside"),
    (dict(cu_seqlens_k=torch.tensor([0, 5, 38], dtype=_I32), block_table=torch.tensor([[0, 1, 2], [3, 4, 9]],
                                                                                        dtype=_I32)),
     ValueError, r"block_table: entry \[1, 2\] = 9 lies outside .* \(sequence 1 has 33 keys\)"),
    # features the op does not have: refused, never ignored
    (dict(window_left=64), ValueError, "window_left: sliding-window attention is not supported"),
    (dict(logits_soft_cap=30.0), ValueError, "logits_soft_cap: logit soft-capping is not supported"),
    (dict(sinks=torch.zeros(4)), ValueError, "sinks: attention sinks are not supported"),
    # backends: forcing CUDA (or Triton) on CPU tensors
    (dict(backend="cuda"), ValueError, "backend: 'cuda' needs CUDA tensors"),
]


@pytest.mark.parametrize("change,exc,message", PAGED_ERRORS, ids=[m[:40] for _, _, m in PAGED_ERRORS])
def test_error_contract_paged(change, exc, message):
    with pytest.raises(exc, match=message):
        _call(_paged_args(**change))


def test_paged_entries_past_the_keys_are_not_used():
    """Entries past a sequence's last used block are never read: any value is accepted (the check
    covers the used ones) and the result is the contiguous call's; max_seqlen_k may be the capacity."""
    kw = _paged_args(max_seqlen_q=3, max_seqlen_k=48)
    kw["block_table"][0, 1:] = torch.tensor([-7, 99])
    kw["block_table"][1, 1:] = torch.tensor([-1, 10 ** 6])
    y = _call(kw)
    q, k, v, cu_q, cu_k = _varlen_case(torch.bfloat16, [3, 3], [5, 6], 4, 2, 64)
    assert torch.equal(y, fray.prefill_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k))


@pytest.mark.parametrize("feature", [dict(window_left=8), dict(logits_soft_cap=5.0), dict(sinks=torch.zeros(4))])
def test_features_refused_for_the_contiguous_forms(feature):
    name = next(iter(feature))
    with pytest.raises(ValueError, match="%s: .* not supported" % name):
        _call(_args(**feature))
    q = torch.zeros(2, 5, 4, 64, dtype=_BF)
    with pytest.raises(ValueError, match="%s: .* not supported" % name):
        fray.prefill_attention(q, q[:, :, :2], q[:, :, :2], **feature)


def test_error_contract_batched_form():
    q = torch.zeros(2, 5, 4, 64, dtype=_BF)
    k = torch.zeros(2, 7, 2, 64, dtype=_BF)
    with pytest.raises(ValueError, match=r"k: expected \[B=2, Sk, Hkv, D\]"):
        fray.prefill_attention(q, k[:1], k[:1])
    with pytest.raises(ValueError, match="max_seqlen_q: only the varlen form"):
        fray.prefill_attention(q, k, k, max_seqlen_q=5)
    with pytest.raises(ValueError, match=r"q: expected \[B, Sq, Hq, D\]"):
        fray.prefill_attention(q[0, 0], k, k)
    with pytest.raises(TypeError, match="q: expected a numpy.ndarray like q|k: expected a numpy.ndarray"):
        fray.prefill_attention(np.zeros((2, 5, 4, 64), np.float32), k, k)
    # on CUDA tensors the varlen form needs max_seqlen (the check, without a GPU)
    with pytest.raises(ValueError, match="max_seqlen_q: the varlen form on CUDA tensors needs"):
        A._check_max_seqlen("max_seqlen_q", None, True, True)


def test_check_indices_refused_during_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1 checks cu_seqlens .* CUDA-graph capture"):
        A._device_check_cu(cu, cu, 1, 1, 1, 1)


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernel under TRITON_INTERPRET=1 (small shapes: the interpreter is slow)

def _triton_varlen(q, k, v, cu_q, cu_k, causal, scale=None, block=16, block_table=None):
    """The kernel on varlen tensors; with block_table, k and v are page pools."""
    from fray_triton import prefill_attention as tp
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"))
    lens = (cu_q[1:] - cu_q[:-1]).tolist()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    paged = block_table is not None
    ks, vs = (t.stride()[:3] if paged else (0, t.stride(0), t.stride(1)) for t in (k, v))
    tp.prefill(q, k, v, out, lse, cu_q, cu_k, scale, causal=causal, batch=cu_q.shape[0] - 1,
               max_seqlen_q=max(lens + [0]), seqlen_k=0, q_strides=(0, q.stride(0), q.stride(1)),
               k_strides=ks, v_strides=vs, out_strides=(0, out.stride(0), out.stride(1)),
               lse_strides=(0, lse.stride(0)), block_table=block_table,
               bt_stride=block_table.stride(0) if paged else 0, page_size=k.shape[1] if paged else 1,
               block_m=block, block_n=block)
    return out, lse


@INTERPRET
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(2, 2, 64), (4, 1, 128)])
def test_triton_interpreter_vs_reference(causal, dtype, hq, hkv, d):
    # lengths 1, 17, 64 (whole 16-tiles), 65 (one past) and an empty sequence, q and k alike
    lens = [1, 17, 0, 64, 65]
    q, k, v, cu_q, cu_k = _varlen_case(dtype, lens, lens, hq, hkv, d, seed=d + hq)
    out, lse = _triton_varlen(q, k, v, cu_q, cu_k, causal)
    _check(out, lse, _expected(q, k, v, cu_q, cu_k, causal), dtype,
           "triton causal=%s group=%d D=%d" % (causal, hq // hkv, d))


@INTERPRET
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_triton_interpreter_chunked_prefill(dtype):
    # q shorter than k (queries are the last positions: chunked prefill against a cached prefix),
    # q longer than k (the first n_q - n_k queries see nothing), and an empty k
    lens_q, lens_k = [5, 16, 20, 3], [40, 17, 7, 0]
    q, k, v, cu_q, cu_k = _varlen_case(dtype, lens_q, lens_k, 4, 2, 64, seed=7)
    out, lse = _triton_varlen(q, k, v, cu_q, cu_k, True, scale=0.3)
    e = _expected(q, k, v, cu_q, cu_k, True, 0.3)
    assert np.isinf(e[1][:, 41:54]).all() and np.isinf(e[1][:, 61:]).all()  # the rows that see no key
    _check(out, lse, e, dtype, "chunked prefill %s" % dtype)


@INTERPRET
def test_triton_interpreter_batched_strided_and_default_blocks():
    from fray_triton import prefill_attention as tp
    g = torch.Generator().manual_seed(5)
    # q, k, v as slices of one packed qkv projection [B, S, Hq + 2 Hkv, D] (strided heads)
    qkv = torch.randn(2, 33, 4 + 2 + 2, 64, generator=g).to(torch.float16)
    q, k, v = qkv[:, :17, :4], qkv[:, :, 4:6], qkv[:, :, 6:]
    for causal, block in ((True, None), (False, 16)):
        out = torch.full(q.shape, float("nan"), dtype=q.dtype)
        lse = torch.full((2, 4, 17), float("nan"))
        tp.prefill(q, k, v, out, lse, None, None, 0.125, causal=causal, batch=2, max_seqlen_q=17, seqlen_k=33,
                   q_strides=q.stride()[:3], k_strides=k.stride()[:3], v_strides=v.stride()[:3],
                   out_strides=out.stride()[:3], lse_strides=lse.stride()[:2], block_m=block, block_n=block)
        _check(out.reshape(34, 4, 64), lse.transpose(0, 1).reshape(4, 34),
               tuple(x.reshape(34, 4, 64) if x.ndim == 4 else x.transpose(1, 0, 2).reshape(4, 34)
                     for x in _expected(q, k, v, causal=causal, scale=0.125)),
               torch.float16, "batched causal=%s block=%s" % (causal, block))


@INTERPRET
def test_triton_interpreter_clamps_bad_cu_seqlens():
    # Outside the trust boundary: offsets past the packed rows are clamped to them.
    q, k, v, cu_q, cu_k = _varlen_case(torch.float32, [9, 7], [9, 7], 2, 2, 64, seed=3)
    out, lse = _triton_varlen(q, k, v, torch.tensor([0, 9, 40], dtype=torch.int32),
                              torch.tensor([0, 9, 90], dtype=torch.int32), True)
    _check(out, lse, _expected(q, k, v, cu_q, cu_k, True), torch.float32, "clamped")


@INTERPRET
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page,block,hq,hkv", [
    (16, 16, 2, 2),   # one page per key tile
    (16, 32, 4, 1),   # a tile spans two pages (GQA 4)
    (64, 16, 2, 2),   # four tiles per page
    (1, 16, 4, 2),    # one token per page: every row of a tile its own page
])
def test_triton_interpreter_paged_vs_reference(causal, dtype, page, block, hq, hkv):
    # chunked (q shorter than k), equal lengths, an empty sequence; keys around the page sizes
    lens_q, lens_k = [1, 20, 0, 65, 33], [1, 63, 0, 65, 129]
    q, k, v, cu_q, cu_k, kp, vp, bt = _paged_case(dtype, lens_q, lens_k, hq, hkv, 64, page, seed=page + hq)
    out, lse = _triton_varlen(q, kp, vp, cu_q, cu_k, causal, block=block, block_table=bt)
    _check(out, lse, _expected(q, k, v, cu_q, cu_k, causal), dtype,
           "triton paged P%d block %d causal=%s group=%d" % (page, block, causal, hq // hkv))
    # the contiguous keys through the same kernel: the same products in the same order
    co, cl = _triton_varlen(q, k, v, cu_q, cu_k, causal, block=block)
    assert torch.equal(out, co) and torch.equal(lse, cl)


@INTERPRET
def test_triton_interpreter_paged_clamps_key_counts():
    # Outside the trust boundary: a key count past the table's capacity (2 pages of 16) is clamped
    # to it, and the table is never read past its row: the view's third column, the next entry in
    # memory, names a page far outside the pool.
    q, k, v, cu_q, cu_k, kp, vp, bt = _paged_case(torch.float32, [9, 7], [32, 20], 2, 2, 64, 16, seed=4)
    wide = torch.full((2, 3), 10 ** 6, dtype=torch.int32)
    wide[:, :2] = bt
    out, lse = _triton_varlen(q, kp, vp, cu_q, torch.tensor([0, 50, 70], dtype=torch.int32), True,
                              block_table=wide[:, :2])
    _check(out, lse, _expected(q, k, v, cu_q, cu_k, True), torch.float32, "clamped counts")


@INTERPRET
def test_ops_layer_paged_wiring_under_interpreter(monkeypatch):
    """The ops layer's paged plan (pool strides, the table, its own plan key, the empty table,
    FRAY_CHECK_INDICES through the plan, "cuda" resolved or forced) on CPU tensors through the
    interpreter, with the CUDA-only calls stubbed out."""
    monkeypatch.setattr(P, "PLANS", P.PlanCache())
    monkeypatch.setattr(A.B, "resolve", lambda *a: "triton")
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    q, k, v, cu_q, cu_k, kp, vp, bt = _paged_case(torch.bfloat16, [3, 20], [30, 20], 4, 2, 64, 16, seed=11)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((4, 23), float("nan"))
    A._prefill_impl(q, kp, vp, cu_q, cu_k, bt, out, lse, True, 20, 30, 0.125, "auto")
    _check(out, lse, _expected(q, k, v, cu_q, cu_k, True, 0.125), torch.bfloat16, "ops paged")
    A._prefill_impl(q, k, v, cu_q, cu_k, None, out, lse, True, 20, 30, 0.125, "auto")
    assert len(P.PLANS) == 2  # block_table is part of the key: the contiguous call has a plan of its own
    # a table of no blocks: nothing to see, zero rows and lse -inf, no launch
    A._prefill_impl(q, kp, vp, cu_q, torch.zeros_like(cu_k), bt[:, :0], out, lse, True, 20, 0, 0.125, "auto")
    assert (out == 0).all() and (lse == -math.inf).all()
    # FRAY_CHECK_INDICES=1: the used entries, checked from the plan with the sequence named
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    bad = bt.clone()
    bad[1, 1] = kp.shape[0]
    with pytest.raises(ValueError, match=r"block_table: entry \[1, 1\] = %d lies outside \[0, num_blocks=%d\) and "
                                         r"is used \(sequence 1 has 20 keys\)" % (kp.shape[0], kp.shape[0])):
        A._prefill_impl(q, kp, vp, cu_q, cu_k, bad, out, lse, True, 20, 30, 0.125, "auto")
    with pytest.raises(ValueError, match=r"cu_seqlens_k: sequence 0 has 33 keys, more than a block_table row holds"):
        A._prefill_impl(q, kp, vp, cu_q, torch.tensor([0, 33, 53], dtype=torch.int32), bt, out, lse, True, 20, 40,
                        0.125, "auto")
    monkeypatch.delenv("FRAY_CHECK_INDICES")
    # "cuda" resolved under "auto": the CUDA kernel's paged configuration and slots (the build and
    # the launch stubbed):
    # pool strides (page, token, head), the page size as the key rows, the table's row stride,
    # width and the pool's page count after the 22 contiguous-form ints; the table's pointer last
    built, launched = stub_jit(monkeypatch)
    monkeypatch.setattr(A.B, "resolve", lambda *a: "cuda")
    P.PLANS.clear()  # (the calls above left a Triton plan under this signature)
    A._prefill_impl(q, kp, vp, cu_q, cu_k, bt, out, lse, True, 20, 30, 0.125, "auto")
    assert built == [A.prefill_cuda_source(torch.bfloat16, 64, True, 16)]
    assert built[0][0] == "prefill_sm90_bf16_d64_n192_s2_ov_pp_page16_causal"
    assert "PrefillConfig<cutlass::bfloat16_t, 64, 192, 2, true, true, true, 16>" in built[0][1]
    (ptrs, ints, floats), = launched
    assert ptrs == (q.data_ptr(), kp.data_ptr(), vp.data_ptr(), out.data_ptr(), lse.data_ptr(), cu_q.data_ptr(),
                    cu_k.data_ptr(), bt.data_ptr())
    assert ints[:8] == (2, 4, 2, 23, 16, 20, 0, 0)
    assert ints[11:17] == kp.stride()[:3] + vp.stride()[:3]
    assert ints[22:] == (bt.stride(0), bt.shape[1], kp.shape[0]) and floats == (0.125,)
    # block size 1: a TMA box per key, refused when forced (Triton under "auto")
    q1, _, _, cu_q1, cu_k1, kp1, vp1, bt1 = _paged_case(torch.bfloat16, [3], [5], 4, 2, 64, 1)
    with pytest.raises(ValueError, match=r"backend='cuda' cannot run prefill_attention here: "
                                         r"paged K/V with block size 1 runs on Triton"):
        A._prefill_impl(q1, kp1, vp1, cu_q1, cu_k1, bt1, out[:3], lse[:, :3], True, 3, 5, 0.125, "cuda")


@INTERPRET
def test_check_cases_prefill_rows_under_interpreter():
    """`fray check`'s CPU rows for prefill_attention, the paged one among them, pass."""
    rows = [c for c in A.check_cases(torch.device("cpu")) if c[0] == "prefill_attention"]
    assert sum("paged" in c[3] for c in rows) == 2
    for row in rows:
        row[4]()


def test_custom_op_takes_the_block_table():
    """torch.compile traces the public function into fray::prefill_attention: its schema carries
    the optional block table (the fake returns nothing, as the op writes out / lse in place)."""
    schema = str(torch.ops.fray.prefill_attention.default._schema)
    assert "Tensor? block_table" in schema and schema.index("cu_seqlens_k") < schema.index("block_table")


@INTERPRET
def test_ops_layer_wiring_under_interpreter(monkeypatch):
    """The ops layer's GPU implementation (plans, strides of both forms, lse layouts, the empty
    cases) driven on CPU tensors through the interpreter, with the CUDA-only calls stubbed out."""
    monkeypatch.setattr(P, "PLANS", P.PlanCache())
    resolve = A.B.resolve
    monkeypatch.setattr(A.B, "resolve", lambda *a: "triton")
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    q, k, v, cu_q, cu_k = _varlen_case(torch.bfloat16, [3, 20], [30, 20], 4, 2, 64, seed=11)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((4, 23), float("nan"))
    A._prefill_impl(q, k, v, cu_q, cu_k, None, out, lse, True, 20, 30, 0.125, "auto")
    _check(out, lse, _expected(q, k, v, cu_q, cu_k, True, 0.125), torch.bfloat16, "ops varlen")
    assert len(P.PLANS) == 1
    A._prefill_impl(q, k, v, cu_q, cu_k, None, out, lse, True, 20, 30, 0.125, "auto")  # the cached plan
    assert len(P.PLANS) == 1
    # batched: lse [B, Hq, Sq]
    qb, kb, vb = q[3:].reshape(1, 20, 4, 64), k[30:].reshape(1, 20, 2, 64), v[30:].reshape(1, 20, 2, 64)
    ob = torch.full_like(qb, float("nan"))
    lb = torch.full((1, 4, 20), float("nan"))
    A._prefill_impl(qb, kb, vb, None, None, None, ob, lb, False, 20, 20, 0.125, "auto")
    e, el, mag = _expected(qb, kb, vb, causal=False, scale=0.125)
    _check(ob[0], lb[0], (e[0], el[0], mag[0]), torch.bfloat16, "ops batched")
    # no keys at all: zero rows, lse -inf, no launch
    ob.fill_(float("nan"))
    A._prefill_impl(qb, kb[:, :0], vb[:, :0], None, None, None, ob, lb, True, 20, 0, 0.125, "auto")
    assert (ob == 0).all() and (lb == -math.inf).all()
    # "cuda" resolved under "auto" for tensors the kernel cannot load (a head stride of 68 elements,
    # not a multiple of 16 bytes): Triton runs
    monkeypatch.setattr(A.B, "resolve", lambda *a: "cuda")
    wide = torch.zeros(q.shape[0], 4, 68, dtype=q.dtype)[:, :, :64]
    wide.copy_(q)
    out.fill_(float("nan"))
    A._prefill_impl(wide, k, v, cu_q, cu_k, None, out, lse, False, 20, 30, 0.125, "auto")
    _check(out, lse, _expected(q, k, v, cu_q, cu_k, False, 0.125), torch.bfloat16, "ops cuda -> triton")
    # FRAY_BACKEND=cuda forces the JIT kernel where it cannot run (CPU tensors): refused with the reason,
    # the gemm family's (nvcc, CUTLASS, sm_90a, the device)
    monkeypatch.setattr(A.B, "resolve", resolve)
    monkeypatch.setenv("FRAY_BACKEND", "cuda")
    with pytest.raises(RuntimeError, match="backend='cuda' cannot run prefill_attention: tensors are on cpu"):
        A._prefill_impl(q, k, v, cu_q, cu_k, None, out, lse, True, 20, 30, 0.125, "auto")


def test_cuda_layout_reasons():
    """What sends a call from the CUDA kernel to Triton under "auto" (and is refused when forced):
    fp32, strides TMA cannot take (not multiples of 16 bytes), odd output strides; dims of size 1
    have free strides."""
    q, k, v, _, _ = _varlen_case(torch.bfloat16, [8], [8], 4, 2, 64)
    out = torch.empty_like(q)
    assert A._prefill_cuda_layout_reason(q, k, v, out) is None
    assert "bf16 and fp16 (got fp32" in A._prefill_cuda_layout_reason(q.float(), k.float(), v.float(), out.float())
    wide = torch.zeros(8, 4, 68, dtype=torch.bfloat16)[:, :, :64]  # head stride 68: not a multiple of 8
    assert A._prefill_cuda_layout_reason(wide, k, v, out).startswith("q: the CUDA kernel loads by TMA")
    kv = torch.zeros(8, 2, 2, 64, dtype=torch.bfloat16)
    assert A._prefill_cuda_layout_reason(q, kv[:, 0], kv[:, 1], out) is None  # token stride 256: fine
    odd = torch.zeros(8, 4, 65, dtype=torch.bfloat16)[:, :, :64]
    assert A._prefill_cuda_layout_reason(q, k, v, odd).startswith("out: the CUDA kernel stores element pairs")
    one = torch.zeros(1, 4, 72, dtype=torch.bfloat16)[:1, :, :64]  # one token: its stride is free
    assert A._prefill_cuda_layout_reason(one, k[:1], v[:1], torch.empty_like(one)) is None
    kp = torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16)  # paged K/V: block sizes 16 to 128 (TMA boxes)
    bt = torch.zeros(1, 4, dtype=torch.int32)
    assert A._prefill_cuda_layout_reason(q, kp, kp, out, bt) is None
    kp1 = torch.zeros(64, 1, 2, 64, dtype=torch.bfloat16)
    assert A._prefill_cuda_layout_reason(q, kp1, kp1, out, bt).startswith("paged K/V with block size 1 runs on Triton")
    wide_pages = torch.zeros(4, 16, 2, 68, dtype=torch.bfloat16)[..., :64]  # the pool's strides, checked as k's
    assert A._prefill_cuda_layout_reason(q, wide_pages, kp, out, bt).startswith("k: the CUDA kernel loads by TMA")


def test_cuda_kernel_compiles_for_sm90a(tmp_path, monkeypatch):
    """The CUDA kernel (cuda/attention/prefill_sm90.cuh) through fray.jit for sm_90a without a GPU,
    loaded by the dynamic linker: the contract's exports are there and describe() names the
    configuration (bf16, D 128, causal; and a paged one: fp16, D 256, 16-key pages; the other
    configurations compile in the GPU tests)."""
    import ctypes
    from fray import jit
    monkeypatch.setenv("FRAY_CACHE_DIR", str(tmp_path / "cache"))
    lib = ctypes.CDLL(str(jit.compile_only(*A.prefill_cuda_source(torch.bfloat16, 128, True))))
    for sym in ("fray_jit_launch", "fray_jit_workspace_bytes", "fray_jit_describe"):
        assert hasattr(lib, sym), sym
    lib.fray_jit_describe.restype = ctypes.c_char_p
    assert lib.fray_jit_describe().decode() == "prefill_sm90 bf16 D128 tile 128x128 stages 2 causal overlap pingpong"
    # the paged configuration: 16-key pages into 64-key tiles (4 TMA boxes a tile), fp16, D 256
    lib = ctypes.CDLL(str(jit.compile_only(*A.prefill_cuda_source(torch.float16, 256, False, 16))))
    lib.fray_jit_describe.restype = ctypes.c_char_p
    assert lib.fray_jit_describe().decode() == ("prefill_sm90 fp16 D256 tile 128x64 stages 2 full overlap pingpong "
                                                "paged 16")
    # the persistent grid (PREFILL_CUDA_PERSISTENT), paged and not
    for page, tail in ((0, ""), (64, " paged 64")):
        lib = ctypes.CDLL(str(jit.compile_only(*A.prefill_cuda_source(torch.bfloat16, 128, True, page, persistent=True))))
        lib.fray_jit_describe.restype = ctypes.c_char_p
        assert lib.fray_jit_describe().decode() == ("prefill_sm90 bf16 D128 tile 128x128 stages 2 causal overlap "
                                                    "pingpong%s persistent" % tail)


_BOX_CHECK = r"""
#include <cstdio>
#include <vector>
#include "cuda/attention/prefill_sm90.cuh"
using namespace cute;
// Every TMA box of a paged stage must be a sub-block of the K / V tile: box i's element (r, c) at
// the tile's (i * BoxN + r, c), the swizzle applied to the absolute offset (box bases are whole
// 1024-byte periods).
template <class C> int check() {
  constexpr int D = C::kHeadDim, BN = C::kBlockN, BX = C::kBoxN;
  auto full_k = take<0, 2>(typename C::SmemK{});
  auto full_v = take<0, 2>(typename C::SmemV{});
  auto sw = get_swizzle_portion(full_k);
  auto box_k = get_nonswizzle_portion(typename C::SmemKBox{});
  auto box_v = get_nonswizzle_portion(typename C::SmemVBox{});
  int bad = 0;
  for (int i = 0; i < BN / BX; ++i)
    for (int r = 0; r < BX; ++r)
      for (int c = 0; c < D; ++c) {
        const int base = i * BX * 64;
        bad += full_k(i * BX + r, c) != sw(base + box_k(r, c));
        bad += full_v(c, i * BX + r) != sw(base + box_v(c, r));
      }
  return bad;
}
template <int D, int BN, int S, bool P, int Page> int one() {
  return check<fray::attention::PrefillConfig<cutlass::bfloat16_t, D, BN, S, true, true, P, Page>>();
}
// The kernel's mask (one bound per row on each element's column offset, mask_bound) against its
// definition, key >= seqlen_k or (causal) key > row + diag, for every consumer thread's elements of
// S, over query tiles, key tiles, sequence ends and diagonals around the tile's edges.
template <bool Causal, int BN> int check_mask() {
  using C = fray::attention::PrefillConfig<cutlass::bfloat16_t, 128, BN, 2, Causal>;
  typename C::MmaQK mma;
  int bad = 0;
  for (int t = 0; t < 128 * C::kConsumers; ++t) {
    Tensor tc = mma.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<C::kBlockM>, Int<BN>>{}));
    Tensor c = make_tensor(tc.data(), fray::attention::rows_cols(tc.layout()));
    const int col0 = get<1>(c(0, 0));
    for (int m_block : {0, 1, 3})
      for (int n : {0, 1, 2})
        for (int end : {1, 7, BN - 1, BN, BN + 1, 2 * BN + 5, 10 * BN})
          for (int diag : {-300, -130, -64, -1, 0, 1, 63, 129, 500}) {
            const int key0 = n * BN;
            for (int i = 0; i < size<0>(c); ++i) {
              const int row = m_block * C::kBlockM + get<0>(c(i, 0));
              const int limit = fray::attention::detail::mask_bound(Causal, row, key0, col0, end, diag);
              for (int j = 0; j < size<1>(c); ++j) {
                const int key = key0 + get<1>(c(i, j));
                const int r = m_block * C::kBlockM + get<0>(c(i, j));
                const bool want = key >= end || (Causal && key > r + diag);
                bad += (get<1>(c(i, j)) - col0 >= limit) != want;
              }
            }
          }
  }
  return bad;
}
// The persistent grid's order visits every (query tile, head, sequence) once: query tiles
// fastest, the last first, then heads, then sequences.
int check_order() {
  int bad = 0;
  for (int m_blocks : {1, 3, 64})
    for (int hq : {1, 5, 32})
      for (int batch : {1, 2, 7}) {
        std::vector<int> seen(m_blocks * hq * batch, 0);
        for (int t = 0; t < m_blocks * hq * batch; ++t) {
          const fray::attention::detail::Tile x = fray::attention::detail::persistent_tile(t, m_blocks, hq, batch);
          bad += x.m_block < 0 || x.m_block >= m_blocks || x.h < 0 || x.h >= hq || x.b < 0 || x.b >= batch;
          if (t % m_blocks == 0) bad += x.m_block != m_blocks - 1;  // a (sequence, head) starts at its last
          if (t % m_blocks != 0) {  // then walks down its own query tiles
            const fray::attention::detail::Tile y =
                fray::attention::detail::persistent_tile(t - 1, m_blocks, hq, batch);
            bad += x.m_block != y.m_block - 1 || x.h != y.h || x.b != y.b;
          }
          if (t >= m_blocks * hq) bad += x.b < 1;  // heads before sequences
          if (!bad) ++seen[(x.m_block * batch + x.b) * hq + x.h];
        }
        for (int c : seen) bad += c != 1;
      }
  return bad;
}
int main() {
  int bad = check_order();
  bad += one<64, 128, 3, true, 16>() + one<64, 128, 3, true, 32>() + one<64, 128, 3, true, 64>() +
            one<64, 128, 3, true, 128>() + one<128, 128, 2, false, 16>() + one<128, 128, 2, false, 32>() +
            one<128, 128, 2, false, 64>() + one<128, 128, 2, false, 128>() + one<256, 64, 2, true, 16>() +
            one<256, 64, 2, true, 32>() + one<256, 64, 2, true, 64>() + one<256, 64, 2, true, 128>();
  bad += check_mask<true, 128>() + check_mask<false, 128>() + check_mask<true, 64>() + check_mask<true, 176>();
  printf("mismatches %d\n", bad);
  return bad != 0;
}
"""


def test_cuda_kernel_index_math_on_the_host(tmp_path):
    """The CUDA kernel's index math, run on the host by a program nvcc builds against the CUTLASS
    headers the JIT uses: the paged kernel's TMA box layouts (PrefillConfig::SmemKBox / SmemVBox)
    address exactly the tile's elements, swizzle included, at every shipped head dim and page
    size; the mask (mask_bound) equals its definition for every consumer thread's elements; the
    persistent grid's tile order (persistent_tile) visits every tile once, a (sequence, head)'s
    query tiles side by side, the last first."""
    run_host_check(_BOX_CHECK, tmp_path)


# ---------------------------------------------------------------------------------------------
# GPU

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BACKENDS = ["cuda", "triton"]
LENS_Q = [1, 0, 17, 64, 65, 333, 1025]
LENS_K = [1, 0, 17, 64, 65, 333, 1025]


def _gpu_varlen(cuda, dtype, lens_q, lens_k, hq, hkv, d, seed, causal=True, **kw):
    q, k, v, cu_q, cu_k = _varlen_case(dtype, lens_q, lens_k, hq, hkv, d, seed, cuda)
    y, lse = fray.prefill_attention(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                    max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), return_lse=True, **kw)
    return (q, k, v, cu_q, cu_k), y, lse


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (32, 8), (12, 1)])
def test_gpu_vs_reference(cuda, backend, causal, dtype, d, hq, hkv):
    if backend == "cuda" and dtype == torch.float32:
        with pytest.raises(ValueError, match="the CUDA prefill kernel takes bf16 and fp16"):
            _gpu_varlen(cuda, dtype, [3], [3], hq, hkv, d, 0, causal, backend=backend)
        return
    (q, k, v, cu_q, cu_k), y, lse = _gpu_varlen(cuda, dtype, LENS_Q, LENS_K, hq, hkv, d, d + hq, causal,
                                                backend=backend)
    torch.cuda.synchronize()
    _check(y, lse, _expected(q, k, v, cu_q, cu_k, causal), dtype,
           "gpu %s causal=%s %s D=%d Hq=%d Hkv=%d" % (backend, causal, dtype, d, hq, hkv))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_cuda_long_sequences_and_garbage_past_the_keys(cuda, causal, d):
    """The CUDA kernel over many key tiles (lengths 4097 and 1000, GQA 8), with NaN in the K / V
    rows past the last sequence (a buffer's uninitialised tail, which TMA reads into the last key
    tile) and in the query padding rows: nothing of them reaches the written rows."""
    lens_q, lens_k = [1000, 4097, 63], [4097, 1000, 129]
    q, k, v, cu_q, cu_k = _varlen_case(torch.bfloat16, lens_q, lens_k, 16, 2, d, 5, cuda)
    pad = 77
    k = torch.cat([k, torch.full((pad,) + k.shape[1:], float("nan"), dtype=k.dtype, device=cuda)])
    v = torch.cat([v, torch.full((pad,) + v.shape[1:], float("nan"), dtype=v.dtype, device=cuda)])
    q = torch.cat([q, torch.full((pad,) + q.shape[1:], float("nan"), dtype=q.dtype, device=cuda)])
    out = torch.full_like(q, 7.0)
    y, lse = fray.prefill_attention(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=4097,
                                    max_seqlen_k=4097, return_lse=True, out=out, backend="cuda")
    rows = sum(lens_q)
    assert (y[rows:] == 7.0).all(), "padding rows written"
    _check(y, lse, _expected(q[:rows], k[:sum(lens_k)], v[:sum(lens_k)], cu_q, cu_k, causal), torch.bfloat16,
           "long D=%d causal=%s" % (d, causal), rows=rows)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("d,dtype,page", [(128, torch.bfloat16, 0), (64, torch.float16, 0), (256, torch.bfloat16, 0),
                                          (128, torch.float16, 64)])
def test_gpu_cuda_persistent_grid(cuda, monkeypatch, causal, d, dtype, page):
    """The persistent grid (PREFILL_CUDA_PERSISTENT): one CTA per SM walking ~9 tiles each, so Q
    is reloaded under bar_q_empty, the rings' phases carry over from tile to tile and the
    ping-pong turns restart per tile; sequences without queries or keys and the query tiles past a
    sequence's end are skipped; against the reference, varlen (contiguous or paged K / V) and
    batched."""
    monkeypatch.setattr(A, "PREFILL_CUDA_PERSISTENT", True)
    monkeypatch.setattr(P, "PLANS", P.PlanCache())
    built = []
    real = A.prefill_cuda_source
    monkeypatch.setattr(A, "prefill_cuda_source", lambda *a, **kw: built.append(real(*a, **kw)[0]) or real(*a, **kw))
    lens_q, lens_k = [1000, 0, 1500, 63, 1, 700], [1000, 5, 1500, 129, 300, 0]
    what = "persistent D%d %s causal=%s page %d" % (d, dtype, causal, page)
    if page:
        (q, k, v, cu_q, cu_k, _, _, _), y, lse = _gpu_paged(cuda, dtype, lens_q, lens_k, 16, 4, d, page, 11,
                                                            causal=causal, backend="cuda")
    else:
        (q, k, v, cu_q, cu_k), y, lse = _gpu_varlen(cuda, dtype, lens_q, lens_k, 16, 4, d, 11, causal, backend="cuda")
    torch.cuda.synchronize()
    _check(y, lse, _expected(q, k, v, cu_q, cu_k, causal), dtype, what)
    if not page:  # the batched form: 2 x 16 heads x 6 query tiles
        g = torch.Generator(device=cuda).manual_seed(d)
        qb, kb, vb = (torch.randn(2, 700, h, d, device=cuda, generator=g).to(dtype) for h in (16, 4, 4))
        yb, lseb = fray.prefill_attention(qb, kb, vb, causal=causal, return_lse=True, backend="cuda")
        torch.cuda.synchronize()
        _check(yb, lseb, _expected(qb, kb, vb, causal=causal), dtype, what + " batched")
    assert built and all("_pers" in name for name in built), built


@pytest.mark.gpu
def test_gpu_auto_falls_back_to_triton_where_cuda_cannot(cuda):
    """fp32, and 16-byte-misaligned data pointers, run on Triton under "auto"; forcing "cuda" on
    misaligned pointers raises naming them."""
    q, k, v, cu_q, cu_k = _varlen_case(torch.float32, [40, 9], [50, 9], 4, 2, 64, 3, cuda)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=40, max_seqlen_k=50, return_lse=True)
    y, lse = fray.prefill_attention(q, k, v, **kw)
    _check(y, lse, _expected(q, k, v, cu_q, cu_k), torch.float32, "auto fp32")
    buf = torch.randn(49 * 4 * 64 + 4, device=cuda).to(torch.bfloat16)
    qm = buf[4:].view(49, 4, 64)  # 8 bytes past a 16-byte boundary
    kb, vb = k.to(torch.bfloat16), v.to(torch.bfloat16)
    y, lse = fray.prefill_attention(qm, kb, vb, **kw)
    _check(y, lse, _expected(qm, kb, vb, cu_q, cu_k), torch.bfloat16, "auto misaligned")
    with pytest.raises(ValueError, match="backend='cuda' loads q, k and v by TMA"):
        fray.prefill_attention(qm, kb, vb, backend="cuda", **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lens_q,lens_k", [
    ([16, 1, 300, 128], [4096, 100, 300, 129]),   # chunked prefill: the queries are the last positions
    ([300, 64, 2], [100, 0, 1]),                  # more queries than keys: leading rows see nothing
])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_chunked_prefill(cuda, dtype, lens_q, lens_k, backend):
    (q, k, v, cu_q, cu_k), y, lse = _gpu_varlen(cuda, dtype, lens_q, lens_k, 16, 4, 128, 3, scale=0.07,
                                                backend=backend)
    _check(y, lse, _expected(q, k, v, cu_q, cu_k, True, 0.07), dtype, "chunked %s %s" % (backend, lens_q))


def _sdpa_f64(q, k, v, causal):
    """SDPA in float64 (its math backend) on [B, S, H, D] inputs: an independent reference."""
    import torch.nn.functional as F
    args = [t.double().transpose(1, 2) for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*args, is_causal=causal, enable_gqa=True)
    mag = F.scaled_dot_product_attention(args[0], args[1], args[2].abs(), is_causal=causal, enable_gqa=True)
    return o.transpose(1, 2), mag.transpose(1, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_batched_vs_sdpa(cuda, causal, dtype, backend):
    """The benchmark's shape family at S = 2048: against SDPA in float64 (Sq = Sk, so SDPA's
    top-left causal mask is the bottom-right one), and the SDPA a user would call (flash) within
    the dtype's tolerance of the same reference."""
    import torch.nn.functional as F
    g = torch.Generator(device=cuda).manual_seed(4)
    q = torch.randn(2, 2048, 32, 128, device=cuda, generator=g).to(dtype)
    k = torch.randn(2, 2048, 8, 128, device=cuda, generator=g).to(dtype)
    v = torch.randn(2, 2048, 8, 128, device=cuda, generator=g).to(dtype)
    y = fray.prefill_attention(q, k, v, causal=causal, backend=backend)
    e, mag = _sdpa_f64(q, k, v, causal)
    assert_close(y, e, dtype, "batched causal=%s" % causal, scale=mag)
    peer = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                          enable_gqa=True).transpose(1, 2)
    # both within the bound of the reference: within twice that bound of each other
    assert_close(y.double(), peer.double(), dtype, "fray vs SDPA", scale=2 * torch.maximum(mag, e.abs()))
    # the seed's name: batched, causal
    if causal and backend == "triton":
        assert torch.equal(fray.triton.attention_prefill(q, k, v), y)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_strided_qkv_and_out(cuda, backend):
    g = torch.Generator(device=cuda).manual_seed(8)
    lens = [100, 1, 517]
    qkv = torch.randn(618, 16 + 4 + 4, 128, device=cuda, generator=g).to(torch.bfloat16)
    q, k, v = qkv[:, :16], qkv[:, 16:20], qkv[:, 20:]
    cu = _cu(lens, cuda)
    out = torch.full((618, 20, 128), float("nan"), device=cuda, dtype=torch.bfloat16)[:, 2:18]
    y, lse = fray.prefill_attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=517, max_seqlen_k=517,
                                    out=out, return_lse=True, backend=backend)
    assert y is out
    _check(y, lse, _expected(q, k, v, cu, cu), torch.bfloat16, "strided")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_torch_compile_fullgraph(cuda, backend):
    q, k, v, cu_q, cu_k = _varlen_case(torch.float16, [70, 0, 130], [200, 5, 130], 8, 2, 64, 11, cuda)

    def f(q, k, v, cu_q, cu_k):
        y, lse = fray.prefill_attention(q * 2.0, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=130,
                                        max_seqlen_k=200, return_lse=True, backend=backend)
        return y + 1.0, lse

    y, lse = torch.compile(f, fullgraph=True)(q, k, v, cu_q, cu_k)
    e = _expected(q * 2.0, k, v, cu_q, cu_k)
    _check(y - 1.0, lse, (e[0], e[1], e[2] + 1.0), torch.float16, "compiled")
    ey, lse_eager = f(q, k, v, cu_q, cu_k)
    assert torch.equal(y, ey) and torch.equal(lse, lse_eager)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_cuda_graph_capture_with_new_cu_seqlens(cuda, backend):
    """One capture, replays with new lengths in the same buffers: max_seqlen bounds them all."""
    total = 600
    q, k, v, _, _ = _varlen_case(torch.bfloat16, [total], [total], 16, 4, 128, 9, cuda)
    out = torch.empty_like(q)
    cu_q = _cu([200, 200, 200], cuda)
    cu_k = cu_q.clone()
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=total, max_seqlen_k=total, out=out, backend=backend)
    fray.prefill_attention(q, k, v, return_lse=True, **kw)  # warm-up (Triton compiles, the plan is built)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = fray.prefill_attention(q, k, v, return_lse=True, **kw)
    for new_q, new_k in (([0, 600, 600, 600], [0, 600, 600, 600]), ([0, 1, 65, 300], [0, 50, 65, 600]),
                         ([0, 0, 0, 129], [0, 0, 17, 17])):
        cu_q.copy_(torch.tensor(new_q))
        cu_k.copy_(torch.tensor(new_k))
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, lse, _expected(q, k, v, cu_q, cu_k), torch.bfloat16, "graph replay %s / %s" % (new_q, new_k),
               rows=new_q[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_non_default_stream(cuda, backend):
    q, k, v, cu_q, cu_k = _varlen_case(torch.bfloat16, [300, 900], [300, 1000], 8, 2, 128, 12, cuda)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y, lse = fray.prefill_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=900,
                                        max_seqlen_k=1000, return_lse=True, backend=backend)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    _check(y, lse, _expected(q, k, v, cu_q, cu_k), torch.bfloat16, "side stream")


@pytest.mark.gpu
def test_gpu_check_indices_and_contract(cuda, monkeypatch):
    q, k, v, cu_q, cu_k = _varlen_case(torch.float16, [10, 20], [10, 20], 4, 2, 64, 1, cuda)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=20, max_seqlen_k=20)
    with pytest.raises(ValueError, match="max_seqlen_q: the varlen form on CUDA tensors needs"):
        fray.prefill_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match="the CUDA prefill kernel takes bf16 and fp16"):
        fray.prefill_attention(q.float(), k.float(), v.float(), backend="cuda", **kw)
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match="cu_seqlens_q: sequence 1 has 20 tokens, more than max_seqlen_q=19"):
        fray.prefill_attention(q, k, v, **dict(kw, max_seqlen_q=19))
    fray.prefill_attention(q, k, v, **kw)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1"):
        with torch.cuda.graph(graph):
            fray.prefill_attention(q, k, v, **kw)


@pytest.mark.gpu
def test_gpu_plan_cache_and_empty(cuda):
    q, k, v, cu_q, cu_k = _varlen_case(torch.bfloat16, [5, 7], [5, 7], 4, 4, 64, 2, cuda)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7, max_seqlen_k=7)
    y = fray.prefill_attention(q, k, v, **kw)
    n = len(P.PLANS)
    assert torch.equal(fray.prefill_attention(q, k, v, **kw), y) and len(P.PLANS) == n
    empty = fray.prefill_attention(q[:0], k[:0], v[:0], cu_seqlens_q=cu_q[:1], cu_seqlens_k=cu_k[:1], max_seqlen_q=0,
                                   max_seqlen_k=0)
    assert empty.shape == (0, 4, 64)


# paged K/V: lengths around the 16- and 64-token pages, an empty sequence, long prefixes; the
# queries the last positions of the keys (chunked prefill) or all of them
GPU_PAGED_LENS_K = [1, 63, 64, 65, 127, 129, 0, 1500, 4100]
GPU_PAGED_LENS_Q = [1, 20, 64, 1, 127, 100, 0, 700, 333]


def _gpu_paged(cuda, dtype, lens_q, lens_k, hq, hkv, d, page, seed, causal=True, **kw):
    case = _paged_case(dtype, lens_q, lens_k, hq, hkv, d, page, seed, cuda)
    q, k, v, cu_q, cu_k, kp, vp, bt = case
    y, lse = fray.prefill_attention(q, kp, vp, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=bt,
                                    max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), return_lse=True, **kw)
    return case, y, lse


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "triton", "cuda"])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (32, 8), (16, 2)])  # GQA groups 1, 4, 8
def test_gpu_paged_vs_reference(cuda, backend, page, dtype, d, hq, hkv):
    (q, k, v, cu_q, cu_k, _, _, _), y, lse = _gpu_paged(cuda, dtype, GPU_PAGED_LENS_Q, GPU_PAGED_LENS_K, hq, hkv, d,
                                                        page, d + hq + page, backend=backend)
    torch.cuda.synchronize()
    _check(y, lse, _expected(q, k, v, cu_q, cu_k), dtype,
           "gpu paged %s P%d %s D=%d Hq=%d Hkv=%d" % (backend, page, dtype, d, hq, hkv))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page", [1, 32, 128])
def test_gpu_paged_non_causal_and_other_page_sizes(cuda, dtype, page):
    (q, k, v, cu_q, cu_k, _, _, _), y, lse = _gpu_paged(cuda, dtype, GPU_PAGED_LENS_Q, GPU_PAGED_LENS_K, 16, 4, 128,
                                                        page, 7 + page, causal=False, scale=0.07)
    torch.cuda.synchronize()
    _check(y, lse, _expected(q, k, v, cu_q, cu_k, False, 0.07), dtype, "gpu paged non-causal P%d %s" % (page, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page,d", [(32, 128), (128, 128), (16, 256), (128, 256), (32, 64)])
def test_gpu_cuda_paged_non_causal_and_page_sizes(cuda, dtype, page, d):
    """The CUDA kernel's paged path at the page sizes the 16 / 64 cases leave out: a page shorter
    than the key tile (several boxes a tile), one as long (one box) and longer (a page spans
    several tiles: D 256 tiles are 64 keys), non-causal."""
    (q, k, v, cu_q, cu_k, _, _, _), y, lse = _gpu_paged(cuda, dtype, GPU_PAGED_LENS_Q, GPU_PAGED_LENS_K, 16, 4, d,
                                                        page, 3 + page + d, causal=False, scale=0.07, backend="cuda")
    torch.cuda.synchronize()
    _check(y, lse, _expected(q, k, v, cu_q, cu_k, False, 0.07), dtype, "gpu cuda paged non-causal P%d D%d %s"
           % (page, d, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "triton", "cuda"])
def test_gpu_paged_cuda_graph_replay_with_new_lengths_and_tables(cuda, backend):
    """One capture over fixed buffers (q rows, the pools, the table, cu_seqlens); replays with new
    lengths, new keys and a new shuffled table written into them: max_seqlen_q and max_seqlen_k
    (the table's capacity) bound them all. Pool rows and table columns no sequence uses hold NaN
    and -1."""
    page, max_blocks, hq, hkv, d = 16, 40, 16, 4, 128
    q = torch.zeros(600, hq, d, dtype=torch.bfloat16, device=cuda)
    kp = torch.zeros(3 * max_blocks + 3, page, hkv, d, dtype=torch.bfloat16, device=cuda)
    vp = torch.zeros_like(kp)
    bt = torch.zeros(3, max_blocks, dtype=torch.int32, device=cuda)
    cu_q = torch.zeros(4, dtype=torch.int32, device=cuda)
    cu_k = torch.zeros_like(cu_q)
    out = torch.empty_like(q)

    def load(lens_q, lens_k, seed):
        nq, k, v, cq, ck, nkp, nvp, nbt = _paged_case(torch.bfloat16, lens_q, lens_k, hq, hkv, d, page, seed, cuda)
        q.fill_(float("nan"))  # the padding rows past cu_seqlens_q[B]: never computed
        q[:sum(lens_q)] = nq
        kp.fill_(float("nan"))
        vp.fill_(float("nan"))
        kp[:nkp.shape[0]], vp[:nvp.shape[0]] = nkp, nvp
        bt.fill_(-1)
        bt[:, :nbt.shape[1]] = nbt
        cu_q.copy_(cq)
        cu_k.copy_(ck)
        return nq, k, v, cq, ck

    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=bt, max_seqlen_q=600, max_seqlen_k=max_blocks * page,
              out=out, backend=backend)
    load([200, 200, 200], [200, 200, 200], 0)
    fray.prefill_attention(q, kp, vp, return_lse=True, **kw)  # warm-up (Triton compiles, the plan is built)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = fray.prefill_attention(q, kp, vp, return_lse=True, **kw)
    for i, (lens_q, lens_k) in enumerate((([200, 200, 200], [200, 200, 200]), ([1, 65, 300], [50, 65, 640]),
                                          ([0, 0, 129], [0, 17, 129]), ([600, 0, 0], [640, 0, 0]))):
        nq, k, v, cq, ck = load(lens_q, lens_k, i + 1)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, lse, _expected(nq, k, v, cq, ck), torch.bfloat16, "paged graph replay %s / %s" % (lens_q, lens_k),
               rows=sum(lens_q))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "triton", "cuda"])
def test_gpu_paged_torch_compile_fullgraph(cuda, backend):
    q, k, v, cu_q, cu_k, kp, vp, bt = _paged_case(torch.float16, [70, 0, 130], [200, 5, 130], 8, 2, 64, 16, 11, cuda)

    def f(q, kp, vp, cu_q, cu_k, bt):
        y, lse = fray.prefill_attention(q * 2.0, kp, vp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=bt,
                                        max_seqlen_q=130, max_seqlen_k=200, return_lse=True, backend=backend)
        return y + 1.0, lse

    y, lse = torch.compile(f, fullgraph=True)(q, kp, vp, cu_q, cu_k, bt)
    e = _expected(q * 2.0, k, v, cu_q, cu_k)
    _check(y - 1.0, lse, (e[0], e[1], e[2] + 1.0), torch.float16, "compiled paged")
    ey, lse_eager = f(q, kp, vp, cu_q, cu_k, bt)
    assert torch.equal(y, ey) and torch.equal(lse, lse_eager)


@pytest.mark.gpu
def test_gpu_paged_contract(cuda, monkeypatch):
    """Forced CUDA refused at block size 1 (one TMA box per key), the capacity bound, the plan
    cache, FRAY_CHECK_INDICES over the used table entries, and its refusal while capturing."""
    q1, _, _, cu_q1, cu_k1, kp1, vp1, bt1 = _paged_case(torch.float16, [3], [5], 4, 2, 64, 1, 1, cuda)
    with pytest.raises(ValueError, match=r"backend='cuda' cannot run prefill_attention here: "
                                         r"paged K/V with block size 1 runs on Triton"):
        fray.prefill_attention(q1, kp1, vp1, cu_seqlens_q=cu_q1, cu_seqlens_k=cu_k1, block_table=bt1, max_seqlen_q=3,
                               max_seqlen_k=5, backend="cuda")
    q, k, v, cu_q, cu_k, kp, vp, bt = _paged_case(torch.float16, [10, 20], [30, 20], 4, 2, 64, 16, 1, cuda)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=bt, max_seqlen_q=20, max_seqlen_k=30)
    with pytest.raises(ValueError, match=r"max_seqlen_k: 33 is more keys than a block_table row holds"):
        fray.prefill_attention(q, kp, vp, **dict(kw, max_seqlen_k=33))
    with pytest.raises(ValueError, match="max_seqlen_k: the varlen form on CUDA tensors needs"):
        fray.prefill_attention(q, kp, vp, **dict(kw, max_seqlen_k=None))
    y = fray.prefill_attention(q, kp, vp, **kw)
    n = len(P.PLANS)
    assert torch.equal(fray.prefill_attention(q, kp, vp, **kw), y) and len(P.PLANS) == n
    _check(y, fray.prefill_attention(q, kp, vp, return_lse=True, **kw)[1], _expected(q, k, v, cu_q, cu_k),
           torch.float16, "paged contract")
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    bad = bt.clone()
    bad[0, 1] = kp.shape[0]
    with pytest.raises(ValueError, match=r"block_table: entry \[0, 1\] = %d lies outside .* \(sequence 0 has 30 "
                                         r"keys\)" % kp.shape[0]):
        fray.prefill_attention(q, kp, vp, **dict(kw, block_table=bad))
    fray.prefill_attention(q, kp, vp, **kw)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1 checks cu_seqlens / block_table"):
        with torch.cuda.graph(graph):
            fray.prefill_attention(q, kp, vp, **kw)


def test_kernel_compiles_for_sm90a_without_spills():
    """The prefill kernel through Triton's compiled path for sm_90a at the GPU's block sizes
    (blocks_for), 16-bit inputs on wgmma, aligned tensors as a launch specialises them: no
    register spills (STL / LDL) at D 64, 128 and 256, contiguous (varlen, batched) and paged K/V."""
    import torch
    from fray.testing import compile_triton_sm90, sm90_spec
    from fray_triton import prefill_attention as PA
    specs = []
    for d in (64, 128, 256):
        bm, bn, warps, stages = PA.blocks_for(d, torch.bfloat16)
        for varlen, page in ((True, None), (False, None), (True, 64)) + (((True, 16),) if d == 128 else ()):
            specs.append(sm90_spec(
                "fray_triton.prefill_attention", "_prefill_kernel",
                {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "OUT": "*bf16", "LSE": "*fp32", "CU_Q": "*i32",
                 "CU_K": "*i32", "BT": "*i32", "sm_scale_log2": "fp32"},
                dict(GROUP=4, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=varlen, VARLEN=varlen, IEEE=False,
                     ROUND_P=False, PAGED=page is not None, PAGE_SIZE=page or 1),
                num_warps=warps, num_stages=stages,
                divisible=("Q", "K", "V", "OUT", "LSE", "CU_Q", "CU_K", "BT", "stride_qb", "stride_qt", "stride_qh",
                           "stride_kb", "stride_kt", "stride_kh", "stride_vb", "stride_vt", "stride_vh",
                           "stride_ob", "stride_ot", "stride_oh", "stride_lb", "stride_lh", "stride_btb")))
    for spec, r in zip(specs, compile_triton_sm90(specs)):
        assert r["wgmma"] and r["spills"] == 0, (spec["constexprs"], r)


def test_seed_flash_attn_cute():
    """fray.jit_kernels.flash_attn_cute, FlashAttention's CuTe interface: batched and varlen (and
    paged through page_table) calls give prefill_attention's (out, lse) in FlashAttention's
    layouts, causal off by default; sliding windows, soft-capping and sinks refused by their
    FlashAttention names."""
    q, k, v, cu_q, cu_k, kp, vp, bt = _paged_case(torch.float32, [5, 9], [7, 9], 4, 2, 64, 16, seed=21)
    out, lse = fray.jit_kernels.flash_attn_cute(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    _check(out, lse, _expected(q, k, v, cu_q, cu_k, causal=False), torch.float32, "flash_attn_cute varlen")
    out, lse = fray.jit_kernels.flash_attn_cute(q, kp, vp, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                                page_table=bt, softmax_scale=0.2)
    _check(out, lse, _expected(q, k, v, cu_q, cu_k, True, 0.2), torch.float32, "flash_attn_cute paged")
    qb, kb, vb = q[5:].reshape(1, 9, 4, 64), k[7:].reshape(1, 9, 2, 64), v[7:].reshape(1, 9, 2, 64)
    out, lse = fray.jit_kernels.flash_attn_cute(qb, kb, vb, causal=True, window_size=(-1, -1))
    assert out.shape == (1, 9, 4, 64) and lse.shape == (1, 4, 9)  # FlashAttention's [B, Hq, S_q]
    e = _expected(qb, kb, vb, causal=True)
    _check(out[0], lse[0], (e[0][0], e[1][0], e[2][0]), torch.float32, "flash_attn_cute batched")
    for kw, msg in ((dict(window_size=(128, 0)), "window_size: sliding-window attention is not supported"),
                    (dict(window_size=128), "window_size: sliding-window attention is not supported"),
                    (dict(softcap=30.0), "softcap: logit soft-capping is not supported"),
                    (dict(learnable_sink=torch.zeros(4)), "learnable_sink: attention sinks are not supported")):
        with pytest.raises(ValueError, match=msg):
            fray.jit_kernels.flash_attn_cute(qb, kb, vb, **kw)
