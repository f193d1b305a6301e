"""Every FRAY_* environment variable, read here and nowhere else.

FRAY_BACKEND          default for backend="auto": "cuda", "triton" or "reference" forces one
                      backend for every call that does not name one (unset: fastest verified).
FRAY_DISABLE_CUDA     "1": never load the compiled CUDA extensions (auto falls back to Triton).
FRAY_CHECK_INDICES    "1": validate device-side index tensors (lengths, block tables, positions,
                      cu_seqlens, MoE expert ids, group offsets and dispatches, penalty
                      histories) on every call, at the cost of a host synchronisation; refused
                      during CUDA-graph capture.
FRAY_COMMIT           commit hash stamped into benchmark results (the GPU bundle sets it, since
                      the GPU machine has no .git).

The JIT (fray.jit) and the tuner (fray.tune):
FRAY_CACHE_DIR        root of the kernel cache (jit/) and the tuning records (tune/); default
                      $XDG_CACHE_HOME/fray, else ~/.cache/fray.
FRAY_NVCC_COMPILER    the nvcc to run; default $CUDA_HOME/bin/nvcc, then nvcc on PATH, then
                      /usr/local/cuda/bin/nvcc.
FRAY_JIT_DEBUG        "1": print each generated source, the build command and the cache
                      decisions (hit, miss, stale entry) on stderr.
FRAYJIT_PRINT_NVCC_COMMAND  "1": print every nvcc command line on stderr (the seed's spelling).
FRAY_JIT_MAX_WORKERS  parallel nvcc processes when several kernels build at once (tuning);
                      default: the CPU count, at most 8.
FRAY_PTXAS_VERBOSE    "1": compile with -Xptxas -v and print ptxas's register / spill report (a
                      flag like any other: it is part of the cache key, so it recompiles).
FRAY_PRINT_AUTOTUNE   "1": print the tuner's table (config, us, TFLOP/s, chosen) and, when it does
                      not tune, where the choice came from (persisted, shipped default, heuristic).
FRAY_AUTOTUNE         "0": never tune; use the persisted choice, the shipped default or the
                      kernel's heuristic (default "1": tune a shape bucket the first time it runs).
FRAY_DISABLE_FFMA_INTERLEAVE  "1": build the promoting FP8 GEMMs without fray.jit.sass's FFMA
                      interleave pass; "0": with it; unset: the pass's default (off until measured).
FRAY_CUOBJDUMP        the cuobjdump the SASS pass lists kernels with (default: beside nvcc, then
                      Triton's copy, PATH, /usr/local/cuda/bin).
"""
import contextlib
import os


# os.environ.get encodes the key and decodes the value on every read (~1 µs). FRAY_BACKEND and
# FRAY_CHECK_INDICES are read on every eager call (FRAY_BACKEND is part of each launch plan's key),
# so they are read from the environ's raw mapping, which os.environ's setters (monkeypatch.setenv
# included) keep in step, and each raw value is decoded once.
_RAW_ENVIRON = getattr(os.environ, "_data", None)
_encoded_keys = {}
_decoded_values = {}


def _get(name):
    """os.environ.get(name), without the per-read encoding where the platform allows."""
    if _RAW_ENVIRON is None:
        return os.environ.get(name)
    key = _encoded_keys.get(name)
    if key is None:
        key = _encoded_keys[name] = os.environ.encodekey(name)
    raw = _RAW_ENVIRON.get(key)
    if raw is None:
        return None
    value = _decoded_values.get(raw)
    if value is None:
        value = _decoded_values[raw] = os.environ.decodevalue(raw)
    return value


_parsed = {}


def _parse(value, kind):
    """value stripped and lower-cased ("backend": or None when empty; "flag": true or false), once per value."""
    hit = _parsed.get((value, kind))
    if hit is None:
        v = value.strip().lower()
        hit = _parsed[(value, kind)] = ((v or None) if kind == "backend" else v in ("1", "true", "yes", "on"),)
    return hit[0]


def _flag(name):
    value = _get(name)
    return value is not None and _parse(value, "flag")


def backend_override():
    value = _get("FRAY_BACKEND")
    return None if value is None else _parse(value, "backend")


def cuda_disabled():
    return _flag("FRAY_DISABLE_CUDA")


def check_indices():
    return _flag("FRAY_CHECK_INDICES")


def commit():
    return os.environ.get("FRAY_COMMIT", "").strip() or None


def cache_dir():
    value = os.environ.get("FRAY_CACHE_DIR", "").strip()
    if value:
        return os.path.abspath(os.path.expanduser(value))
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fray")


def nvcc_candidates():
    """Where to look for nvcc, in order: FRAY_NVCC_COMPILER alone when set."""
    value = os.environ.get("FRAY_NVCC_COMPILER", "").strip()
    if value:
        return [value]
    out = []
    cuda_home = os.environ.get("CUDA_HOME", "").strip() or os.environ.get("CUDA_PATH", "").strip()
    if cuda_home:
        out.append(os.path.join(cuda_home, "bin", "nvcc"))
    out.append("nvcc")  # resolved on PATH by the caller
    out.append("/usr/local/cuda/bin/nvcc")
    return out


def jit_debug():
    return _flag("FRAY_JIT_DEBUG")


def print_nvcc_command():
    return _flag("FRAYJIT_PRINT_NVCC_COMMAND") or jit_debug()


def jit_max_workers():
    value = os.environ.get("FRAY_JIT_MAX_WORKERS", "").strip()
    if value:
        try:
            workers = int(value)
        except ValueError:
            raise ValueError("FRAY_JIT_MAX_WORKERS: expected a positive integer, got %r" % value) from None
        if workers < 1:
            raise ValueError("FRAY_JIT_MAX_WORKERS: expected a positive integer, got %r" % value)
        return workers
    return max(1, min(8, os.cpu_count() or 1))


def ptxas_verbose():
    return _flag("FRAY_PTXAS_VERBOSE")


def print_autotune():
    return _flag("FRAY_PRINT_AUTOTUNE")


def autotune_enabled():
    return os.environ.get("FRAY_AUTOTUNE", "1").strip().lower() not in ("0", "false", "no", "off")


def disable_ffma_interleave():
    """FRAY_DISABLE_FFMA_INTERLEAVE: True ("1"), False ("0") or None (unset: the default)."""
    value = os.environ.get("FRAY_DISABLE_FFMA_INTERLEAVE", "").strip()
    if not value:
        return None
    if value not in ("0", "1"):
        raise ValueError("FRAY_DISABLE_FFMA_INTERLEAVE: expected 0 or 1, got %r" % value)
    return value == "1"


def cuobjdump_override():
    return os.environ.get("FRAY_CUOBJDUMP", "").strip() or None


@contextlib.contextmanager
def scoped(name, value):
    """The FRAY_* variable `name` set to `value` inside the block, restored after (a benchmark
    timing both sides of a build-time switch, e.g. FRAY_DISABLE_FFMA_INTERLEAVE)."""
    if not name.startswith("FRAY_"):
        raise ValueError("env.scoped: expected a FRAY_* name, got %r" % name)
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
