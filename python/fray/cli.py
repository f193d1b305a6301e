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
        for backend, reason in B.available(op, family, dev).items():
            print("%-14s %-8s %-10s %s" % ("", "", backend, "available" if reason is None else "unavailable: " + reason))
    return 0


def _checks_cpu():
    """(name, callable) pairs for a machine without a GPU."""
    import numpy as np
    import torch

    import fray
    from fray.reference import norm as ref

    def ref_hand():
        y = fray.rmsnorm(np.array([[3.0, 4.0]]), np.array([1.0, 2.0]), eps=0.0)
        np.testing.assert_allclose(y, [[3 / 12.5 ** 0.5, 8 / 12.5 ** 0.5]], rtol=1e-12)
        y, s = fray.add_rmsnorm(np.array([[1.0, 1.0]]), np.array([[2.0, 3.0]]), np.array([1.0, 2.0]), eps=0.0)
        np.testing.assert_allclose(s, [[3.0, 4.0]])

    def triton_interp(dtype, op):
        from fray.testing import assert_close
        from fray_triton import norm as tnorm
        rows, hidden = 3, 100
        x = torch.randn(rows, hidden).to(dtype)
        r = torch.randn(rows, hidden).to(dtype)
        w = torch.randn(hidden).to(dtype)
        y = torch.full_like(x, float("nan"))
        if op == "rmsnorm":
            tnorm.rmsnorm(x, w, y, 1e-6, 0.0, hidden, hidden, rows, hidden)
            assert_close(y, ref.rmsnorm(x.double(), w.double(), 1e-6), dtype, op)
        else:
            s = torch.full_like(x, float("nan"))
            tnorm.add_rmsnorm(x, r, w, y, s, 1e-6, 0.0, hidden, hidden, hidden, hidden, rows, hidden)
            ey, es = ref.add_rmsnorm(x.double(), r.double(), w.double(), 1e-6,
                                     round_sum=lambda v: v.to(dtype).double())
            assert_close(y, ey, dtype, op)
            assert_close(s, es, dtype, op)

    checks = [("all", "reference", "fp64", "hand", ref_hand)]
    for op in ("rmsnorm", "add_rmsnorm"):
        for dtype in (torch.float32, torch.bfloat16):
            checks.append((op, "triton-interpreter", str(dtype).replace("torch.", ""), "3x100",
                           lambda d=dtype, o=op: triton_interp(d, o)))
    return checks


def _checks_gpu(device):
    import torch

    import fray
    from fray import backend as B
    from fray.reference import norm as ref
    from fray.testing import assert_close

    def one(op, backend, dtype, rows, hidden):
        x = torch.randn(rows, hidden, device=device).to(dtype)
        r = torch.randn(rows, hidden, device=device).to(dtype)
        w = torch.randn(hidden, device=device).to(dtype)
        if op == "rmsnorm":
            y = fray.rmsnorm(x, w, backend=backend)
            assert_close(y, ref.rmsnorm(x.double(), w.double(), 1e-6), dtype, op)
        else:
            y, s = fray.add_rmsnorm(x, r, w, backend=backend)
            ey, es = ref.add_rmsnorm(x.double(), r.double(), w.double(), 1e-6,
                                     round_sum=lambda v: v.to(dtype).double())
            assert_close(y, ey, dtype, op)
            assert_close(s, es, dtype, op)
        torch.cuda.synchronize()

    checks = []
    for op, family in fray.OPS.items():
        for backend, reason in B.available(op, family, device).items():
            if reason is not None:
                checks.append((op, backend, "-", "-", RuntimeError("unavailable: " + reason)))
                continue
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                for rows, hidden in ((1, 1), (7, 4097), (1024, 8192)):
                    checks.append((op, backend, str(dtype).replace("torch.", ""), "%dx%d" % (rows, hidden),
                                   lambda o=op, b=backend, d=dtype, r=rows, h=hidden: one(o, b, d, r, h)))
    return checks


def _cmd_check(device_flag):
    import torch
    use_gpu = torch.cuda.is_available() if device_flag is None else device_flag.startswith("cuda")
    if use_gpu:
        checks = _checks_gpu(torch.device(device_flag or "cuda"))
    else:
        checks = _checks_cpu()
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


def _cmd_bench(args):
    import fray
    from fray.bench.main import run_op
    if len(args) != 1 or args[0] not in fray.OPS:
        raise app.UsageError("bench: expected one op name (%s), got %s" % (", ".join(fray.OPS), args))
    run_op(fray.OPS[args[0]], args[0])
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
