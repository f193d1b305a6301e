"""GEMM benchmark: fray.cuda (JIT CUTLASS / small-M kernels), fray.triton, torch.mm (cuBLAS) and
torch.compile(mode="max-autotune") of the matmul, in one process, b as [N, K] (nn.Linear's).

flops = 2·M·N·K; bytes (the gbps column, M <= 64 only, where the weight stream bounds the time)
= N·K·s(b). Shapes: the issue's 4096³, 8192³, 4096x14336x4096, 4096x4096x14336 and M in
{1, 16, 64, 128} x (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336)} in bf16, one fp16 row
per shape class (4096³, 1x4096x4096, 16x14336x4096). Each impl gets the do_bench median with the
L2 flushed (3 interleaved rounds; ":graph" rows under 50 us) and a "<shape>:kineto" row,
fray.bench_kineto's device time of its kernels (L2 flushed, 30 calls). torch.compile max-autotune
runs at 4096³ and 1x4096x4096 only (MAX_AUTOTUNE_SHAPES: minutes of autotuning per shape).

Set-up costs, recorded as rows of their own (us = the time in µs, `note` says what):
  shape "<shape>:setup"      per fray impl, the first call at the shape: JIT compile (if the
                             kernel is not cached), tuning (if no persisted or shipped choice),
                             load; `compiles` and `tunings` count what it did;
  shape "all:cold_compile"   the shipped-default kernels of every shape built in parallel into
                             the cache before the timing (0 compiles when the cache is warm);
  shape "<shape>:warm_first_call"  a new process with the cache warm: import-to-result of its
                             first call (bar: <= 50 ms, no compile, no tuning);
  shape "1x1024x1024:host"   eager host cost per call (2000 back-to-back calls, one
                             synchronisation) of fray.cuda, fray.triton and torch.mm (bar: fray.cuda
                             <= 1.1x torch.mm).
"""
import json
import os
import subprocess
import sys
import textwrap
import time

import torch

import fray

LARGE = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096), (4096, 4096, 14336)]
NK = [(4096, 4096), (14336, 4096), (4096, 14336)]
SHAPES = {"gemm": [(m, n, k, torch.bfloat16) for m, n, k in LARGE]
          + [(m, n, k, torch.bfloat16) for m in (1, 16, 64, 128) for n, k in NK]
          + [(4096, 4096, 4096, torch.float16), (1, 4096, 4096, torch.float16), (16, 14336, 4096, torch.float16)]}
WARM_SHAPES = [(4096, 4096, 4096), (1, 4096, 4096)]
# Host cost: a decode-sized GEMM whose kernel (~3 us) is shorter than a call's host work, so
# back-to-back calls with one synchronisation measure the host (as bench/host does for the others).
HOST_SHAPE = (1, 1024, 1024)
# Inductor's max-autotune benchmarks its own Triton configs for minutes per shape: one large and
# one decode shape keep the run inside the GPU machine's 10-minute command limit.
MAX_AUTOTUNE_SHAPES = ((4096, 4096, 4096), (1, 4096, 4096))
HOST_CALLS = 2000

# Kernel names in the profiler trace, per impl (the first that matches is used).
KINETO_NAMES = {
    "fray.cuda": ("GemmUniversal", "small_m_kernel", "small_m_bulk_kernel"),
    "fray.triton": ("_gemm_kernel",),
    "torch.mm": ("nvjet", "gemm", "xmma", "Kernel"),
    "torch.compile": ("triton", "nvjet", "gemm", "xmma", "Kernel"),
}


def parse_shapes(op, text):
    """'MxNxK[:dtype],...' -> [(M, N, K, dtype)]."""
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    out = []
    for item in text.split(","):
        dims, _, dt = item.partition(":")
        m, n, k = (int(v) for v in dims.split("x"))
        out.append((m, n, k, dtypes[dt or "bf16"]))
    return out


def _kineto_us(fn, impl):
    for name in KINETO_NAMES.get(impl, ()):
        try:
            return round(fray.bench_kineto(fn, name, num_tests=30) * 1e6, 3)
        except RuntimeError:
            continue
    return None


def _shipped_kernels(shapes):
    """(name, source, flags) of the shipped-default kernel of every shape (the cold build)."""
    from fray import tune
    from fray.ops import gemm as G
    shipped = tune._shipped(torch.cuda.get_device_name())
    items = set()
    for m, n, k, dtype in shapes:
        small = m <= G._SMALL_M
        kernel = "gemm_small_m" if small else "gemm_sm90"
        key = "|".join([kernel, G.bucket(m, n, k, "nk", False, dtype, dtype), "fp16" if dtype == torch.float16 else "bf16"])
        config = shipped.get(key)
        if config is not None:
            items.add(G.kernel_source(config, dtype, dtype, "nk", False) + ((),))
    return sorted(items)


def _warm_process(m, n, k):
    """First-call time of a new process whose cache is warm (what a server restart sees)."""
    script = textwrap.dedent("""
        import json, time
        t0 = time.perf_counter()
        import torch
        import fray
        from fray import jit, tune
        a = torch.randn(%d, %d, device="cuda").to(torch.bfloat16)
        b = torch.randn(%d, %d, device="cuda").to(torch.bfloat16)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        fray.gemm(a, b, backend="cuda")
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(json.dumps({"first_call_ms": 1e3 * (t2 - t1), "import_ms": 1e3 * (t1 - t0),
                          "compiles": jit.stats["compiles"], "tunings": tune.stats["tunings"]}))
    """ % (m, k, n, k))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ),
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _host_us(fn, calls=HOST_CALLS):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / calls


def _host_rows(op, recorder):
    from fray.bench import median, time_rounds
    m, n, k = HOST_SHAPE
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    bt = b.t()
    impls = {"fray.cuda": lambda: fray.gemm(a, b, backend="cuda"),
             "fray.triton": lambda: fray.gemm(a, b, backend="triton"),
             "torch.mm": lambda: torch.mm(a, bt)}
    for fn in impls.values():
        fn()  # plan, tuning and compile happen here, not in the timing
    for impl, rounds in time_rounds(impls, _host_us).items():
        if isinstance(rounds, Exception):
            recorder.add(op, impl, "%dx%dx%d:host" % HOST_SHAPE, torch.bfloat16, None, note="error: %s" % str(rounds)[:200])
        else:
            recorder.add(op, impl, "%dx%dx%d:host" % HOST_SHAPE, torch.bfloat16, median(rounds),
                         rounds=[round(u, 3) for u in rounds], note="eager host cost per call")


def run(op, recorder, shapes=None, graph=True):
    if op != "gemm":
        raise ValueError("op: expected gemm, got %r" % op)
    from fray import jit, tune
    from fray.bench import bench_impls
    shapes = shapes or SHAPES[op]
    t0 = time.monotonic()
    before = jit.stats["compiles"]
    built = jit.build_many(_shipped_kernels(shapes))
    failed = [str(b).splitlines()[0][:200] for b in built if isinstance(b, Exception)]
    recorder.add(op, "fray.cuda", "all:cold_compile", "bf16", (time.monotonic() - t0) * 1e6,
                 note="%d shipped-default kernels built in parallel (FRAY_JIT_MAX_WORKERS)" % len(built),
                 compiles=jit.stats["compiles"] - before, failed=failed or None)
    for m, n, k, dtype in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", generator=g).to(dtype)
        b = torch.randn(n, k, device="cuda", generator=g).to(dtype)
        out = torch.empty(m, n, device="cuda", dtype=dtype)
        bt = b.t()
        shape = "%dx%dx%d" % (m, n, k)
        impls = {
            "fray.cuda": lambda: fray.gemm(a, b, out=out, backend="cuda"),
            "fray.triton": lambda: fray.gemm(a, b, out=out, backend="triton"),
            "torch.mm": lambda: torch.mm(a, bt, out=out),
        }
        for impl in ("fray.cuda", "fray.triton"):
            c0, t_0, s0 = jit.stats["compiles"], time.monotonic(), tune.stats["tunings"]
            try:
                impls[impl]()
                torch.cuda.synchronize()
                recorder.add(op, impl, shape + ":setup", dtype, (time.monotonic() - t_0) * 1e6,
                             note="first call: compile + tune + load", compiles=jit.stats["compiles"] - c0,
                             tunings=tune.stats["tunings"] - s0)
            except Exception as exc:  # the row says why; the timing loop records the error too
                recorder.add(op, impl, shape + ":setup", dtype, None, note="error: %s" % str(exc)[:200])
        if dtype == torch.bfloat16 and (m, n, k) in MAX_AUTOTUNE_SHAPES:
            try:
                compiled = torch.compile(lambda x, w: x @ w.t(), mode="max-autotune")
                compiled(a, b)
                impls["torch.compile"] = lambda: compiled(a, b)
            except Exception as exc:  # where Inductor cannot autotune, the row says so
                recorder.add(op, "torch.compile", shape, dtype, None, note="error: %s" % str(exc)[:200])
        flops = 2.0 * m * n * k
        nbytes = n * k * b.element_size() if m <= 64 else None
        bench_impls(recorder, op, shape, dtype, impls, nbytes, flops, graph=graph)
        for impl, fn in impls.items():
            us = _kineto_us(fn, impl)
            recorder.add(op, impl, shape + ":kineto", dtype, us, nbytes, flops,
                         note="fray.bench_kineto: device time of the kernels, L2 flushed, 30 calls"
                         if us is not None else "no kernel of this impl recognised in the trace")
        del impls, a, b, out
        torch.cuda.empty_cache()
    _host_rows(op, recorder)
    for m, n, k in WARM_SHAPES:
        shape = "%dx%dx%d" % (m, n, k)
        try:
            rep = _warm_process(m, n, k)
            recorder.add(op, "fray.cuda", shape + ":warm_first_call", "bf16", rep["first_call_ms"] * 1e3,
                         note="new process, warm cache: first call (import %.0f ms)" % rep["import_ms"],
                         compiles=rep["compiles"], tunings=rep["tunings"])
        except Exception as exc:
            recorder.add(op, "fray.cuda", shape + ":warm_first_call", "bf16", None, note="error: %s" % str(exc)[:200])
