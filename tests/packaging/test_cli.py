"""The `fray` command line: aligned columns, one line per case as it goes, --json, the exit status
and --help through absl."""
import json
import os
import subprocess
import sys
import types

import pytest
from absl import app, flags

from fray import cli


@pytest.fixture(autouse=True)
def _flags():
    flags.FLAGS(["fray"])  # parse defaults, as absl.app.run would
    yield
    flags.FLAGS.unparse_flags()


def test_ops_columns_stay_aligned(capsys):
    assert cli.main(["fray", "ops"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("op "))
    status_col = lines[header].index("status here")
    rows = [line for line in lines[header + 1:] if not line.startswith("jit:")]
    assert any(r.startswith("paged_decode_attention ") for r in rows), rows
    for r in rows:
        assert r[status_col - 2:status_col] == "  " and r[status_col] != " ", (status_col, r)
        assert r[status_col:].startswith(("available", "unavailable")), (status_col, r)


def test_ops_json(capsys):
    flags.FLAGS.json = True
    assert cli.main(["fray", "ops"]) == 0
    objs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ops = {o["op"] for o in objs if "op" in o}
    assert {"rmsnorm", "decode_attention", "sample"} <= ops
    assert all(isinstance(o["available"], bool) for o in objs if "op" in o)


def _fake_families(monkeypatch):
    def fail():
        raise AssertionError("rmsnorm: max error 3.0 > 0.1\nsecond line")
    module = types.SimpleNamespace(check_cases=lambda device: [
        ("rmsnorm", "reference", "fp32", "3x5", lambda: None),
        ("rmsnorm", "triton-interpreter", "fp16", "111x4097", fail),
        ("rmsnorm", "cuda", "bf16", "1x8", RuntimeError("no CUDA device")),
    ])
    import fray
    monkeypatch.setattr(fray, "FAMILIES", {"norm": module})


def test_check_reports_each_case_and_fails_on_any_failure(monkeypatch, capsys):
    _fake_families(monkeypatch)
    assert cli._cmd_check("cpu") == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("1/3") and "PASS" in out[1]
    assert out[2].startswith("2/3") and "FAIL: rmsnorm: max error 3.0 > 0.1" in out[2] and "second" not in out[2]
    assert out[3].startswith("3/3") and "SKIP (no CUDA device)" in out[3]
    assert out[-1] == "1 passed, 1 failed, 1 skipped"
    assert len({line.index("rmsnorm") for line in out[1:4]}) == 1  # aligned


def test_check_json(monkeypatch, capsys):
    _fake_families(monkeypatch)
    flags.FLAGS.json = True
    assert cli._cmd_check("cpu") == 1
    objs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["result"] for o in objs[:3]] == ["pass", "fail", "skip"]
    assert objs[1]["error"].startswith("rmsnorm: max error")
    assert objs[-1]["passed"] == 1 and objs[-1]["failed"] == 1 and objs[-1]["skipped"] == 1


def test_check_runs_only_the_named_ops(monkeypatch, capsys):
    import fray
    calls = []

    def family(name, cases):
        return types.SimpleNamespace(check_cases=lambda device: calls.append(name) or cases)
    monkeypatch.setattr(fray, "FAMILIES", {
        "norm": family("norm", [("rmsnorm", "reference", "fp32", "3", lambda: None),
                                ("layernorm", "reference", "fp32", "3", lambda: None)]),
        "moe": family("moe", [("grouped_gemm+routed", "reference", "fp64", "hand", lambda: None),
                              ("fused_moe", "reference", "fp32", "3", lambda: None)])})
    monkeypatch.setattr(fray, "OPS", {"rmsnorm": "norm", "layernorm": "norm", "grouped_gemm": "moe",
                                      "routed_grouped_gemm": "moe", "fused_moe": "moe"})
    assert cli._cmd_check("cpu", ["rmsnorm", "grouped_gemm"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in out[1:-1]] == ["rmsnorm", "grouped_gemm+routed"]
    assert out[-1] == "2 passed, 0 failed, 0 skipped"
    calls.clear()
    assert cli._cmd_check("cpu", ["fused_moe"]) == 0 and calls == ["moe"]  # only the op's family is built
    with pytest.raises(app.UsageError, match="check: no operator nope; expected some of: fused_moe, grouped_gemm"):
        cli._cmd_check("cpu", ["nope"])


def test_check_passes_on_this_machine_per_family(capsys):
    """The real cases of one family (the whole suite runs from the installed wheel)."""
    import fray
    real = fray.FAMILIES
    try:
        fray.FAMILIES = {"elementwise": real["elementwise"]}
        os.environ["TRITON_INTERPRET"] = "1"
        assert cli._cmd_check("cpu") == 0, capsys.readouterr().out
    finally:
        fray.FAMILIES = real
    assert "0 failed" in capsys.readouterr().out


@pytest.mark.parametrize("as_json", [False, True])
def test_bench_progress_and_failures(capsys, as_json):
    rec = cli._progress_recorder(None, as_json)
    rec.add("rmsnorm", "fray.cuda", "4096x8192", "bf16", 36.8, nbytes=134217728)
    rec.add("rmsnorm", "liger", "4096x8192", "bf16", None, note="error: no module liger_kernel")
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and rec.failed == 1
    if as_json:
        assert json.loads(out[0])["us"] == 36.8 and json.loads(out[1])["us"] is None
    else:
        assert out[0].startswith("rmsnorm 4096x8192 bf16 fray.cuda: 36.80 us")
        assert "no module liger_kernel" in out[1]


def test_help_through_absl():
    out = subprocess.run([sys.executable, "-c", "from fray import cli; cli.run()", "--help"],
                         capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr
    text = out.stdout + out.stderr
    assert "fray: Fray's command line" in text and "--json" in text and "--device" in text, text


def test_unknown_command_exits_nonzero():
    out = subprocess.run([sys.executable, "-c", "from fray import cli; cli.run()", "frobnicate"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "unknown command" in out.stderr, out.stdout + out.stderr


def test_plot_renders_every_family_and_the_roofline(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    rows = [("rmsnorm", "fray.cuda", 30.0, 4000.0), ("rmsnorm", "fray.triton", 45.0, 2700.0),
            ("rmsnorm", "liger", 40.0, 3000.0), ("rmsnorm", "torch.compile", 60.0, 2000.0)]
    with open(results / "norm.jsonl", "w") as fh:
        for op, impl, us, gbps in rows:
            fh.write(json.dumps({"op": op, "impl": impl, "shape": "4096x8192", "dtype": "bf16", "us": us,
                                 "gbps": gbps, "tflops": None, "date": "2026-12-01T00:00:00Z"}) + "\n")
    flags.FLAGS.results_dir, flags.FLAGS.charts_dir = str(results), str(tmp_path / "charts")
    assert cli.main(["fray", "plot"]) == 0
    for name in ("norm.png", "roofline.png"):
        data = open(tmp_path / "charts" / name, "rb").read()
        assert data.startswith(b"\x89PNG") and len(data) > 5000, name
    from fray.bench import plot
    assert [(impl, round(r, 3)) for _, _, impl, r in plot.losses(str(results))] == [("fray.triton", 0.889)]
