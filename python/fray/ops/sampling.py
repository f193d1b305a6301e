"""The sampling family: topk, argmax, sample, apply_penalties, decode_step.

The exact semantics (value order with NaNs and signed zeros, index tie-breaks, the filter chain
temperature -> top-k -> top-p -> min-p, the Philox-4x32-10 draw and the inverse-CDF pick) are
written down once, in fray.reference.sampling; the Triton kernels (fray_triton.sampling) make the
same choices. Validation happens here, once. GPU entry points are torch custom ops
(fray::topk, fray::argmax, fray::sample, fray::apply_penalties, fray::decode_step) with fakes,
called directly in eager mode; each validates a GPU call signature once (fray._plan: scalar
parameters by value, tensor ones by layout) and skips to the launch after that (sample and argmax
from a cached launch plan). CPU tensors and numpy arrays run the reference. CUDA C++ kernels:
cuda/topk (topk, argmax) and cuda/sampling (sample, apply_penalties, decode_step); "auto" tries
CUDA first, then Triton.

Per-row parameters (sample, apply_penalties, decode_step) are a Python scalar or a [B] tensor on
the logits' device; the "off" values are top_k 0, top_p 1.0, min_p 0.0, repetition 1.0,
presence 0.0, frequency 0.0; temperature 0 makes that row greedy (so does any temperature below
2^-126, the smallest normal fp32, where 1 / temperature would overflow). Python scalars are range-checked;
values inside CUDA tensors are not (that would need a host sync) and out-of-range values give
unspecified (but memory-safe) results. Graph replay: (seeds[b], offsets[b]) alone decide row b's
draw, so a captured graph replays with fresh randomness when the caller bumps `offsets` in place.
"""
import math
from typing import List, Optional

import numpy as np
import torch

from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray import env
from fray.reference import sampling as ref

FAMILY = "sampling"
OPS = ("topk", "argmax", "sample", "apply_penalties", "decode_step")
__all__ = ["topk", "argmax", "sample", "apply_penalties", "decode_step", "topk_workspace_size"]
for _name in OPS:
    B.register_preference(_name, ("triton",))
for _name in ("topk", "argmax"):  # cuda/topk first; Triton where the extension is missing
    B.register_preference(_name, ("cuda", "triton"))
for _name in ("sample", "apply_penalties", "decode_step"):
    B.register_preference(_name, ("cuda", "triton"))
# Widest rows cuda/sampling's kernel takes (8 blocks x 192 KB of shared memory; its
# sample_max_width()): "auto" takes Triton beyond, backend="cuda" raises ValueError.
CUDA_SAMPLE_MAX_WIDTH = {torch.float32: 393216, torch.bfloat16: 786432}

TOPK_ALGORITHMS = ("auto", "reduce", "partial", "sort", "torch")
TOPK_MAX_WIDTH = 262144
SORT_MAX_WIDTH = 4096   # fray_triton.sampling.SORT_MAX_WIDTH (not imported: Triton may be absent)
REDUCE_MAX_K = 64       # fray_triton.sampling.REDUCE_MAX_K
SAMPLE_DTYPES = (torch.float32, torch.bfloat16)


def _compiling():
    return torch.compiler.is_compiling()


def _dt(d):
    return str(d).replace("torch.", "")


def _cpu_backend_ok(backend, what):
    V.require_cpu_backend(backend, what)


def _check_logits(name, x, dtypes, ndim=None):
    if V.is_array(x):
        if x.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError("%s: expected a float16/float32/float64 array, got %s" % (name, x.dtype))
    else:
        V.require_tensor(name, x)
        V.require_device_family(name, x)
        V.require_float_dtype(name, x, dtypes)
    if ndim is not None and x.ndim != ndim:
        raise ValueError("%s: expected a %d-d [batch, vocab] tensor, got shape %s" % (name, ndim, tuple(x.shape)))
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError("%s: expected a non-empty last dimension, got shape %s" % (name, tuple(x.shape)))


def _f64(a):
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# topk

TOPK_FAMILY = "topk"    # the CUDA extension of topk and argmax: fray._C._topk (cuda/topk)
CUDA_FAMILIES = {"topk": TOPK_FAMILY, "argmax": TOPK_FAMILY}  # the others: fray._C._sampling
CUDA_SORT_MAX_K = 4096  # cuda/topk kTopkMaxSortK: the kernel ranks up to this many winners itself
RANK_KEY_INDEX_MASK = (1 << 24) - 1  # cuda/topk rank keys: key << 24 | (2^24 - 1 - index)
_BITS = {2: torch.int16, 4: torch.int32}


def _check_topk_algorithm(width, k, algorithm, backend):
    """The limits of a forced algorithm; shapes and argument strings only (traceable)."""
    if algorithm in ("auto", "torch"):
        return
    if width > TOPK_MAX_WIDTH:
        raise ValueError("x: algorithm=%r supports widths up to %d, got %d (use algorithm='auto')"
                         % (algorithm, TOPK_MAX_WIDTH, width))
    if algorithm == "partial":
        if backend == "triton":
            raise ValueError("algorithm: 'partial' is the CUDA radix select; backend='triton' runs 'sort' or "
                             "'reduce' (or use algorithm='auto')")
        return
    if backend == "cuda":
        raise ValueError("algorithm: %r is a Triton algorithm; backend='cuda' runs 'partial' (or use "
                         "algorithm='auto')" % algorithm)
    if algorithm == "sort" and width > SORT_MAX_WIDTH:
        raise ValueError("x: algorithm='sort' supports widths up to %d, got %d" % (SORT_MAX_WIDTH, width))
    if algorithm == "reduce" and k > REDUCE_MAX_K:
        raise ValueError("k: algorithm='reduce' supports k up to %d, got %d" % (REDUCE_MAX_K, k))


def _topk_plan(x, k, algorithm, backend):
    """(method, backend) of one call: ("partial", "cuda"), ("sort" | "reduce", "triton") or
    ("torch", None). backend="auto" is resolved on x's device, so this runs in eager code only
    (inside the custom op); an x that is not on a GPU is planned as if "auto" chose CUDA."""
    width = x.shape[-1]
    if algorithm == "torch" or (algorithm == "auto" and width > TOPK_MAX_WIDTH):
        return "torch", None
    on_gpu = isinstance(x, torch.Tensor) and x.device.type == "cuda"
    if algorithm == "auto":
        if on_gpu:
            be = B.resolve("topk", TOPK_FAMILY, backend, x.device)
        else:
            be = "triton" if backend == "triton" else "cuda"
        if be == "cuda":
            return "partial", "cuda"
        if width <= SORT_MAX_WIDTH:
            return "sort", "triton"
        return ("reduce", "triton") if k <= REDUCE_MAX_K else ("torch", None)
    be = backend if backend != "auto" else ("cuda" if algorithm == "partial" else "triton")
    if on_gpu:
        be = B.resolve("topk", TOPK_FAMILY, be, x.device)
    return algorithm, be


def _topk_workspace_bytes(method, rows, width, k, itemsize, sorted):
    if method == "torch":
        return rows * width * (8 + itemsize)
    if method == "partial" and sorted and k > CUDA_SORT_MAX_K:
        return rows * k * 16
    return 0


def topk_workspace_size(x, k, algorithm="auto", *, sorted=True, backend="auto"):
    """Bytes of uint8 workspace that topk(x, k, algorithm=, sorted=, backend=) uses instead of
    allocating buffers of its own (torch.sort's internal scratch aside):

    - "torch" (and "auto" for widths > 262144): rows * width * (8 + itemsize), the int64 indices
      and values of torch.sort over whole rows;
    - "partial" (CUDA) with sorted=True and k > 4096: rows * k * 16, the int64 rank keys the
      kernel writes and their sorted copy (the kernel ranks k <= 4096 itself: 0);
    - everything else (the Triton algorithms, "partial" otherwise): 0.

    backend="auto" is resolved on x's device as topk resolves it; for an x that is not on a GPU
    the size is the one a GPU with the CUDA backend would need."""
    width = x.shape[-1]
    if width == 0:
        return 0
    numel, itemsize = (x.numel(), x.element_size()) if isinstance(x, torch.Tensor) else (x.size, x.itemsize)
    method, _ = _topk_plan(x, k, algorithm, backend)
    return _topk_workspace_bytes(method, numel // width, width, k, itemsize, sorted)


def _check_workspace(workspace, need, method):
    if workspace.numel() < need:
        formula = "rows * width * (8 + itemsize)" if method == "torch" else "rows * k * 16"
        raise ValueError("workspace: expected at least %d bytes (%s for algorithm %r; see "
                         "topk_workspace_size), got %d" % (need, formula, method, workspace.numel()))


def _topk_cuda(x, values, indices, workspace, k, largest, sorted, rows, width):
    # Launcher slots: cuda/topk/topk.h (ptrs x, values, indices, rank_keys; ints x_row_stride,
    # dtype, rows, width, k, largest, sorted).
    ext = B.load_extension(TOPK_FAMILY)
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    stream = P.current_stream(dev)
    if not sorted or k <= CUDA_SORT_MAX_K:
        ext.topk((x, values, indices, None), (V.row_stride("x", x), V.DTYPE_CODES[x.dtype], rows, width, k,
                                              largest, sorted), (), dev, stream)
        return
    # Rank order for k > 4096: the kernel writes the winners' distinct, non-negative int64 rank
    # keys in index order and a plain integer sort ranks them, so the NaN / signed-zero / tie
    # rules stay the kernel's (no float comparison in torch.sort).
    n = rows * k
    if workspace is None:
        keys = torch.empty((rows, k), dtype=torch.int64, device=x.device)
        ranked = torch.empty_like(keys)
    else:
        keys = workspace[:n * 8].view(torch.int64).view(rows, k)
        ranked = workspace[n * 8:n * 16].view(torch.int64).view(rows, k)
    ext.topk((x, values, indices, keys), (V.row_stride("x", x), V.DTYPE_CODES[x.dtype], rows, width, k, largest,
                                          False), (), dev, stream)
    idx = indices.view(rows, k)
    torch.sort(keys, dim=-1, descending=True, out=(ranked, idx))  # idx: scratch for the permutation
    torch.bitwise_and(ranked, RANK_KEY_INDEX_MASK, out=idx)
    idx.neg_().add_(RANK_KEY_INDEX_MASK)
    bits = _BITS[x.element_size()]
    torch.gather(x.reshape(rows, width).view(bits), -1, idx, out=values.view(rows, k).view(bits))


def _topk_impl(x, values, indices, workspace, k, largest, sorted, algorithm, backend):
    width = x.shape[-1]
    rows = x.numel() // width
    if rows == 0:
        return
    method, be = _topk_plan(x, k, algorithm, backend)
    if workspace is not None:
        _check_workspace(workspace, _topk_workspace_bytes(method, rows, width, k, x.element_size(), sorted), method)
    if method == "torch":  # "auto" on Triton with width > 4096 and k > 64
        v, i = _topk_torch(x, k, largest, workspace)
        values.copy_(v)
        indices.copy_(i)
    elif be == "cuda":
        _topk_cuda(x, values, indices, workspace, k, largest, sorted, rows, width)
    else:
        from fray_triton import sampling as ts
        with torch.cuda.device(x.device):
            ts.topk(x, values, indices, k, largest, method, V.row_stride("x", x), rows, width)


@P.custom_op("fray::topk", mutates_args=("values", "indices", "workspace"))
def _topk_op(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, workspace: Optional[torch.Tensor],
             k: int, largest: bool, sorted: bool, algorithm: str, backend: str) -> None:
    _topk_impl(x, values, indices, workspace, k, largest, sorted, algorithm, backend)


def _gather_bits(x, idx):
    """torch.gather through an integer view: values bit for bit (torch's CPU bf16 gather
    rewrites NaN payloads)."""
    bits = _BITS[x.element_size()]
    return torch.gather(x.view(bits), -1, idx).view(x.dtype)


def _topk_torch(x, k, largest, workspace):
    """torch.sort(stable=True) keeps equal values in index order and sorts NaN as the largest
    value, which is exactly the documented order; values are gathered from x (bits preserved)."""
    x2 = x.reshape(-1, x.shape[-1])
    if workspace is None:
        _, idx = torch.sort(x2, dim=-1, descending=largest, stable=True)
    else:
        n = x2.numel()
        idx = workspace[:n * 8].view(torch.int64).view(x2.shape)
        vals = workspace[n * 8:n * (8 + x.element_size())].view(x.dtype).view(x2.shape)
        torch.sort(x2, dim=-1, descending=largest, stable=True, out=(vals, idx))
    idx = idx[:, :k]
    return _gather_bits(x2, idx).view(x.shape[:-1] + (k,)), idx.reshape(x.shape[:-1] + (k,))


def topk(x, k, *, algorithm="auto", largest=True, sorted=True, workspace=None, backend="auto"):
    """The k largest (or smallest) entries along the last axis: (values, int64 indices).

    x: [..., width] fp32/fp16/bf16, last dim contiguous; 1 <= k <= width. Order: NaN above every
    number (first for largest, last for smallest), -0.0 == +0.0, equal values by lower index
    first. Values are read from x (bits preserved). sorted=False returns the same k entries in
    an unspecified order: increasing index on the CUDA backend (no ranking pass), rank order on
    the others.
    algorithm:
      "partial"  CUDA radix select (cuda/topk), widths <= 262144, any k: one CTA or one
                 thread-block cluster per row keeps the row on chip; the winners are ranked in
                 the kernel for k <= 4096 and by an integer torch.sort of their rank keys above.
      "sort"     Triton, width <= 4096: one sort of the row.
      "reduce"   Triton, k <= 64, any width up to 262144: k max-passes over the row.
      "torch"    torch.sort(stable=True) of the whole row (any width).
      "auto"     "partial" when the CUDA backend resolves, else sort / reduce / torch by shape;
                 "torch" for widths > 262144.
    A forced algorithm raises ValueError for inputs (or a forced backend) it cannot take.
    workspace: a contiguous uint8 tensor on x's device of at least
    topk_workspace_size(x, k, algorithm, sorted=, backend=) bytes, used instead of buffers this
    call would allocate (a too-small one raises ValueError). No workspace is needed for CUDA
    graph capture: every path is capturable.
    CPU tensors and numpy arrays run the reference (algorithm is then only validated).
    """
    key = None
    if not _compiling():
        key = P.signature("topk", backend, (x, workspace), (k, algorithm, largest, sorted))
        if P.PLANS.get(key) is not None:
            return _topk_validated(x, k, largest, sorted, workspace, algorithm, backend)
    V.require_backend(backend, B.BACKENDS)
    if not isinstance(algorithm, str) or algorithm not in TOPK_ALGORITHMS:
        raise ValueError("algorithm: expected one of %s, got %r" % (", ".join(map(repr, TOPK_ALGORITHMS)), algorithm))
    for name, flag in (("largest", largest), ("sorted", sorted)):
        if not isinstance(flag, bool):
            raise TypeError("%s: expected a bool, got %s" % (name, type(flag).__name__))
    _check_logits("x", x, V.FLOAT_DTYPES)
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError("k: expected an int, got %s" % type(k).__name__)
    width = x.shape[-1]
    if not 1 <= k <= width:
        raise ValueError("k: expected 1 <= k <= %d (the width of x), got %d" % (width, k))
    if V.is_array(x) or x.device.type == "cpu":
        if not V.is_array(x):
            _cpu_backend_ok(backend, "x")
        vals, idx = ref.topk(_f64(x) if not V.is_array(x) else x, k, largest)
        if V.is_array(x):
            return vals, idx
        i = torch.from_numpy(idx)
        return _gather_bits(x, i), i
    _check_topk_algorithm(width, k, algorithm, backend)
    V.row_stride("x", x)
    if workspace is not None:
        V.require_tensor("workspace", workspace)
        V.require_same_device([("x", x), ("workspace", workspace)])
        if workspace.dtype != torch.uint8 or not workspace.is_contiguous():
            raise TypeError("workspace: expected a contiguous uint8 tensor, got %s (contiguous=%s)"
                            % (_dt(workspace.dtype), workspace.is_contiguous()))
    if key is not None:
        P.PLANS.put(key, True)  # validated: later calls of this signature skip to _topk_validated
    return _topk_validated(x, k, largest, sorted, workspace, algorithm, backend)


def _topk_validated(x, k, largest, sorted, workspace, algorithm, backend):
    """topk on a validated GPU call."""
    width = x.shape[-1]
    if algorithm == "torch" or (algorithm == "auto" and width > TOPK_MAX_WIDTH):
        if workspace is not None:
            rows = x.numel() // width
            _check_workspace(workspace, _topk_workspace_bytes("torch", rows, width, k, x.element_size(), sorted),
                             "torch")
        if backend == "reference":
            B.resolve("topk", TOPK_FAMILY, backend, x.device)
        if x.dim() > 1 and not x.is_contiguous():
            x = x.contiguous()
        return _topk_torch(x, k, largest, workspace)
    values = torch.empty(x.shape[:-1] + (k,), dtype=x.dtype, device=x.device)
    indices = torch.empty(x.shape[:-1] + (k,), dtype=torch.int64, device=x.device)
    if _compiling():
        torch.ops.fray.topk(x, values, indices, workspace, k, largest, sorted, algorithm, backend)
    else:
        _topk_impl(x, values, indices, workspace, k, largest, sorted, algorithm, backend)
    return values, indices


# ---------------------------------------------------------------------------------------------
# argmax

def _argmax_plan(x, backend):
    width = x.shape[-1]
    rows = x.numel() // width
    if rows == 0:
        return P.NOOP
    stride = V.row_stride("x", x)
    if B.resolve("argmax", TOPK_FAMILY, backend, x.device) == "cuda":
        # Launcher slots: cuda/topk/topk.h (ptrs x, out; ints x_row_stride, dtype, rows, width).
        return P.CudaPlan(B.load_extension(TOPK_FAMILY).argmax, (stride, V.DTYPE_CODES[x.dtype], rows, width), (),
                          x.device)
    from fray_triton import sampling as ts
    return P.TritonPlan(ts.argmax, x.device, (stride, rows, width))


def _argmax_launch(plan, x, out):
    plan((x, out))


def _argmax_impl(x, out, backend):
    key = P.signature("argmax:op", backend, (x,))
    plan = P.PLANS.get(key) or P.PLANS.put(key, (_argmax_plan(x, backend),))
    _argmax_launch(plan[0], x, out)


@P.custom_op("fray::argmax", mutates_args=("out",))
def _argmax_op(x: torch.Tensor, out: torch.Tensor, backend: str) -> None:
    _argmax_impl(x, out, backend)


def argmax(x, *, backend="auto"):
    """int64 index of the maximum along the last axis, shape x.shape[:-1], on x's device.

    Matches torch.argmax: a NaN is the maximum (the first NaN wins), ties go to the earliest
    index, -0.0 == +0.0. x: [..., width] fp32/fp16/bf16, last dim contiguous. No host
    synchronisation (CUDA-graph capturable); the CUDA backend splits few wide rows over a
    thread-block cluster."""
    if not _compiling():
        key = P.signature("argmax", backend, (x,))
        plan = P.PLANS.get(key)
        if plan is not None:
            out = torch.empty(x.shape[:-1], dtype=torch.int64, device=x.device)
            _argmax_launch(plan[0], x, out)
            return out
    V.require_backend(backend, B.BACKENDS)
    _check_logits("x", x, V.FLOAT_DTYPES)
    if V.is_array(x):
        return ref.argmax(x)
    if x.device.type == "cpu":
        _cpu_backend_ok(backend, "x")
        return torch.from_numpy(ref.argmax(_f64(x)))
    V.row_stride("x", x)
    out = torch.empty(x.shape[:-1], dtype=torch.int64, device=x.device)
    if _compiling():
        torch.ops.fray.argmax(x, out, backend)
    else:
        plan = P.PLANS.put(key, (_argmax_plan(x, backend),))
        _argmax_launch(plan[0], x, out)
    return out


# ---------------------------------------------------------------------------------------------
# per-row parameters

def _row_param(name, value, rows, device, kind, check):
    """A validated per-row parameter: a contiguous [rows] tensor (fp32 for kind "float", int64 for
    "int") from a [rows] tensor, or the Python scalar itself. Scalars stay scalars so that the CUDA
    kernels take them by value (no [rows] fill launched per call); _materialize builds the tensor
    the reference and Triton take."""
    tdtype = torch.float32 if kind == "float" else torch.int64
    if isinstance(value, torch.Tensor):
        if value.device != device:
            raise TypeError("%s: expected a tensor on %s (the device of logits), got one on %s"
                            % (name, device, value.device))
        if kind == "int" and (value.dtype.is_floating_point or value.dtype == torch.bool):
            raise TypeError("%s: expected an integer tensor, got %s" % (name, _dt(value.dtype)))
        if kind == "float" and value.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            raise TypeError("%s: expected a float tensor, got %s" % (name, _dt(value.dtype)))
        if tuple(value.shape) != (rows,):
            raise ValueError("%s: expected shape (%d,) (one value per row), got %s" % (name, rows, tuple(value.shape)))
        if device.type == "cpu":
            for v in value.tolist():
                check(v)
        return value.to(tdtype).contiguous()  # the kernels index value[row]
    if isinstance(value, np.ndarray) and device.type == "cpu":
        if value.shape != (rows,):
            raise ValueError("%s: expected shape (%d,) (one value per row), got %s" % (name, rows, value.shape))
        return _row_param(name, torch.from_numpy(value), rows, device, kind, check)
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind == "float" else (int,)):
        raise TypeError("%s: expected a %s or a [batch] tensor, got %s" % (
            name, "float" if kind == "float" else "int", type(value).__name__))
    check(value)
    return float(value) if kind == "float" else int(value)


def _materialize(value, rows, device, kind):
    """The [rows] tensor of a _row_param result (a tensor already, or a scalar to fill)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.full((rows,), value, dtype=torch.float32 if kind == "float" else torch.int64, device=device)


def _materialize_all(params, kinds, rows, device):
    return tuple(_materialize(v, rows, device, k) for v, k in zip(params, kinds))


def _split_params(params, kinds):
    """Custom-op form: the tensors (None for scalars), the float scalars and the int scalars (the
    values of tensor parameters are placeholders)."""
    tensors = [p if isinstance(p, torch.Tensor) else None for p in params]
    fvals = [0.0 if isinstance(p, torch.Tensor) else float(p) for p, k in zip(params, kinds) if k == "float"]
    ivals = [0 if isinstance(p, torch.Tensor) else int(p) for p, k in zip(params, kinds) if k == "int"]
    return tensors, fvals, ivals


def _join_params(tensors, fvals, ivals, kinds):
    """Inverse of _split_params."""
    fi, ii = iter(fvals), iter(ivals)
    out = []
    for t, k in zip(tensors, kinds):
        v = next(fi) if k == "float" else next(ii)  # consume the placeholder of tensor parameters too
        out.append(t if t is not None else v)
    return tuple(out)


def _params_key(values):
    """The plan-key parts of raw per-row parameters: tensors (by layout) and scalars (by value)."""
    return (tuple(v if isinstance(v, torch.Tensor) else None for v in values),
            tuple(None if isinstance(v, torch.Tensor) else v for v in values))


def _scalars_only(params):
    """What a plan keeps of validated parameters: the scalars (a tensor is the call's own)."""
    return tuple(None if isinstance(v, torch.Tensor) else v for v in params)


_KIND_DTYPES = {"float": torch.float32, "int": torch.int64}


def _params_again(values, validated, kinds):
    """A signature's validated parameters for this call's tensors: scalars as validated (their
    values are in the key), tensors converted as _row_param converts them (skipped, and so no
    .to() / .contiguous() call per tensor, when one is already the kernels' dtype and dense)."""
    out = []
    for v, p, k in zip(values, validated, kinds):
        if isinstance(v, _Tensor):
            dt = _KIND_DTYPES[k]
            out.append(v if v.dtype is dt and v.is_contiguous() else v.to(dt).contiguous())
        else:
            out.append(p)
    return tuple(out)


def _range_check(name, lo, hi, lo_open=False, finite=True):
    def check(v):
        ok = (v > lo if lo_open else v >= lo) and (hi is None or v <= hi) and (not finite or math.isfinite(v))
        if not ok:
            raise ValueError("%s: expected a value in %s%s, %s], got %r" % (
                name, "(" if lo_open else "[", lo, "inf" if hi is None else hi, v))
    return check


def _int_check(name, lo=None):
    def check(v):
        if lo is not None and v < lo:
            raise ValueError("%s: expected a value >= %d, got %r" % (name, lo, v))
        if not -2 ** 63 <= v < 2 ** 63:
            raise ValueError("%s: expected a 64-bit integer, got %r" % (name, v))
    return check


def _sampling_params(logits, temperature, top_k, top_p, min_p, seeds, offsets):
    rows, dev = logits.shape[0], logits.device
    return (
        _row_param("temperature", temperature, rows, dev, "float", _range_check("temperature", 0.0, None)),
        _row_param("top_k", 0 if top_k is None else top_k, rows, dev, "int", _int_check("top_k", 0)),
        _row_param("top_p", 1.0 if top_p is None else top_p, rows, dev, "float", _range_check("top_p", 0.0, 1.0, True)),
        _row_param("min_p", 0.0 if min_p is None else min_p, rows, dev, "float", _range_check("min_p", 0.0, 1.0)),
        _row_param("seeds", seeds, rows, dev, "int", _int_check("seeds")),
        _row_param("offsets", offsets, rows, dev, "int", _int_check("offsets")),
    )


_SAMPLE_KINDS = ("float", "int", "float", "float", "int", "int")  # temperature, top_k, top_p, min_p, seeds, offsets
_PENALTY_KINDS = ("float", "float", "float")                      # repetition, presence, frequency


def _penalty_params(logits, repetition, presence, frequency):
    rows, dev = logits.shape[0], logits.device
    return (
        _row_param("repetition", repetition, rows, dev, "float", _range_check("repetition", 0.0, None, True)),
        _row_param("presence", presence, rows, dev, "float", _range_check("presence", -math.inf, None)),
        _row_param("frequency", frequency, rows, dev, "float", _range_check("frequency", -math.inf, None)),
    )


_Tensor = torch.Tensor


def _ptr(value):
    """A parameter's pointer slot: the tensor (the binder reads its address) or None for a scalar."""
    return value if isinstance(value, _Tensor) else None


def _val(value):
    """A parameter's value slot: the scalar, or 0 beside a tensor (the kernels read the tensor)."""
    return 0 if isinstance(value, _Tensor) else value


def _history_slots(token_ids, token_offsets):
    """apply_penalties' history slots: (ptrs token_ids, token_offsets), (ints ids_int64, num_ids,
    offsets_int64)."""
    return (token_ids, token_offsets), (token_ids.dtype == torch.int64, token_ids.numel(),
                                        token_offsets.dtype == torch.int64)


# ---------------------------------------------------------------------------------------------
# sample

def _cuda_sample_fits(logits):
    return logits.shape[1] <= CUDA_SAMPLE_MAX_WIDTH[logits.dtype]


def _check_cuda_width(logits, backend):
    if backend == "cuda" and not _cuda_sample_fits(logits):
        raise ValueError("logits: backend='cuda' samples rows of up to %d %s logits, got %d (use backend='auto' "
                         "or 'triton')" % (CUDA_SAMPLE_MAX_WIDTH[logits.dtype], _dt(logits.dtype), logits.shape[1]))


def _sample_launch(logits, backend):
    """(CudaPlan of ext.sample with its leading int slots, or None for Triton, row stride) of one
    logits signature."""
    rows, width = logits.shape
    be = B.resolve("sample", FAMILY, backend, logits.device)
    if be == "cuda" and not _cuda_sample_fits(logits):
        be = "triton"  # only under "auto": a forced "cuda" was refused by _check_cuda_width
    stride = V.row_stride("logits", logits)
    if be != "cuda":
        return None, stride
    return P.CudaPlan(B.load_extension(FAMILY).sample, (stride, V.DTYPE_CODES[logits.dtype], rows, width), (),
                      logits.device), stride


def _sample_run(launch, logits, params, tokens, logprobs):
    """One launch from _sample_launch's (plan, stride) of this logits signature."""
    plan, stride = launch
    if plan is not None:
        # Launcher slots: cuda/sampling/sampling.h (sample).
        t, k, p, m, s, o = params
        dev = plan.device
        plan.launcher((logits, _ptr(t), _ptr(k), _ptr(p), _ptr(m), _ptr(s), _ptr(o), tokens, logprobs),
                      plan.ints + (_val(k), _val(s), _val(o)), (_val(t), _val(p), _val(m)), dev, P.current_stream(dev))
        return
    from fray_triton import sampling as ts
    rows, width = logits.shape
    with torch.cuda.device(logits.device):
        ts.sample(logits, tokens, logprobs, *_materialize_all(params, _SAMPLE_KINDS, rows, logits.device),
                  stride, rows, width)


def _sample_impl(logits, params, tokens, logprobs, backend):
    if logits.shape[0] == 0:
        return
    key = P.signature("sample:op", backend, (logits,))
    _sample_run(P.PLANS.get(key) or P.PLANS.put(key, _sample_launch(logits, backend)), logits, params, tokens,
                logprobs)


@P.custom_op("fray::sample", mutates_args=("tokens", "logprobs"))
def _sample_op(logits: torch.Tensor, temperature: Optional[torch.Tensor], top_k: Optional[torch.Tensor],
               top_p: Optional[torch.Tensor], min_p: Optional[torch.Tensor], seeds: Optional[torch.Tensor],
               offsets: Optional[torch.Tensor], fvals: List[float], ivals: List[int], tokens: torch.Tensor,
               logprobs: torch.Tensor, backend: str) -> None:
    params = _join_params((temperature, top_k, top_p, min_p, seeds, offsets), fvals, ivals, _SAMPLE_KINDS)
    _sample_impl(logits, params, tokens, logprobs, backend)


def _sample_validated(logits, params, return_logprobs, backend, launch=None):
    """launch: the eager plan's (plan, stride) from _sample_launch, when the caller has it."""
    rows = logits.shape[0]
    if logits.device.type == "cpu":
        t, k, p, m, s, o = (v.numpy() for v in _materialize_all(params, _SAMPLE_KINDS, rows, logits.device))
        tok, lp = ref.sample(_f64(logits), t.astype(np.float64), k, p.astype(np.float64), m.astype(np.float64), s, o)
        tok, lp = torch.from_numpy(tok), torch.from_numpy(lp).to(torch.float32)
        return (tok, lp) if return_logprobs else tok
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if _compiling():
        tensors, fvals, ivals = _split_params(params, _SAMPLE_KINDS)
        torch.ops.fray.sample(logits, *tensors, fvals, ivals, tokens, logprobs, backend)
    elif launch is not None:
        _sample_run(launch, logits, params, tokens, logprobs)
    else:
        _sample_impl(logits, params, tokens, logprobs, backend)
    return (tokens, logprobs) if return_logprobs else tokens


def _check_sample_common(logits, return_logprobs, backend):
    V.require_backend(backend, B.BACKENDS)
    if not isinstance(return_logprobs, bool):
        raise TypeError("return_logprobs: expected a bool, got %s" % type(return_logprobs).__name__)
    V.require_tensor("logits", logits)
    _check_logits("logits", logits, SAMPLE_DTYPES, ndim=2)
    if logits.device.type == "cpu":
        _cpu_backend_ok(backend, "logits")
    else:
        V.row_stride("logits", logits)
        _check_cuda_width(logits, backend)


def _from_numpy(v):
    """A numpy argument as the CPU tensor sharing its memory (writes reach the array); else v."""
    if not V.is_array(v):
        return v
    if not v.flags.writeable:
        v = v.copy()  # only inputs are read-only in practice; torch refuses to share such memory silently
    return torch.from_numpy(v)


def _require_writable_array(logits):
    if not logits.flags.writeable:
        raise ValueError("logits: the numpy array is read-only, and the penalties are applied in place on it")


def _numpy_out(result):
    return tuple(t.numpy() for t in result) if isinstance(result, tuple) else result.numpy()


def sample(logits, *, temperature, top_k=None, top_p=None, min_p=None, seeds, offsets,
           return_logprobs=False, backend="auto"):
    """One token per row of logits [B, V] (fp32 or bf16): int64 [B] (and fp32 logprobs [B]).

    temperature -> top-k -> top-p -> min-p -> one Philox-4x32-10 uniform per row from
    (seeds[b], offsets[b]) -> inverse CDF over the kept tokens in index order; temperature 0 (and any
    below 2^-126, whose inverse overflows fp32) is greedy (argmax, logprob 0). Ties at a threshold are kept. The exact procedure is in
    fray.reference.sampling. logprobs: log of the chosen token's probability in the filtered,
    renormalised distribution it was drawn from. NaN logits are defined only for greedy rows.
    Backends: "cuda" (one thread-block cluster per row, exact fixed-point masses, rows up to
    CUDA_SAMPLE_MAX_WIDTH; Python-scalar parameters are passed by value, no [B] tensor is built),
    "triton", or "auto" (CUDA first, Triton for wider rows).
    """
    if V.is_array(logits):  # numpy in, numpy out: the CPU path on tensors sharing the arrays' memory
        return _numpy_out(sample(_from_numpy(logits), temperature=_from_numpy(temperature), top_k=_from_numpy(top_k),
                                 top_p=_from_numpy(top_p), min_p=_from_numpy(min_p), seeds=_from_numpy(seeds),
                                 offsets=_from_numpy(offsets), return_logprobs=return_logprobs, backend=backend))
    raw = (temperature, top_k, top_p, min_p, seeds, offsets)
    key = None
    if not _compiling():  # a GPU call validated once per signature (CPU parameter values are checked per call)
        tensors, scalars = _params_key(raw)
        key = P.signature("sample", backend, (logits,) + tensors, (return_logprobs,) + scalars)
        validated = P.PLANS.get(key)
        if validated is not None:
            scalars, launch = validated
            return _sample_validated(logits, _params_again(raw, scalars, _SAMPLE_KINDS), return_logprobs, backend,
                                     launch)
    _check_sample_common(logits, return_logprobs, backend)
    params = _sampling_params(logits, temperature, top_k, top_p, min_p, seeds, offsets)
    launch = None
    if key is not None and logits.device.type == "cuda":
        # The signature's launch too (None for zero rows, which launch nothing): a hit makes one
        # plan lookup, not two.
        launch = _sample_launch(logits, backend) if logits.shape[0] > 0 else None
        P.PLANS.put(key, (_scalars_only(params), launch))
    return _sample_validated(logits, params, return_logprobs, backend, launch)


# ---------------------------------------------------------------------------------------------
# penalties

def _penalties_impl(logits, token_ids, token_offsets, params, backend):
    rows, width = logits.shape
    if rows == 0:
        return
    _device_history_check(logits, token_ids, token_offsets)
    be = B.resolve("apply_penalties", FAMILY, backend, logits.device)
    stride = V.row_stride("logits", logits, writable=True)
    if be == "cuda":
        # Launcher slots: cuda/sampling/sampling.h (apply_penalties).
        hp, hi = _history_slots(token_ids, token_offsets)
        r, p, f = params
        dev = logits.device.index if logits.device.index is not None else torch.cuda.current_device()
        B.load_extension(FAMILY).apply_penalties(
            (logits,) + hp + (_ptr(r), _ptr(p), _ptr(f)), (stride, V.DTYPE_CODES[logits.dtype], rows, width) + hi,
            (_val(r), _val(p), _val(f)), dev, P.current_stream(dev))
        return
    from fray_triton import sampling as ts
    with torch.cuda.device(logits.device):
        ts.apply_penalties(logits, token_ids, token_offsets,
                           *_materialize_all(params, _PENALTY_KINDS, rows, logits.device), stride, rows, width)


@P.custom_op("fray::apply_penalties", mutates_args=("logits",))
def _penalties_op(logits: torch.Tensor, token_ids: torch.Tensor, token_offsets: torch.Tensor,
                  repetition: Optional[torch.Tensor], presence: Optional[torch.Tensor],
                  frequency: Optional[torch.Tensor], fvals: List[float], backend: str) -> None:
    params = _join_params((repetition, presence, frequency), fvals, [], _PENALTY_KINDS)
    _penalties_impl(logits, token_ids, token_offsets, params, backend)


def _decode_impl(logits, token_ids, token_offsets, pen, params, tokens, logprobs, backend):
    rows, width = logits.shape
    if rows == 0:
        return
    _device_history_check(logits, token_ids, token_offsets)
    be = B.resolve("decode_step", FAMILY, backend, logits.device)
    if be == "cuda" and _cuda_sample_fits(logits):
        # Two launches (penalties, then the sampling cluster kernel), no host sync. Launcher
        # slots: cuda/sampling/sampling.h (decode_step: the penalties' slots, then sample's).
        hp, hi = _history_slots(token_ids, token_offsets)
        r, p, f = pen
        t, k, tp, m, s, o = params
        dev = logits.device.index if logits.device.index is not None else torch.cuda.current_device()
        B.load_extension(FAMILY).decode_step(
            (logits,) + hp + (_ptr(r), _ptr(p), _ptr(f), _ptr(t), _ptr(k), _ptr(tp), _ptr(m), _ptr(s), _ptr(o),
                              tokens, logprobs),
            (V.row_stride("logits", logits, writable=True), V.DTYPE_CODES[logits.dtype], rows, width) + hi
            + (_val(k), _val(s), _val(o)),
            (_val(r), _val(p), _val(f), _val(t), _val(tp), _val(m)), dev, P.current_stream(dev))
        return
    _penalties_impl(logits, token_ids, token_offsets, pen, backend)
    _sample_impl(logits, params, tokens, logprobs, backend)


@P.custom_op("fray::decode_step", mutates_args=("logits", "tokens", "logprobs"))
def _decode_op(logits: torch.Tensor, token_ids: torch.Tensor, token_offsets: torch.Tensor,
               repetition: Optional[torch.Tensor], presence: Optional[torch.Tensor],
               frequency: Optional[torch.Tensor], pvals: List[float], temperature: Optional[torch.Tensor],
               top_k: Optional[torch.Tensor], top_p: Optional[torch.Tensor], min_p: Optional[torch.Tensor],
               seeds: Optional[torch.Tensor], offsets: Optional[torch.Tensor], fvals: List[float], ivals: List[int],
               tokens: torch.Tensor, logprobs: torch.Tensor, backend: str) -> None:
    pen = _join_params((repetition, presence, frequency), pvals, [], _PENALTY_KINDS)
    params = _join_params((temperature, top_k, top_p, min_p, seeds, offsets), fvals, ivals, _SAMPLE_KINDS)
    _decode_impl(logits, token_ids, token_offsets, pen, params, tokens, logprobs, backend)


_decode_op.register_fake(lambda *args, **kwargs: None)


for _op in (_topk_op, _argmax_op, _sample_op, _penalties_op):
    _op.register_fake(lambda *args, **kwargs: None)


def _check_history(logits, token_ids, token_offsets):
    for name, t in (("token_ids", token_ids), ("token_offsets", token_offsets)):
        V.require_tensor(name, t)
        if t.device != logits.device:
            raise TypeError("%s: expected a tensor on %s (the device of logits), got one on %s"
                            % (name, logits.device, t.device))
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError("%s: expected dtype int32 or int64, got %s" % (name, _dt(t.dtype)))
        if t.dim() != 1 or not t.is_contiguous():
            raise ValueError("%s: expected a contiguous 1-d tensor, got shape %s" % (name, tuple(t.shape)))
    if token_offsets.shape[0] != logits.shape[0] + 1:
        raise ValueError("token_offsets: expected shape (%d,) (batch + 1 CSR offsets), got %s"
                         % (logits.shape[0] + 1, tuple(token_offsets.shape)))
    if logits.device.type == "cpu":  # values are checkable without a device sync only here
        _history_values(logits.shape[1], token_ids, token_offsets)


def _history_values(width, token_ids, token_offsets):
    """The CSR history's values: offsets non-decreasing from 0 to at most len(token_ids), ids in
    [0, width). On CUDA tensors this reads them back (FRAY_CHECK_INDICES=1)."""
    offs = token_offsets.tolist()
    if offs[0] != 0 or any(b < a for a, b in zip(offs, offs[1:])) or offs[-1] > token_ids.shape[0]:
        raise ValueError("token_offsets: expected non-decreasing offsets from 0 to at most %d, got %s"
                         % (token_ids.shape[0], offs))
    if token_ids.numel():
        lo, hi = (int(v) for v in torch.stack(torch.aminmax(token_ids)).tolist())
        if lo < 0 or hi >= width:
            raise ValueError("token_ids: expected ids in [0, %d), got values in [%d, %d]" % (width, lo, hi))


def _device_history_check(logits, token_ids, token_offsets):
    """FRAY_CHECK_INDICES=1 on CUDA tensors: the history's values, per call (custom ops too)."""
    if env.check_indices():
        V.device_index_check("token_ids / token_offsets", _history_values, logits.shape[1], token_ids, token_offsets)


def _check_rows_writable(logits):
    # Penalties write logits in place: rows that share memory (stride 0, as expand() makes; fine
    # for sample, which only reads) would race on the GPU, so they are refused on every device.
    if logits.device.type != "cpu":
        V.row_stride("logits", logits, writable=True)
        return
    dims = sorted((abs(st), n) for n, st in zip(logits.shape, logits.stride()) if n > 1)
    if dims and (dims[0][0] == 0 or (len(dims) == 2 and dims[0][0] * (dims[0][1] - 1) >= dims[1][0])):
        raise ValueError("logits: written in place, so its elements may not overlap (as expand() makes); got shape "
                         "%s with strides %s: pass logits.contiguous()" % (tuple(logits.shape), logits.stride()))


def _penalties_validated(logits, token_ids, token_offsets, params, backend):
    if logits.device.type == "cpu":
        r, p, f = (v.double().numpy() for v in _materialize_all(params, _PENALTY_KINDS, logits.shape[0], logits.device))
        y = ref.apply_penalties(_f64(logits), token_ids.numpy(), token_offsets.numpy(), r, p, f)
        logits.copy_(torch.from_numpy(y).to(logits.dtype))
        return logits
    if _compiling():
        tensors, fvals, _ = _split_params(params, _PENALTY_KINDS)
        torch.ops.fray.apply_penalties(logits, token_ids, token_offsets, *tensors, fvals, backend)
    else:
        _penalties_impl(logits, token_ids, token_offsets, params, backend)
    return logits


def apply_penalties(logits, token_ids, token_offsets, *, repetition=1.0, presence=0.0, frequency=0.0,
                    backend="auto"):
    """Repetition/presence/frequency penalties, in place on logits [B, V]; returns logits.

    Row b's history is token_ids[token_offsets[b]:token_offsets[b + 1]] (CSR; int32/int64).
    For each distinct id with count n: l = l / rep if l > 0 else l * rep, then l -= presence,
    then l -= n * frequency; fp32 math, one rounding. Ids outside [0, V) raise on the CPU and are
    ignored on the GPU (checking them there needs a host sync: FRAY_CHECK_INDICES=1 checks the ids
    and offsets on every GPU call, and refuses under graph capture)."""
    if V.is_array(logits):  # numpy in, numpy out: in place on the array itself (a tensor sharing its memory)
        _require_writable_array(logits)
        apply_penalties(_from_numpy(logits), _from_numpy(token_ids), _from_numpy(token_offsets),
                        repetition=_from_numpy(repetition), presence=_from_numpy(presence),
                        frequency=_from_numpy(frequency), backend=backend)
        return logits
    raw = (repetition, presence, frequency)
    key = None
    if not _compiling():  # a GPU call validated once per signature (CPU history values are checked per call)
        tensors, scalars = _params_key(raw)
        key = P.signature("apply_penalties", backend, (logits, token_ids, token_offsets) + tensors, scalars)
        validated = P.PLANS.get(key)
        if validated is not None:
            return _penalties_validated(logits, token_ids, token_offsets, _params_again(raw, validated,
                                                                                        _PENALTY_KINDS), backend)
    V.require_backend(backend, B.BACKENDS)
    V.require_tensor("logits", logits)
    _check_logits("logits", logits, V.FLOAT_DTYPES, ndim=2)
    if logits.device.type == "cpu":
        _cpu_backend_ok(backend, "logits")
    _check_rows_writable(logits)
    _check_history(logits, token_ids, token_offsets)
    params = _penalty_params(logits, repetition, presence, frequency)
    if key is not None and logits.device.type == "cuda":
        P.PLANS.put(key, _scalars_only(params))
    return _penalties_validated(logits, token_ids, token_offsets, params, backend)


def decode_step(logits, token_ids, token_offsets, *, repetition=1.0, presence=0.0, frequency=0.0,
                temperature, top_k=None, top_p=None, min_p=None, seeds, offsets, return_logprobs=False,
                backend="auto"):
    """apply_penalties (in place on logits) then sample, for the whole batch; returns tokens
    (and logprobs). Everything is validated before logits are touched. On CUDA tensors with the
    "cuda" backend: exactly two kernel launches (penalties, then sampling), no host sync, no
    allocation beyond the outputs; graph-capturable (bump `offsets` in place between replays)."""
    if V.is_array(logits):  # numpy in, numpy out (penalties in place on the array itself)
        _require_writable_array(logits)
        return _numpy_out(decode_step(
            _from_numpy(logits), _from_numpy(token_ids), _from_numpy(token_offsets),
            repetition=_from_numpy(repetition), presence=_from_numpy(presence), frequency=_from_numpy(frequency),
            temperature=_from_numpy(temperature), top_k=_from_numpy(top_k), top_p=_from_numpy(top_p),
            min_p=_from_numpy(min_p), seeds=_from_numpy(seeds), offsets=_from_numpy(offsets),
            return_logprobs=return_logprobs, backend=backend))
    raw_pen, raw = (repetition, presence, frequency), (temperature, top_k, top_p, min_p, seeds, offsets)
    key = None
    if not _compiling():  # a GPU call validated once per signature
        pen_t, pen_s = _params_key(raw_pen)
        tensors, scalars = _params_key(raw)
        key = P.signature("decode_step", backend, (logits, token_ids, token_offsets) + pen_t + tensors,
                          (return_logprobs,) + pen_s + scalars)
        validated = P.PLANS.get(key)
        if validated is not None:
            return _decode_validated(logits, token_ids, token_offsets, _params_again(raw_pen, validated[0],
                                                                                     _PENALTY_KINDS),
                                     _params_again(raw, validated[1], _SAMPLE_KINDS), return_logprobs, backend)
    _check_sample_common(logits, return_logprobs, backend)
    _check_rows_writable(logits)
    _check_history(logits, token_ids, token_offsets)
    pen = _penalty_params(logits, repetition, presence, frequency)
    params = _sampling_params(logits, temperature, top_k, top_p, min_p, seeds, offsets)
    if key is not None and logits.device.type == "cuda":
        P.PLANS.put(key, (_scalars_only(pen), _scalars_only(params)))
    return _decode_validated(logits, token_ids, token_offsets, pen, params, return_logprobs, backend)


def _decode_validated(logits, token_ids, token_offsets, pen, params, return_logprobs, backend):
    if logits.device.type == "cpu":
        _penalties_validated(logits, token_ids, token_offsets, pen, backend)
        return _sample_validated(logits, params, return_logprobs, backend)
    rows = logits.shape[0]
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if _compiling():
        pt, pf, _ = _split_params(pen, _PENALTY_KINDS)
        st, sf, si = _split_params(params, _SAMPLE_KINDS)
        torch.ops.fray.decode_step(logits, token_ids, token_offsets, *pt, pf, *st, sf, si, tokens, logprobs, backend)
    else:
        _decode_impl(logits, token_ids, token_offsets, pen, params, tokens, logprobs, backend)
    return (tokens, logprobs) if return_logprobs else tokens


# ---------------------------------------------------------------------------------------------
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

def _run_case(op, dtype, rows, width, dev, interpreter, backend="auto"):
    g = torch.Generator().manual_seed(rows * 1009 + width)
    x = torch.randn(rows, width, generator=g).to(dtype).to(dev)
    xd = x.double().cpu().numpy()
    if interpreter:
        from fray_triton import sampling as ts
    if op == "topk":
        k = min(5, width)
        if interpreter:
            v, i = torch.empty(rows, k, dtype=dtype), torch.empty(rows, k, dtype=torch.int64)
            ts.topk(x, v, i, k, True, "sort", width, rows, width)
        else:
            v, i = topk(x, k, backend=backend)
        np.testing.assert_array_equal(i.cpu().numpy(), ref.topk_indices(xd, k))
    elif op == "argmax":
        if interpreter:
            i = torch.empty(rows, dtype=torch.int64)
            ts.argmax(x, i, width, rows, width)
        else:
            i = argmax(x, backend=backend)
        np.testing.assert_array_equal(i.cpu().numpy(), ref.argmax(xd))
    else:
        temp = torch.tensor([0.0] + [0.8] * (rows - 1), device=dev)
        tk = torch.tensor([0, 20] * rows, device=dev)[:rows]
        tp = torch.full((rows,), 0.9, device=dev)
        mp = torch.full((rows,), 0.01, device=dev)
        seeds = torch.arange(rows, device=dev) + 1234
        offs = torch.arange(rows, device=dev) * 7
        if op in ("apply_penalties", "decode_step"):
            ids = torch.randint(0, width, (rows * 4,), generator=g).to(dev)
            toffs = (torch.arange(rows + 1) * 4).to(dev)
            pen = (torch.full((rows,), 1.3, device=dev), torch.full((rows,), 0.5, device=dev),
                   torch.full((rows,), 0.25, device=dev))
            expect = ref.apply_penalties(xd, ids.cpu().numpy(), toffs.cpu().numpy(),
                                         *(p.double().cpu().numpy() for p in pen))
            if interpreter:
                ts.apply_penalties(x, ids, toffs, *pen, width, rows, width)
            else:
                apply_penalties(x, ids, toffs, repetition=pen[0], presence=pen[1], frequency=pen[2],
                                backend=backend)
            from fray.testing import assert_close
            assert_close(x, expect, dtype, op)
            xd = x.double().cpu().numpy()
        tok_ref, _ = ref.sample(xd, temp.double().cpu().numpy(), tk.cpu().numpy(), tp.double().cpu().numpy(),
                                mp.double().cpu().numpy(), seeds.cpu().numpy(), offs.cpu().numpy())
        if interpreter:
            tok, lp = torch.empty(rows, dtype=torch.int64), torch.empty(rows)
            ts.sample(x, tok, lp, temp, tk, tp, mp, seeds, offs, width, rows, width)
        else:
            tok = sample(x, temperature=temp, top_k=tk, top_p=tp, min_p=mp, seeds=seeds, offsets=offs,
                         backend=backend)
        np.testing.assert_array_equal(tok.cpu().numpy(), tok_ref)


def check_cases(device):
    """On a GPU: every available backend x fp32/bf16 x a few shapes vs the reference's choices.
    On the CPU: the reference against hand values and the Triton kernels under the interpreter."""
    def hand():
        out = [int(v) for v in ref.philox4x32_10((0, 0, 0, 0), (0, 0))]
        assert out == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8], out
        x = np.array([[1.0, np.nan, 3.0, -0.0, 0.0, 3.0]])
        np.testing.assert_array_equal(ref.topk_indices(x, 6), [[1, 2, 5, 0, 3, 4]])
        np.testing.assert_array_equal(ref.topk_indices(x, 6, largest=False), [[3, 4, 0, 2, 5, 1]])

    if device.type != "cuda":
        return B.cpu_check_cases("sampling", hand, OPS,
                                 lambda op, d, rows, cols: _run_case(op, d, rows, cols, "cpu", True))
    return B.gpu_check_cases(lambda op: CUDA_FAMILIES.get(op, FAMILY), OPS, device, ((1, 1), (7, 4097), (4, 32000)),
                             lambda op, b, d, rows, width, dev: _run_case(op, d, rows, width, dev, False, b),
                             dtypes=(torch.float32, torch.bfloat16))
