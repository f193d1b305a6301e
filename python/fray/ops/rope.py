"""The rope family: rotary position embedding of q and k (fray.rope).

Validation happens here, once; the kernels (cuda/rope, fray_triton.rope) trust their inputs.
GPU entry points are torch custom ops (fray::rope, fray::rope_) with fake implementations, so
torch.compile(fullgraph=True) traces through them; in eager mode the same implementation is
called directly. CPU tensors and numpy arrays run the float64 reference.

The default cos/sin table is built once per (max_position, rotary_dim, theta, device) with torch
ops on the device (float64 math, stored as fp32) and kept in _CACHES. It is looked up inside the
implementation, never in traced code, so compiled graphs see no Python dict. It cannot be built
while a CUDA graph is being captured (the build would only be recorded, not run): call fray.rope
once before capturing (every engine warms up first), or pass cos_sin_cache.

Trust boundary: positions are read on the device and never on the host. Values outside
[0, max_position) read outside the cos/sin table (undefined results, possibly a fault); callers
guarantee the range. FRAY_CHECK_INDICES=1 checks it on every call at the cost of a host
synchronisation (ValueError on a bad value; RuntimeError while a CUDA graph is being captured).
"""
import math
from typing import Optional

import numpy as np
import torch

from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray import env
from fray.reference import convert as C
from fray.reference import rope as ref

FAMILY = "rope"
OPS = ("rope",)
__all__ = ["rope"]
B.register_preference("rope", ("cuda", "triton"))

STYLES = ("neox", "gptj")
POSITION_DTYPES = (torch.int32, torch.int64)
_POSITION_CODES = {torch.int32: 32, torch.int64: 64}

# (max_position, rotary_dim, theta, device) -> fp32 [max_position, rotary_dim] (cos | sin)
_CACHES = {}


def cos_sin_cache(max_position, rotary_dim, theta=10000.0, device="cuda"):
    """The fp32 [max_position, rotary_dim] table (cos | sin) fray.rope uses when no cos_sin_cache
    is passed: cos[p, i] = cos(p * theta^(-2i/rotary_dim)), i < rotary_dim/2, computed in float64
    on `device`, built once and cached."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (int(max_position), int(rotary_dim), float(theta), device)
    table = _CACHES.get(key)
    if table is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "fray.rope: the cos/sin table for max_position=%d, rotary_dim=%d, theta=%r is not built "
                "yet and cannot be built during CUDA-graph capture; call fray.rope once before "
                "capturing, or pass cos_sin_cache" % (max_position, rotary_dim, theta))
        i = torch.arange(rotary_dim // 2, dtype=torch.float64, device=device)
        inv_freq = torch.pow(torch.tensor(float(theta), dtype=torch.float64, device=device), -2.0 * i / rotary_dim)
        angles = torch.outer(torch.arange(max_position, dtype=torch.float64, device=device), inv_freq)
        table = torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.float32).contiguous()
        _CACHES[key] = table
    return table


# ---------------------------------------------------------------------------------------------
# validation

def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _check_style(style):
    if style not in STYLES:
        raise ValueError("style: expected 'neox' or 'gptj', got %r" % (style,))
    return style == "neox"


# max_position's bound: a table of 2^31 rows would hold >= 512 GB at rotary_dim 64; past it the
# table could never be built (the reference's numpy refused 2^70 rows with no argument named).
MAX_POSITION_LIMIT = 2 ** 31


def _check_int(name, value, minimum, maximum=None):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError("%s: expected an int, got %s" % (name, type(value).__name__))
    if value < minimum:
        raise ValueError("%s: expected an int >= %d, got %d" % (name, minimum, value))
    if maximum is not None and value > maximum:
        raise ValueError("%s: expected an int <= %d, got %d" % (name, maximum, value))
    return int(value)


def _check_theta(theta):
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise TypeError("theta: expected a float, got %s" % type(theta).__name__)
    if not (math.isfinite(theta) and theta > 0):
        raise ValueError("theta: expected a finite value > 0, got %r" % (theta,))
    return float(theta)


def _check_rotary_dim(rotary_dim, head_dim, cache_width):
    """None: the width of a passed cos_sin_cache, else head_dim."""
    if rotary_dim is None:
        rotary_dim = cache_width if cache_width is not None else head_dim
    elif isinstance(rotary_dim, bool) or not isinstance(rotary_dim, (int, np.integer)):
        raise TypeError("rotary_dim: expected an int or None, got %s" % type(rotary_dim).__name__)
    rotary_dim = int(rotary_dim)
    if rotary_dim % 2 != 0 or not 2 <= rotary_dim <= head_dim:
        raise ValueError("rotary_dim: expected an even value in [2, head_dim=%d], got %d" % (head_dim, rotary_dim))
    return rotary_dim


def _non_overlapping(t):
    """True when no two indices of `t` address the same element (what writing needs)."""
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1)
    span = 1  # elements covered by the inner dims so far, as a stride bound
    for st, n in dims:
        if st < span:
            return False
        span = st * (n - 1) + span
    return True


def _check_head_tensor(name, t, q, writable):
    V.require_tensor(name, t)
    if t.dim() != 3:
        raise ValueError("%s: expected 3 dimensions [tokens, heads, head_dim], got shape %s" % (name, tuple(t.shape)))
    if t.shape[2] > 1 and t.stride(2) != 1:
        raise ValueError("%s: the last dimension must be contiguous (stride 1), got stride %d" % (name, t.stride(2)))
    if writable and not _non_overlapping(t):
        raise ValueError("%s: in place needs every element addressed once, got shape %s with strides %s"
                         % (name, tuple(t.shape), t.stride()))
    if t is not q:
        if t.device != q.device:
            raise TypeError("%s: expected a tensor on %s (the device of q), got one on %s" % (name, q.device, t.device))
        if t.dtype != q.dtype:
            raise TypeError("%s: expected dtype %s (that of q), got %s" % (name, _dtype_name(q.dtype), _dtype_name(t.dtype)))
        if t.shape[0] != q.shape[0] or t.shape[2] != q.shape[2]:
            raise ValueError("%s: expected shape [%d, heads, %d] (tokens and head_dim of q), got %s"
                             % (name, q.shape[0], q.shape[2], tuple(t.shape)))


def _check_qk(q, k, inplace):
    V.require_tensor("q", q)
    V.require_device_family("q", q)
    V.require_float_dtype("q", q)
    _check_head_tensor("q", q, q, inplace)
    if k is not None:
        _check_head_tensor("k", k, q, inplace)
    return q.shape[0], q.shape[2]


def _check_positions(positions, tokens, max_position, q):
    """(offset, positions tensor or None)."""
    if isinstance(positions, bool):
        raise TypeError("positions: expected an int32/int64 tensor or an int offset, got bool")
    if isinstance(positions, (int, np.integer)):
        offset = int(positions)
        if offset < 0 or (tokens > 0 and offset + tokens > max_position):
            raise ValueError("positions: offset %d + %d tokens must lie within max_position=%d"
                             % (offset, tokens, max_position))
        return offset, None
    if not isinstance(positions, torch.Tensor):
        raise TypeError("positions: expected an int32/int64 tensor or an int offset, got %s" % type(positions).__name__)
    if positions.dtype not in POSITION_DTYPES:
        raise TypeError("positions: expected dtype int32 or int64, got %s" % _dtype_name(positions.dtype))
    if positions.device != q.device:
        raise TypeError("positions: expected a tensor on %s (the device of q), got one on %s"
                        % (q.device, positions.device))
    if tuple(positions.shape) != (tokens,):
        raise ValueError("positions: expected shape (%d,) (one per token of q), got %s" % (tokens, tuple(positions.shape)))
    return 0, positions


def _check_table(name, t, rows, cols, device):
    V.require_tensor(name, t)
    if t.dtype != torch.float32:
        raise TypeError("%s: expected dtype float32, got %s" % (name, _dtype_name(t.dtype)))
    if t.device != device:
        raise TypeError("%s: expected a tensor on %s (the device of q), got one on %s" % (name, device, t.device))
    if tuple(t.shape) != (rows, cols):
        raise ValueError("%s: expected shape (%d, %d) = (max_position, %s), got %s"
                         % (name, rows, cols, "rotary_dim" if name == "cos_sin_cache" else "rotary_dim/2",
                            tuple(t.shape)))
    if cols > 1 and t.stride(1) != 1:
        raise ValueError("%s: the last dimension must be contiguous (stride 1), got stride %d" % (name, t.stride(1)))


def _cache_width(cache):
    if isinstance(cache, (tuple, list)) and len(cache) == 2 and hasattr(cache[0], "shape") and len(cache[0].shape) == 2:
        return 2 * cache[0].shape[1]
    if hasattr(cache, "shape") and len(cache.shape) == 2:
        return cache.shape[1]
    return None


def _check_cache(cache, max_position, rotary_dim, device):
    """(cos, sin): sin None means cos is the [max_position, rotary_dim] cos|sin table."""
    if cache is None:
        return None, None
    if isinstance(cache, (tuple, list)):
        if len(cache) != 2:
            raise ValueError("cos_sin_cache: expected a tensor or a (cos, sin) pair, got %d items" % len(cache))
        cos, sin = cache
        _check_table("cos", cos, max_position, rotary_dim // 2, device)
        _check_table("sin", sin, max_position, rotary_dim // 2, device)
        if max_position > 1 and cos.stride(0) != sin.stride(0):
            raise ValueError("cos_sin_cache: cos and sin must share a row stride, got %d and %d"
                             % (cos.stride(0), sin.stride(0)))
        return cos, sin
    if not isinstance(cache, torch.Tensor):
        raise TypeError("cos_sin_cache: expected a float32 tensor or a (cos, sin) pair, got %s" % type(cache).__name__)
    _check_table("cos_sin_cache", cache, max_position, rotary_dim, device)
    return cache, None


# ---------------------------------------------------------------------------------------------
# CPU / numpy: the float64 reference

def _cpu_cos_sin(cache, max_position, rotary_dim, theta):
    half = rotary_dim // 2
    if cache is None:
        table = ref.cos_sin_cache(max_position, rotary_dim, theta)
        return table[:, :half], table[:, half:]
    if isinstance(cache, (tuple, list)):
        return C.to_f64(cache[0]), C.to_f64(cache[1])
    table = C.to_f64(cache)
    return table[:, :half], table[:, half:]


def _cpu_rope(q, k, pos, cache, max_position, rotary_dim, theta, style, inplace):
    """q/k CPU tensors or numpy arrays; pos an int64 numpy array of positions."""
    if pos.size and (pos.min() < 0 or pos.max() >= max_position):
        raise ValueError("positions: values must lie in [0, max_position=%d), got values in [%d, %d]"
                         % (max_position, pos.min(), pos.max()))
    cos, sin = _cpu_cos_sin(cache, max_position, rotary_dim, theta)
    outs = []
    for x in (q, k):
        if x is None:
            outs.append(None)
            continue
        y = C.like(ref.rope(C.to_f64(x), pos, cos, sin, style), x)
        if inplace:
            if isinstance(x, torch.Tensor):
                x.copy_(y)
            else:
                x[...] = y
            y = x
        outs.append(y)
    return outs[0], outs[1]


def _check_arrays(q, k, positions, cache, max_position, rotary_dim):
    for name, a in (("q", q), ("k", k)):
        if a is None:
            continue
        if not isinstance(a, np.ndarray):
            raise TypeError("%s: expected a numpy.ndarray like q, got %s" % (name, type(a).__name__))
        if a.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError("%s: expected a float16/float32/float64 array, got %s" % (name, a.dtype))
        if a.ndim != 3:
            raise ValueError("%s: expected 3 dimensions [tokens, heads, head_dim], got shape %s" % (name, a.shape))
    if k is not None and (k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]):
        raise ValueError("k: expected shape [%d, heads, %d] (tokens and head_dim of q), got %s"
                         % (q.shape[0], q.shape[2], k.shape))
    tokens = q.shape[0]
    if isinstance(positions, bool):
        raise TypeError("positions: expected an integer array or an int offset, got bool")
    if isinstance(positions, (int, np.integer)):
        offset = _check_positions(positions, tokens, max_position, None)[0]
        pos = offset + np.arange(tokens, dtype=np.int64)
    elif isinstance(positions, np.ndarray):
        if not np.issubdtype(positions.dtype, np.integer):
            raise TypeError("positions: expected an integer array, got dtype %s" % positions.dtype)
        if positions.shape != (tokens,):
            raise ValueError("positions: expected shape (%d,) (one per token of q), got %s" % (tokens, positions.shape))
        pos = positions.astype(np.int64)
    else:
        raise TypeError("positions: expected a numpy integer array or an int offset, got %s" % type(positions).__name__)
    tables = cache if isinstance(cache, (tuple, list)) else (cache,)
    for t in tables:
        if t is not None and not isinstance(t, np.ndarray):
            raise TypeError("cos_sin_cache: expected numpy arrays like q, got %s" % type(t).__name__)
    if isinstance(cache, (tuple, list)):
        for name, t in zip(("cos", "sin"), cache):
            V.require_shape(name, t, (max_position, rotary_dim // 2))
    elif cache is not None:
        V.require_shape("cos_sin_cache", cache, (max_position, rotary_dim))
    return pos


# ---------------------------------------------------------------------------------------------
# GPU implementation: a launch plan (fray._plan) per call signature; the custom ops (what a
# torch.compile'd graph calls) use the same plans under keys of their own


def _check_indices(positions, max_position):
    """FRAY_CHECK_INDICES=1: a host-synchronising range check of the positions."""
    lo, hi = V.device_index_check("positions", lambda: torch.stack(torch.aminmax(positions)).tolist())
    if lo < 0 or hi >= max_position:
        raise ValueError("positions: values must lie in [0, max_position=%d), got values in [%d, %d] "
                         "(found by FRAY_CHECK_INDICES=1)" % (max_position, lo, hi))


class _RopePlan:
    """One rope signature's launch: every size and stride fixed, and the built-in cos/sin table
    when the call passes none (a passed table is the call's own: read per call, like q and k)."""

    __slots__ = ("cuda", "triton", "cos", "device")

    def __init__(self, cuda, triton, cos, device):
        self.cuda, self.triton, self.cos, self.device = cuda, triton, cos, device

    def __call__(self, q, k, q_out, k_out, positions, offset, cos, sin):
        if cos is None:
            cos = self.cos
        if self.cuda is not None:
            c = self.cuda
            c.launcher((q, q_out, k, k_out, positions, cos, sin), c.ints + (offset,), (), c.device,
                       P.current_stream(c.device))
        elif self.triton is not None:
            with torch.cuda.device(self.device):
                self.triton(q, k, q_out, k_out, positions, offset, cos, sin)


_NOTHING = _RopePlan(None, None, None, None)


def _rope_plan(q, k, q_out, k_out, positions, cos, sin, max_position, rotary_dim, theta, neox, backend):
    tokens, n_qh, head_dim = q.shape
    n_kh = k.shape[1] if k is not None else 0
    if tokens == 0 or n_qh + n_kh == 0:
        return _NOTHING
    be = B.resolve("rope", FAMILY, backend, q.device)
    builtin = cos_sin_cache(max_position, rotary_dim, theta, q.device) if cos is None else None
    table = cos if cos is not None else builtin
    half = rotary_dim // 2
    cs_stride = table.stride(0)
    if be == "cuda":
        has_pos = positions is not None
        ks = (k.stride(0), k.stride(1), k_out.stride(0), k_out.stride(1)) if n_kh else (0, 0, 0, 0)
        ints = (q.stride(0), q.stride(1), q_out.stride(0), q_out.stride(1)) + ks + (
            _POSITION_CODES[positions.dtype] if has_pos else 0, positions.stride(0) if has_pos else 0, cs_stride,
            tokens, n_qh, n_kh, head_dim, rotary_dim, int(neox), V.DTYPE_CODES[q.dtype])
        return _RopePlan(P.CudaPlan(B.load_extension(FAMILY).rope, ints, (), q.device), None, builtin, q.device)
    from fray_triton import rope as trope

    def run(q_, k_, qo_, ko_, pos_, offset, cos_, sin_):
        tcos, tsin = (cos_[:, :half], cos_[:, half:]) if sin_ is None else (cos_, sin_)
        trope.rope(q_, k_ if n_kh else None, qo_, ko_ if n_kh else None, pos_, offset, tcos, tsin, cs_stride,
                   rotary_dim, neox)
    return _RopePlan(None, run, builtin, q.device)


def _rope_launch(plan, q, k, q_out, k_out, positions, offset, cos, sin, max_position):
    """Per call: what no plan can hold (the FRAY_CHECK_INDICES range check, the offset, a passed
    table), then launch."""
    if positions is not None and env.check_indices() and plan is not _NOTHING:
        _check_indices(positions, max_position)
    plan(q, k, q_out, k_out, positions, offset, cos, sin)


def _rope_impl(q, k, q_out, k_out, positions, offset, cos, sin, max_position, rotary_dim, theta, neox, backend):
    key = P.signature("rope:op", backend, (q, k, q_out, k_out, positions, cos, sin),
                      (max_position, rotary_dim, theta, neox))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _rope_plan(q, k, q_out, k_out, positions, cos, sin, max_position,
                                                           rotary_dim, theta, neox, backend))
    _rope_launch(plan, q, k, q_out, k_out, positions, offset, cos, sin, max_position)


def _public_key(q, k, positions, cos_sin_cache, max_position, theta, rotary_dim, style, inplace, backend):
    """The plan key of a public rope call: positions by kind only (an int offset is a per-call value)."""
    pos_t = positions if type(positions) is torch.Tensor else None
    if isinstance(cos_sin_cache, (tuple, list)):
        if len(cos_sin_cache) != 2:
            return None
        cos, sin = cos_sin_cache
    else:
        cos, sin = cos_sin_cache, None
    return P.signature("rope", backend, (q, k, pos_t, cos, sin),
                       (type(positions), type(cos_sin_cache), max_position, theta, rotary_dim, style, inplace))


@P.custom_op("fray::rope", mutates_args=("q_out", "k_out"))
def _rope_op(q: torch.Tensor, k: Optional[torch.Tensor], q_out: torch.Tensor, k_out: Optional[torch.Tensor],
             positions: Optional[torch.Tensor], offset: int, cos: Optional[torch.Tensor], sin: Optional[torch.Tensor],
             max_position: int, rotary_dim: int, theta: float, neox: bool, backend: str) -> None:
    _rope_impl(q, k, q_out, k_out, positions, offset, cos, sin, max_position, rotary_dim, theta, neox, backend)


@P.custom_op("fray::rope_", mutates_args=("q", "k"))
def _rope_inplace_op(q: torch.Tensor, k: Optional[torch.Tensor], positions: Optional[torch.Tensor], offset: int,
                     cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], max_position: int, rotary_dim: int,
                     theta: float, neox: bool, backend: str) -> None:
    _rope_impl(q, k, q, k, positions, offset, cos, sin, max_position, rotary_dim, theta, neox, backend)


for _op in (_rope_op, _rope_inplace_op):
    _op.register_fake(lambda *args, **kwargs: None)


_compiling = P.compiling


# ---------------------------------------------------------------------------------------------
# public API

def rope(q, k, positions, *, max_position, cos_sin_cache=None, theta=10000.0, rotary_dim=None, style="neox",
         inplace=False, backend="auto"):
    """Rotary position embedding of q and k; returns (q_out, k_out) (k_out is None when k is).

    q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim] or None; fp32/fp16/bf16, last dim
    contiguous, token and head strides arbitrary (views into one fused qkv buffer are fine).
    positions: int32/int64 tensor [tokens] on q's device (read on the device only, never on the
    host), or an int offset meaning offset + arange(tokens). Positions must lie in
    [0, max_position): the caller's guarantee (FRAY_CHECK_INDICES=1 checks it, with a sync).
    max_position: rows of the cos/sin table. cos_sin_cache: None (built once from theta and cached),
    a fp32 [max_position, rotary_dim] tensor (cos | sin; how scaled variants such as Llama-3.1 or
    YaRN are served), or a (cos, sin) pair of fp32 [max_position, rotary_dim/2] tensors.
    rotary_dim: even, <= head_dim (default: the passed table's width, else head_dim); dims past it
    pass through. style: "neox" (pairs i, i + rotary_dim/2) or "gptj" (pairs 2i, 2i+1).
    Math in fp32, one rounding. inplace=True writes into q and k and returns them; else new
    contiguous tensors. CUDA tensors run on the current stream without host synchronisation.
    """
    if not _compiling():
        key = _public_key(q, k, positions, cos_sin_cache, max_position, theta, rotary_dim, style, inplace, backend)
        plan = P.PLANS.get(key)
        if plan is not None:
            if type(positions) is torch.Tensor:
                offset, pos_t = 0, positions
            else:  # the offset's range depends on its value: checked on every call
                offset, pos_t = _check_positions(positions, q.shape[0], max_position, q)
            cos, sin = cos_sin_cache if isinstance(cos_sin_cache, (tuple, list)) else (cos_sin_cache, None)
            if inplace:
                _rope_launch(plan, q, k, q, k, pos_t, offset, cos, sin, max_position)
                return q, k
            q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
            k_out = torch.empty_like(k, memory_format=torch.contiguous_format) if k is not None else None
            _rope_launch(plan, q, k, q_out, k_out, pos_t, offset, cos, sin, max_position)
            return q_out, k_out
    V.require_backend(backend, B.BACKENDS)
    if not isinstance(inplace, bool):
        raise TypeError("inplace: expected a bool, got %s" % type(inplace).__name__)
    neox = _check_style(style)
    max_position = _check_int("max_position", max_position, 1, MAX_POSITION_LIMIT)
    theta = _check_theta(theta)
    if V.is_array(q):
        rotary_dim = _check_rotary_dim(rotary_dim, q.shape[-1] if q.ndim else 0, _cache_width(cos_sin_cache))
        pos = _check_arrays(q, k, positions, cos_sin_cache, max_position, rotary_dim)
        return _cpu_rope(q, k, pos, cos_sin_cache, max_position, rotary_dim, theta, style, inplace)
    tokens, head_dim = _check_qk(q, k, inplace)
    rotary_dim = _check_rotary_dim(rotary_dim, head_dim, _cache_width(cos_sin_cache))
    offset, pos_t = _check_positions(positions, tokens, max_position, q)
    cos, sin = _check_cache(cos_sin_cache, max_position, rotary_dim, q.device)
    if q.device.type == "cpu":
        V.require_cpu_backend(backend, "q")
        pos = (pos_t.numpy().astype(np.int64) if pos_t is not None else offset + np.arange(tokens, dtype=np.int64))
        return _cpu_rope(q, k, pos, cos_sin_cache, max_position, rotary_dim, theta, style, inplace)
    if inplace:
        if _compiling():
            torch.ops.fray.rope_(q, k, pos_t, offset, cos, sin, max_position, rotary_dim, theta, neox, backend)
        else:
            plan = P.PLANS.put(key, _rope_plan(q, k, q, k, pos_t, cos, sin, max_position, rotary_dim, theta, neox,
                                               backend))
            _rope_launch(plan, q, k, q, k, pos_t, offset, cos, sin, max_position)
        return q, k
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device) if k is not None else None
    if _compiling():
        torch.ops.fray.rope(q, k, q_out, k_out, pos_t, offset, cos, sin, max_position, rotary_dim, theta, neox, backend)
    else:
        plan = P.PLANS.put(key, _rope_plan(q, k, q_out, k_out, pos_t, cos, sin, max_position, rotary_dim, theta,
                                           neox, backend))
        _rope_launch(plan, q, k, q_out, k_out, pos_t, offset, cos, sin, max_position)
    return q_out, k_out


# ---------------------------------------------------------------------------------------------
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

def check_cases(device):
    """On a GPU: every available backend x dtype x style x a few shapes (fused-qkv views
    included). On the CPU: the reference against hand-computed values and the Triton kernel
    under Triton's interpreter."""
    from fray.testing import assert_close

    def run(backend, dtype, tokens, hq, hk, d, style, dev, fused=False):
        g = torch.Generator(device=dev).manual_seed(tokens * 131 + d)
        max_position = 4096
        if fused:
            qkv = torch.randn(tokens, (hq + 2 * hk) * d, device=dev, generator=g).to(dtype)
            q = qkv[:, :hq * d].view(tokens, hq, d)
            k = qkv[:, hq * d:(hq + hk) * d].view(tokens, hk, d)
        else:
            q = torch.randn(tokens, hq, d, device=dev, generator=g).to(dtype)
            k = torch.randn(tokens, hk, d, device=dev, generator=g).to(dtype)
        pos = torch.randint(0, max_position, (tokens,), device=dev, generator=g)
        table = cos_sin_cache(max_position, d, 10000.0, dev)
        cos, sin = table[:, :d // 2].double(), table[:, d // 2:].double()
        eq, ek = ref.rope(q.double(), pos, cos, sin, style), ref.rope(k.double(), pos, cos, sin, style)
        if backend == "triton-interpreter":
            from fray_triton import rope as trope
            qo, ko = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
            trope.rope(q, k, qo, ko, pos, 0, table[:, :d // 2], table[:, d // 2:], d, d, style == "neox")
        else:
            qo, ko = rope(q, k, pos, max_position=max_position, style=style, backend=backend)
        assert_close(qo, eq, dtype, "rope q")
        assert_close(ko, ek, dtype, "rope k")

    def hand():
        # 2 dims, position 1: (1, 0) rotates by 1 radian; position 0 is the identity.
        out, _ = rope(np.array([[[1.0, 0.0]], [[0.5, 2.0]]]), None, np.array([1, 0]), max_position=2)
        np.testing.assert_allclose(out, [[[math.cos(1.0), math.sin(1.0)]], [[0.5, 2.0]]], rtol=1e-15)

    cases = []
    if device.type != "cuda":
        cases.append(("rope", "reference", "fp64", "hand", hand))
        for dtype in (torch.float32, torch.bfloat16):
            for style in STYLES:
                cases.append(("rope", "triton-interpreter", V.DTYPE_NAMES[dtype], "5x3+2x64:" + style,
                              lambda d=dtype, s=style: run("triton-interpreter", d, 5, 3, 2, 64, s, "cpu")))
        return cases
    def rows(op, backend):
        return [(V.DTYPE_NAMES[dtype], "%dx%dx%d:%s" % (tokens, hq, d, style),
                 lambda b=backend, dt=dtype, t=tokens, a=hq, c=hk, dd=d, s=style, f=fused:
                 run(b, dt, t, a, c, dd, s, device, f))
                for dtype in (torch.float32, torch.float16, torch.bfloat16)
                for tokens, hq, hk, d, style, fused in ((1, 1, 1, 64, "neox", False), (7, 5, 1, 80, "gptj", False),
                                                        (1000, 32, 8, 128, "neox", True))]
    return cases + B.gpu_check_rows(FAMILY, ("rope",), device, rows)
