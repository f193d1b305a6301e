"""The quantization family, first part: quantize and dequantize (int8 and float8_e4m3fn with fp32
scales per tensor, token, channel or block).

quantize turns x [M, K] (bf16/fp16/fp32) into q of the same shape plus fp32 scales, one per group
of elements: "tensor" (one scale, shape []), "token" (a row, [M, 1]), "channel" (a column,
[1, K]), "block" (a (bm, bk) tile, [ceil(M / bm), ceil(K / bk)], block (1, 128) or (128, 128)).
dequantize maps (q, scale) back. The rules (fray.reference.quant, exact):

  amax  = max |x| over the group's finite values (NaN and +-inf are left out; 0 if none)
  scale = fp32(amax / qmax), qmax 127 (int8) or 448 (e4m3); a scale of 0 (amax 0, or an amax
          so small that the division underflows fp32) becomes 1
  q     = fp32(x / scale) rounded to nearest, ties to even, saturated to [-qmax, qmax]: int8 never
          takes -128; +-inf saturate to +-qmax; NaN becomes 0 in int8 and stays NaN in e4m3
  x     = fp32(q * scale), rounded once more to the output dtype (dequantize)

A static scale (scale=..., fp32 of the group shape) is used as given: a 0 or inf in it divides
as IEEE division does (then saturates), which is the caller's business.

The block scales are [ceil(M / bm), ceil(K / bk)] fp32, row-major, or for (1, 128) blocks
MN-major on request (scale_layout="mn_major": DeepGEMM's TMA-aligned activation-scale layout,
which fray.scaled_gemm takes too).

Validation happens here, once; the kernels (fray_triton.quant) trust their inputs. GPU entry
points are torch custom ops (fray::quantize, fray::dequantize) with fake implementations, so
torch.compile(fullgraph=True) traces through them; no launch reads anything back on the host, so
both run under CUDA-graph capture. CPU tensors and numpy arrays run the reference (numpy has no
float8: numpy arrays quantize to int8 only, and dequantize to float32 arrays holding the values
rounded to `dtype`). There is no CUDA C++ backend yet: "auto" runs Triton on CUDA tensors.
"""
from typing import Optional

import numpy as np
import torch

from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray.reference import quant as ref

FAMILY = "quant"
OPS = ("quantize", "dequantize", "rmsnorm_quant", "silu_mul_quant", "scaled_gemm", "w8a16_gemm")
__all__ = ["quantize", "dequantize", "rmsnorm_quant", "silu_mul_quant", "scaled_gemm", "w8a16_gemm"]
# quantize: the CUDA quantizers (fray._C._quant, cuda/quant) take granularity "token" and block
# (1, 128); "auto" keeps Triton first until their GPU tests and benchmarks have run.
B.register_preference("quantize", ("triton", "cuda"))
_NO_CUDA = {"cuda": "no CUDA C++ kernel yet (use 'triton')"}
B.register_preference("dequantize", ("triton",), missing=_NO_CUDA)

GRANULARITIES = ref.GRANULARITIES
BLOCKS = ((1, 128), (128, 128))
Q_DTYPES = (torch.int8, torch.float8_e4m3fn)
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
_REF_NAME = {torch.int8: "int8", torch.float8_e4m3fn: "float8_e4m3fn"}
_NP_FLOAT = {np.dtype(np.float16), np.dtype(np.float32)}
_NP_OUT = {torch.float32: np.float32, torch.float16: np.float16}


def _name(dtype):
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------------------------
# validation

def _check_2d(name, x, dtypes, np_ok):
    if V.is_array(x):
        if not np_ok(x.dtype):
            raise TypeError("%s: expected a %s array, got %s" % (name, dtypes, x.dtype))
    else:
        V.require_tensor(name, x)
        V.require_device_family(name, x)
    if x.ndim != 2:
        raise ValueError("%s: expected 2 dimensions [M, K], got shape %s" % (name, tuple(x.shape)))
    if not V.is_array(x) and x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError("%s: the last dimension must be contiguous (stride 1), got stride %d" % (name, x.stride(1)))
    return x.shape[0], x.shape[1]


def _check_granularity(granularity, block, required):
    if not isinstance(granularity, str) or granularity not in GRANULARITIES:
        raise ValueError("granularity: expected one of %s, got %r" % (", ".join(map(repr, GRANULARITIES)),
                                                                     granularity))
    if granularity != "block":
        return None
    if block is None and required:
        raise ValueError("block: required with granularity='block' (one of %s)" % (BLOCKS,))
    try:
        b = tuple(int(v) for v in block) if not isinstance(block, (str, bytes)) else None
        if b is not None and any(isinstance(v, bool) for v in block):
            b = None
    except TypeError:
        b = None
    if b not in BLOCKS:
        raise ValueError("block: expected one of %s, got %r" % (BLOCKS, block))
    return b


def _check_scale(scale, x, granularity, m, k, block, name="scale"):
    if V.is_array(x):
        if not V.is_array(scale):
            raise TypeError("%s: expected a numpy.ndarray like the input, got %s" % (name, type(scale).__name__))
        if scale.dtype != np.float32:
            raise TypeError("%s: expected dtype float32, got %s" % (name, scale.dtype))
    else:
        if not isinstance(scale, torch.Tensor):
            raise TypeError("%s: expected a torch.Tensor like the input, got %s" % (name, type(scale).__name__))
        V.require_same_device([("x" if name == "scale" else "q", x), (name, scale)])
        if scale.dtype != torch.float32:
            raise TypeError("%s: expected dtype float32, got %s" % (name, _name(scale.dtype)))
    shape = ref.scale_shape(granularity, m, k, block)
    allowed = [shape, (1,)] if granularity == "tensor" else [shape]
    if tuple(scale.shape) not in allowed:
        raise ValueError("%s: expected shape %s for granularity=%r, got %s"
                         % (name, " or ".join(map(str, allowed)), granularity, tuple(scale.shape)))


def _check_out(out, like, dtype, m, k):
    if out is None:
        return
    if V.is_array(like):
        raise TypeError("out: not supported for numpy arrays (the result is a new array)")
    if not isinstance(out, torch.Tensor):
        raise TypeError("out: expected a torch.Tensor, got %s" % type(out).__name__)
    V.require_same_device([("input", like), ("out", out)])
    if out.dtype != dtype:
        raise TypeError("out: expected dtype %s, got %s" % (_name(dtype), _name(out.dtype)))
    V.require_shape("out", out, (m, k))
    if k > 1 and out.stride(1) != 1:
        raise ValueError("out: the last dimension must be contiguous (stride 1), got stride %d" % out.stride(1))
    V.require_distinct_elements("out", out)


SCALE_LAYOUTS = ("row", "mn_major")


def _check_quantize(x, dtype, granularity, block, scale, out, scale_layout="row"):
    m, k = _check_2d("x", x, "float16/float32", lambda d: d in _NP_FLOAT)
    if not V.is_array(x):
        V.require_float_dtype("x", x)
    if dtype not in Q_DTYPES:
        raise TypeError("dtype: expected torch.int8 or torch.float8_e4m3fn, got %r" % (dtype,))
    if V.is_array(x) and dtype != torch.int8:
        raise TypeError("dtype: numpy arrays quantize to torch.int8 only (numpy has no float8), got %s"
                        % _name(dtype))
    block = _check_granularity(granularity, block, True)
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError("scale_layout: expected one of %s, got %r" % (", ".join(map(repr, SCALE_LAYOUTS)), scale_layout))
    if scale_layout == "mn_major" and (granularity != "block" or block[0] != 1 or scale is not None):
        raise ValueError("scale_layout: 'mn_major' is the layout of dynamic (1, 128)-block activation scales "
                         "(granularity='block', block=(1, bk), scale=None); got granularity=%r, block=%s, %s scale"
                         % (granularity, block, "a static" if scale is not None else "a dynamic"))
    if scale is not None:
        _check_scale(scale, x, granularity, m, k, block)
    _check_out(out, x, dtype, m, k)
    return m, k, block


def mn_major_view(m, kb, make):
    """An [M, KB] view, stride 1 along M, of make((KB, M rounded up to 4)): DeepGEMM's TMA-aligned
    MN-major layout of activation block scales (make allocates the buffer: a tensor or an array)."""
    return make((kb, -(-m // 4) * 4))[:, :m].T


def mn_major_like(s):
    """s [M, KB] (a tensor or array) copied into mn_major_view's layout, the padding zero."""
    if V.is_array(s):
        out = mn_major_view(*s.shape, lambda shape: np.zeros(shape, np.float32))
    else:
        out = mn_major_view(*s.shape, lambda shape: torch.zeros(shape, dtype=s.dtype, device=s.device))
    out[...] = s
    return out


def _check_dequantize(q, scale, granularity, block, dtype, out):
    m, k = _check_2d("q", q, "int8", lambda d: d == np.int8)
    if not V.is_array(q) and q.dtype not in Q_DTYPES:
        raise TypeError("q: expected dtype int8 or float8_e4m3fn, got %s" % _name(q.dtype))
    if dtype not in V.FLOAT_DTYPES:
        raise TypeError("dtype: expected torch.bfloat16, torch.float16 or torch.float32, got %r" % (dtype,))
    block = _check_granularity(granularity, block, True)
    _check_scale(scale, q, granularity, m, k, block)
    _check_out(out, q, dtype, m, k)
    return m, k, block


# ---------------------------------------------------------------------------------------------
# GPU implementations: launch plans (fray._plan), built once per call signature

class _CudaQuantize:
    """The CUDA quantizer's plan (cuda/quant/quant.h slots), taking (x, q, scale, amax). q's row
    stride and the scale's strides are set by the plan's key (quantize's: out and a static scale
    in it, fresh outputs made from x's shape and scale_layout; the custom op's: q and scale in
    it), but the plan is built before its outputs exist: its first call reads them, later calls
    reuse them."""

    __slots__ = ("launcher", "x_stride", "tail", "dev", "ints")

    def __init__(self, x, granularity, dtype, static):
        m, k = x.shape
        self.launcher = B.load_extension(FAMILY).quantize
        self.x_stride = x.stride(0) if m > 1 else k
        self.tail = (m, k, 0 if granularity == "token" else 128, 1 if dtype == torch.float8_e4m3fn else 0,
                     1 if static else 0, V.DTYPE_CODES[x.dtype])
        self.dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
        self.ints = None

    def __call__(self, tensors):
        x, q, s, _ = tensors
        ints = self.ints
        if ints is None:
            ss = s.stride()
            ints = self.ints = (self.x_stride, q.stride(0), ss[0] if ss else 0, ss[1] if len(ss) > 1 else 0) + self.tail
        self.launcher((x, q, s), ints, (), self.dev, P.current_stream(self.dev))


def _quantize_launch(x, granularity, block, dtype, static, backend):
    """The launch plan taking (x, q, scale, amax)."""
    if x.numel() == 0:
        return P.NOOP
    be = B.resolve("quantize", FAMILY, backend, x.device)
    if be == "cuda":
        if (granularity, None if block is None else tuple(block)) not in CUDA_CASES:
            raise ValueError("backend='cuda': the CUDA quantizers take granularity 'token' and 'block' with block "
                             "(1, 128); got granularity=%r%s (backend='triton' or 'auto' runs it)" % (
                                 granularity, ", block=%s" % (tuple(block),) if block else ""))
        return _CudaQuantize(x, granularity, dtype, static)
    from fray_triton import quant as tq
    qmax, fp8 = QMAX[dtype], dtype == torch.float8_e4m3fn
    return P.TritonPlan(lambda x_, q_, s_, a_: tq.quantize(x_, q_, s_, granularity, block, qmax, fp8, static, a_),
                        x.device)


def _dequantize_launch(q, granularity, block, backend):
    """The launch plan taking (q, scale, out)."""
    if q.numel() == 0:
        return P.NOOP
    B.resolve("dequantize", FAMILY, backend, q.device)
    from fray_triton import quant as tq
    return P.TritonPlan(lambda q_, s_, o_: tq.dequantize(q_, s_, o_, granularity, block), q.device)


def _needs_amax(granularity, static):
    return not static and granularity in ("tensor", "channel")


def _quantize_outputs(x, dtype, granularity, block, scale, out, scale_layout="row"):
    """(q, scale, amax or None) on x's device; a dynamic scale in scale_layout."""
    m, k = x.shape
    dev = x.device
    q = out if out is not None else torch.empty((m, k), dtype=dtype, device=dev)
    static = scale is not None
    if not static:
        shape = ref.scale_shape(granularity, m, k, block)
        if scale_layout == "mn_major":  # the padding stays unwritten, as DeepGEMM leaves it
            scale = mn_major_view(m, shape[1], lambda s: torch.empty(s, dtype=torch.float32, device=dev))
        else:
            scale = torch.empty(shape, dtype=torch.float32, device=dev)
    amax = (torch.zeros(ref.scale_shape(granularity, m, k, block), dtype=torch.int32, device=dev)
            if _needs_amax(granularity, static) else None)
    return q, scale, amax


class _QuantizePlan:
    __slots__ = ("launch", "dtype", "granularity", "block", "layout")

    def __init__(self, launch, dtype, granularity, block, layout):
        self.launch, self.dtype, self.granularity, self.block, self.layout = launch, dtype, granularity, block, layout

    def __call__(self, x, scale, out):
        q, s, amax = _quantize_outputs(x, self.dtype, self.granularity, self.block, scale, out, self.layout)
        self.launch((x, q, s, amax))
        return q, s


class _DequantizePlan:
    __slots__ = ("launch", "dtype")

    def __init__(self, launch, dtype):
        self.launch, self.dtype = launch, dtype

    def __call__(self, q, scale, out):
        if out is None:
            out = torch.empty(q.shape, dtype=self.dtype, device=q.device)
        self.launch((q, scale, out))
        return out


def _quantize_impl(x, q, scale, amax, granularity, block, static, backend):
    key = P.signature("quantize:op", backend, (x, q, scale, amax), (granularity, block, static))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _quantize_launch(x, granularity, block, q.dtype, static, backend))
    plan((x, q, scale, amax))


def _dequantize_impl(q, scale, out, granularity, block, backend):
    key = P.signature("dequantize:op", backend, (q, scale, out), (granularity, block))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _dequantize_launch(q, granularity, block, backend))
    plan((q, scale, out))


def _block_args(block):
    return (0, 0) if block is None else block


@P.custom_op("fray::quantize", mutates_args=("q", "scale", "amax"))
def _quantize_op(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, amax: Optional[torch.Tensor],
                 granularity: str, block_m: int, block_k: int, static: bool, backend: str) -> None:
    _quantize_impl(x, q, scale, amax, granularity, (block_m, block_k) if block_m else None, static, backend)


@P.custom_op("fray::dequantize", mutates_args=("out",))
def _dequantize_op(q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, granularity: str, block_m: int,
                   block_k: int, backend: str) -> None:
    _dequantize_impl(q, scale, out, granularity, (block_m, block_k) if block_m else None, backend)


for _op in (_quantize_op, _dequantize_op):
    _op.register_fake(lambda *args, **kwargs: None)


_compiling = P.compiling


# ---------------------------------------------------------------------------------------------
# public API

def quantize(x, dtype=torch.int8, *, granularity="tensor", block=(1, 128), scale=None, out=None,
             scale_layout="row", backend="auto"):
    """(q, scale): x [M, K] (bf16/fp16/fp32) quantized to dtype (torch.int8 or
    torch.float8_e4m3fn) with fp32 scales per group.

    granularity: "tensor" (scale shape []), "token" (per row, [M, 1]), "channel" (per column,
    [1, K]) or "block" (per (bm, bk) tile of `block`, (1, 128) or (128, 128): [ceil(M / bm),
    ceil(K / bk)], the last tiles clipped at M and K). block is read for granularity="block" only.
    scale=None: dynamic scales, amax / qmax per group (qmax 127 for int8, 448 for e4m3) over the
    group's finite values, a zero scale replaced by 1 (an all-zero group quantizes to zeros with
    scale 1). Otherwise scale is a static fp32 tensor of the group shape (for "tensor" [] or [1])
    and is returned as given. q = round-to-nearest-even(fp32(x / scale)), saturated to
    [-qmax, qmax] (int8 never -128); +-inf saturate, NaN gives 0 (int8) or NaN (e4m3). out: an
    [M, K] tensor of dtype to write q into.
    scale_layout: "row" (default: the scales row-major) or, for dynamic (1, bk)-block scales,
    "mn_major": DeepGEMM's TMA-aligned activation-scale layout, the [M, ceil(K / bk)] scales as a
    view with stride 1 along M of a [ceil(K / bk), M rounded up to 4] buffer (its padding rows
    unwritten on a GPU, zero from the CPU reference); fray.scaled_gemm takes either layout.

    CUDA tensors run on the current stream without host synchronisation. backend "triton" (what
    "auto" picks): token and block in one launch (one program per group: amax, then quantize),
    tensor and channel in two (an amax with integer atomics, then quantize) plus a zero fill.
    "cuda" (cuda/quant, ahead of time): granularity "token" and block (1, 128) only, dynamic or
    static, one launch (ValueError for the others). CPU tensors and numpy arrays run the exact
    reference (numpy arrays: int8 only).
    """
    if not _compiling():
        key = P.signature("quantize", backend, (x, scale, out), (dtype, granularity, block, scale_layout))
        plan = P.PLANS.get(key)
        if plan is not None:
            return plan(x, scale, out)
    V.require_backend(backend, B.BACKENDS)
    m, k, blk = _check_quantize(x, dtype, granularity, block, scale, out, scale_layout)
    array = V.is_array(x)
    if array or x.device.type == "cpu":
        V.require_cpu_backend(backend, "x")
        x64 = x.astype(np.float64) if array else x.detach().double().numpy()
        s_in = None if scale is None else (scale if array else scale.detach().cpu().numpy())
        qv, s = ref.quantize(x64, _REF_NAME[dtype], granularity, blk, s_in)
        layout = mn_major_like if scale is None and scale_layout == "mn_major" else (lambda t: t)
        if array:
            return qv.astype(np.int8), (layout(s) if scale is None else scale)
        q = torch.from_numpy(qv).to(dtype)
        if out is not None:
            out.copy_(q)
            q = out
        return q, (layout(torch.from_numpy(np.array(s, np.float32))) if scale is None else scale)
    static = scale is not None
    if _compiling():
        q, s, amax = _quantize_outputs(x, dtype, granularity, blk, scale, out, scale_layout)
        torch.ops.fray.quantize(x, q, s, amax, granularity, *_block_args(blk), static, backend)
        return q, s
    launch = _quantize_launch(x, granularity, blk, dtype, static, backend)
    return P.PLANS.put(key, _QuantizePlan(launch, dtype, granularity, blk, scale_layout))(x, scale, out)


def dequantize(q, scale, *, granularity, block=None, dtype=torch.bfloat16, out=None, backend="auto"):
    """x [M, K] of dtype (bf16/fp16/fp32) = fp32(q * scale) rounded once to dtype.

    q: int8 or float8_e4m3fn [M, K]; scale: fp32 of quantize's group shape for `granularity`
    (block: required for granularity="block", (1, 128) or (128, 128)). out: an [M, K] tensor of
    dtype to write into. CUDA tensors run one Triton launch; CPU tensors and numpy arrays
    (int8) run the reference (numpy: a float32 array holding the values rounded to dtype).
    """
    if not _compiling():
        key = P.signature("dequantize", backend, (q, scale, out), (granularity, block, dtype))
        plan = P.PLANS.get(key)
        if plan is not None:
            return plan(q, scale, out)
    V.require_backend(backend, B.BACKENDS)
    m, k, blk = _check_dequantize(q, scale, granularity, block, dtype, out)
    array = V.is_array(q)
    if array or q.device.type == "cpu":
        V.require_cpu_backend(backend, "q")
        qv = q if array else q.float().numpy()
        x = torch.from_numpy(ref.dequantize(qv, scale if array else scale.cpu().numpy(), granularity, blk)).to(dtype)
        if array:
            return x.float().numpy()
        if out is not None:
            out.copy_(x)
            return out
        return x
    if _compiling():
        res = out if out is not None else torch.empty((m, k), dtype=dtype, device=q.device)
        torch.ops.fray.dequantize(q, scale, res, granularity, *_block_args(blk), backend)
        return res
    launch = _dequantize_launch(q, granularity, blk, backend)
    return P.PLANS.put(key, _DequantizePlan(launch, dtype))(q, scale, out)


# ---------------------------------------------------------------------------------------------
# rmsnorm_quant / silu_mul_quant: the norm or the gated activation writing 8-bit values and their
# per-token scales in one pass (fray_triton.rmsnorm_quant, fray_triton.silu_mul_quant)

B.register_preference("rmsnorm_quant", ("triton",), missing=_NO_CUDA)
B.register_preference("silu_mul_quant", ("triton",), missing=_NO_CUDA)


def _check_fused(x, dtype, scale, out, out_shape):
    """The quantized output's checks shared by rmsnorm_quant and silu_mul_quant (x already checked
    as the norm / activation input): dtype, a static scale (fp32: one value, or one per row of
    shape out_shape[:-1] + (1,), contiguous) and out. Returns (static, the scale's row stride)."""
    if dtype not in Q_DTYPES:
        raise TypeError("dtype: expected torch.int8 or torch.float8_e4m3fn, got %r" % (dtype,))
    row_shape = tuple(out_shape[:-1]) + (1,)
    static = scale is not None
    stride = 1
    if static:
        V.require_tensor("scale", scale)
        V.require_same_device([("x", x), ("scale", scale)])
        if scale.dtype != torch.float32:
            raise TypeError("scale: expected dtype float32, got %s" % _name(scale.dtype))
        if scale.numel() == 1 and scale.dim() <= 1:
            stride = 0
        elif tuple(scale.shape) != row_shape or not scale.is_contiguous():
            raise ValueError("scale: expected one static scale ([] or [1]) or a contiguous one per row %s, got "
                             "shape %s" % (row_shape, tuple(scale.shape)))
    if out is not None:
        V.require_tensor("out", out)
        V.require_same_device([("x", x), ("out", out)])
        if out.dtype != dtype:
            raise TypeError("out: expected dtype %s, got %s" % (_name(dtype), _name(out.dtype)))
        V.require_shape("out", out, tuple(out_shape))
        V.row_stride("out", out, writable=True)
    return static, stride


def _fused_outputs(out_shape, dtype, scale, out, device):
    q = out if out is not None else torch.empty(out_shape, dtype=dtype, device=device)
    s = scale if scale is not None else torch.empty(tuple(out_shape[:-1]) + (1,), dtype=torch.float32, device=device)
    return q, s


def _cpu_quantized(qv, sc, x, dtype, scale, out, out_shape):
    """The reference's (q values, scales) as tensors of the op's shapes (written into out if given)."""
    q = torch.from_numpy(np.ascontiguousarray(qv)).to(dtype).reshape(out_shape)
    if out is not None:
        out.copy_(q)
        q = out
    if scale is not None:
        return q, scale
    return q, torch.from_numpy(np.asarray(sc, np.float32)).reshape(tuple(out_shape[:-1]) + (1,))


def _rmsnorm_quant_launch(x, residual, q, s, eps, weight_offset, static, s_stride, backend):
    """The launch plan taking (x, weight, residual or None, q, scale)."""
    from fray.ops.norm import _rows
    rows, hidden = _rows(x)
    if rows == 0:
        return P.NOOP
    B.resolve("rmsnorm_quant", FAMILY, backend, x.device)
    from fray_triton import rmsnorm_quant as tk
    sx, sq = V.row_stride("x", x), V.row_stride("out", q, writable=True)
    sr = 0 if residual is None else V.row_stride("residual", residual, writable=True)
    qmax, fp8 = QMAX[q.dtype], q.dtype == torch.float8_e4m3fn
    return P.TritonPlan(lambda x_, w_, r_, q_, s_: tk.rmsnorm_quant(
        x_, r_, w_, q_, s_, eps, weight_offset, qmax, fp8, static, sx, sr, sq, s_stride, rows, hidden), x.device)


def _rmsnorm_quant_impl(x, weight, residual, q, scale, eps, weight_offset, static, backend):
    tensors = (x, weight, residual, q, scale)
    s_stride = 0 if static and scale.numel() == 1 else 1
    key = P.signature("rmsnorm_quant:op", backend, tensors, (eps, weight_offset, static))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _rmsnorm_quant_launch(x, residual, q, scale, eps, weight_offset,
                                                                      static, s_stride, backend))
    plan(tensors)


@P.custom_op("fray::rmsnorm_quant", mutates_args=("residual", "q", "scale"))
def _rmsnorm_quant_op(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor], q: torch.Tensor,
                      scale: torch.Tensor, eps: float, weight_offset: float, static: bool, backend: str) -> None:
    _rmsnorm_quant_impl(x, weight, residual, q, scale, eps, weight_offset, static, backend)


def _silu_mul_quant_launch(x, up, q, static, s_stride, backend):
    """The launch plan taking (x, up or None, q, scale)."""
    d = q.shape[-1]
    if d == 0 or q.numel() == 0:
        return P.NOOP
    rows = q.numel() // d
    B.resolve("silu_mul_quant", FAMILY, backend, x.device)
    from fray_triton import silu_mul_quant as tk
    sx, sq = V.row_stride("x", x), V.row_stride("out", q, writable=True)
    su = sx if up is None else V.row_stride("up", up)
    qmax, fp8 = QMAX[q.dtype], q.dtype == torch.float8_e4m3fn
    return P.TritonPlan(lambda x_, u_, q_, s_: tk.silu_mul_quant(
        x_, x_.narrow(-1, d, d) if u_ is None else u_, q_, s_, qmax, fp8, static, sx, su, sq, s_stride, rows, d),
        x.device)


def _silu_mul_quant_impl(x, up, q, scale, static, backend):
    tensors = (x, up, q, scale)
    s_stride = 0 if static and scale.numel() == 1 else 1
    key = P.signature("silu_mul_quant:op", backend, tensors, (static,))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _silu_mul_quant_launch(x, up, q, static, s_stride, backend))
    plan(tensors)


@P.custom_op("fray::silu_mul_quant", mutates_args=("q", "scale"))
def _silu_mul_quant_op(x: torch.Tensor, up: Optional[torch.Tensor], q: torch.Tensor, scale: torch.Tensor,
                       static: bool, backend: str) -> None:
    _silu_mul_quant_impl(x, up, q, scale, static, backend)


for _op in (_rmsnorm_quant_op, _silu_mul_quant_op):
    _op.register_fake(lambda *args, **kwargs: None)


def rmsnorm_quant(x, weight, eps=1e-6, *, dtype=torch.int8, residual=None, scale=None, weight_offset=0.0, out=None,
                  backend="auto"):
    """(q, scale): RMSNorm of x, quantized to 8 bits per token, in one pass.

    y = fray.rmsnorm(x, weight, eps, weight_offset=weight_offset) (fp32 math), rounded to x's dtype
    (the value the unfused rmsnorm stores), then quantized as fray.quantize(y, dtype,
    granularity="token") does: per row, scale = amax / qmax over the row's finite values (qmax 127
    for int8, 448 for e4m3; a zero scale becomes 1), q = round-to-nearest-even(fp32(y / scale)),
    saturated (int8 never -128; NaN gives 0 in int8, NaN in e4m3). The result is the unfused
    rmsnorm -> quantize pair's up to the one rounding of y (an fp32 rstd a few ulps apart can move
    an element of y by one ulp of its dtype).

    x: [..., hidden] fp32/fp16/bf16, last dim contiguous, leading dims any evenly strided rows;
    weight: [hidden], x's dtype or fp32. dtype: torch.int8 or torch.float8_e4m3fn. q has x's shape;
    scale is fp32 [..., 1] (x's leading dims). residual (x's shape and dtype): s = x + residual,
    rounded to x's dtype, is written into residual in place and is what gets normalised (vLLM's
    fused_add_rms_norm data flow; residual must not be x). scale=... quantizes by static fp32
    scales instead (one value, [] or [1], or one per row, [..., 1]) and returns that tensor. out:
    the q tensor to write into.

    CUDA tensors run one Triton launch on the current stream without host synchronisation (custom
    op fray::rmsnorm_quant: CUDA-graph capturable, torch.compile-traceable); the row stays in
    registers up to 16384 elements (one read of x, one write of q). CPU tensors run the float64
    reference. There is no CUDA C++ kernel yet (backend="cuda" is refused).
    """
    if not _compiling():
        key = P.signature("rmsnorm_quant", backend, (x, weight, residual, scale, out), (eps, weight_offset, dtype))
        plan = P.PLANS.get(key)
        if plan is not None:
            q, s = _fused_outputs(x.shape, dtype, scale, out, x.device)
            plan((x, weight, residual, q, s))
            return q, s
    from fray.ops import norm as N
    V.require_backend(backend, B.BACKENDS)
    eps, weight_offset = N._check_eps(eps), N._check_offset(weight_offset)
    N._check_tensors(x, weight, [("residual", residual, True)])
    if residual is not None and residual.data_ptr() == x.data_ptr() and x.numel():
        raise ValueError("residual: must not be x itself (it receives x + residual)")
    static, s_stride = _check_fused(x, dtype, scale, out, x.shape)
    if x.device.type == "cpu":
        V.require_cpu_backend(backend, "x")
        from fray.reference import convert as C
        hidden = x.shape[-1]
        x2 = C.to_f64(x).reshape(-1, hidden)
        qv, sc, sm = ref.rmsnorm_quant(x2, C.to_f64(weight), eps, _REF_NAME[dtype], lambda v: C.round_to(v, x),
                                       weight_offset, None if residual is None else C.to_f64(residual).reshape(-1, hidden),
                                       None if scale is None else scale.numpy())
        if residual is not None:
            residual.copy_(torch.from_numpy(sm).to(x.dtype).reshape(x.shape))
        return _cpu_quantized(qv, sc, x, dtype, scale, out, x.shape)
    q, s = _fused_outputs(x.shape, dtype, scale, out, x.device)
    if _compiling():
        torch.ops.fray.rmsnorm_quant(x, weight, residual, q, s, eps, weight_offset, static, backend)
        return q, s
    P.PLANS.put(key, _rmsnorm_quant_launch(x, residual, q, s, eps, weight_offset, static, s_stride, backend))(
        (x, weight, residual, q, s))
    return q, s


def silu_mul_quant(x, up=None, *, dtype=torch.int8, scale=None, out=None, backend="auto"):
    """(q, scale): silu(gate) * up quantized to 8 bits per token, in one pass.

    y = fray.silu_mul(x, up) (fp32 math), rounded to x's dtype (the value the unfused silu_mul
    stores), then quantized as fray.quantize(y, dtype, granularity="token") does (see
    rmsnorm_quant: per-row amax / qmax scales, round to nearest even, saturation, NaN).
    silu_mul_quant(x): x = [..., 2 d] holds gate and up halves (a fused gate_up projection's
    output); silu_mul_quant(gate, up): two [..., d] tensors. fp32/fp16/bf16, last dim contiguous,
    leading dims any evenly strided rows. q: [..., d] of dtype; scale: fp32 [..., 1]. scale=...:
    static fp32 scales (one value, [] or [1], or one per row, [..., 1]), returned as given. out:
    the q tensor to write into.

    CUDA tensors run one Triton launch (custom op fray::silu_mul_quant; no host synchronisation,
    CUDA-graph capturable, torch.compile-traceable); rows up to 16384 outputs stay in registers.
    CPU tensors run the float64 reference. No CUDA C++ kernel yet (backend="cuda" is refused).
    """
    if not _compiling():
        key = P.signature("silu_mul_quant", backend, (x, up, scale, out), (dtype,))
        plan = P.PLANS.get(key)
        if plan is not None:
            n = x.shape[-1] if up is not None else x.shape[-1] // 2
            q, s = _fused_outputs(tuple(x.shape[:-1]) + (n,), dtype, scale, out, x.device)
            plan((x, up, q, s))
            return q, s
    from fray.ops import activation as A
    V.require_backend(backend, B.BACKENDS)
    d = A._check_tensors(x, up, None)
    out_shape = tuple(x.shape[:-1]) + (d,)
    static, s_stride = _check_fused(x, dtype, scale, out, out_shape)
    if x.device.type == "cpu":
        V.require_cpu_backend(backend, "x")
        from fray.reference import activation as ref_act
        from fray.reference import convert as C
        xf = C.to_f64(x)
        gate, u = ref_act.split(xf) if up is None else (xf, C.to_f64(up))
        qv, sc = ref.silu_mul_quant(gate.reshape(-1, d), u.reshape(-1, d), _REF_NAME[dtype],
                                    lambda v: C.round_to(v, x), None if scale is None else scale.numpy())
        return _cpu_quantized(qv, sc, x, dtype, scale, out, out_shape)
    q, s = _fused_outputs(out_shape, dtype, scale, out, x.device)
    if _compiling():
        torch.ops.fray.silu_mul_quant(x, up, q, s, static, backend)
        return q, s
    P.PLANS.put(key, _silu_mul_quant_launch(x, up, q, static, s_stride, backend))((x, up, q, s))
    return q, s


# ---------------------------------------------------------------------------------------------
# scaled_gemm: out = (a * a_scale) @ (b * b_scale)^T (+ bias) on 8-bit operands

_SG_IN = (torch.int8, torch.float8_e4m3fn)
_SG_OUT = (torch.bfloat16, torch.float16, torch.float32)
_SG_NAMES = {torch.int8: "int8", torch.float8_e4m3fn: "e4m3", torch.bfloat16: "bf16", torch.float16: "fp16",
             torch.float32: "fp32"}
_SG_CT = {torch.int8: "int8_t", torch.float8_e4m3fn: "cutlass::float_e4m3_t", torch.bfloat16: "cutlass::bfloat16_t",
          torch.float16: "cutlass::half_t", torch.float32: "float"}
_KIND_CODE = {"tensor": 0, "vector": 1, "block": 2}
_KIND_CT = {"tensor": "kScaleTensor", "vector": "kScaleVector", "block": "kScaleBlock"}
SCALE_BLOCK = ref.SCALE_BLOCK
# int32 accumulation of K products of at most 127 * 127 stays exact below 2^31.
INT8_MAX_K = 131072
B.register_preference("scaled_gemm", ("cuda", "triton"))
CUDA_FAMILIES = {"scaled_gemm": "gemm"}  # its CUDA kernels are the gemm family's JIT (fray.jit + CUTLASS)


def _sm90(tile, cluster, schedule="coop"):
    return {"kernel": "scaled_sm90", "tile": tile, "cluster": cluster, "schedule": schedule, "stages": 0,
            "raster": "auto", "swizzle": 1}


# Tile K is 128 (128 bytes of 8-bit elements: one 128-byte swizzled row, and block scales' K).
SCALED_LARGE = [_sm90("128x256x128", "2x1"), _sm90("256x128x128", "1x2"), _sm90("128x256x128", "1x2"),
                _sm90("128x128x128", "1x2", "pingpong")]
SCALED_SMALL = [_sm90("64x128x128", "1x1", "pingpong"), _sm90("128x128x128", "1x1", "pingpong"),
                _sm90("64x256x128", "1x1", "pingpong")]
# e4m3 with block scales, or without fast_accum, keeps a second accumulator that the mainloop
# promotes into every 128 of K: a warpgroup's 64 x 256 tile would then need 256 accumulator
# registers a thread and spill (CUTLASS's 128x256 cooperative tile ran 8192^3 at 453 TFLOP/s on the
# H200 at c7d7935, against 1235 with fast_accum), so these tiles hold 64 x 128 a warpgroup. Tile N
# is a multiple of 128 (b's scale blocks).
PROMOTED_LARGE = [_sm90("128x128x128", "1x2"), _sm90("128x128x128", "2x1"), _sm90("64x128x128", "1x2", "pingpong")]
PROMOTED_SMALL = [_sm90("64x128x128", "1x1", "pingpong"), _sm90("128x128x128", "1x1")]
# The Triton kernel's tiles (M > 128, M <= 128); not tuned yet.
_SG_TRITON = [
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4},
    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 4, "num_warps": 4, "num_stages": 4},
]


def promoted(in_dtype, kind_a, fast_accum):
    """Whether the mainloop promotes a second accumulator (e4m3 with block scales or without fast_accum)."""
    return in_dtype == torch.float8_e4m3fn and (kind_a == "block" or not fast_accum)


def scaled_sass_pass(in_dtype, kind_a):
    """The SASS pass a scaled-GEMM kernel is built with: fray.jit.sass's ffma_interleave on the
    block-scaled e4m3 kernels, whose promotion multiplies each 128-deep partial by its scales in
    runs of FFMAs (5 runs of 16-64 in the 128x128x128 cooperative kernel; the other promoting
    kernels add their partials with FADDs and have none), when FRAY_DISABLE_FFMA_INTERLEAVE allows
    it (off by default until measured); None otherwise."""
    from fray.jit import sass
    return "ffma_interleave" if in_dtype == torch.float8_e4m3fn and kind_a == "block" and \
        sass.ffma_interleave_enabled() else None


def scaled_candidates(m, promoted_acc):
    if promoted_acc:
        return PROMOTED_SMALL if m <= 128 else PROMOTED_LARGE
    return SCALED_SMALL if m <= 128 else SCALED_LARGE


def scaled_kernel_source(config, in_dtype, out_dtype, kind_a, kind_b, bias, fast_accum):
    """(name, translation unit) of one scaled-GEMM configuration (the JIT contract's 3-line TU)."""
    tm, tn, tk = (int(v) for v in config["tile"].split("x"))
    cm, cn = (int(v) for v in config["cluster"].split("x"))
    coop = config["schedule"] == "coop"
    name = "scaled_gemm_sm90_%s_%s_%s%s%s%s_%s_c%s_%s_s%d_r%s_w%d" % (
        _SG_NAMES[in_dtype], _SG_NAMES[out_dtype], kind_a[0], kind_b[0], "_bias" if bias else "",
        "_fast" if fast_accum else "", config["tile"], config["cluster"], "coop" if coop else "pp", config["stages"],
        config["raster"], config["swizzle"])
    raster = {"auto": "kRasterHeuristic", "m": "kRasterAlongM", "n": "kRasterAlongN"}[config["raster"]]
    src = ('#include "cuda/gemm/scaled_gemm_sm90.cuh"\n'
           "using Config = fray::gemm::Sm90ScaledGemmConfig<%s, %s, fray::gemm::%s, fray::gemm::%s, %s, %d, %d, %d, "
           "%d, %d, fray::gemm::%s, %d, fray::gemm::%s, %d, fray::gemm::kPersistent, %s>;\n"
           "FRAY_SCALED_GEMM_ENTRY(Config)\n" % (
               _SG_CT[in_dtype], _SG_CT[out_dtype], _KIND_CT[kind_a], _KIND_CT[kind_b], "true" if bias else "false",
               tm, tn, tk, cm, cn, "kCooperative" if coop else "kPingpong", config["stages"], raster,
               config["swizzle"], "true" if fast_accum else "false"))
    return name, src


def _scale_kinds(a_scale, b_scale, m, n, k):
    """(kind_a, kind_b) from the scales' shapes (see scaled_gemm's docstring), or ValueError."""
    kb = ref.cdiv(k, SCALE_BLOCK)
    sa, sb = tuple(a_scale.shape), tuple(b_scale.shape)
    block_a, block_b = (m, kb), (ref.cdiv(n, SCALE_BLOCK), kb)
    if a_scale.numel() == 1 and len(sa) <= 2:
        kind_a = "tensor"
    elif sa in ((m, 1), (m,)):
        kind_a = "vector"
    elif sa == block_a:
        kind_a = "block"
    else:
        raise ValueError("a_scale: expected one scale ([] or [1]), one per row of a ([%d, 1]) or one per row and "
                         "128 of K ([%d, %d]), got shape %s" % (m, m, kb, sa,))
    if b_scale.numel() == 1 and len(sb) <= 2:
        kind_b = "tensor"
    elif sb in ((n, 1), (n,)):
        kind_b = "vector"
    elif sb == block_b:
        kind_b = "block"
    else:
        raise ValueError("b_scale: expected one scale ([] or [1]), one per output channel ([%d, 1]) or one per "
                         "128 x 128 block of b ([%d, %d]), got shape %s" % (n, block_b[0], kb, sb))
    # K <= 128: a per-row scale is also a per-row-and-block one (one block along K).
    if kind_b == "block" and kind_a == "vector" and kb == 1:
        kind_a = "block"
    if (kind_a == "block") != (kind_b == "block"):
        raise ValueError("a_scale, b_scale: block scales are for both operands (a [%d, %d], b [%d, %d]), got a_scale "
                         "%s (%s) and b_scale %s (%s)" % (m, kb, block_b[0], kb, sa, kind_a, sb, kind_b))
    return kind_a, kind_b


def _check_operands(an, a, bn, b):
    """(M, N, K) of a [M, K] and b [N, K], both 2-d with a contiguous last dimension and rows that
    do not overlap, or ValueError (scaled_gemm and w8a16_gemm)."""
    if a.dim() != 2:
        raise ValueError("%s: expected a 2-d [M, K] operand, got shape %s" % (an, tuple(a.shape)))
    if b.dim() != 2:
        raise ValueError("%s: expected a 2-d [N, K] operand, got shape %s" % (bn, tuple(b.shape)))
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError("%s: expected [N, K] with K = %d (%s's columns), got shape %s" % (bn, k, an, tuple(b.shape)))
    for name, t in ((an, a), (bn, b)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError("%s: the last dimension must be contiguous (stride 1), got strides %s" % (name, t.stride()))
        if t.shape[0] > 1 and t.stride(0) < t.shape[1]:
            raise ValueError("%s: rows overlap (row stride %d < row length %d)" % (name, t.stride(0), t.shape[1]))
    return m, n, k


def _check_scaled_gemm(a, b, a_scale, b_scale, out_dtype, bias, out, fast_accum):
    for name, t in (("a", a), ("b", b), ("a_scale", a_scale), ("b_scale", b_scale)):
        V.require_tensor(name, t)
    V.require_tensor("bias", bias, allow_none=True)
    V.require_tensor("out", out, allow_none=True)
    V.require_device_family("a", a)
    V.require_same_device([("a", a), ("b", b), ("a_scale", a_scale), ("b_scale", b_scale), ("bias", bias),
                           ("out", out)])
    if a.dtype not in _SG_IN:
        raise TypeError("a: expected dtype int8 or float8_e4m3fn, got %s" % _name(a.dtype))
    if b.dtype != a.dtype:
        raise TypeError("b: expected dtype %s (that of a), got %s" % (_name(a.dtype), _name(b.dtype)))
    for name, s in (("a_scale", a_scale), ("b_scale", b_scale)):
        if s.dtype != torch.float32:
            raise TypeError("%s: expected float32 scales, got %s" % (name, _name(s.dtype)))
    if out_dtype not in _SG_OUT:
        raise TypeError("out_dtype: expected torch.bfloat16, torch.float16 or torch.float32, got %r" % (out_dtype,))
    if not isinstance(fast_accum, bool):
        raise TypeError("fast_accum: expected a bool, got %r" % (fast_accum,))
    m, n, k = _check_operands("a", a, "b", b)
    if a.dtype == torch.int8 and k > INT8_MAX_K:
        raise ValueError("a: int8 accumulates in int32, exact up to K = %d; got K = %d" % (INT8_MAX_K, k))
    kind_a, kind_b = _scale_kinds(a_scale, b_scale, m, n, k)
    if kind_a == "block" and a.dtype != torch.float8_e4m3fn:
        raise TypeError("a: block scales are for float8_e4m3fn operands, got %s" % _name(a.dtype))
    if fast_accum and (a.dtype == torch.int8 or kind_a == "block"):
        raise ValueError("fast_accum: a choice for float8_e4m3fn with tensor / vector scales only (int8 accumulates "
                         "exactly; block scales promote every 128 of K), got %s with %s scales" % (
                             _name(a.dtype), kind_a))
    for name, s in (("a_scale", a_scale), ("b_scale", b_scale)):
        if not s.is_contiguous() and not (name == "a_scale" and kind_a == "block" and mn_major(s)):
            raise ValueError("%s: expected a contiguous (row-major) scale tensor%s, got strides %s" % (
                name, " or a's block scales MN-major (stride 1 along M, DeepGEMM's layout)" if name == "a_scale" and
                kind_a == "block" else "", s.stride()))
    if bias is not None:
        if bias.dtype != out_dtype:
            raise TypeError("bias: expected dtype %s (out_dtype), got %s" % (_name(out_dtype), _name(bias.dtype)))
        V.require_shape("bias", bias, (n,))
        if n > 1 and bias.stride(0) != 1:
            raise ValueError("bias: expected a contiguous [N] vector, got stride %d" % bias.stride(0))
    if out is not None:
        if out.dtype != out_dtype:
            raise TypeError("out: expected dtype %s (out_dtype), got %s" % (_name(out_dtype), _name(out.dtype)))
        V.require_shape("out", out, (m, n))
        if n > 1 and out.stride(1) != 1:
            raise ValueError("out: the last dimension must be contiguous (stride 1), got strides %s" % (out.stride(),))
        if m > 1 and out.stride(0) < n:
            raise ValueError("out: rows overlap (row stride %d < row length %d)" % (out.stride(0), n))
    return m, n, k, kind_a, kind_b


def mn_major(scale):
    """Whether a [M, KB] block-scale tensor is MN-major: unit stride along M and columns that do
    not overlap (DeepGEMM's TMA-aligned layout pads each column to a multiple of 4 rows)."""
    m, kb = scale.shape
    return (m <= 1 or scale.stride(0) == 1) and (kb <= 1 or scale.stride(1) >= max(m, 1))


def _cuda_takes(a, b, out, bias, a_scale, b_scale):
    """None when the TMA kernels take these operands as they are, else why not (16-byte rows and bases)."""
    k, n, es = a.shape[1], out.shape[1], out.element_size()
    if k % 16:
        return "K = %d is not a multiple of 16 (TMA's 16-byte rows of 8-bit operands)" % k
    if (n * es) % 16:
        return "N = %d output columns are not 16-byte rows of %s" % (n, _name(out.dtype))
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t.data_ptr() % 16 or (t.shape[0] > 1 and (t.stride(0) * t.element_size()) % 16):
            return "%s's base address or row stride is not a multiple of 16 bytes" % name
    return None


def _sg_bound(exp, terms, out_dtype, in_dtype, fast_accum, k):
    """The elementwise error bound of a scaled GEMM against the float64 reference: one rounding to
    the output (TOLERANCES' rtol) plus the accumulation's: int8 sums exactly, then a few fp32
    roundings (gemm_bound's fp32 term); e4m3 sums on the tensor core with a ~13-bit-mantissa
    accumulator that CUTLASS promotes into fp32 every 128 of K (block scales, and tensor / vector
    scales without fast_accum): at most 4 truncations of 2^-13 per promoted slice, 2^-11 of the
    terms; fast_accum never promotes: K / 32 truncations, (K / 32) 2^-13 of the terms."""
    from fray import testing
    if in_dtype == torch.int8:
        return testing.gemm_bound(exp, terms, out_dtype, k)
    tol = testing.TOLERANCES[out_dtype]
    factor = (max(k, 32) / 32.0) * 2.0 ** -13 if fast_accum else 2.0 ** -11
    return tol["atol"] + tol["rtol"] * exp.abs() + factor * terms


def assert_scaled_gemm_close(out, a, b, a_scale, b_scale, kind_a, kind_b, bias=None, fast_accum=False, what=""):
    """out against the float64 reference within _sg_bound (tests and `fray check`)."""
    args = [t.detach().cpu().double().numpy() for t in (a, b, a_scale, b_scale)]
    bb = None if bias is None else bias.detach().cpu().double().numpy()
    exp = torch.from_numpy(ref.scaled_gemm(*args, kind_a, kind_b, bb))
    terms = torch.from_numpy(ref.scaled_gemm_terms(*args, kind_a, kind_b))
    if bb is not None:
        terms = terms + torch.from_numpy(np.abs(bb))[None, :]
    got = out.detach().cpu().double()
    assert torch.isfinite(got).all(), "%s: non-finite values (an element never written?)" % what
    bound = _sg_bound(exp, terms, out.dtype, a.dtype, fast_accum, a.shape[1])
    err = (got - exp).abs()
    bad = err > bound
    assert not bad.any(), "%s: %d of %d elements off; worst %.3g where the bound is %.3g" % (
        what, int(bad.sum()), err.numel(), float(err[bad].max()), float(bound[bad][err[bad].argmax()]))


def scaled_gemm_operands(m, n, k, dtype, kind_a, kind_b, device="cpu", seed=0, bias_dtype=None):
    """Test operands: a, b (uniform int8, or e4m3 of randn * 64), fp32 scales of the kinds' shapes
    in [0.5, 1.5) / 128, and a randn bias of bias_dtype (or None)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int8:
        a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
        b = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    else:
        a = (torch.randn(m, k, generator=g) * 64).to(dtype)
        b = (torch.randn(n, k, generator=g) * 64).to(dtype)
    kb = ref.cdiv(k, SCALE_BLOCK)
    sa_shape = {"tensor": (), "vector": (m, 1), "block": (m, kb)}[kind_a]
    sb_shape = {"tensor": (), "vector": (n, 1), "block": (ref.cdiv(n, SCALE_BLOCK), kb)}[kind_b]
    sa = (torch.rand(sa_shape, generator=g) + 0.5) / 128
    sb = (torch.rand(sb_shape, generator=g) + 0.5) / 128
    bias = None if bias_dtype is None else torch.randn(n, generator=g).to(bias_dtype)
    return [t.to(device) if t is not None else None for t in (a, b, sa, sb, bias)]


class _ScaledTuningInput:
    """Fresh operands of one call's shape and kinds, and the fp32 reference the candidates are checked against."""

    def __init__(self, m, n, k, in_dtype, out_dtype, kind_a, kind_b, bias, fast_accum, device):
        g = torch.Generator(device=device).manual_seed(4321)
        self.m, self.n, self.k, self.kind, self.kind_b, self.fast = m, n, k, kind_a, kind_b, fast_accum
        self.in_dtype, self.out_dtype = in_dtype, out_dtype
        if in_dtype == torch.int8:
            self.a = torch.randint(-127, 128, (m, k), device=device, generator=g, dtype=torch.int8)
            self.b = torch.randint(-127, 128, (n, k), device=device, generator=g, dtype=torch.int8)
        else:
            self.a = torch.randn(m, k, device=device, generator=g).mul_(64).to(in_dtype)
            self.b = torch.randn(n, k, device=device, generator=g).mul_(64).to(in_dtype)
        kb = ref.cdiv(k, SCALE_BLOCK)
        shapes = {"tensor": ((), ()), "vector": ((m, 1), (n, 1)), "block": ((m, kb), (ref.cdiv(n, SCALE_BLOCK), kb))}
        self.sa = torch.rand(shapes[kind_a][0], device=device, generator=g).add_(0.5).div_(128)
        self.sb = torch.rand(shapes[kind_b][1], device=device, generator=g).add_(0.5).div_(128)
        self.bias = torch.randn(n, device=device, generator=g).to(out_dtype) if bias else None
        self.out = torch.empty(m, n, device=device, dtype=out_dtype)
        self._ref = None

    def _expand(self, s, kind, rows, block_rows):
        """s as a [rows, K]-broadcastable fp32 tensor (block scales repeated over their blocks)."""
        if kind == "tensor":
            return s.reshape(1, 1)
        if kind == "vector":
            return s.reshape(rows, 1)
        return s.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(SCALE_BLOCK, 1)[:, :self.k]

    def reference(self):
        if self._ref is None:
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = False
            try:
                af = self.a.float() * self._expand(self.sa, self.kind, self.m, 1)
                bf = self.b.float() * self._expand(self.sb, self.kind_b, self.n, SCALE_BLOCK)
                exp = af @ bf.t()
                terms = af.abs() @ bf.abs().t()
                if self.bias is not None:
                    exp += self.bias.float()
                    terms += self.bias.float().abs()
            finally:
                torch.backends.cuda.matmul.allow_tf32 = prev
            bound = 2.0 * _sg_bound(exp, terms, self.out_dtype, self.in_dtype, self.fast, self.k)
            self._ref = (exp, bound)
        return self._ref

    def check(self, launch):
        self.out.fill_(float("nan"))
        launch()
        exp, bound = self.reference()
        ok = (self.out.float() - exp).abs() <= bound
        if not bool(ok.all()):
            raise AssertionError("%d of %d elements off the fp32 reference" % (int((~ok).sum()), ok.numel()))


def _sg_bucket(m, n, k, in_dtype, out_dtype, kind_a, kind_b, bias, fast_accum):
    return "%s%s%s%s->%s:m%d:n%d:k%d" % (kind_a[0], kind_b[0], "+bias" if bias else "", "+fast" if fast_accum else "",
                                         _SG_NAMES[out_dtype], 1 << (m - 1).bit_length() if m > 1 else 1, n, k)


class _ScaledCudaPlan:
    """The JIT scaled-GEMM kernel fray.tune chose for one call signature; __call__ launches it."""

    __slots__ = ("launch", "ints", "dev", "ws")

    def __init__(self, a, b, kind_a, kind_b, bias, out, fast_accum):
        from fray import jit, tune
        m, k = a.shape
        n = b.shape[0]
        self.dev = a.device.index
        in_dtype, odt, has_bias = a.dtype, out.dtype, bias is not None
        tuning = {}

        def inputs():
            if "x" not in tuning:
                tuning["x"] = _ScaledTuningInput(m, n, k, in_dtype, odt, kind_a, kind_b, has_bias, fast_accum, a.device)
            return tuning["x"]

        def source(c):
            return scaled_kernel_source(c, in_dtype, odt, kind_a, kind_b, has_bias, fast_accum)

        sass_pass = scaled_sass_pass(in_dtype, kind_a)

        def build(configs):
            return jit.build_many([source(c) + ((), sass_pass) for c in configs], device=self.dev)

        def runner(kern):
            x = inputs()
            ptrs = (x.a.data_ptr(), x.b.data_ptr(), x.sa.data_ptr(), x.sb.data_ptr(),
                    x.bias.data_ptr() if has_bias else 0, x.out.data_ptr())
            ints = (m, n, k, k, k, n)
            ws = kern.workspace_bytes(ptrs, ints, (), self.dev, B.current_stream(a.device))
            if ws:
                buf = torch.empty(ws, dtype=torch.uint8, device=a.device)
                ptrs = ptrs + (buf.data_ptr(),)
                x.__dict__.setdefault("keep", []).append(buf)
            return lambda: kern.launch(ptrs, ints, (), self.dev, B.current_stream(a.device))

        candidates = scaled_candidates(m, promoted(in_dtype, kind_a, fast_accum))
        config = tune.choose("scaled_gemm_sm90", _sg_bucket(m, n, k, in_dtype, odt, kind_a, kind_b, has_bias, fast_accum),
                             _SG_NAMES[in_dtype], candidates, build=build, run=lambda c, kern: runner(kern)(),
                             check=lambda c, kern: inputs().check(runner(kern)), default=dict(candidates[0]),
                             flops=2.0 * m * n * k, bytes=float(n * k), device=self.dev)
        tuning.clear()
        name, src = source(config)
        kern = jit.build(name, src, device=self.dev, sass_pass=sass_pass)
        self.launch = kern.launch
        self.ints = (m, n, k, a.stride(0) if m > 1 else k, b.stride(0) if n > 1 else k, out.stride(0) if m > 1 else n)
        self.ws = kern.workspace_bytes((16, 16, 16, 16, 16 if has_bias else 0, 16), self.ints, (), self.dev,
                                       B.current_stream(a.device))

    def __call__(self, a, b, a_scale, b_scale, bias, out):
        if not a_scale.is_contiguous():
            # MN-major block scales (DeepGEMM's layout): CUTLASS's blockwise mainloop reads them
            # K-major, so one small copy ([M, K / 128] fp32) on the stream, released after the launch
            a_scale = a_scale.contiguous()
        ptrs = (a.data_ptr(), b.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr(),
                0 if bias is None else bias.data_ptr(), out.data_ptr())
        if self.ws:
            ws = torch.empty(self.ws, dtype=torch.uint8, device=out.device)
            ptrs = ptrs + (ws.data_ptr(),)
        self.launch(ptrs, self.ints, (), self.dev, B.current_stream(out.device))


class _ScaledTritonPlan:
    __slots__ = ("config", "kinds")

    def __init__(self, a, b, kind_a, kind_b, bias, out, fast_accum):
        self.kinds = (_KIND_CODE[kind_a], _KIND_CODE[kind_b])
        self.config = _SG_TRITON[1] if a.shape[0] <= 128 else _SG_TRITON[0]

    def __call__(self, a, b, a_scale, b_scale, bias, out):
        from fray_triton import scaled_gemm as ts
        with torch.cuda.device(a.device):
            ts.scaled_gemm(a, b, a_scale, b_scale, self.kinds[0], self.kinds[1], bias, out, self.config)


def _trivial_product(m, n, k, bias, out):
    """M or N = 0: nothing to write; K = 0: out = bias (or zeros). True when the call is done."""
    if m == 0 or n == 0:
        return True
    if k == 0:
        if bias is None:
            out.zero_()
        else:
            out.copy_(bias.expand(m, n))
        return True
    return False


def _pick_backend(op, backend, device, why_not):
    """(backend, cuda fits): "cuda", or "triton" where why_not() names what the CUDA kernel cannot
    take (a ValueError when backend="cuda" was asked for)."""
    be = B.resolve(op, "gemm", backend, device)
    if be != "cuda":
        return be, False
    why = why_not()
    if why is None:
        return be, True
    if backend == "cuda":
        raise ValueError("backend='cuda' cannot take this call: %s (backend='triton' or 'auto' can)" % why)
    return "triton", False


def _trivial_plan(*tensors):
    """The plan of a product with M, N or K = 0 (_trivial_product on the call's (.., bias, out))."""
    _trivial_product(tensors[0].shape[0], tensors[-1].shape[1], tensors[0].shape[1], tensors[-2], tensors[-1])


def _scaled_gemm_impl(a, b, a_scale, b_scale, bias, out, fast_accum, backend):
    """Runs one validated call; returns its plan (what a later call of the same signature, 16-byte
    alignment included, may run directly), or None where none may be kept (built during capture)."""
    m, k = a.shape
    n = b.shape[0]
    if _trivial_product(m, n, k, bias, out):
        return _trivial_plan
    be, fits = _pick_backend("scaled_gemm", backend, a.device, lambda: _cuda_takes(a, b, out, bias, a_scale, b_scale))
    key = P.signature("scaled_gemm:plan", be, (a, b, a_scale, b_scale, bias, out), (fast_accum, fits))
    plan = P.PLANS.get(key)
    if plan is None:
        kind_a, kind_b = _scale_kinds(a_scale, b_scale, m, n, k)
        plan = (_ScaledCudaPlan if be == "cuda" else _ScaledTritonPlan)(a, b, kind_a, kind_b, bias, out, fast_accum)
        if P.capturing():
            plan(a, b, a_scale, b_scale, bias, out)
            return None
        P.PLANS.put(key, plan)
    plan(a, b, a_scale, b_scale, bias, out)
    return plan


@P.custom_op("fray::scaled_gemm", mutates_args=("out",))
def _scaled_gemm_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                    bias: Optional[torch.Tensor], out: torch.Tensor, fast_accum: bool, backend: str) -> None:
    _scaled_gemm_impl(a, b, a_scale, b_scale, bias, out, fast_accum, backend)


_scaled_gemm_op.register_fake(lambda *args, **kwargs: None)


def scaled_gemm(a, b, a_scale, b_scale, *, out_dtype=torch.bfloat16, bias=None, out=None, fast_accum=False,
                backend="auto"):
    """out [M, N] = (a * a_scale) @ (b * b_scale)^T (+ bias), rounded once to out_dtype.

    a [M, K] and b [N, K] (nn.Linear's layout): int8 (exact int32 accumulation, K <= 131072) or
    float8_e4m3fn (fp32 accumulation on the tensor cores), last dimension contiguous. Scales are
    fp32, contiguous, and their shapes say what they scale (fray.quantize's outputs fit as they are):

      a_scale  [] or [1]: the tensor | [M, 1] (or [M]): per row (token) | [M, ceil(K / 128)]: per row
               and 128 of K (quantize(a, granularity="block", block=(1, 128))), row-major or
               MN-major (stride 1 along M, columns padded as DeepGEMM's TMA-aligned layout pads
               them: a view of a [ceil(K / 128), M_pad] tensor; the CUDA backend copies those to
               row-major, [M, ceil(K / 128)] fp32, before its launch)
      b_scale  [] or [1]: the tensor | [N, 1] (or [N]): per output channel (quantize(b,
               granularity="token")) | [ceil(N / 128), ceil(K / 128)]: per 128 x 128 block

    Block scales go with block scales (float8_e4m3fn only): each 128-deep slice of the product is
    promoted to fp32 registers times its two scales, as DeepSeek-V3 specifies. Otherwise the
    scales apply once, in the epilogue: fp32(acc) * b_scale, then * a_scale (+ bias).
    out_dtype: bf16 (default), fp16 or fp32; bias: [N] of out_dtype. fast_accum (e4m3 with tensor /
    vector scales): accumulate across all of K in the tensor core (torch._scaled_mm's
    use_fast_accum=True; faster, with a ~13-bit-mantissa running sum) instead of promoting to fp32
    every 128 of K.

    backend "cuda": CUTLASS TMA + wgmma kernels on fray.jit (cuda/gemm/scaled_gemm_sm90.cuh), the
    tile chosen by fray.tune per shape bucket; they need K a multiple of 16, 16-byte output rows and
    16-byte aligned bases and row strides (ValueError otherwise). "triton": a tiled tl.dot kernel
    with masked loads (any shape). "auto": cuda, or triton for what cuda cannot take. CUDA tensors
    run on the current stream without host synchronisation (CUDA-graph capturable after one eager
    call; torch.compile traces the custom op fray::scaled_gemm). CPU tensors run the float64
    reference (fray.reference.quant.scaled_gemm).
    """
    if not _compiling():
        # validated once per signature: a later call with the same shapes, strides, dtypes,
        # devices, scalars and 16-byte alignment launches the plan the first one built
        key = P.signature("scaled_gemm", backend, (a, b, a_scale, b_scale, bias, out),
                          (out_dtype, fast_accum, P.misaligned(a, b, out)))
        plan = P.PLANS.get(key)
        if plan is not None:
            if out is None:
                out = torch.empty(a.shape[0], b.shape[0], dtype=out_dtype, device=a.device)
            plan(a, b, a_scale, b_scale, bias, out)
            return out
    V.require_backend(backend, B.BACKENDS)
    m, n, k, kind_a, kind_b = _check_scaled_gemm(a, b, a_scale, b_scale, out_dtype, bias, out, fast_accum)
    if a.device.type == "cpu":
        V.require_cpu_backend(backend, "a")
        c = ref.scaled_gemm(a.float().numpy(), b.float().numpy(), a_scale.numpy(), b_scale.numpy(), kind_a, kind_b,
                            None if bias is None else bias.double().numpy())
        c = torch.from_numpy(np.ascontiguousarray(c)).to(out_dtype)
        if out is not None:
            out.copy_(c)
            return out
        return c
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if _compiling():
        torch.ops.fray.scaled_gemm(a, b, a_scale, b_scale, bias, out, fast_accum, backend)
        return out
    plan = _scaled_gemm_impl(a, b, a_scale, b_scale, bias, out, fast_accum, backend)
    if plan is not None:
        P.PLANS.put(key, plan)
    return out


# ---------------------------------------------------------------------------------------------
# w8a16_gemm: out = x @ (w * w_scale)^T (+ bias), bf16 / fp16 activations and 8-bit weights

_W8_X = (torch.bfloat16, torch.float16)
_W8_CT = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half", torch.int8: "int8_t",
          torch.float8_e4m3fn: "__nv_fp8_e4m3"}
_W8_SCALE_CT = {"tensor": "kScaleChannel", "channel": "kScaleChannel", "group": "kScaleGroup"}
W8A16_GROUP = ref.W8A16_GROUP
W8A16_MAX_M = 16  # the CUDA kernel's rows of x (two m16n8k16 n-tiles); larger M runs Triton
B.register_preference("w8a16_gemm", ("cuda", "triton"))
CUDA_FAMILIES["w8a16_gemm"] = "gemm"


def _w8(rowtiles, warps, tile_k, stages, split_k):
    """A configuration of the bulk-copy small-M kernel on 8-bit weights (SmallMBulkConfig with W
    int8 / e4m3): 16 * rowtiles weight rows a CTA, `warps` consumer warps plus one producer,
    tile_k weights (bytes) of each row per stage, split_k CTAs of a cluster along K."""
    return {"kernel": "small_m_bulk_w8", "rowtiles": rowtiles, "warps": warps, "tile_k": tile_k, "stages": stages,
            "split_k": split_k}


# Stage bytes around those of the bf16 kernel's best M = 1 configuration (16 rows x 2 KB x 3
# stages, bench/NOTES.md, GEMM), deeper rings, 32-row CTAs and a 2-way split of K for N too small
# to fill 132 SMs with 16-row CTAs. Every tile_k is a multiple of 128 (the scale groups).
# The 32-row CTA (first) won every bucket of bench/quant/w8a16_gemm on the H200 (2026-12-04), by 7-12%
# over the next; the last two are its neighbours (a deeper ring of shorter rows, fewer warps).
W8A16_CANDIDATES = [_w8(2, 8, 1024, 3, 1), _w8(1, 8, 2048, 3, 1), _w8(1, 8, 1024, 4, 1), _w8(1, 4, 1024, 4, 1),
                    _w8(1, 4, 1024, 6, 1), _w8(1, 8, 1024, 3, 2), _w8(1, 4, 2048, 4, 1), _w8(2, 8, 512, 6, 1),
                    _w8(2, 4, 1024, 3, 1)]


def w8a16_kernel_source(config, x_dtype, w_dtype, kind, bias, m):
    """(name, translation unit) of one W8A16 configuration for M rows of x (the JIT contract's 3-line TU)."""
    mtiles = 1 if m <= 8 else 2
    name = "gemm_w8a16_%s_%s_%s%s_m%d_r%d_w%d_k%d_s%d_z%d" % (
        V.DTYPE_NAMES[x_dtype], _SG_NAMES[w_dtype], "group" if kind == "group" else "channel", "_bias" if bias else "", mtiles * 8, config["rowtiles"] * 16,
        config["warps"], config["tile_k"], config["stages"], config["split_k"])
    src = ('#include "cuda/gemm/gemm_small_m.cuh"\n'
           "using Config = fray::gemm::small_m::SmallMBulkConfig<%s, %s, %s, %d, %d, %d, %d, %d, %d, false, %s, "
           "fray::gemm::small_m::%s>;\n"
           "FRAY_GEMM_SMALL_M_ENTRY(Config)\n" % (
               _W8_CT[x_dtype], _W8_CT[x_dtype], "true" if bias else "false", mtiles, config["rowtiles"],
               config["warps"], config["tile_k"], config["stages"], config["split_k"], _W8_CT[w_dtype],
               _W8_SCALE_CT[kind]))
    return name, src


def _w8a16_kind(w_scale, n, k):
    """The scale kind from w_scale's shape (see w8a16_gemm's docstring), or ValueError."""
    g = ref.cdiv(k, W8A16_GROUP)
    shape = tuple(w_scale.shape)
    if shape in ((n,), (n, 1)):
        return "channel"
    if shape == (n, g):
        return "group"
    if w_scale.numel() == 1 and len(shape) <= 2:
        return "tensor"
    raise ValueError("w_scale: expected one scale ([] or [1]), one per output channel ([%d] or [%d, 1]) or one per "
                     "output channel and 128 of K ([%d, %d]), got shape %s" % (n, n, n, g, shape))


def _check_w8a16(x, w, w_scale, bias, out):
    for name, t in (("x", x), ("w", w), ("w_scale", w_scale)):
        V.require_tensor(name, t)
    V.require_tensor("bias", bias, allow_none=True)
    V.require_tensor("out", out, allow_none=True)
    V.require_device_family("x", x)
    V.require_same_device([("x", x), ("w", w), ("w_scale", w_scale), ("bias", bias), ("out", out)])
    if x.dtype not in _W8_X:
        raise TypeError("x: expected dtype bfloat16 or float16, got %s" % _name(x.dtype))
    if w.dtype not in _SG_IN:
        raise TypeError("w: expected dtype int8 or float8_e4m3fn, got %s" % _name(w.dtype))
    if w_scale.dtype != torch.float32:
        raise TypeError("w_scale: expected float32 scales, got %s" % _name(w_scale.dtype))
    m, n, k = _check_operands("x", x, "w", w)
    kind = _w8a16_kind(w_scale, n, k)
    if not w_scale.is_contiguous():
        raise ValueError("w_scale: expected a contiguous (row-major) scale tensor, got strides %s" % (w_scale.stride(),))
    if bias is not None:
        if bias.dtype != x.dtype:
            raise TypeError("bias: expected dtype %s (that of x), got %s" % (_name(x.dtype), _name(bias.dtype)))
        V.require_shape("bias", bias, (n,))
        if n > 1 and bias.stride(0) != 1:
            raise ValueError("bias: expected a contiguous [N] vector, got stride %d" % bias.stride(0))
    if out is not None:
        if out.dtype != x.dtype:
            raise TypeError("out: expected dtype %s (that of x), got %s" % (_name(x.dtype), _name(out.dtype)))
        V.require_shape("out", out, (m, n))
        if n > 1 and out.stride(1) != 1:
            raise ValueError("out: the last dimension must be contiguous (stride 1), got strides %s" % (out.stride(),))
        if m > 1 and out.stride(0) < n:
            raise ValueError("out: rows overlap (row stride %d < row length %d)" % (out.stride(0), n))
    return m, n, k, kind


def _w8a16_lds(kind, w_scale):
    """The scales' row stride in the kernels' indexing: 0 (one scale), 1 (per channel), G (per group)."""
    return {"tensor": 0, "channel": 1}.get(kind) if kind != "group" else w_scale.stride(0)


def _w8a16_cuda_takes(x, w):
    """None when the CUDA kernel takes these operands as they are, else why not."""
    m, k = x.shape
    if m > W8A16_MAX_M:
        return "M = %d rows of x: the CUDA kernel is the decode kernel (M <= %d)" % (m, W8A16_MAX_M)
    if k % 16:
        return "K = %d is not a multiple of 16 (16-byte rows of 8-bit weights)" % k
    if x.data_ptr() % 16 or (m > 1 and x.stride(0) % 8):
        return "x's base address or row stride is not a multiple of 16 bytes"
    if w.data_ptr() % 16 or (w.shape[0] > 1 and w.stride(0) % 16):
        return "w's base address or row stride is not a multiple of 16 bytes"
    return None


def w8a16_operands(m, n, k, x_dtype, w_dtype, kind, device="cpu", seed=0, bias=False):
    """Test operands: x (randn, x_dtype), w (uniform int8, or e4m3 of randn * 64), fp32 scales of the
    kind's shape in [0.5, 1.5) / 128, and a randn bias of x_dtype (or None)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(x_dtype)
    if w_dtype == torch.int8:
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    else:
        w = (torch.randn(n, k, generator=g) * 64).to(w_dtype)
    shape = {"tensor": (), "channel": (n,), "group": (n, ref.cdiv(k, W8A16_GROUP))}[kind]
    s = (torch.rand(shape, generator=g) + 0.5) / 128
    b = torch.randn(n, generator=g).to(x_dtype) if bias else None
    return [t.to(device) if t is not None else None for t in (x, w, s, b)]


def assert_w8a16_close(out, x, w, w_scale, kind, bias=None, what=""):
    """out against the float64 reference within gemm_bound (an fp32-accumulated GEMM; tests and `fray check`)."""
    from fray import testing
    args = [t.detach().cpu().double().numpy() for t in (x, w, w_scale)]
    exp = ref.w8a16_gemm(*args, kind, None if bias is None else bias.detach().cpu().double().numpy())
    terms = ref.w8a16_gemm_terms(*args, kind)
    if bias is not None:
        terms = terms + np.abs(bias.detach().cpu().double().numpy())[None, :]
    testing.assert_gemm_close(out, exp, terms, out.dtype, x.shape[1], what)


# One ulp of each input dtype, relative (the rounding of y to x's dtype can land on either
# neighbour of the exact value when the kernel's fp32 y is a few fp32 ulps from it).
_ULP_REL = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -23}


def fused_quant_reference(op, x, weight=None, up=None, residual=None, eps=1e-6, weight_offset=0.0):
    """float64 [rows, d] of the exact norm / activation value (before any rounding to x's dtype) of
    rmsnorm_quant (op "rmsnorm") or silu_mul_quant (op "silu_mul"); with a residual, the sum is
    rounded to x's dtype first (as the op stores it)."""
    from fray.reference import activation as ref_act
    from fray.reference import convert as C
    from fray.reference import norm as ref_norm
    xf = C.to_f64(x.detach().cpu())
    if op == "rmsnorm":
        if residual is not None:
            xf = C.round_to(xf + C.to_f64(residual.detach().cpu()), x.detach().cpu())
        y = ref_norm.rmsnorm(xf, C.to_f64(weight.detach().cpu()), eps, weight_offset)
    else:
        gate, u = ref_act.split(xf) if up is None else (xf, C.to_f64(up.detach().cpu()))
        y = ref_act.silu_mul(gate, u)
    return y.reshape(-1, y.shape[-1])


def assert_fused_quant_close(q, scale, y, x_dtype, static=None, what=""):
    """(q, scale) of rmsnorm_quant / silu_mul_quant against y, the float64 exact value
    (fused_quant_reference), within the roundings the op performs: y_k = y rounded to x's dtype
    after fp32 math (within one ulp of y, rho relative), a dynamic scale = fp32(amax(|y_k|) / qmax)
    (within rho of amax(|y|) / qmax), then q = round(y_k / scale) (int8: within scale / 2; e4m3:
    within half an e4m3 ulp, 2^-4 relative, or 2^-10 scale below the normals). Exact: each row
    with a finite non-zero amax takes +-qmax somewhere (dynamic scales)."""
    fp8 = q.dtype == torch.float8_e4m3fn
    qmax = QMAX[q.dtype]
    rho = _ULP_REL[x_dtype] + 1e-5
    qv = q.detach().cpu().float().double().numpy().reshape(y.shape)
    if static is None:
        sv = scale.detach().cpu().double().numpy().reshape(-1, 1)
        fin = np.where(np.isfinite(y), np.abs(y), 0.0)
        amax = fin.max(axis=1, keepdims=True) if y.shape[1] else np.zeros((y.shape[0], 1))
        want = np.where(amax > 0, amax / qmax, 1.0)
        bad = np.abs(sv - want) > (rho + 2.0 ** -23) * want
        assert not bad.any(), "%s: %d row scales off (first row %d: %r vs %r)" % (
            what, int(bad.sum()), int(np.argmax(bad)), float(sv[bad][0]), float(want[bad][0]))
        rows = (amax[:, 0] > 0) & np.isfinite(y).all(axis=1)
        peak = np.abs(np.where(np.isnan(qv), 0.0, qv)).max(axis=1) if y.shape[1] else np.zeros(y.shape[0])
        assert (peak[rows] == qmax).all(), "%s: a row's largest |q| is not %g" % (what, qmax)
    else:
        sv = np.broadcast_to(static.detach().cpu().double().numpy().reshape(-1, 1), (y.shape[0], 1))
    ok = np.isfinite(y)
    yk_err = rho * np.abs(y)  # |y_k - y|
    yc = np.clip(y, -qmax * sv, qmax * sv)  # what the saturation keeps (static scales can clip)
    if fp8:
        tol = np.maximum(2.0 ** -4 * (np.abs(yc) + yk_err), 2.0 ** -10 * sv) + yk_err + 1e-6 * sv
    else:
        tol = (0.5 + 1e-6) * sv + yk_err
    err = np.abs(qv * sv - yc)
    bad = ok & ~(err <= tol)
    assert not bad.any(), "%s: %d of %d values off (first at %s: q %r scale %r, exact %r)" % (
        what, int(bad.sum()), bad.size, np.unravel_index(np.argmax(bad), bad.shape), float(qv[bad][0]),
        float(np.broadcast_to(sv, y.shape)[bad][0]), float(y[bad][0]))
    assert (np.abs(qv[~np.isnan(qv)]) <= qmax).all(), "%s: |q| above %g" % (what, qmax)


class _W8TuningInput:
    """Fresh operands of one call's shape and kind, and the float64 reference the candidates are checked against."""

    def __init__(self, m, n, k, x_dtype, w_dtype, kind, bias, device):
        self.x, self.w, self.s, self.bias = w8a16_operands(m, n, k, x_dtype, w_dtype, kind, "cpu", seed=4321, bias=bias)
        self.kind = kind
        self.ref = None
        self.x, self.w, self.s = self.x.to(device), self.w.to(device), self.s.to(device)
        self.bias = None if self.bias is None else self.bias.to(device)
        self.out = torch.empty(m, n, dtype=x_dtype, device=device)

    def check(self, launch):
        from fray import testing
        self.out.fill_(float("nan"))
        launch()
        if self.ref is None:
            s = self.s.double()
            if self.kind == "group":
                s = s.repeat_interleave(W8A16_GROUP, 1)[:, :self.x.shape[1]]
            else:
                s = s.reshape(-1, 1) if s.numel() > 1 else s.reshape(1, 1)
            wd = self.w.double() * s
            exp = self.x.double() @ wd.t()
            terms = self.x.double().abs() @ wd.abs().t()
            if self.bias is not None:
                exp += self.bias.double()
                terms += self.bias.double().abs()
            self.ref = (exp, terms)
        exp, terms = self.ref
        testing.assert_gemm_close(self.out, exp, terms, self.out.dtype, self.x.shape[1], "w8a16 candidate")


class _W8CudaPlan:
    """The W8A16 kernel fray.tune chose for one call signature; __call__ launches it."""

    __slots__ = ("launch", "ints", "dev")

    def __init__(self, x, w, w_scale, kind, bias, out):
        from fray import jit, tune
        m, k = x.shape
        n = w.shape[0]
        self.dev = x.device.index
        has_bias = bias is not None
        lds = _w8a16_lds(kind, w_scale)
        tuning = {}

        def inputs():
            if "x" not in tuning:
                tuning["x"] = _W8TuningInput(m, n, k, x.dtype, w.dtype, kind, has_bias, x.device)
            return tuning["x"]

        def source(c):
            return w8a16_kernel_source(c, x.dtype, w.dtype, kind, has_bias, m)

        def build(configs):
            return jit.build_many([source(c) + ((),) for c in configs], device=self.dev)

        def runner(kern):
            t = inputs()
            ptrs = (t.x.data_ptr(), t.w.data_ptr(), t.bias.data_ptr() if has_bias else 0, t.out.data_ptr(),
                    t.s.data_ptr())
            ints = (m, n, k, k, k, n, _w8a16_lds(kind, t.s))
            return lambda: kern.launch(ptrs, ints, (), self.dev, B.current_stream(x.device))

        bucket = "%s%s->%s:m%d:n%d:k%d" % (kind, "+bias" if has_bias else "", V.DTYPE_NAMES[x.dtype],
                                            1 << (m - 1).bit_length() if m > 1 else 1, n, k)
        config = tune.choose("gemm_w8a16", bucket, _SG_NAMES[w.dtype], W8A16_CANDIDATES, build=build,
                             run=lambda c, kern: runner(kern)(), check=lambda c, kern: inputs().check(runner(kern)),
                             default=dict(W8A16_CANDIDATES[0]), flops=2.0 * m * n * k, bytes=float(n * k),
                             device=self.dev)
        tuning.clear()
        name, src = source(config)
        self.launch = jit.build(name, src, device=self.dev).launch
        self.ints = (m, n, k, x.stride(0) if m > 1 else k, w.stride(0) if n > 1 else k, out.stride(0) if m > 1 else n,
                     lds)

    def __call__(self, x, w, w_scale, bias, out):
        self.launch((x.data_ptr(), w.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                     w_scale.data_ptr()), self.ints, (), self.dev, B.current_stream(out.device))


class _W8TritonPlan:
    __slots__ = ("config", "lds", "group")

    def __init__(self, x, w, w_scale, kind, bias, out):
        from fray_triton import w8a16_gemm as tw
        self.config = tw.config_for(x.shape[0])
        self.lds, self.group = _w8a16_lds(kind, w_scale), kind == "group"

    def __call__(self, x, w, w_scale, bias, out):
        from fray_triton import w8a16_gemm as tw
        with torch.cuda.device(x.device):
            tw.w8a16_gemm(x, w, w_scale, self.lds, self.group, bias, out, self.config)


def _w8a16_impl(x, w, w_scale, bias, out, backend):
    """Runs one validated call; returns its plan, or None (as _scaled_gemm_impl)."""
    m, k = x.shape
    n = w.shape[0]
    if _trivial_product(m, n, k, bias, out):
        return _trivial_plan
    be, fits = _pick_backend("w8a16_gemm", backend, x.device, lambda: _w8a16_cuda_takes(x, w))
    key = P.signature("w8a16_gemm:plan", be, (x, w, w_scale, bias, out), (fits,))
    plan = P.PLANS.get(key)
    if plan is None:
        kind = _w8a16_kind(w_scale, n, k)
        plan = (_W8CudaPlan if be == "cuda" else _W8TritonPlan)(x, w, w_scale, kind, bias, out)
        if P.capturing():
            plan(x, w, w_scale, bias, out)
            return None
        P.PLANS.put(key, plan)
    plan(x, w, w_scale, bias, out)
    return plan


@P.custom_op("fray::w8a16_gemm", mutates_args=("out",))
def _w8a16_op(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: Optional[torch.Tensor],
              out: torch.Tensor, backend: str) -> None:
    _w8a16_impl(x, w, w_scale, bias, out, backend)


_w8a16_op.register_fake(lambda *args, **kwargs: None)


def w8a16_gemm(x, w, w_scale, *, bias=None, out=None, backend="auto"):
    """out [M, N] = x @ (w * w_scale)^T (+ bias): bf16 / fp16 activations times 8-bit weights
    (W8A16, the decode GEMM of weight-only quantized models), fp32 accumulation, one rounding to
    x's dtype.

    x [M, K] bf16 or fp16; w [N, K] (nn.Linear's layout) int8 or float8_e4m3fn, both with a
    contiguous last dimension. w_scale, fp32 and contiguous, says by its shape what it scales
    (fray.quantize's outputs fit as they are):

      []  or [1]                 one scale for all of w
      [N] or [N, 1]              one per output channel (quantize(w, granularity="token"))
      [N, ceil(K / 128)]         one per output channel and 128 of K (quantize(w, granularity="block",
                                 block=(1, 128)))

    The weights convert exactly to x's dtype in registers (|q| <= 127 and every e4m3 value are
    bf16 and fp16 numbers); a per-channel scale multiplies the fp32 sum once, a per-group scale
    each 128-deep slice's fp32 partial sum. bias: [N] of x's dtype.

    backend "cuda" (M <= 16, K a multiple of 16, 16-byte aligned bases and row strides of x and
    w; ValueError otherwise): the weight-streaming kernel of cuda/gemm/gemm_small_m.cuh on
    fray.jit (a cp.async.bulk ring of 8-bit weight rows, mma.sync m16n8k16; each weight byte read
    once), its configuration chosen by fray.tune per shape bucket. "triton": a tiled tl.dot kernel
    with masked loads (any shape). "auto": cuda, or triton for what cuda cannot take. CUDA tensors
    run on the current stream without host synchronisation (CUDA-graph capturable after one eager
    call; torch.compile traces the custom op fray::w8a16_gemm). CPU tensors run the float64
    reference (fray.reference.quant.w8a16_gemm).
    """
    if not _compiling():
        key = P.signature("w8a16_gemm", backend, (x, w, w_scale, bias, out), (P.misaligned(x, w),))
        plan = P.PLANS.get(key)
        if plan is not None:
            if out is None:
                out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
            plan(x, w, w_scale, bias, out)
            return out
    V.require_backend(backend, B.BACKENDS)
    m, n, k, kind = _check_w8a16(x, w, w_scale, bias, out)
    if x.device.type == "cpu":
        V.require_cpu_backend(backend, "x")
        c = ref.w8a16_gemm(x.double().numpy(), w.float().double().numpy(), w_scale.double().numpy(), kind,
                           None if bias is None else bias.double().numpy())
        c = torch.from_numpy(np.ascontiguousarray(c)).to(x.dtype)
        if out is not None:
            out.copy_(c)
            return out
        return c
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if _compiling():
        torch.ops.fray.w8a16_gemm(x, w, w_scale, bias, out, backend)
        return out
    plan = _w8a16_impl(x, w, w_scale, bias, out, backend)
    if plan is not None:
        P.PLANS.put(key, plan)
    return out


# ---------------------------------------------------------------------------------------------
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

CASES = [("tensor", None), ("token", None), ("channel", None), ("block", (1, 128)), ("block", (128, 128))]
CUDA_CASES = [("token", None), ("block", (1, 128))]  # what the CUDA quantizers take (cuda/quant)


def _case_x(m, k, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g) * 4).to(dtype).to(device)


def _gshape(granularity, block):
    return granularity if block is None else "block%dx%d" % block


def _assert_quantize_matches(x, qdtype, granularity, block, q, s, what="quantize"):
    eq, es = ref.quantize(x.detach().double().cpu().numpy(), _REF_NAME[qdtype], granularity, block)
    got_s = s.detach().cpu().numpy().reshape(es.shape)
    assert np.array_equal(got_s, es), "%s: scales differ from the reference" % what
    got = q.detach().cpu().float().numpy()
    assert np.array_equal(got, eq, equal_nan=True), "%s: %d values differ from the reference" % (
        what, int((~np.isclose(got, eq, equal_nan=True, rtol=0, atol=0)).sum()))


def _assert_dequantize_matches(q, s, granularity, block, dtype, x, what="dequantize"):
    e = torch.from_numpy(ref.dequantize(q.detach().cpu().float().numpy(), s.detach().cpu().numpy(), granularity,
                                        block)).to(dtype).float().numpy()
    assert np.array_equal(x.detach().cpu().float().numpy(), e, equal_nan=True), "%s differs from the reference" % what


def check_cases(device):
    """On a GPU: the Triton backend at every granularity (int8 and e4m3, bf16 input) and the
    round trip. On the CPU: the reference on hand-computed values and the int8 kernels under
    Triton's interpreter (its float8 and bf16 conversions do not round as the hardware does:
    the round trip goes to fp16 there)."""
    def quant(backend, qdtype, granularity, block, m, k, dev):
        x = _case_x(m, k, torch.bfloat16, dev)
        if backend == "triton-interpreter":
            from fray_triton import quant as tq
            q, s, amax = _quantize_outputs(x, qdtype, granularity, block, None, None)
            tq.quantize(x, q, s, granularity, block, QMAX[qdtype], qdtype == torch.float8_e4m3fn, False, amax)
        else:
            q, s = quantize(x, qdtype, granularity=granularity, block=block or (1, 128), backend=backend)
        _assert_quantize_matches(x, qdtype, granularity, block, q, s, "quantize " + _gshape(granularity, block))
        if backend == "triton-interpreter":  # fp16: the interpreter truncates fp32 -> bf16
            from fray_triton import quant as tq
            xd = torch.empty(x.shape, dtype=torch.float16, device=dev)
            tq.dequantize(q, s, xd, granularity, block)
        else:
            xd = dequantize(q, s, granularity=granularity, block=block,
                            backend="auto" if backend == "cuda" else backend)  # no CUDA dequantize yet
        _assert_dequantize_matches(q, s, granularity, block, xd.dtype, xd)

    def hand():
        # amax 254 -> scale 2; 1/2 = 0.5 and 3/2 = 1.5 round to even (0, 2); -254 -> -127
        q, s = quantize(np.array([[1.0, 3.0, -254.0, 0.0]], np.float32), granularity="token")
        assert q.tolist() == [[0, 2, -127, 0]] and s.tolist() == [[2.0]], (q, s)
        # an all-zero group: scale 1; NaN / inf are left out of the amax, NaN -> 0, inf -> 127
        q, s = quantize(np.array([[0.0, 0.0], [np.nan, np.inf]], np.float32), granularity="token")
        assert q.tolist() == [[0, 0], [0, 127]] and s.tolist() == [[1.0], [1.0]], (q, s)
        x = dequantize(np.array([[3, -127]], np.int8), np.array([[0.5]], np.float32), granularity="token",
                       dtype=torch.float32)
        assert x.tolist() == [[1.5, -63.5]], x

    def sg(backend, dtype, kind, m, n, k, dev):
        a, b, sa, sb, bias = scaled_gemm_operands(m, n, k, dtype, kind, kind, dev, seed=m + k, bias_dtype=torch.bfloat16)
        if backend == "triton-interpreter":
            from fray_triton import scaled_gemm as ts
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
            ts.scaled_gemm(a, b, sa, sb, _KIND_CODE[kind], _KIND_CODE[kind], bias, out,
                           {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2})
        else:
            out = scaled_gemm(a, b, sa, sb, bias=bias, backend=backend)
        assert_scaled_gemm_close(out, a, b, sa, sb, kind, kind, bias, what="scaled_gemm %s %dx%dx%d" % (backend, m, n, k))

    def w8(backend, wdt, kind, m, n, k, dev):
        x, w, s_, b = w8a16_operands(m, n, k, torch.float16 if dev == "cpu" else torch.bfloat16, wdt, kind, dev,
                                     seed=m + k, bias=True)
        if backend == "triton-interpreter":
            from fray_triton import w8a16_gemm as tw
            out = torch.full((m, n), float("nan"), dtype=x.dtype)
            tw.w8a16_gemm(x, w, s_, _w8a16_lds(kind, s_), kind == "group", b, out, tw.config_for(m))
        else:
            out = w8a16_gemm(x, w, s_, bias=b, backend=backend)
        assert_w8a16_close(out, x, w, s_, kind, b, what="w8a16_gemm %s %s %dx%dx%d" % (backend, kind, m, n, k))

    def w8_hand():
        out = w8a16_gemm(torch.tensor([[1.0, -2.0], [3.0, 4.0]], dtype=torch.bfloat16),
                         torch.tensor([[5, 6], [-7, 8], [1, 1]], dtype=torch.int8), torch.tensor([1.0, 2.0, 4.0]))
        assert out.float().tolist() == [[-7.0, -46.0, -4.0], [39.0, 22.0, 28.0]], out

    def sg_hand():
        out = scaled_gemm(torch.tensor([[1, -2], [3, 4]], dtype=torch.int8), torch.tensor([[5, 6], [-7, 8]], dtype=torch.int8),
                          torch.tensor([[1.0], [0.5]]), torch.tensor(2.0), out_dtype=torch.float32)
        assert out.tolist() == [[-14.0, -46.0], [39.0, 11.0]], out

    def fused(op, backend, qdtype, m, h, dev):
        x = _case_x(m, 2 * h if op == "silu_mul_quant" else h, torch.bfloat16, dev)
        w = (torch.rand(h, generator=torch.Generator().manual_seed(h)) + 0.5).to(torch.bfloat16).to(dev)
        r = _case_x(m, h, torch.bfloat16, dev, seed=1) if op == "rmsnorm_quant" else None
        r0 = None if r is None else r.clone()
        if backend == "triton-interpreter":
            from fray_triton import rmsnorm_quant as trq
            from fray_triton import silu_mul_quant as tsq
            q = torch.empty(m, h, dtype=qdtype)
            s = torch.full((m, 1), -1.0)
            if op == "rmsnorm_quant":
                trq.rmsnorm_quant(x, r, w, q, s, 1e-6, 0.0, QMAX[qdtype], False, False, h, h, h, 1, m, h)
            else:
                tsq.silu_mul_quant(x, x.narrow(-1, h, h), q, s, QMAX[qdtype], False, False, 2 * h, 2 * h, h, 1, m, h)
        elif op == "rmsnorm_quant":
            q, s = rmsnorm_quant(x, w, dtype=qdtype, residual=r, backend=backend)
        else:
            q, s = silu_mul_quant(x, dtype=qdtype, backend=backend)
        y = fused_quant_reference("rmsnorm" if op == "rmsnorm_quant" else "silu_mul", x, weight=w, residual=r0)
        assert_fused_quant_close(q, s, y, x.dtype, what="%s %s %dx%d" % (op, backend, m, h))

    if device.type != "cuda":
        cases = [("quantize+dequantize", "reference", "fp64", "hand", hand), ("scaled_gemm", "reference", "fp64", "hand", sg_hand),
                 ("w8a16_gemm", "reference", "fp64", "hand", w8_hand)]
        for op in ("rmsnorm_quant", "silu_mul_quant"):
            cases.append((op, "triton-interpreter", "bf16->int8", "37x200",
                          lambda o=op: fused(o, "triton-interpreter", torch.int8, 37, 200, "cpu")))
        for granularity, block in CASES:
            cases.append(("quantize", "triton-interpreter", "bf16->int8", "%s:37x200" % _gshape(granularity, block),
                          lambda g=granularity, b=block: quant("triton-interpreter", torch.int8, g, b, 37, 200,
                                                               "cpu")))
        for kind in ("vector", "block"):  # the kernel's block path is dtype-blind: int8 runs it here
            cases.append(("scaled_gemm", "triton-interpreter", "int8->bf16", "%s:37x40x200" % kind,
                          lambda kd=kind: sg("triton-interpreter", torch.int8, kd, 37, 40, 200, "cpu")))
        for kind in ("channel", "group"):
            cases.append(("w8a16_gemm", "triton-interpreter", "fp16xint8->fp16", "%s:7x40x200" % kind,
                          lambda kd=kind: w8("triton-interpreter", torch.int8, kd, 7, 40, 200, "cpu")))
        return cases

    def rows(op, backend):
        if op == "dequantize":
            return []  # quant() checks the round trip
        if op in ("rmsnorm_quant", "silu_mul_quant"):
            return [("bf16->%s" % _name(qdtype), "%dx%d" % (m, h),
                     lambda b=backend, o=op, d=qdtype, m_=m, h_=h: fused(o, b, d, m_, h_, device))
                    for qdtype in Q_DTYPES for m, h in ((1, 4096), (333, 1000), (64, 20000))]
        if op == "w8a16_gemm":
            return [(label, "%s:%dx%dx%d" % (kind, m, n, k),
                     lambda b=backend, d=wdt, kd=kind, m_=m, n_=n, k_=k: w8(b, d, kd, m_, n_, k_, device))
                    for label, wdt, kind in (("bf16xint8->bf16", torch.int8, "channel"),
                                             ("bf16xe4m3->bf16", torch.float8_e4m3fn, "group"))
                    for m, n, k in ((1, 4096, 4096), (16, 4096, 4096))]
        if op == "scaled_gemm":
            return [(label, "%s:%dx%dx%d" % (kind, m, n, k),
                     lambda b=backend, d=dtype, kd=kind, m_=m, n_=n, k_=k: sg(b, d, kd, m_, n_, k_, device))
                    for label, dtype, kind in (("int8->bf16", torch.int8, "vector"),
                                               ("e4m3->bf16", torch.float8_e4m3fn, "vector"),
                                               ("e4m3->bf16", torch.float8_e4m3fn, "block"))
                    for m, n, k in ((16, 4096, 4096), (4096, 4096, 4096))]
        return [("bf16->%s" % _name(qdtype), "%s:%dx%d" % (_gshape(granularity, block), m, k),
                 lambda b=backend, d=qdtype, g=granularity, bl=block, m_=m, k_=k: quant(b, d, g, bl, m_, k_, device))
                for qdtype in Q_DTYPES for granularity, block in (CUDA_CASES if backend == "cuda" else CASES)
                for m, k in ((1, 128), (333, 1000), (4096, 7168))]
    return B.gpu_check_rows(lambda op: CUDA_FAMILIES.get(op, FAMILY), OPS, device, rows)
