"""The activation family: gated MLP activations silu_mul and gelu_mul, and the unary activations
silu, gelu (erf or tanh), relu, tanh and sigmoid.

The unary ops are flat elementwise ops (fray._flat: dense tensors of one layout, out may be x; one
custom op fray::unary over the activation code). silu and gelu evaluate the same fp32 functions as
silu_mul's and gelu_mul's gates, on CUDA and in Triton.

Two layouts, as engines and model files hold them:
  one tensor   x = [..., 2 d], gate in the first half of the last dim, up in the second
               (the output of a fused gate_up projection), out = act(x[..., :d]) * x[..., d:];
  two tensors  gate, up = [..., d] each, out = act(gate) * up.
Neither half is copied: the kernels read both halves of x in place through one row stride.

Validation happens here, once; the kernels (cuda/activation, fray_triton.activation) trust their
inputs. GPU entry points are torch custom ops (fray::silu_mul, fray::gelu_mul) with fake
implementations, so torch.compile(fullgraph=True) traces through them; in eager mode a call
validates its signature once and launches from the cached plan after that (fray._plan). CPU tensors and numpy arrays run the float64 reference and come
back in the input's dtype.
"""
from typing import Optional

import numpy as np
import torch

from fray import _flat as F
from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray.reference import activation as ref
from fray.reference import convert as C

FAMILY = "activation"
UNARY_OPS = ("silu", "gelu", "relu", "tanh", "sigmoid")
OPS = ("silu_mul", "gelu_mul") + UNARY_OPS
__all__ = list(OPS)
for _name in OPS:
    B.register_preference(_name, ("cuda", "triton"))

APPROXIMATIONS = ("none", "tanh")


# ---------------------------------------------------------------------------------------------
# validation

def _check_approximate(approximate):
    if not isinstance(approximate, str):
        raise TypeError("approximate: expected 'none' or 'tanh', got %s" % type(approximate).__name__)
    if approximate not in APPROXIMATIONS:
        raise ValueError("approximate: expected 'none' or 'tanh', got %r" % (approximate,))
    return approximate


def _half_width(x_shape, up):
    """d: the last dim of up / out. One-tensor form: half of x's (which must be even)."""
    n = x_shape[-1]
    if up is not None:
        return n
    if n % 2:
        raise ValueError("x: the last dimension holds the gate and up halves and must be even, got %d "
                         "(pass up= for separate gate and up tensors)" % n)
    return n // 2


def _dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def _check_tensors(x, up, out):
    """Returns d. Checks dtypes, devices, shapes and that every layout is row-strided."""
    V.require_tensor("x", x)
    V.require_tensor("up", up, allow_none=True)
    V.require_tensor("out", out, allow_none=True)
    V.require_device_family("x", x)
    V.require_float_dtype("x", x)
    if x.dim() == 0:
        raise ValueError("x: expected at least 1 dimension, got a 0-d tensor")
    V.require_same_device([("x", x), ("up", up), ("out", out)])
    d = _half_width(x.shape, up)
    if up is not None:
        if up.dtype != x.dtype:
            raise TypeError("up: expected dtype %s (that of x), got %s" % (_dtype_name(x), _dtype_name(up)))
        V.require_shape("up", up, x.shape)
        V.row_stride("up", up)
    V.row_stride("x", x)
    if out is not None:
        if out.dtype != x.dtype:
            raise TypeError("out: expected dtype %s (that of x), got %s" % (_dtype_name(x), _dtype_name(out)))
        V.require_shape("out", out, tuple(x.shape[:-1]) + (d,))
        V.row_stride("out", out, writable=True)
    return d


def _check_arrays(x, up, out):
    for name, a in (("x", x), ("up", up), ("out", out)):
        if a is None:
            continue
        if not isinstance(a, np.ndarray):
            raise TypeError("%s: expected a numpy.ndarray like x, got %s" % (name, type(a).__name__))
        if a.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError("%s: expected a float16/float32/float64 array, got %s" % (name, a.dtype))
    if x.ndim == 0:
        raise ValueError("x: expected at least 1 dimension, got a 0-d array")
    d = _half_width(x.shape, up)
    if up is not None:
        V.require_shape("up", up, x.shape)
    if out is not None:
        V.require_shape("out", out, tuple(x.shape[:-1]) + (d,))


def _reference(fn, x, up, out):
    """CPU path: float64 reference, rounded to x's dtype, as x's kind (numpy / torch)."""
    xf = C.to_f64(x)
    gate, u = ref.split(xf) if up is None else (xf, C.to_f64(up))
    y = C.like(fn(gate, u), x)
    if out is None:
        return y
    if isinstance(out, np.ndarray):
        out[...] = y
    else:
        out.copy_(y)
    return out


# ---------------------------------------------------------------------------------------------
# GPU implementations: launch plans (fray._plan), built once per call signature; the custom ops
# (what a torch.compile'd graph calls) use the same plans under keys of their own

_ACT_CODES = {("silu_mul", "none"): 0, ("gelu_mul", "none"): 1, ("gelu_mul", "tanh"): 2}


def _act_plan(op, x, up, out, approximate, backend):
    """The launch plan of one call, taking (x, up or None, out)."""
    n = x.shape[-1]
    d = n if up is not None else n // 2
    if d == 0 or out.numel() == 0:
        return P.NOOP
    rows = out.numel() // d
    be = B.resolve(op, FAMILY, backend, x.device)
    sx, so = V.row_stride("x", x), V.row_stride("out", out, writable=True)
    su = sx if up is None else V.row_stride("up", up)
    if be == "cuda":
        return P.CudaPlan(B.load_extension(FAMILY).act_mul,
                          (sx, su, so, rows, d, _ACT_CODES[(op, approximate)], V.DTYPE_CODES[x.dtype]), (),
                          x.device)
    from fray_triton import activation as tact
    act = tact.SILU if op == "silu_mul" else (tact.GELU_TANH if approximate == "tanh" else tact.GELU_ERF)
    return P.TritonPlan(lambda x_, up_, out_: tact.act_mul(x_, x_.narrow(-1, d, d) if up_ is None else up_, out_,
                                                           act, sx, su, so, rows, d), x.device)


def _act_impl(op, x, up, out, approximate, backend):
    tensors = (x, up, out)
    key = P.signature("activation:op", backend, tensors, (op, approximate))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _act_plan(op, x, up, out, approximate, backend))
    plan(tensors)


@P.custom_op("fray::silu_mul", mutates_args=("out",))
def _silu_mul_op(x: torch.Tensor, up: Optional[torch.Tensor], out: torch.Tensor, backend: str) -> None:
    _act_impl("silu_mul", x, up, out, "none", backend)


@P.custom_op("fray::gelu_mul", mutates_args=("out",))
def _gelu_mul_op(x: torch.Tensor, up: Optional[torch.Tensor], out: torch.Tensor, approximate: str,
                 backend: str) -> None:
    _act_impl("gelu_mul", x, up, out, approximate, backend)


for _op in (_silu_mul_op, _gelu_mul_op):
    _op.register_fake(lambda *args, **kwargs: None)


_compiling = P.compiling


def _out_like(x, up):
    shape = x.shape if up is not None else x.shape[:-1] + (x.shape[-1] // 2,)
    return torch.empty(shape, dtype=x.dtype, device=x.device)


def _fast(op, x, up, out, approximate, backend):
    """(key, out) of the call; out is the result when a cached plan launched it, else None."""
    if _compiling():
        return None, None
    key = P.signature(op, backend, (x, up, out), (approximate,))
    plan = P.PLANS.get(key)
    if plan is None:
        return key, None
    if out is None:
        out = _out_like(x, up)
    plan((x, up, out))
    return key, out


def _run(op, key, x, up, out, approximate, backend, fn):
    if V.is_array(x):
        _check_arrays(x, up, out)
        return _reference(fn, x, up, out)
    d = _check_tensors(x, up, out)
    if x.device.type == "cpu":
        V.require_cpu_backend(backend, "x")
        return _reference(fn, x, up, out)
    if out is None:
        out = torch.empty(tuple(x.shape[:-1]) + (d,), dtype=x.dtype, device=x.device)
    if _compiling():
        if op == "silu_mul":
            torch.ops.fray.silu_mul(x, up, out, backend)
        else:
            torch.ops.fray.gelu_mul(x, up, out, approximate, backend)
    else:
        P.PLANS.put(key, _act_plan(op, x, up, out, approximate, backend))((x, up, out))
    return out


# ---------------------------------------------------------------------------------------------
# public API

def silu_mul(x, up=None, *, out=None, backend="auto"):
    """SwiGLU's gated activation: silu(gate) * up, silu(g) = g / (1 + exp(-g)).

    silu_mul(x): x = [..., 2 d] holds gate (first half of the last dim) and up (second half), as a
    fused gate_up projection writes it; returns [..., d]. silu_mul(gate, up): two [..., d] tensors.
    fp32/fp16/bf16; last dim contiguous, leading dims any evenly strided rows (a slice of a wider
    buffer is fine). Math in fp32, one rounding to x's dtype. CUDA tensors run on the current
    stream without host synchronisation; CPU tensors and numpy arrays run the float64 reference.
    out: preallocated [..., d] result of x's dtype; it may be the gate itself (x[..., :d] or
    gate), not a partial overlap.
    """
    key, done = _fast("silu_mul", x, up, out, "none", backend)
    if done is not None:
        return done
    V.require_backend(backend, B.BACKENDS)
    return _run("silu_mul", key, x, up, out, "none", backend, ref.silu_mul)


def gelu_mul(x, up=None, *, approximate="none", out=None, backend="auto"):
    """GeGLU's gated activation: gelu(gate) * up, layouts and arguments as in silu_mul.

    approximate="none": gelu(g) = 0.5 g (1 + erf(g / sqrt(2))); "tanh": the tanh approximation
    0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), as torch.nn.functional.gelu's `approximate`.
    """
    key, done = _fast("gelu_mul", x, up, out, approximate, backend)
    if done is not None:
        return done
    V.require_backend(backend, B.BACKENDS)
    approximate = _check_approximate(approximate)
    return _run("gelu_mul", key, x, up, out, approximate, backend,
                lambda g, u: ref.gelu_mul(g, u, approximate))


# ---------------------------------------------------------------------------------------------
# the unary activations

# Activation codes of cuda/activation/activation.h (enum Activation) and fray_triton.activation.
_UNARY_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3, "tanh": 4, "sigmoid": 5}
_UNARY_REFS = {"silu": ref.silu, "gelu": ref.gelu, "gelu_tanh": lambda g: ref.gelu(g, "tanh"), "relu": ref.relu,
               "tanh": ref.tanh, "sigmoid": ref.sigmoid}


@P.custom_op("fray::unary", mutates_args=("out",))
def _unary_op(x: torch.Tensor, out: torch.Tensor, act: str, backend: str) -> None:
    _UNARY[act].launch((x,), out, (), backend)


_unary_op.register_fake(lambda *args, **kwargs: None)


def _triton_unary(code):
    def launch(x, out, n):
        from fray_triton import activation as tact
        tact.unary(x, out, code, n)
    return launch


_UNARY = {name: F.FlatOp(name, FAMILY, ("x",), _UNARY_REFS[name], lambda ext: ext.unary, _triton_unary(code),
                         custom_op=lambda x, out, backend, a=name: torch.ops.fray.unary(x, out, a, backend),
                         ints=(code,), op="gelu" if name == "gelu_tanh" else name)
          for name, code in _UNARY_CODES.items()}


def silu(x, *, out=None, backend="auto"):
    """silu(x) = x / (1 + exp(-x)), elementwise.

    x: fp32/fp16/bf16, contiguous or any dense permutation of a contiguous layout (out shares it).
    Math in fp32, one rounding to x's dtype. out: preallocated result, may be x itself (in place).
    CUDA tensors run on the current stream without host synchronisation; CPU tensors and numpy
    arrays run the float64 reference and come back in the input's dtype.
    """
    return _UNARY["silu"]((x,), out, (), backend)


def gelu(x, *, approximate="none", out=None, backend="auto"):
    """gelu(x), elementwise; layouts and arguments as in silu.

    approximate="none": 0.5 x (1 + erf(x / sqrt(2))); "tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x +
    0.044715 x^3))), as torch.nn.functional.gelu's `approximate`.
    """
    approximate = _check_approximate(approximate)
    return _UNARY["gelu" if approximate == "none" else "gelu_tanh"]((x,), out, (), backend)


def relu(x, *, out=None, backend="auto"):
    """relu(x) = max(x, 0), elementwise (NaN stays NaN); layouts and arguments as in silu."""
    return _UNARY["relu"]((x,), out, (), backend)


def tanh(x, *, out=None, backend="auto"):
    """tanh(x), elementwise; layouts and arguments as in silu."""
    return _UNARY["tanh"]((x,), out, (), backend)


def sigmoid(x, *, out=None, backend="auto"):
    """sigmoid(x) = 1 / (1 + exp(-x)), elementwise; layouts and arguments as in silu."""
    return _UNARY["sigmoid"]((x,), out, (), backend)


def _unary_check_cases(device):
    from fray.testing import assert_close

    def run(op, backend, dtype, rows, cols, dev):
        x = (3 * torch.randn(rows, cols, device=dev)).to(dtype)
        for name in (("gelu", "gelu_tanh") if op == "gelu" else (op,)):
            want = _UNARY_REFS[name](x.double())
            if backend == "triton-interpreter":
                from fray_triton import activation as tact
                y = torch.full_like(x, float("nan"))
                tact.unary(x, y, _UNARY_CODES[name], x.numel())
            else:
                y = _UNARY[name]((x,), None, (), backend)
            assert_close(y, want, dtype, name)

    def hand():
        x = np.array([-2.0, -0.0, 0.0, 1.0, np.nan])
        np.testing.assert_array_equal(relu(x)[:4], [0.0, 0.0, 0.0, 1.0])
        assert np.isnan(relu(x)[4])
        np.testing.assert_allclose(sigmoid(np.array([0.0, 1.0])), [0.5, 0.7310585786], rtol=1e-10)
        np.testing.assert_allclose(tanh(np.array([0.5])), [0.4621171573], rtol=1e-10)
        np.testing.assert_allclose(silu(np.array([1.0])), [0.7310585786], rtol=1e-10)
        np.testing.assert_allclose(gelu(np.array([1.0])), [0.8413447461], rtol=1e-10)
        np.testing.assert_allclose(gelu(np.array([1.0]), approximate="tanh"), [0.8411919906], rtol=1e-10)

    if device.type != "cuda":
        return B.cpu_check_cases("+".join(UNARY_OPS), hand, UNARY_OPS,
                                 lambda op, d, rows, cols: run(op, "triton-interpreter", d, rows, cols, "cpu"))
    return B.gpu_check_cases(FAMILY, UNARY_OPS, device, ((1, 1), (3, 4097), (1024, 8192)), run)


# ---------------------------------------------------------------------------------------------
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

def check_cases(device):
    """On a GPU: every available backend x dtype x a few awkward shapes, both layouts (and both
    GELU forms). On the CPU: the reference against hand-computed values and the Triton kernels
    under Triton's interpreter."""
    from fray.testing import assert_close

    def expected(op, approximate, gate, up):
        if op == "silu_mul":
            return ref.silu_mul(gate.double(), up.double())
        return ref.gelu_mul(gate.double(), up.double(), approximate)

    def run(op, backend, dtype, rows, d, dev):
        x = torch.randn(rows, 2 * d, device=dev).to(dtype)
        gate, up = x[:, :d], x[:, d:]
        for approximate in (("none",) if op == "silu_mul" else APPROXIMATIONS):
            want = expected(op, approximate, gate, up)
            if backend == "triton-interpreter":
                from fray_triton import activation as tact
                out = torch.full((rows, d), float("nan"), dtype=dtype)
                act = tact.SILU if op == "silu_mul" else (
                    tact.GELU_TANH if approximate == "tanh" else tact.GELU_ERF)
                tact.act_mul(x, up, out, act, 2 * d, 2 * d, d, rows, d)
                assert_close(out, want, dtype, op)
                continue
            kw = {} if op == "silu_mul" else {"approximate": approximate}
            fn = silu_mul if op == "silu_mul" else gelu_mul
            assert_close(fn(x, backend=backend, **kw), want, dtype, op + " one tensor")
            assert_close(fn(gate.contiguous(), up.contiguous(), backend=backend, **kw), want, dtype,
                         op + " two tensors")

    def hand():
        np.testing.assert_allclose(silu_mul(np.array([0.0, 1.0, 2.0, 3.0])), [0.0, 0.7310585786 * 3.0],
                                   rtol=1e-10)
        np.testing.assert_allclose(gelu_mul(np.array([1.0]), np.array([1.0])), [0.8413447461], rtol=1e-10)
        np.testing.assert_allclose(gelu_mul(np.array([1.0]), np.array([1.0]), approximate="tanh"),
                                   [0.8411919906], rtol=1e-10)

    if device.type != "cuda":
        return B.cpu_check_cases("silu_mul+gelu_mul", hand, ("silu_mul", "gelu_mul"),
                                 lambda op, d, rows, cols: run(op, "triton-interpreter", d, rows, cols, "cpu")) + \
            _unary_check_cases(device)
    return B.gpu_check_cases(FAMILY, ("silu_mul", "gelu_mul"), device, ((1, 1), (7, 4097), (1024, 8192)), run) + \
        _unary_check_cases(device)
