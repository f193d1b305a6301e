"""The attention and sampling benchmarks without a GPU: shape tables, the peers' composites
against Fray's reference on small CPU tensors, and run() end to end under fake timers."""
import numpy as np
import pytest
import torch

import fray
import fray.bench as fb
from fray.bench import attention as ba
from fray.bench import sampling as bs
from fray.bench.main import run_op  # noqa: F401  (the module defines the flags run_op reads)


def test_shape_names_and_parse_round_trip():
    names = {op: [ba.shape_name(s) for s, _ in ba.SHAPES[op]] for op in ba.OPS}
    assert names["decode_attention"] == ["B32Hq32Hkv8T4096D128", "B1Hq32Hkv8T4096D128", "B64Hq64Hkv8T8192D128",
                                         "B64Hq32Hkv8Tvar8192D128"]
    assert "B64Hq32Hkv8Tvar8192D128P64" in names["paged_decode_attention"]
    assert len(names["paged_decode_attention"]) == 8
    assert names["kv_append_paged"] == ["B64Hkv8D128P16"]
    for op in ba.OPS:
        assert ba.parse_shapes(op, ",".join(names[op])) == ba.SHAPES[op]
    topk = [bs.shape_name(s) for s, _ in bs.SHAPES["topk"]]
    assert topk[-1] == "64x131072k50:unsorted" and topk.count("64x131072k50") == 2
    assert [bs.shape_name(s) for s, _ in bs.SHAPES["sample_topp"]] == [
        "64x131072", "64x131072:peaked", "64x131072:flat", "256x152064", "256x152064:peaked", "256x152064:flat"]
    assert bs.parse_shapes("topk", "64x131072k50:bf16,64x131072k50:unsorted") == [
        (bs.TopK(64, 131072, 50, True), torch.bfloat16), (bs.TopK(64, 131072, 50, False), torch.float32)]
    for bad_op, bad in (("kv_append", "B64Hkv8D128P16"), ("paged_decode_attention", "B1Hq32Hkv8T4096D128"),
                        ("decode_attention", "64x128")):
        with pytest.raises(ValueError, match="shapes"):
            ba.parse_shapes(bad_op, bad)
    with pytest.raises(ValueError, match="shapes"):
        bs.parse_shapes("topk", "64x131072")


@pytest.mark.parametrize("name", ["B2Hq4Hkv2T48D64", "B3Hq8Hkv2Tvar64D64"])
def test_decode_peers_match_reference(name):
    (spec, _), = ba.parse_shapes("decode_attention", name)
    inp = ba.decode_inputs(spec, torch.float32, "cpu")
    fns = ba.impls("decode_attention", spec, inp)
    want = fray.decode_attention(inp["q"], inp["k"], inp["v"], inp["lens"], backend="reference")
    peers = [n for n in fns if not n.startswith("fray.")]
    assert peers == (["torch.builtin", "torch.builtin:additive"] if spec.varlen else ["torch.builtin"])
    for n in peers:
        torch.testing.assert_close(fns[n]()[:, :, 0], want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="CUDA"):  # on the GPU: the timed call; here an error row
        fns["fray.cuda"]()
    n, extra = ba.nbytes("decode_attention", spec, torch.bfloat16, inp)
    assert n == 2 * int(inp["lens"].sum()) * spec.hkv * spec.head_dim * 2
    assert bool(extra) == spec.varlen


def test_nhd_rows_on_the_b32_shape_only():
    spec = ba.Decode(32, 4, 2, 16, 64, False, None)
    fns = ba.impls("decode_attention", spec, ba.decode_inputs(spec, torch.float32, "cpu"))
    assert {"fray.cuda:NHD", "fray.triton:NHD"} <= set(fns)


@pytest.mark.parametrize("name", ["B2Hq4Hkv2T64D64P16", "B3Hq4Hkv1Tvar64D64P16"])
def test_paged_peers_match_reference(name):
    (spec, _), = ba.parse_shapes("paged_decode_attention", name)
    inp = ba.decode_inputs(spec, torch.float32, "cpu")
    fns = ba.impls("paged_decode_attention", spec, inp)
    want = fray.paged_decode_attention(inp["q"], inp["k_pages"], inp["v_pages"], inp["block_table"], inp["lens"],
                                       backend="reference")
    assert sorted(inp["block_table"].flatten().tolist()) == list(range(spec.batch * spec.capacity // spec.page))
    for n in ("torch.builtin", "torch.eager"):
        torch.testing.assert_close(fns[n]()[:, :, 0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op,name", [("kv_append", "B3Hkv2T32D64"), ("kv_append_paged", "B3Hkv2T32D64P16")])
def test_append_peers_match_reference(op, name):
    (spec, _), = ba.parse_shapes(op, name)
    inp = ba.append_inputs(spec, torch.float32, "cpu")
    k0, v0 = inp["k_cache"].clone(), inp["v_cache"].clone()
    ba.impls(op, spec, inp)["torch.eager"]()
    args = (k0, v0, inp["k_new"], inp["v_new"], inp["lens"])
    if op == "kv_append":
        fray.kv_append(*args, backend="reference")
    else:
        fray.kv_append_paged(k0, v0, inp["block_table"], *args[2:], backend="reference")
    assert torch.equal(inp["k_cache"], k0) and torch.equal(inp["v_cache"], v0)
    assert not torch.equal(k0, ba.append_inputs(spec, torch.float32, "cpu")["k_cache"])  # something was written


def test_topk_and_argmax_peers():
    for spec, dtype in bs.parse_shapes("topk", "3x300k7,3x300k7:unsorted:bf16"):
        fns = bs.impls("topk", spec, bs.inputs("topk", spec, dtype, "cpu"))
        vals, _ = fray.topk(bs.inputs("topk", spec, dtype, "cpu")["x"], spec.k, backend="reference")
        assert torch.equal(fns["torch.builtin"]()[0], vals)
        assert ("torch.builtin:unsorted" in fns) == (not spec.sorted)
    (spec, dtype), = bs.parse_shapes("argmax", "3x300")
    x = bs.inputs("argmax", spec, dtype, "cpu")["x"]
    assert torch.equal(bs.impls("argmax", spec, {"x": x})["torch.builtin"](), fray.argmax(x, backend="reference"))


def _allowed(x, temperature, top_k, top_p):
    """Per row, the token ids a top-k then top-p filter keeps (float64)."""
    keep = []
    for row in x.double().numpy() / temperature:
        order = np.argsort(-row, kind="stable")[:top_k or None]
        p = np.exp(row[order] - row[order[0]])
        p /= p.sum()
        before = np.cumsum(p) - p
        keep.append(set(order[before <= top_p + 1e-6].tolist()))
    return keep


def _no_compile(fn, fullgraph):
    assert fullgraph
    return fn


@pytest.mark.parametrize("op,name", [("sample_topp", "4x500"), ("sample_topp", "4x500:peaked"),
                                     ("sample_topp", "4x500:flat"), ("sample_topk", "4x500")])
def test_sample_peers_draw_from_the_filtered_set(op, name):
    (spec, dtype), = bs.parse_shapes(op, name)
    inp = bs.inputs(op, spec, dtype, "cpu")
    fns = bs.impls(op, spec, inp, compile_fn=_no_compile)
    top_k = bs.TOP_K if op == "sample_topk" else 0
    allowed = _allowed(inp["x"], bs.TEMPERATURE, top_k, bs.TOP_P)
    if spec.dist == "peaked":
        assert max(len(a) for a in allowed) < 10
    if spec.dist == "flat":
        assert min(len(a) for a in allowed) > 300
    peers = [n for n in fns if not n.startswith("fray.")]
    assert peers == (["torch.eager", "torch.eager:hf", "torch.compile"] if op == "sample_topk"
                     else ["torch.eager", "torch.compile"])
    torch.manual_seed(0)
    for n in peers:
        for _ in range(5):
            tokens = fns[n]().tolist()
            assert all(t in a for t, a in zip(tokens, allowed)), n


def test_penalty_peer_matches_reference():
    for op in ("apply_penalties", "decode_step"):
        (spec, dtype), = bs.parse_shapes(op, "3x400")
        inp = bs.inputs(op, spec, dtype, "cpu")
        assert inp["token_offsets"].tolist() == [0, 256, 512, 768]
        want = fray.apply_penalties(inp["x"].clone(), inp["token_ids"], inp["token_offsets"],
                                    repetition=bs.REPETITION, presence=bs.PRESENCE, frequency=bs.FREQUENCY,
                                    backend="reference")
        got = bs._eager_penalties(inp["x"], inp["history"], bs.REPETITION, bs.PRESENCE, bs.FREQUENCY)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        fns = bs.impls(op, spec, inp)
        assert set(fns) == {"fray.cuda", "fray.triton", "torch.eager"}
        fns["torch.eager"]()


def test_prefill_shapes_flops_and_peers():
    names = [ba.shape_name(s) for s, _ in ba.SHAPES["prefill_attention"]]
    assert names == ["B2Hq32Hkv8S%dD%d%s" % (s, d, c)
                     for s, d in ((1024, 128), (4096, 128), (8192, 128), (16384, 128), (8192, 64), (8192, 256))
                     for c in ("", ":causal")] + ["B16Hq32Hkv8Svar8192D128", "B16Hq32Hkv8Svar8192D128:causal",
                                                  "B1Hq32Hkv8S2048K16384D128:causal",
                                                  "B1Hq32Hkv8S2048K16384D128P64:causal"]
    for spec, _ in ba.SHAPES["prefill_attention"]:  # names read back
        assert ba.parse_shapes("prefill_attention", ba.shape_name(spec))[0][0] == spec
    assert ba.parse_shapes("prefill_attention", "B1Hq4Hkv2S16D64:causal:fp16,B1Hq4Hkv2S16D64") == [
        (ba.Prefill(1, 4, 2, 16, 64, True), torch.float16), (ba.Prefill(1, 4, 2, 16, 64, False), torch.bfloat16)]
    # chunked: 16 queries at the end of 48 keys: 16 x 32 prefix pairs + the 16-query triangle
    assert ba.prefill_flops(ba.Prefill(1, 4, 2, 16, 64, True, seq_k=48)) == 4 * 4 * 64 * (16 * 32 + 16 * 16 / 2)
    assert ba.parse_shapes("prefill_attention", "B2Hq4Hkv2S16K48D64P16:causal")[0][0] == ba.Prefill(
        2, 4, 2, 16, 64, True, seq_k=48, page=16)
    for bad in ("B1Hq4Hkv2T16D64", "B1Hq4Hkv2S16D64:sliding", "B1Hq4Hkv2Svar16K32D64", "B1Hq4Hkv2Svar16D64P16"):
        with pytest.raises(ValueError, match="shapes"):
            ba.parse_shapes("prefill_attention", bad)
    spec = ba.Prefill(2, 4, 2, 16, 64, True)
    assert ba.prefill_flops(spec) == 4 * 2 * 4 * 16 * 16 * 64 / 2
    assert ba.prefill_flops(spec._replace(causal=False)) == 4 * 2 * 4 * 16 * 16 * 64
    inp = ba.prefill_inputs(spec, torch.float32, "cpu")
    assert inp["q_bhsd"].data_ptr() == inp["q"].data_ptr() and inp["q_bhsd"].shape == (2, 4, 16, 64)
    fns = ba.impls("prefill_attention", spec, inp)
    assert set(fns) == {"fray.cuda", "fray.triton", "torch.builtin:flash", "torch.builtin:efficient",
                        "torch.builtin:cudnn"}
    # the peers' call (SDPA's math kernel on the CPU here) and Fray's reference agree on the views
    want = fray.prefill_attention(inp["q"], inp["k"], inp["v"], causal=True, backend="reference")
    got = torch.nn.functional.scaled_dot_product_attention(inp["q_bhsd"], inp["k_bhsd"], inp["v_bhsd"], is_causal=True,
                                                           enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for name in ("fray.cuda", "fray.triton"):
        with pytest.raises(ValueError, match="CUDA"):
            fns[name]()


def test_mla_shapes_work_and_parse():
    names = [ba.shape_name(s) for s, _ in ba.SHAPES["mla_decode"]]
    assert len(names) == 36 and len(set(names)) == 36
    assert {"B128Hq16Sq1T16384", "B128Hq128Sq2T4096", "B1Hq16Sq2T1024"} <= set(names)  # the two bars, the smallest
    assert ba.parse_shapes("mla_decode", "B2Hq4Sq2T128:fp16,B1Hq16Sq1T64") == [
        (ba.Mla(2, 4, 2, 128), torch.float16), (ba.Mla(1, 16, 1, 64), torch.bfloat16)]
    for bad in ("B2Hq4Sq2T100", "B2Hq4T128", "B2Hq4Sq2T128:fp32"):
        with pytest.raises(ValueError, match="shapes"):
            ba.parse_shapes("mla_decode", bad)
    # bytes: every latent row once; flops: 2 Hq (576 + 512) per visible (query, token) pair
    n, flops = ba.mla_work(ba.Mla(128, 16, 1, 16384), torch.bfloat16)
    assert n == 128 * 16384 * 576 * 2 and flops == 2.0 * 16 * 1088 * 128 * 16384
    assert ba.mla_work(ba.Mla(2, 4, 2, 128), torch.bfloat16)[1] == 2.0 * 4 * 1088 * 2 * (127 + 128)


@pytest.mark.parametrize("name", ["B3Hq4Sq2T128", "B2Hq16Sq1T64"])
def test_mla_peer_matches_reference(name):
    (spec, _), = ba.parse_shapes("mla_decode", name)
    inp = ba.mla_inputs(spec, torch.float32, "cpu")
    assert inp["q"].shape == (spec.batch, spec.s_q, spec.hq, 576)
    assert sorted(inp["block_table"].flatten().tolist()) == list(range(spec.batch * spec.seq // 64))
    fns = ba.impls("mla_decode", spec, inp)
    assert set(fns) == {"fray.cuda", "fray.triton", "torch.eager"}
    want = fray.mla_decode(inp["q"], inp["kv_cache"], inp["block_table"], inp["lens"], backend="reference")
    torch.testing.assert_close(fns["torch.eager"](), want, rtol=1e-4, atol=1e-5)
    # shorter sequences too (the causal mask among s_q and the padding past lens)
    lens = torch.tensor([spec.s_q, spec.seq - 1, 65][:spec.batch], dtype=torch.int32)
    want = fray.mla_decode(inp["q"], inp["kv_cache"], inp["block_table"], lens, scale=0.1, backend="reference")
    got = ba.eager_mla(inp["q"], inp["kv_cache"], inp["block_table"], lens, 0.1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="CUDA"):
        fns["fray.triton"]()


def test_prefill_varlen_and_chunked_peers_compute_the_same_attention():
    """The varlen shape's padded-and-masked SDPA and per-sequence SDPA, and the chunked shape's
    causal_lower_right SDPA, against Fray's reference on the packed / batched tensors (the math
    kernel on the CPU; the GPU backends run the same calls)."""
    spec = ba.Prefill(3, 4, 2, 200, 64, True, varlen=True)
    inp = ba.prefill_inputs(spec, torch.float32, "cpu")
    fns = ba.impls("prefill_attention", spec, inp)
    assert set(fns) == {"fray.cuda", "fray.triton", "torch.builtin:padded", "torch.builtin:per_sequence"}
    assert inp["lens"] == ba.prefill_lens(spec) and all(128 <= n <= 200 for n in inp["lens"])
    want = fray.prefill_attention(inp["q"], inp["k"], inp["v"], cu_seqlens_q=inp["cu"], cu_seqlens_k=inp["cu"],
                                  causal=True, backend="reference")
    padded = torch.nn.functional.scaled_dot_product_attention(inp["q_bhsd"], inp["k_bhsd"], inp["v_bhsd"],
                                                              attn_mask=inp["mask"], enable_gqa=True)
    starts = inp["cu"].tolist()
    for b, n in enumerate(inp["lens"]):
        rows = want[starts[b]:starts[b] + n]
        torch.testing.assert_close(padded[b, :, :n].transpose(0, 1), rows, rtol=1e-4, atol=1e-5)
        seq = torch.nn.functional.scaled_dot_product_attention(inp["q_seqs"][b], inp["k_seqs"][b], inp["v_seqs"][b],
                                                               is_causal=True, enable_gqa=True)
        torch.testing.assert_close(seq[0].transpose(0, 1), rows, rtol=1e-4, atol=1e-5)
    spec = ba.Prefill(1, 4, 2, 16, 64, True, seq_k=48)
    inp = ba.prefill_inputs(spec, torch.float32, "cpu")
    assert inp["q"].shape == (1, 16, 4, 64) and inp["k"].shape == (1, 48, 2, 64)
    from torch.nn.attention.bias import causal_lower_right
    got = torch.nn.functional.scaled_dot_product_attention(inp["q_bhsd"], inp["k_bhsd"], inp["v_bhsd"],
                                                           attn_mask=causal_lower_right(16, 48), enable_gqa=True)
    want = fray.prefill_attention(inp["q"], inp["k"], inp["v"], causal=True, backend="reference")
    torch.testing.assert_close(got.transpose(1, 2), want, rtol=1e-4, atol=1e-5)


def test_prefill_paged_peers_compute_the_same_attention():
    """The paged chunked shape: fray's paged call (the reference on the CPU) and the SDPA peers'
    causal_lower_right call on the gathered keys compute the same attention; the block table is
    a shuffled permutation of every page."""
    spec = ba.Prefill(2, 4, 2, 16, 64, True, seq_k=40, page=16)  # 40 keys: a part-filled last page
    assert ba.shape_name(spec) == "B2Hq4Hkv2S16K40D64P16:causal"
    assert ba.prefill_flops(spec) == 4 * 2 * 4 * 64 * (16 * 24 + 16 * 16 / 2)
    inp = ba.prefill_inputs(spec, torch.float32, "cpu")
    entries = inp["block_table"].flatten().tolist()
    assert inp["block_table"].shape == (2, 3) and sorted(entries) == list(range(6)) and entries != sorted(entries)
    assert inp["q"].shape == (32, 4, 64) and inp["k_bhsd"].shape == (2, 2, 40, 64)
    assert inp["cu_q"].tolist() == [0, 16, 32] and inp["cu_k"].tolist() == [0, 40, 80]
    fns = ba.impls("prefill_attention", spec, inp)
    assert set(fns) == {"fray.cuda", "fray.triton", "torch.builtin:flash", "torch.builtin:efficient",
                        "torch.builtin:cudnn"}
    want = fray.prefill_attention(inp["q"], inp["k_pages"], inp["v_pages"], cu_seqlens_q=inp["cu_q"],
                                  cu_seqlens_k=inp["cu_k"], block_table=inp["block_table"], causal=True,
                                  backend="reference")
    from torch.nn.attention.bias import causal_lower_right
    got = torch.nn.functional.scaled_dot_product_attention(inp["q_bhsd"], inp["k_bhsd"], inp["v_bhsd"],
                                                           attn_mask=causal_lower_right(16, 40), enable_gqa=True)
    torch.testing.assert_close(got.transpose(1, 2).reshape(32, 4, 64), want, rtol=1e-4, atol=1e-5)
    for backend in ("fray.cuda", "fray.triton"):
        with pytest.raises(ValueError, match="CUDA"):
            fns[backend]()


def _fake_timers(monkeypatch):
    monkeypatch.setattr(fb, "time_us", lambda fn: (fn(), 10.0)[1])
    monkeypatch.setattr(fb, "graph_us", lambda fn: (fn(), 2.0)[1])
    monkeypatch.setattr(fb, "environment", lambda: {"device": "fake"})


def test_run_end_to_end_leaves_error_rows_for_fray_on_cpu(monkeypatch):
    _fake_timers(monkeypatch)
    rec = fb.Recorder()
    for op, shapes in (("decode_attention", "B2Hq4Hkv2Tvar32D64"), ("paged_decode_attention", "B2Hq4Hkv2T32D64P16"),
                       ("kv_append", "B2Hkv2T32D64"), ("kv_append_paged", "B2Hkv2T32D64P16"),
                       ("prefill_attention", "B1Hq4Hkv2S16D64:causal,B1Hq4Hkv2S16K40D64P16:causal"),
                       ("mla_decode", "B2Hq4Sq2T64")):
        ba.run(op, rec, shapes=ba.parse_shapes(op, shapes), device="cpu")
    for op, shapes in (("topk", "2x300k5"), ("argmax", "2x300"), ("sample", "2x300"), ("decode_step", "2x300"),
                       ("apply_penalties", "2x300")):
        bs.run(op, rec, shapes=bs.parse_shapes(op, shapes), device="cpu", compile_fn=_no_compile)
    ops = {r["op"] for r in rec.records}
    assert ops == set(ba.OPS) | {"topk", "argmax", "sample_topp", "sample_topk", "decode_step", "apply_penalties"}
    for r in rec.records:
        if r["impl"] == "fray.auto":  # on CPU tensors "auto" runs the reference
            assert r["us"] in (10.0, 2.0), r
        elif r["impl"].startswith("fray."):
            assert r["us"] is None and "CUDA" in r["note"], r
        elif r["op"] == "prefill_attention":  # SDPA's CUDA-only backends (torch's build decides which) error
            assert r["us"] in (10.0, 2.0) or (r["us"] is None and r["note"].startswith("error:")), r
        else:
            assert r["us"] in (10.0, 2.0) and r["rounds"], r
    varlen = [r for r in rec.records if r["shape"] == "B2Hq4Hkv2Tvar32D64"]
    assert all("padded_bytes" in r and "kv_tokens" in r for r in varlen)
    assert any(r["shape"].endswith(":graph") for r in rec.records)
    with pytest.raises(ValueError, match="op"):
        bs.run("sample_minp", rec)


def test_cli_knows_the_bench_only_names():
    from fray import cli
    names = cli._bench_ops()
    assert names["sample_topp"] == names["sample_topk"] == names["topk"] == "sampling"
    assert names["kv_append_paged"] == "attention" and names["softmax"] == "softmax"


def test_host_bench_covers_every_op_and_records_host_rows():
    from fray.bench import host as bh
    rec = fb.Recorder()
    calls = []

    def timer(fn):
        calls.append(fn)
        fn()  # the peers really run on the CPU tensors; Fray's CUDA backends raise here
        return 4.0

    bh.run("host", rec, device="cpu", timer=timer)
    assert {r["op"] for r in rec.records} == set(fray.OPS)
    assert all(r["shape"].endswith(":host") for r in rec.records)
    peers = {r["op"]: r for r in rec.records if r["impl"] == "torch.builtin"}
    assert {"rmsnorm", "softmax", "topk", "decode_attention", "vector_add"} <= set(peers)
    assert all(r["us"] == 4.0 and len(r["rounds"]) == 3 for r in peers.values())
    for r in rec.records:
        if r["impl"].startswith("fray."):
            assert r["us"] is None and r["note"].startswith("error:"), r
    from fray import cli
    assert cli._bench_ops()["host"] == "host"


def test_e2e_decoder_step_in_lockstep_on_the_cpu_references():
    """The decoder step's wiring: Fray's ops (their float64 references on CPU tensors) against the
    torch model, three steps over a paged cache whose lens advance."""
    from fray.bench import e2e
    cfg = e2e.Config(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=64, intermediate=96, vocab=300, batch=3,
                     context=20, page=16, max_position=64)
    base = e2e.build(cfg, torch.device("cpu"))
    a, b = e2e._clone(base), e2e._clone(base)
    checks = e2e.lockstep(cfg, a, b, steps=3)
    assert len(checks) == 3 and all(diff <= tol for diff, tol, _, _ in checks)
    assert sum(c[2] for c in checks) >= 3  # some rows are decided, so tokens were compared
    assert torch.equal(a["lens"], torch.full((3,), 23, dtype=torch.int32))
    # the caches took the new tokens identically
    assert torch.allclose(a["layers"][1]["k_pages"].float(), b["layers"][1]["k_pages"].float(), atol=0.1)
    # the per-op host breakdown times every Fray op of the step and puts fray's own functions back
    import fray
    before = {n: getattr(fray, n) for n in e2e.STEP_OPS}
    per_op = e2e.ops_host_us(lambda: e2e.fray_step(cfg, a), steps=2)
    assert set(per_op) == set(e2e.STEP_OPS) and all(v > 0 for v in per_op.values())
    assert all(getattr(fray, n) is f for n, f in before.items())
