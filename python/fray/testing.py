"""Shared test helpers: the one tolerance table, keyed by dtype, and the comparison."""
import numpy as np
import torch

# Outputs are rounded once to the dtype after fp32 math: the error is at most half an ulp plus a
# little fp32 error, so rtol is the dtype's machine epsilon (2^-7 bf16, 2^-10 fp16: twice the
# worst rounding) and 1e-5 for fp32 outputs (fp32 accumulation over up to 64K terms). atol only
# covers results that land among subnormals.
TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-6),
    torch.float16: dict(rtol=2.0 ** -10, atol=1e-5),
    torch.bfloat16: dict(rtol=2.0 ** -7, atol=1e-5),
}


def tolerance(dtype):
    return TOLERANCES[dtype]


def _cpu_f64(v):
    """A tensor or array as a float64 CPU tensor."""
    if isinstance(v, torch.Tensor):
        return v.detach().to("cpu", torch.float64)
    return torch.from_numpy(np.asarray(v, np.float64))


def assert_close(actual, expected_f64, dtype, what="", scale=None):
    """actual (any device/dtype) vs a float64 reference (numpy or tensor), dtype-scaled.

    scale: for ops whose result is a sum that can cancel (layernorm's w * x_hat + b, x_hat itself a
    difference), the float64 magnitude of the terms. Rounding errors are relative to the terms, not
    to the (possibly near-zero) result, so the bound becomes atol + rtol * max(|expected|, scale).
    """
    a, e = _cpu_f64(actual), _cpu_f64(expected_f64)
    assert a.shape == e.shape, "%s: shape %s != %s" % (what, tuple(a.shape), tuple(e.shape))
    assert torch.isfinite(a).all(), "%s: non-finite values in the result" % what
    if scale is None:
        torch.testing.assert_close(a, e, msg=lambda m: "%s (%s)\n%s" % (what, dtype, m), **TOLERANCES[dtype])
        return
    tol = TOLERANCES[dtype]
    _assert_within(a, e, lambda: tol["atol"] + tol["rtol"] * torch.maximum(e.abs(), _cpu_f64(scale)),
                   "%s (%s)" % (what, dtype), what)


def layernorm_scale(x, w, b, eps):
    """The `scale` of layernorm's result for assert_close: the magnitude of the terms of
    w * x_hat + b, i.e. |w| (|x_hat| + 1) + |b|, the + 1 being x_hat's absolute error floor
    (x - mean is a difference)."""
    from fray.reference import norm as ref
    xd = x.to(torch.float64)
    xhat = torch.as_tensor(ref.layernorm(xd, torch.ones_like(w, dtype=torch.float64), None, eps))
    s = w.to(torch.float64).abs() * (xhat.abs() + 1.0)
    return s if b is None else s + b.to(torch.float64).abs()


# GEMM: the output is rounded once (TOLERANCES' rtol of the output dtype) after an fp32 sum of K
# products (exact for bf16/fp16 inputs). That sum's rounding error grows like sqrt(K) * 2^-24 of
# the terms' magnitude sum_k |a_ik b_kj| for random data (K * 2^-24 is the never-reached worst
# case); GEMM_ACC_FACTOR covers the blocked order of tensor-core sums with a margin. Dropping or
# doubling one 64-wide K block moves an element by ~8 |a||b| at K >= 4096, far outside the bound.
GEMM_ACC_FACTOR = 8.0


def gemm_bound(expected_f64, terms, out_dtype, k):
    """Elementwise error bound of a GEMM result: atol + rtol(out) |expected| + factor sqrt(K) 2^-24 terms."""
    tol = TOLERANCES[out_dtype]
    e = expected_f64.abs() if isinstance(expected_f64, torch.Tensor) else np.abs(expected_f64)
    return tol["atol"] + tol["rtol"] * e + GEMM_ACC_FACTOR * (max(k, 1) ** 0.5) * 2.0 ** -24 * terms


def assert_gemm_close(actual, expected_f64, terms, out_dtype, k, what=""):
    """actual vs the float64 GEMM reference, within gemm_bound (terms: reference.gemm.term_scale)."""
    a, e, t = _cpu_f64(actual), _cpu_f64(expected_f64), _cpu_f64(terms)
    _assert_within(a, e, lambda: gemm_bound(e, t, out_dtype, k), "%s (%s, K=%d)" % (what, out_dtype, k), what)


def _assert_within(a, e, bound_fn, label, what):
    """Every element of a (finite, e's shape) within bound_fn() of e; label heads the message."""
    assert a.shape == e.shape, "%s: shape %s != %s" % (what, tuple(a.shape), tuple(e.shape))
    assert torch.isfinite(a).all(), "%s: non-finite values in the result" % what
    bound = bound_fn()
    err = (a - e).abs()
    bad = err > bound
    assert not bad.any(), "%s: %d of %d elements off; worst error %.3g where the bound is %.3g" % (
        label, int(bad.sum()), err.numel(), float(err[bad].max()), float(bound[bad][err[bad].argmax()]))


def cuobjdump():
    """The path of cuobjdump (Triton's package carries one under backends/nvidia/bin), else the PATH's."""
    import pathlib
    import shutil
    import triton
    tool = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    tool = str(tool) if tool.is_file() else shutil.which("cuobjdump")
    assert tool, "cuobjdump not found (Triton's package carries one under backends/nvidia/bin)"
    return tool


def dump_sass(so):
    """The SASS of a compiled .so (cuobjdump --dump-sass), for tests that check what ptxas emitted."""
    import subprocess
    return subprocess.run([cuobjdump(), "--dump-sass", str(so)], capture_output=True, text=True).stdout


_SM90_COMPILE = r"""
import json, pathlib, re, shutil, subprocess, sys, tempfile, traceback
import importlib
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
tool = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
tool = str(tool) if tool.is_file() else shutil.which("cuobjdump")
out = []
for req in json.loads(sys.argv[1]):
    try:
        kernel = getattr(importlib.import_module(req["module"]), req["kernel"])
        sig = {p.name: "constexpr" if p.is_constexpr else req["types"].get(p.name, "i32") for p in kernel.params}
        attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(kernel.params) if p.name in req["divisible"]}
        options = dict(req["options"], num_warps=req["num_warps"], num_stages=req["num_stages"])
        c = triton.compile(ASTSource(kernel, sig, req["constexprs"], attrs), target=GPUTarget("cuda", 90, 32),
                           options=options)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(c.asm["cubin"])
            f.flush()
            sass = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout
        out.append({"shared": c.metadata.shared, "spills": len(re.findall(r"\b(?:STL|LDL)\b", sass)),
                    "wgmma": "wgmma" in c.asm["ptx"], "ptx_counts": {k: c.asm["ptx"].count(k) for k in req["count"]}})
    except Exception:
        out.append({"error": traceback.format_exc()[-3000:]})
print(json.dumps(out))
"""


def sm90_spec(module, kernel, types, constexprs, *, num_warps=4, num_stages=3, divisible=(), options=None,
              count=()):
    """One kernel specialisation for compile_triton_sm90 (see there). options: further compile
    options of the launch (e.g. {"enable_fp_fusion": False}); count: PTX substrings whose
    occurrences the result reports ("ptx_counts")."""
    return {"module": module, "kernel": kernel, "types": dict(types), "constexprs": dict(constexprs),
            "num_warps": num_warps, "num_stages": num_stages, "divisible": list(divisible),
            "options": dict(options or {}), "count": list(count)}


def compile_triton_sm90(specs):
    """Compiles Triton kernel specialisations (sm90_spec) for sm_90a without a GPU (Triton's own
    ptxas), all in one child process without TRITON_INTERPRET (under the interpreter @triton.jit
    builds no compilable function); returns per spec {"shared": bytes, "spills": STL/LDL count in
    the SASS, "wgmma": bool, "ptx_counts": {substring: occurrences in the PTX}}. Catches what the
    CPU interpreter never sees: type errors of the compiled path (fp8 casts, inconsistent
    returns), layouts, shared memory, register spills.
    Raises AssertionError with Triton's message for a kernel that does not compile.

    sm90_spec's types: parameter name -> Triton type ("*bf16", "*fp8e4nv", "fp32"; unnamed
    non-constexpr parameters are "i32"); constexprs: name -> value; divisible: the parameters
    specialised as multiples of 16 (pointers 16-byte aligned, strides multiples of 16), as a launch
    on aligned tensors would be."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    with tempfile.TemporaryDirectory(prefix="fray-sm90-") as cache:  # Triton's cache: writable, private
        env["TRITON_CACHE_DIR"] = cache
        p = subprocess.run([sys.executable, "-c", _SM90_COMPILE, json.dumps(list(specs))], capture_output=True,
                           text=True, env=env, timeout=900)
    assert p.returncode == 0, "the sm_90a compile process failed:\n" + p.stderr[-3000:]
    results = json.loads(p.stdout.strip().splitlines()[-1])
    for spec, r in zip(specs, results):
        assert "error" not in r, "%s.%s %s does not compile for sm_90a:\n%s" % (
            spec["module"], spec["kernel"], spec["constexprs"], r["error"])
    return results


def moe_bound(expected_f64, mag, terms, dtype):
    """Elementwise bound of an MoE result against fray.reference.moe (which rounds where the
    kernels round): a rounding the fp32 kernel takes the other way moves one contribution by up to
    one ulp of its projection and one of its weighted value (2 rtol of mag, the sum of the
    contributions' magnitudes), the final rounding half an ulp of the result, and ulp changes of a
    few h_i inside a second GEMM move it by a random-signed sum over terms (the root-sum-square of
    that GEMM's products): 2 rtol of terms is far beyond their spread (about rtol / 4 of terms when
    one h_i in 16 flips) and far under what a wrong expert, a lost route or a misplaced weight does."""
    tol = TOLERANCES[dtype]
    e = expected_f64.abs() if isinstance(expected_f64, torch.Tensor) else np.abs(expected_f64)
    return tol["atol"] + tol["rtol"] * (0.5 * e + 2.0 * mag + 2.0 * terms)


def assert_moe_close(actual, expected_f64, mag, terms, dtype, what="", rows=None):
    """actual [rows, N] vs fray.reference.moe's (expected, mag, terms), within moe_bound; rows: a
    boolean mask of the rows to compare (the rest are not written by the op)."""
    a, e, m, t = (_cpu_f64(v) for v in (actual, expected_f64, mag, terms))
    if rows is not None:
        keep = torch.from_numpy(np.asarray(rows, bool))
        a, e, m, t = a[keep], e[keep], m[keep], t[keep]
    _assert_within(a, e, lambda: moe_bound(e, m, t, dtype), "%s (%s)" % (what, dtype), what)


def stub_jit(monkeypatch):
    """For the ops layer's wiring tests on CPU tensors: fray.jit.build and the current stream
    stubbed. Returns (built, launched): the (name, source) of every build and the (ptrs, ints,
    floats) of every launch of the stub kernels it returns."""
    from fray import backend, jit
    built, launched = [], []

    class Kernel:
        def launch(self, ptrs, ints, floats, dev, stream):
            launched.append((ptrs, ints, floats))

    monkeypatch.setattr(jit, "build", lambda name, src, device: built.append((name, src)) or Kernel())
    monkeypatch.setattr(backend, "current_stream", lambda device: 0)
    return built, launched


def run_host_check(source, tmp_path):
    """Builds `source` (a C++ program printing "mismatches N") with nvcc against the headers the
    JIT uses (Fray's and CUTLASS's) for sm_90a, runs it on the host and returns its output; raises
    AssertionError unless it printed "mismatches 0". For kernels' index math checked without a
    GPU (layouts, masks)."""
    import subprocess
    from fray import jit
    src, exe = tmp_path / "check.cu", tmp_path / "check"
    src.write_text(source)
    subprocess.run([jit.nvcc_path(), "-std=c++17", "-O1", "--expt-relaxed-constexpr", "-arch=sm_90a",
                    "-I" + jit.include_root(), "-I" + jit.cutlass_include(), str(src), "-o", str(exe)],
                   check=True, capture_output=True, timeout=600)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "mismatches 0", run.stdout + run.stderr
    return run.stdout


def spawn_ranks(worker, world, args=(), deadline_s=240, what="group"):
    """Runs worker(rank, world, store_path, out_dir, *args) in `world` spawned processes (a
    distributed test's ranks; store_path: a FileStore path in a fresh temporary directory) and
    returns each rank's result, which the worker saves as out_dir/rank<r>.pt. A group that has not
    finished in deadline_s (a hung collective) is killed and fails the test instead of its target's
    timeout."""
    import os
    import tempfile
    import time
    import torch.multiprocessing as mp
    tmp = tempfile.mkdtemp(prefix="fray_ranks_")
    ctx = mp.start_processes(worker, args=(world, os.path.join(tmp, "store"), tmp) + tuple(args), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + deadline_s
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise AssertionError("%d-process %s did not finish in %d s" % (world, what, deadline_s))
    return [torch.load(os.path.join(tmp, "rank%d.pt" % r), weights_only=False) for r in range(world)]
