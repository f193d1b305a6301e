"""fray.bench.bench_impls / Recorder without a GPU: the timers are replaced by fakes."""
import json

import fray.bench as fb


def test_bench_impls_records_rounds_graph_variant_and_errors(monkeypatch, tmp_path):
    times = {"fast": [4.0, 3.0, 5.0], "slow": [70.0, 60.0, 80.0]}
    calls = {"fast": 0, "slow": 0}

    def fake_time(fn):
        return fn()

    def make(name):
        def fn():
            v = times[name][calls[name] % 3]
            calls[name] += 1
            return v
        return fn

    def broken():
        raise RuntimeError("peer refuses this shape")

    monkeypatch.setattr(fb, "time_us", fake_time)
    monkeypatch.setattr(fb, "graph_us", lambda fn: fn() / 2)
    monkeypatch.setattr(fb, "environment", lambda: {"device": "fake", "torch": "t", "triton": "t",
                                                    "cuda": "c", "commit": "abc", "date": "d"})
    out = tmp_path / "r.jsonl"
    rec = fb.Recorder(str(out))
    fb.bench_impls(rec, "op", "2x8", "bf16", {"fast": make("fast"), "slow": make("slow"), "broken": broken},
                   nbytes=4e6, graph=True, notes="k heads 8")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    plain = {r["impl"]: r for r in rows if r["shape"] == "2x8"}
    graph = {r["impl"]: r for r in rows if r["shape"] == "2x8:graph"}
    assert plain["fast"]["us"] == 4.0 and plain["fast"]["rounds"] == [4.0, 3.0, 5.0]
    assert plain["fast"]["gbps"] == 1000.0  # 4e6 bytes / 4 us
    assert plain["slow"]["us"] == 70.0
    assert plain["broken"]["us"] is None and "refuses" in plain["broken"]["note"]
    assert set(graph) == {"fast", "slow", "broken"}  # fastest < 50 us: every impl gets the row
    assert all(r["notes"] == "k heads 8" for r in rows)
    for key in ("op", "impl", "shape", "dtype", "us", "gbps", "tflops", "device", "torch", "triton",
                "cuda", "commit", "date"):
        assert key in plain["fast"]


def test_no_graph_variant_for_slow_shapes(monkeypatch):
    monkeypatch.setattr(fb, "time_us", lambda fn: 80.0)
    monkeypatch.setattr(fb, "graph_us", lambda fn: 1.0)
    monkeypatch.setattr(fb, "environment", lambda: {})
    rec = fb.Recorder()
    fb.bench_impls(rec, "op", "4x4", "fp32", {"a": lambda: None}, nbytes=None)
    assert [r["shape"] for r in rec.records] == ["4x4"] and rec.records[0]["gbps"] is None


def test_impls_filter_times_only_the_matching_impls(monkeypatch):
    import re
    called = []
    monkeypatch.setattr(fb, "time_us", lambda fn: fn() or 80.0)
    monkeypatch.setattr(fb, "environment", lambda: {})
    monkeypatch.setattr(fb, "IMPLS", re.compile(r"^fray|eager"))
    rec = fb.Recorder()
    impls = {name: (lambda n=name: called.append(n)) for name in ("fray.triton", "torch.eager", "torch.compile")}
    fb.bench_impls(rec, "op", "4x4", "fp32", impls, graph=False)
    assert {r["impl"] for r in rec.records} == {"fray.triton", "torch.eager"}
    assert "torch.compile" not in called
