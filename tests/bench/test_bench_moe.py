"""The MoE GEMM benchmarks (fused_moe, grouped_gemm, routed_grouped_gemm) without a GPU: shape
names, the torch peers against float64 per-token loops written here on small CPU tensors, the
metric formulas on hand-computed cases, and run() end to end under fake timers."""
import math

import numpy as np
import pytest
import torch

import fray
import fray.bench as fb
from fray.bench import moe as bm

NEW_OPS = ("fused_moe", "grouped_gemm", "routed_grouped_gemm")


# ---------------------------------------------------------------------------------------------
# shapes

def test_shape_names_round_trip():
    fused = [bm.shape_name("fused_moe", s) for s in bm.SHAPES["fused_moe"]]
    for model in ("mixtral", "qwen3", "dsv2lite", "dsv3ep8"):
        for t in (1, 16, 128, 1024, 4096):
            assert "%s:T%d" % (model, t) in fused and "%s:T%d:prepared" % (model, t) in fused
    assert fused[-4:] == ["seed:T4096", "seed:T4096:prepared", "e64h4096i1408k6:T4096",
                          "e64h4096i1408k6:T4096:prepared"]
    assert len(fused) == len(set(fused)) == 44
    assert [bm.shape_name("grouped_gemm", s) for s in bm.SHAPES["grouped_gemm"]] == [
        "G64x384N2816K4096", "G64x384N2816K4096:uneven", "G8x1024N28672K4096"]
    assert [bm.shape_name("routed_grouped_gemm", s) for s in bm.SHAPES["routed_grouped_gemm"]] == [
        "e8h4096n14336k2:T%d" % t for t in (16, 1024, 4096)] + ["e64h2048n1408k6:T%d" % t for t in (16, 1024, 4096)]
    for op in bm.OPS:
        names = [bm.shape_name(op, s) for s in bm.SHAPES[op]]
        assert bm.parse_shapes(op, ",".join(names)) == bm.SHAPES[op], op
    assert bm.parse_shapes("fused_moe", " qwen3:T8:prepared , e4h32i16k2:T5") == [
        bm.Fused("qwen3", 8, True), bm.Fused("e4h32i16k2", 5, False)]
    assert bm.parse_shapes("moe_route", "mixtral:T1") == [("mixtral", 1)]


@pytest.mark.parametrize("op,bad", [
    ("fused_moe", "mixtral"), ("fused_moe", "mixtral:T"), ("fused_moe", "llama:T16"),
    ("fused_moe", "mixtral:T16:graph"),
    ("fused_moe", "mixtral:T0"), ("fused_moe", "e8h64i32k9:T4"), ("fused_moe", "e0h64i32k1:T4"),
    ("fused_moe", "deepseek_v3:T16"), ("fused_moe", "mixtral:T16,"), ("fused_moe", "G64x384N2816K4096"),
    ("grouped_gemm", "G64x384N2816"), ("grouped_gemm", "G64x384N2816K4096:sorted"), ("grouped_gemm", "G0x4N8K8"),
    ("grouped_gemm", "64x384x2816x4096"), ("grouped_gemm", "mixtral:T16"),
    ("routed_grouped_gemm", "e8h4096n14336k2"), ("routed_grouped_gemm", "e2h8n8k3:T4"),
    ("routed_grouped_gemm", "e8h4096n14336k2:T16:prepared"), ("routed_grouped_gemm", "e64h4096i1408k6:T4096"),
    ("moe_route", "qwen3:T16:prepared"), ("moe_dispatch", "dsv3ep8:T1"),
])
def test_parse_shapes_rejects_junk(op, bad):
    with pytest.raises(ValueError, match="shapes"):
        bm.parse_shapes(op, bad)


def test_models():
    as_tuple = {name: (m.experts, m.top_k, m.hidden, m.inter, m.global_experts, m.dtype)
                for name, m in bm.MODELS.items()}
    bf16 = torch.bfloat16
    assert as_tuple == {"mixtral": (8, 2, 4096, 14336, 8, bf16), "qwen3": (128, 8, 2048, 768, 128, bf16),
                        "dsv2lite": (64, 6, 2048, 1408, 64, bf16), "dsv3ep8": (32, 8, 7168, 2048, 256, bf16),
                        "seed": (64, 2, 4096, 14336, 64, torch.float16)}
    assert bm.MODELS["dsv2lite"].route == {"renormalize": False}
    assert bm.MODELS["dsv3ep8"].route == dict(scoring="sigmoid", num_expert_group=8, topk_group=4,
                                              routed_scaling_factor=2.5) and bm.MODELS["dsv3ep8"].bias
    assert bm.model_spec("e64h4096i1408k6") == bm.Model(64, 6, 4096, 1408, 64, bf16, {})


def test_dsv3_rank_inputs_route_over_256_and_keep_32():
    inp = bm.fused_inputs(bm.Fused("dsv3ep8", 64, True), "cpu", weights=(None, None))
    emap = inp["emap"]
    assert emap.dtype == torch.int32 and emap.shape == (256,)
    assert emap[:32].tolist() == list(range(32)) and (emap[32:] == -1).all()
    assert inp["logits"].shape == (64, 256) and inp["route"]["correction_bias"].shape == (256,)
    assert inp["ids"].shape == (64, 8) and int(inp["ids"].max()) >= 32  # routes other ranks serve exist
    routes, hit = bm.route_counts(inp["ids"], emap)
    assert 0 < routes < 64 * 8 and 0 < hit <= 32
    # fixed seeds: the same inputs twice
    again = bm.fused_inputs(bm.Fused("dsv3ep8", 64, True), "cpu", weights=(None, None))
    assert torch.equal(inp["x"], again["x"]) and torch.equal(inp["ids"], again["ids"])


# ---------------------------------------------------------------------------------------------
# the torch peers against float64 loops

def _act64(name, g):
    if name == "silu":
        return g / (1 + np.exp(-g))
    if name == "gelu":
        return 0.5 * g * (1 + np.vectorize(math.erf)(g / math.sqrt(2)))
    return 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))


def _fused64(x, w13, w2, tw, ids, emap, activation):
    """fused_moe per token in float64: sum over ranks of w_tj · W2_e (act(gate) · up)."""
    x, w13, w2, tw = (a.double().numpy() for a in (x, w13, w2, tw))
    inter = w2.shape[2]
    out = np.zeros((x.shape[0], w2.shape[1]))
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if emap is not None:
                e = int(emap[e])
                if e < 0:
                    continue
            g = w13[e] @ x[t]
            out[t] += tw[t, j] * (w2[e] @ (_act64(activation, g[:inter]) * g[inter:]))
    return out


def _route64(logits, k):
    """Softmax top-k renormalised, in float64 (random normal logits: no ties)."""
    z = logits.double().numpy()
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, 1)
    return torch.from_numpy(w / w.sum(1, keepdims=True)), torch.from_numpy(ids.astype(np.int32))


def _nan_grouped_mm(a, b, offs):
    """torch._grouped_mm's 2D x 3D semantics as a loop, the rows past offs[-1] NaN (the CUDA
    kernel leaves them unwritten: the composite must not let them reach the output)."""
    out = torch.full((a.shape[0], b.shape[2]), float("nan"), dtype=a.dtype)
    lo = 0
    for g, hi in enumerate(offs.tolist()):
        out[lo:hi] = a[lo:hi] @ b[g]
        lo = hi
    return out


def _moe_case(t, e_global, e_local, k, h, inter, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e_local, 2 * inter, h, generator=g) / math.sqrt(h)
    w2 = torch.randn(e_local, h, inter, generator=g) / math.sqrt(inter)
    logits = torch.randn(t, e_global, generator=g)
    return x, w13, w2, logits


# an expert map of 8 global experts onto 5 local ones, permuted, 3 dropped
EMAP = torch.tensor([3, -1, 0, 4, -1, 1, -1, 2], dtype=torch.int32)


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("mm", ["torch._grouped_mm", "loop stand-in"])
def test_fused_composites_match_float64_loop(activation, mapped, mm):
    emap = EMAP if mapped else None
    x, w13, w2, logits = _moe_case(13, 8, 5 if mapped else 8, 3, 24, 16, seed=7)
    tw, ids = _route64(logits, 3)
    tw = tw.float()
    want = _fused64(x, w13, w2, tw, ids, emap, activation)
    grouped_mm = None if mm == "torch._grouped_mm" else _nan_grouped_mm
    got = bm.eager_experts(x, w13, w2, tw, ids, emap, activation, grouped_mm)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5)
    # end to end: the composite routes itself (moe_route's torch composite), the same routes
    got = bm.eager_fused_moe(x, w13, w2, logits, 3, emap, activation, grouped_mm)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5)
    if mm == "torch._grouped_mm":  # the per-expert loop takes no grouped-mm function
        got = bm.loop_experts(x, w13, w2, tw, ids, emap, activation)
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5)
    if mapped:  # the map is exercised: some routes dropped (with the stand-in, NaN rows), some kept
        local = EMAP.long()[ids.long()]
        assert (local < 0).any() and (local >= 0).any()


def test_fused_composite_rounds_as_the_op_in_bf16():
    """In bf16 the composite's intermediate roundings (g, h, y, y·w in bf16, the sum in fp32) stay
    within bf16 tolerance of the float64 loop: a missing weight or a mis-sorted route does not."""
    x, w13, w2, logits = _moe_case(9, 8, 8, 2, 32, 16, seed=3)
    tw, ids = _route64(logits, 2)
    tw = tw.float()
    bf = [a.bfloat16() for a in (x, w13, w2)]
    want = _fused64(*[a.float() for a in bf], tw, ids, None, "silu")
    got = bm.eager_experts(*bf, tw, ids)
    assert got.dtype == torch.bfloat16
    np.testing.assert_allclose(got.double().numpy(), want, rtol=3e-2, atol=3e-2)
    unweighted = _fused64(*[a.float() for a in bf], torch.ones_like(tw), ids, None, "silu")
    assert np.abs(unweighted - want).max() > 0.1  # the check above could tell the weights were lost


def test_composites_trace_whole_with_dynamo():
    """fullgraph tracing (what the torch.compile rows need) fails on graph breaks and on
    data-dependent sizes (nonzero, bincount, .item: the host synchronisations the composites must
    not have); AOTAutograd's eager backend runs the traced graph."""
    x, w13, w2, logits = _moe_case(6, 8, 5, 2, 16, 8, seed=1)
    x, w13, w2 = x.bfloat16(), w13.bfloat16(), w2.bfloat16()
    tw, ids = bm.eager_route(logits, 2)
    deepseek = dict(scoring="sigmoid", num_expert_group=4, topk_group=2, correction_bias=torch.rand(8),
                    routed_scaling_factor=2.5)
    for fn, args, kw in ((bm.eager_experts, (x, w13, w2, tw, ids, EMAP), {}),
                         (bm.eager_fused_moe, (x, w13, w2, logits, 2, EMAP), deepseek),
                         (bm.eager_routed_grouped_gemm, (x, w13, logits[:, :5].contiguous(), 2), {})):
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(*args, **kw), fn(*args, **kw), rtol=0, atol=0)
    with pytest.raises(Exception):  # the check has teeth: the per-expert loop's torch.where breaks it
        torch.compile(bm.loop_experts, backend="aot_eager", fullgraph=True)(x, w13, w2, tw, ids)


@pytest.mark.parametrize("mm", ["torch._grouped_mm", "loop stand-in"])
def test_routed_composite_matches_float64_loop(mm):
    x, w, _, logits = _moe_case(11, 6, 6, 2, 16, 10, seed=5)
    w = w[:, :12]  # [E, N, H] with N 12 (the helper built [E, 2I, H])
    tw, ids = _route64(logits, 2)
    xd, wd = x.double().numpy(), w.double().numpy()
    want = np.zeros((11, 12))
    for t in range(11):
        for j in range(2):
            want[t] += float(tw[t, j]) * (wd[int(ids[t, j])] @ xd[t])
    got = bm.eager_routed_grouped_gemm(x, w, logits, 2, None if mm == "torch._grouped_mm" else _nan_grouped_mm)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5)


def test_group_sizes():
    even = bm.group_sizes(bm.Grouped(64, 384, 2816, 4096, False))
    assert even == [384] * 64
    uneven = bm.group_sizes(bm.Grouped(64, 384, 2816, 4096, True))
    assert len(uneven) == 64 and sum(uneven) == 24576 and min(uneven) == 0
    assert uneven.count(0) == 8 and max(uneven) > 2 * 384  # some empty, some far above the mean
    assert uneven == bm.group_sizes(bm.Grouped(64, 384, 2816, 4096, True))  # fixed seed
    assert bm.group_sizes(bm.Grouped(2, 5, 8, 8, True)).count(0) == 1
    assert bm.group_sizes(bm.Grouped(1, 5, 8, 8, True)) == [5]


def test_grouped_gemm_peers_match_float64_loop():
    shape = bm.Grouped(7, 6, 24, 16, True)
    inp = bm.grouped_inputs(shape, "cpu")
    offsets = inp["offsets"]
    assert offsets[0] == 0 and offsets[-1] == 42 and inp["offs"].tolist() == offsets
    assert any(lo == hi for lo, hi in zip(offsets, offsets[1:]))  # an empty group is exercised
    a, b = inp["a"].double().numpy(), inp["b"].double().numpy()
    want = np.concatenate([a[lo:hi] @ b[g].T for g, (lo, hi) in enumerate(zip(offsets, offsets[1:]))])
    fns = bm.grouped_impls(inp, "cpu")
    assert list(fns) == ["fray.triton", "torch.eager", "torch.loop"]
    for name in ("torch.eager", "torch.loop"):
        got = fns[name]()
        assert got.dtype == torch.bfloat16 and got.shape == (42, 24)
        np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-2, atol=2e-2, err_msg=name)
    with pytest.raises(Exception):  # fray on CPU tensors with backend="triton": an error row on a GPU-less run
        fns["fray.triton"]()


@pytest.mark.skipif(not all(hasattr(fray, op) for op in NEW_OPS), reason="the ops are not in this fray yet")
def test_fray_calls_and_peers_agree_on_the_reference(monkeypatch):
    """The fray.* rows' calls (the same arguments, backend="reference": CPU tensors run Fray's
    float64 reference) against the torch peers, in bf16, both fused variants with an expert map
    (a small DeepSeek-style rank: sigmoid, groups, bias, 4 local of 16), the grouped and routed
    GEMMs."""
    monkeypatch.setattr(bm, "_fray_backends", lambda op, device: ("reference",))
    monkeypatch.setitem(bm.MODELS, "tinyep", bm.Model(4, 4, 32, 16, 16, torch.bfloat16, dict(
        scoring="sigmoid", num_expert_group=4, topk_group=2, routed_scaling_factor=2.5), bias=True))
    weights = None
    for prepared in (False, True):
        inp = bm.fused_inputs(bm.Fused("tinyep", 9, prepared), "cpu", weights)
        weights = inp["w13"], inp["w2"]
        routes, _ = bm.route_counts(inp["ids"], inp["emap"])
        assert 0 < routes < 9 * 4  # some routes dropped by the map, some kept
        fns = bm.fused_impls(inp, compile_fn=lambda fn, fullgraph: fn, device="cpu")
        assert list(fns) == ["fray.reference", "torch.eager", "torch.compile", "torch.loop"]
        want = fns["fray.reference"]().float()
        for name in ("torch.eager", "torch.loop"):
            torch.testing.assert_close(fns[name]().float(), want, rtol=1e-2, atol=1e-2, msg=name)
    inp = bm.grouped_inputs(bm.Grouped(5, 6, 16, 8, True), "cpu")
    fns = bm.grouped_impls(inp, "cpu")
    for name in ("torch.eager", "torch.loop"):
        torch.testing.assert_close(fns[name]().float(), fns["fray.reference"]().float(), rtol=1e-2, atol=1e-2)
    inp = bm.routed_inputs(bm.Routed(6, 16, 8, 2, 7), "cpu")
    fns = bm.routed_impls(inp, "cpu")
    torch.testing.assert_close(fns["torch.eager"]().float(), fns["fray.reference"]().float(), rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------------------------------------
# metrics

def test_metrics_hand_computed():
    # 3 tokens, top-2 of 6 global experts; the map keeps global 0, 1, 2 as local 1, 0, 2
    ids = torch.tensor([[0, 1], [1, 3], [5, 0]], dtype=torch.int32)
    emap = torch.tensor([1, 0, 2, -1, -1, -1], dtype=torch.int32)
    assert bm.route_counts(ids, emap) == (4, 2)  # routes 0,1,1,0 kept; local experts {0, 1}
    assert bm.route_counts(ids) == (6, 4)
    spec = bm.Model(3, 2, 4, 3, 6, torch.bfloat16, {})  # H 4, I 3
    assert bm.fused_flops(spec, 4) == 2 * 4 * (4 * 6 + 3 * 4) == 288
    assert bm.fused_bytes(spec, 3, 2) == 2 * (6 * 4 + 4 * 3) * 2 == 144
    assert bm.fused_bytes(spec, 16, 2) == 144 and bm.fused_bytes(spec, 17, 2) is None
    assert bm.fused_bytes(spec._replace(dtype=torch.float32), 3, 2) == 288
    assert bm.grouped_flops(bm.Grouped(3, 2, 5, 7, True), [0, 2, 2, 6]) == 2 * 6 * 5 * 7 == 420
    assert bm.grouped_flops(bm.Grouped(3, 2, 5, 7, True), [1, 2, 2, 6]) == 350
    r = bm.Routed(8, 4, 5, 2, 3)  # E8 H4 N5 k2 T3
    assert bm.routed_flops(r) == 2 * 3 * 2 * 4 * 5 == 240
    assert bm.routed_bytes(r, 3) == 3 * 5 * 4 * 2 == 120 and bm.routed_bytes(r._replace(tokens=17), 3) is None


def test_loop_left_out_only_where_slow():
    fused = {(s.model, s.tokens) for s in bm.SHAPES["fused_moe"]}
    assert all(bm.loop_ms(bm.model_spec(m), t) <= bm.LOOP_LIMIT_MS for m, t in fused)
    assert bm.loop_ms(bm.MODELS["qwen3"], 4096) > bm.loop_ms(bm.MODELS["qwen3"], 1) > 128 * bm.LOOP_EXPERT_US / 1e3

    def impls(model, t):
        inp = dict(spec=bm.model_spec(model), shape=bm.Fused(model, t, True), x=None, w13=None, w2=None,
                   emap=None, route={}, logits=None, tw=None, ids=None)
        return bm.fused_impls(inp, compile_fn=lambda fn, fullgraph: fn, device="cpu")

    assert list(impls("qwen3", 4096)) == ["fray.triton", "torch.eager", "torch.compile", "torch.loop"]
    big = "e1024h7168i2048k8"  # 1024 experts: ~60 ms of per-expert synchronisations alone
    assert bm.loop_ms(bm.model_spec(big), 1) > bm.LOOP_LIMIT_MS
    assert "torch.loop" not in impls(big, 1)


def test_fray_cuda_row_only_where_fray_reports_the_backend(monkeypatch):
    from fray import backend as B
    assert bm._fray_backends("fused_moe", "cpu") == ("triton",)
    assert bm._fray_backends("moe_route", "cuda") == ("triton",)  # no CUDA kernel of its own
    monkeypatch.setattr(B, "available", lambda op, family, device: {"cuda": None, "triton": None})
    assert bm._fray_backends("fused_moe", "cuda") == ("cuda", "triton")


# ---------------------------------------------------------------------------------------------
# run() end to end, fake timers

def _fake_timers(monkeypatch):
    monkeypatch.setattr(fb, "time_us", lambda fn: (fn(), 10.0)[1])
    monkeypatch.setattr(fb, "graph_us", lambda fn: (fn(), 2.0)[1])
    monkeypatch.setattr(fb, "environment", lambda: {"device": "fake"})


def test_run_end_to_end_on_cpu(monkeypatch):
    _fake_timers(monkeypatch)
    rec = fb.Recorder()
    for op, shapes in (("fused_moe", "e4h32i16k2:T5,e4h32i16k2:T5:prepared"), ("grouped_gemm", "G3x4N16K8:uneven"),
                       ("routed_grouped_gemm", "e4h16n8k2:T5")):
        bm.run(op, rec, shapes=bm.parse_shapes(op, shapes), device="cpu", compile_fn=lambda fn, fullgraph: fn)
    rows = {}
    for r in rec.records:
        rows.setdefault((r["op"], r["shape"]), []).append(r)
    shapes = (("fused_moe", "e4h32i16k2:T5"), ("fused_moe", "e4h32i16k2:T5:prepared"),
              ("grouped_gemm", "G3x4N16K8:uneven"), ("routed_grouped_gemm", "e4h16n8k2:T5"))
    assert set(rows) == {(op, s + v) for op, s in shapes for v in ("", ":graph")}
    impls = {key: [r["impl"] for r in rs] for key, rs in rows.items()}
    assert impls[("fused_moe", "e4h32i16k2:T5")] == ["fray.triton", "torch.eager", "torch.compile", "torch.loop"]
    assert impls[("grouped_gemm", "G3x4N16K8:uneven")] == ["fray.triton", "torch.eager", "torch.loop"]
    assert impls[("routed_grouped_gemm", "e4h16n8k2:T5")] == [
        "fray.triton", "fray.triton:atomic", "fray.triton:staged", "fray.triton:scatter", "torch.eager"]
    for r in rec.records:
        assert r["dtype"] == "bf16"
        if r["impl"].startswith("fray."):  # Triton refuses CPU tensors (or the op is not there yet)
            assert r["us"] is None and r["note"].startswith("error:"), r
        else:
            assert r["us"] in (10.0, 2.0) and r["rounds"], r
    fused = [r for r in rec.records if r["op"] == "fused_moe" and r["impl"] == "torch.eager" and r["us"] == 10.0]
    assert len(fused) == 2 and all(r["routes"] == 10 and 1 <= r["experts_hit"] <= 4 for r in fused)
    hit = fused[0]["experts_hit"]
    assert fused[0]["gbps"] == round(hit * 3 * 32 * 16 * 2 / 10.0 / 1e3, 1)  # T <= 16: the weight stream
    with pytest.raises(ValueError, match="op"):
        bm.run("moe_gemm", rec)


def test_cli_finds_the_benchmarks_in_bench_moe():
    from fray import cli
    names = cli._bench_ops()
    assert all(names[op] == "moe" for op in NEW_OPS + ("moe_route", "moe_dispatch"))


def test_host_rows_of_the_moe_gemms(monkeypatch):
    """bench/host's rows for the three ops (recorded once fray.OPS has them; set here so the rows are
    built and run on the CPU now)."""
    from fray.bench import host as bh
    for op in NEW_OPS:
        monkeypatch.setitem(fray.OPS, op, "moe")
    rec = fb.Recorder()

    def timer(fn):
        fn()
        return 4.0

    bh.run("host", rec, device="cpu", timer=timer)
    rows = {(r["op"], r["impl"]): r for r in rec.records if r["op"] in NEW_OPS}
    assert set(rows) == {(op, impl) for op in NEW_OPS for impl in ("fray.cuda", "fray.triton")} | {
        ("fused_moe", "torch.eager"), ("grouped_gemm", "torch.builtin"), ("routed_grouped_gemm", "torch.eager")}
    assert rows[("fused_moe", "torch.eager")]["shape"] == "qwen3:T8:prepared:host"
    assert rows[("grouped_gemm", "torch.builtin")]["shape"] == "G8x4N1024K1024:host"
    assert rows[("routed_grouped_gemm", "torch.eager")]["shape"] == "e8h1024n1024k2:T8:host"
    for (op, impl), r in rows.items():
        if impl.startswith("fray."):
            assert r["us"] is None and r["note"].startswith("error:"), r
        else:
            assert r["us"] == 4.0 and len(r["rounds"]) == 3, r
