"""The soak (fray.bench.soak): its step and state update, the check schedule and the checks on the
CPU references (the loop run eagerly, as it runs where no graph can be captured), each check made
to fail by a perturbed result; on a GPU, a short soak under CUDA-graph replay."""
import itertools

import pytest
import torch

import fray.bench as fb
from fray.bench import soak
from fray.bench.main import run_op  # noqa: F401  (the module defines the flags soak reads)

CPU = torch.device("cpu")


def _tiny(steps):
    return soak.Config(batch=3, heads=4, kv_heads=2, head_dim=64, vocab=300, page=16, prompt=(5, 40), steps=steps,
                       window=8)


def _eager(cfg, w, live):
    return lambda: soak.step(cfg, w, live)


def test_config_sizes_the_cache_for_every_step():
    cfg = soak.Config()
    assert (cfg.batch, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.vocab, cfg.page) == (8, 8, 2, 128, 32000, 16)
    # the longest prompt + 20000 steps + the 3 warm-up steps, rounded up to whole pages
    assert cfg.capacity == 20528 and cfg.blocks == 1283 and cfg.max_position == cfg.capacity
    assert cfg.name() == "B8Hq8Hkv2D128P16V32000T20528"
    w, s = soak.build(_tiny(4), CPU)
    assert sorted(w["block_table"].flatten().tolist()) == list(range(3 * _tiny(4).blocks))
    assert w["history_offsets"].tolist() == [0, 8, 16, 24]
    # the input token is in the history ring at its position's slot
    assert all(s["history"].view(3, 8)[b, int(s["lens"][b]) % 8] == s["tokens"][b] for b in range(3))


def test_step_advances_the_state_in_place():
    cfg = _tiny(4)
    w, s = soak.build(cfg, CPU)
    before = soak.snapshot(s)
    out = soak.step(cfg, w, s)
    lens0 = before["lens"].long()
    assert torch.equal(s["lens"], before["lens"] + 1) and s["lens"].dtype == torch.int32
    assert s["offsets"].tolist() == [1, 1, 1]
    assert torch.equal(s["tokens"], out["tokens"])
    hist, hist0 = s["history"].view(3, 8), before["history"].view(3, 8)
    slot = (lens0 + 1) % 8
    assert torch.equal(hist[torch.arange(3), slot], out["tokens"])
    others = torch.ones_like(hist, dtype=torch.bool)
    others[torch.arange(3), slot] = False
    assert torch.equal(hist[others], hist0[others])
    # the new K went to position lens0 of each sequence, through the block table, and nowhere else
    pages = w["block_table"][torch.arange(3), lens0 // cfg.page].long()
    written = torch.zeros_like(s["k_pages"], dtype=torch.bool)
    written[pages, lens0 % cfg.page] = True
    assert not torch.equal(s["k_pages"][written], before["k_pages"][written])
    assert torch.equal(s["k_pages"][~written], before["k_pages"][~written])
    assert out["attn"].shape == (3, 4, 64) and out["logits"].shape == (3, 300) and out["logits"].dtype == torch.float32


def test_penalties_reach_the_logits():
    """The logits are after the penalties: exactly the ids in a row's history move."""
    cfg = _tiny(4)
    w, s = soak.build(cfg, CPU)
    with_pen = soak.step(cfg, w, soak.snapshot(s))["logits"]
    off = _tiny(4)
    off.repetition, off.presence, off.frequency = 1.0, 0.0, 0.0
    without = soak.step(off, w, soak.snapshot(s))["logits"]
    hist = s["history"].view(3, 8)
    for b in range(3):
        seen = set(hist[b].tolist())
        differ = set((with_pen[b] != without[b]).nonzero().flatten().tolist())
        assert differ == seen, b


def test_soak_on_the_references_checks_on_schedule_and_passes():
    cfg = _tiny(7)
    w, live = soak.build(cfg, CPU)
    lens0 = live["lens"].clone()
    checks, summary = soak.loop(cfg, w, live, _eager(cfg, w, live), 3, lambda: 0, CPU)
    assert [c["step"] for c in checks] == [3, 6, 7]  # every 3rd step and the last
    assert [c["lens_max"] for c in checks] == [int(lens0.max()) + n for n in (3, 6, 7)]
    assert all(c["passed"] and c["bitwise"] and c["rows_logits_differ"] == 0 for c in checks), checks
    assert checks[0]["us"] > 0 and checks[2]["us"] is None  # the last interval had no unchecked step
    assert summary["passed"] and summary["steps"] == 7 and summary["checks_passed"] == 3 and not summary["errors"]
    assert torch.equal(live["lens"], lens0 + 7) and live["offsets"].tolist() == [7, 7, 7]
    assert len({tuple(c["tokens"]) for c in checks}) > 1  # the loop feeds new tokens


def _perturbed(cfg, w, live, what):
    def replay():
        out = soak.step(cfg, w, live)
        if what == "attn":
            out["attn"][0, 1, 2] += 0.5
        elif what == "logits":
            out["logits"][1, 7] += 10.0
        elif what == "tokens":
            out["tokens"][2] = (out["tokens"][2] + 1) % cfg.vocab
        elif what == "lens":
            live["lens"][0] -= 1
        elif what == "cache":
            live["v_pages"][0, 0, 0, 0] += 1.0
        return out
    return replay


@pytest.mark.parametrize("what,message", [("attn", "attention output"), ("logits", "logits"),
                                          ("tokens", "sample on the replay's logits"), ("lens", "state lens"),
                                          ("cache", "caches")])
def test_a_perturbed_replay_fails_its_check(what, message):
    cfg = _tiny(4)
    w, live = soak.build(cfg, CPU)
    checks, summary = soak.loop(cfg, w, live, _perturbed(cfg, w, live, what), 2, lambda: 0, CPU)
    assert len(checks) == 2 and not any(c["passed"] for c in checks)
    assert not summary["passed"] and summary["checks_passed"] == 0
    assert any(message in f for f in summary["failures"]), summary["failures"]


def test_memory_growth_and_a_raising_step_fail_the_run():
    cfg = _tiny(4)
    w, live = soak.build(cfg, CPU)
    counter = itertools.count()
    checks, summary = soak.loop(cfg, w, live, _eager(cfg, w, live), 2, lambda: next(counter), CPU)
    assert [c["memory_allocated"] for c in checks] == [1, 2] and summary["memory_max"] == 2
    assert not summary["passed"] and all("memory_allocated" in f for f in summary["failures"])

    calls = []

    def failing():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return soak.step(cfg, w, live)
    w, live = soak.build(cfg, CPU)
    checks, summary = soak.loop(cfg, w, live, failing, 2, lambda: 0, CPU)
    assert len(checks) == 1 and not summary["passed"]
    assert summary["errors"] == ["after step 2: RuntimeError: CUDA error: an illegal memory access was encountered"]


def test_run_records_every_check_then_raises_on_failure(monkeypatch):
    monkeypatch.setattr(fb, "environment", lambda: {"device": "fake"})
    rec = fb.Recorder()
    summary = soak.run("soak", rec, cfg=_tiny(5), check_every=2, device="cpu")
    assert summary["passed"] and summary["checks"] == 3
    shape = _tiny(5).name() + ":eager"
    assert [r["shape"] for r in rec.records] == [shape + ":check"] * 3 + [shape]
    last = rec.records[-1]
    assert last["op"] == "decode_soak" and last["steps"] == 5 and last["us"] > 0 and last["check_every"] == 2
    assert {"memory_start", "memory_end", "errors", "checks_passed"} <= set(last)

    rec = fb.Recorder()
    counter = itertools.count()
    with pytest.raises(soak.SoakFailed, match="memory_allocated"):
        soak.run("soak", rec, cfg=_tiny(5), check_every=2, device="cpu", memory=lambda: next(counter))
    assert len(rec.records) == 4 and rec.records[-1]["passed"] is False  # recorded before raising
    assert rec.records[-1]["note"].startswith("error: step 2: memory_allocated")
    assert "note" not in rec.records[0] and not rec.records[0]["passed"]
    with pytest.raises(ValueError, match="check_every"):
        soak.run("soak", rec, cfg=_tiny(5), check_every=-1, device="cpu")


def test_cli_and_flags_know_the_soak():
    from fray import cli
    assert cli._bench_ops()["soak"] == "soak"
    assert soak._flag("steps") == 20000 and soak._flag("check_every") == 1000


@pytest.mark.gpu
def test_soak_under_graph_replay(cuda):
    """200 replayed steps of the default toy model, two checks against eager runs, memory flat."""
    rec = fb.Recorder()
    summary = soak.run("soak", rec, cfg=soak.Config(steps=200), check_every=100)
    assert summary["passed"] and summary["steps"] == 200 and summary["checks"] == 2, summary
    checks = [r for r in rec.records if r["shape"].endswith(":graph:check")]
    assert [c["step"] for c in checks] == [100, 200]
    assert checks[1]["lens_max"] - checks[0]["lens_max"] == 100  # every replay advanced the lengths
    assert checks[0]["tokens"] != checks[1]["tokens"]
    assert summary["memory_end"] <= summary["memory_start"] and rec.records[-1]["us"] > 0
