"""The elementwise family: vector_add (out = a + b).

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

from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray.reference import convert as C
from fray.reference import elementwise as ref

FAMILY = "elementwise"
OPS = ("vector_add",)
__all__ = ["vector_add"]
B.register_preference("vector_add", ("cuda", "triton"))


# ---------------------------------------------------------------------------------------------
# validation

def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _layout(name, t):
    """The strides of t's non-trivial (size > 1) dims, after checking that t is dense: its
    elements fill numel consecutive slots of memory (a permutation of a contiguous layout).
    That holds iff every such stride is the product of the sizes of the dims with smaller
    strides and no two are equal. (Pairwise comparisons rather than a sort: torch.compile
    traces comparisons of symbolic sizes, not sorts of them.)"""
    dims = [(size, st) for size, st in zip(t.shape, t.stride()) if size > 1]
    for i, (_, st) in enumerate(dims):
        expected = 1
        for j, (size2, st2) in enumerate(dims):
            if j != i and st2 == st:
                expected = -1  # two dims on one stride: overlapping
                break
            if st2 < st:
                expected *= size2
        if st != expected:
            raise ValueError(
                "%s: expected a contiguous tensor (or a dense permutation of one, shared by a, b and "
                "out); got shape %s with strides %s" % (name, tuple(t.shape), t.stride()))
    return tuple(st for _, st in dims)


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


def _overlaps_partially(x, y):
    """True when x and y share memory but are not the same elements (same start, same layout)."""
    if x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr():
        return False
    if x.data_ptr() == y.data_ptr():
        return False  # same start, and the layouts were checked equal: the same elements
    size = x.numel() * x.element_size()
    return x.data_ptr() < y.data_ptr() + size and y.data_ptr() < x.data_ptr() + size


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


@torch.library.custom_op("fray::vector_add", mutates_args=("out",))
def _vector_add_op(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, backend: str) -> None:
    _vector_add_impl(a, b, out, backend)


@torch.library.custom_op("fray::vector_add_", mutates_args=("a",))
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

    cases = []
    if device.type != "cuda":
        cases.append(("vector_add", "reference", "fp64", "hand", hand))
        for dtype in (torch.float32, torch.bfloat16):
            cases.append(("vector_add", "triton-interpreter", V.DTYPE_NAMES[dtype], "1000",
                          lambda d=dtype: run("triton-interpreter", d, 1000, "cpu")))
        return cases
    for backend, reason in B.available("vector_add", FAMILY, device).items():
        if reason is not None:
            cases.append(("vector_add", backend, "-", "-", RuntimeError("unavailable: " + reason)))
            continue
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for n in (1, 4097, 1 << 20):
                cases.append(("vector_add", backend, V.DTYPE_NAMES[dtype], str(n),
                              lambda b=backend, d=dtype, k=n: run(b, d, k, device)))
    return cases
