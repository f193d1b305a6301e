"""fray.mla_decode (DeepSeek's latent attention decode over a paged latent cache): the float64
reference (hand values, a direct softmax formula), the Triton kernels under the interpreter (both
MMA orientations, several splits and head blocks, block sizes above and below the tile, garbage
past lens), the ops layer's wiring (the CUDA kernel's slots with its build stubbed), the split
heuristic, the error contract, the sm_90a compiles, the CUDA kernel's shared-memory views, TMA
boxes and mask checked on the host; GPU, both backends: Hq 16 / 64 / 128 x bf16 / fp16 x s_q 1 / 2
against the reference, every block size and odd head / query counts, forced split counts,
garbage past lens, graph replay with new lens, torch.compile, out=, the seed's flash_mla."""
import contextlib
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
D, DV = 576, 512
SCALE = 1.0 / math.sqrt(D)


def _case(dtype, lens, s_q=2, hq=16, page=64, max_blocks=None, seed=0, device="cpu"):
    """q [B, s_q, Hq, 576], pages [n, page, 1, 576], a shuffled int32 block table, int32 lens."""
    return A._mla_case(dtype, device, batch=len(lens), s_q=s_q, hq=hq, lens=tuple(lens), page=page,
                       max_blocks=max_blocks, seed=seed)


def _f64(t):
    return t.detach().to("cpu", torch.float64).numpy()


def _expected(q, kv, bt, lens, scale=None):
    """The reference's (out, lse, magnitude) and each row's score-term magnitude: scale * max_j
    sum_k |q_k| |row_jk| over the visible tokens, what the fp32 score sums' errors (and so the
    lse's) are relative to (a row whose lse is near 0 still carries errors of that size)."""
    scale = SCALE if scale is None else scale
    qd, kd, bt, lens = _f64(q), _f64(kv), bt.cpu(), lens.cpu().tolist()
    out, lse, mag = ref.mla_decode(qd, kd, bt, lens, DV, scale)
    terms = np.zeros(lse.shape)
    s_q = qd.shape[1]
    for b, n in enumerate(lens):
        rows = ref.gather_pages(kd, bt[b], max(n, 0))[:, 0]
        for i in range(s_q):
            seen = n - s_q + 1 + i
            if seen > 0:
                terms[b, i] = scale * (np.abs(qd[b, i]) @ np.abs(rows[:seen]).T).max(axis=1)
    return out, lse, mag, terms


def _check(out, lse, expected, dtype, what):
    e, el, mag, terms = expected
    assert_close(out, e, dtype, what, scale=mag)
    el, lse = torch.from_numpy(np.asarray(el)), lse.detach().cpu()
    empty = torch.isinf(el)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "%s: lse -inf rows differ" % what
    assert_close(lse[~empty], el[~empty], torch.float32, what + " lse", scale=torch.from_numpy(terms)[~empty])


# ---------------------------------------------------------------------------------------------
# CPU: the reference against hand-computed values and a direct softmax formula

def _hand(latent, rope_k, q_rope, s_q=1, page=16):
    """One head: cached rows whose 512 latent columns are each `latent[j]` and whose 64 rotary
    columns are `rope_k[j]`; s_q queries that are 0 on the latent dims and q_rope on the rotary
    ones (so a score is 64 * q_rope * rope_k[j] * scale)."""
    n = len(latent)
    q = np.zeros((1, s_q, 1, D))
    q[..., DV:] = q_rope
    kv = np.zeros((1, page, 1, D))
    kv[0, :n, 0, :DV] = np.asarray(latent, dtype=np.float64)[:, None]
    kv[0, :n, 0, DV:] = np.asarray(rope_k, dtype=np.float64)[:, None]
    return q, kv, np.zeros((1, 1), np.int64)


def test_reference_hand_computed():
    # equal scores: each query averages the values it sees; causal among s_q = 2: query 0 sees
    # tokens 0, 1 (mean 3), query 1 all three (14/3)
    q, kv, bt = _hand([2.0, 4.0, 8.0], [0.0] * 3, 1.0, s_q=2)
    out, lse, _ = ref.mla_decode(q, kv, bt, [3])
    np.testing.assert_allclose(out[0, :, 0], [[3.0] * DV, [14.0 / 3.0] * DV], rtol=1e-15)
    np.testing.assert_allclose(lse[0, :, 0], [math.log(2.0), math.log(3.0)], rtol=1e-15)
    # the value is the latent part only: the rotary columns (7 here) never reach the output
    q, kv, bt = _hand([5.0], [7.0], 0.0)
    out, lse, _ = ref.mla_decode(q, kv, bt, [1])
    assert out.shape == (1, 1, 1, DV)
    np.testing.assert_allclose(out[0, 0, 0], np.full(DV, 5.0), rtol=1e-15)
    assert lse[0, 0, 0] == 0.0
    # the key is the whole row: rotary scores 64 * 1 * (0, 1/64) * scale = (0, ln 3) give weights
    # 1 : 3 between values 0 and 1
    q, kv, bt = _hand([0.0, 1.0], [0.0, 1.0 / 64], 1.0)
    out, lse, _ = ref.mla_decode(q, kv, bt, [2], scale=math.log(3.0))
    np.testing.assert_allclose(out[0, 0, 0], np.full(DV, 0.75), rtol=1e-14)
    np.testing.assert_allclose(lse[0, 0, 0], math.log(4.0), rtol=1e-14)
    # nothing visible: lens 0, and lens 1 with s_q = 2 for query 0
    q, kv, bt = _hand([5.0], [0.0], 1.0, s_q=2)
    out, lse, _ = ref.mla_decode(q, kv, bt, [0])
    assert (out == 0).all() and (lse == -np.inf).all()
    out, lse, _ = ref.mla_decode(q, kv, bt, [1])
    assert (out[0, 0] == 0).all() and lse[0, 0, 0] == -np.inf
    np.testing.assert_allclose(out[0, 1, 0], np.full(DV, 5.0))
    assert lse[0, 1, 0] == 0.0


def _direct(q, kv, bt, lens, scale):
    """softmax(scale q K^T + causal mask) V per sequence with torch's softmax on a dense K
    gathered page by page (an independent path: no online softmax, no gather_pages)."""
    batch, s_q, hq, _ = q.shape
    page = kv.shape[1]
    out = torch.zeros(batch, s_q, hq, DV, dtype=q.dtype)
    lse = torch.full((batch, s_q, hq), -math.inf, dtype=q.dtype)
    for b, n in enumerate(lens.tolist()):
        k = torch.cat([kv[int(bt[b, t // page]), t % page, 0][None] for t in range(n)]) if n else kv[:0, 0, 0]
        s = scale * torch.einsum("ihd,jd->ihj", q[b], k)                       # [s_q, Hq, n]
        i = torch.arange(s_q)[:, None, None]
        j = torch.arange(n)[None, None, :]
        s = s.masked_fill(j > n - s_q + i, -math.inf)
        seen = torch.isfinite(s).any(-1)
        p = torch.where(seen[..., None], torch.softmax(s, -1), torch.zeros_like(s))
        out[b] = p @ k[:, :DV]
        lse[b] = torch.where(seen, torch.logsumexp(s, -1), torch.full_like(lse[b], -math.inf))
    return out, lse


@pytest.mark.parametrize("s_q", [1, 2, 3])
@pytest.mark.parametrize("page", [16, 64])
def test_reference_matches_direct_softmax(s_q, page):
    lens = [0, 1, 2, 63, 64, 65, 130]
    q, kv, bt, lens_t = _case(torch.float64, lens, s_q=s_q, hq=4, page=page, seed=s_q + page)
    out, lse, mag = ref.mla_decode(q.numpy(), kv.numpy(), bt, lens_t, DV, 0.07)
    want, want_lse = _direct(q, kv, bt, lens_t, 0.07)
    torch.testing.assert_close(torch.from_numpy(out), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.from_numpy(lse), want_lse, rtol=1e-12, atol=1e-12)
    assert (mag >= np.abs(out) - 1e-12).all()


def test_public_api_numpy_and_cpu_tensors():
    q, kv, bt = _hand([2.0, 4.0, 8.0], [0.0] * 3, 1.0, s_q=2)
    y, lse = fray.mla_decode(q.astype(np.float32), kv.astype(np.float32), bt.astype(np.int32),
                             np.array([3], np.int32), return_lse=True)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (1, 2, 1, DV)
    assert lse.dtype == np.float32 and lse.shape == (1, 2, 1)
    np.testing.assert_allclose(y[0, :, 0, 0], [3.0, 14.0 / 3.0], rtol=1e-6)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        q, kv, bt, lens = _case(dtype, [0, 65, 130, 1])
        out = torch.full((4, 2, 16, DV), float("nan"), dtype=dtype)
        y, lse = fray.mla_decode(q, kv, bt, lens, out=out, return_lse=True, scale=0.05)
        assert y is out and lse.dtype == torch.float32 and lse.shape == (4, 2, 16)
        _check(y, lse, _expected(q, kv, bt, lens, 0.05), dtype, "cpu %s" % dtype)
        assert torch.equal(fray.mla_decode(q, kv, bt, lens, scale=0.05, backend="reference"), y)
    # the seed's name: FlashMLA's argument order and its lse layout [B, Hq, s_q]
    o2, l2 = fray.jit_kernels.flash_mla(q, kv, bt, lens, 512, None, None, 0.05, True)
    assert torch.equal(o2, y) and torch.equal(l2, lse.transpose(1, 2))
    o1, l1 = fray.jit_kernels.flash_mla(q[:, :1], kv, bt, lens, softmax_scale=0.05)  # s_q = 1: causal is moot
    assert torch.equal(o1, fray.mla_decode(q[:, :1], kv, bt, lens, scale=0.05))
    with pytest.raises(ValueError, match="causal: fray.mla_decode is causal among the s_q query tokens"):
        fray.jit_kernels.flash_mla(q, kv, bt, lens, 512, softmax_scale=0.05)
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.triton.mla_decode(q, kv, bt, lens)


def test_registration():
    assert fray.OPS["mla_decode"] == "attention" and hasattr(torch.ops.fray, "mla_decode")
    assert B._PREFERENCE["mla_decode"] == ("cuda", "triton") and A.CUDA_FAMILIES["mla_decode"] == "gemm"
    name, src = A.mla_cuda_source(torch.bfloat16, 64)
    assert name == "mla_sm90_bf16_page64"
    assert "MlaConfig<cutlass::bfloat16_t, 64>" in src and "FRAY_MLA_ENTRY(Config)" in src
    assert "MlaConfig<cutlass::half_t, 16>" in A.mla_cuda_source(torch.float16, 16)[1]


# ---------------------------------------------------------------------------------------------
# CPU: the error contract (validation runs before the CPU / GPU split, so CPU tensors show it)

_BF = torch.bfloat16


def _args(**change):
    q, kv, bt, lens = _case(_BF, [17, 1], page=16, max_blocks=2)
    kw = dict(q=q, kv_cache=kv, block_table=bt, lens=lens)
    kw.update(change)
    return kw


def _call(kw):
    kw = dict(kw)
    return fray.mla_decode(kw.pop("q"), kw.pop("kv_cache"), kw.pop("block_table"), kw.pop("lens"), **kw)


ERRORS = [
    # dtypes
    (dict(kv_cache=torch.zeros(7, 16, 1, D, dtype=torch.float16)), TypeError, "kv_cache: expected dtype bfloat16"),
    (dict(q=torch.zeros(2, 2, 16, D, dtype=torch.int32)), TypeError, r"q: expected dtype in"),
    (dict(q=torch.zeros(2, 2, 16, D, dtype=torch.float64)), TypeError, r"q: expected dtype in"),
    (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "block_table: expected dtype int32"),
    (dict(lens=torch.tensor([1.0, 2.0])), TypeError, "lens: expected dtype int32"),
    (dict(kv_cache=[0.0]), TypeError, "kv_cache: expected a torch.Tensor"),
    (dict(out=[0.0]), TypeError, "out: expected a torch.Tensor"),
    # shapes
    (dict(q=torch.zeros(2, 16, D, dtype=_BF)), ValueError, r"q: expected shape \[B, s_q, Hq, 576\]"),
    (dict(q=torch.zeros(2, 2, 16, 512, dtype=_BF)), ValueError, "q: expected head dim 576"),
    (dict(q=torch.zeros(2, 9, 16, D, dtype=_BF)), ValueError, r"q: s_q \(dim 1, query tokens per sequence\) must lie "
                                                              r"in 1\.\.8, got 9"),
    (dict(q=torch.zeros(2, 2, 129, D, dtype=_BF)), ValueError, r"q: Hq \(dim 2\) must lie in 1\.\.128, got 129"),
    (dict(kv_cache=torch.zeros(7, 16, D, dtype=_BF)), ValueError, r"kv_cache: expected \[num_blocks, block_size, 1, "),
    (dict(kv_cache=torch.zeros(7, 16, 2, D, dtype=_BF)), ValueError, "kv_cache: MLA caches one latent row per token"),
    (dict(kv_cache=torch.zeros(7, 16, 1, 512, dtype=_BF)), ValueError, "kv_cache: head dim 512 differs from q's 576"),
    (dict(kv_cache=torch.zeros(7, 24, 1, D, dtype=_BF)), ValueError, r"kv_cache: block size \(dim 1\) must be one of"),
    (dict(block_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError, r"block_table: expected shape \[B=2, max_"),
    (dict(block_table=torch.zeros(2, dtype=torch.int32)), ValueError, r"block_table: expected shape \[B=2, max_"),
    (dict(lens=torch.zeros(3, dtype=torch.int32)), ValueError, r"lens: expected shape \(2,\)"),
    # values (CPU calls check lens and the used block-table entries; the capacity is 2 * 16)
    (dict(lens=torch.tensor([33, 0], dtype=torch.int32)), ValueError, r"lens: values must lie in \[0, T=32\]"),
    (dict(lens=torch.tensor([-1, 0], dtype=torch.int32)), ValueError, r"lens: values must lie in \[0, T=32\]"),
    (dict(block_table=torch.tensor([[0, 7], [1, 2]], dtype=torch.int32)), ValueError,
     r"block_table: entry \[0, 1\] = 7 lies outside \[0, num_blocks=7\)"),
    # devices (meta tensors stand in for a second device: validation never touches their data)
    (dict(kv_cache=torch.zeros(7, 16, 1, D, dtype=_BF, device="meta")), TypeError, "kv_cache: expected a tensor on cpu"),
    (dict(lens=torch.zeros(2, dtype=torch.int32, device="meta")), TypeError, "lens: expected a tensor on cpu"),
    (dict(out=torch.zeros(2, 2, 16, DV, dtype=_BF, device="meta")), TypeError, "out: expected a tensor on cpu"),
    # layout, out, scalars, backend
    (dict(kv_cache=torch.zeros(7, 16, 1, 2 * D, dtype=_BF)[..., ::2]), ValueError,
     "kv_cache: the last dimension must be contiguous"),
    (dict(out=torch.zeros(2, 2, 16, DV)), TypeError, "out: expected dtype bfloat16"),
    (dict(out=torch.zeros(2, 2, 16, D, dtype=_BF)), ValueError, r"out: expected shape \(2, 2, 16, 512\)"),
    (dict(out=torch.zeros(2, 16, DV, dtype=_BF)[:, None].expand(2, 2, 16, DV)), ValueError, "out: elements overlap"),
    (dict(head_dim_v=256), ValueError, "head_dim_v: expected 512"),
    (dict(head_dim_v=512.0), TypeError, "head_dim_v: expected an int, got float"),
    (dict(return_lse=1), TypeError, "return_lse: expected a bool, got int"),
    (dict(num_splits=0), ValueError, "num_splits: expected a value >= 1"),
    (dict(num_splits=2.0), TypeError, "num_splits: expected an int or None"),
    (dict(scale=0.0), ValueError, "scale: expected a finite value > 0"),
    (dict(scale="0.1"), TypeError, "scale: expected a float or None"),
    (dict(backend="cuda"), ValueError, "backend: 'cuda' needs CUDA tensors"),
    (dict(backend="triton"), ValueError, "backend: 'triton' needs CUDA tensors"),
    (dict(backend="fast"), ValueError, "backend: expected one of"),
]


@pytest.mark.parametrize("change,exc,match", ERRORS)
def test_error_contract(change, exc, match):
    with pytest.raises(exc, match=match):
        _call(_args(**change))


def test_valid_edges_and_numpy_errors():
    # zero-size batch, a block table without blocks (every row empty), Hq = 1, s_q = 8
    kw = _args()
    y = _call(dict(kw, q=kw["q"][:0], block_table=kw["block_table"][:0], lens=kw["lens"][:0]))
    assert y.shape == (0, 2, 16, DV)
    y, lse = _call(dict(kw, block_table=kw["block_table"][:, :0], lens=torch.zeros(2, dtype=torch.int32),
                        return_lse=True))
    assert (y == 0).all() and (lse == -math.inf).all()
    q, kv, bt, lens = _case(torch.float32, [9, 3], s_q=8, hq=1, page=16)
    _check(*fray.mla_decode(q, kv, bt, lens, return_lse=True), _expected(q, kv, bt, lens), torch.float32, "s_q 8")
    with pytest.raises(TypeError, match="kv_cache: expected a numpy.ndarray like q"):
        fray.mla_decode(np.zeros((1, 1, 1, D), np.float32), torch.zeros(1, 16, 1, D), np.zeros((1, 1), np.int32),
                        np.zeros(1, np.int32))
    with pytest.raises(ValueError, match=r"out: expected shape \(1, 1, 1, 512\)"):
        fray.mla_decode(np.zeros((1, 1, 1, D), np.float32), np.zeros((1, 16, 1, D), np.float32),
                        np.zeros((1, 1), np.int32), np.zeros(1, np.int32), out=np.zeros((1, 1, 1, D), np.float32))


def test_check_indices_refused_during_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1 checks lens / block_table"):
        A._device_check_indices(torch.tensor([1], dtype=torch.int32), 64, torch.zeros(1, 1, dtype=torch.int32), 64, 1)


# ---------------------------------------------------------------------------------------------
# CPU: the split heuristic (host-side, from shapes alone)

def test_split_heuristic():
    from fray_triton import mla_decode as tmla
    cfg = tmla.config(16, 1, torch.bfloat16)
    assert cfg[:2] == (16, 16) and cfg[-1] is True               # Hq 16: transposed, 16 rows
    assert tmla.config(128, 2, torch.bfloat16)[:2] == (32, 64)    # 4 head blocks of 32 x 2 queries
    assert tmla.config(128, 1, torch.float16)[:2] == (64, 64) and tmla.config(128, 1, torch.float16)[-1] is False
    assert tmla.config(20, 3, torch.bfloat16)[:2] == (16, 64)    # padded heads and queries
    split = tmla.num_splits_for
    # the memory-bound bar's shape fills the SMs already; B = 32 needs 4 splits (128 of 132 SMs)
    assert split(128, 1, 16, 16384, 132) == 1
    assert split(32, 1, 16, 16384, 132) == 4
    assert split(128, 4, 64, 4096, 132) == 1
    assert split(8, 1, 16, 16384, 132) == 16
    for batch, hb, rows, cap in ((1, 1, 16, 16384), (1, 4, 64, 1 << 20), (3, 2, 64, 100), (1, 1, 16, 64)):
        s = split(batch, hb, rows, cap, 132)
        assert 1 <= s <= tmla.MAX_SPLITS and (s == 1 or cap // s >= tmla.MIN_SPLIT_TOKENS), (batch, cap, s)
    assert split(4, 1, 16, 0, 132) == 1
    # the plan rounds splits to whole tiles: 5 asked over 3 tiles gives 3
    (_, n, size) = tmla.plan(1, 1, 16, torch.bfloat16, 192, 64, 5, 132)
    assert (n, size) == (3, 64)


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernels under TRITON_INTERPRET=1 (small shapes: the interpreter is slow)

def _triton(q, kv, bt, lens, scale=None, num_splits=None, cfg=None):
    from fray_triton import mla_decode as tmla
    out = torch.full(q.shape[:3] + (DV,), float("nan"), dtype=q.dtype)
    lse = torch.full(q.shape[:3], float("nan"))
    n = tmla.decode(q, kv, bt, lens, out, lse, SCALE if scale is None else scale, q_strides=q.stride()[:3],
                    kv_strides=kv.stride()[:2], bt_stride=bt.stride(0), out_strides=out.stride()[:3],
                    lse_strides=lse.stride(), capacity=bt.shape[1] * kv.shape[1], page_size=kv.shape[1],
                    num_splits=num_splits, num_sms=132, cfg=cfg)
    return out, lse, n


LENS = [0, 1, 63, 64, 65, 192]   # empty, one token, around the 64-token tile and page, T max


@INTERPRET
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_interpreter_vs_reference(dtype, s_q):
    q, kv, bt, lens = _case(dtype, LENS, s_q=s_q, seed=s_q)
    e = _expected(q, kv, bt, lens, 0.05)
    for splits in (1, 3):  # one split writes out directly; 3 splits of 64 go through the combine
        out, lse, n = _triton(q, kv, bt, lens, 0.05, num_splits=splits)
        assert n == splits
        _check(out, lse, e, dtype, "%s s_q=%d splits=%d" % (dtype, s_q, splits))


@INTERPRET
@pytest.mark.parametrize("cfg", [
    (8, 16, 16, 4, 1, False),    # 2 head blocks, 16-token tiles (4 per page), untransposed
    (8, 16, 16, 4, 1, True),     # the same, transposed ([tokens, rows] scores)
    (16, 32, 32, 8, 2, False),   # one head block of 16 x 2 queries, untransposed
])
def test_triton_interpreter_tiles_and_orientations(cfg):
    q, kv, bt, lens = _case(torch.bfloat16, LENS, s_q=2, seed=7)
    e = _expected(q, kv, bt, lens)
    for splits in (1, 5):
        out, lse, _ = _triton(q, kv, bt, lens, num_splits=splits, cfg=cfg)
        _check(out, lse, e, torch.bfloat16, "cfg %s splits=%d" % (cfg, splits))


@INTERPRET
@pytest.mark.parametrize("page", [16, 128])
def test_triton_interpreter_block_sizes(page):
    # 16: 16-token tiles, one per page; 128: one page holds two 64-token tiles
    q, kv, bt, lens = _case(torch.float16, [0, 15, 17, 200, 256], s_q=2, page=page, max_blocks=256 // page,
                            seed=page)
    out, lse, _ = _triton(q, kv, bt, lens, num_splits=2)
    _check(out, lse, _expected(q, kv, bt, lens), torch.float16, "page %d" % page)


@INTERPRET
def test_triton_interpreter_odd_heads_and_queries():
    # Hq = 20 (heads padded to 32), s_q = 3 (rows padded to 64), lens below s_q
    q, kv, bt, lens = _case(torch.bfloat16, [2, 0, 70], s_q=3, hq=20, seed=3)
    for splits in (1, 2):
        out, lse, _ = _triton(q, kv, bt, lens, num_splits=splits)
        _check(out, lse, _expected(q, kv, bt, lens), torch.bfloat16, "Hq 20 s_q 3 splits=%d" % splits)


@INTERPRET
def test_triton_interpreter_ignores_what_lies_past_lens():
    # Past lens[b]: block-table entries that are garbage (negative, past the pool) or that point at
    # pages of NaN, and NaN rows in the last page's tail. None of it may reach the output.
    q, kv, bt, lens = _case(torch.bfloat16, [5, 70, 0], s_q=2, page=16, max_blocks=8, seed=9)
    e = _expected(q, kv, bt, lens)
    kv, bt = kv.clone(), bt.clone()
    kv[bt[0, 1:].long()] = float("nan")
    kv[bt[0, 0].long(), 5:] = float("nan")
    kv[bt[1, 5:].long()] = float("nan")
    kv[bt[1, 4].long(), 6:] = float("nan")
    kv[bt[2].long()] = float("nan")
    bt[0, 1::2], bt[0, 2::2] = -7, 10 ** 6
    bt[1, 6:] = -1
    bt[2] = 10 ** 6
    for splits in (1, 4):
        out, lse, _ = _triton(q, kv, bt, lens, num_splits=splits)
        _check(out, lse, e, torch.bfloat16, "garbage past lens, splits=%d" % splits)


@INTERPRET
def test_triton_interpreter_clamps_bad_lens():
    # Outside the trust boundary: lens above the capacity reads the whole capacity, below 0 nothing.
    q, kv, bt, lens = _case(torch.float32, [128, 0], s_q=2, max_blocks=2, seed=4)
    out, lse, _ = _triton(q, kv, bt, torch.tensor([10 ** 6, -5], dtype=torch.int32), num_splits=2)
    _check(out, lse, _expected(q, kv, bt, lens), torch.float32, "clamped")


@INTERPRET
def test_ops_layer_wiring_under_interpreter(monkeypatch):
    """The ops layer's GPU implementation (the plan, its strides and split plan, the cached plan,
    an empty capacity, FRAY_BACKEND=cuda) driven on CPU tensors through the interpreter, with the
    CUDA-only calls stubbed out."""
    monkeypatch.setattr(P, "PLANS", P.PlanCache())
    monkeypatch.setattr(A.B, "resolve", lambda *a: "triton")
    monkeypatch.setattr(A.B, "num_sms", lambda dev: 132)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    q, kv, bt, lens = _case(torch.bfloat16, [65, 1, 192], s_q=2, seed=11)
    # q and out as slices of bigger buffers: strides are the plan's
    big_q = torch.zeros(3, 2, 16, D + 64, dtype=torch.bfloat16)
    big_q[..., :D] = q
    out = torch.full((3, 2, 20, DV), float("nan"), dtype=torch.bfloat16)[:, :, 2:18]
    lse = torch.full((3, 2, 16), float("nan"))
    A._mla_impl(big_q[..., :D], kv, bt, lens, out, lse, 0.05, 3, "auto")
    _check(out, lse, _expected(q, kv, bt, lens, 0.05), torch.bfloat16, "ops layer")
    assert len(P.PLANS) == 1
    plan = next(iter(P.PLANS._plans.values()))
    assert plan.launch[1:] == (3, 64) and plan.q_strides == big_q.stride()[:3]
    lens.copy_(torch.tensor([0, 64, 63], dtype=torch.int32))  # the cached plan, new lengths
    A._mla_impl(big_q[..., :D], kv, bt, lens, out, lse, 0.05, 3, "auto")
    assert len(P.PLANS) == 1
    _check(out, lse, _expected(q, kv, bt, lens, 0.05), torch.bfloat16, "ops layer, new lens")
    # no blocks at all: zero rows, lse -inf, no launch
    A._mla_impl(q, kv, bt[:, :0], lens, out, lse, 0.05, 0, "auto")
    assert (out == 0).all() and (lse == -math.inf).all()
    # "cuda" resolved: the CUDA kernel's configuration and slots (the build and the launch stubbed):
    # block_h heads x s_q queries in 64 rows, the split plan in whole 64-token tiles, strides of
    # size-1 dimensions 0, the partials allocated per call
    built, launched = stub_jit(monkeypatch)
    monkeypatch.setattr(A.B, "resolve", lambda *a: "cuda")
    P.PLANS.clear()  # (the Triton plans above share these signatures)
    qs = big_q[..., :D]
    A._mla_impl(qs, kv, bt, lens, out, lse, 0.05, 3, "auto")
    assert built == [A.mla_cuda_source(torch.bfloat16, 64)]
    (ptrs, ints, floats), = launched
    assert ptrs[:6] == (qs.data_ptr(), kv.data_ptr(), bt.data_ptr(), lens.data_ptr(), out.data_ptr(), lse.data_ptr())
    # 3 splits: the partial outputs [B, s_q, Hq, splits, 512] then their LSEs, in one fp32 buffer
    assert ptrs[6] and ptrs[7] == ptrs[6] + 3 * 2 * 16 * 3 * DV * 4
    # capacity 3 x 64 = 192 tokens in 3 splits of one tile
    assert ints == ((3, 2, 16, 16, 3, 64, 3, kv.shape[0]) + qs.stride()[:3] + kv.stride()[:2]
                    + (bt.stride(0),) + out.stride()[:3] + lse.stride()) and floats == (0.05,)
    assert A.mla_cuda_plan(3, 2, 16, torch.bfloat16, 256, 3, 132) == (16, 2, 128)
    assert A.mla_cuda_plan(1, 1, 128, torch.bfloat16, 64, 1, 132) == (64, 1, 64)
    assert A.mla_cuda_plan(1, 3, 20, torch.bfloat16, 1000, None, 132)[0] == 20  # 60 of 64 rows
    # one split (the kernel writes out and lse itself, no partials); a size-1 s_q's stride is 0
    launched.clear()
    A._mla_impl(qs[:, :1], kv, bt, lens, out[:, :1], lse[:, :1], 0.05, 1, "auto")
    (ptrs, ints, floats), = launched
    assert ptrs[6:] == (0, 0) and ints[1] == 1 and ints[4:6] == (1, 192) and ints[9] == 0 and ints[15] == 0
    # forced "cuda" where the kernel cannot run: fp32, and misaligned pointers
    q32, kv32, bt32, lens32 = _case(torch.float32, [3], s_q=1, hq=4)
    with pytest.raises(ValueError, match="backend='cuda' cannot run mla_decode here: the CUDA MLA kernel takes bf16 "
                                         "and fp16"):
        A._mla_impl(q32, kv32, bt32, lens32, torch.empty(1, 1, 4, DV), torch.empty(1, 1, 4), 0.05, 0, "cuda")
    buf = torch.zeros(3 * 2 * 16 * D + 1, dtype=torch.bfloat16)
    qm = buf[1:].view(3, 2, 16, D)  # 2 bytes off 16-byte alignment
    with pytest.raises(ValueError, match="backend='cuda' loads q and kv_cache in 16-byte chunks"):
        A._mla_impl(qm, kv, bt, lens, out, lse, 0.05, 3, "cuda")


# ---------------------------------------------------------------------------------------------
# CPU: the kernels compile for sm_90a (Triton's own ptxas, no GPU needed)

_DIVISIBLE = ("Q", "KV", "BT", "LENS", "OUT", "LSE", "PO", "PL", "stride_qb", "stride_qs", "stride_qh", "stride_kvp",
              "stride_kvt", "stride_btb", "stride_ob", "stride_os", "stride_oh", "stride_lb")


def test_kernels_compile_for_sm90a_without_spills():
    """The split kernel at the GPU's configurations (plan) for the issue's Hq x s_q, one split
    (final output) and several (partials), FlashMLA's 64-token blocks and 16 / 32-token ones
    (tiles cut to the block), 16-bit caches on wgmma, fp32 on the CUDA cores; and the combine.
    No register spills (STL / LDL) anywhere."""
    from fray.testing import compile_triton_sm90, sm90_spec
    from fray_triton import mla_decode as M
    specs = []
    for hq, s_q, dtype, page in ((16, 1, "bf16", 64), (16, 2, "bf16", 64), (64, 1, "fp16", 64), (64, 2, "bf16", 64),
                                 (128, 1, "bf16", 64), (128, 2, "bf16", 64), (128, 2, "fp16", 16), (16, 1, "fp16", 16),
                                 (64, 1, "bf16", 32), (20, 3, "bf16", 16), (128, 4, "fp16", 128), (16, 2, "fp32", 64),
                                 (128, 1, "fp32", 16)):
        torch_dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype])
        (block_h, rows, block_n, warps, stages, trans), _, _ = M.plan(8, s_q, hq, torch_dtype, 1024, page, 1, 132)
        for single in (True, False):
            specs.append(sm90_spec(
                "fray_triton.mla_decode", "_mla_split_kernel",
                {"Q": "*" + dtype, "KV": "*" + dtype, "BT": "*i32", "LENS": "*i32", "OUT": "*" + dtype,
                 "LSE": "*fp32", "PO": "*fp32", "PL": "*fp32", "sm_scale_log2": "fp32"},
                dict(S_Q=s_q, BLOCK_H=block_h, ROWS=rows, D_V=DV, D_R=D - DV, BLOCK_N=block_n, PAGE_SIZE=page,
                     SINGLE=single, DOT_F32=dtype == "fp32", ROUND_P=False, TRANS=trans),
                num_warps=warps, num_stages=stages, divisible=_DIVISIBLE))
    specs.append(sm90_spec("fray_triton.mla_decode", "_mla_combine_kernel",
                           {"PO": "*fp32", "PL": "*fp32", "LENS": "*i32", "OUT": "*bf16", "LSE": "*fp32"},
                           dict(S_Q=2, D_V=DV, SPLITS_PAD=M.MAX_SPLITS), num_warps=4,
                           divisible=("PO", "PL", "LENS", "OUT", "LSE", "stride_ob", "stride_os", "stride_oh")))
    for spec, r in zip(specs, compile_triton_sm90(specs)):
        assert r["spills"] == 0, (spec["kernel"], spec["constexprs"], r)
        if spec["kernel"] == "_mla_split_kernel" and not spec["constexprs"]["DOT_F32"]:
            assert r["wgmma"], (spec["constexprs"], r)


# ---------------------------------------------------------------------------------------------
# GPU (cheap shapes: seconds in all)

GPU_LENS = [0, 1, 63, 64, 65, 1024, 777]   # T max = 1024 (16 blocks of 64)


def _gpu_case(cuda, dtype, s_q, hq, seed=0, lens=GPU_LENS, **kw):
    return _case(dtype, lens, s_q=s_q, hq=hq, seed=seed, device=cuda, **kw)


BACKENDS = ["triton", "cuda"]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("hq", [16, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_vs_reference(cuda, dtype, hq, s_q, backend):
    q, kv, bt, lens = _gpu_case(cuda, dtype, s_q, hq, seed=hq + s_q)
    e = _expected(q, kv, bt, lens)
    for splits in (None, 1, 5, 16):
        out = torch.full((len(GPU_LENS), s_q, hq, DV), float("nan"), device=cuda, dtype=dtype)
        y, lse = fray.mla_decode(q, kv, bt, lens, out=out, return_lse=True, num_splits=splits, backend=backend)
        assert y is out
        _check(y, lse, e, dtype, "%s %s Hq=%d s_q=%d splits=%s" % (backend, dtype, hq, s_q, splits))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_block_sizes_and_odd_shapes(cuda, backend):
    """Every block size (a 64-token tile of four, two, one page or half of one); heads that do not
    fill the 64 rows (20 x 3 = 60), queries that take them all (128 heads x 4: 16 heads a head
    block); lengths around the tiles."""
    for dtype, page, hq, s_q in ((torch.float32, 64, 16, 2), (torch.bfloat16, 16, 20, 3), (torch.float16, 128, 128, 4),
                                 (torch.bfloat16, 32, 1, 1), (torch.float16, 64, 7, 8)):
        if dtype == torch.float32 and backend == "cuda":
            continue
        q, kv, bt, lens = _gpu_case(cuda, dtype, s_q, hq, seed=page, lens=[0, 2, 129, 1024, 64, 65],
                                    page=page, max_blocks=1024 // page)
        for splits in (None, 1, 3):
            y, lse = fray.mla_decode(q, kv, bt, lens, return_lse=True, scale=0.03, backend=backend,
                                     num_splits=splits)
            _check(y, lse, _expected(q, kv, bt, lens, 0.03), dtype, "%s %s P%d Hq=%d s_q=%d splits=%s"
                   % (backend, dtype, page, hq, s_q, splits))


@pytest.mark.gpu
def test_gpu_cuda_refuses_fp32_when_forced(cuda):
    q, kv, bt, lens = _gpu_case(cuda, torch.float32, 1, 16, lens=[3])
    with pytest.raises(ValueError, match="the CUDA MLA kernel takes bf16 and fp16"):
        fray.mla_decode(q, kv, bt, lens, backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_deterministic_and_split_independent(cuda, backend):
    q, kv, bt, lens = _gpu_case(cuda, torch.bfloat16, 2, 64, seed=5)
    a = fray.mla_decode(q, kv, bt, lens, num_splits=7, backend=backend)
    assert torch.equal(a, fray.mla_decode(q, kv, bt, lens, num_splits=7, backend=backend))
    e = _expected(q, kv, bt, lens)
    for splits in (1, 3, 16):  # every split count within the tolerance of the reference: of each other
        assert_close(fray.mla_decode(q, kv, bt, lens, num_splits=splits, backend=backend).double(),
                     torch.from_numpy(e[0]), torch.bfloat16, "splits=%d" % splits, scale=torch.from_numpy(e[2]))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_ignores_what_lies_past_lens(cuda, backend):
    q, kv, bt, lens = _gpu_case(cuda, torch.bfloat16, 2, 16, seed=9, lens=[5, 70, 0, 1000], page=16, max_blocks=64)
    e = _expected(q, kv, bt, lens)
    bt = bt.clone()
    for b, n in enumerate(lens.tolist()):
        used = -(-n // 16)
        kv[bt[b, used:].long()] = float("nan")
        if n % 16:
            kv[bt[b, used - 1].long(), n % 16:] = float("nan")
        bt[b, used::2] = -7
        bt[b, used + 1::2] = 10 ** 6
    for splits in (None, 1, 8):
        y, lse = fray.mla_decode(q, kv, bt, lens, return_lse=True, num_splits=splits, backend=backend)
        _check(y, lse, e, torch.bfloat16, "%s garbage past lens, splits=%s" % (backend, splits))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("splits", [None, 1, 6])
def test_gpu_graph_capture_with_new_lens(cuda, splits, backend):
    q, kv, bt, lens = _gpu_case(cuda, torch.bfloat16, 2, 128, seed=12, lens=[1024, 3, 0, 500])
    out = torch.empty(4, 2, 128, DV, device=cuda, dtype=torch.bfloat16)
    fray.mla_decode(q, kv, bt, lens, out=out, num_splits=splits, backend=backend)  # warm-up: compiles, plans
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = fray.mla_decode(q, kv, bt, lens, out=out, return_lse=True, num_splits=splits, backend=backend)
    for new in ([17, 1024, 64, 1], [0, 0, 0, 0], [65, 2, 1023, 1024]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, lse, _expected(q, kv, bt, lens), torch.bfloat16, "graph replay %s splits=%s" % (new, splits))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_torch_compile_fullgraph(cuda, backend):
    q, kv, bt, lens = _gpu_case(cuda, torch.float16, 2, 64, seed=13)

    def f(q, kv, bt, lens):
        y, lse = fray.mla_decode(q * 2.0, kv, bt, lens, return_lse=True, scale=0.02, backend=backend)
        return y + 1.0, lse

    y, lse = torch.compile(f, fullgraph=True)(q, kv, bt, lens)
    e = _expected(q * 2.0, kv, bt, lens, 0.02)
    _check(y - 1.0, lse, (e[0], e[1], e[2] + 1.0, e[3]), torch.float16, "compiled")
    ey, else_ = f(q, kv, bt, lens)
    assert torch.equal(y, ey) and torch.equal(lse, else_)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_strided_inputs_out_and_side_stream(cuda, backend):
    q, kv, bt, lens = _gpu_case(cuda, torch.bfloat16, 2, 16, seed=14)
    big = torch.zeros(q.shape[:3] + (D + 64,), device=cuda, dtype=torch.bfloat16)
    big[..., 32:32 + D] = q
    qs = big[..., 32:32 + D]                        # q inside a wider buffer
    out = torch.full((len(GPU_LENS), 2, 24, DV), float("nan"), device=cuda, dtype=torch.bfloat16)[:, :, 4:20]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y, lse = fray.mla_decode(qs, kv, bt, lens, out=out, return_lse=True, backend=backend)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert y is out
    _check(y, lse, _expected(q, kv, bt, lens), torch.bfloat16, "strided, side stream")
    plain = fray.mla_decode(q, kv, bt, lens, backend=backend)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, y)
    n = len(P.PLANS)
    assert torch.equal(fray.mla_decode(q, kv, bt, lens, backend=backend), plain) and len(P.PLANS) == n  # cached


@pytest.mark.gpu
def test_gpu_seed_alias_backends_and_check_indices(cuda, monkeypatch):
    q, kv, bt, lens = _gpu_case(cuda, torch.bfloat16, 2, 16, seed=15)
    y, lse = fray.mla_decode(q, kv, bt, lens, return_lse=True, scale=0.05)
    fy, flse = fray.jit_kernels.flash_mla(q, kv, bt, lens, 512, None, None, 0.05, True)
    assert torch.equal(fy, y) and torch.equal(flse, lse.transpose(1, 2)) and flse.shape == (len(GPU_LENS), 16, 2)
    # fray.triton is the Triton kernel's; "auto" runs the CUDA kernel here (bf16, 16 heads)
    assert torch.equal(fray.triton.mla_decode(q, kv, bt, lens, scale=0.05),
                       fray.mla_decode(q, kv, bt, lens, scale=0.05, backend="triton"))
    yc, lc = fray.mla_decode(q, kv, bt, lens, return_lse=True, scale=0.05, backend="cuda")
    assert torch.equal(yc, y) and torch.equal(lc, lse)
    _check(yc, lc, _expected(q, kv, bt, lens, 0.05), torch.bfloat16, "cuda beside the seed alias")
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    bad = bt.clone()
    bad[4, 1] = kv.shape[0]   # lens[4] = 65 uses blocks 0 and 1
    with pytest.raises(ValueError, match=r"block_table: entry \[4, 1\] = %d lies outside" % kv.shape[0]):
        fray.mla_decode(q, kv, bad, lens)
    with pytest.raises(ValueError, match=r"lens: values must lie in \[0, T=1024\]"):
        fray.mla_decode(q, kv, bt, lens + 1000)
    bad = bt.clone()
    bad[0] = -1  # lens[0] = 0 uses no block: not checked
    fray.mla_decode(q, kv, bad, lens)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1"):
        with torch.cuda.graph(graph):
            fray.mla_decode(q, kv, bt, lens)


# ---------------------------------------------------------------------------------------------
# CPU: the CUDA kernel's index math on the host, and its compile for sm_90a

_LAYOUT_CHECK = r"""
#include <cstdio>
#include "cuda/attention/mla_sm90.cuh"
using namespace cute;
// One shared-memory cache tile, three views: K-major [64 tokens, 576] for S = Q K^T, and the two
// MN-major [256, 64 tokens] value halves of P V at 0 and kHalfOffset elements past the tile's base.
// Each value half's element (d, t) must be the K view's (t, half * 256 + d). The TMA boxes of a
// paged tile: box i's element (r, c) at the tile's (i * BoxN + r, c), the swizzle applied to the
// absolute offset.
template <class C> int check_layouts() {
  auto k = typename C::SmemK{};
  auto v = typename C::SmemVHalf{};
  auto sw = get_swizzle_portion(k);
  auto box = get_nonswizzle_portion(typename C::SmemKBox{});
  int bad = 0;
  for (int t = 0; t < C::kBlockN; ++t)
    for (int d = 0; d < C::kDV; ++d) bad += k(t, d) != v(d % C::kHalf, t) + (d / C::kHalf) * C::kHalfOffset;
  for (int i = 0; i < C::kBlockN / C::kBoxN; ++i)
    for (int r = 0; r < C::kBoxN; ++r)
      for (int c = 0; c < C::kD; ++c) bad += k(i * C::kBoxN + r, c) != sw(i * C::kBoxN * 64 + box(r, c));
  return bad;
}
// The kernel's mask (mla_mask_bound, after its early return for tiles wholly before the first
// query's end) against its definition for every element of warpgroup 1's S fragments.
int check_mask() {
  using C = fray::attention::MlaConfig<cutlass::bfloat16_t, 64>;
  typename C::MmaQK mma;
  int bad = 0;
  for (int t = 0; t < 128; ++t) {
    Tensor tc = mma.get_thread_slice(t).partition_C(make_identity_tensor(Shape<_64, _64>{}));
    Tensor c = make_tensor(tc.data(), fray::attention::rows_cols(tc.layout()));
    const int col0 = get<1>(c(0, 0));
    for (int s_q : {1, 2, 3, 8})
      for (int block_h : {1, 7, 16, 64 / s_q})
        for (int seqlen : {1, 2, 5, 63, 64, 65, 130, 1000})
          for (int t0 = 0; t0 < seqlen; t0 += 64) {
            const bool skip = t0 + 64 <= seqlen - s_q + 1;
            for (int i = 0; i < size<0>(c); ++i) {
              const int row = get<0>(c(i, 0));
              const int limit = fray::attention::mla::mla_mask_bound(row, t0, col0, block_h, s_q, seqlen);
              for (int j = 0; j < size<1>(c); ++j) {
                const int key = t0 + get<1>(c(i, j));
                const bool want = key >= seqlen - s_q + 1 + get<0>(c(i, j)) / block_h || key >= seqlen;
                bad += (skip ? false : get<1>(c(i, j)) - col0 >= limit) != want;
              }
            }
          }
  }
  return bad;
}
int main() {
  using BF = cutlass::bfloat16_t;
  using H = cutlass::half_t;
  int bad = check_layouts<fray::attention::MlaConfig<BF, 16>>() + check_layouts<fray::attention::MlaConfig<BF, 32>>() +
            check_layouts<fray::attention::MlaConfig<BF, 64>>() + check_layouts<fray::attention::MlaConfig<H, 128>>();
  bad += check_mask();
  printf("mismatches %d\n", bad);
  return bad != 0;
}
"""


def test_cuda_kernel_index_math_on_the_host(tmp_path):
    """The CUDA kernel's index math, run on the host by a program nvcc builds against the CUTLASS
    headers the JIT uses: the value halves read MN-major from the K-major cache tile address the
    same elements, the paged TMA boxes are sub-blocks of the tile at every block size, and the
    mask equals its definition for every element of S a thread holds."""
    run_host_check(_LAYOUT_CHECK, tmp_path)


def test_cuda_kernel_compiles_for_sm90a(tmp_path, monkeypatch):
    """The CUDA kernel through fray.jit for sm_90a without a GPU, loaded by the dynamic linker:
    the contract's exports are there and describe() names the configuration."""
    import ctypes
    from fray import jit
    monkeypatch.setenv("FRAY_CACHE_DIR", str(tmp_path / "cache"))
    lib = ctypes.CDLL(str(jit.compile_only(*A.mla_cuda_source(torch.bfloat16, 64))))
    for sym in ("fray_jit_launch", "fray_jit_workspace_bytes", "fray_jit_describe"):
        assert hasattr(lib, sym), sym
    lib.fray_jit_describe.restype = ctypes.c_char_p
    assert lib.fray_jit_describe().decode() == "mla_sm90 bf16 D576/512 rows 64 tile 64 stages 2 page 64"
