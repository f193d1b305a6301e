"""fray.tune without a GPU: fake builds, checks and timers, counted; the persisted record is real."""
import json
import os
import subprocess
import sys

import pytest

import fray.tune as tune

IDENT = {"arch": "sm_90", "device": "NVIDIA H200", "cuda": "12.8", "driver": "13.0", "fray": "0.1.0"}
CANDIDATES = [{"BLOCK_M": 64, "stages": 3}, {"BLOCK_M": 128, "stages": 4}, {"BLOCK_M": 256, "stages": 2}]
DEFAULT = CANDIDATES[0]


class Fake:
    """build/run/check/timer doubles: µs per config, configs whose check fails, counters."""

    def __init__(self, us, wrong=(), broken=()):
        self.us = us
        self.wrong = set(wrong)
        self.broken = set(broken)
        self.builds = self.runs = self.checks = self.timings = 0

    def build(self, configs):
        self.builds += len(configs)
        return [RuntimeError("ptxas: too many resources") if c["BLOCK_M"] in self.broken else ("runner", c["BLOCK_M"])
                for c in configs]

    def run(self, config, runner):
        assert runner == ("runner", config["BLOCK_M"])
        self.runs += 1

    def check(self, config, runner):
        self.checks += 1
        if config["BLOCK_M"] in self.wrong:
            raise AssertionError("max error 3.5 > 0.02")

    def timer(self, fn):
        self.timings += 1
        fn()
        return self.us[self._last_config]

    def kwargs(self):
        return dict(build=self.build, run=self._run_tracking, check=self.check, default=DEFAULT,
                    timer=self.timer, flops=2 * 4096.0 ** 3)

    def _run_tracking(self, config, runner):
        self._last_config = config["BLOCK_M"]
        self.run(config, runner)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("FRAY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FRAY_AUTOTUNE", raising=False)
    monkeypatch.setattr(tune, "device_identity", lambda device=None: dict(IDENT))
    monkeypatch.setattr(tune, "_memo", {})
    tune._shipped.cache_clear()
    yield tmp_path / "cache"
    tune._shipped.cache_clear()


def _store(cache):
    return json.loads((cache / "tune" / "nvidia_h200.json").read_text())


def test_tunes_once_persists_and_reuses(fresh):
    fake = Fake({64: 30.0, 128: 12.0, 256: 20.0})
    assert tune.choose("gemm", "m4096_n4096_k4096", "bf16", CANDIDATES, **fake.kwargs()) == CANDIDATES[1]
    assert (fake.builds, fake.checks, fake.timings) == (3, 3, 3)
    [(key, record)] = _store(fresh).items()
    assert key == "gemm|m4096_n4096_k4096|bf16|sm_90|NVIDIA H200|cuda12.8|driver13.0|fray0.1.0"
    assert record["config"] == CANDIDATES[1] and record["us"] == 12.0

    again = Fake({64: 1.0, 128: 1.0, 256: 1.0})  # same process: the memo
    assert tune.choose("gemm", "m4096_n4096_k4096", "bf16", CANDIDATES, **again.kwargs()) == CANDIDATES[1]
    tune._memo.clear()  # as a new process: the record on disk
    assert tune.choose("gemm", "m4096_n4096_k4096", "bf16", CANDIDATES, **again.kwargs()) == CANDIDATES[1]
    assert (again.builds, again.runs, again.checks, again.timings) == (0, 0, 0, 0)


_NEW_PROCESS = """
import json, sys
sys.path[:0] = %(path)r
import fray.tune as tune
tune.device_identity = lambda device=None: %(ident)r
def refuse(*a, **k):
    raise AssertionError("tuned again in a new process")
config = tune.choose("gemm", "b", "bf16", %(cands)r, build=refuse, run=refuse, check=refuse, default=%(default)r,
                     timer=refuse)
print(json.dumps({"config": config, "stats": tune.stats}))
"""


def test_a_new_process_reuses_the_record_without_building_or_timing(fresh, tmp_path):
    fake = Fake({64: 30.0, 128: 40.0, 256: 10.0})
    assert tune.choose("gemm", "b", "bf16", CANDIDATES, **fake.kwargs()) == CANDIDATES[2]
    script = tmp_path / "again.py"
    script.write_text(_NEW_PROCESS % {"path": [p for p in sys.path if p], "ident": IDENT, "cands": CANDIDATES,
                                      "default": DEFAULT})
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, FRAY_CACHE_DIR=str(fresh)))
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["config"] == CANDIDATES[2]
    assert r["stats"] == {"tunings": 0, "builds": 0, "timings": 0}


def test_a_wrong_or_broken_candidate_never_wins(fresh):
    fake = Fake({64: 30.0, 128: 1.0, 256: 20.0}, wrong={128}, broken={256})
    assert tune.choose("gemm", "b", "bf16", CANDIDATES, **fake.kwargs()) == CANDIDATES[0]
    assert fake.timings == 1  # only the candidate that built and passed its check was timed


def test_no_passing_candidate_is_a_runtime_error(fresh):
    fake = Fake({64: 1.0, 128: 1.0, 256: 1.0}, wrong={64, 128}, broken={256})
    with pytest.raises(RuntimeError, match=r"(?s)no candidate of gemm passed.*BLOCK_M=64,stages=3: check failed.*build failed: ptxas"):
        tune.choose("gemm", "b", "bf16", CANDIDATES, **fake.kwargs())
    assert not (fresh / "tune" / "nvidia_h200.json").exists()


@pytest.mark.parametrize("why", ["capturing", "torch.compile tracing", "FRAY_AUTOTUNE=0"])
def test_no_tuning_while_capturing_compiling_or_disabled(fresh, monkeypatch, capfd, why):
    import torch
    if why == "capturing":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    elif why == "torch.compile tracing":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    else:
        monkeypatch.setenv("FRAY_AUTOTUNE", "0")
    monkeypatch.setenv("FRAY_PRINT_AUTOTUNE", "1")
    fake = Fake({64: 30.0, 128: 1.0, 256: 20.0})
    assert tune.choose("gemm", "b", "bf16", CANDIDATES, **fake.kwargs()) == DEFAULT
    assert fake.builds == fake.timings == 0
    assert "heuristic (%s)" % why in capfd.readouterr().err
    assert not (fresh / "tune").exists()  # nothing persisted, nothing remembered:
    monkeypatch.undo()  # the same process out of capture / tracing, tuning on
    monkeypatch.setenv("FRAY_CACHE_DIR", str(fresh))
    monkeypatch.delenv("FRAY_AUTOTUNE", raising=False)
    monkeypatch.setattr(tune, "device_identity", lambda device=None: dict(IDENT))
    monkeypatch.setattr(tune, "_memo", {})
    assert tune.choose("gemm", "b", "bf16", CANDIDATES, **fake.kwargs()) == CANDIDATES[1]  # eager: tunes
    assert fake.timings == 3


def test_persisted_choice_is_used_while_capturing(fresh, monkeypatch, capfd):
    import torch
    tune.choose("gemm", "b", "bf16", CANDIDATES, **Fake({64: 3.0, 128: 2.0, 256: 1.0}).kwargs())
    tune._memo.clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setenv("FRAY_PRINT_AUTOTUNE", "1")
    fake = Fake({64: 1.0, 128: 1.0, 256: 1.0})
    assert tune.choose("gemm", "b", "bf16", CANDIDATES, **fake.kwargs()) == CANDIDATES[2]
    assert fake.builds == 0 and "(persisted)" in capfd.readouterr().err


def test_shipped_default_before_tuning(fresh, monkeypatch, tmp_path, capfd):
    shipped = tmp_path / "defaults"
    shipped.mkdir()
    (shipped / "nvidia_h200.json").write_text(json.dumps({"gemm|b|bf16": CANDIDATES[2]}))
    monkeypatch.setattr(tune, "_DEFAULTS_DIR", shipped)
    tune._shipped.cache_clear()
    monkeypatch.setenv("FRAY_PRINT_AUTOTUNE", "1")
    fake = Fake({64: 1.0, 128: 1.0, 256: 9.0})
    assert tune.choose("gemm", "b", "bf16", CANDIDATES, **fake.kwargs()) == CANDIDATES[2]
    assert fake.builds == 0 and "(shipped default)" in capfd.readouterr().err
    assert tune.choose("gemm", "b", "fp16", CANDIDATES, **fake.kwargs()) == CANDIDATES[0]  # not shipped: tuned
    assert fake.builds == 3


def test_record_of_other_versions_or_a_vanished_config_is_not_used(fresh, monkeypatch):
    tune.choose("gemm", "b", "bf16", CANDIDATES, **Fake({64: 3.0, 128: 2.0, 256: 1.0}).kwargs())
    tune._memo.clear()
    monkeypatch.setattr(tune, "device_identity", lambda device=None: dict(IDENT, driver="13.1"))
    fake = Fake({64: 1.0, 128: 2.0, 256: 3.0})
    assert tune.choose("gemm", "b", "bf16", CANDIDATES, **fake.kwargs()) == CANDIDATES[0]
    assert fake.timings == 3
    tune._memo.clear()
    fewer = CANDIDATES[1:]  # the persisted winner (BLOCK_M=64) is no longer offered
    fake2 = Fake({64: 1.0, 128: 2.0, 256: 3.0})
    kwargs = dict(fake2.kwargs(), default=fewer[0])
    assert tune.choose("gemm", "b", "bf16", fewer, **kwargs) == CANDIDATES[1]
    assert fake2.timings == 2
    assert len(_store(fresh)) == 2


def test_print_autotune_table(fresh, monkeypatch, capfd):
    monkeypatch.setenv("FRAY_PRINT_AUTOTUNE", "1")
    fake = Fake({64: 300.0, 128: 200.0, 256: 250.0}, wrong={256})
    tune.choose("gemm", "m4096_n4096_k4096", "bf16", CANDIDATES, **fake.kwargs())
    err = capfd.readouterr().err
    assert "tuning gemm m4096_n4096_k4096 bf16 over 3 configs" in err
    lines = [ln for ln in err.splitlines() if "BLOCK_M=" in ln]
    assert len(lines) == 3
    assert "config" in err and "TFLOP/s" in err and "chosen" in err
    best = next(ln for ln in lines if "BLOCK_M=128" in ln)
    assert "200.00" in best and "687.2" in best and best.rstrip().endswith("*")  # 2*4096^3 / 200 us
    assert "check failed" in next(ln for ln in lines if "BLOCK_M=256" in ln)


def test_quiet_without_print_autotune_except_one_line_per_tuning(fresh, monkeypatch, capfd):
    monkeypatch.delenv("FRAY_PRINT_AUTOTUNE", raising=False)
    tune.choose("gemm", "b", "bf16", CANDIDATES, **Fake({64: 3.0, 128: 2.0, 256: 1.0}).kwargs())
    tune.choose("gemm", "b", "bf16", CANDIDATES, **Fake({64: 3.0, 128: 2.0, 256: 1.0}).kwargs())
    err = capfd.readouterr().err.strip().splitlines()
    assert err == ["fray.tune: tuning gemm b bf16 over 3 configs"]


def test_bad_arguments(fresh):
    fake = Fake({64: 1.0})
    with pytest.raises(ValueError, match="candidates"):
        tune.choose("gemm", "b", "bf16", [], **fake.kwargs())
    with pytest.raises(ValueError, match="default"):
        tune.choose("gemm", "b", "bf16", CANDIDATES[1:], **fake.kwargs())


def test_export_defaults_writes_data(fresh, tmp_path):
    tune.choose("gemm", "b", "bf16", CANDIDATES, **Fake({64: 3.0, 128: 2.0, 256: 1.0}).kwargs())
    path = tune.export_defaults("NVIDIA H200", tmp_path / "nvidia_h200.json")
    assert json.loads(path.read_text()) == {"gemm|b|bf16": CANDIDATES[2]}


def test_shipped_defaults_are_data():
    for name in os.listdir(tune._DEFAULTS_DIR):
        assert name.endswith(".json"), name
        data = json.loads((tune._DEFAULTS_DIR / name).read_text())
        for key, config in data.items():
            assert key.count("|") == 2 and isinstance(config, dict), (name, key)
