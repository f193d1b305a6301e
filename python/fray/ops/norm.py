"""The norm family: rmsnorm, fused add+rmsnorm and layernorm.

Validation happens here, once; the kernels (cuda/norm, fray_triton.norm) trust their inputs.
GPU entry points are torch custom ops (fray::rmsnorm, fray::add_rmsnorm, fray::add_rmsnorm_,
fray::add_rmsnorm_residual_, fray::layernorm) with fake implementations, so torch.compile(fullgraph=True) traces
through them; in eager mode a call validates its signature once and launches from the cached plan
after that (fray._plan), without the dispatcher.
CPU tensors and numpy arrays run the float64 reference and come back in the input's dtype.
"""
import math
from typing import Optional

import numpy as np
import torch

from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray.reference import convert as C
from fray.reference import norm as ref

FAMILY = "norm"
OPS = ("rmsnorm", "add_rmsnorm", "layernorm")
__all__ = ["rmsnorm", "add_rmsnorm", "layernorm"]
B.register_preference("rmsnorm", ("cuda", "triton"))
B.register_preference("add_rmsnorm", ("cuda", "triton"))
B.register_preference("layernorm", ("cuda", "triton"))


# ---------------------------------------------------------------------------------------------
# validation

def _check_eps(eps):
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError("eps: expected a float, got %s" % type(eps).__name__)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError("eps: expected a finite value >= 0, got %r" % (eps,))
    return float(eps)


def _check_offset(weight_offset):
    if isinstance(weight_offset, bool) or not isinstance(weight_offset, (int, float)) \
            or not math.isfinite(weight_offset):
        raise ValueError("weight_offset: expected a finite float (0.0, or 1.0 for Gemma's (1 + w)), got %r"
                         % (weight_offset,))
    return float(weight_offset)


def _check_tensors(x, weight, others):
    """x and weight, plus `others` = [(name, tensor or None, writable)] shaped like x."""
    V.require_tensor("x", x)
    V.require_tensor("weight", weight)
    V.require_device_family("x", x)
    V.require_float_dtype("x", x)
    if x.dim() == 0:
        raise ValueError("x: expected at least 1 dimension (the normalised one), got a 0-d tensor")
    hidden = x.shape[-1]
    if hidden == 0:
        raise ValueError("x: the normalised (last) dimension must not be empty")
    pairs = [("x", x), ("weight", weight)]
    for name, t, _ in others:
        V.require_tensor(name, t, allow_none=True)
        if t is not None:
            pairs.append((name, t))
    V.require_same_device(pairs)
    allowed_w = (x.dtype, torch.float32)
    if weight.dtype not in allowed_w:
        raise TypeError("weight: expected dtype %s or float32 (x is %s), got %s" % (
            str(x.dtype).replace("torch.", ""), str(x.dtype).replace("torch.", ""),
            str(weight.dtype).replace("torch.", "")))
    V.require_shape("weight", weight, (hidden,))
    if hidden > 1 and weight.stride(0) != 1:
        raise ValueError("weight: expected a contiguous 1-d tensor, got stride %d" % weight.stride(0))
    strides = {"x": V.row_stride("x", x)}
    for name, t, writable in others:
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise TypeError("%s: expected dtype %s (that of x), got %s" % (
                name, str(x.dtype).replace("torch.", ""), str(t.dtype).replace("torch.", "")))
        V.require_shape(name, t, x.shape)
        strides[name] = V.row_stride(name, t, writable=writable)
    return strides


def _check_arrays(x, weight, others):
    for name, a in [("x", x), ("weight", weight)] + [(n, t) for n, t in others]:
        if a is None:
            continue
        if not isinstance(a, np.ndarray):
            raise TypeError("%s: expected a numpy.ndarray like x, got %s" % (name, type(a).__name__))
        if a.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError("%s: expected a float16/float32/float64 array, got %s" % (name, a.dtype))
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError("x: expected at least 1 non-empty dimension, got shape %s" % (x.shape,))
    V.require_shape("weight", weight, (x.shape[-1],))
    for name, a in others:
        if a is not None:
            V.require_shape(name, a, x.shape)


def _check_bias(x, weight, bias):
    """bias: None, or [hidden] with weight's dtype (x's dtype or fp32) on x's device, contiguous.
    Call after _check_tensors / _check_arrays have validated x and weight."""
    if bias is None:
        return
    hidden = x.shape[-1]
    if V.is_array(x):
        if not isinstance(bias, np.ndarray):
            raise TypeError("bias: expected a numpy.ndarray like x, got %s" % type(bias).__name__)
        if bias.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError("bias: expected a float16/float32/float64 array, got %s" % bias.dtype)
        V.require_shape("bias", bias, (hidden,))
        return
    V.require_tensor("bias", bias)
    V.require_same_device([("x", x), ("bias", bias)])
    if bias.dtype != weight.dtype:
        raise TypeError("bias: expected dtype %s (that of weight), got %s" % (
            str(weight.dtype).replace("torch.", ""), str(bias.dtype).replace("torch.", "")))
    V.require_shape("bias", bias, (hidden,))
    if hidden > 1 and bias.stride(0) != 1:
        raise ValueError("bias: expected a contiguous 1-d tensor, got stride %d" % bias.stride(0))


# ---------------------------------------------------------------------------------------------
# GPU implementations (called directly in eager mode, through the custom ops under torch.compile)

def _rows(x):
    hidden = x.shape[-1]
    return x.numel() // hidden, hidden


def _rmsnorm_plan(x, weight, out, residual, sum_out, eps, weight_offset, backend):
    """The launch plan of one (add_)rmsnorm call, taking (x, weight, out, residual, sum_out)."""
    rows, hidden = _rows(x)
    if rows == 0:
        return P.NOOP
    op = "rmsnorm" if residual is None else "add_rmsnorm"
    be = B.resolve(op, FAMILY, backend, x.device)
    sx, so = V.row_stride("x", x), V.row_stride("out", out, writable=True)
    sr = ss = 0
    if residual is not None:
        sr, ss = V.row_stride("residual", residual), V.row_stride("sum_out", sum_out, writable=True)
    if be == "cuda":
        return P.CudaPlan(B.load_extension(FAMILY).rmsnorm,
                          (sx, so, sr, ss, rows, hidden, V.DTYPE_CODES[x.dtype], V.DTYPE_CODES[weight.dtype]),
                          (eps, weight_offset), x.device)
    from fray_triton import norm as tnorm
    if residual is None:
        return P.TritonPlan(lambda x_, w_, y_, r_, s_: tnorm.rmsnorm(x_, w_, y_, eps, weight_offset, sx, so, rows,
                                                                   hidden), x.device)
    return P.TritonPlan(lambda x_, w_, y_, r_, s_: tnorm.add_rmsnorm(x_, r_, w_, y_, s_, eps, weight_offset,
                                                                   sx, sr, so, ss, rows, hidden), x.device)


def _layernorm_plan(x, weight, bias, out, eps, backend):
    """The launch plan of one layernorm call, taking (x, weight, bias, out)."""
    rows, hidden = _rows(x)
    if rows == 0:
        return P.NOOP
    be = B.resolve("layernorm", FAMILY, backend, x.device)
    sx, so = V.row_stride("x", x), V.row_stride("out", out, writable=True)
    if be == "cuda":
        return P.CudaPlan(B.load_extension(FAMILY).layernorm,
                          (sx, so, rows, hidden, V.DTYPE_CODES[x.dtype], V.DTYPE_CODES[weight.dtype]), (eps,),
                          x.device)
    from fray_triton import norm as tnorm
    return P.TritonPlan(lambda x_, w_, b_, y_: tnorm.layernorm(x_, w_, b_, y_, eps, sx, so, rows, hidden), x.device)


# The custom ops' implementations (what a torch.compile'd graph calls): the same plans, under keys
# of their own, since these calls were validated when the graph was traced, not here.

def _rmsnorm_impl(x, weight, out, eps, weight_offset, backend):
    _add_rmsnorm_impl(x, None, weight, out, None, eps, weight_offset, backend)


def _add_rmsnorm_impl(x, residual, weight, out, sum_out, eps, weight_offset, backend):
    tensors = (x, weight, out, residual, sum_out)
    key = P.signature("norm.rmsnorm:op", backend, tensors, (eps, weight_offset))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _rmsnorm_plan(x, weight, out, residual, sum_out, eps,
                                                              weight_offset, backend))
    plan(tensors)


def _layernorm_impl(x, weight, bias, out, eps, backend):
    tensors = (x, weight, bias, out)
    key = P.signature("norm.layernorm:op", backend, tensors, (eps,))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _layernorm_plan(x, weight, bias, out, eps, backend))
    plan(tensors)


@P.custom_op("fray::rmsnorm", mutates_args=("out",))
def _rmsnorm_op(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float,
                weight_offset: float, backend: str) -> None:
    _rmsnorm_impl(x, weight, out, eps, weight_offset, backend)


@P.custom_op("fray::add_rmsnorm", mutates_args=("out", "sum_out"))
def _add_rmsnorm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                    sum_out: torch.Tensor, eps: float, weight_offset: float, backend: str) -> None:
    _add_rmsnorm_impl(x, residual, weight, out, sum_out, eps, weight_offset, backend)


@P.custom_op("fray::add_rmsnorm_", mutates_args=("x", "residual"))
def _add_rmsnorm_inplace_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                            weight_offset: float, backend: str) -> None:
    _add_rmsnorm_impl(x, residual, weight, x, residual, eps, weight_offset, backend)


@P.custom_op("fray::add_rmsnorm_residual_", mutates_args=("residual", "out"))
def _add_rmsnorm_residual_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                             out: torch.Tensor, eps: float, weight_offset: float, backend: str) -> None:
    _add_rmsnorm_impl(x, residual, weight, out, residual, eps, weight_offset, backend)


@P.custom_op("fray::layernorm", mutates_args=("out",))
def _layernorm_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor,
                  eps: float, backend: str) -> None:
    _layernorm_impl(x, weight, bias, out, eps, backend)


for _op in (_rmsnorm_op, _add_rmsnorm_op, _add_rmsnorm_inplace_op, _add_rmsnorm_residual_op, _layernorm_op):
    _op.register_fake(lambda *args, **kwargs: None)


_compiling = P.compiling


# ---------------------------------------------------------------------------------------------
# public API

def rmsnorm(x, weight, eps=1e-6, *, out=None, backend="auto", weight_offset=0.0):
    """RMSNorm over the last dimension: x * rsqrt(mean(x^2) + eps) * (weight + weight_offset).

    x: [..., hidden] fp32/fp16/bf16, last dim contiguous, leading dims any evenly strided rows
    (a slice of a wider buffer is fine). weight: [hidden], x's dtype or fp32. weight_offset=1.0
    gives Gemma's (1 + weight). Math in fp32, one rounding to x's dtype. CUDA tensors run on the
    current stream without host synchronisation; CPU tensors and numpy arrays run the float64
    reference. out: preallocated result (x's shape and dtype; may be x itself).
    """
    if not _compiling():
        key = P.signature("rmsnorm", backend, (x, weight, out), (eps, weight_offset))
        plan = P.PLANS.get(key)
        if plan is not None:
            if out is None:
                out = torch.empty_like(x, memory_format=torch.contiguous_format)
            plan((x, weight, out, None, None))
            return out
    V.require_backend(backend, B.BACKENDS)
    eps, weight_offset = _check_eps(eps), _check_offset(weight_offset)
    if V.is_array(x):
        _check_arrays(x, weight, [("out", out)])
        y = C.like(ref.rmsnorm(C.to_f64(x), C.to_f64(weight), eps, weight_offset), x)
        if out is not None:
            out[...] = y
            return out
        return y
    _check_tensors(x, weight, [("out", out, True)])
    if x.device.type == "cpu":
        V.require_cpu_backend(backend, "x")
        y = C.like(ref.rmsnorm(C.to_f64(x), C.to_f64(weight), eps, weight_offset), x)
        if out is not None:
            out.copy_(y)
            return out
        return y
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if _compiling():
        torch.ops.fray.rmsnorm(x, weight, out, eps, weight_offset, backend)
        return out
    P.PLANS.put(key, _rmsnorm_plan(x, weight, out, None, None, eps, weight_offset, backend))(
        (x, weight, out, None, None))
    return out


def add_rmsnorm(x, residual, weight, eps=1e-6, *, inplace=False, backend="auto", weight_offset=0.0):
    """Fused residual add + RMSNorm: returns (rmsnorm(s), s) with s = x + residual.

    s is rounded to x's dtype, and that rounded s is what is normalised (as engines store it).
    inplace=True writes the normalised rows into x and s into residual and returns (x, residual).
    residual: x's shape and dtype. Other arguments as in rmsnorm.
    """
    if not _compiling():
        key = P.signature("add_rmsnorm", backend, (x, residual, weight), (eps, weight_offset, inplace))
        plan = P.PLANS.get(key)
        if plan is not None:
            if inplace:
                plan((x, weight, x, residual, residual))
                return x, residual
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
            sum_out = torch.empty_like(x, memory_format=torch.contiguous_format)
            plan((x, weight, out, residual, sum_out))
            return out, sum_out
    V.require_backend(backend, B.BACKENDS)
    if not isinstance(inplace, bool):
        raise TypeError("inplace: expected a bool, got %s" % type(inplace).__name__)
    eps, weight_offset = _check_eps(eps), _check_offset(weight_offset)
    if V.is_array(x):
        _check_arrays(x, weight, [("residual", residual)])
        y, s = ref.add_rmsnorm(C.to_f64(x), C.to_f64(residual), C.to_f64(weight), eps, weight_offset,
                               round_sum=lambda v: C.round_to(v, x))
        y, s = C.like(y, x), C.like(s, x)
        if inplace:
            x[...], residual[...] = y, s
            return x, residual
        return y, s
    _check_tensors(x, weight, [("residual", residual, inplace)])
    if inplace:
        V.row_stride("x", x, writable=True)
    if x.device.type == "cpu":
        V.require_cpu_backend(backend, "x")
        y, s = ref.add_rmsnorm(C.to_f64(x), C.to_f64(residual), C.to_f64(weight), eps, weight_offset,
                               round_sum=lambda v: C.round_to(v, x))
        y, s = C.like(y, x), C.like(s, x)
        if inplace:
            x.copy_(y)
            residual.copy_(s)
            return x, residual
        return y, s
    if inplace:
        if _compiling():
            torch.ops.fray.add_rmsnorm_(x, residual, weight, eps, weight_offset, backend)
        else:
            P.PLANS.put(key, _rmsnorm_plan(x, weight, x, residual, residual, eps, weight_offset, backend))(
                (x, weight, x, residual, residual))
        return x, residual
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    sum_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if _compiling():
        torch.ops.fray.add_rmsnorm(x, residual, weight, out, sum_out, eps, weight_offset, backend)
    else:
        P.PLANS.put(key, _rmsnorm_plan(x, weight, out, residual, sum_out, eps, weight_offset, backend))(
            (x, weight, out, residual, sum_out))
    return out, sum_out


def add_rmsnorm_residual_inplace(x, residual, weight, eps=1e-6, *, backend="auto", weight_offset=0.0):
    """residual += x (rounded, in place); returns rmsnorm(residual) in a new tensor (the seed's
    fused_rmsnorm contract and vLLM's fused_add_rms_norm data flow)."""
    if not _compiling():
        key = P.signature("add_rmsnorm_residual_inplace", backend, (x, residual, weight), (eps, weight_offset))
        plan = P.PLANS.get(key)
        if plan is not None:
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
            plan((x, weight, out, residual, residual))
            return out
    V.require_backend(backend, B.BACKENDS)
    eps, weight_offset = _check_eps(eps), _check_offset(weight_offset)
    if V.is_array(x) or (isinstance(x, torch.Tensor) and x.device.type == "cpu"):
        y, s = add_rmsnorm(x, residual, weight, eps, backend=backend, weight_offset=weight_offset)
        residual[...] = s
        return y
    _check_tensors(x, weight, [("residual", residual, True)])
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if _compiling():
        torch.ops.fray.add_rmsnorm_residual_(x, residual, weight, out, eps, weight_offset, backend)
    else:
        P.PLANS.put(key, _rmsnorm_plan(x, weight, out, residual, residual, eps, weight_offset, backend))(
            (x, weight, out, residual, residual))
    return out


def layernorm(x, weight, bias=None, eps=1e-5, *, out=None, backend="auto"):
    """LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight (+ bias).

    var is the biased variance (as torch.nn.functional.layer_norm). x: [..., hidden]
    fp32/fp16/bf16, last dim contiguous, leading dims any evenly strided rows. weight: [hidden],
    x's dtype or fp32; bias: None or [hidden] of weight's dtype. Math in fp32 (statistics taken
    relative to the row's first element, so a large mean costs no accuracy), one rounding to
    x's dtype. CUDA tensors run on the current stream without host synchronisation; CPU tensors
    and numpy arrays run the float64 reference. out: preallocated result (x's shape and dtype;
    may be x itself).
    """
    if not _compiling():
        key = P.signature("layernorm", backend, (x, weight, bias, out), (eps,))
        plan = P.PLANS.get(key)
        if plan is not None:
            if out is None:
                out = torch.empty_like(x, memory_format=torch.contiguous_format)
            plan((x, weight, bias, out))
            return out
    V.require_backend(backend, B.BACKENDS)
    eps = _check_eps(eps)
    if V.is_array(x):
        _check_arrays(x, weight, [("out", out)])
        _check_bias(x, weight, bias)
        y = C.like(ref.layernorm(C.to_f64(x), C.to_f64(weight), None if bias is None else C.to_f64(bias), eps), x)
        if out is not None:
            out[...] = y
            return out
        return y
    _check_tensors(x, weight, [("out", out, True)])
    _check_bias(x, weight, bias)
    if x.device.type == "cpu":
        V.require_cpu_backend(backend, "x")
        y = C.like(ref.layernorm(C.to_f64(x), C.to_f64(weight), None if bias is None else C.to_f64(bias), eps), x)
        if out is not None:
            out.copy_(y)
            return out
        return y
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if _compiling():
        torch.ops.fray.layernorm(x, weight, bias, out, eps, backend)
    else:
        P.PLANS.put(key, _layernorm_plan(x, weight, bias, out, eps, backend))((x, weight, bias, out))
    return out


# ---------------------------------------------------------------------------------------------
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

def check_cases(device):
    """On a GPU: every available backend x dtype x a few awkward shapes. On the CPU: the reference
    against hand-computed values and the Triton kernels under Triton's interpreter."""
    from fray.testing import assert_close, layernorm_scale

    def run(op, backend, dtype, rows, hidden, dev):
        x = torch.randn(rows, hidden, device=dev).to(dtype)
        r = torch.randn(rows, hidden, device=dev).to(dtype)
        w = torch.randn(hidden, device=dev).to(dtype)
        ey, es = ref.add_rmsnorm(x.double(), r.double(), w.double(), 1e-6,
                                 round_sum=lambda v: v.to(dtype).double())
        b = r[0]  # layernorm's bias
        if backend == "triton-interpreter":
            from fray_triton import norm as tnorm
            y, s = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
            if op == "rmsnorm":
                tnorm.rmsnorm(x, w, y, 1e-6, 0.0, hidden, hidden, rows, hidden)
            elif op == "layernorm":
                tnorm.layernorm(x, w, b, y, 1e-5, hidden, hidden, rows, hidden)
            else:
                tnorm.add_rmsnorm(x, r, w, y, s, 1e-6, 0.0, hidden, hidden, hidden, hidden, rows, hidden)
        elif op == "rmsnorm":
            y = rmsnorm(x, w, backend=backend)
        elif op == "layernorm":
            y = layernorm(x, w, b, backend=backend)
        else:
            y, s = add_rmsnorm(x, r, w, backend=backend)
        if op == "rmsnorm":
            assert_close(y, ref.rmsnorm(x.double(), w.double(), 1e-6), dtype, op)
        elif op == "layernorm":
            assert_close(y, ref.layernorm(x.double(), w.double(), b.double(), 1e-5), dtype, op,
                         scale=layernorm_scale(x, w, b, 1e-5))
        else:
            assert_close(y, ey, dtype, op)
            assert_close(s, es, dtype, op)

    def hand():
        y = rmsnorm(np.array([[3.0, 4.0]]), np.array([1.0, 2.0]), eps=0.0)
        np.testing.assert_allclose(y, [[3 / 12.5 ** 0.5, 8 / 12.5 ** 0.5]], rtol=1e-12)
        y, s = add_rmsnorm(np.array([[1.0, 1.0]]), np.array([[2.0, 3.0]]), np.array([1.0, 2.0]), eps=0.0)
        np.testing.assert_allclose(s, [[3.0, 4.0]])
        # x = [1, 3]: mean 2, biased var 1 -> x_hat = [-1, 1]
        y = layernorm(np.array([[1.0, 3.0]]), np.array([1.0, 2.0]), np.array([0.5, 0.0]), eps=0.0)
        np.testing.assert_allclose(y, [[-0.5, 2.0]], rtol=1e-12)

    if device.type != "cuda":
        return B.cpu_check_cases("rmsnorm+add+ln", hand, OPS,
                                 lambda op, d, rows, cols: run(op, "triton-interpreter", d, rows, cols, "cpu"))
    return B.gpu_check_cases(FAMILY, OPS, device, ((1, 1), (7, 4097), (1024, 8192)), run)
