"""fray.decode_attention: reference, Triton (interpreter on CPU, GPU), error contract, index checks."""
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
from fray.testing import assert_close

INTERPRET = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                               reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _expected(q, k, v, lens, scale=None, kv_layout="HND"):
    return ref.decode_attention(q.double(), k.double(), v.double(), lens.tolist(), scale, kv_layout)


def _check(out, lse, expected, dtype, what):
    e, el, mag = expected
    assert_close(out, e, dtype, what, scale=mag)
    el = torch.as_tensor(el).cpu()
    lse = lse.cpu()
    empty = torch.isinf(el)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "%s: lse -inf rows differ" % what
    assert_close(lse[~empty], el[~empty], torch.float32, what + " lse")


# ---------------------------------------------------------------------------------------------
# CPU: reference against hand-computed values

def _one_head(keys, values, q=None):
    """q [1, 1, D] of ones (D = 64) against the given per-position key/value rows."""
    d = 64
    q = np.ones((1, 1, d)) if q is None else q
    k = np.zeros((1, 1, len(keys), d))
    v = np.zeros((1, 1, len(values), d))
    for t, (kk, vv) in enumerate(zip(keys, values)):
        k[0, 0, t], v[0, 0, t] = kk, vv
    return q, k, v


def test_reference_hand_computed():
    q, k, v = _one_head([0.5, -1.0, 3.0], [2.0, 4.0, 8.0])
    # one key: the output is its value, lse = its score (q.k = 64 * 0.5 = 32, scale 1/8 -> 4)
    out, lse, _ = ref.decode_attention(q, k, v, [1])
    np.testing.assert_allclose(out, np.full((1, 1, 64), 2.0), rtol=1e-15)
    np.testing.assert_allclose(lse, [[4.0]], rtol=1e-15)
    # two equal keys: the mean of the values, lse = score + log 2
    q, k, v = _one_head([1.0, 1.0, 5.0], [2.0, 4.0, 100.0])
    out, lse, _ = ref.decode_attention(q, k, v, [2])
    np.testing.assert_allclose(out, np.full((1, 1, 64), 3.0), rtol=1e-15)
    np.testing.assert_allclose(lse, [[8.0 + math.log(2.0)]], rtol=1e-15)
    # lens 0: a zero row and lse = -inf
    out, lse, _ = ref.decode_attention(q, k, v, [0])
    assert (out == 0).all() and lse[0, 0] == -np.inf
    # scale: keys 0 and 1/64 per element give scores 0 and scale; weights 1 : e^scale
    q, k, v = _one_head([0.0, 1.0 / 64], [0.0, 1.0])
    out, lse, _ = ref.decode_attention(q, k, v, [2], scale=math.log(3.0))
    np.testing.assert_allclose(out, np.full((1, 1, 64), 0.75), rtol=1e-14)
    np.testing.assert_allclose(lse, [[math.log(4.0)]], rtol=1e-14)


def test_reference_gqa_head_mapping():
    # Hq = 4, Hkv = 2: query heads 0, 1 read kv head 0 and heads 2, 3 read kv head 1.
    q = np.ones((1, 4, 64))
    k = np.zeros((1, 2, 1, 64))
    v = np.stack([np.full((1, 64), 1.0), np.full((1, 64), 2.0)])[None]
    out, _, _ = ref.decode_attention(q, k, v, [1])
    np.testing.assert_allclose(out[0, :, 0], [1.0, 1.0, 2.0, 2.0])


def test_reference_layouts_and_paged_agree():
    q, k, v, kp, vp, bt, lens = A._random_case(torch.float32, "cpu", lens=(37, 16))
    e = _expected(q, k, v, lens)
    nhd = ref.decode_attention(q.double(), k.transpose(1, 2).double(), v.transpose(1, 2).double(), [37, 16],
                               None, "NHD")
    paged = ref.paged_decode_attention(q.double(), kp.double(), vp.double(), bt, [37, 16])
    for a, b in zip(e, nhd):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(e, paged):
        torch.testing.assert_close(a, b, rtol=1e-15, atol=1e-15)


def test_public_api_numpy_and_cpu_tensors():
    q, k, v = _one_head([1.0, 1.0], [2.0, 4.0])
    y = fray.decode_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), np.array([2]))
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (1, 1, 64)
    np.testing.assert_allclose(y, 3.0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        q, k, v, _, _, _, lens = A._random_case(dtype, "cpu", lens=(5, 0))
        out = torch.full_like(q, float("nan"))
        y, lse = fray.decode_attention(q, k, v, lens, out=out, return_lse=True)
        assert y is out and y.dtype == dtype and lse.dtype == torch.float32
        _check(y, lse, _expected(q, k, v, lens), dtype, "cpu")
        # the seed's 4-d q [B, H, 1, D] gives a 4-d output
        y4 = fray.decode_attention(q[:, :, None], k, v, lens)
        assert y4.shape == (2, 4, 1, 64) and torch.equal(y4[:, :, 0], y)
        yn = fray.decode_attention(q, k.transpose(1, 2), v.transpose(1, 2), lens, kv_layout="NHD")
        assert torch.equal(yn, y)


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernels under TRITON_INTERPRET=1

def _triton(q, k, v, lens, kv_layout="HND", scale=None, num_splits=3, block_n=16):
    from fray_triton import attention as tattn
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"))
    if kv_layout == "HND":
        ks, vs, hkv, cap = (k.stride(0), k.stride(1), k.stride(2)), (v.stride(0), v.stride(1), v.stride(2)), \
            k.shape[1], k.shape[2]
    else:
        ks, vs, hkv, cap = (k.stride(0), k.stride(2), k.stride(1)), (v.stride(0), v.stride(2), v.stride(1)), \
            k.shape[2], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    tattn.decode(q, k, v, lens, None, out, lse, scale, q_strides=q.stride()[:2], k_strides=ks, v_strides=vs,
                 bt_stride=0, out_strides=out.stride()[:2], lse_stride=lse.stride(0), n_kv_heads=hkv,
                 capacity=cap, page_size=1, num_splits=num_splits, num_sms=132, block_n=block_n)
    return out, lse


@INTERPRET
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_triton_interpreter_vs_reference(dtype, kv_layout, num_splits):
    # B=2, Hq=4, Hkv=2, T=37, D=64; lens 1 (splits past it exit), 16 (a tile boundary), T.
    for lens in ((1, 37), (16, 0)):
        q, k, v, _, _, _, lens_t = A._random_case(dtype, "cpu", lens=lens, seed=sum(lens))
        if kv_layout == "NHD":
            k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        out, lse = _triton(q, k, v, lens_t, kv_layout, num_splits=num_splits)
        _check(out, lse, _expected(q, k, v, lens_t, None, kv_layout), dtype,
               "triton %s lens=%s splits=%d" % (kv_layout, lens, num_splits))


@INTERPRET
def test_triton_interpreter_group8_d128_scale_and_strided_cache():
    g = torch.Generator().manual_seed(3)
    big_k = torch.randn(2, 1, 50, 128, generator=g)
    big_v = torch.randn(2, 1, 50, 128, generator=g)
    k, v = big_k[:, :, 5:45], big_v[:, :, 5:45]  # a slice of a larger cache: T = 40
    q = torch.randn(2, 8, 128, generator=g)
    lens = torch.tensor([40, 33], dtype=torch.int32)
    out, lse = _triton(q, k, v, lens, scale=0.3, num_splits=2, block_n=16)
    _check(out, lse, _expected(q, k, v, lens, 0.3), torch.float32, "group 8, D 128")


@INTERPRET
def test_triton_interpreter_clamps_bad_lens():
    # Outside the trust boundary: lens past T reads only T positions, negative lens a zero row.
    q, k, v, _, _, _, _ = A._random_case(torch.float32, "cpu")
    out, lse = _triton(q, k, v, torch.tensor([37 + 50, -3], dtype=torch.int32))
    _check(out, lse, _expected(q, k, v, torch.tensor([37, 0])), torch.float32, "clamped")


@INTERPRET
def test_ops_layer_wiring_under_interpreter(monkeypatch):
    """The GPU implementations of the ops layer (strides of both layouts, paged, 4-d q, appends)
    driven on CPU tensors through the interpreter, with the CUDA-only calls stubbed out."""
    import contextlib
    monkeypatch.setattr(P, "PLANS", P.PlanCache())  # plans built under the stubs below stay in this test
    monkeypatch.setattr(A.B, "resolve", lambda *a: "triton")
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(B, "num_sms", lambda i: 4)
    q, k, v, kp, vp, bt, lens = A._random_case(torch.bfloat16, "cpu", lens=(37, 16))
    e = _expected(q, k, v, lens)
    for layout in ("HND", "NHD", "paged"):
        out = torch.full(q.shape[:2] + (1, 64), float("nan"), dtype=q.dtype)
        lse = torch.empty(2, 4)
        if layout == "paged":
            A._decode_impl("paged_decode_attention", q[:, :, None], kp, vp, lens, bt, out, lse, 0.125, False, 0, "auto")
        else:
            kk, vv = (k, v) if layout == "HND" else (k.transpose(1, 2), v.transpose(1, 2))
            A._decode_impl("decode_attention", q[:, :, None], kk, vv, lens, None, out, lse, 0.125, layout == "NHD",
                           2, "auto")
        _check(out[:, :, 0], lse, e, torch.bfloat16, "ops layer " + layout)
    kn, vn = torch.randn(2, 2, 64).to(q.dtype), torch.randn(2, 2, 64).to(q.dtype)
    at = torch.tensor([36, 0], dtype=torch.int32)
    kc, vc = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    A._append_impl("kv_append", kc, vc, kn, vn, at, None, True, "auto")
    assert torch.equal(kc[0, 36], kn[0]) and torch.equal(vc[1, 0], vn[1])
    A._append_impl("kv_append_paged", kp, vp, kn, vn, at, bt, False, "auto")
    assert torch.equal(kp[bt[0, 2], 4], kn[0]) and torch.equal(vp[bt[1, 0], 0], vn[1])


# ---------------------------------------------------------------------------------------------
# CPU: error contract and index checks

def test_errors_name_the_argument():
    q, k, v, _, _, _, lens = A._random_case(torch.float32, "cpu")
    with pytest.raises(TypeError, match="k_cache: expected dtype float32"):
        fray.decode_attention(q, k.half(), v, lens)
    with pytest.raises(TypeError, match="lens: expected dtype int32, got int64"):
        fray.decode_attention(q, k, v, lens.long())
    with pytest.raises(TypeError, match="q: expected dtype in"):
        fray.decode_attention(q.double(), k, v, lens)
    if hasattr(torch, "float8_e4m3fn"):
        with pytest.raises(TypeError, match="k_cache: FP8 KV caches are not supported"):
            fray.decode_attention(q, k.to(torch.float8_e4m3fn), v, lens)
    with pytest.raises(ValueError, match="q: decode attention takes one query token"):
        fray.decode_attention(q[:, :, None].expand(2, 4, 3, 64), k, v, lens)
    with pytest.raises(ValueError, match="window_left: sliding-window"):
        fray.decode_attention(q, k, v, lens, window_left=128)
    with pytest.raises(ValueError, match="logits_soft_cap: logit soft-capping"):
        fray.decode_attention(q, k, v, lens, logits_soft_cap=30.0)
    with pytest.raises(ValueError, match="sinks: attention sinks"):
        fray.decode_attention(q, k, v, lens, sinks=torch.zeros(4))
    with pytest.raises(ValueError, match="kv_layout: expected 'HND'"):
        fray.decode_attention(q, k, v, lens, kv_layout="HDN")
    with pytest.raises(ValueError, match=r"v_cache: expected shape \(2, 2, 37, 64\)"):
        fray.decode_attention(q, k, v[:, :, :36], lens)
    with pytest.raises(ValueError, match="q: head dim must be one of"):
        fray.decode_attention(q[..., :32], k[..., :32], v[..., :32], lens)
    with pytest.raises(ValueError, match="q: Hq / Hkv must be an integer group size"):
        fray.decode_attention(q[:, :3], k, v, lens)
    with pytest.raises(ValueError, match="q: Hq / Hkv must be an integer group size in 1..16"):
        fray.decode_attention(torch.randn(2, 34, 64), k, v, lens)
    with pytest.raises(ValueError, match=r"lens: expected shape \(2,\)"):
        fray.decode_attention(q, k, v, lens[:1])
    with pytest.raises(ValueError, match="k_cache: the last dimension must be contiguous"):
        fray.decode_attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, lens)
    with pytest.raises(ValueError, match="scale: expected a finite value > 0"):
        fray.decode_attention(q, k, v, lens, scale=float("nan"))
    with pytest.raises(ValueError, match="num_splits: expected a value >= 1"):
        fray.decode_attention(q, k, v, lens, num_splits=0)
    with pytest.raises(TypeError, match="return_lse: expected a bool"):
        fray.decode_attention(q, k, v, lens, return_lse=1)
    with pytest.raises(ValueError, match="backend: expected one of"):
        fray.decode_attention(q, k, v, lens, backend="flashinfer")
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.decode_attention(q, k, v, lens, backend="triton")
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        fray.decode_attention(q, k, v, lens, out=torch.empty(2, 4, 64, dtype=torch.float16))
    with pytest.raises(TypeError, match="lens: expected a tensor on cpu"):
        fray.decode_attention(q, k, v, torch.empty(2, dtype=torch.int32, device="meta"))
    with pytest.raises(TypeError, match="k_cache: expected a numpy.ndarray"):
        fray.decode_attention(q.numpy(), k, v, lens)


def test_lens_range_checked_on_cpu(monkeypatch):
    q, k, v, _, _, _, _ = A._random_case(torch.float32, "cpu")
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match=r"lens: values must lie in \[0, T=37\]; got values in \[0, 38\]"):
        fray.decode_attention(q, k, v, torch.tensor([38, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match="lens: values must lie"):
        fray.decode_attention(q, k, v, torch.tensor([-1, 3], dtype=torch.int32))
    monkeypatch.delenv("FRAY_CHECK_INDICES")  # the CPU path checks regardless (it reads lens anyway)
    with pytest.raises(ValueError, match="lens: values must lie"):
        fray.decode_attention(q, k, v, torch.tensor([38, 0], dtype=torch.int32))


def test_check_indices_refused_during_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1 .* CUDA-graph capture"):
        A._device_check_indices(torch.tensor([1], dtype=torch.int32), 37)


# ---------------------------------------------------------------------------------------------
# CPU: the CUDA extension builds, links and imports; its host-side split plan and argument checks
# (no GPU needed: both run before any CUDA call)

def _ext():
    from fray import backend as B
    ext = B.load_extension("attention")
    assert not isinstance(ext, ImportError), ext
    return ext


def test_cuda_extension_imports():
    ext = _ext()
    assert "90a" in ext.archs().split(",")
    assert ext.cuda_runtime_version() >= 13000
    # decode: {f32, f16, bf16} x {D 64, 128, 256} x {contiguous, paged} + 3 combines each; append: 4 words x 2
    assert ext.num_kernel_instances() == 35
    for op in A.OPS:
        assert hasattr(torch.ops.fray, op) and fray.OPS[op] == "attention"
        # (prefill_attention's and mla_decode's CUDA kernels are JIT-compiled: their own test files)
        assert A.B._PREFERENCE[op] == ("cuda", "triton")


@pytest.mark.parametrize("batch,hkv,capacity,splits", [
    (1, 8, 4096, 16),     # B = 1: split-KV fills the SMs, but splits stay >= 256 tokens
    (32, 8, 4096, 1),     # B * Hkv = 256 CTAs for 264 slots: whole sequences, no combine
    (64, 8, 8192, 1),     # 512 CTAs: two full waves of whole sequences (2 splits measured 3% slower)
    (64, 8, 16384, 2),    # at least ceil(T / 8192) splits
    (1, 1, 32768, 103),   # 122 splits within 5% of the best, rounded up to 64-token tiles
    (2, 2, 37, 1),        # short caches: one split
    (3, 4, 300, 1),       # >= 256 tokens per split
])
def test_cuda_split_plan(batch, hkv, capacity, splits):
    ext = _ext()
    split = ext.decode_split_size(2, 128, 4, batch, hkv, capacity, 0, 132)
    assert split % 64 == 0 and -(-capacity // split) == splits
    # never from lens, and an explicit count is honoured up to whole 64-token tiles
    assert -(-3001 // ext.decode_split_size(2, 128, 4, 3, 4, 3001, 7, 132)) == 7
    assert ext.decode_split_size(2, 64, 2, 2, 2, 37, 3, 132) == 64
    # paged caches keep at least ceil(T / 4096) splits (long page-walking splits end unevenly)
    assert -(-8192 // ext.decode_split_size(2, 128, 8, 64, 8, 8192, 0, 132, True)) == 2
    assert -(-8192 // ext.decode_split_size(2, 128, 8, 64, 8, 8192, 0, 132, paged=False)) == 1


# The launchers' slot orders (cuda/attention/attention.h), to call and record them by name.
DECODE_SLOTS = (("q", "k", "v", "lens", "block_table", "out", "lse", "part_out", "part_lse"),
                ("q_sb", "q_sh", "k_sb", "k_sh", "k_st", "v_sb", "v_sh", "v_st", "bt_sb", "page_size", "o_sb", "o_sh",
                 "lse_sb", "batch", "n_heads", "n_kv_heads", "head_dim", "capacity", "num_splits", "split_size",
                 "dtype"),
                ("scale",))
APPEND_SLOTS = (("k", "v", "k_new", "v_new", "lens", "block_table"),
                ("k_sb", "k_sh", "k_st", "v_sb", "v_sh", "v_st", "kn_sb", "kn_sh", "vn_sb", "vn_sh", "bt_sb",
                 "page_size", "batch", "n_kv_heads", "head_dim", "capacity", "dtype"),
                ())


def _pack(slots, named):
    return tuple(tuple(named[n] for n in group) for group in slots) + (named["device_index"], named["stream"])


def test_cuda_adapter_rejects_what_the_kernels_cannot_take():
    ext = _ext()
    good = dict(q=16, q_sb=512, q_sh=128, k=4096, k_sb=8 * 37 * 128, k_sh=37 * 128, k_st=128, v=8192,
                v_sb=8 * 37 * 128, v_sh=37 * 128, v_st=128, lens=64, block_table=0, bt_sb=0, page_size=1, out=32,
                o_sb=512, o_sh=128, lse=48, lse_sb=4, part_out=0, part_lse=0, batch=2, n_heads=4, n_kv_heads=2,
                head_dim=128, capacity=37, num_splits=1, split_size=64, scale=0.1, dtype=2, device_index=0,
                stream=0)
    for change, message in [(dict(k=4098), "k_cache: the CUDA decode kernels need a 16-byte aligned pointer"),
                            (dict(v_st=129), "v_cache: the CUDA decode kernels need"),
                            (dict(head_dim=96), "head_dim must be 64, 128 or 256"),
                            (dict(n_heads=34), "integer group size in 1..16"),
                            (dict(split_size=32), "the split plan"),
                            (dict(num_splits=2), "the split plan"),
                            (dict(num_splits=2, split_size=64, capacity=128), "need the partial buffers"),
                            (dict(block_table=80, page_size=24), "block size must be a power of two"),
                            (dict(dtype=7), "unsupported q dtype code 7")]:
        with pytest.raises(ValueError, match=message):
            ext.decode(*_pack(DECODE_SLOTS, dict(good, **change)))
    with pytest.raises(ValueError, match="decode_attention expects 9 ptrs, 21 ints, 1 floats"):
        ext.decode((0,) * 9, (0,) * 20, (0.1,), 0, 0)


class _RecordingExtension:
    """Stands in for fray._C._attention: records each launcher call by slot name (tensors in the
    ptrs slots as the binder reads them: data_ptr(), None as 0)."""

    def __init__(self, real):
        self.real, self.calls = real, []
        for fn, slots in (("decode", DECODE_SLOTS), ("kv_append", APPEND_SLOTS)):
            def launch(ptrs, ints, floats, device, stream, fn=fn, slots=slots):
                values = [0 if t is None else t if isinstance(t, int) else t.data_ptr() for t in ptrs]
                names = slots[0] + slots[1] + slots[2]
                named = dict(zip(names, values + list(ints) + list(floats)), device_index=device, stream=stream)
                self.calls.append((fn, named, tuple(map(len, (ptrs, ints, floats))) == tuple(map(len, slots))))
            setattr(self, fn, launch)

    def decode_split_size(self, *args):
        return self.real.decode_split_size(*args)


def test_ops_layer_cuda_wiring(monkeypatch):
    """What the ops layer hands the CUDA binding for each layout (no kernel runs: the extension is
    replaced by a recorder)."""
    import contextlib
    rec = _RecordingExtension(_ext())
    monkeypatch.setattr(P, "PLANS", P.PlanCache())  # plans built under the stubs below stay in this test
    monkeypatch.setattr(A.B, "resolve", lambda *a: "cuda")
    monkeypatch.setattr(A.B, "load_extension", lambda family: rec)
    monkeypatch.setattr(A.B, "current_stream", lambda device: 1234)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(B, "num_sms", lambda i: 132)
    q, k, v, kp, vp, bt, lens = A._random_case(torch.bfloat16, "cpu", lens=(37, 16))
    out = torch.empty(2, 4, 1, 64, dtype=q.dtype)
    lse = torch.empty(2, 4)
    A._decode_impl("decode_attention", q[:, :, None], k, v, lens, None, out, lse, 0.125, False, 0, "auto")
    A._decode_impl("decode_attention", q, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), lens,
                   None, out[:, :, 0], lse, 0.125, True, 0, "auto")
    A._decode_impl("paged_decode_attention", q, kp, vp, lens, bt, out[:, :, 0], lse, 0.125, False, 0, "auto")
    kn = torch.empty(2, 2, 64, dtype=q.dtype)
    A._append_impl("kv_append", k, v, kn, kn, lens, None, False, "auto")
    A._append_impl("kv_append_paged", kp, vp, kn, kn, lens, bt, False, "auto")
    assert [c[0] for c in rec.calls] == ["decode"] * 3 + ["kv_append"] * 2 and all(c[2] for c in rec.calls)
    hnd, nhd, paged, app, app_p = (c[1] for c in rec.calls)
    assert (hnd["k"], hnd["k_sb"], hnd["k_sh"], hnd["k_st"]) == (k.data_ptr(), 2 * 37 * 64, 37 * 64, 64)
    assert (nhd["k_sb"], nhd["k_sh"], nhd["k_st"]) == (37 * 2 * 64, 64, 2 * 64)
    assert (paged["k_sb"], paged["k_sh"], paged["k_st"], paged["page_size"]) == (16 * 2 * 64, 64, 2 * 64, 16)
    assert (paged["block_table"], paged["bt_sb"], paged["capacity"]) == (bt.data_ptr(), 3, 48)
    for call in (hnd, nhd, paged):
        assert (call["batch"], call["n_heads"], call["n_kv_heads"], call["head_dim"]) == (2, 4, 2, 64)
        assert (call["q_sb"], call["q_sh"], call["o_sb"], call["o_sh"], call["lse_sb"]) == (256, 64, 256, 64, 4)
        assert (call["num_splits"], call["split_size"], call["part_out"]) == (1, 64, 0)
        assert (call["scale"], call["dtype"], call["device_index"], call["stream"]) == (0.125, 2, 0, 1234)
        assert call["lens"] == lens.data_ptr() and call["out"] == out.data_ptr() and call["lse"] == lse.data_ptr()
    assert hnd["block_table"] == 0 and hnd["capacity"] == 37
    assert (app["k_st"], app["kn_sb"], app["kn_sh"], app["capacity"], app["block_table"]) == (64, 128, 64, 37, 0)
    assert (app_p["k_sb"], app_p["page_size"], app_p["capacity"], app_p["bt_sb"]) == (16 * 2 * 64, 16, 48, 3)
    # several splits: the partial buffers come from the ops layer
    rec.calls.clear()
    A._decode_impl("decode_attention", q, k, v, lens, None, out[:, :, 0], lse, 0.125, False, 3, "auto")
    call = rec.calls[0][1]
    assert call["num_splits"] == 1 and call["split_size"] == 64  # 37 tokens: one 64-token tile
    big_k, big_v = torch.zeros(2, 2, 300, 64, dtype=q.dtype), torch.zeros(2, 2, 300, 64, dtype=q.dtype)
    A._decode_impl("decode_attention", q, big_k, big_v, lens, None, out[:, :, 0], lse, 0.125, False, 3, "auto")
    call = rec.calls[1][1]
    assert (call["num_splits"], call["split_size"]) == (3, 128)
    assert call["part_out"] != 0 and call["part_lse"] != 0


# ---------------------------------------------------------------------------------------------
# GPU

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BACKENDS = ["cuda", "triton"]


def _gpu_case(cuda, dtype, batch, hq, hkv, capacity, d, seed):
    g = torch.Generator(device=cuda).manual_seed(seed)
    q = torch.randn(batch, hq, d, device=cuda, generator=g).to(dtype)
    k = torch.randn(batch, hkv, capacity, d, device=cuda, generator=g).to(dtype)
    v = torch.randn(batch, hkv, capacity, d, device=cuda, generator=g).to(dtype)
    # T, 0, 1, a tile boundary, and random lengths
    pattern = [capacity, 0, 1, 64, 129] + torch.randint(0, capacity + 1, (batch,), generator=g,
                                                        device=cuda).tolist()
    lens = torch.tensor(pattern[:batch], dtype=torch.int32, device=cuda)
    return q, k, v, lens


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (32, 4), (12, 4)])
def test_gpu_vs_reference(cuda, backend, dtype, d, hq, hkv):
    q, k, v, lens = _gpu_case(cuda, dtype, 6, hq, hkv, 517, d, d + hq)
    out = torch.full_like(q, float("nan"))
    y, lse = fray.decode_attention(q, k, v, lens, out=out, return_lse=True, backend=backend)
    torch.cuda.synchronize()
    assert y is out
    e = _expected(q, k, v, lens)
    _check(y, lse, e, dtype, "%s D=%d group=%d" % (backend, d, hq // hkv))
    yn, lsen = fray.decode_attention(q, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), lens,
                                     kv_layout="NHD", return_lse=True, backend=backend)
    _check(yn, lsen, e, dtype, "%s NHD" % backend)
    # one split (the split kernel writes out and lse itself) and many (the combine does)
    for splits in (1, 9):
        ys, lses = fray.decode_attention(q, k, v, lens, return_lse=True, num_splits=splits, backend=backend)
        _check(ys, lses, e, dtype, "%s splits=%d" % (backend, splits))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hq,hkv", [(64, 16), (16, 1), (7, 7), (48, 3)])
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_gpu_groups_and_splits(cuda, backend, hq, hkv, num_splits):
    q, k, v, lens = _gpu_case(cuda, torch.bfloat16, 3, hq, hkv, 3001, 128, hq)
    y, lse = fray.decode_attention(q, k, v, lens, return_lse=True, num_splits=num_splits, backend=backend)
    _check(y, lse, _expected(q, k, v, lens), torch.bfloat16, "%s splits=%s" % (backend, num_splits))
    # deterministic: the same inputs give the same bits
    assert torch.equal(fray.decode_attention(q, k, v, lens, num_splits=num_splits, backend=backend), y)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_long_single_sequence(cuda, backend, dtype):
    q, k, v, _ = _gpu_case(cuda, dtype, 1, 8, 1, 32768, 128, 5)
    lens = torch.tensor([32768 - 5], dtype=torch.int32, device=cuda)
    y, lse = fray.decode_attention(q, k, v, lens, return_lse=True, backend=backend)
    _check(y, lse, _expected(q, k, v, lens), dtype, "%s long" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,batch,hq,hkv,cap,d", [
    (torch.bfloat16, 32, 32, 8, 1111, 128), (torch.float16, 1, 32, 8, 4096, 128),
    (torch.bfloat16, 5, 64, 8, 777, 64), (torch.float16, 3, 20, 2, 333, 256), (torch.float32, 4, 24, 2, 401, 128)])
def test_gpu_cuda_matches_triton(cuda, dtype, batch, hq, hkv, cap, d):
    """Shapes of the performance bars (T scaled down) and awkward ones: both backends are within the
    dtype's tolerance of the reference and of each other."""
    q, k, v, lens = _gpu_case(cuda, dtype, batch, hq, hkv, cap, d, batch + hq + d)
    e = _expected(q, k, v, lens)
    what = "%s B=%d Hq=%d Hkv=%d T=%d D=%d" % (dtype, batch, hq, hkv, cap, d)
    yc, lc = fray.decode_attention(q, k, v, lens, return_lse=True, backend="cuda")
    yt, lt = fray.decode_attention(q, k, v, lens, return_lse=True, backend="triton")
    _check(yc, lc, e, dtype, "cuda " + what)
    _check(yt, lt, e, dtype, "triton " + what)
    assert_close(yc.double(), yt.double(), dtype, "cuda vs triton " + what, scale=e[2])
    assert torch.equal(torch.isinf(lc), torch.isinf(lt))
    finite = ~torch.isinf(lc)
    assert_close(lc[finite], lt[finite].double(), torch.float32, "cuda vs triton lse " + what)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_strided_cache_slice_and_scale(cuda, backend):
    g = torch.Generator(device=cuda).manual_seed(3)
    big_k = torch.randn(3, 2, 900, 128, device=cuda, generator=g).to(torch.bfloat16)
    big_v = torch.randn(3, 2, 900, 128, device=cuda, generator=g).to(torch.bfloat16)
    k, v = big_k[:, :, 40:840], big_v[:, :, 40:840]   # a slice of a larger cache: T = 800
    q = torch.randn(3, 16, 200, device=cuda, generator=g).to(torch.bfloat16)[:, :, 36:164]  # strided q
    lens = torch.tensor([800, 799, 65], dtype=torch.int32, device=cuda)
    out = torch.full((3, 20, 128), float("nan"), device=cuda, dtype=torch.bfloat16)[:, 2:18]  # strided out
    y, lse = fray.decode_attention(q, k, v, lens, out=out, return_lse=True, scale=0.3, backend=backend)
    assert y is out
    _check(y, lse, _expected(q, k, v, lens, 0.3), torch.bfloat16, "%s strided" % backend)


@pytest.mark.gpu
def test_gpu_cuda_unaligned_cache_falls_back_to_triton(cuda):
    # k rows starting 2 elements (4 bytes) into an allocation: not 16-byte aligned for cp.async
    q, k, v, lens = _gpu_case(cuda, torch.float16, 2, 4, 2, 50, 64, 4)
    big = torch.randn(2 * 2 * 50 * 64 + 2, device=cuda).to(torch.float16)
    ku = big[2:].view(2, 2, 50, 64)
    ku.copy_(k)
    with pytest.raises(ValueError, match="backend='cuda' copies K/V rows in 16-byte pieces"):
        fray.decode_attention(q, ku, v, lens, backend="cuda")
    y = fray.decode_attention(q, ku, v, lens)  # auto: Triton
    e = _expected(q, k, v, lens)
    assert_close(y, e[0], torch.float16, "unaligned auto", scale=e[2])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch,hkv,cap,lens,num_splits", [
    (1, 8, 4096, [4001], None),          # B = 1: 16 splits of 256 tokens, one CTA per SM
    (2, 4, 1000, [997, 130], 16),        # 64-token splits
    (3, 2, 1000, [1, 500, 999], 4),      # 256-token splits (4 tiles)
])
def test_gpu_nan_past_lens_short_splits(cuda, backend, dtype, batch, hkv, cap, lens, num_splits):
    """Short splits of contiguous caches request their first tiles before lens arrives (CUDA):
    cache rows past lens[b] holding NaN bits must not reach the output."""
    q, k, v, _ = _gpu_case(cuda, dtype, batch, 4 * hkv, hkv, cap, 128, 40 + batch)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=cuda)
    e = _expected(q, k, v, lens_t)
    kp, vp = k.clone(), v.clone()
    for b, n in enumerate(lens):
        kp[b, :, n:] = float("nan")
        vp[b, :, n:] = float("nan")
    y, lse = fray.decode_attention(q, kp, vp, lens_t, return_lse=True, num_splits=num_splits, backend=backend)
    _check(y, lse, e, dtype, "%s NaN past lens %s" % (backend, lens))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_clamps_bad_lens(cuda, backend):
    # Outside the trust boundary: lens past T reads only T positions, negative lens a zero row.
    q, k, v, _ = _gpu_case(cuda, torch.float16, 2, 8, 2, 300, 128, 6)
    for splits in (None, 1):
        y, lse = fray.decode_attention(q, k, v, torch.tensor([300 + 70, -3], dtype=torch.int32, device=cuda),
                                       return_lse=True, num_splits=splits, backend=backend)
        _check(y, lse, _expected(q, k, v, torch.tensor([300, 0])), torch.float16, "%s clamped" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_cuda_graph_capture_with_new_lens(cuda, backend):
    q, k, v, lens = _gpu_case(cuda, torch.bfloat16, 4, 16, 4, 700, 128, 9)
    out = torch.empty_like(q)
    fray.decode_attention(q, k, v, lens, out=out, backend=backend)  # warm-up (Triton compiles here)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fray.decode_attention(q, k, v, lens, out=out, backend=backend)
    for new in ([700, 1, 0, 300], [5, 699, 64, 65], [0, 0, 0, 1]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        e = _expected(q, k, v, lens)
        assert_close(out, e[0], torch.bfloat16, "%s graph replay lens=%s" % (backend, new), scale=e[2])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_non_default_stream(cuda, backend):
    q, k, v, lens = _gpu_case(cuda, torch.bfloat16, 3, 8, 2, 2000, 128, 12)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = fray.decode_attention(q, k, v, lens, backend=backend)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    e = _expected(q, k, v, lens)
    assert_close(y, e[0], torch.bfloat16, "%s side stream" % backend, scale=e[2])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_torch_compile_fullgraph(cuda, backend):
    q, k, v, lens = _gpu_case(cuda, torch.float16, 3, 8, 2, 300, 64, 11)

    def f(q, k, v, lens):
        y, lse = fray.decode_attention(q * 2.0, k, v, lens, return_lse=True, backend=backend)
        return y + 1.0, lse

    y, lse = torch.compile(f, fullgraph=True)(q, k, v, lens)
    e = _expected(q * 2.0, k, v, lens)
    assert_close(y - 1.0, e[0], torch.float16, "%s compiled" % backend, scale=e[2] + 1.0)
    ey, lse_eager = f(q, k, v, lens)
    assert torch.equal(y, ey) and torch.equal(lse, lse_eager)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_check_indices(cuda, monkeypatch, backend):
    q, k, v, lens = _gpu_case(cuda, torch.float32, 2, 4, 2, 37, 64, 1)
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match=r"lens: values must lie in \[0, T=37\]"):
        fray.decode_attention(q, k, v, torch.tensor([38, 1], dtype=torch.int32, device=cuda), backend=backend)
    fray.decode_attention(q, k, v, lens, backend=backend)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1"):
        with torch.cuda.graph(graph):
            fray.decode_attention(q, k, v, lens, backend=backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_seed_layout_and_empty(cuda, backend):
    q, k, v, lens = _gpu_case(cuda, torch.bfloat16, 2, 4, 4, 100, 128, 2)
    y = fray.decode_attention(q[:, :, None], k, v, lens, backend=backend)  # the seed's Q [B, H, 1, D]
    assert y.shape == (2, 4, 1, 128)
    e = _expected(q, k, v, lens)
    assert_close(y[:, :, 0], e[0], torch.bfloat16, "%s 4-d q" % backend, scale=e[2])
    assert fray.decode_attention(q[:0], k[:0], v[:0], lens[:0], backend=backend).shape == (0, 4, 128)


def test_cuda_plan_scratch_without_a_gpu(monkeypatch):
    """The CUDA decode plan's one scratch allocation: po, pl and (when not returned) lse are
    addresses into it, in that order; a returned lse is the caller's tensor. The extension is a
    recorder, so this runs on CPU tensors."""
    calls = []

    class _Ext:
        @staticmethod
        def decode_split_size(code, d, group, batch, hkv, capacity, num_splits, num_sms, paged):
            return 16  # capacity 37 -> 3 splits

        @staticmethod
        def decode(ptrs, ints, floats, device, stream):
            calls.append(ptrs)

    monkeypatch.setattr(P, "PLANS", P.PlanCache())
    monkeypatch.setattr(A.B, "resolve", lambda *a: "cuda")
    monkeypatch.setattr(A.B, "load_extension", lambda family: _Ext)
    monkeypatch.setattr(A.B, "current_stream", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(B, "num_sms", lambda i: 4)
    q, k, v, _, _, _, lens = A._random_case(torch.bfloat16, "cpu", lens=(37, 16))
    k, v = k[:, :, :37].contiguous(), v[:, :, :37].contiguous()  # capacity 37: 3 splits of 16
    out, lse = torch.empty(2, 4, 1, 64, dtype=q.dtype), torch.empty(2, 4)
    plan = A._decode_plan("decode_attention", q[:, :, None], k, v, None, out, lse, 0.125, False, 0, "auto")
    assert plan.splits == 3 and plan.q_shape == (2, 4, 64)
    plan(q[:, :, None], k, v, lens, None, out, lse)
    ptrs = calls[-1]
    assert ptrs[6] is lse and isinstance(ptrs[7], int) and ptrs[8] == ptrs[7] + 4 * 2 * 4 * 3 * 64
    plan(q[:, :, None], k, v, lens, None, out, None)  # lse not returned: it follows pl in the scratch
    ptrs = calls[-1]
    assert isinstance(ptrs[6], int) and ptrs[6] == ptrs[8] + 4 * 2 * 4 * 3
