"""fray._plan without a GPU: signature keys, the bounded plan cache, the binder call a CUDA plan
makes, and each converted family's plan slots against its launcher's documented order (the
extension is replaced by a recorder, CPU tensors stand in for CUDA ones)."""
import numpy as np
import pytest
import torch

import fray
from fray import _plan as P
from fray import backend as B


def _address(t):
    return 0 if t is None else t if isinstance(t, int) else t.data_ptr()


class _Recorder:
    """Records launcher calls with the ptrs slots as the binder reads them (tensors -> data_ptr())."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def launch(ptrs, *rest):
            self.calls.append((name, tuple(map(_address, ptrs))) + rest)
        return launch


@pytest.fixture
def fake_cuda(monkeypatch):
    """Plans built for CPU tensors as if they were on cuda:0, launching into a recorder."""
    rec = _Recorder()
    monkeypatch.setattr(B, "resolve", lambda *a: "cuda")
    monkeypatch.setattr(B, "load_extension", lambda family: rec)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(P, "_raw_stream", lambda index: 4321)
    P.PLANS.clear()
    yield rec
    P.PLANS.clear()


def test_signature_holds_layouts_scalar_types_and_the_override(monkeypatch):
    x = torch.empty(4, 8)
    monkeypatch.delenv("FRAY_BACKEND", raising=False)
    key = P.signature("op", "auto", (x, None), (1e-6, True))
    assert key == P.signature("op", "auto", (torch.empty(4, 8), None), (1e-6, True))
    assert key != P.signature("op", "auto", (x.t(), None), (1e-6, True))            # strides
    assert key != P.signature("op", "auto", (x.half(), None), (1e-6, True))         # dtype
    assert key != P.signature("op", "auto", (x, x), (1e-6, True))                    # an optional tensor
    assert key != P.signature("op", "auto", (x, None), (1e-6, 1))                    # True is not 1
    assert P.signature("op", "auto", (x,), (1,)) != P.signature("op", "auto", (x,), (1.0,))
    monkeypatch.setenv("FRAY_BACKEND", "triton")
    assert key != P.signature("op", "auto", (x, None), (1e-6, True))                 # FRAY_BACKEND
    for odd in (P.signature("op", "auto", (np.zeros(3),)), P.signature("op", "auto", (x,), ([1.0],))):
        assert P.PLANS.get(odd) is None and P.PLANS.put(odd, "plan") == "plan" and P.PLANS.get(odd) is None
    assert P.PLANS.get(None) is None


def test_plan_cache_is_size_capped():
    cache = P.PlanCache(maxsize=2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert len(cache) == 2 and cache.get("a") is None and cache.get("b") == 2 and cache.get("c") == 3
    assert cache.put(None, 4) == 4 and len(cache) == 2


def test_cuda_plan_calls_the_binder_with_addresses_slots_and_the_stream(fake_cuda):
    x, y = torch.empty(3), torch.empty(3)
    plan = P.CudaPlan(fake_cuda.launch, (1, 2.0), (0.5,), torch.device("cuda", 1))
    plan((x, None, y))
    assert fake_cuda.calls == [("launch", (x.data_ptr(), 0, y.data_ptr()), (1, 2), (0.5,), 1, 4321)]


def test_norm_plans_follow_the_launcher_slots(fake_cuda):
    from fray.ops import norm
    x = torch.empty(6, 16, dtype=torch.bfloat16)[:, :8]  # row stride 16
    w, r = torch.empty(8), torch.empty(3, 2, 8, dtype=torch.bfloat16).view(6, 8)
    out, s = torch.empty(6, 8, dtype=torch.bfloat16), torch.empty(6, 8, dtype=torch.bfloat16)
    norm._rmsnorm_plan(x, w, out, None, None, 1e-6, 1.0, "auto")((x, w, out, None, None))
    norm._rmsnorm_plan(x, w, out, r, s, 1e-5, 0.0, "auto")((x, w, out, r, s))
    norm._layernorm_plan(x, w, None, out, 1e-5, "auto")((x, w, None, out))
    (n1, p1, i1, f1, d1, s1), (n2, p2, i2, f2, _, _), (n3, p3, i3, f3, _, _) = fake_cuda.calls
    assert n1 == n2 == "rmsnorm" and n3 == "layernorm" and (d1, s1) == (0, 4321)
    assert p1 == (x.data_ptr(), w.data_ptr(), out.data_ptr(), 0, 0)
    assert i1 == (16, 8, 0, 0, 6, 8, 2, 0) and f1 == (1e-6, 1.0)
    assert p2 == (x.data_ptr(), w.data_ptr(), out.data_ptr(), r.data_ptr(), s.data_ptr())
    assert i2 == (16, 8, 8, 8, 6, 8, 2, 0) and f2 == (1e-5, 0.0)
    assert p3 == (x.data_ptr(), w.data_ptr(), 0, out.data_ptr()) and i3 == (16, 8, 6, 8, 2, 0) and f3 == (1e-5,)
    assert norm._rmsnorm_plan(x[:0], w, out[:0], None, None, 1e-6, 0.0, "auto") is P.NOOP


def test_activation_softmax_and_elementwise_plans_follow_the_launcher_slots(fake_cuda):
    from fray.ops import activation, elementwise, softmax
    x = torch.empty(5, 2 * 12, dtype=torch.float16)
    out = torch.empty(5, 12, dtype=torch.float16)
    activation._act_plan("gelu_mul", x, None, out, "tanh", "auto")((x, None, out))
    up = torch.empty(5, 12, dtype=torch.float16)
    activation._act_plan("silu_mul", out, up, out, "none", "auto")((out, up, out))
    logits, probs = torch.empty(2, 3, 7), torch.empty(2, 3, 7, dtype=torch.bfloat16)
    softmax._softmax_plan(logits, probs, 2, 0.5, "auto")((logits, probs))
    m, lse = torch.empty(2, 3), torch.empty(2, 3)
    softmax._online_softmax_plan(logits, logits, "auto")((logits, logits, m, lse))
    a = torch.empty(10)
    elementwise._vector_add_plan(a, "auto")((a, a, a))
    act1, act2, sm, online, add = fake_cuda.calls
    assert act1[1:4] == ((x.data_ptr(), 0, out.data_ptr()), (24, 24, 12, 5, 12, 2, 1), ())
    assert act2[1:4] == ((out.data_ptr(), up.data_ptr(), out.data_ptr()), (12, 12, 12, 5, 12, 0, 1), ())
    assert sm[0] == "softmax" and sm[1:4] == ((logits.data_ptr(), probs.data_ptr(), 0, 0), (7, 7, 6, 7, 0, 2), (0.5,))
    assert online[1:4] == ((logits.data_ptr(),) * 2 + (m.data_ptr(), lse.data_ptr()), (7, 7, 6, 7, 0, 0), (1.0,))
    assert add[1:4] == ((a.data_ptr(),) * 3, (10, 0), ())


def test_public_calls_launch_from_a_cached_plan(fake_cuda):
    """A hit skips validation and launches; the key is the public function's own (a plan put under
    it by hand stands in for the first, validating call that a CPU tensor never makes)."""
    from fray.ops import elementwise, norm
    x, w = torch.empty(4, 8), torch.empty(8)
    key = P.signature("rmsnorm", "cuda", (x, w, None), (1e-6, 0.0))
    P.PLANS.put(key, norm._rmsnorm_plan(x, w, torch.empty(4, 8), None, None, 1e-6, 0.0, "cuda"))
    y = fray.rmsnorm(x, w, 1e-6, backend="cuda")
    assert y.shape == x.shape and y.is_contiguous()
    assert fake_cuda.calls[-1][1] == (x.data_ptr(), w.data_ptr(), y.data_ptr(), 0, 0)
    # a hit with different scalar types is a miss: eps=True still raises on the CPU path
    with pytest.raises(TypeError, match="eps: expected a float"):
        fray.rmsnorm(x, w, True, backend="cuda")
    # vector_add checks per call what no plan can hold: a partial overlap of out with a or b
    buf = torch.empty(12)
    a, b, out = buf[:8], torch.empty(8), buf[2:10]
    P.PLANS.put(P.signature("vector_add", "cuda", (a, b, out)), elementwise._vector_add_plan(a, "cuda"))
    with pytest.raises(ValueError, match="out: overlaps a without being a itself"):
        fray.vector_add(a, b, out=out, backend="cuda")
    fray.vector_add(a, b, out=a, backend="cuda")
    assert fake_cuda.calls[-1][1] == (a.data_ptr(), b.data_ptr(), a.data_ptr())



def test_quantized_gemms_launch_from_a_cached_plan_keyed_by_alignment(fake_cuda):
    """scaled_gemm and w8a16_gemm validate once per signature: a hit launches the cached plan
    (out allocated in out_dtype / x's dtype); the key holds whether any TMA operand's base is off
    16 bytes (what picks the backend and no shape holds), so a misaligned view of the same shape
    misses and takes the full path (here the CPU reference)."""
    from fray.ops import quant as Q
    calls = []

    def plan(*tensors):
        calls.append(tensors)
    buf = torch.zeros(2, 64 + 16, dtype=torch.int8)
    a, b = buf[:, :64], torch.zeros(4, 64, dtype=torch.int8)
    sa, sb = torch.ones(2, 1), torch.ones(4, 1)
    assert P.misaligned(a, b, None) is False and P.misaligned(buf[:, 1:65]) is True
    assert P.misaligned(np.zeros(2)) is None
    P.PLANS.put(P.signature("scaled_gemm", "auto", (a, b, sa, sb, None, None), (torch.float16, False, False)), plan)
    y = fray.scaled_gemm(a, b, sa, sb, out_dtype=torch.float16)
    assert len(calls) == 1 and calls[0][:5] == (a, b, sa, sb, None) and calls[0][5] is y
    assert y.shape == (2, 4) and y.dtype == torch.float16
    # the same shapes and strides 1 byte off: a miss, the CPU reference runs (exact zeros)
    c = fray.scaled_gemm(buf[:, 1:65], b, sa, sb, out_dtype=torch.float16)
    assert len(calls) == 1 and torch.equal(c, torch.zeros(2, 4, dtype=torch.float16))
    # a scalar of another type is another signature: fast_accum=1 still raises
    with pytest.raises(TypeError, match="fast_accum: expected a bool"):
        fray.scaled_gemm(a, b, sa, sb, out_dtype=torch.float16, fast_accum=1)
    x, w, ws = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(5, 64, dtype=torch.int8), torch.ones(5)
    P.PLANS.put(P.signature("w8a16_gemm", "auto", (x, w, ws, None, None), (False,)), plan)
    z = fray.w8a16_gemm(x, w, ws)
    assert len(calls) == 2 and calls[1][:4] == (x, w, ws, None) and calls[1][4] is z
    assert z.shape == (3, 5) and z.dtype == torch.bfloat16
    # the plan a full call returns is what its key is given: a trivial product (K = 0) too
    out = torch.full((2, 4), 7.0, dtype=torch.float16)
    Q._trivial_plan(a[:, :0], b[:, :0], sa, sb, None, out)
    assert torch.equal(out, torch.zeros(2, 4, dtype=torch.float16))


def test_quantize_cuda_plan_follows_the_launcher_slots(fake_cuda):
    """cuda/quant/quant.h: ptrs x, q, scale; ints x / q row strides, the scale's two strides, rows,
    cols, group (0 token, 128 block), out code, static, dtype; the strides read at the first call,
    new addresses at every call."""
    from fray.ops import quant as Q
    x = torch.empty(5, 300, dtype=torch.bfloat16)[:, :200]
    q, s = torch.empty(5, 200, dtype=torch.int8), torch.empty(5, 1)
    token = Q._quantize_launch(x, "token", None, torch.int8, False, "cuda")
    token((x, q, s, None))
    qb = torch.empty(5, 208, dtype=torch.float8_e4m3fn)[:, :200]
    sb = Q.mn_major_view(5, 2, lambda shape: torch.empty(shape))
    Q._quantize_launch(x, "block", (1, 128), torch.float8_e4m3fn, True, "cuda")((x, qb, sb, None))
    q2, s2 = torch.empty_like(q), torch.empty_like(s)
    token((x, q2, s2, None))
    (n1, p1, i1, f1, _, _), (n2, p2, i2, _, _, _), (_, p3, i3, _, _, _) = fake_cuda.calls
    assert n1 == n2 == "quantize" and f1 == ()
    assert p1 == (x.data_ptr(), q.data_ptr(), s.data_ptr()) and i1 == (300, 200, 1, 1, 5, 200, 0, 0, 0, 2)
    assert p2 == (x.data_ptr(), qb.data_ptr(), sb.data_ptr()) and i2 == (300, 208, 1, 8, 5, 200, 128, 1, 1, 2)
    assert p3 == (x.data_ptr(), q2.data_ptr(), s2.data_ptr()) and i3 == i1
    for granularity, block in (("block", (128, 128)), ("tensor", None), ("channel", None)):
        with pytest.raises(ValueError, match="backend='cuda'"):
            Q._quantize_launch(x, granularity, block, torch.int8, False, "cuda")


def test_rope_plan_follows_the_launcher_slots_with_the_offset_last(fake_cuda):
    from fray.ops import rope
    qkv = torch.empty(3, 6, 16, dtype=torch.bfloat16)
    q, k = qkv[:, :4], qkv[:, 4:]
    table = torch.empty(32, 16)
    plan = rope._rope_plan(q, k, q, k, None, table, None, 32, 16, 1e4, True, "auto")
    rope._rope_launch(plan, q, k, q, k, None, 7, table, None, 32)
    other = torch.empty(32, 16)  # a later call's own table, not the first call's
    rope._rope_launch(plan, q, k, q, k, None, 9, other, None, 32)
    (name, ptrs, ints, floats, dev, stream), second = fake_cuda.calls
    assert name == "rope" and (dev, stream) == (0, 4321) and floats == ()
    assert ptrs == (q.data_ptr(), q.data_ptr(), k.data_ptr(), k.data_ptr(), 0, table.data_ptr(), 0)
    assert ints == (96, 16, 96, 16, 96, 16, 96, 16, 0, 0, 16, 3, 4, 2, 16, 16, 1, 2, 7)
    assert second[2][-1] == 9 and second[2][:-1] == ints[:-1] and second[1][5] == other.data_ptr()


def test_topk_and_argmax_follow_the_launcher_slots(fake_cuda):
    from fray.ops import sampling
    x = torch.empty(3, 40, dtype=torch.bfloat16)[:, :32]  # row stride 40
    values, indices = torch.empty(3, 5, dtype=torch.bfloat16), torch.empty(3, 5, dtype=torch.int64)
    sampling._topk_cuda(x, values, indices, None, 5, False, True, 3, 32)
    out = torch.empty(3, dtype=torch.int64)
    sampling._argmax_plan(x, "auto")((x, out))
    (n1, p1, i1, f1, d1, s1), (n2, p2, i2, f2, d2, s2) = fake_cuda.calls
    assert (n1, n2) == ("topk", "argmax") and (d1, s1) == (d2, s2) == (0, 4321)
    assert p1 == (x.data_ptr(), values.data_ptr(), indices.data_ptr(), 0)
    assert i1 == (40, 2, 3, 32, 5, False, True) and f1 == ()
    assert p2 == (x.data_ptr(), out.data_ptr()) and i2 == (40, 2, 3, 32) and f2 == ()
    assert sampling._argmax_plan(x[:0], "auto") is P.NOOP


def test_sampling_plans_follow_the_launcher_slots(fake_cuda):
    """A tensor parameter fills its pointer slot with 0 in its value slot; a scalar one leaves the
    pointer 0 and fills the value (cuda/sampling/sampling.h)."""
    from fray.ops import sampling
    logits = torch.empty(4, 48)[:, :40]  # row stride 48
    top_k, seeds = torch.full((4,), 7, dtype=torch.int64), torch.arange(4)
    rep = torch.full((4,), 1.3)
    params = (0.7, top_k, 0.9, 0.05, seeds, 11)
    pen = (rep, 0.25, 0.5)
    tokens, logprobs = torch.empty(4, dtype=torch.int64), torch.empty(4)
    ids, offs = torch.zeros(6, dtype=torch.int32), torch.zeros(5, dtype=torch.int64)
    sampling._sample_impl(logits, params, tokens, logprobs, "auto")
    sampling._penalties_impl(torch.empty(4, 40), ids, offs, pen, "auto")
    sampling._decode_impl(torch.empty(4, 40), ids, offs, pen, params, tokens, logprobs, "auto")
    (n1, p1, i1, f1, d1, s1), (n2, p2, i2, f2, _, _), (n3, p3, i3, f3, d3, s3) = fake_cuda.calls
    assert (n1, n2, n3) == ("sample", "apply_penalties", "decode_step") and (d1, s1) == (d3, s3) == (0, 4321)
    ptr = lambda *ts: tuple(0 if t is None else t.data_ptr() for t in ts)  # noqa: E731
    sample_ptrs = ptr(None, top_k, None, None, seeds, None, tokens, logprobs)
    assert p1 == (logits.data_ptr(),) + sample_ptrs
    assert i1 == (48, 0, 4, 40, 0, 0, 11) and f1 == (0.7, 0.9, 0.05)
    assert p2[1:] == ptr(ids, offs, rep, None, None)
    assert i2 == (40, 0, 4, 40, False, 6, True) and f2 == (0, 0.25, 0.5)
    assert p3[1:] == ptr(ids, offs, rep, None, None) + sample_ptrs
    assert i3 == (40, 0, 4, 40, False, 6, True, 0, 0, 11) and f3 == (0, 0.25, 0.5, 0.7, 0.9, 0.05)


def test_triton_plan_call_forms(monkeypatch):
    """Every family builds its Triton plans as TritonPlan(fn, device) or TritonPlan(fn, device,
    args); a plan calls fn(*tensors, *args) under the device guard. (The plans of the GPU path are
    only reached with CUDA tensors, so this pins the constructor the call sites use.)"""
    import contextlib

    from fray import _plan as P
    seen = []
    monkeypatch.setattr(P.torch.cuda, "device", lambda d: (seen.append(d), contextlib.nullcontext())[1])
    calls = []
    P.TritonPlan(lambda *a: calls.append(a), "dev0")((1, 2))
    P.TritonPlan(lambda *a: calls.append(a), "dev1", (3, 4))((1,))
    assert calls == [(1, 2), (1, 3, 4)] and seen == ["dev0", "dev1"]
