"""`bazel run //:fray -- <command>`

  ops           operators, backends, and whether each backend can run here (and why not)
  check         run every operator on this machine against the float64 reference: on a GPU every
                available backend x fp32/fp16/bf16 x a few awkward shapes; on a CPU-only machine
                the reference (against hand-computed values) and the Triton kernels under
                Triton's interpreter. Prints a pass/fail table; exits 1 on any failure.
  bench <op>    run the op's benchmark (see bench/<family>/), flags as the bench binaries take
"""
import os
import sys

from absl import app, flags

from fray.bench import main as _bench_main  # noqa: F401  (defines the bench flags: --out, ...)

flags.DEFINE_string("device", None, "cuda device for `check` (default: cuda if available, else cpu)")


def _cmd_ops():
    import torch

    import fray
    from fray import backend as B
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    print("device: %s" % (torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (no CUDA device)"))
    print("%-14s %-8s %-10s %s" % ("op", "family", "backend", "status here"))
    for op, family in fray.OPS.items():
        print("%-14s %-8s %-10s %s" % (op, family, "reference", "available (CPU tensors, numpy)"))
        for backend, reason in B.available(op, fray.CUDA_FAMILY[op], dev).items():
            print("%-14s %-8s %-10s %s" % ("", "", backend, "available" if reason is None else "unavailable: " + reason))
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


def _cmd_check(device_flag):
    import torch

    import fray
    use_gpu = torch.cuda.is_available() if device_flag is None else device_flag.startswith("cuda")
    device = torch.device(device_flag or "cuda") if use_gpu else torch.device("cpu")
    checks = [c for module in fray.FAMILIES.values() for c in module.check_cases(device)]
    failed = 0
    print("%-14s %-20s %-9s %-10s %s" % ("op", "backend", "dtype", "shape", "result"))
    for op, backend, dtype, shape, fn in checks:
        if isinstance(fn, Exception):
            result = "SKIP (%s)" % fn
        else:
            try:
                fn()
                result = "PASS"
            except Exception as exc:  # report every failure, keep going
                failed += 1
                result = "FAIL: %s" % str(exc).strip().splitlines()[0][:120]
        print("%-14s %-20s %-9s %-10s %s" % (op, backend, dtype, shape, result))
    print("%d passed, %d failed" % (sum(1 for c in checks if not isinstance(c[4], Exception)) - failed, failed))
    return 1 if failed else 0


def _bench_ops():
    """{benchmark name: family}: every op, plus the names a family's benchmark module lists in
    BENCH_OPS (benchmarks of one op under several settings, e.g. sample_topp)."""
    import importlib

    import fray
    names = dict(fray.OPS)
    for family in fray.FAMILIES:
        try:
            module = importlib.import_module("fray.bench." + family)
        except ModuleNotFoundError as exc:
            if exc.name != "fray.bench." + family:
                raise
            continue  # a family without benchmarks
        names.update((name, family) for name in getattr(module, "BENCH_OPS", ()))
    return names


def _cmd_bench(args):
    from fray.bench.main import run_op
    names = _bench_ops()
    if len(args) != 1 or args[0] not in names:
        raise app.UsageError("bench: expected one op name (%s), got %s" % (", ".join(sorted(names)), args))
    run_op(names[args[0]], args[0])
    return 0


def main(argv):
    args = argv[1:]
    if not args or args[0] in ("-h", "help"):
        print(__doc__)
        return 0
    cmd, rest = args[0], args[1:]
    if cmd == "check" and not rest:
        import torch
        if not torch.cuda.is_available() and flags.FLAGS.device is None:
            # No GPU: run the Triton kernels in Triton's interpreter (must be set before import).
            os.environ["TRITON_INTERPRET"] = "1"
        return _cmd_check(flags.FLAGS.device)
    if cmd == "ops" and not rest:
        return _cmd_ops()
    if cmd == "bench":
        return _cmd_bench(rest)
    raise app.UsageError("unknown command %r; expected ops, check or bench <op>" % " ".join(args))


def run():
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    run()
