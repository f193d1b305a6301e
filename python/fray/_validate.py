"""Input validation shared by every family: the one place the error contract is spelled out.

ValueError  shapes, value ranges, layouts the kernels cannot take (non-contiguous last dim, ...)
TypeError   dtypes, device families, mixed devices, wrong Python types
Messages name the argument and say what was expected and what was got.
"""
import numpy as np
import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# dtype codes shared with the CUDA bindings (cuda/common/dtype.h)
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def is_array(obj):
    return isinstance(obj, np.ndarray)


def require_tensor(name, value, allow_none=False):
    if value is None and allow_none:
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor or numpy.ndarray, got %s" % (name, type(value).__name__))


def require_float_dtype(name, t, allowed=FLOAT_DTYPES):
    if t.dtype not in allowed:
        raise TypeError("%s: expected dtype in (%s), got %s" % (
            name, ", ".join(str(d).replace("torch.", "") for d in allowed), str(t.dtype).replace("torch.", "")))


def require_same_device(pairs):
    """pairs: [(name, tensor), ...]; every tensor must be on the first one's device."""
    (name0, t0), rest = pairs[0], pairs[1:]
    for name, t in rest:
        if t is not None and t.device != t0.device:
            raise TypeError("%s: expected a tensor on %s (the device of %s), got one on %s" % (
                name, t0.device, name0, t.device))


def require_device_family(name, t):
    if t.device.type not in ("cuda", "cpu"):
        raise TypeError("%s: expected a CUDA or CPU tensor, got device %s" % (name, t.device))


def require_shape(name, t, expected):
    if tuple(t.shape) != tuple(expected):
        raise ValueError("%s: expected shape %s, got %s" % (name, tuple(expected), tuple(t.shape)))


def row_stride(name, t, writable=False):
    """Row stride (elements) of `t` seen as [rows, t.shape[-1]]; the last dim must be contiguous.

    Leading dimensions must collapse into one evenly strided row index (what `t.view(-1, n)`
    accepts); anything else is refused rather than silently copied. Inputs may repeat rows
    (stride 0, as `expand` makes); outputs (writable=True) may not overlap.
    """
    if t.dim() == 0:
        raise ValueError("%s: expected at least 1 dimension, got a 0-d tensor" % name)
    n = t.shape[-1]
    if n > 1 and t.stride(-1) != 1:
        raise ValueError("%s: the last dimension must be contiguous (stride 1), got stride %d" % (name, t.stride(-1)))
    if t.dim() == 1:
        return n
    stride = None
    expected = None
    for size, st in zip(reversed(t.shape[:-1]), reversed(t.stride()[:-1])):
        if size == 1:
            continue
        if stride is None:
            stride, expected = st, st * size
        elif st != expected:
            raise ValueError(
                "%s: leading dimensions must collapse to evenly strided rows (as x.view(-1, %d) "
                "needs); got shape %s with strides %s" % (name, n, tuple(t.shape), t.stride()))
        else:
            expected = st * size
    if stride is None:
        return n
    if writable and stride < n:
        raise ValueError("%s: rows overlap (row stride %d < row length %d)" % (name, stride, n))
    return stride


def require_distinct_elements(name, t):
    """An output: no two of its elements share memory (an expand()ed or as_strided view would have
    several threads write one address: garbage on the GPU). Dims of size > 1 in increasing stride
    order must each step past everything the smaller ones span."""
    extent = 1
    for st, size in sorted((st, size) for size, st in zip(t.shape, t.stride()) if size > 1):
        if st < extent:
            raise ValueError("%s: elements overlap in memory (shape %s, strides %s, as expand() or "
                             "as_strided make); pass a tensor with distinct elements" % (name, tuple(t.shape), t.stride()))
        extent += (size - 1) * st


def require_backend(backend, allowed):
    if not isinstance(backend, str) or backend not in allowed:
        raise ValueError("backend: expected one of %s, got %r" % (", ".join(repr(b) for b in allowed), backend))


def require_cpu_backend(backend, what="x"):
    """CPU tensors and numpy arrays run the reference: 'auto' or 'reference' only."""
    if backend not in ("auto", "reference"):
        raise ValueError("backend: %r needs CUDA tensors; %s is on the CPU (use 'reference' or 'auto')"
                         % (backend, what))


def device_index_check(what, check, *args):
    """FRAY_CHECK_INDICES=1 on CUDA tensors: check(*args) reads the index values back to the host
    (one synchronisation), which CUDA-graph capture forbids, so a capturing stream is refused with
    a RuntimeError naming `what`."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("FRAY_CHECK_INDICES=1 checks %s with a host synchronisation, which CUDA-graph capture "
                           "forbids; unset FRAY_CHECK_INDICES while capturing" % what)
    return check(*args)
