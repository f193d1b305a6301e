"""The softmax family: softmax (temperature, any stride-1 dim, out_dtype) and online_softmax (the
softmax plus each row's max and log-sum-exp).

Validation happens here, once; the kernels (cuda/softmax, fray_triton.softmax) trust their inputs.
GPU entry points are torch custom ops (fray::softmax, fray::online_softmax) with fake
implementations, so torch.compile(fullgraph=True) traces through them; in eager mode the same
implementation is called directly (no dispatcher overhead). CPU tensors and numpy arrays run the
float64 reference and come back in the requested dtype.

Special rows (same on every backend): an all -inf row gives NaN (as torch.softmax) and
row_max = row_lse = -inf (as torch.logsumexp); rows holding NaN or +inf give NaN outputs, and a
row holding a NaN has row_max = NaN (as torch.max; the property tests found both kernels skipping
NaNs with tl.max / fmaxf, fixed on 2026-12-02).

dim: the kernels reduce a dimension of stride 1. dim = -1 of a tensor whose last dim is contiguous
is the usual case; any other dim works without a copy when it has stride 1 (e.g. a transposed
view of a contiguous tensor) and the remaining dims collapse to evenly strided rows. Anything
else is a ValueError that says so: Fray never copies silently.
"""
import math

import numpy as np
import torch

from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray.reference import convert as C
from fray.reference import softmax as ref

FAMILY = "softmax"
OPS = ("softmax", "online_softmax")
__all__ = ["softmax", "online_softmax"]
B.register_preference("softmax", ("cuda", "triton"))
B.register_preference("online_softmax", ("cuda", "triton"))

_LOG2E = 1.4426950408889634
_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_NUMPY_OUT = {torch.float32: np.float32, torch.float16: np.float16}
# plain type tuples (not the numbers ABCs): cheap, and traced by torch.compile without a break
_INTS = (int, np.integer)
_REALS = (int, float, np.integer, np.floating)


def _name(dtype):
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------------------------
# validation

def _check_temperature(temperature):
    if isinstance(temperature, bool) or not isinstance(temperature, _REALS):
        raise TypeError("temperature: expected a float, got %s" % type(temperature).__name__)
    t = float(temperature)
    # The kernels multiply by log2(e) / temperature in fp32: that must stay finite.
    if not (math.isfinite(t) and t > 0 and _LOG2E / t < 3.0e38):
        raise ValueError("temperature: expected a finite value > 0 (with 1/temperature a finite float32), got %r"
                         % (temperature,))
    return t


def _check_dim(dim, ndim):
    if isinstance(dim, bool) or not isinstance(dim, _INTS):
        raise TypeError("dim: expected an int, got %s" % type(dim).__name__)
    if not -ndim <= dim < ndim:
        raise ValueError("dim: expected a value in [%d, %d] for a %d-d x, got %d" % (-ndim, ndim - 1, ndim, dim))
    return int(dim) % ndim


def _check_out_dtype(out_dtype, x_dtype):
    if out_dtype is None:
        return x_dtype
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in _OUT_DTYPES:
        raise TypeError("out_dtype: expected None, torch.float32, torch.float16 or torch.bfloat16, got %r"
                        % (out_dtype,))
    return out_dtype


def _numpy_out_dtype(out_dtype, x):
    if out_dtype is None:
        return x.dtype
    if isinstance(out_dtype, torch.dtype):
        if out_dtype not in _NUMPY_OUT:
            raise TypeError("out_dtype: %s has no numpy counterpart (x is a numpy array); use float32 or float16"
                            % _name(out_dtype))
        return np.dtype(_NUMPY_OUT[out_dtype])
    try:
        d = np.dtype(out_dtype)
    except TypeError:
        d = None
    if d is None or d not in (np.float16, np.float32, np.float64):
        raise TypeError("out_dtype: expected None or a float16/float32/float64 dtype for a numpy x, got %r"
                        % (out_dtype,))
    return d


def _row_layout(name, t, dim, writable=False):
    """(t with `dim` moved last, its row stride): the view the kernels walk, or a ValueError."""
    last = t.dim() - 1
    if dim != last:
        if t.shape[dim] > 1 and t.stride(dim) != 1:
            raise ValueError(
                "%s: the softmax dimension (dim=%d) must have stride 1, got stride %d; dim != -1 runs on a "
                "transposed view without copying (pass %s.movedim(%d, -1).contiguous() and dim=-1 instead)"
                % (name, dim, t.stride(dim), name, dim))
        t = t.movedim(dim, -1)
    return t, V.row_stride(name, t, writable=writable)


def _check_tensor_x(x):
    V.require_tensor("x", x)
    V.require_device_family("x", x)
    V.require_float_dtype("x", x)
    if x.dim() == 0:
        raise ValueError("x: expected at least 1 dimension (the softmax one), got a 0-d tensor")


def _check_tensor_out(out, x, dtype, what):
    V.require_tensor("out", out)
    V.require_same_device([("x", x), ("out", out)])
    if out.dtype != dtype:
        raise TypeError("out: expected dtype %s (%s), got %s" % (_name(dtype), what, _name(out.dtype)))
    V.require_shape("out", out, x.shape)


def _check_array(x, out):
    for name, a in (("x", x), ("out", out)):
        if a is None:
            continue
        if not isinstance(a, np.ndarray):
            raise TypeError("%s: expected a numpy.ndarray like x, got %s" % (name, type(a).__name__))
    if x.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError("x: expected a float16/float32/float64 array, got %s" % x.dtype)
    if x.ndim == 0:
        raise ValueError("x: expected at least 1 dimension (the softmax one), got a 0-d array")
    if out is not None:
        V.require_shape("out", out, x.shape)


# ---------------------------------------------------------------------------------------------
# GPU implementations: launch plans (fray._plan), built once per call signature; the custom ops
# (what a torch.compile'd graph calls) use the same plans under keys of their own

def _softmax_plan(x, out, dim, temperature, backend):
    """The launch plan of one softmax call, taking (x, out)."""
    if x.numel() == 0:
        return P.NOOP
    be = B.resolve("softmax", FAMILY, backend, x.device)
    xv, sx = _row_layout("x", x, dim)
    ov, so = _row_layout("out", out, dim, writable=True)
    cols = xv.shape[-1]
    rows = xv.numel() // cols
    if be == "cuda":  # x.movedim(dim, -1) starts where x does: the launcher takes x's address
        plan = P.CudaPlan(B.load_extension(FAMILY).softmax,
                          (sx, so, rows, cols, V.DTYPE_CODES[x.dtype], V.DTYPE_CODES[out.dtype]), (temperature,),
                          x.device)
        return lambda t: plan((t[0], t[1], None, None))
    from fray_triton import softmax as tsoftmax
    sms, last = B.num_sms(x.device.index), x.dim() - 1
    return P.TritonPlan(lambda x_, o_: tsoftmax.softmax(x_.movedim(dim, -1) if dim != last else x_,
                                                        o_.movedim(dim, -1) if dim != last else o_,
                                                        temperature, sx, so, rows, cols, num_sms=sms), x.device)


def _online_softmax_plan(x, out, backend):
    """The launch plan of one online_softmax call, taking (x, out, row_max, row_lse)."""
    cols = x.shape[-1]
    if x.numel() == 0:
        if cols == 0:  # max and log-sum-exp of nothing
            def fill(t):
                t[2].fill_(float("-inf"))
                t[3].fill_(float("-inf"))
            return fill
        return P.NOOP
    be = B.resolve("online_softmax", FAMILY, backend, x.device)
    sx, so = V.row_stride("x", x), V.row_stride("out", out, writable=True)
    rows = x.numel() // cols
    if be == "cuda":
        code = V.DTYPE_CODES[x.dtype]
        return P.CudaPlan(B.load_extension(FAMILY).softmax, (sx, so, rows, cols, code, code), (1.0,), x.device)
    from fray_triton import softmax as tsoftmax
    sms = B.num_sms(x.device.index)
    return P.TritonPlan(lambda x_, o_, m_, l_: tsoftmax.softmax(x_, o_, 1.0, sx, so, rows, cols, row_max=m_,
                                                                row_lse=l_, num_sms=sms), x.device)


def _softmax_impl(x, out, dim, temperature, backend):
    key = P.signature("softmax:op", backend, (x, out), (dim, temperature))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _softmax_plan(x, out, dim, temperature, backend))
    plan((x, out))


def _online_softmax_impl(x, out, row_max, row_lse, backend):
    tensors = (x, out, row_max, row_lse)
    key = P.signature("online_softmax:op", backend, tensors)
    plan = P.PLANS.get(key) or P.PLANS.put(key, _online_softmax_plan(x, out, backend))
    plan(tensors)


@P.custom_op("fray::softmax", mutates_args=("out",))
def _softmax_op(x: torch.Tensor, out: torch.Tensor, dim: int, temperature: float, backend: str) -> None:
    _softmax_impl(x, out, dim, temperature, backend)


@P.custom_op("fray::online_softmax", mutates_args=("out", "row_max", "row_lse"))
def _online_softmax_op(x: torch.Tensor, out: torch.Tensor, row_max: torch.Tensor, row_lse: torch.Tensor,
                       backend: str) -> None:
    _online_softmax_impl(x, out, row_max, row_lse, backend)


for _op in (_softmax_op, _online_softmax_op):
    _op.register_fake(lambda *args, **kwargs: None)


_compiling = P.compiling


def _cpu_backend_check(backend):
    V.require_cpu_backend(backend, "x")


def _reference_softmax(x64, temperature, dim):
    if x64.size == 0:
        return x64.copy()
    return ref.softmax(x64, temperature, axis=dim)


def _reference_online(x64):
    if x64.size == 0:
        lead = x64.shape[:-1]
        fill = -np.inf if x64.shape[-1] == 0 else np.nan  # shape (..., 0): max/lse of nothing
        return x64.copy(), np.full(lead, fill), np.full(lead, fill)
    return ref.online_softmax(x64)


# ---------------------------------------------------------------------------------------------
# public API

def softmax(x, *, temperature=1.0, dim=-1, out_dtype=None, out=None, backend="auto"):
    """softmax(x / temperature) along `dim`, numerically stable for any row width.

    x: fp32/fp16/bf16 with at least 1 dim. dim: a dimension of stride 1 (dim=-1 on a tensor whose
    last dim is contiguous; another dim on a view where it has stride 1, e.g. a transpose); the
    other dims must collapse to evenly strided rows (slices of wider buffers are fine). No copies
    are made: other layouts raise ValueError. temperature: finite, > 0. out_dtype: None (x's dtype)
    or torch.float32/float16/bfloat16. out: preallocated result of x's shape and the output dtype
    (may be x itself for an in-place softmax of the same dtype). Math in fp32, one rounding. CUDA
    tensors run on the current stream without host synchronisation; CPU tensors and numpy arrays
    run the float64 reference. An all -inf row gives NaN, as torch.softmax does.
    """
    if not _compiling():
        key = P.signature("softmax", backend, (x, out), (temperature, dim, out_dtype))
        plan = P.PLANS.get(key)
        if plan is not None:
            if out is None:
                out = _softmax_out(x, plan.dim, plan.odt)
            plan((x, out))
            return out
    V.require_backend(backend, B.BACKENDS)
    temperature = _check_temperature(temperature)
    if V.is_array(x):
        _check_array(x, out)
        dim = _check_dim(dim, x.ndim)
        y = _reference_softmax(C.to_f64(x), temperature, dim).astype(_numpy_out_dtype(out_dtype, x))
        if out is not None:
            out[...] = y
            return out
        return y
    _check_tensor_x(x)
    dim = _check_dim(dim, x.dim())
    odt = _check_out_dtype(out_dtype, x.dtype)
    if out is not None:
        _check_tensor_out(out, x, odt, "out_dtype" if out_dtype is not None else "that of x")
    if x.numel() > 0:  # an empty tensor has no rows to lay out
        _row_layout("x", x, dim)
        if out is not None:
            _row_layout("out", out, dim, writable=True)
    if x.device.type == "cpu":
        _cpu_backend_check(backend)
        y = torch.from_numpy(np.ascontiguousarray(_reference_softmax(C.to_f64(x), temperature, dim))).to(odt)
        if out is not None:
            out.copy_(y)
            return out
        return y
    if out is None:
        out = _softmax_out(x, dim, odt)
    if _compiling():
        torch.ops.fray.softmax(x, out, dim, temperature, backend)
    else:
        P.PLANS.put(key, _Planned(_softmax_plan(x, out, dim, temperature, backend), dim, odt))((x, out))
    return out


class _Planned:
    """A softmax plan with what allocating its output needs (the normalised dim and out dtype)."""

    __slots__ = ("plan", "dim", "odt")

    def __init__(self, plan, dim, odt):
        self.plan, self.dim, self.odt = plan, dim, odt

    def __call__(self, tensors):
        self.plan(tensors)


def _softmax_out(x, dim, odt):
    if dim == x.dim() - 1:
        return torch.empty_like(x, dtype=odt, memory_format=torch.contiguous_format)
    # rows laid out like the kernels write them: dim contiguous
    moved = x.shape[:dim] + x.shape[dim + 1:] + x.shape[dim:dim + 1]
    return torch.empty(moved, dtype=odt, device=x.device).movedim(-1, dim)


def online_softmax(x, *, out=None, backend="auto"):
    """Softmax over the last dim plus its statistics: returns (y, row_max, row_lse).

    y = softmax(x) in x's dtype (into `out` when given; out may be x); row_max = max(x) and
    row_lse = log(sum(exp(x))) (natural log) per row, fp32 tensors of shape x.shape[:-1]. The row
    is read once (rows wider than the CUDA backend's on-chip capacity, 1.75 MB of 16-byte-aligned
    row (917504 fp16/bf16 or 458752 fp32 elements) or 32768 elements of an unaligned one, and the
    Triton backend's 32768, are read twice) with an online max/sum rescaling. An all -inf row gives
    y = NaN and row_max = row_lse = -inf. Layout rules as softmax(dim=-1).
    """
    if not _compiling():
        key = P.signature("online_softmax", backend, (x, out))
        plan = P.PLANS.get(key)
        if plan is not None:
            return _online_launch(plan, x, out)
    V.require_backend(backend, B.BACKENDS)
    if V.is_array(x):
        _check_array(x, out)
        y, m, lse = _reference_online(C.to_f64(x))
        y = y.astype(x.dtype)
        m, lse = np.asarray(m, np.float32), np.asarray(lse, np.float32)
        if out is not None:
            out[...] = y
            y = out
        return y, m, lse
    _check_tensor_x(x)
    if out is not None:
        _check_tensor_out(out, x, x.dtype, "that of x")
    if x.numel() > 0:
        V.row_stride("x", x)
        if out is not None:
            V.row_stride("out", out, writable=True)
    if x.device.type == "cpu":
        _cpu_backend_check(backend)
        y, m, lse = _reference_online(C.to_f64(x))
        y = C.like(y, x)
        m = torch.from_numpy(np.array(m, dtype=np.float32))  # np.array keeps 0-d statistics 0-d
        lse = torch.from_numpy(np.array(lse, dtype=np.float32))
        if out is not None:
            out.copy_(y)
            y = out
        return y, m, lse
    if _compiling():
        if out is None:
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        row_max = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        row_lse = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        torch.ops.fray.online_softmax(x, out, row_max, row_lse, backend)
        return out, row_max, row_lse
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    return _online_launch(P.PLANS.put(key, _online_softmax_plan(x, out, backend)), x, out)


def _online_launch(plan, x, out):
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    row_max = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    row_lse = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    plan((x, out, row_max, row_lse))
    return out, row_max, row_lse


# ---------------------------------------------------------------------------------------------
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

def check_cases(device):
    """On a GPU: every available backend x dtype x a few awkward shapes. On the CPU: the reference
    against hand-computed values and the Triton kernels under Triton's interpreter."""
    from fray.testing import assert_close

    def run(op, backend, dtype, rows, cols, dev):
        x = (torch.randn(rows, cols, device=dev) * 3).to(dtype)
        ey, em, el = ref.online_softmax(x.double())
        if backend == "triton-interpreter":
            from fray_triton import softmax as tsoftmax
            y = torch.full_like(x, float("nan"))
            m = torch.full((rows,), float("nan"))
            lse = torch.full((rows,), float("nan"))
            tsoftmax.softmax(x, y, 1.0, cols, cols, rows, cols, row_max=m, row_lse=lse)
        elif op == "softmax":
            y = softmax(x, backend=backend)
        else:
            y, m, lse = online_softmax(x, backend=backend)
        assert_close(y, ey, dtype, op)
        if op == "online_softmax" or backend == "triton-interpreter":
            assert_close(m, em, torch.float32, op + " max")
            assert_close(lse, el, torch.float32, op + " lse")

    def hand():
        np.testing.assert_allclose(softmax(np.array([0.0, math.log(3.0)])), [0.25, 0.75], rtol=1e-12)
        y, m, lse = online_softmax(np.array([[0.0, math.log(3.0)]]))
        np.testing.assert_allclose(lse, [math.log(4.0)], rtol=1e-6)
        assert np.isnan(softmax(np.full((1, 3), -np.inf))).all()

    cases = []
    if device.type != "cuda":
        cases.append(("softmax+online", "reference", "fp64", "hand", hand))
        for dtype in (torch.float32, torch.bfloat16):
            for rows, cols in ((3, 100), (2, 40000)):
                cases.append(("softmax", "triton-interpreter", V.DTYPE_NAMES[dtype], "%dx%d" % (rows, cols),
                              lambda d=dtype, r=rows, c=cols: run("softmax", "triton-interpreter", d, r, c, "cpu")))
        return cases
    return B.gpu_check_cases(FAMILY, OPS, device, ((1, 1), (7, 4097), (64, 65536), (3, 262144)), run)
