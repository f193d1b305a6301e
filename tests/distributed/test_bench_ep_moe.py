"""bench/distributed/ep_moe.py (the expert-parallel MoE layer benchmark) without a GPU.

CPU: the benchmark's own functions on gloo groups, at DeepSeek-V3's routing (256 experts, top-8,
grouped sigmoid with the correction bias) with hidden 64 and intermediate 32 in place of 7168 and
2048. fray.moe_route and fray.fused_moe take their float64 references on CPU tensors,
torch._grouped_mm runs on the CPU, and fray.distributed's collectives run on gloo, so both layers
run end to end: against the single-process fray.fused_moe (all experts in one process, routed
from the same logits), the check that gates the timing (passing, and failing on a composite that
loses the routing weights, every rank exiting), run() end to end under a fake timer (its records),
world size 1 in this process and 2 in spawned processes (the same start_processes / FileStore
pattern as test_distributed.py), the flags and their errors.
GPU (`-m gpu`): the check and run() with the real lockstep timer, one process on one GPU (NCCL),
at a small layer (hidden 256, intermediate 128); the Triton kernels there, not the references.
"""
import datetime
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import fray
from fray.bench import Recorder
from fray.testing import spawn_ranks

BENCH = "bench/distributed/ep_moe.py"
SPAWN_DEADLINE_S = 240


def _load():
    spec = importlib.util.spec_from_file_location("bench_ep_moe", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ep = _load()  # once per process: the module defines an absl flag


def _small(world, experts_per_rank=None, hidden=64, inter=32):
    return ep.layer(world, experts_per_rank, hidden=hidden, inter=inter)


def _fake_timer(fn):
    fn()  # the timed call runs (on every rank alike), its time is made up
    return 100.0


@pytest.fixture
def group1(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _single_process(model, ranks, tokens, world):
    """The whole layer in one process: every rank's tokens through fray.fused_moe with every
    rank's experts stacked (rank r's are global experts r*El ..), routed from the same logits."""
    dev = torch.device("cpu")
    w13, w2 = zip(*(ep.rank_weights(model, r, dev) for r in range(world)))
    w13, w2 = torch.cat(w13), torch.cat(w2)
    route = ep.routing(model, dev)
    out = []
    for r in ranks:
        x, logits = ep.rank_tokens(model, tokens, r, dev)
        out.append(fray.fused_moe(x, w13, w2, router_logits=logits, top_k=model.top_k, **route))
    return out


def _close(got, want, what):
    assert got.dtype == want.dtype == torch.bfloat16, what
    # bf16 roundings of g, h, y and y*w in both, the sums in another order: a few units in the
    # last place of O(1) values
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=2 ** -6, msg=what)


# ---------------------------------------------------------------------------------------------
# the layer, the shapes, the flags

def test_layer_defaults_to_deepseek_v3_over_the_ranks():
    for world, local in ((1, 256), (2, 128), (8, 32), (256, 1)):
        m = ep.layer(world)
        assert (m.experts, m.global_experts, m.top_k, m.hidden, m.inter, m.dtype) == (
            local, 256, 8, 7168, 2048, torch.bfloat16)
        assert m.route == dict(scoring="sigmoid", num_expert_group=8, topk_group=4, routed_scaling_factor=2.5)
    assert ep.shape_name(ep.layer(8), 4096, 8) == "T4096:w8"
    assert ep.shape_name(ep.layer(1, 16), 128, 1) == "T128:w1:e16"
    assert (ep.layer(2, 8).global_experts, ep.layer(4, 64).global_experts) == (16, 256)
    assert ep.shape_name(ep.layer(4, 64), 128, 4) == "T128:w4"  # 256 however it was asked for
    for world, per_rank, why in ((3, None, "split evenly"), (1, 8, "at least 16"), (4, 3, "multiple of 8"),
                                 (1, 0, ">= 1")):
        with pytest.raises(ValueError, match="^experts_per_rank: .*" + why):
            ep.layer(world, per_rank)
    assert ep.TOKENS == (4096, 128)


def test_parse_shapes():
    assert ep.parse_shapes("T4096, T128") == [4096, 128]
    for bad in ("4096", "T0", "T4096:w1", "128x7168", "T"):
        with pytest.raises(ValueError, match="^shapes: "):
            ep.parse_shapes(bad)


def test_routing_is_the_deepseek_v3_recipes():
    from fray.ops import moe as M
    _, _, kw = M._recipe_args("deepseek_v3", 3, torch.bfloat16, "cpu")
    route = ep.routing(ep.layer(1), torch.device("cpu"))
    assert torch.equal(route.pop("correction_bias"), kw.pop("correction_bias")) and route == kw


def test_cli_reads_its_flags_and_needs_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the CLI would run the benchmark on this GPU")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    for args in (["--experts_per_rank=3", "--shapes=T16"], ["--nosuch"]):
        out = subprocess.run([sys.executable, BENCH, "--out", str(tmp_path / "r.jsonl")] + args, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode != 0
        if args[-1] == "--nosuch":
            assert "nosuch" in out.stderr, out.stderr  # absl refuses an unknown flag: the others were known
        else:
            assert "benchmarks need a CUDA GPU" in out.stderr, out.stderr
    assert not (tmp_path / "r.jsonl").exists()


# ---------------------------------------------------------------------------------------------
# world size 1, in this process

def test_both_layers_are_the_single_process_layer(group1):
    m = _small(1)
    dev = torch.device("cpu")
    w13, w2 = ep.rank_weights(m, 0, dev)
    emap = fray.distributed.expert_map(m.global_experts, 0, 1)
    route = ep.routing(m, dev)
    x, logits = ep.rank_tokens(m, 40, 0, dev)
    want, = _single_process(m, [0], 40, 1)
    _close(ep.fray_layer(x, logits, w13, w2, m, route, emap), want, "fray.nccl")
    _close(ep.composite_layer(x, logits, w13, w2, m, route, emap), want, "torch.eager")
    result = ep.check(x, logits, w13, w2, m, route, emap)
    assert result["bad"] == result["rerouted"] == 0 and ep.verdict(result) is None, result
    assert result["max_diff"] < 2 ** -5
    # the exchange alone is the identity at world size 1 (each token: the sum of k copies of itself)
    tw, ids = fray.moe_route(logits, m.top_k, **route)
    _close(ep.exchange(x, tw, ids, m), (x.float() * m.top_k).to(x.dtype), "ep_exchange")


def test_the_check_has_teeth():
    g = torch.Generator().manual_seed(0)
    want = torch.randn(200, 16, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(32, generator=g)[:8] for _ in range(200)])
    ok = ep.compare(want, want, ids, ids.flip(1))  # the same experts in another order: routed alike
    assert ok["bad"] == ok["rerouted"] == 0 and ep.verdict(ok) is None
    off = want.clone()
    off[7, 3] += 0.25
    bad = ep.compare(off, want, ids, ids)
    assert bad["bad"] == 1 and bad["worst"][:2] == (7, 3) and "token 7, column 3" in ep.verdict(bad)
    nan = want.clone()
    nan[9, 0] = float("nan")
    assert ep.compare(nan, want, ids, ids)["bad"] == 1
    # a token the routings disagree on is left out of the output comparison, counted, and more
    # than 1% of them fail the check
    other = ids.clone()
    other[7, 0] = 32
    left_out = ep.compare(off, want, ids, other)
    assert left_out["bad"] == 0 and left_out["rerouted"] == 1 and ep.verdict(left_out) is None
    other = ids.clone()
    other[:3, 0] = 32
    assert "disagree on 3 of 200 tokens (at most 2" in ep.verdict(ep.compare(want, want, ids, other))


def test_run_records_every_row(group1):
    rec = Recorder(None)
    m = _small(1)
    ep.run(rec, shapes=[24, 3], model=m, timer=_fake_timer, device=torch.device("cpu"))
    rows = [("ep_moe", "fray.nccl"), ("ep_moe", "torch.eager"), ("ep_exchange", "fray.nccl")]
    assert [(d["op"], d["impl"], d["shape"]) for d in rec.records] == [
        (op, impl, shape) for shape in ("T24:w1", "T3:w1") for op, impl in rows]
    for d in rec.records:
        tokens = int(d["shape"][1:].split(":")[0])
        assert d["world_size"] == 1 and d["experts"] == d["experts_per_rank"] == 256 and d["dtype"] == "bf16"
        assert d["routes"] == tokens * 8 and 0 < d["experts_hit"] <= tokens * 8
        assert d["us"] == 100.0 and d["rounds"] == [100.0] * ep.ROUNDS and d["rerouted"] == 0
        if d["op"] == "ep_moe":
            assert d["tflops"] == round(2.0 * d["routes"] * 3 * 64 * 32 / 100.0 / 1e6, 2)
            assert d["gbps"] == round(d["experts_hit"] * 3 * 64 * 32 * 2 / 100.0 / 1e3, 1)  # T <= 128
        else:
            assert d["gbps"] == round(2 * tokens * 8 * 64 * 2 / 100.0 / 1e3, 1) and d["tflops"] is None


def test_run_exits_when_the_layers_disagree(group1, monkeypatch):
    # the composite's experts with every routing weight 1: the kind of slip the check is there for
    experts = ep.bm.eager_experts
    monkeypatch.setattr(ep.bm, "eager_experts", lambda x, w13, w2, tw, ids, emap=None, **kw:
                        experts(x, w13, w2, torch.ones_like(tw), ids, emap, **kw))
    rec = Recorder(None)
    with pytest.raises(SystemExit, match="^ep_moe T16:w1: the layers disagree on rank 0: .* tokens differ"):
        ep.run(rec, shapes=[16], model=_small(1), timer=_fake_timer, device=torch.device("cpu"))
    assert rec.records == []  # nothing timed, nothing recorded


# ---------------------------------------------------------------------------------------------
# world size 2: spawned gloo processes

def _worker(rank, world, store_path, out_dir):
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        dev = torch.device("cpu")
        m = _small(world)
        w13, w2 = ep.rank_weights(m, rank, dev)
        emap = fray.distributed.expert_map(m.global_experts, rank, world)
        route = ep.routing(m, dev)
        x, logits = ep.rank_tokens(m, 20 + rank, rank, dev)  # the ranks' token counts differ
        res = dict(fray=ep.fray_layer(x, logits, w13, w2, m, route, emap),
                   composite=ep.composite_layer(x, logits, w13, w2, m, route, emap),
                   check=ep.check(x, logits, w13, w2, m, route, emap))
        rec = Recorder(None) if rank == 0 else None
        ep.run(rec, shapes=[12], model=m, timer=_fake_timer, device=dev)
        res["records"] = None if rec is None else rec.records
        torch.save(res, os.path.join(out_dir, "rank%d.pt" % rank))
    finally:
        dist.destroy_process_group()


def _spawn(world):
    return spawn_ranks(_worker, world, deadline_s=SPAWN_DEADLINE_S, what="gloo group")


def test_world_two_gloo():
    results = _spawn(2)
    m = _small(2)
    assert (m.experts, m.global_experts) == (128, 256)
    for rank, (res, want) in enumerate(zip(results, [_single_process(m, [r], 20 + r, 2)[0] for r in range(2)])):
        _close(res["fray"], want, "rank %d fray.nccl" % rank)
        _close(res["composite"], want, "rank %d torch.eager" % rank)
        assert ep.verdict(res["check"]) is None and res["check"]["rerouted"] == 0, res["check"]
    assert results[1]["records"] is None
    recs = results[0]["records"]
    assert {(d["op"], d["impl"], d["shape"]) for d in recs} == {
        ("ep_moe", "fray.nccl", "T12:w2"), ("ep_moe", "torch.eager", "T12:w2"), ("ep_exchange", "fray.nccl", "T12:w2")}
    # the busiest rank's routes: between an even share and all of both ranks' 2 * 12 * 8
    assert all(d["world_size"] == 2 and 96 <= d["routes"] <= 192 and d["experts_per_rank"] == 128 for d in recs)


# ---------------------------------------------------------------------------------------------
# GPU: one process, NCCL

@pytest.mark.gpu
def test_gpu_world_one_nccl(tmp_path, cuda):
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        m = _small(1, hidden=256, inter=128)
        dev = torch.device("cuda", 0)
        w13, w2 = ep.rank_weights(m, 0, dev)
        emap = fray.distributed.expert_map(m.global_experts, 0, 1, device=dev)
        route = ep.routing(m, dev)
        with torch.no_grad():
            x, logits = ep.rank_tokens(m, 512, 0, dev)
            result = ep.check(x, logits, w13, w2, m, route, emap)
            assert ep.verdict(result) is None, result
            rec = Recorder(None)
            ep.run(rec, shapes=[512, 16], model=m)  # the real lockstep timer
        assert len(rec.records) == 6 and all(d["us"] and d["us"] > 0 for d in rec.records), rec.records
    finally:
        dist.destroy_process_group()
