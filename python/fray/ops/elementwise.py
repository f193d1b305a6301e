"""The elementwise family: vector_add (out = a + b), mul (out = a * b) and axpy (out = a * x + b for
scalars a and b: a scale and shift, the name and arguments fusedtok users know).

mul and axpy are flat ops on the shared machinery of fray._flat (the layout rules below, custom
ops fray::mul and fray::axpy); vector_add keeps its own path (its in-place custom op).

Validation happens here, once; the kernels (cuda/elementwise, fray_triton.elementwise) see flat
arrays and trust their inputs. The GPU entry points are torch custom ops (fray::vector_add, and
fray::vector_add_ for out= a or b) with fake implementations, so torch.compile(fullgraph=True)
traces through them; in eager mode a call validates its signature once and launches from the cached
plan after that (fray._plan), checking per call only what a plan cannot hold (whether out partially
overlaps a or b). CPU tensors and
numpy arrays run the float64 reference and come back in the input's dtype.

Layout: a, b (and out) must be dense -- contiguous, or any permutation of a contiguous layout
(what x.t() of a contiguous x gives) -- and share one layout, so that element i of the flat
storage is the same logical element in all of them. Anything else is refused (ValueError naming
the argument) rather than silently copied.
"""
import numpy as np
import torch

from fray import _flat as F
from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray.reference import convert as C
from fray.reference import elementwise as ref

FAMILY = "elementwise"
OPS = ("vector_add", "mul", "axpy")
__all__ = list(OPS)
for _name in OPS:
    B.register_preference(_name, ("cuda", "triton"))


# ---------------------------------------------------------------------------------------------
# validation

def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


_layout = F.dense_layout  # its error message names a, b and out: vector_add's arguments


def _check_tensors(a, b, out):
    V.require_tensor("a", a)
    V.require_tensor("b", b)
    V.require_tensor("out", out, allow_none=True)
    V.require_device_family("a", a)
    V.require_same_device([("a", a), ("b", b), ("out", out)])
    V.require_float_dtype("a", a)
    for name, t in (("b", b), ("out", out)):
        if t is not None and t.dtype != a.dtype:
            raise TypeError("%s: expected dtype %s (that of a), got %s" % (name, _dtype_name(a.dtype),
                                                                          _dtype_name(t.dtype)))
    for name, t in (("b", b), ("out", out)):
        if t is not None and t.shape != a.shape:
            raise ValueError("%s: expected shape %s (that of a; no broadcasting), got %s" % (
                name, tuple(a.shape), tuple(t.shape)))
    if a.numel() == 0:
        return
    layout = _layout("a", a)
    for name, t in (("b", b), ("out", out)):
        if t is not None and _layout(name, t) != layout:
            raise ValueError("%s: expected the strides of a %s (one shared layout), got %s" % (
                name, a.stride(), t.stride()))
    # (Storage addresses are not traceable; under torch.compile functionalisation orders the
    # reads and writes anyway.)
    if out is not None and not _compiling():
        _check_out_overlap(a, b, out)


def _check_out_overlap(a, b, out):
    """What a plan cannot hold: whether out partially overlaps a or b (their addresses)."""
    for name, t in (("a", a), ("b", b)):
        if _overlaps_partially(out, t):
            raise ValueError("out: overlaps %s without being %s itself (in place needs out to be "
                             "exactly a or b)" % (name, name))


_overlaps_partially = F.overlaps_partially


def _check_arrays(a, b, out):
    for name, x in (("a", a), ("b", b), ("out", out)):
        if x is None:
            continue
        if not isinstance(x, np.ndarray):
            raise TypeError("%s: expected a numpy.ndarray like a, got %s" % (name, type(x).__name__))
        if x.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError("%s: expected a float16/float32/float64 array, got %s" % (name, x.dtype))
    for name, x in (("b", b), ("out", out)):
        if x is not None and x.dtype != a.dtype:
            raise TypeError("%s: expected dtype %s (that of a), got %s" % (name, a.dtype, x.dtype))
        if x is not None and x.shape != a.shape:
            raise ValueError("%s: expected shape %s (that of a; no broadcasting), got %s" % (name, a.shape, x.shape))


# ---------------------------------------------------------------------------------------------
# GPU implementation: a launch plan (fray._plan) per call signature; the custom ops (what a
# torch.compile'd graph calls) use the same plans under keys of their own

def _vector_add_plan(a, backend):
    """The launch plan of one call, taking (a, b, out)."""
    n = a.numel()
    if n == 0:
        return P.NOOP
    be = B.resolve("vector_add", FAMILY, backend, a.device)
    if be == "cuda":
        return P.CudaPlan(B.load_extension(FAMILY).vector_add, (n, V.DTYPE_CODES[a.dtype]), (), a.device)
    from fray_triton import elementwise as tew
    return P.TritonPlan(lambda a_, b_, o_: tew.vector_add(a_, b_, o_, n), a.device)


def _vector_add_impl(a, b, out, backend):
    key = P.signature("vector_add:op", backend, (a,))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _vector_add_plan(a, backend))
    plan((a, b, out))


@P.custom_op("fray::vector_add", mutates_args=("out",))
def _vector_add_op(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, backend: str) -> None:
    _vector_add_impl(a, b, out, backend)


@P.custom_op("fray::vector_add_", mutates_args=("a",))
def _vector_add_inplace_op(a: torch.Tensor, b: torch.Tensor, backend: str) -> None:
    _vector_add_impl(a, b, a, backend)


for _op in (_vector_add_op, _vector_add_inplace_op):
    _op.register_fake(lambda *args, **kwargs: None)


# ---------------------------------------------------------------------------------------------
# public API

def _reference(a, b):
    """float64 a + b rounded to a's dtype, as a's kind of object and shape (0-d included)."""
    return C.like(ref.vector_add(C.to_f64(a), C.to_f64(b)), a).reshape(a.shape)


def vector_add(a, b, *, out=None, backend="auto"):
    """out = a + b, elementwise, for a and b of one shape, dtype (fp32/fp16/bf16) and device.

    Math in fp32, one rounding to the dtype (bitwise what torch.add gives). a and b (and out)
    must be contiguous, or share one dense layout (e.g. both transposed); no broadcasting.
    out: preallocated result, may be a or b itself (in place). CUDA tensors run on the current
    stream without host synchronisation; CPU tensors and numpy arrays run the float64 reference.
    """
    if not _compiling():
        key = P.signature("vector_add", backend, (a, b, out))
        plan = P.PLANS.get(key)
        if plan is not None:
            if out is None:
                out = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            elif out is not a and out is not b:
                _check_out_overlap(a, b, out)
            plan((a, b, out))
            return out
    V.require_backend(backend, B.BACKENDS)
    if V.is_array(a):
        _check_arrays(a, b, out)
        y = _reference(a, b)
        if out is not None:
            out[...] = y
            return out
        return y
    _check_tensors(a, b, out)
    if a.device.type == "cpu":
        V.require_cpu_backend(backend, "a")
        y = _reference(a, b)
        if out is None:
            return y
        out.copy_(y)
        return out
    if out is None:
        out = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
    if _compiling():
        if out is a:
            torch.ops.fray.vector_add_(a, b, backend)
        elif out is b:
            torch.ops.fray.vector_add_(b, a, backend)  # a + b == b + a, bit for bit
        else:
            torch.ops.fray.vector_add(a, b, out, backend)
    else:
        P.PLANS.put(key, _vector_add_plan(a, backend))((a, b, out))
    return out


_compiling = P.compiling


# ---------------------------------------------------------------------------------------------
# mul and axpy

def _triton_mul(a, b, out, n):
    from fray_triton import elementwise as tew
    tew.mul(a, b, out, n)


def _triton_axpy(x, out, n, a, b):
    from fray_triton import elementwise as tew
    tew.axpy(x, out, n, a, b)


@P.custom_op("fray::mul", mutates_args=("out",))
def _mul_op(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, backend: str) -> None:
    _MUL.launch((a, b), out, (), backend)


@P.custom_op("fray::axpy", mutates_args=("out",))
def _axpy_op(x: torch.Tensor, out: torch.Tensor, a: float, b: float, backend: str) -> None:
    _AXPY.launch((x,), out, (a, b), backend)


for _op in (_mul_op, _axpy_op):
    _op.register_fake(lambda *args, **kwargs: None)

_MUL = F.FlatOp("mul", FAMILY, ("a", "b"), ref.mul, lambda ext: ext.mul, _triton_mul,
                custom_op=lambda a, b, out, backend: torch.ops.fray.mul(a, b, out, backend))
_AXPY = F.FlatOp("axpy", FAMILY, ("x",), ref.axpy, lambda ext: ext.axpy, _triton_axpy,
                 custom_op=lambda x, out, a, b, backend: torch.ops.fray.axpy(x, out, a, b, backend))


def mul(a, b, *, out=None, backend="auto"):
    """out = a * b, elementwise; shapes, dtypes, layouts, out and devices as in vector_add.

    Math in fp32, one rounding to the dtype (bitwise what torch.mul gives).
    """
    return _MUL((a, b), out, (), backend)


def _scalar(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError("%s: expected a Python float, got %s" % (name, type(v).__name__))
    v = float(v)
    if not np.isfinite(np.float32(v)):
        raise ValueError("%s: expected a value finite in fp32, got %r" % (name, v))
    return v


def axpy(x, a=1.0, b=0.0, *, out=None, backend="auto"):
    """out = a * x + b, elementwise, for Python floats a and b (a scale and shift).

    x: fp32/fp16/bf16, layouts, out and devices as in vector_add. a and b are rounded to fp32; the
    kernels compute one fp32 fma(a, x, b) and round once to x's dtype (the float64 reference is
    within half an fp32 ulp of that).
    """
    a, b = _scalar("a", a), _scalar("b", b)
    return _AXPY((x,), out, (a, b), backend)


# ---------------------------------------------------------------------------------------------
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

def check_cases(device):
    """On a GPU: every available backend x dtype x a few awkward sizes. On the CPU: the reference
    against hand-computed values and the Triton kernel under Triton's interpreter."""
    from fray.testing import assert_close

    def run(backend, dtype, n, dev):
        a = torch.randn(n, device=dev).to(dtype)
        b = torch.randn(n, device=dev).to(dtype)
        if backend == "triton-interpreter":
            from fray_triton import elementwise as tew
            y = torch.full_like(a, float("nan"))
            tew.vector_add(a, b, y, n)
        else:
            y = vector_add(a, b, backend=backend)
        assert_close(y, ref.vector_add(a.double(), b.double()), dtype, "vector_add")

    def hand():
        y = vector_add(np.array([1.0, -2.5, 3.0]), np.array([0.5, 2.5, -4.0]))
        np.testing.assert_array_equal(y, [1.5, 0.0, -1.0])

    def run_flat(op, backend, dtype, n, dev):
        a = torch.randn(n, device=dev).to(dtype)
        b = torch.randn(n, device=dev).to(dtype)
        if op == "mul":
            want = ref.mul(a.double(), b.double())
        else:
            want = ref.axpy(a.double(), -1.75, 0.3)
        if backend == "triton-interpreter":
            from fray_triton import elementwise as tew
            y = torch.full_like(a, float("nan"))
            tew.mul(a, b, y, n) if op == "mul" else tew.axpy(a, y, n, -1.75, 0.3)
        else:
            y = mul(a, b, backend=backend) if op == "mul" else axpy(a, -1.75, 0.3, backend=backend)
        assert_close(y, want, dtype, op)

    def hand_flat():
        np.testing.assert_array_equal(mul(np.array([1.5, -2.0, 0.0]), np.array([2.0, 3.0, -1.0])), [3.0, -6.0, 0.0])
        np.testing.assert_array_equal(axpy(np.array([1.0, -2.0]), 2.0, 0.5), [2.5, -3.5])

    cases = []
    if device.type != "cuda":
        cases.append(("vector_add", "reference", "fp64", "hand", hand))
        cases.append(("mul+axpy", "reference", "fp64", "hand", hand_flat))
        for dtype in (torch.float32, torch.bfloat16):
            cases.append(("vector_add", "triton-interpreter", V.DTYPE_NAMES[dtype], "1000",
                          lambda d=dtype: run("triton-interpreter", d, 1000, "cpu")))
            for op in ("mul", "axpy"):
                cases.append((op, "triton-interpreter", V.DTYPE_NAMES[dtype], "1000",
                              lambda o=op, d=dtype: run_flat(o, "triton-interpreter", d, 1000, "cpu")))
        return cases
    def rows(op, backend):
        return [(V.DTYPE_NAMES[dtype], str(n),
                 (lambda b=backend, d=dtype, k=n: run(b, d, k, device)) if op == "vector_add" else
                 (lambda o=op, b=backend, d=dtype, k=n: run_flat(o, b, d, k, device)))
                for dtype in (torch.float32, torch.float16, torch.bfloat16) for n in (1, 4097, 1 << 20)]
    return B.gpu_check_rows(FAMILY, ("mul", "axpy", "vector_add"), device, rows)
