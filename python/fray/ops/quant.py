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

The block scales are row-major [ceil(M / bm), ceil(K / bk)] fp32; DeepGEMM's MN-major,
TMA-aligned activation-scale layout is left for the scaled-GEMM change that consumes it.

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
OPS = ("quantize", "dequantize")
__all__ = ["quantize", "dequantize"]
B.register_preference("quantize", ("triton",))
B.register_preference("dequantize", ("triton",))
# No fray._C._quant extension yet: the family says itself why backend="cuda" cannot run.
B.register_cuda_check(FAMILY, lambda device: "the quant family has no CUDA C++ kernels yet (use 'triton')")

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


def _check_quantize(x, dtype, granularity, block, scale, out):
    m, k = _check_2d("x", x, "float16/float32", lambda d: d in _NP_FLOAT)
    if not V.is_array(x):
        V.require_float_dtype("x", x)
    if dtype not in Q_DTYPES:
        raise TypeError("dtype: expected torch.int8 or torch.float8_e4m3fn, got %r" % (dtype,))
    if V.is_array(x) and dtype != torch.int8:
        raise TypeError("dtype: numpy arrays quantize to torch.int8 only (numpy has no float8), got %s"
                        % _name(dtype))
    block = _check_granularity(granularity, block, True)
    if scale is not None:
        _check_scale(scale, x, granularity, m, k, block)
    _check_out(out, x, dtype, m, k)
    return m, k, block


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

def _quantize_launch(x, granularity, block, dtype, static, backend):
    """The launch plan taking (x, q, scale, amax)."""
    if x.numel() == 0:
        return P.NOOP
    B.resolve("quantize", FAMILY, backend, x.device)
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


def _quantize_outputs(x, dtype, granularity, block, scale, out):
    """(q, scale, amax or None) on x's device."""
    m, k = x.shape
    dev = x.device
    q = out if out is not None else torch.empty((m, k), dtype=dtype, device=dev)
    static = scale is not None
    if not static:
        scale = torch.empty(ref.scale_shape(granularity, m, k, block), dtype=torch.float32, device=dev)
    amax = (torch.zeros(ref.scale_shape(granularity, m, k, block), dtype=torch.int32, device=dev)
            if _needs_amax(granularity, static) else None)
    return q, scale, amax


class _QuantizePlan:
    __slots__ = ("launch", "dtype", "granularity", "block")

    def __init__(self, launch, dtype, granularity, block):
        self.launch, self.dtype, self.granularity, self.block = launch, dtype, granularity, block

    def __call__(self, x, scale, out):
        q, s, amax = _quantize_outputs(x, self.dtype, self.granularity, self.block, scale, out)
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

def quantize(x, dtype=torch.int8, *, granularity="tensor", block=(1, 128), scale=None, out=None, backend="auto"):
    """(q, scale): x [M, K] (bf16/fp16/fp32) quantized to dtype (torch.int8 or
    torch.float8_e4m3fn) with fp32 scales per group.

    granularity: "tensor" (scale shape []), "token" (per row, [M, 1]), "channel" (per column,
    [1, K]) or "block" (per (bm, bk) tile of `block`, (1, 128) or (128, 128): [ceil(M / bm),
    ceil(K / bk)], the last tiles clipped at M and K). block is read for granularity="block" only.
    scale=None: dynamic scales, amax / qmax per group (qmax 127 for int8, 448 for e4m3) over the
    group's finite values, a zero scale replaced by 1 (an all-zero group quantizes to zeros with
    scale 1). Otherwise scale is a static fp32 tensor of the group shape (for "tensor" [] or [1])
    and is returned as given. q = round-to-nearest-even(fp32(x / scale)), saturated to
    [-qmax, qmax] (int8 never -128); +-inf saturate, NaN gives 0 (int8) or NaN (e4m3). The block
    scales are row-major; DeepGEMM's MN-major TMA-aligned activation layout is left for the
    scaled-GEMM change. out: an [M, K] tensor of dtype to write q into.

    CUDA tensors run Triton on the current stream without host synchronisation: token and block
    in one launch (one program per group: amax, then quantize), tensor and channel in two (an
    amax with integer atomics, then quantize) plus a zero fill. CPU tensors and numpy arrays run
    the exact reference (numpy arrays: int8 only).
    """
    if not _compiling():
        key = P.signature("quantize", backend, (x, scale, out), (dtype, granularity, block))
        plan = P.PLANS.get(key)
        if plan is not None:
            return plan(x, scale, out)
    V.require_backend(backend, B.BACKENDS)
    m, k, blk = _check_quantize(x, dtype, granularity, block, scale, out)
    array = V.is_array(x)
    if array or x.device.type == "cpu":
        V.require_cpu_backend(backend, "x")
        x64 = x.astype(np.float64) if array else x.detach().double().numpy()
        s_in = None if scale is None else (scale if array else scale.detach().cpu().numpy())
        qv, s = ref.quantize(x64, _REF_NAME[dtype], granularity, blk, s_in)
        if array:
            return qv.astype(np.int8), (s if scale is None else scale)
        q = torch.from_numpy(qv).to(dtype)
        if out is not None:
            out.copy_(q)
            q = out
        return q, (torch.from_numpy(np.array(s, np.float32)) if scale is None else scale)
    static = scale is not None
    if _compiling():
        q, s, amax = _quantize_outputs(x, dtype, granularity, blk, scale, out)
        torch.ops.fray.quantize(x, q, s, amax, granularity, *_block_args(blk), static, backend)
        return q, s
    launch = _quantize_launch(x, granularity, blk, dtype, static, backend)
    return P.PLANS.put(key, _QuantizePlan(launch, dtype, granularity, blk))(x, scale, out)


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
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

CASES = [("tensor", None), ("token", None), ("channel", None), ("block", (1, 128)), ("block", (128, 128))]


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
            xd = dequantize(q, s, granularity=granularity, block=block, backend=backend)
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

    if device.type != "cuda":
        cases = [("quantize+dequantize", "reference", "fp64", "hand", hand)]
        for granularity, block in CASES:
            cases.append(("quantize", "triton-interpreter", "bf16->int8", "%s:37x200" % _gshape(granularity, block),
                          lambda g=granularity, b=block: quant("triton-interpreter", torch.int8, g, b, 37, 200,
                                                               "cpu")))
        return cases
    def rows(op, backend):
        if op == "dequantize":
            return []  # quant() checks the round trip
        return [("bf16->%s" % _name(qdtype), "%s:%dx%d" % (_gshape(granularity, block), m, k),
                 lambda b=backend, d=qdtype, g=granularity, bl=block, m_=m, k_=k: quant(b, d, g, bl, m_, k_, device))
                for qdtype in Q_DTYPES for granularity, block in CASES
                for m, k in ((1, 128), (333, 1000), (4096, 7168))]
    return B.gpu_check_rows(FAMILY, OPS, device, rows)
