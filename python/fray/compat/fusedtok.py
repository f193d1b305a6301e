"""fray.compat.fusedtok: fusedtok's public API on Fray's operators.

`import fray.compat.fusedtok as fusedtok` serves code written against fusedtok 1.x: the names of
its published __init__.pyi, their signatures and their return conventions --

  numpy in            -> float32 numpy out (CPU torch in -> CPU torch out): Fray's float64
                         reference, rounded to float32 (inputs of other float dtypes are converted
                         to float32 first, as fusedtok does);
  numpy in, cuda=True -> the staged path: copied to the GPU, run by Fray's kernels
                         (backend="auto"), copied back, float32 numpy out;
  CUDA tensor in      -> CUDA tensor out, on the current stream, in the tensor's dtype;
  single-token samplers and argmax return Python ints (one device-to-host read, as fusedtok's).

Every call is a composition of Fray's public operators; nothing here has a kernel of its own.

Where Fray's semantics differ from fusedtok's, they are Fray's, and they are:

* RNG. sample_topp / sample_topk / sample_minp (and their _batched forms) and decode_step draw
  one Philox-4x32-10 uniform per row from (seed, offset 0) -- fray.sample's generator -- not
  fusedtok's splitmix-style hash of the seed. The same seed gives a reproducible token, but not
  the token fusedtok gives; the distribution sampled from is the same up to the filter
  differences below.
* Filters (fray.sample): temperature, then top-k / top-p / min-p, with ties at a threshold KEPT
  (every token equal to the k-th largest stays in top-k; fusedtok keeps exactly k, earliest index
  first), and the inverse CDF walks the kept tokens in index order, not rank order.
  temperature must be > 0 here (fusedtok's rule; Fray's own temperature 0 means greedy).
* _batched samplers: seeds=None means seeds 0..rows-1 (fusedtok's default); each row draws from
  its own seed at offset 0. Results come back as fusedtok returns them: int64 numpy for numpy
  input, a CPU int64 tensor for any torch input (CUDA included: the values are read back).
* Ties and NaN in selection: argmax / topk / topp order equal values by lower index (as
  fusedtok); a NaN ranks above every number (Fray's rule, torch.argmax's).
* topp(probs, p): fray.topk over the whole row (descending, ties by lower index), then the
  shortest prefix whose float64 cumulative sum reaches p (the crossing element included; the
  whole row when rounding keeps the sum below p). fusedtok accumulates in float32, so an
  element whose prefix sum lies within float32 rounding of p may be in one result and not the
  other. One device-to-host read of the count (as fusedtok).
* temperature(x, t): fray.axpy(x, 1/t): x times the float32 reciprocal of t, one rounding more
  than a true division: within one float32 ulp of x / t.
* repetition_penalty: fray.apply_penalties on a copy of the logits (the input is never
  modified): each distinct id is penalised once however often it repeats; logit / penalty when
  positive, logit * penalty otherwise (zero stays zero). Ids on the GPU outside [0, vocab) are
  ignored (fusedtok: undefined); host ids are checked (ValueError).
* rope: fray.rope on [seq, 1 head, dim] views; neox=False is Fray's style "gptj" (pairs 2j,
  2j+1), neox=True style "neox" (pairs j, j + dim/2); positions pos_offset .. pos_offset+seq-1
  with a table of pos_offset + seq rows built in float64 from theta (fusedtok computes the
  angles in float32: results agree to float32 rounding, not bit for bit).
* rmsnorm: residual given -> fray.add_rmsnorm, which rounds x + residual to x's dtype before
  normalising (what engines store; fusedtok keeps the float32 sum). Only the normalised output
  is returned, as fusedtok. A norm weight of another dtype than x is cast to x's dtype on the
  GPU unless it is float32 (which Fray reads as is).
* layernorm: fray.layernorm with fusedtok's default eps=1e-6 (Fray's own default is 1e-5).
* attention_decode(_paged): fray.decode_attention / paged_decode_attention, which take head
  dims 64, 128, 256 and at most 16 query heads per KV head on the GPU (fusedtok: any multiple of
  4 up to 512). lens=None means every cache row is valid; host lens are checked (ValueError);
  CUDA lens tensors are trusted, as in fusedtok (FRAY_CHECK_INDICES=1 checks them, with a sync).
  fusedtok's pools are [Nb, Hkv, P, D]; Fray's pages are [Nb, P, Hkv, D]: the facade passes the
  transposed view (no copy). Paged block sizes are 1, 16, 32, 64 or 128 on the GPU.
* kv_append(_paged): in place; host caches must be float32 C-contiguous arrays (a converted
  copy would drop the write), as in fusedtok; returns None. On the staged path the caches are
  copied to the GPU and back in full.

* quantize_int8 / dequantize_int8: per-tensor symmetric int8 through fray.quantize /
  fray.dequantize (granularity="tensor"): ties round to even, NaN / inf are left out of the
  scale, an all-zero x gets scale 1; the scale comes back as a float (a sync on the GPU).
* qgemm / qgemm_perchannel: fray.scaled_gemm (int8, int32 accumulation exact up to K = 131072)
  with the scale composed first, float32(a_scale * b_scale[s]), and applied once, as fusedtok;
  float32 out. Operands must be int8 (fusedtok casts other dtypes to int8; Fray refuses them,
  TypeError). Any M (fusedtok's M = 1 GEMV is the same kernel family here).
* qadd_int8: fray.dequantize of both operands, a float32 add, fray.quantize per tensor; on every
  path (fusedtok: CUDA only), same shape and device required.

Not available yet (raise NotImplementedError naming the Fray issue that brings the operator):
attention_prefill (the prefill-attention issue).

Errors follow fusedtok's (and Fray's) contract: ValueError for shapes and values, TypeError for
dtypes and device families (a host operand next to a CUDA primary input, or the reverse),
RuntimeError for CUDA failures and for cuda=True without a GPU.
"""
from typing import Any, Optional, Tuple, Union

import numpy as np
import torch

import fray

__all__ = [
    "cuda_available", "axpy", "rmsnorm", "layernorm", "softmax", "rope", "swiglu", "silu", "gelu",
    "gelu_tanh", "relu", "tanh", "sigmoid", "add", "mul", "temperature", "repetition_penalty", "argmax",
    "topk", "topp", "sample_topp", "sample_topk", "sample_minp", "sample_topp_batched",
    "sample_topk_batched", "sample_minp_batched", "quantize_int8", "dequantize_int8", "qadd_int8", "qgemm",
    "qgemm_perchannel", "decode_step", "attention_decode", "kv_append", "attention_decode_paged",
    "attention_prefill", "kv_append_paged",
]

Array = Union[np.ndarray, Any]

PREFILL_ISSUE = "Fray's prefill-attention issue"


# ---------------------------------------------------------------------------------------------
# the three paths

def _is_cuda(x):
    return isinstance(x, torch.Tensor) and x.is_cuda


def _host_f32(x, name):
    """A host operand as a float32 numpy array (a copy only when needed)."""
    if isinstance(x, torch.Tensor):
        if x.is_cuda:
            raise TypeError("%s: expected a host array or CPU tensor like the primary input, got a CUDA "
                            "tensor (move every input to one device)" % name)
        x = x.detach().to(torch.float32).numpy()
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub":
        raise TypeError("%s: expected a numeric array, got dtype %s" % (name, arr.dtype))
    return np.ascontiguousarray(arr, dtype=np.float32)


def _require_cuda_operand(x, name):
    if x is not None and not _is_cuda(x):
        raise TypeError("%s: expected a CUDA tensor (the primary input is on CUDA), got %s" % (
            name, type(x).__name__ if not isinstance(x, torch.Tensor) else "a tensor on " + str(x.device)))


def _gpu():
    if not torch.cuda.is_available():
        raise RuntimeError("cuda=True: expected a CUDA device for the staged path, found none")
    return torch.device("cuda", torch.cuda.current_device())


def _back(r, like_torch):
    """A staged or reference result to the host family of the input."""
    if r is None or isinstance(r, (int, float)):
        return r
    if isinstance(r, tuple):
        return tuple(_back(v, like_torch) for v in r)
    if isinstance(r, torch.Tensor):
        r = r.cpu()
        return r if like_torch else r.numpy()
    return torch.from_numpy(r) if like_torch else r


def _run(fn, cuda, operands, names):
    """fn(*operands) on the path the primary operand (operands[0]) and cuda= pick; operands may hold
    None (absent optional ones). Float operands only; integer ones go through _ints."""
    x = operands[0]
    if _is_cuda(x):
        for v, name in zip(operands[1:], names[1:]):
            _require_cuda_operand(v, name)
        return fn(*operands)
    like_torch = isinstance(x, torch.Tensor)
    host = [None if v is None else _host_f32(v, name) for v, name in zip(operands, names)]
    if cuda:
        dev = _gpu()
        return _back(fn(*[None if h is None else torch.from_numpy(h).to(dev) for h in host]), like_torch)
    return _back(fn(*host), like_torch)


def _ints(v, name, dtype=np.int64):
    """Host integer values as a numpy array (float dtypes refused: a silent truncation would move
    positions / ids), or the tensor itself when it is on a GPU (trusted, never read back)."""
    if _is_cuda(v):
        return v
    arr = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError("%s: expected integer values, got dtype %s" % (name, arr.dtype))
    return np.ascontiguousarray(arr, dtype=dtype)


def _on(x, ref, dtype=None):
    """x (numpy ints or a CUDA tensor) where ref lives: a tensor on ref's device, or numpy."""
    if isinstance(ref, torch.Tensor):
        t = x if isinstance(x, torch.Tensor) else torch.from_numpy(x)
        return t.to(device=ref.device, dtype=dtype if dtype is not None else t.dtype)
    if isinstance(x, torch.Tensor):
        raise TypeError("expected host integer values next to host operands, got a CUDA tensor")
    return x if dtype is None else x.astype(np.dtype(str(dtype).replace("torch.", "")))


def _check_range(arr, lo, hi, name, hi_inclusive=True):
    if isinstance(arr, np.ndarray) and arr.size:
        bad = (arr < lo) | ((arr > hi) if hi_inclusive else (arr >= hi))
        if bad.any():
            raise ValueError("%s: expected values in [%d, %d%s, got %d" % (
                name, lo, hi, "]" if hi_inclusive else ")", int(arr[bad][0])))


def cuda_available() -> bool:
    """True when torch sees a usable CUDA device."""
    return bool(torch.cuda.is_available())


# ---------------------------------------------------------------------------------------------
# elementwise and activations

def axpy(x: Array, a: float = 1.0, b: float = 0.0, *, cuda: bool = False) -> Array:
    """y = a * x + b elementwise (fray.axpy; one fp32 fma)."""
    return _run(lambda x_: fray.axpy(x_, a, b), cuda, (x,), ("x",))


def _unary(fn):
    def op(x: Array, *, cuda: bool = False) -> Array:
        return _run(fn, cuda, (x,), ("x",))
    return op


silu = _unary(fray.silu)
silu.__name__ = silu.__qualname__ = "silu"
silu.__doc__ = "SiLU, x / (1 + exp(-x)) (fray.silu)."
gelu = _unary(fray.gelu)
gelu.__name__ = gelu.__qualname__ = "gelu"
gelu.__doc__ = "Exact (erf) GELU (fray.gelu)."
gelu_tanh = _unary(lambda x_: fray.gelu(x_, approximate="tanh"))
gelu_tanh.__name__ = gelu_tanh.__qualname__ = "gelu_tanh"
gelu_tanh.__doc__ = "tanh-approximated GELU (fray.gelu(approximate='tanh'))."
relu = _unary(fray.relu)
relu.__name__ = relu.__qualname__ = "relu"
relu.__doc__ = "max(x, 0), NaN kept (fray.relu)."
tanh = _unary(fray.tanh)
tanh.__name__ = tanh.__qualname__ = "tanh"
tanh.__doc__ = "tanh(x) (fray.tanh)."
sigmoid = _unary(fray.sigmoid)
sigmoid.__name__ = sigmoid.__qualname__ = "sigmoid"
sigmoid.__doc__ = "1 / (1 + exp(-x)) (fray.sigmoid)."


def add(a: Array, b: Array, *, cuda: bool = False) -> Array:
    """a + b elementwise, same shapes (fray.vector_add)."""
    return _run(fray.vector_add, cuda, (a, b), ("a", "b"))


def mul(a: Array, b: Array, *, cuda: bool = False) -> Array:
    """a * b elementwise, same shapes (fray.mul)."""
    return _run(fray.mul, cuda, (a, b), ("a", "b"))


def swiglu(gate: Array, up: Array, *, cuda: bool = False) -> Array:
    """silu(gate) * up (fray.silu_mul's two-tensor form)."""
    return _run(fray.silu_mul, cuda, (gate, up), ("gate", "up"))


def temperature(x: Array, t: float, *, cuda: bool = False) -> Array:
    """x / t for t > 0, as x times the float32 reciprocal of t (fray.axpy): within one float32 ulp."""
    if not t > 0.0:
        raise ValueError("t: expected a temperature > 0, got %r" % (t,))
    inv = float(np.float32(1.0 / float(t)))
    return _run(lambda x_: fray.axpy(x_, inv, 0.0), cuda, (x,), ("x",))


# ---------------------------------------------------------------------------------------------
# norms, softmax, rope

def _rows(x, name):
    if x.ndim not in (1, 2):
        raise ValueError("%s: expected a 1-D or 2-D array, got %d dimensions" % (name, x.ndim))


def _norm_weight(w, x):
    if isinstance(w, torch.Tensor) and isinstance(x, torch.Tensor) and w.dtype not in (x.dtype, torch.float32):
        return w.to(x.dtype)
    return w


def rmsnorm(x: Array, weight: Array, *, residual: Optional[Array] = None, eps: float = 1e-6,
            cuda: bool = False) -> Array:
    """(x + residual) * rsqrt(mean((x + residual)^2) + eps) * weight over the last dim."""
    _rows(x, "x")

    def fn(x_, w_, r_):
        w_ = _norm_weight(w_, x_)
        if r_ is None:
            return fray.rmsnorm(x_, w_, eps)
        return fray.add_rmsnorm(x_, r_, w_, eps)[0]
    return _run(fn, cuda, (x, weight, residual), ("x", "weight", "residual"))


def layernorm(x: Array, weight: Array, bias: Array, *, eps: float = 1e-6, cuda: bool = False) -> Array:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim."""
    _rows(x, "x")
    return _run(lambda x_, w_, b_: fray.layernorm(x_, _norm_weight(w_, x_), _norm_weight(b_, x_), eps),
                cuda, (x, weight, bias), ("x", "weight", "bias"))


def softmax(x: Array, *, cuda: bool = False) -> Array:
    """Row-wise softmax over the last dim."""
    _rows(x, "x")
    return _run(fray.softmax, cuda, (x,), ("x",))


def rope(q: Array, k: Optional[Array] = None, *, theta: float = 10000.0, pos_offset: int = 0,
         neox: bool = False, cuda: bool = False) -> Tuple[Array, Optional[Array]]:
    """Rotary embedding of q (and k), [seq, dim] each, rows at positions pos_offset + i."""
    if isinstance(pos_offset, bool) or not isinstance(pos_offset, int):
        raise TypeError("pos_offset: expected an int, got %s" % type(pos_offset).__name__)
    if pos_offset < 0:
        raise ValueError("pos_offset: expected >= 0, got %d" % pos_offset)
    if q.ndim != 2:
        raise ValueError("q: expected [seq, dim], got %d dimensions" % q.ndim)
    if q.shape[1] % 2:
        raise ValueError("q: expected an even dim (RoPE pairs elements), got %d" % q.shape[1])
    if k is not None and tuple(k.shape) != tuple(q.shape):
        raise ValueError("k: expected q's shape %s, got %s" % (tuple(q.shape), tuple(k.shape)))
    seq = q.shape[0]

    def fn(q_, k_):
        if seq == 0:
            return q_.copy() if isinstance(q_, np.ndarray) else q_.clone(), (
                None if k_ is None else (k_.copy() if isinstance(k_, np.ndarray) else k_.clone()))
        qo, ko = fray.rope(q_[:, None, :], None if k_ is None else k_[:, None, :], pos_offset,
                           max_position=pos_offset + seq, theta=float(theta), style="neox" if neox else "gptj")
        return qo[:, 0, :], None if ko is None else ko[:, 0, :]
    return _run(fn, cuda, (q, k), ("q", "k"))


# ---------------------------------------------------------------------------------------------
# selection and sampling

def _one_row(x, name):
    if x.ndim != 1:
        raise ValueError("%s: expected a 1-D array, got %d dimensions" % (name, x.ndim))


def _two_rows(x, name):
    if x.ndim != 2:
        raise ValueError("%s: expected a 2-D [rows, vocab] array, got %d dimensions" % (name, x.ndim))


def argmax(x: Array, *, cuda: bool = False) -> int:
    """Index of the largest element (earliest on ties; a NaN is the largest)."""
    _one_row(x, "x")
    if x.shape[0] == 0:
        raise ValueError("x: expected at least one element, got an empty array")
    return int(_run(lambda x_: int(fray.argmax(x_)), cuda, (x,), ("x",)))


def topk(x: Array, k: int, *, cuda: bool = False) -> Tuple[Array, Array]:
    """The k largest values, descending, and their int64 indices (earliest index on ties)."""
    _one_row(x, "x")
    n = x.shape[0]
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError("k: expected an int, got %s" % type(k).__name__)
    if not 0 <= k <= n:
        raise ValueError("k: expected a value in [0, %d], got %d" % (n, k))

    def fn(x_):
        if k == 0:
            if isinstance(x_, torch.Tensor):
                return (torch.empty(0, dtype=x_.dtype, device=x_.device),
                        torch.empty(0, dtype=torch.int64, device=x_.device))
            return np.empty(0, np.float32), np.empty(0, np.int64)
        return fray.topk(x_, k)
    return _run(fn, cuda, (x,), ("x",))


def topp(probs: Array, p: float, *, cuda: bool = False) -> Tuple[Array, Array]:
    """The shortest run of the largest probabilities whose mass reaches p (the crossing element
    included), descending, and their int64 indices."""
    if not 0.0 < p <= 1.0:
        raise ValueError("p: expected a value in (0, 1], got %r" % (p,))
    _one_row(probs, "probs")

    def fn(x_):
        n = x_.shape[0]
        if n == 0:
            return fn_empty(x_)
        vals, idx = fray.topk(x_, n)
        if isinstance(vals, torch.Tensor):
            cs = torch.cumsum(vals.double(), 0)
            count = min(int(torch.searchsorted(cs, torch.tensor([float(p)], dtype=torch.float64,
                                                                 device=cs.device)).item()) + 1, n)
        else:
            count = min(int(np.searchsorted(np.cumsum(vals.astype(np.float64)), p)) + 1, n)
        return vals[:count], idx[:count]

    def fn_empty(x_):
        if isinstance(x_, torch.Tensor):
            return (torch.empty(0, dtype=x_.dtype, device=x_.device),
                    torch.empty(0, dtype=torch.int64, device=x_.device))
        return np.empty(0, np.float32), np.empty(0, np.int64)
    return _run(fn, cuda, (probs,), ("probs",))


def _check_temperature(t):
    if not t > 0.0:
        raise ValueError("temperature: expected a value > 0, got %r" % (t,))


def _check_unit(v, name):
    if not 0.0 < v <= 1.0:
        raise ValueError("%s: expected a value in (0, 1], got %r" % (name, v))


def _check_seed(seed, name="seed"):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError("%s: expected an int, got %s" % (name, type(seed).__name__))
    if not 0 <= int(seed) < 2 ** 63:
        raise ValueError("%s: expected a value in [0, 2**63), got %d" % (name, int(seed)))
    return int(seed)


def _batch_seeds(seeds, rows):
    if seeds is None:
        return np.arange(rows, dtype=np.int64)
    arr = seeds.detach().cpu().numpy() if isinstance(seeds, torch.Tensor) else np.asarray(seeds)
    if arr.dtype.kind not in "iu":
        raise TypeError("seeds: expected integers, got dtype %s" % arr.dtype)
    if arr.ndim != 1 or arr.shape[0] != rows:
        raise ValueError("seeds: expected one seed per row (%d), got shape %s" % (rows, arr.shape))
    out = arr.astype(np.int64)
    if out.size and out.min() < 0:
        raise ValueError("seeds: expected values in [0, 2**63), got %d" % int(out.min()))
    return out


def _seeds_like(seeds, logits):
    if isinstance(logits, torch.Tensor):
        return torch.from_numpy(seeds).to(logits.device)
    return seeds


def _tensor(x):
    """fray.sample / apply_penalties / decode_step take torch tensors only: a host array as a CPU
    tensor sharing its memory."""
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def _sample_rows(logits, seeds, **filters):
    """fray.sample over [rows, vocab] with per-row seeds (offset 0)."""
    logits = _tensor(logits)
    rows = logits.shape[0]
    offsets = np.zeros(rows, dtype=np.int64)
    return fray.sample(logits, seeds=_seeds_like(seeds, logits), offsets=_seeds_like(offsets, logits), **filters)


def _sample_one(logits, seed, cuda, **filters):
    _one_row(logits, "logits")
    seed = _check_seed(seed)
    tok = _run(lambda x_: _sample_rows(x_[None], np.array([seed], np.int64), **filters), cuda, (logits,), ("logits",))
    return int(tok[0])


def _sample_batch(logits, seeds, cuda, **filters):
    _two_rows(logits, "logits")
    s = _batch_seeds(seeds, logits.shape[0])
    like_torch = isinstance(logits, torch.Tensor)
    if logits.shape[0] == 0:
        out = np.empty(0, np.int64)
    else:
        out = _run(lambda x_: _sample_rows(x_, s, **filters), cuda, (logits,), ("logits",))
        out = out.cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
    out = out.astype(np.int64)
    return torch.from_numpy(out) if like_torch else out


def sample_topp(logits: Array, p: float, *, temperature: float = 1.0, seed: int = 0, cuda: bool = False) -> int:
    """A token from the top-p nucleus of softmax(logits / temperature) (fray.sample, Philox)."""
    _check_unit(p, "p")
    _check_temperature(temperature)
    return _sample_one(logits, seed, cuda, temperature=float(temperature), top_p=float(p))


def _top_k(k, vocab):
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError("k: expected an int, got %s" % type(k).__name__)
    if k <= 0:
        raise ValueError("k: expected a value >= 1, got %d" % k)
    return min(k, vocab)  # fusedtok: k >= vocab samples the whole distribution


def sample_topk(logits: Array, k: int, *, temperature: float = 1.0, seed: int = 0, cuda: bool = False) -> int:
    """A token from the k most likely of softmax(logits / temperature) (fray.sample, Philox)."""
    _check_temperature(temperature)
    return _sample_one(logits, seed, cuda, temperature=float(temperature), top_k=_top_k(k, logits.shape[-1]))


def sample_minp(logits: Array, min_p: float, *, temperature: float = 1.0, seed: int = 0, cuda: bool = False) -> int:
    """A token from those with probability >= min_p * the maximum (fray.sample, Philox)."""
    _check_unit(min_p, "min_p")
    _check_temperature(temperature)
    return _sample_one(logits, seed, cuda, temperature=float(temperature), min_p=float(min_p))


def sample_topp_batched(logits: Array, p: float, *, temperature: float = 1.0, seeds: Optional[Array] = None,
                        cuda: bool = False) -> Array:
    """sample_topp per row of [rows, vocab]; seeds one per row (None: 0..rows-1); int64 on the host."""
    _check_unit(p, "p")
    _check_temperature(temperature)
    return _sample_batch(logits, seeds, cuda, temperature=float(temperature), top_p=float(p))


def sample_topk_batched(logits: Array, k: int, *, temperature: float = 1.0, seeds: Optional[Array] = None,
                        cuda: bool = False) -> Array:
    """sample_topk per row of [rows, vocab]; seeds one per row (None: 0..rows-1); int64 on the host."""
    _check_temperature(temperature)
    return _sample_batch(logits, seeds, cuda, temperature=float(temperature), top_k=_top_k(k, logits.shape[-1]))


def sample_minp_batched(logits: Array, min_p: float, *, temperature: float = 1.0, seeds: Optional[Array] = None,
                        cuda: bool = False) -> Array:
    """sample_minp per row of [rows, vocab]; seeds one per row (None: 0..rows-1); int64 on the host."""
    _check_unit(min_p, "min_p")
    _check_temperature(temperature)
    return _sample_batch(logits, seeds, cuda, temperature=float(temperature), min_p=float(min_p))


def _history(token_ids, logits, vocab):
    """(ids, offsets) of one row's history for fray.apply_penalties / decode_step, where logits live."""
    ids = _ints(token_ids, "token_ids")
    if ids.ndim != 1:
        raise ValueError("token_ids: expected a 1-D array, got %d dimensions" % ids.ndim)
    if isinstance(ids, np.ndarray):
        _check_range(ids, 0, vocab, "token_ids", hi_inclusive=False)
    elif not _is_cuda(logits):
        raise TypeError("token_ids: expected host ids next to host logits, got a CUDA tensor")
    n = ids.shape[0]
    offs = np.array([0, n], dtype=np.int64)
    return _on(ids, logits, torch.int64), _on(offs, logits, torch.int64)


def repetition_penalty(logits: Array, token_ids: Array, penalty: float, *, cuda: bool = False) -> Array:
    """CTRL repetition penalty on a copy of 1-D logits for the ids in token_ids (fray.apply_penalties)."""
    if not penalty > 0.0:
        raise ValueError("penalty: expected a value > 0, got %r" % (penalty,))
    _one_row(logits, "logits")

    def fn(x_):
        t = _tensor(x_)
        ids, offs = _history(token_ids, t, t.shape[0])
        y = fray.apply_penalties(t.clone()[None], ids, offs, repetition=float(penalty))[0]
        return y.numpy() if isinstance(x_, np.ndarray) else y
    return _run(fn, cuda, (logits,), ("logits",))


def decode_step(logits: Array, sampled_ids: Array, penalty: float = 1.0, *, p: float = 0.9,
                temperature: float = 1.0, seed: int = 0, cuda: bool = False) -> int:
    """Repetition penalty over sampled_ids, then a top-p token (fray.decode_step on a copy, Philox)."""
    if not penalty > 0.0:
        raise ValueError("penalty: expected a value > 0, got %r" % (penalty,))
    _check_unit(p, "p")
    _check_temperature(temperature)
    _one_row(logits, "logits")
    seed = _check_seed(seed)

    def fn(x_):
        t = _tensor(x_)
        ids, offs = _history(sampled_ids, t, t.shape[0])
        s = _seeds_like(np.array([seed], np.int64), t)
        o = _seeds_like(np.zeros(1, np.int64), t)
        return fray.decode_step(t.clone()[None], ids, offs, repetition=float(penalty), temperature=float(temperature),
                                top_p=float(p), seeds=s, offsets=o)
    return int(_run(fn, cuda, (logits,), ("logits",))[0])


# ---------------------------------------------------------------------------------------------
# decode attention and the KV cache

def _lens(lens, batch, limit, ref, upper_inclusive=True, default=None):
    if lens is None:
        arr = np.full(batch, default, dtype=np.int32)
    else:
        arr = _ints(lens, "lens", np.int32)
        if arr.ndim != 1 or arr.shape[0] != batch:
            raise ValueError("lens: expected [%d] (one length per sequence), got shape %s" % (batch, tuple(arr.shape)))
        _check_range(arr, 0, limit, "lens", hi_inclusive=upper_inclusive)
        if _is_cuda(arr) and not _is_cuda(ref):
            raise TypeError("lens: expected host lengths next to host operands, got a CUDA tensor")
    return _on(arr, ref, torch.int32)


def _table(block_table, batch, nblocks, ref):
    t = _ints(block_table, "block_table", np.int32)
    if t.ndim != 2 or t.shape[0] != batch:
        raise ValueError("block_table: expected [%d, S] (one row per sequence), got shape %s" % (batch, tuple(t.shape)))
    _check_range(t, 0, nblocks, "block_table", hi_inclusive=False)
    if _is_cuda(t) and not _is_cuda(ref):
        raise TypeError("block_table: expected a host table next to host operands, got a CUDA tensor")
    return _on(t, ref, torch.int32)


def _check_attention_shapes(q, k, v, kname, vname):
    if q.ndim != 3 or k.ndim != 4 or v.ndim != 4:
        raise ValueError("q: expected [B, Hq, D] with %s / %s 4-D, got %d / %d / %d dimensions" % (
            kname, vname, q.ndim, k.ndim, v.ndim))
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError("%s: expected %s's shape %s, got %s" % (vname, kname, tuple(k.shape), tuple(v.shape)))
    if k.shape[3] != q.shape[2]:
        raise ValueError("%s: expected q's head dim %d, got %d" % (kname, q.shape[2], k.shape[3]))
    if k.shape[1] < 1 or q.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError("q: expected a head count that is a multiple of %s's %d, got %d" % (
            kname, k.shape[1], q.shape[1]))


def attention_decode(q: Array, k_cache: Array, v_cache: Array, lens: Optional[Array] = None, *,
                     cuda: bool = False) -> Array:
    """One query token per sequence against a [B, Hkv, T, D] cache (fray.decode_attention)."""
    _check_attention_shapes(q, k_cache, v_cache, "k_cache", "v_cache")
    if k_cache.shape[0] != q.shape[0]:
        raise ValueError("k_cache: expected q's batch %d, got %d" % (q.shape[0], k_cache.shape[0]))
    t_rows = k_cache.shape[2]

    def fn(q_, k_, v_):
        return fray.decode_attention(q_, k_, v_, _lens(lens, q_.shape[0], t_rows, q_, default=t_rows))
    return _run(fn, cuda, (q, k_cache, v_cache), ("q", "k_cache", "v_cache"))


def _swap12(x):
    return np.swapaxes(x, 1, 2) if isinstance(x, np.ndarray) else x.transpose(1, 2)


def attention_decode_paged(q: Array, k_pool: Array, v_pool: Array, block_table: Array,
                           lens: Optional[Array] = None, *, cuda: bool = False) -> Array:
    """One query token per sequence against a paged [Nb, Hkv, P, D] pool (fray.paged_decode_attention)."""
    _check_attention_shapes(q, k_pool, v_pool, "k_pool", "v_pool")
    nb, page = k_pool.shape[0], k_pool.shape[2]

    def fn(q_, k_, v_):
        bt = _table(block_table, q_.shape[0], nb, q_)
        cap = bt.shape[1] * page
        return fray.paged_decode_attention(q_, _swap12(k_), _swap12(v_), bt, _lens(lens, q_.shape[0], cap, q_, default=cap))
    return _run(fn, cuda, (q, k_pool, v_pool), ("q", "k_pool", "v_pool"))


def _writable_host(x, name):
    raw = x.numpy() if isinstance(x, torch.Tensor) and not x.is_cuda else x
    if not isinstance(raw, np.ndarray) or raw.dtype != np.float32 or not raw.flags["C_CONTIGUOUS"]:
        raise TypeError("%s: expected a float32 C-contiguous array (the op writes into it; a converted copy "
                        "would drop the write), got %s" % (name, getattr(raw, "dtype", type(raw).__name__)))
    return raw


def _append(fn, caches, news, names, cuda):
    """Run an in-place append: CUDA tensors directly, host caches on the reference or staged."""
    kc, vc = caches
    if _is_cuda(kc):
        for v, name in zip((vc,) + news, names[1:]):
            _require_cuda_operand(v, name)
        fn(kc, vc, *news)
        return None
    hk, hv = _writable_host(kc, names[0]), _writable_host(vc, names[1])
    hn = tuple(_host_f32(v, name) for v, name in zip(news, names[2:]))
    if cuda:
        dev = _gpu()
        dk, dv = torch.from_numpy(hk).to(dev), torch.from_numpy(hv).to(dev)
        fn(dk, dv, *[torch.from_numpy(h).to(dev) for h in hn])
        np.copyto(hk, dk.cpu().numpy())
        np.copyto(hv, dv.cpu().numpy())
    else:
        fn(hk, hv, *hn)
    return None


def kv_append(k_cache: Array, v_cache: Array, k_new: Array, v_new: Array, lens: Array, *,
              cuda: bool = False) -> None:
    """In place: row lens[b] of k_cache[b] / v_cache[b] ([B, Hkv, T, D]) gets k_new[b] / v_new[b]."""
    if k_cache.ndim != 4 or k_new.ndim != 3:
        raise ValueError("k_cache: expected [B, Hkv, T, D] with k_new [B, Hkv, D], got %d / %d dimensions" % (
            k_cache.ndim, k_new.ndim))
    b, hkv, t_rows, d = k_cache.shape
    if tuple(k_new.shape) != (b, hkv, d) or tuple(v_new.shape) != tuple(k_new.shape) or \
            tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError("k_new: expected [B, Hkv, D] = %s matching the caches, got %s" % ((b, hkv, d), tuple(k_new.shape)))

    def fn(kc, vc, kn, vn):
        fray.kv_append(kc, vc, kn, vn, _lens(lens, b, t_rows, kc, upper_inclusive=False))
    return _append(fn, (k_cache, v_cache), (k_new, v_new), ("k_cache", "v_cache", "k_new", "v_new"), cuda)


def kv_append_paged(k_pool: Array, v_pool: Array, block_table: Array, k_new: Array, v_new: Array, lens: Array, *,
                    cuda: bool = False) -> None:
    """In place: sequence b's token lens[b] lands in pool block block_table[b, lens[b] // P], slot lens[b] % P."""
    if k_pool.ndim != 4 or k_new.ndim != 3:
        raise ValueError("k_pool: expected [Nb, Hkv, P, D] with k_new [B, Hkv, D], got %d / %d dimensions" % (
            k_pool.ndim, k_new.ndim))
    nb, hkv, page, d = k_pool.shape
    b = k_new.shape[0]
    if tuple(k_new.shape) != (b, hkv, d) or tuple(v_new.shape) != tuple(k_new.shape) or \
            tuple(v_pool.shape) != tuple(k_pool.shape):
        raise ValueError("k_new: expected [B, Hkv, D] with (Hkv, D) = %s matching the pools, got %s" % (
            (hkv, d), tuple(k_new.shape)))

    def fn(kp, vp, kn, vn):
        bt = _table(block_table, b, nb, kp)
        fray.kv_append_paged(_swap12(kp), _swap12(vp), bt, kn, vn,
                             _lens(lens, b, bt.shape[1] * page, kp, upper_inclusive=False))
    return _append(fn, (k_pool, v_pool), (k_new, v_new), ("k_pool", "v_pool", "k_new", "v_new"), cuda)


# ---------------------------------------------------------------------------------------------
# quantization

def _as_rows(x, name):
    """x (any shape of at least 1 dimension) as the [rows, last] view fray.quant takes."""
    if not isinstance(x, torch.Tensor):
        x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("%s: expected at least 1 dimension, got a 0-d array" % name)
    return x, x.reshape(-1, x.shape[-1])


def quantize_int8(x: Array) -> Tuple[Array, float]:
    """Symmetric per-tensor int8 (fray.quantize, granularity="tensor"): scale = max |x| / 127 over
    the finite values in float32 (1 for an all-zero x), q = round-half-even(x / scale) saturated to
    [-127, 127], q of x's shape. Any shape of float32 / float16 (and bf16 tensors); a CUDA tensor
    is quantized on the GPU, and reading the float scale back synchronises."""
    x, rows = _as_rows(x, "x")
    q, s = fray.quantize(rows, granularity="tensor")
    return q.reshape(x.shape), float(s)


def dequantize_int8(q: Array, scale: float) -> Array:
    """float32 q * scale (fray.dequantize, granularity="tensor"), q int8 of any shape."""
    q, rows = _as_rows(q, "q")
    if isinstance(q, torch.Tensor):
        s = torch.tensor(float(scale), dtype=torch.float32, device=q.device)
    else:
        s = np.array(float(scale), np.float32)
    return fray.dequantize(rows, s, granularity="tensor", dtype=torch.float32).reshape(q.shape)


def _int8_operand(v, name, like):
    """An int8 operand where the primary operand `like` lives: the CUDA tensor itself (checked to
    be on CUDA), or a CPU int8 tensor (numpy arrays and CPU tensors; other dtypes are refused, since
    a silent cast would wrap or truncate)."""
    if _is_cuda(like):
        _require_cuda_operand(v, name)
        t = v
    else:
        if _is_cuda(v):
            raise TypeError("%s: expected a host array or CPU tensor like the primary input, got a CUDA tensor" % name)
        t = v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(np.asarray(v)))
    if t.dtype != torch.int8:
        raise TypeError("%s: expected int8 values, got %s" % (name, str(t.dtype).replace("torch.", "")))
    if t.ndim != 2:
        raise ValueError("%s: expected 2 dimensions [rows, K], got shape %s" % (name, tuple(t.shape)))
    return t


def _f32_scale(v, like, name):
    """A float32 scale tensor where `like` lives (a float, or a vector for b_scales)."""
    if isinstance(v, torch.Tensor):
        if v.is_cuda != like.is_cuda:
            raise TypeError("%s: expected it on %s like the operands, got a tensor on %s" % (name, like.device, v.device))
        return v.to(device=like.device, dtype=torch.float32)
    return torch.as_tensor(np.asarray(v, np.float32), device=like.device)


def _qgemm(a_q, b_q, scales, cuda):
    """float32 out [M, N] = (a_q [M, K] @ b_q [N, K]^T, exact in int32) * scales, one rounding:
    fray.scaled_gemm with a_scale 1 and b_scale the composed float32 scale (per tensor or per
    output channel), so the epilogue's fp32(acc) * b_scale * 1 is fusedtok's acc * (a_scale * b_scale)."""
    a = _int8_operand(a_q, "a_q", a_q)
    b = _int8_operand(b_q, "b_q", a_q)
    if a.shape[1] != b.shape[1]:
        raise ValueError("b_q: expected [N, %d] (the K of a_q [M, K]), got shape %s" % (a.shape[1], tuple(b.shape)))
    s = scales(a)
    if not _is_cuda(a_q) and cuda:
        dev = _gpu()
        a, b, s = a.to(dev), b.to(dev), s.to(dev)
    one = torch.ones((), dtype=torch.float32, device=a.device)
    y = fray.scaled_gemm(a, b, one, s, out_dtype=torch.float32)
    if _is_cuda(a_q):
        return y
    return _back(y, isinstance(a_q, torch.Tensor))


def qgemm(a_q: Array, a_scale: float, b_q: Array, b_scale: float, *, cuda: bool = False) -> Array:
    """INT8 GEMM (fray.scaled_gemm): float32 y [M, N] = (a_q [M, K] @ b_q [N, K]^T) * float32(a_scale *
    b_scale), the int32 accumulation exact (K <= 131072), the composed scale applied once. a_q and
    b_q int8 (numpy arrays, CPU or CUDA tensors; other dtypes are refused, not cast); numpy in runs
    Fray's reference, CUDA tensors (or cuda=True) the tensor-core kernels."""
    def scales(a):
        return _f32_scale(np.float32(a_scale) * np.float32(b_scale), a, "b_scale")
    return _qgemm(a_q, b_q, scales, cuda)


def qgemm_perchannel(a_q: Array, a_scale: float, b_q: Array, b_scales: Array, *, cuda: bool = False) -> Array:
    """W8A8 INT8 GEMM with a weight scale per output channel (fray.scaled_gemm): float32 y[i, j] =
    (a_q @ b_q^T)[i, j] * float32(a_scale * b_scales[j]), one rounding of the composed scale and one
    of the product. b_scales: N float32 values (numpy or a tensor on the operands' device)."""
    n = b_q.shape[0] if hasattr(b_q, "shape") and len(b_q.shape) == 2 else None

    def scales(a):
        s = _f32_scale(b_scales, a, "b_scales")
        if s.ndim != 1 or (n is not None and s.shape[0] != n):
            raise ValueError("b_scales: expected one scale per output channel ([%s]), got shape %s" % (
                n, tuple(s.shape)))
        return (s * torch.tensor(np.float32(a_scale), device=s.device)).contiguous()  # one fp32 rounding
    return _qgemm(a_q, b_q, scales, cuda)


def qadd_int8(qa: Array, sa: float, qb: Array, sb: float) -> Tuple[Array, float]:
    """Dequantize, add, requantize (fray.dequantize twice, fray.quantize): y = float32(qa * sa) +
    float32(qb * sb), then per-tensor symmetric int8 of y (its own scale, max |y| / 127). Returns
    (qy, scale) with the scale a float (a sync on the GPU). qa and qb int8 of one shape, on one
    device."""
    qa_, a = _as_rows(qa, "qa")
    qb_, b = _as_rows(qb, "qb")
    for name, t in (("qa", a), ("qb", b)):
        dt = t.dtype
        if (dt != torch.int8) if isinstance(t, torch.Tensor) else (dt != np.int8):
            raise TypeError("%s: expected int8 values, got %s" % (name, str(dt).replace("torch.", "")))
    if tuple(qa_.shape) != tuple(qb_.shape):
        raise ValueError("qb: expected the shape of qa %s, got %s" % (tuple(qa_.shape), tuple(qb_.shape)))
    if _is_cuda(qa_) != _is_cuda(qb_):
        raise TypeError("qb: expected it on the device of qa")
    ya = dequantize_int8(qa_, sa)
    yb = dequantize_int8(qb_, sb)
    return quantize_int8(ya + yb)


# ---------------------------------------------------------------------------------------------
# not in Fray yet

def _missing(name, issue):
    raise NotImplementedError("fray.compat.fusedtok.%s: Fray has no such operator yet; it comes with %s" % (
        name, issue))


def attention_prefill(q: Array, k: Array, v: Array, causal: bool = True, *, cuda: bool = False) -> Array:
    """Not available yet: comes with Fray's prefill-attention issue."""
    _missing("attention_prefill", PREFILL_ISSUE)
