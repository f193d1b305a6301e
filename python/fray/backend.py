"""Backends and how "auto" chooses among them.

"cuda"       the ahead-of-time compiled CUDA C++ kernels (fray._C._<family>), built for the
             architectures in --//tools:cuda_archs (default sm_90a: H100/H200 only).
"triton"     the Triton kernels (fray_triton); any CUDA GPU Triton supports.
"reference"  the CPU reference (float64 math); CPU tensors and numpy arrays always run it.

"auto" takes the first backend of the op's preference list that is available on the tensor's
device; the lists come from the H200 benchmarks (bench/results/h200) and are only trusted on the
devices those results were measured on (VERIFIED_CAPABILITIES); elsewhere "auto" prefers Triton.
FRAY_BACKEND overrides "auto" for every call.
"""
import functools
import importlib

import torch

from fray import env

BACKENDS = ("auto", "cuda", "triton", "reference")
VERIFIED_CAPABILITIES = {(9, 0)}

# op -> backends in order of measured speed on the verified devices
_PREFERENCE = {}
# op -> {backend: why it has no kernel for this op} (a family whose extension exists but lacks one op)
_MISSING = {}


def register_preference(op, order, missing=None):
    """order: the backends that implement `op`, fastest first; missing: {backend: reason} for the
    ones that do not yet (forcing one raises RuntimeError with the reason; `fray ops` shows it)."""
    _PREFERENCE[op] = tuple(order)
    _MISSING[op] = dict(missing or {})


def missing_reason(op, backend):
    """Why `backend` has no kernel for `op`, or None."""
    return _MISSING.get(op, {}).get(backend)


def _op_reason(op, backend, family, device):
    return missing_reason(op, backend) or unavailable_reason(backend, family, device)


try:  # the raw cudaStream_t of the current stream without building a torch.cuda.Stream object
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # CPU-only torch builds
    _raw_stream = None


def current_stream(device):
    """The raw cudaStream_t (an int) of `device`'s current stream, as the extensions take it."""
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


@functools.lru_cache(maxsize=None)
def load_extension(family):
    """The compiled module fray._C._<family>, or an ImportError describing why it is missing."""
    if env.cuda_disabled():
        return ImportError("FRAY_DISABLE_CUDA=1")
    try:
        return importlib.import_module("fray._C._" + family)
    except ImportError as exc:  # not built (e.g. a source checkout without Bazel)
        return exc


@functools.lru_cache(maxsize=None)
def extension_archs(family):
    ext = load_extension(family)
    if isinstance(ext, ImportError):
        return ()
    return tuple(a.strip() for a in ext.archs().split(",") if a.strip())


def _arch_matches(archs, cap):
    major, minor = cap
    for arch in archs:
        digits = arch.rstrip("a")
        if digits.isdigit() and (int(digits) // 10, int(digits) % 10) == (major, minor):
            return True
    return False


@functools.lru_cache(maxsize=None)
def num_sms(index):
    """The SM count of CUDA device `index` (cached)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _capability(index):
    return torch.cuda.get_device_capability(index)


# family -> fn(device) -> None or why not: families whose CUDA kernels are JIT-compiled (no
# fray._C._<family> extension to ask for its archs) say themselves whether they can run.
_CUDA_CHECKS = {}


def register_cuda_check(family, fn):
    _CUDA_CHECKS[family] = fn


def cuda_unavailable_reason(family, device):
    """None when the CUDA backend of `family` can run on `device`, else why not."""
    check = _CUDA_CHECKS.get(family)
    if check is not None:
        return check(device)
    ext = load_extension(family)
    if isinstance(ext, ImportError):
        return "the CUDA extension fray._C._%s is not available (%s)" % (family, ext)
    if device.type != "cuda":
        return "tensors are on %s" % device
    cap = _capability(device.index if device.index is not None else torch.cuda.current_device())
    archs = extension_archs(family)
    if not _arch_matches(archs, cap):
        return "fray._C._%s was built for sm_%s, the device is sm_%d%d" % (family, "/sm_".join(archs), cap[0], cap[1])
    return None


@functools.lru_cache(maxsize=None)
def _triton_import_error():
    try:
        import fray_triton  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def triton_unavailable_reason(device):
    err = _triton_import_error()
    if err:
        return "Triton is not importable (%s)" % err
    if device.type != "cuda":
        return "tensors are on %s" % device
    return None


def unavailable_reason(backend, family, device):
    if backend == "cuda":
        return cuda_unavailable_reason(family, device)
    if backend == "triton":
        return triton_unavailable_reason(device)
    return None


_RESOLVED = {}


def resolve(op, family, backend, device):
    """The concrete backend for one call on CUDA tensors; raises for a forced unavailable one.

    Resolutions are cached per (op, requested backend, device, FRAY_BACKEND): this runs on every
    eager call, where a few microseconds of Python matter for small shapes."""
    key = (op, backend, device, env.backend_override())
    hit = _RESOLVED.get(key)
    if hit is None:
        hit = _RESOLVED[key] = _resolve(op, family, backend, device)
    return hit


def _resolve(op, family, backend, device):
    if backend == "auto":
        backend = env.backend_override() or "auto"
    if backend == "reference":
        raise ValueError("backend: 'reference' runs on CPU tensors or numpy arrays; got tensors on %s "
                         "(move them with .cpu())" % device)
    if backend != "auto":
        reason = _op_reason(op, backend, family, device)
        if reason:
            raise RuntimeError("backend=%r cannot run %s: %s" % (backend, op, reason))
        return backend
    order = _PREFERENCE.get(op, ("cuda", "triton"))
    cap = _capability(device.index if device.index is not None else torch.cuda.current_device())
    if cap not in VERIFIED_CAPABILITIES:
        order = ("triton",) + tuple(b for b in order if b != "triton")
    reasons = []
    for b in order:
        reason = _op_reason(op, b, family, device)
        if reason is None:
            return b
        reasons.append("%s: %s" % (b, reason))
    raise RuntimeError("no backend can run %s on %s (%s)" % (op, device, "; ".join(reasons)))


def available(op, family, device):
    """{backend: None or the reason it is unavailable} for the CLI's `ops` table."""
    return {b: _op_reason(op, b, family, device) for b in ("cuda", "triton")}


def cpu_check_cases(label, hand, ops, run, rows=3, cols=100):
    """`fray check` rows without a GPU: the hand-computed reference check, then each op through the
    Triton interpreter in fp32 and bf16 at rows x cols, the thunk calling run(op, dtype, rows, cols)."""
    from fray._validate import DTYPE_NAMES
    cases = [(label, "reference", "fp64", "hand", hand)]
    for op in ops:
        for dtype in (torch.float32, torch.bfloat16):
            cases.append((op, "triton-interpreter", DTYPE_NAMES[dtype], "%dx%d" % (rows, cols),
                          lambda o=op, d=dtype: run(o, d, rows, cols)))
    return cases


def gpu_check_rows(family, ops, device, rows):
    """`fray check` rows for a GPU, the one loop every family's check_cases shares: for each op and
    backend, one row whose thunk is the reason (an exception) when the backend is unavailable,
    else (op, backend, *r) for each r = (dtype label, shape label, thunk) in rows(op, backend).
    family: the CUDA family of every op, or a function op -> family."""
    cases = []
    for op in ops:
        for backend, reason in available(op, family(op) if callable(family) else family, device).items():
            if reason is not None:
                cases.append((op, backend, "-", "-", RuntimeError("unavailable: " + reason)))
                continue
            cases.extend((op, backend) + tuple(r) for r in rows(op, backend))
    return cases


def gpu_check_cases(family, ops, device, shapes, run, dtypes=None):
    """gpu_check_rows over every dtype x shape, the thunk calling run(op, backend, dtype, *shape,
    device) and raising on a mismatch."""
    import functools

    from fray._validate import DTYPE_NAMES
    dtypes = dtypes or (torch.float32, torch.float16, torch.bfloat16)
    return gpu_check_rows(family, ops, device, lambda op, backend: [
        (DTYPE_NAMES[dtype], "x".join(str(v) for v in shape), functools.partial(run, op, backend, dtype, *shape, device))
        for dtype in dtypes for shape in shapes])
