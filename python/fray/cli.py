"""fray: Fray's command line (`fray <command>` after pip install, `bazel run //:fray -- <command>`).

  ops           operators, backends, and whether each backend can run here (and why not)
  check [OP...] run every operator (or the ones named) on this machine against the float64
                reference: on a GPU every available backend x fp32/fp16/bf16 x a few awkward
                shapes; on a CPU-only machine the reference (against hand-computed values) and the
                Triton kernels under Triton's interpreter. One line per case as it finishes; exits
                1 on any failure.
  bench <op>    run the op's benchmark (see bench/<family>/; needs a GPU): one line per record as
                it is measured, then the table; exits 1 if any implementation failed.
                `bench host`: every op's eager per-call host cost beside torch's (bench/host/);
                `bench e2e`: a Llama-shaped decoder step from Fray ops vs torch (bench/e2e/);
                `bench soak`: a toy decode loop replayed as a CUDA graph for --steps steps,
                checked against eager runs every --check_every steps (bench/soak/)
  plot          charts from --results_dir (bench/results/h200) into --charts_dir (docs/charts):
                one PNG per family (every implementation against the best peer, losses in red)
                and roofline.png (achieved TB/s under the H200's ceilings); needs matplotlib.

--json prints one JSON object per line instead (cases, records, then a summary object).
"""
import json
import os
import sys
import time

from absl import app, flags

from fray.bench import main as _bench_main  # noqa: F401  (defines the bench flags: --out, ...)

flags.DEFINE_string("device", None, "cuda device for `check` (default: cuda if available, else cpu)")
flags.DEFINE_bool("json", False, "print JSON lines (one object per case or record, then a summary)")

flags.DEFINE_string("results_dir", None, "`plot`: benchmark JSON lines (default: bench/results/h200 of the checkout)")
flags.DEFINE_string("charts_dir", None, "`plot`: where the PNGs go (default: docs/charts of the checkout)")

FLAGS = flags.FLAGS


def _emit(obj):
    print(json.dumps(obj), flush=True)


class _Columns:
    """Left-aligned columns as wide as their widest cell (known before any row is printed) plus
    one trailing free-width column, so rows can be printed as they come."""

    def __init__(self, header, rows):
        self.widths = [max(len(str(c)) for c in col) for col in zip(header[:-1], *[r[:len(header) - 1] for r in rows])]

    def line(self, cells):
        fixed = "  ".join(str(c).ljust(w) for c, w in zip(cells[:-1], self.widths))
        return fixed + "  " + str(cells[-1])


def _cmd_ops():
    import torch

    import fray
    from fray import backend as B
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    rows = []
    for op, family in fray.OPS.items():
        rows.append((op, family, "reference", None, "available (CPU tensors, numpy)"))
        for backend, reason in B.available(op, fray.CUDA_FAMILY[op], dev).items():
            rows.append((op, family, backend, reason, "available" if reason is None else "unavailable: " + reason))
    device = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (no CUDA device)"
    if FLAGS.json:
        _emit({"device": device})
        for op, family, backend, reason, _ in rows:
            _emit({"op": op, "family": family, "backend": backend, "available": reason is None, "reason": reason})
        _emit({"jit": _jit_line(dev)})
        return 0
    print("device: %s" % device)
    header = ("op", "family", "backend", "status here")
    cols = _Columns(header, [r[:3] + (r[4],) for r in rows])
    print(cols.line(header))
    last = None
    for op, family, backend, _, status in rows:
        print(cols.line(("", "", backend, status) if op == last else (op, family, backend, status)))
        last = op
    print(_jit_line(dev))
    return 0


def _jit_line(dev):
    """One line on the run-time compiler: nvcc, CUTLASS, the device's arch, the cache."""
    from fray import jit
    s = jit.status()
    parts = ["nvcc %s (%s)" % (s["nvcc_release"], s["nvcc"]) if s["nvcc"] else "no nvcc"]
    parts.append("cutlass %s" % s["cutlass"] if s["cutlass"] else "no cutlass (pip install nvidia-cutlass)")
    if s["include_root"] is None:
        parts.append("Fray headers missing")
    if dev.type == "cuda":
        try:
            parts.append("sm_%s" % jit._device_arch(dev.index))
        except RuntimeError as exc:
            parts.append("unsupported device: %s" % str(exc).split("; ")[-1])
    else:
        parts.append("no device (compile_only)")
    return "jit: %s; cache %s" % (", ".join(parts), s["cache"])


def _checked(case_op, ops):
    """Whether a check case belongs to one of the named ops (a case may cover several: "a+b")."""
    return ops is None or any(name in ops for name in case_op.split("+"))


def _cmd_check(device_flag, ops=None):
    import torch

    import fray
    use_gpu = torch.cuda.is_available() if device_flag is None else device_flag.startswith("cuda")
    device = torch.device(device_flag or "cuda") if use_gpu else torch.device("cpu")
    families = fray.FAMILIES
    if ops is not None:
        unknown = sorted(set(ops) - set(fray.OPS))
        if unknown:
            raise app.UsageError("check: no operator %s; expected some of: %s" % (", ".join(unknown),
                                                                                ", ".join(sorted(fray.OPS))))
        families = {f: m for f, m in fray.FAMILIES.items() if f in {fray.OPS[op] for op in ops}}
    checks = [c for module in families.values() for c in module.check_cases(device) if _checked(c[0], ops)]
    counts = {"pass": 0, "fail": 0, "skip": 0}
    header = ("case", "op", "backend", "dtype", "shape", "result")
    n = len(checks)
    cols = _Columns(header, [("%d/%d" % (n, n), op, backend, dtype, shape) for op, backend, dtype, shape, _ in checks])
    if not FLAGS.json:
        print(cols.line(header), flush=True)
    for i, (op, backend, dtype, shape, fn) in enumerate(checks):
        start = time.perf_counter()
        error = None
        if isinstance(fn, Exception):
            result, error = "skip", str(fn)
        else:
            try:
                fn()
                result = "pass"
            except Exception as exc:  # report every failure, keep going
                result, error = "fail", (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        seconds = time.perf_counter() - start
        counts[result] += 1
        if FLAGS.json:
            _emit({"op": op, "backend": backend, "dtype": str(dtype), "shape": str(shape), "result": result,
                   "error": error, "seconds": round(seconds, 3)})
        else:
            text = {"pass": "PASS", "fail": "FAIL: %s" % error, "skip": "SKIP (%s)" % error}[result]
            print(cols.line(("%d/%d" % (i + 1, n), op, backend, dtype, shape, "%s  %.1fs" % (text, seconds)
                             if result != "skip" else text)), flush=True)
    if FLAGS.json:
        _emit({"passed": counts["pass"], "failed": counts["fail"], "skipped": counts["skip"], "device": str(device)})
    else:
        print("%d passed, %d failed, %d skipped" % (counts["pass"], counts["fail"], counts["skip"]))
    return 1 if counts["fail"] else 0


# Benchmarks of no one family (bench/<name>/, fray.bench.<name>): the eager host cost of every op,
# a decoder step built from Fray ops, and a long decode loop under graph replay.
WHOLE_LIBRARY_BENCHES = ("host", "e2e", "soak")


def _bench_ops():
    """{benchmark name: family}: every op, plus the names a family's benchmark module lists in
    BENCH_OPS (benchmarks of one op under several settings, e.g. sample_topp)."""
    import importlib

    import fray
    names = dict(fray.OPS)
    for family in tuple(fray.FAMILIES) + WHOLE_LIBRARY_BENCHES:
        try:
            module = importlib.import_module("fray.bench." + family)
        except ModuleNotFoundError as exc:
            if exc.name != "fray.bench." + family:
                raise
            continue  # a family without benchmarks
        names.update((name, family) for name in getattr(module, "BENCH_OPS", ()))
    return names


def _progress_recorder(out_path, as_json):
    """A bench Recorder that reports every record as it is added."""
    from fray.bench import Recorder

    class Progress(Recorder):
        failed = 0

        def add(self, op, impl, shape, dtype, us, nbytes=None, flops=None, **extra):
            rec = super().add(op, impl, shape, dtype, us, nbytes, flops, **extra)
            if rec["us"] is None:
                Progress.failed += 1
            if as_json:
                _emit(rec)
            else:
                speed = "%.2f us" % rec["us"] if rec["us"] is not None else rec.get("note", "error")
                rate = ("  %.0f GB/s" % rec["gbps"]) if rec.get("gbps") else ""
                print("%s %s %s %s: %s%s" % (rec["op"], rec["shape"], rec["dtype"], rec["impl"], speed, rate),
                      flush=True)
            return rec

        def table(self, file=sys.stdout):
            if not as_json:
                super().table(file)

    return Progress(out_path)


def _cmd_bench(args):
    from fray.bench.main import run_op
    names = _bench_ops()
    if len(args) != 1 or args[0] not in names:
        raise app.UsageError("bench: expected one op name (%s), got %s" % (", ".join(sorted(names)), args))
    rec = run_op(names[args[0]], args[0], recorder=_progress_recorder(FLAGS.out, FLAGS.json))
    if FLAGS.json:
        _emit({"records": len(rec.records), "failed": rec.failed})
    return 1 if rec.failed else 0


def _cmd_plot():
    from fray.bench import plot
    # `bazel run` starts in the runfiles; the checkout is where `bazel run` was called from.
    root = os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.getcwd()
    results = FLAGS.results_dir or os.path.join(root, "bench", "results", "h200")
    charts = FLAGS.charts_dir or os.path.join(root, "docs", "charts")
    for path in plot.render(results, charts):
        if FLAGS.json:
            _emit({"chart": path})
        else:
            print(path)
    return 0


def main(argv):
    args = argv[1:]
    if not args or args[0] == "help":
        print(__doc__)
        return 0
    cmd, rest = args[0], args[1:]
    if cmd == "check":
        import torch
        if not torch.cuda.is_available() and FLAGS.device is None:
            # No GPU: run the Triton kernels in Triton's interpreter (must be set before import).
            os.environ["TRITON_INTERPRET"] = "1"
        return _cmd_check(FLAGS.device, rest or None)
    if cmd == "ops" and not rest:
        return _cmd_ops()
    if cmd == "bench":
        return _cmd_bench(rest)
    if cmd == "plot" and not rest:
        return _cmd_plot()
    raise app.UsageError("unknown command %r; expected ops, check [op...], bench <op> or plot" % " ".join(args))


def run():
    """The console script `fray` (and `bazel run //:fray`): absl parses the flags, --help prints
    this module's docstring and the flags."""
    sys.modules["__main__"].__doc__ = __doc__
    # absl's --help lists the key flags of the program named by argv[0]; the console script is a
    # stub that defines none, so name this module's and the bench flags for it.
    for name in ("device", "json", "results_dir", "charts_dir", "out", "graph", "shapes", "steps", "check_every"):
        FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[name])
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    run()
