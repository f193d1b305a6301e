"""The sampling family: topk, argmax, sample, apply_penalties, decode_step.

The exact semantics (value order with NaNs and signed zeros, index tie-breaks, the filter chain
temperature -> top-k -> top-p -> min-p, the Philox-4x32-10 draw and the inverse-CDF pick) are
written down once, in fray.reference.sampling; the Triton kernels (fray_triton.sampling) make the
same choices. Validation happens here, once. GPU entry points are torch custom ops
(fray::topk, fray::argmax, fray::sample, fray::apply_penalties) with fakes, called directly in
eager mode. CPU tensors and numpy arrays run the reference. There is no CUDA C++ kernel yet:
backend "cuda" reports itself unavailable and "auto" takes Triton.

Per-row parameters (sample, apply_penalties, decode_step) are a Python scalar or a [B] tensor on
the logits' device; the "off" values are top_k 0, top_p 1.0, min_p 0.0, repetition 1.0,
presence 0.0, frequency 0.0; temperature 0 makes that row greedy. Python scalars are range-checked;
values inside CUDA tensors are not (that would need a host sync) and out-of-range values give
unspecified (but memory-safe) results. Graph replay: (seeds[b], offsets[b]) alone decide row b's
draw, so a captured graph replays with fresh randomness when the caller bumps `offsets` in place.
"""
import math

import numpy as np
import torch

from fray import _validate as V
from fray import backend as B
from fray.reference import sampling as ref

FAMILY = "sampling"
OPS = ("topk", "argmax", "sample", "apply_penalties", "decode_step")
__all__ = ["topk", "argmax", "sample", "apply_penalties", "decode_step", "topk_workspace_size"]
for _name in OPS:
    B.register_preference(_name, ("triton",))

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

def topk_workspace_size(x, k, algorithm="auto"):
    """Bytes of uint8 workspace topk(x, k, algorithm=...) uses: 0 for the Triton algorithms;
    rows * width * (8 + itemsize) for "torch" (int64 indices then values of the full sort)."""
    alg = _topk_algorithm(x, k, algorithm)
    if alg != "torch":
        return 0
    rows = x.numel() // x.shape[-1]
    return rows * x.shape[-1] * (8 + x.element_size())


def _topk_algorithm(x, k, algorithm):
    width = x.shape[-1]
    if algorithm == "auto":
        if width > TOPK_MAX_WIDTH:
            return "torch"
        if width <= SORT_MAX_WIDTH:
            return "sort"
        return "reduce" if k <= REDUCE_MAX_K else "torch"
    if algorithm == "torch":
        return "torch"
    if width > TOPK_MAX_WIDTH:
        raise ValueError("x: algorithm=%r supports widths up to %d, got %d (use algorithm='auto')"
                         % (algorithm, TOPK_MAX_WIDTH, width))
    if algorithm == "partial":
        raise ValueError("algorithm: 'partial' is not implemented yet; use 'auto', 'sort', 'reduce' or 'torch'")
    if algorithm == "sort" and width > SORT_MAX_WIDTH:
        raise ValueError("x: algorithm='sort' supports widths up to %d, got %d" % (SORT_MAX_WIDTH, width))
    if algorithm == "reduce" and k > REDUCE_MAX_K:
        raise ValueError("k: algorithm='reduce' supports k up to %d, got %d" % (REDUCE_MAX_K, k))
    return algorithm


def _topk_impl(x, values, indices, k, largest, algorithm, backend):
    width = x.shape[-1]
    rows = x.numel() // width
    if rows == 0:
        return
    B.resolve("topk", FAMILY, backend, x.device)
    from fray_triton import sampling as ts
    with torch.cuda.device(x.device):
        ts.topk(x, values, indices, k, largest, algorithm, V.row_stride("x", x), rows, width)


@torch.library.custom_op("fray::topk", mutates_args=("values", "indices"))
def _topk_op(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, k: int, largest: bool,
             algorithm: str, backend: str) -> None:
    _topk_impl(x, values, indices, k, largest, algorithm, backend)


def _gather_bits(x, idx):
    """torch.gather through an integer view: values bit for bit (torch's CPU bf16 gather
    rewrites NaN payloads)."""
    bits = {2: torch.int16, 4: torch.int32}[x.element_size()]
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

    x: [..., width] fp32/fp16/bf16, last dim contiguous, width <= 262144 for the Triton
    algorithms. 1 <= k <= width. Order (also with sorted=False, which returns the same sorted
    result): NaN above every number (first for largest, last for smallest), -0.0 == +0.0, equal
    values by lower index first. Values are read from x (bits preserved).
    algorithm: "sort" (Triton, width <= 4096), "reduce" (Triton, k <= 64, any width),
    "partial" (not implemented yet: raises), "torch" (torch.sort(stable=True)), or "auto" (sort,
    else reduce, else torch). A forced algorithm raises ValueError for inputs it cannot take.
    workspace: a contiguous uint8 tensor on x's device of at least topk_workspace_size(x, k,
    algorithm) bytes (0 for the Triton algorithms) so the "torch" path allocates nothing.
    CPU tensors and numpy arrays run the reference (algorithm is then only validated).
    """
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
    alg = _topk_algorithm(x, k, algorithm)
    V.row_stride("x", x)
    if workspace is not None:
        V.require_tensor("workspace", workspace)
        V.require_same_device([("x", x), ("workspace", workspace)])
        if workspace.dtype != torch.uint8 or not workspace.is_contiguous():
            raise TypeError("workspace: expected a contiguous uint8 tensor, got %s (contiguous=%s)"
                            % (_dt(workspace.dtype), workspace.is_contiguous()))
        need = topk_workspace_size(x, k, algorithm)
        if workspace.numel() < need:
            raise ValueError("workspace: expected at least %d bytes (rows * width * (8 + itemsize) for "
                             "algorithm 'torch'), got %d" % (need, workspace.numel()))
    if alg == "torch":
        if backend == "reference":
            B.resolve("topk", FAMILY, backend, x.device)
        if x.dim() > 1 and not x.is_contiguous():
            x = x.contiguous()
        return _topk_torch(x, k, largest, workspace)
    values = torch.empty(x.shape[:-1] + (k,), dtype=x.dtype, device=x.device)
    indices = torch.empty(x.shape[:-1] + (k,), dtype=torch.int64, device=x.device)
    if _compiling():
        torch.ops.fray.topk(x, values, indices, k, largest, alg, backend)
    else:
        _topk_impl(x, values, indices, k, largest, alg, backend)
    return values, indices


# ---------------------------------------------------------------------------------------------
# argmax

def _argmax_impl(x, out, backend):
    width = x.shape[-1]
    rows = x.numel() // width
    if rows == 0:
        return
    B.resolve("argmax", FAMILY, backend, x.device)
    from fray_triton import sampling as ts
    with torch.cuda.device(x.device):
        ts.argmax(x, out, V.row_stride("x", x), rows, width)


@torch.library.custom_op("fray::argmax", mutates_args=("out",))
def _argmax_op(x: torch.Tensor, out: torch.Tensor, backend: str) -> None:
    _argmax_impl(x, out, backend)


def argmax(x, *, backend="auto"):
    """int64 index of the maximum along the last axis, shape x.shape[:-1], on x's device.

    Matches torch.argmax: a NaN is the maximum (the first NaN wins), ties go to the earliest
    index, -0.0 == +0.0. x: [..., width] fp32/fp16/bf16, last dim contiguous."""
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
        _argmax_impl(x, out, backend)
    return out


# ---------------------------------------------------------------------------------------------
# per-row parameters

def _row_param(name, value, rows, device, kind, check):
    """A [rows] tensor (fp32 for kind "float", int64 for "int") from a scalar or a [rows] tensor."""
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
        return value.to(tdtype)
    if isinstance(value, np.ndarray) and device.type == "cpu":
        if value.shape != (rows,):
            raise ValueError("%s: expected shape (%d,) (one value per row), got %s" % (name, rows, value.shape))
        return _row_param(name, torch.from_numpy(value), rows, device, kind, check)
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind == "float" else (int,)):
        raise TypeError("%s: expected a %s or a [batch] tensor, got %s" % (
            name, "float" if kind == "float" else "int", type(value).__name__))
    check(value)
    return torch.full((rows,), value, dtype=tdtype, device=device)


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


def _penalty_params(logits, repetition, presence, frequency):
    rows, dev = logits.shape[0], logits.device
    return (
        _row_param("repetition", repetition, rows, dev, "float", _range_check("repetition", 0.0, None, True)),
        _row_param("presence", presence, rows, dev, "float", _range_check("presence", -math.inf, None)),
        _row_param("frequency", frequency, rows, dev, "float", _range_check("frequency", -math.inf, None)),
    )


# ---------------------------------------------------------------------------------------------
# sample

def _sample_impl(logits, temperature, top_k, top_p, min_p, seeds, offsets, tokens, logprobs, backend):
    rows, width = logits.shape
    if rows == 0:
        return
    B.resolve("sample", FAMILY, backend, logits.device)
    from fray_triton import sampling as ts
    with torch.cuda.device(logits.device):
        ts.sample(logits, tokens, logprobs, temperature, top_k, top_p, min_p, seeds, offsets,
                  V.row_stride("logits", logits), rows, width)


@torch.library.custom_op("fray::sample", mutates_args=("tokens", "logprobs"))
def _sample_op(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
               min_p: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor, tokens: torch.Tensor,
               logprobs: torch.Tensor, backend: str) -> None:
    _sample_impl(logits, temperature, top_k, top_p, min_p, seeds, offsets, tokens, logprobs, backend)


def _sample_validated(logits, params, return_logprobs, backend):
    if logits.device.type == "cpu":
        t, k, p, m, s, o = (v.numpy() for v in params)
        tok, lp = ref.sample(_f64(logits), t.astype(np.float64), k, p.astype(np.float64), m.astype(np.float64), s, o)
        tok, lp = torch.from_numpy(tok), torch.from_numpy(lp).to(torch.float32)
        return (tok, lp) if return_logprobs else tok
    rows = logits.shape[0]
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if _compiling():
        torch.ops.fray.sample(logits, *params, tokens, logprobs, backend)
    else:
        _sample_impl(logits, *params, tokens, logprobs, backend)
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


def sample(logits, *, temperature, top_k=None, top_p=None, min_p=None, seeds, offsets,
           return_logprobs=False, backend="auto"):
    """One token per row of logits [B, V] (fp32 or bf16): int64 [B] (and fp32 logprobs [B]).

    temperature -> top-k -> top-p -> min-p -> one Philox-4x32-10 uniform per row from
    (seeds[b], offsets[b]) -> inverse CDF over the kept tokens in index order; temperature 0 is
    greedy (argmax, logprob 0). Ties at a threshold are kept. The exact procedure is in
    fray.reference.sampling. logprobs: log of the chosen token's probability in the filtered,
    renormalised distribution it was drawn from. NaN logits are defined only for greedy rows.
    """
    _check_sample_common(logits, return_logprobs, backend)
    params = _sampling_params(logits, temperature, top_k, top_p, min_p, seeds, offsets)
    return _sample_validated(logits, params, return_logprobs, backend)


# ---------------------------------------------------------------------------------------------
# penalties

def _penalties_impl(logits, token_ids, token_offsets, rep, pres, freq, backend):
    rows, width = logits.shape
    if rows == 0:
        return
    B.resolve("apply_penalties", FAMILY, backend, logits.device)
    from fray_triton import sampling as ts
    with torch.cuda.device(logits.device):
        ts.apply_penalties(logits, token_ids, token_offsets, rep, pres, freq,
                           V.row_stride("logits", logits, writable=True), rows, width)


@torch.library.custom_op("fray::apply_penalties", mutates_args=("logits",))
def _penalties_op(logits: torch.Tensor, token_ids: torch.Tensor, token_offsets: torch.Tensor,
                  repetition: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor, backend: str) -> None:
    _penalties_impl(logits, token_ids, token_offsets, repetition, presence, frequency, backend)


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
        offs = token_offsets.tolist()
        if offs[0] != 0 or any(b < a for a, b in zip(offs, offs[1:])) or offs[-1] > token_ids.shape[0]:
            raise ValueError("token_offsets: expected non-decreasing offsets from 0 to at most %d, got %s"
                             % (token_ids.shape[0], offs))
        if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= logits.shape[1]):
            raise ValueError("token_ids: expected ids in [0, %d), got values in [%d, %d]" % (
                logits.shape[1], int(token_ids.min()), int(token_ids.max())))


def _penalties_validated(logits, token_ids, token_offsets, params, backend):
    if logits.device.type == "cpu":
        r, p, f = (v.double().numpy() for v in params)
        y = ref.apply_penalties(_f64(logits), token_ids.numpy(), token_offsets.numpy(), r, p, f)
        logits.copy_(torch.from_numpy(y).to(logits.dtype))
        return logits
    if _compiling():
        torch.ops.fray.apply_penalties(logits, token_ids, token_offsets, *params, backend)
    else:
        _penalties_impl(logits, token_ids, token_offsets, *params, backend)
    return logits


def apply_penalties(logits, token_ids, token_offsets, *, repetition=1.0, presence=0.0, frequency=0.0,
                    backend="auto"):
    """Repetition/presence/frequency penalties, in place on logits [B, V]; returns logits.

    Row b's history is token_ids[token_offsets[b]:token_offsets[b + 1]] (CSR; int32/int64).
    For each distinct id with count n: l = l / rep if l > 0 else l * rep, then l -= presence,
    then l -= n * frequency; fp32 math, one rounding. Ids outside [0, V) raise on the CPU and are
    ignored on the GPU (checking them there would need a host sync)."""
    V.require_backend(backend, B.BACKENDS)
    V.require_tensor("logits", logits)
    _check_logits("logits", logits, V.FLOAT_DTYPES, ndim=2)
    if logits.device.type == "cpu":
        _cpu_backend_ok(backend, "logits")
    else:
        V.row_stride("logits", logits, writable=True)
    _check_history(logits, token_ids, token_offsets)
    params = _penalty_params(logits, repetition, presence, frequency)
    return _penalties_validated(logits, token_ids, token_offsets, params, backend)


def decode_step(logits, token_ids, token_offsets, *, repetition=1.0, presence=0.0, frequency=0.0,
                temperature, top_k=None, top_p=None, min_p=None, seeds, offsets, return_logprobs=False,
                backend="auto"):
    """apply_penalties (in place on logits) then sample, for the whole batch; returns tokens
    (and logprobs). Everything is validated before logits are touched."""
    _check_sample_common(logits, return_logprobs, backend)
    _check_history(logits, token_ids, token_offsets)
    pen = _penalty_params(logits, repetition, presence, frequency)
    params = _sampling_params(logits, temperature, top_k, top_p, min_p, seeds, offsets)
    if logits.device.type != "cpu":
        V.row_stride("logits", logits, writable=True)
    _penalties_validated(logits, token_ids, token_offsets, pen, backend)
    return _sample_validated(logits, params, return_logprobs, backend)


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

    cases = []
    if device.type != "cuda":
        cases.append(("sampling", "reference", "fp64", "hand", hand))
        for op in OPS:
            for dtype in (torch.float32, torch.bfloat16):
                cases.append((op, "triton-interpreter", V.DTYPE_NAMES[dtype], "3x100",
                              lambda o=op, d=dtype: _run_case(o, d, 3, 100, "cpu", True)))
        return cases
    for op in OPS:
        for backend, reason in B.available(op, FAMILY, device).items():
            if reason is not None:
                cases.append((op, backend, "-", "-", RuntimeError("unavailable: " + reason)))
                continue
            for dtype in (torch.float32, torch.bfloat16):
                for rows, width in ((1, 1), (7, 4097), (4, 32000)):
                    cases.append((op, backend, V.DTYPE_NAMES[dtype], "%dx%d" % (rows, width),
                              lambda o=op, b=backend, d=dtype, r=rows, w=width:
                              _run_case(o, d, r, w, device, False, b)))
    return cases
