"""The attention family: single-token (decode) attention over contiguous and paged KV caches, the
KV-cache appends that precede it, multi-token (prefill) attention over packed varlen or batched
sequences or a paged KV cache, and DeepSeek's latent attention decode over a paged latent cache.

Backends: the CUDA C++ kernels (cuda/attention, fray._C._attention: tensor-core split-KV decode
for 16-bit caches, CUDA-core for fp32, one kv_append kernel; prefill_attention's and mla_decode's
TMA + wgmma kernels, cuda/attention/prefill_sm90.cuh and mla_sm90.cuh, JIT-compiled by fray.jit)
and the Triton kernels
(fray_triton.attention, .prefill_attention, .mla_decode); "auto" tries CUDA first. Both implement
the same contract (split count from T, B * Hkv and the SM count; deterministic combine; the same
clamping of lens). The CUDA decode kernels copy K/V rows with 16-byte cp.async: caches whose
pointer or strides are not 16-byte multiples run on Triton under "auto" (backend="cuda" raises
ValueError for them).

Validation happens here, once; the kernels trust their inputs. GPU entry points are torch custom
ops (fray::decode_attention, fray::paged_decode_attention, fray::kv_append, fray::kv_append_paged,
fray::prefill_attention, fray::mla_decode) with fake implementations, so
torch.compile(fullgraph=True) traces through them; in eager mode a call validates its signature
once and launches from the cached plan after that (fray._plan; the split plan is part of it),
checking per call only the caches' address alignment and FRAY_CHECK_INDICES. CPU tensors and
numpy arrays run the float64 reference and come back in the input's dtype.

Trust boundary: lens, block_table and cu_seqlens live on the device and are never read on the
host (a read would synchronise and break CUDA-graph replay with new lengths). The kernels clamp
lens[b] to [0, T] (decode, MLA), skip appends at positions outside [0, T) and clamp cu_seqlens
offsets into the packed rows and paged key counts to [0, T] (prefill), so a bad length cannot
read or write outside the tensors; block-table entries are used as given. FRAY_CHECK_INDICES=1
checks them all with a host synchronisation and raises ValueError (RuntimeError while a CUDA
graph is capturing). CPU calls always check them (the reference reads them on the host anyway).

Layouts: contiguous caches are HND [B, Hkv, T, D] (the seed's [B, H, T, D]) or NHD [B, T, Hkv, D];
paged caches (paged decode, appends, paged prefill) are NHD pages [num_blocks, block_size, Hkv, D]
(vLLM's and FlashInfer's NHD paged layout) with an int32 block_table [B, max_blocks]: token t of
sequence b is in page block_table[b, t // block_size], slot t % block_size; T, the capacity, is
max_blocks * block_size. The MLA latent cache is the same with one 576-wide row per token,
[num_blocks, block_size, 1, 576] (FlashMLA's).
"""
import functools
import math
from typing import Optional

import numpy as np
import torch

from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray import env
from fray.reference import attention as ref
from fray.reference import convert as C

FAMILY = "attention"
OPS = ("decode_attention", "paged_decode_attention", "kv_append", "kv_append_paged", "prefill_attention", "mla_decode")
__all__ = list(OPS)
for _op_name in OPS[:4]:
    B.register_preference(_op_name, ("cuda", "triton"))
B.register_preference("prefill_attention", ("cuda", "triton"))
# prefill_attention's and mla_decode's CUDA kernels are JIT-compiled (fray.jit + CUTLASS headers), as
# the gemm family's are: their availability is that family's (nvcc, the headers, sm_90a), not
# fray._C._attention's.
CUDA_FAMILIES = {"prefill_attention": "gemm", "mla_decode": "gemm"}
B.register_preference("mla_decode", ("cuda", "triton"))

LAYOUTS = ("HND", "NHD")
HEAD_DIMS = (64, 128, 256)
MAX_GROUP = 16
PAGE_SIZES = (1, 16, 32, 64, 128)
# Refused with a message of their own (a membership test torch.compile traces without a break).
_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
             if hasattr(torch, n))


# ---------------------------------------------------------------------------------------------
# validation

def _name(dtype):
    return str(dtype).replace("torch.", "")


def _refuse_features(window_left, logits_soft_cap, sinks):
    if window_left is not None:
        raise ValueError("window_left: sliding-window attention is not supported; got %r (expected None)"
                         % (window_left,))
    if logits_soft_cap is not None:
        raise ValueError("logits_soft_cap: logit soft-capping is not supported; got %r (expected None)"
                         % (logits_soft_cap,))
    if sinks is not None:
        raise ValueError("sinks: attention sinks are not supported; expected None")


def _check_layout(kv_layout):
    if kv_layout not in LAYOUTS:
        raise ValueError("kv_layout: expected 'HND' ([B, Hkv, T, D]) or 'NHD' ([B, T, Hkv, D]), got %r"
                         % (kv_layout,))
    return kv_layout == "NHD"


def _check_scale(scale, head_dim):
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError("scale: expected a float or None, got %s" % type(scale).__name__)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError("scale: expected a finite value > 0, got %r" % (scale,))
    return float(scale)


def _check_num_splits(num_splits):
    if num_splits is None:
        return 0
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError("num_splits: expected an int or None, got %s" % type(num_splits).__name__)
    if num_splits < 1:
        raise ValueError("num_splits: expected a value >= 1 (or None for the heuristic), got %d" % num_splits)
    return num_splits


def _q_tokens(q):
    """q's [B, Hq, D] shape; a 4-d q [B, Hq, 1, D] (the seed's form) is one query token."""
    if len(q.shape) == 4:
        if q.shape[2] != 1:
            raise ValueError("q: decode attention takes one query token per sequence; got shape %s "
                             "(expected [B, Hq, D] or [B, Hq, 1, D])" % (tuple(q.shape),))
        return q.shape[0], q.shape[1], q.shape[3]
    if len(q.shape) != 3:
        raise ValueError("q: expected shape [B, Hq, D] or [B, Hq, 1, D], got %s" % (tuple(q.shape),))
    return tuple(q.shape)


def _check_heads(batch, n_heads, n_kv_heads, head_dim, cache_name, q_batch, q_dim):
    if q_dim != head_dim:
        raise ValueError("%s: head dim %d differs from q's %d" % (cache_name, head_dim, q_dim))
    if head_dim not in HEAD_DIMS:
        raise ValueError("q: head dim must be one of %s, got %d" % (HEAD_DIMS, head_dim))
    if batch is not None and batch != q_batch:
        raise ValueError("%s: batch %d differs from q's %d" % (cache_name, batch, q_batch))
    if n_kv_heads < 1 or n_heads % n_kv_heads or not 1 <= n_heads // n_kv_heads <= MAX_GROUP:
        raise ValueError("q: Hq / Hkv must be an integer group size in 1..%d; got Hq=%d, Hkv=%d"
                         % (MAX_GROUP, n_heads, n_kv_heads))


def _decode_shapes(q, k, v, lens, nhd):
    qb, hq, d = _q_tokens(q)
    if len(k.shape) != 4:
        raise ValueError("k_cache: expected a 4-d cache (%s), got shape %s" % (
            "[B, T, Hkv, D]" if nhd else "[B, Hkv, T, D]", tuple(k.shape)))
    V.require_shape("v_cache", v, k.shape)
    if nhd:
        batch, capacity, hkv, dk = k.shape
    else:
        batch, hkv, capacity, dk = k.shape
    _check_heads(batch, hq, hkv, dk, "k_cache", qb, d)
    V.require_shape("lens", lens, (qb,))
    return capacity, hkv


def _page_pool(k_name, kp, v_name, vp):
    """(block_size, Hkv, D) of NHD page pools [num_blocks, block_size, Hkv, D] after the shape checks."""
    if len(kp.shape) != 4:
        raise ValueError("%s: expected [num_blocks, block_size, Hkv, D], got shape %s" % (k_name, tuple(kp.shape)))
    V.require_shape(v_name, vp, kp.shape)
    _, page, hkv, d = kp.shape
    if page not in PAGE_SIZES:
        raise ValueError("%s: block size (dim 1) must be one of %s, got %d" % (k_name, PAGE_SIZES, page))
    return page, hkv, d


def _check_block_table(block_table, batch):
    if len(block_table.shape) != 2 or block_table.shape[0] != batch:
        raise ValueError("block_table: expected shape [B=%d, max_blocks], got %s" % (batch, tuple(block_table.shape)))


def _paged_shapes(q, kp, vp, block_table, lens):
    qb, hq, d = _q_tokens(q)
    page, hkv, dk = _page_pool("k_pages", kp, "v_pages", vp)
    _check_heads(None, hq, hkv, dk, "k_pages", qb, d)
    _check_block_table(block_table, qb)
    V.require_shape("lens", lens, (qb,))
    return block_table.shape[1] * page, hkv, page


def _append_shapes(k, v, k_new, v_new, lens, paged, nhd):
    if paged:
        _, hkv, d = _page_pool("k_pages", k, "v_pages", v)
        batch = None
    else:
        if len(k.shape) != 4:
            raise ValueError("k_cache: expected a 4-d cache, got shape %s" % (tuple(k.shape),))
        V.require_shape("v_cache", v, k.shape)
        if nhd:
            batch, _, hkv, d = k.shape
        else:
            batch, hkv, _, d = k.shape
    if len(k_new.shape) != 3:
        raise ValueError("k_new: expected shape [B, Hkv, D] (one token per sequence), got %s" % (tuple(k_new.shape),))
    if (batch is not None and k_new.shape[0] != batch) or tuple(k_new.shape[1:]) != (hkv, d):
        raise ValueError("k_new: expected shape %s, got %s" % (
            ((batch if batch is not None else k_new.shape[0]), hkv, d), tuple(k_new.shape)))
    V.require_shape("v_new", v_new, k_new.shape)
    V.require_shape("lens", lens, (k_new.shape[0],))


def _check_cache_dtype(name, t, want):
    if t.dtype in _FP8:
        raise TypeError("%s: FP8 KV caches are not supported yet (got %s); use bf16, fp16 or fp32 caches"
                        % (name, _name(t.dtype)))
    if t.dtype != want:
        raise TypeError("%s: expected dtype %s (that of q / the cache), got %s" % (name, _name(want), _name(t.dtype)))


def _check_tensors(floats, ints, out=None):
    """floats: [(name, tensor)] sharing the first one's float dtype; ints: [(name, tensor)] int32
    and 1-element-stride contiguous; all on the first tensor's device; last dims contiguous."""
    name0, t0 = floats[0]
    for name, t in floats + ints:
        V.require_tensor(name, t)
    V.require_device_family(name0, t0)
    if t0.dtype in _FP8:
        raise TypeError("%s: FP8 is not supported yet (got %s)" % (name0, _name(t0.dtype)))
    V.require_float_dtype(name0, t0)
    V.require_same_device(floats + ints + ([("out", out)] if out is not None else []))
    for name, t in floats[1:]:
        _check_cache_dtype(name, t, t0.dtype)
    for name, t in ints:
        if t.dtype != torch.int32:
            raise TypeError("%s: expected dtype int32, got %s" % (name, _name(t.dtype)))
        if t.dim() >= 1 and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError("%s: the last dimension must be contiguous (stride 1), got stride %d"
                             % (name, t.stride(-1)))
    for name, t in floats:
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError("%s: the last dimension must be contiguous (stride 1), got stride %d"
                             % (name, t.stride(-1)))


def _check_out(out, q):
    if out is None:
        return
    V.require_tensor("out", out)
    if out.dtype != q.dtype:
        raise TypeError("out: expected dtype %s (that of q), got %s" % (_name(q.dtype), _name(out.dtype)))
    V.require_shape("out", out, q.shape)
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError("out: the last dimension must be contiguous (stride 1), got stride %d" % out.stride(-1))
    V.require_distinct_elements("out", out)


def _check_arrays(floats, ints, out=None):
    for name, a in floats + ([("out", out)] if out is not None else []):
        if not isinstance(a, np.ndarray):
            raise TypeError("%s: expected a numpy.ndarray like %s, got %s" % (name, floats[0][0], type(a).__name__))
        if a.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError("%s: expected a float16/float32/float64 array, got %s" % (name, a.dtype))
    for name, a in ints:
        if not isinstance(a, np.ndarray):
            raise TypeError("%s: expected a numpy.ndarray like %s, got %s" % (name, floats[0][0], type(a).__name__))
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError("%s: expected an integer array, got %s" % (name, a.dtype))


def _index_values(lens, capacity, block_table=None, page_size=1, num_pages=0, append=False):
    """The host-side range check of lens (and the block-table entries they use)."""
    lens = torch.as_tensor(lens)
    if lens.numel() == 0:
        return
    lo, hi = (int(x) for x in torch.stack(torch.aminmax(lens.to(torch.int64))).tolist())
    if append:
        if lo < 0 or hi >= capacity:
            raise ValueError("lens: kv_append writes position lens[b], so values must lie in [0, T=%d); got values "
                             "in [%d, %d]" % (capacity, lo, hi))
    elif lo < 0 or hi > capacity:
        raise ValueError("lens: values must lie in [0, T=%d]; got values in [%d, %d]" % (capacity, lo, hi))
    if block_table is not None:
        _block_table_values(block_table, lens, page_size, num_pages, append)


def _block_table_values(block_table, lens, page_size, num_pages, append=False, used_by="lens[%d] = %d"):
    """The host-side range check of the block-table entries that sequences of lens tokens use
    (append: position lens[b] too); used_by names a sequence's length in the message."""
    bt = torch.as_tensor(block_table).to(torch.int64)
    lens64 = torch.as_tensor(lens).to(device=bt.device, dtype=torch.int64)
    used_blocks = lens64 // page_size + 1 if append else (lens64 + page_size - 1) // page_size
    used = torch.arange(bt.shape[1], device=bt.device)[None, :] < used_blocks[:, None]
    bad = used & ((bt < 0) | (bt >= num_pages))
    if bool(bad.any()):
        b, i = (int(x) for x in bad.nonzero()[0].tolist())
        raise ValueError("block_table: entry [%d, %d] = %d lies outside [0, num_blocks=%d) and is used (%s)"
                         % ((b, i, int(bt[b, i]), num_pages) + (used_by % (b, int(lens64[b])),)))


def _device_check_indices(*args, **kwargs):
    """FRAY_CHECK_INDICES=1 on CUDA tensors: the range checks, at the cost of a host sync."""
    V.device_index_check("lens / block_table", lambda: _index_values(*args, **kwargs))


def _cpu_backend(backend, device):
    if backend not in ("auto", "reference"):
        raise ValueError("backend: %r needs CUDA tensors; the inputs are on %s (use 'reference' or 'auto')"
                         % (backend, device))


# ---------------------------------------------------------------------------------------------
# GPU implementations: launch plans (fray._plan), built once per call signature; the custom ops
# (what a torch.compile'd graph calls) use the same plans under keys of their own

def _three(t):
    return t if t.dim() == 3 else t.select(2, 0)


def _cache_dims(paged, nhd):
    """The cache dims holding (batch or page, kv head, token or token-in-page)."""
    return (0, 2, 1) if paged or nhd else (0, 1, 2)


def _strides(t, dims):
    """t's strides along dims; 0 along extent-1 dims (never stepped, so their stride is free)."""
    return tuple(0 if t.shape[d] == 1 else t.stride(d) for d in dims)


@functools.lru_cache(maxsize=1024)
def _cuda_split_size(dtype_code, head_dim, group, batch, hkv, capacity, num_splits, num_sms, paged):
    return B.load_extension(FAMILY).decode_split_size(dtype_code, head_dim, group, batch, hkv, capacity,
                                                      num_splits, num_sms, paged)


class _DecodePlan:
    """One decode signature's launch: backend, cache geometry, strides and the split plan fixed.
    Per call: FRAY_CHECK_INDICES, and the caches' 16-byte address alignment the CUDA kernels need
    (an address is no part of a signature; an unaligned one goes to Triton, or raises for
    backend='cuda', exactly as a full call would)."""

    __slots__ = ("op", "be", "backend", "paged", "page", "hkv", "capacity", "dims", "dev", "num_splits",
                 "scale", "ks", "vs", "strides16", "cuda_args", "split", "splits", "q_shape", "num_sms")

    def __call__(self, q, k, v, lens, block_table, out, lse):
        """lse: the caller's [B, Hq] fp32 tensor, or None when the caller does not return it (the
        CUDA path then keeps it in its one scratch allocation)."""
        if env.check_indices():  # here rather than in the wrapper: compiled graphs check too
            _device_check_indices(lens, self.capacity, block_table, self.page, k.shape[0])
        if self.capacity == 0:
            _three(out).zero_()
            if lse is not None:
                lse.fill_(float("-inf"))
            return
        if self.be == "cuda":
            if self.strides16 and k.data_ptr() % 16 == 0 and v.data_ptr() % 16 == 0:
                self._cuda(q, k, v, lens, block_table, out, lse)
                return
            if self.backend == "cuda":
                names = "k_pages, v_pages" if self.paged else "k_cache, v_cache"
                raise ValueError("%s: backend='cuda' copies K/V rows in 16-byte pieces: the caches need 16-byte "
                                 "aligned pointers and strides (got data_ptr %% 16 = %d / %d, strides %s / %s); use "
                                 "backend='triton' or 'auto'" % (names, k.data_ptr() % 16, v.data_ptr() % 16,
                                                                 tuple(k.stride()), tuple(v.stride())))
        self._triton(q, k, v, lens, block_table, out, lse)

    def _cuda(self, q, k, v, lens, block_table, out, lse):
        # One fp32 scratch allocation per call (from the caching allocator; a graph's pool while
        # capturing) holds what the caller does not keep: the combine's inputs po [B, Hq, splits, D]
        # and pl [B, Hq, splits] when splits > 1, and lse [B, Hq] when it is not returned. Passed
        # as addresses into it (the binder takes ints), so no view is built per call.
        batch, hq, d = self.q_shape
        n_po = batch * hq * self.splits * d if self.splits > 1 else 0
        n_pl = batch * hq * self.splits if self.splits > 1 else 0
        n_lse = batch * hq if lse is None else 0
        po = pl = None
        ws = None
        if n_po + n_lse:
            ws = torch.empty(n_po + n_pl + n_lse, dtype=torch.float32, device=q.device)
            base = ws.data_ptr()
            if n_po:
                po, pl = base, base + 4 * n_po
            if n_lse:
                lse = base + 4 * (n_po + n_pl)
        B.load_extension(FAMILY).decode((q, k, v, lens, block_table, out, lse, po, pl), self.cuda_args,
                                        (self.scale,), self.dev, B.current_stream(q.device))
        del ws  # freed to the caching allocator after the launch is enqueued (stream-ordered reuse)

    def _triton(self, q, k, v, lens, block_table, out, lse):
        from fray_triton import attention as tattn
        if lse is None:
            lse = torch.empty(self.q_shape[:2], dtype=torch.float32, device=q.device)
        q3, o3 = _three(q), _three(out)
        ks, vs = tuple(k.stride(i) for i in self.dims), tuple(v.stride(i) for i in self.dims)
        with torch.cuda.device(q.device):
            tattn.decode(q3, k, v, lens, block_table, o3, lse, self.scale,
                         q_strides=(q3.stride(0), q3.stride(1)), k_strides=ks, v_strides=vs,
                         bt_stride=block_table.stride(0) if block_table is not None else 0,
                         out_strides=(o3.stride(0), o3.stride(1)), lse_stride=lse.stride(0),
                         n_kv_heads=self.hkv, capacity=self.capacity, page_size=self.page,
                         num_splits=self.num_splits or None, num_sms=self.num_sms)


def _decode_plan(op, q, k, v, block_table, out, lse, scale, nhd, num_splits, backend):
    q3, o3 = _three(q), _three(out)
    if q3.shape[0] == 0:
        return _no_decode
    p = _DecodePlan()
    p.op, p.backend, p.scale, p.num_splits = op, backend, scale, num_splits
    p.be = B.resolve(op, FAMILY, backend, q.device)
    p.paged = block_table is not None
    p.dims = _cache_dims(p.paged, nhd)
    if p.paged:
        p.page, p.hkv = k.shape[1], k.shape[2]
        p.capacity = block_table.shape[1] * p.page
    elif nhd:
        p.page, p.capacity, p.hkv = 1, k.shape[1], k.shape[2]
    else:
        p.page, p.hkv, p.capacity = 1, k.shape[1], k.shape[2]
    p.dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    p.num_sms = B.num_sms(p.dev)
    p.q_shape = tuple(q3.shape)  # (batch, hq, d)
    p.splits = 1
    p.strides16 = False
    if p.be == "cuda" and p.capacity > 0:
        p.ks, p.vs = _strides(k, p.dims), _strides(v, p.dims)
        esz = k.element_size()
        p.strides16 = all(st * esz % 16 == 0 for st in p.ks + p.vs)
        batch, hq, d = q3.shape
        code = V.DTYPE_CODES[q3.dtype]
        p.split = _cuda_split_size(code, d, hq // p.hkv, batch, p.hkv, p.capacity, num_splits, p.num_sms, p.paged)
        p.splits = -(-p.capacity // p.split)
        # the launcher's int slots (cuda/attention/attention.h)
        p.cuda_args = (q3.stride(0), q3.stride(1)) + p.ks + p.vs + (
            block_table.stride(0) if p.paged else 0, p.page, o3.stride(0), o3.stride(1), lse.stride(0), batch, hq,
            p.hkv, d, p.capacity, p.splits, p.split, code)
    return p


def _no_decode(q, k, v, lens, block_table, out, lse):
    """The plan of a decode call over an empty batch."""


def _decode_impl(op, q, k, v, lens, block_table, out, lse, scale, nhd, num_splits, backend):
    key = P.signature(op + ":op", backend, (q, k, v, lens, block_table, out, lse), (scale, nhd, num_splits))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _decode_plan(op, q, k, v, block_table, out, lse, scale, nhd,
                                                             num_splits, backend))
    plan(q, k, v, lens, block_table, out, lse)


def _append_plan(op, k, v, k_new, v_new, block_table, nhd, backend):
    """(launch(k, v, k_new, v_new, lens, block_table), capacity, page) of one append signature."""
    if k_new.shape[0] == 0 or k_new.shape[1] == 0:
        return None, 0, 1
    be = B.resolve(op, FAMILY, backend, k.device)
    dims = _cache_dims(block_table is not None, nhd)
    if block_table is not None:
        page, capacity = k.shape[1], block_table.shape[1] * k.shape[1]
    elif nhd:
        page, capacity = 1, k.shape[1]
    else:
        page, capacity = 1, k.shape[2]
    if be == "cuda":
        batch, hkv, d = k_new.shape
        dev = k.device.index if k.device.index is not None else torch.cuda.current_device()
        ks, vs, kns, vns = _strides(k, dims), _strides(v, dims), _strides(k_new, (0, 1)), _strides(v_new, (0, 1))
        bt_sb = block_table.stride(0) if block_table is not None else 0
        ints = ks + vs + kns + vns + (bt_sb, page, batch, hkv, d, capacity, V.DTYPE_CODES[k.dtype])
        fn = B.load_extension(FAMILY).kv_append

        def launch(k_, v_, kn_, vn_, lens_, bt_):
            fn((k_, v_, kn_, vn_, lens_, bt_), ints, (), dev, B.current_stream(k_.device))
        return launch, capacity, page
    from fray_triton import attention as tattn
    ks, vs = tuple(k.stride(i) for i in dims), tuple(v.stride(i) for i in dims)
    bt_sb = block_table.stride(0) if block_table is not None else 0

    def launch(k_, v_, kn_, vn_, lens_, bt_):
        with torch.cuda.device(k_.device):
            tattn.append(k_, v_, kn_, vn_, lens_, bt_, k_strides=ks, v_strides=vs, bt_stride=bt_sb,
                         capacity=capacity, page_size=page)
    return launch, capacity, page


def _append_launch(plan, k, v, k_new, v_new, lens, block_table):
    launch, capacity, page = plan
    if launch is None:
        return
    if env.check_indices():
        _device_check_indices(lens, capacity, block_table, page, k.shape[0], append=True)
    if capacity == 0:
        return
    launch(k, v, k_new, v_new, lens, block_table)


def _append_impl(op, k, v, k_new, v_new, lens, block_table, nhd, backend):
    key = P.signature(op + ":op", backend, (k, v, k_new, v_new, lens, block_table), (nhd,))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _append_plan(op, k, v, k_new, v_new, block_table, nhd, backend))
    _append_launch(plan, k, v, k_new, v_new, lens, block_table)


@P.custom_op("fray::decode_attention", mutates_args=("out", "lse"))
def _decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor,
               out: torch.Tensor, lse: torch.Tensor, scale: float, nhd: bool, num_splits: int,
               backend: str) -> None:
    _decode_impl("decode_attention", q, k_cache, v_cache, lens, None, out, lse, scale, nhd, num_splits, backend)


@P.custom_op("fray::paged_decode_attention", mutates_args=("out", "lse"))
def _paged_decode_op(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                     lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, scale: float, num_splits: int,
                     backend: str) -> None:
    _decode_impl("paged_decode_attention", q, k_pages, v_pages, lens, block_table, out, lse, scale, False,
                 num_splits, backend)


@P.custom_op("fray::kv_append", mutates_args=("k_cache", "v_cache"))
def _append_op(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
               lens: torch.Tensor, nhd: bool, backend: str) -> None:
    _append_impl("kv_append", k_cache, v_cache, k_new, v_new, lens, None, nhd, backend)


@P.custom_op("fray::kv_append_paged", mutates_args=("k_pages", "v_pages"))
def _append_paged_op(k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                     k_new: torch.Tensor, v_new: torch.Tensor, lens: torch.Tensor, backend: str) -> None:
    _append_impl("kv_append_paged", k_pages, v_pages, k_new, v_new, lens, block_table, False, backend)


for _op in (_decode_op, _paged_decode_op, _append_op, _append_paged_op):
    _op.register_fake(lambda *args, **kwargs: None)


_compiling = P.compiling


# ---------------------------------------------------------------------------------------------
# public API

def _cpu_decode(q, out, return_lse, result):
    """Round the float64 reference result to q's dtype and type; fill `out` when given."""
    y, lse = result[0], result[1]
    if len(q.shape) == 4:
        y = y[:, :, None, :]
    if V.is_array(q):
        y = C.like(y, q)
        lse = np.asarray(lse).astype(np.float64 if q.dtype == np.float64 else np.float32)
        if out is not None:
            out[...] = y
            y = out
    else:
        y = C.like(y, q)
        lse = torch.from_numpy(np.asarray(lse)).to(torch.float32)
        if out is not None:
            out.copy_(y)
            y = out
    return (y, lse) if return_lse else y


def _q3_f64(q):
    a = C.to_f64(q)
    return a[:, :, 0] if a.ndim == 4 else a


def decode_attention(q, k_cache, v_cache, lens, *, kv_layout="HND", scale=None, out=None, return_lse=False,
                     num_splits=None, backend="auto", window_left=None, logits_soft_cap=None, sinks=None):
    """Single-token attention over a contiguous KV cache, split-KV (flash decoding) on the GPU.

    q: [B, Hq, D] (or [B, Hq, 1, D]); k_cache, v_cache: [B, Hkv, T, D] (kv_layout="HND") or
    [B, T, Hkv, D] ("NHD"), q's dtype (fp32/fp16/bf16; FP8 refused), last dim contiguous, other
    strides free (slices of bigger caches are fine). Hq / Hkv in 1..16 (GQA), D in 64, 128, 256.
    lens: int32 [B] on q's device; sequence b attends to positions [0, lens[b]); lens[b] = 0 gives
    a zero row and lse = -inf. scale: default 1/sqrt(D). Softmax in fp32, one rounding to q's dtype.
    Returns out (q's shape and dtype; `out` if given) or (out, lse) with return_lse: lse fp32
    [B, Hq], natural log of sum exp(scale q.k).
    num_splits: KV splits per sequence (None: chosen on the host from T, B*Hkv and the SM count,
    never from lens; splits that start at or past lens[b] exit at once). Deterministic.
    Trust boundary (see the module docstring): lens is not read on the host; the kernel clamps it
    to [0, T]; FRAY_CHECK_INDICES=1 validates 0 <= lens <= T with a host sync (ValueError; a
    RuntimeError during CUDA-graph capture). Sliding windows, soft-capping and sinks are refused.
    """
    if not _compiling():
        key = P.signature("decode_attention", backend, (q, k_cache, v_cache, lens, out),
                          (kv_layout, scale, return_lse, num_splits, window_left, logits_soft_cap, sinks))
        plan = P.PLANS.get(key)
        if plan is not None:
            return _decode_launch(plan, q, k_cache, v_cache, lens, None, out, return_lse)
    V.require_backend(backend, B.BACKENDS)
    _refuse_features(window_left, logits_soft_cap, sinks)
    nhd = _check_layout(kv_layout)
    if not isinstance(return_lse, bool):
        raise TypeError("return_lse: expected a bool, got %s" % type(return_lse).__name__)
    splits = _check_num_splits(num_splits)
    floats, ints = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)], [("lens", lens)]
    if V.is_array(q):
        _check_arrays(floats, ints, out)
    else:
        _check_tensors(floats, ints, out)
        _check_out(out, q)
    capacity, _ = _decode_shapes(q, k_cache, v_cache, lens, nhd)
    if V.is_array(out):
        V.require_shape("out", out, q.shape)
    scale = _check_scale(scale, q.shape[-1])
    if V.is_array(q) or q.device.type == "cpu":
        if not V.is_array(q):
            _cpu_backend(backend, q.device)
        _index_values(lens, capacity)
        result = ref.decode_attention(_q3_f64(q), C.to_f64(k_cache), C.to_f64(v_cache), C.to_f64(lens).astype(np.int64),
                                      scale, kv_layout)
        return _cpu_decode(q, out, return_lse, result)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if _compiling():
        torch.ops.fray.decode_attention(q, k_cache, v_cache, lens, out, lse, scale, nhd, splits, backend)
        return (out, lse) if return_lse else out
    plan = P.PLANS.put(key, _decode_plan("decode_attention", q, k_cache, v_cache, None, out, lse, scale, nhd, splits,
                                         backend))
    plan(q, k_cache, v_cache, lens, None, out, lse)
    return (out, lse) if return_lse else out


def _decode_launch(plan, q, k, v, lens, block_table, out, return_lse):
    """A cached decode plan's call: allocate what the caller did not pass, launch (an lse that is
    not returned lives in the plan's scratch allocation)."""
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    plan(q, k, v, lens, block_table, out, lse)
    return (out, lse) if return_lse else out


def paged_decode_attention(q, k_pages, v_pages, block_table, lens, *, scale=None, out=None, return_lse=False,
                           num_splits=None, backend="auto", window_left=None, logits_soft_cap=None, sinks=None):
    """Single-token attention over a paged KV cache.

    k_pages, v_pages: [num_blocks, block_size, Hkv, D] (NHD pages as in vLLM / FlashInfer), block
    size 1, 16, 32, 64 or 128, q's dtype, last dim contiguous. block_table: int32 [B, max_blocks]
    (last dim contiguous): token t of sequence b is k_pages[block_table[b, t // block_size],
    t % block_size]. The capacity T is max_blocks * block_size. Everything else as in
    decode_attention. Trust boundary: block_table entries for the blocks below lens[b] are used
    as given (FRAY_CHECK_INDICES=1 checks them, and lens, with a host sync).
    """
    if not _compiling():
        key = P.signature("paged_decode_attention", backend, (q, k_pages, v_pages, block_table, lens, out),
                          (scale, return_lse, num_splits, window_left, logits_soft_cap, sinks))
        plan = P.PLANS.get(key)
        if plan is not None:
            return _decode_launch(plan, q, k_pages, v_pages, lens, block_table, out, return_lse)
    V.require_backend(backend, B.BACKENDS)
    _refuse_features(window_left, logits_soft_cap, sinks)
    if not isinstance(return_lse, bool):
        raise TypeError("return_lse: expected a bool, got %s" % type(return_lse).__name__)
    splits = _check_num_splits(num_splits)
    floats = [("q", q), ("k_pages", k_pages), ("v_pages", v_pages)]
    ints = [("block_table", block_table), ("lens", lens)]
    if V.is_array(q):
        _check_arrays(floats, ints, out)
    else:
        _check_tensors(floats, ints, out)
        _check_out(out, q)
    capacity, _, page = _paged_shapes(q, k_pages, v_pages, block_table, lens)
    if V.is_array(out):
        V.require_shape("out", out, q.shape)
    scale = _check_scale(scale, q.shape[-1])
    if V.is_array(q) or q.device.type == "cpu":
        if not V.is_array(q):
            _cpu_backend(backend, q.device)
        _index_values(lens, capacity, block_table, page, k_pages.shape[0])
        result = ref.paged_decode_attention(_q3_f64(q), C.to_f64(k_pages), C.to_f64(v_pages),
                                            C.to_f64(block_table).astype(np.int64),
                                            C.to_f64(lens).astype(np.int64), scale)
        return _cpu_decode(q, out, return_lse, result)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if _compiling():
        torch.ops.fray.paged_decode_attention(q, k_pages, v_pages, block_table, lens, out, lse, scale, splits,
                                              backend)
        return (out, lse) if return_lse else out
    plan = P.PLANS.put(key, _decode_plan("paged_decode_attention", q, k_pages, v_pages, block_table, out, lse, scale,
                                         False, splits, backend))
    plan(q, k_pages, v_pages, lens, block_table, out, lse)
    return (out, lse) if return_lse else out


def kv_append(k_cache, v_cache, k_new, v_new, lens, *, kv_layout="HND", backend="auto"):
    """In place: k_cache[b, :, lens[b]] = k_new[b] (HND; k_cache[b, lens[b]] for NHD), same for v.

    k_new, v_new: [B, Hkv, D] in the caches' dtype, last dim contiguous. lens: int32 [B] on the
    caches' device, left unchanged (advance it yourself after the step). No host reads: CUDA-graph
    capturable. Trust boundary: a position outside [0, T) is not written; FRAY_CHECK_INDICES=1
    raises ValueError for it instead (host sync). Returns (k_cache, v_cache).
    """
    if not _compiling():
        key = P.signature("kv_append", backend, (k_cache, v_cache, k_new, v_new, lens), (kv_layout,))
        plan = P.PLANS.get(key)
        if plan is not None:
            _append_launch(plan, k_cache, v_cache, k_new, v_new, lens, None)
            return k_cache, v_cache
    V.require_backend(backend, B.BACKENDS)
    nhd = _check_layout(kv_layout)
    floats = [("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new)]
    if V.is_array(k_cache):
        _check_arrays(floats, [("lens", lens)])
    else:
        _check_tensors(floats, [("lens", lens)])
    _append_shapes(k_cache, v_cache, k_new, v_new, lens, False, nhd)
    capacity = k_cache.shape[1] if nhd else k_cache.shape[2]
    if V.is_array(k_cache) or k_cache.device.type == "cpu":
        if not V.is_array(k_cache):
            _cpu_backend(backend, k_cache.device)
        _index_values(lens, capacity, append=True)
        ref.kv_append(k_cache, v_cache, k_new, v_new, C.to_f64(lens).astype(np.int64), kv_layout)
        return k_cache, v_cache
    if _compiling():
        torch.ops.fray.kv_append(k_cache, v_cache, k_new, v_new, lens, nhd, backend)
    else:
        _append_launch(P.PLANS.put(key, _append_plan("kv_append", k_cache, v_cache, k_new, v_new, None, nhd, backend)),
                       k_cache, v_cache, k_new, v_new, lens, None)
    return k_cache, v_cache


def kv_append_paged(k_pages, v_pages, block_table, k_new, v_new, lens, *, backend="auto"):
    """In place: the token at position lens[b] of sequence b, page block_table[b, lens[b] //
    block_size], slot lens[b] % block_size, gets k_new[b] / v_new[b] ([B, Hkv, D], the pages'
    dtype). Pages and block_table as in paged_decode_attention; lens unchanged; graph-capturable.
    Trust boundary as in kv_append, plus the block-table entry, used as given. Returns (k_pages, v_pages).
    """
    if not _compiling():
        key = P.signature("kv_append_paged", backend, (k_pages, v_pages, block_table, k_new, v_new, lens))
        plan = P.PLANS.get(key)
        if plan is not None:
            _append_launch(plan, k_pages, v_pages, k_new, v_new, lens, block_table)
            return k_pages, v_pages
    V.require_backend(backend, B.BACKENDS)
    floats = [("k_pages", k_pages), ("v_pages", v_pages), ("k_new", k_new), ("v_new", v_new)]
    ints = [("block_table", block_table), ("lens", lens)]
    if V.is_array(k_pages):
        _check_arrays(floats, ints)
    else:
        _check_tensors(floats, ints)
    _append_shapes(k_pages, v_pages, k_new, v_new, lens, True, False)
    _check_block_table(block_table, k_new.shape[0])
    page = k_pages.shape[1]
    capacity = block_table.shape[1] * page
    if V.is_array(k_pages) or k_pages.device.type == "cpu":
        if not V.is_array(k_pages):
            _cpu_backend(backend, k_pages.device)
        _index_values(lens, capacity, block_table, page, k_pages.shape[0], append=True)
        ref.kv_append_paged(k_pages, v_pages, C.to_f64(block_table).astype(np.int64), k_new, v_new,
                            C.to_f64(lens).astype(np.int64))
        return k_pages, v_pages
    if _compiling():
        torch.ops.fray.kv_append_paged(k_pages, v_pages, block_table, k_new, v_new, lens, backend)
    else:
        plan = P.PLANS.put(key, _append_plan("kv_append_paged", k_pages, v_pages, k_new, v_new, block_table, False,
                                             backend))
        _append_launch(plan, k_pages, v_pages, k_new, v_new, lens, block_table)
    return k_pages, v_pages


# ---------------------------------------------------------------------------------------------
# prefill attention

def _prefill_shapes(q, k, v, cu_q, cu_k, block_table):
    """(varlen, batch, block size of paged K/V or None) after the shape checks of every form."""
    paged = block_table is not None
    if paged and cu_q is None and cu_k is None:
        raise ValueError("block_table: only the varlen form takes it (q [total_q, Hq, D] with cu_seqlens_q and "
                         "cu_seqlens_k); got q of shape %s without cu_seqlens" % (tuple(q.shape),))
    if (cu_q is None) != (cu_k is None):
        given, missing = ("cu_seqlens_q", "cu_seqlens_k") if cu_k is None else ("cu_seqlens_k", "cu_seqlens_q")
        raise ValueError("%s: expected a tensor with %s (the varlen form takes both; the batched form "
                         "[B, S, H, D] neither%s), got None" % (
                             missing, given, "; with block_table, sequence b's key count is cu_seqlens_k[b + 1] - "
                             "cu_seqlens_k[b]" if paged else ""))
    varlen = cu_q is not None
    page = None
    if varlen:
        if len(q.shape) != 3:
            raise ValueError("q: the varlen form (cu_seqlens given) takes q [total_q, Hq, D], got shape %s"
                             % (tuple(q.shape),))
        if len(cu_q.shape) != 1 or cu_q.shape[0] < 1:
            raise ValueError("cu_seqlens_q: expected shape [B + 1] (sequence b's queries are rows "
                             "cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q), got %s" % (tuple(cu_q.shape),))
        V.require_shape("cu_seqlens_k", cu_k, cu_q.shape)
        batch = cu_q.shape[0] - 1
        if paged:
            page = _page_pool("k", k, "v", v)[0]
            _check_block_table(block_table, batch)
        elif len(k.shape) != 3:
            raise ValueError("k: the varlen form (cu_seqlens given) takes k [total_k, Hkv, D] (or page pools "
                             "[num_blocks, block_size, Hkv, D] with block_table), got shape %s" % (tuple(k.shape),))
    else:
        if len(q.shape) != 4:
            raise ValueError("q: expected [B, Sq, Hq, D] (or [total_q, Hq, D] with cu_seqlens_q / cu_seqlens_k), "
                             "got shape %s" % (tuple(q.shape),))
        if len(k.shape) != 4 or k.shape[0] != q.shape[0]:
            raise ValueError("k: expected [B=%d, Sk, Hkv, D] like q [B, Sq, Hq, D], got shape %s"
                             % (q.shape[0], tuple(k.shape)))
        batch = q.shape[0]
    if not paged:
        V.require_shape("v", v, k.shape)
    hq, d = q.shape[-2], q.shape[-1]
    hkv, dk = k.shape[-2], k.shape[-1]
    if dk != d:
        raise ValueError("k: head dim %d differs from q's %d" % (dk, d))
    if d not in HEAD_DIMS:
        raise ValueError("q: head dim must be one of %s, got %d" % (HEAD_DIMS, d))
    if hkv < 1 or hq % hkv:
        raise ValueError("q: the query head count Hq=%d must be a multiple of k's kv head count Hkv=%d (GQA / MQA)"
                         % (hq, hkv))
    return varlen, batch, page


def _check_paged_capacity(max_k, block_table, page):
    """max_seqlen_k against what one block-table row holds."""
    capacity = block_table.shape[1] * page
    if max_k is not None and max_k > capacity:
        raise ValueError("max_seqlen_k: %d is more keys than a block_table row holds (max_blocks * block size = "
                         "%d * %d = %d)" % (max_k, block_table.shape[1], page, capacity))


def _check_max_seqlen(name, value, varlen, on_gpu):
    if value is None:
        if varlen and on_gpu:
            raise ValueError("%s: the varlen form on CUDA tensors needs the longest sequence's length as a Python "
                             "int (cu_seqlens stays on the device: nothing is read on the host), got None" % name)
        return None
    if not varlen:
        raise ValueError("%s: only the varlen form (cu_seqlens given) takes it; the batched form's lengths are "
                         "dim 1 of q and k (got %r)" % (name, value))
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("%s: expected a Python int, got %s" % (name, type(value).__name__))
    if value < 0:
        raise ValueError("%s: expected a value >= 0, got %d" % (name, value))
    return value


def _cu_values(cu_q, cu_k, total_q, total_k, max_q, max_k, block_table=None, page=1):
    """The host-side check of cu_seqlens: starts at 0, non-decreasing, ends within the packed rows,
    no sequence longer than max_seqlen (when given). Paged K/V (block_table given; total_k is then
    the pool's page count): cu_seqlens_k counts keys rather than indexing rows of k, each
    sequence's count fits its table row (max_blocks * page) and the entries its keys use lie in
    [0, total_k)."""
    paged = block_table is not None
    for name, cu, total, mx, mname, tname in (("cu_seqlens_q", cu_q, total_q, max_q, "max_seqlen_q", "q"),
                                              ("cu_seqlens_k", cu_k, None if paged else total_k, max_k,
                                               "max_seqlen_k", "k")):
        c = [int(x) for x in torch.as_tensor(cu).to("cpu", torch.int64).tolist()]
        if c[0] != 0:
            raise ValueError("%s: expected entry 0 to be 0, got %d" % (name, c[0]))
        for b in range(len(c) - 1):
            if c[b + 1] < c[b]:
                raise ValueError("%s: expected non-decreasing offsets; entry %d = %d < entry %d = %d"
                                 % (name, b + 1, c[b + 1], b, c[b]))
            if mx is not None and c[b + 1] - c[b] > mx:
                raise ValueError("%s: sequence %d has %d tokens, more than %s=%d"
                                 % (name, b, c[b + 1] - c[b], mname, mx))
        if total is not None and c[-1] > total:
            raise ValueError("%s: the last offset %d lies past %s's %d rows" % (name, c[-1], tname, total))
    if paged:
        counts = [c[b + 1] - c[b] for b in range(len(c) - 1)]
        capacity = block_table.shape[1] * page
        for b, n in enumerate(counts):
            if n > capacity:
                raise ValueError("cu_seqlens_k: sequence %d has %d keys, more than a block_table row holds "
                                 "(max_blocks * block size = %d * %d = %d)" % (b, n, block_table.shape[1], page,
                                                                               capacity))
        _block_table_values(block_table, counts, page, total_k, used_by="sequence %d has %d keys")


def _device_check_cu(cu_q, cu_k, total_q, total_k, max_q, max_k, block_table=None, page=1):
    """FRAY_CHECK_INDICES=1 on CUDA tensors: _cu_values at the cost of a host sync."""
    V.device_index_check("cu_seqlens" if block_table is None else "cu_seqlens / block_table", _cu_values, cu_q, cu_k,
                         total_q, total_k, max_q, max_k, block_table, page)


def _prefill_lse_shape(q, varlen):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


# The CUTLASS element types of the JIT-compiled attention kernels (prefill, MLA).
_CUTLASS_T = {torch.bfloat16: "cutlass::bfloat16_t", torch.float16: "cutlass::half_t"}
# The CUDA prefill kernel (cuda/attention/prefill_sm90.cuh): TMA + wgmma, a producer warpgroup
# and two consumer warpgroups, one JIT translation unit per (dtype, D, causal, block size). At D
# 128, 128-key tiles in two stages fill 160 KB of shared memory (Q 32 KB, K and V 64 KB each); D
# 256 takes 64-key tiles (192 KB).
# (D, causal) -> (key tile, ring stages, overlap, ping-pong): the fastest of the schedules in
# cuda/attention/prefill_sm90.cuh as measured at B2 Hq32 Hkv8 S8192 / S16384 (bench/NOTES.md;
# bench/micro/prefill_schedules.py sweeps them). The paged kernel takes the same tile where it is
# whole pages of 16-128 keys or lies within one (the header's static_assert), else the 128-key
# tile of PREFILL_CUDA_PAGED_TILE.
PREFILL_CUDA_TILES = {
    (64, False): (128, 3, True, False), (64, True): (192, 2, True, True),
    (128, False): (128, 2, True, False), (128, True): (128, 2, True, True),
    (256, False): (64, 2, True, True), (256, True): (64, 2, True, True),
}
PREFILL_CUDA_PAGED_TILE = (128, 2, True, True)
# The persistent grid (one CTA per SM walking the query tiles, the ones that see the most keys
# first: cuda/attention/prefill_sm90.cuh, kPersistent) or one CTA per tile.
PREFILL_CUDA_PERSISTENT = False


def prefill_cuda_tile(d, causal, page=0):
    """(key tile, stages, overlap, ping-pong) of the CUDA prefill kernel for head dim d."""
    tile = PREFILL_CUDA_TILES[(d, causal)]
    box = min(page, tile[0])
    if page and (tile[0] % box or page % box):
        return PREFILL_CUDA_PAGED_TILE
    return tile


def prefill_cuda_source(dtype, d, causal, page=0, persistent=None):
    """(name, translation unit) of the CUDA prefill kernel for one (dtype, head dim, causal, page
    size of paged K/V: 0 for contiguous K/V, persistent grid: PREFILL_CUDA_PERSISTENT when None)."""
    persistent = PREFILL_CUDA_PERSISTENT if persistent is None else persistent
    bn, stages, overlap, pingpong = prefill_cuda_tile(d, causal, page)
    name = "prefill_sm90_%s_d%d_n%d_s%d%s%s%s%s_%s" % (
        V.DTYPE_NAMES[dtype], d, bn, stages, "_ov" if overlap else "", "_pp" if pingpong else "",
        "_page%d" % page if page else "", "_pers" if persistent else "", "causal" if causal else "full")
    cpp = ("false", "true")
    src = ('#include "cuda/attention/prefill_sm90.cuh"\n'
           "using Config = fray::attention::PrefillConfig<%s, %d, %d, %d, %s, %s, %s%s>;\nFRAY_PREFILL_ENTRY(Config)\n"
           % (_CUTLASS_T[dtype], d, bn, stages, cpp[causal], cpp[overlap], cpp[pingpong],
              (", %d, true" % page) if persistent else (", %d" % page if page else "")))
    return name, src


def _prefill_cuda_layout_reason(q, k, v, out, block_table=None):
    """Why the CUDA kernel cannot take these tensors' dtype / strides / paging, or None (pointers
    are checked per call: _PrefillPlan.aligned)."""
    if block_table is not None and k.shape[1] < 16:
        return ("paged K/V with block size %d runs on Triton: the CUDA kernel loads a page as one TMA box of "
                "whole 8-row swizzle atoms (block sizes 16 to 128)" % k.shape[1])
    if q.dtype not in _CUTLASS_T:
        return "the CUDA prefill kernel takes bf16 and fp16 (got %s; fp32 runs on Triton)" % V.DTYPE_NAMES[q.dtype]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if any(st % 8 for st, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):
            return ("%s: the CUDA kernel loads by TMA, which needs strides that are multiples of 8 elements "
                    "(16 bytes); got strides %s" % (name, tuple(t.stride())))
    if any(st % 2 for st, n in zip(out.stride()[:-1], out.shape[:-1]) if n > 1):
        return "out: the CUDA kernel stores element pairs, which needs even strides; got %s" % (tuple(out.stride()),)
    return None


class _PrefillPlan:
    """One prefill signature's launch with every host-side argument fixed; per call only
    FRAY_CHECK_INDICES, the pointers' alignment (CUDA) and the data pointers."""

    __slots__ = ("varlen", "batch", "max_q", "max_k", "seqlen_k", "total_q", "total_k", "causal", "scale", "dev",
                 "strides", "empty_k", "lse_shape", "kernel", "ints", "forced", "page", "bt_stride")

    def __call__(self, q, k, v, cu_q, cu_k, block_table, out, lse):
        if self.varlen and env.check_indices():
            _device_check_cu(cu_q, cu_k, self.total_q, self.total_k, self.max_q, self.max_k, block_table, self.page)
        if self.batch == 0 or self.max_q == 0 or q.shape[-2] == 0:
            return
        if self.empty_k:  # no keys at all: every row is a zero row with lse -inf
            out.zero_()
            lse.fill_(float("-inf"))
            return
        if self.kernel is not None:
            if (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16 == 0 and out.data_ptr() % 4 == 0:
                ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                        cu_q.data_ptr() if self.varlen else 0, cu_k.data_ptr() if self.varlen else 0,
                        block_table.data_ptr() if block_table is not None else 0)
                self.kernel.launch(ptrs, self.ints, (self.scale,), self.dev, B.current_stream(q.device))
                return
            if self.forced:
                raise ValueError("q / k / v / out: backend='cuda' loads q, k and v by TMA (16-byte aligned data "
                                 "pointers) and stores out in element pairs (4-byte aligned); got pointers %#x, "
                                 "%#x, %#x, %#x (use backend='triton' or 'auto')"
                                 % (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()))
        from fray_triton import prefill_attention as tprefill
        qs, ks, vs, os_, ls = self.strides
        with torch.cuda.device(self.dev):
            tprefill.prefill(q, k, v, out, lse, cu_q, cu_k, self.scale, causal=self.causal, batch=self.batch,
                             max_seqlen_q=self.max_q, seqlen_k=self.seqlen_k, q_strides=qs, k_strides=ks,
                             v_strides=vs, out_strides=os_, lse_strides=ls, block_table=block_table,
                             bt_stride=self.bt_stride, page_size=self.page)


def _token_strides(t, varlen):
    """(batch, token, head) strides of a [T, H, D] (varlen: batch 0) or [B, S, H, D] tensor; of
    page pools [num_blocks, block_size, H, D] (varlen False): (page, token in page, head)."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def _prefill_plan(q, k, v, cu_q, block_table, out, lse, causal, max_q, max_k, scale, backend):
    be = B.resolve("prefill_attention", CUDA_FAMILIES["prefill_attention"], backend, q.device)
    p = _PrefillPlan()
    p.varlen = cu_q is not None
    paged = block_table is not None
    p.batch = cu_q.shape[0] - 1 if p.varlen else q.shape[0]
    p.max_q, p.max_k = max_q, max_k
    p.seqlen_k = 0 if p.varlen else k.shape[1]
    p.total_q, p.total_k = q.shape[0], k.shape[0]  # paged: the pool's page count
    p.page = k.shape[1] if paged else 1
    p.bt_stride = block_table.stride(0) if paged else 0
    # no keys at all (no rows, no pages, or a table of no blocks): zero rows, lse -inf, no launch
    if paged:
        p.empty_k = k.shape[0] == 0 or block_table.shape[1] == 0
    else:
        p.empty_k = k.shape[0] == 0 or (not p.varlen and k.shape[1] == 0)
    p.causal, p.scale = causal, scale
    p.dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    p.lse_shape = tuple(lse.shape)
    p.strides = (_token_strides(q, p.varlen), _token_strides(k, p.varlen and not paged),
                 _token_strides(v, p.varlen and not paged), _token_strides(out, p.varlen),
                 (0, lse.stride(0)) if p.varlen else (lse.stride(0), lse.stride(1)))
    p.kernel, p.ints, p.forced = None, None, be == "cuda" and not _auto(backend)
    if be == "cuda":
        why = _prefill_cuda_layout_reason(q, k, v, out, block_table)  # (nvcc, CUTLASS, sm_90a: checked by resolve)
        if why and p.forced:
            raise ValueError("backend='cuda' cannot run prefill_attention here: %s (use backend='triton' or 'auto')"
                             % why)
        if not why:
            from fray import jit
            name, src = prefill_cuda_source(q.dtype, q.shape[-1], causal, p.page if paged else 0)
            p.kernel = jit.build(name, src, device=p.dev)
            # A dimension of size 1 is never stepped along, so its stride is free in torch; TMA still
            # checks it: give it D (a multiple of 16 bytes). (varlen q / out / k / v: a batch of 1;
            # page pools: [pages, block size, Hkv].)
            d = q.shape[-1]
            one = (1,) if p.varlen else ()  # the varlen form's batch of one
            dims = [(q, one, p.strides[0]), (k, () if paged else one, p.strides[1]),
                    (v, () if paged else one, p.strides[2]), (out, one, p.strides[3])]
            (qb, qt, qh), (kb, kt, kh), (vb, vt, vh), (ob, ot, oh) = [
                tuple(d if n == 1 else st for st, n in zip(strides, lead + tuple(t.shape[:-1])))
                for t, lead, strides in dims]
            rows_q = q.shape[0] if p.varlen else q.shape[1]
            rows_k = k.shape[1] if paged else (k.shape[0] if p.varlen else k.shape[1])
            p.ints = ((p.batch, q.shape[-2], k.shape[-2], rows_q, rows_k, max_q, 0 if p.varlen else q.shape[1],
                       p.seqlen_k, qb, qt, qh, kb, kt, kh, vb, vt, vh, ob, ot, oh) + p.strides[4]
                      + ((p.bt_stride, block_table.shape[1], k.shape[0]) if paged else (0, 0, 0)))
    return p


def _auto(backend):
    """Whether the caller left the backend to Fray (neither backend= nor FRAY_BACKEND names one)."""
    return backend == "auto" and env.backend_override() is None


def _prefill_impl(q, k, v, cu_q, cu_k, block_table, out, lse, causal, max_q, max_k, scale, backend):
    key = P.signature("prefill_attention:op", backend, (q, k, v, cu_q, cu_k, block_table, out, lse),
                      (causal, max_q, max_k, scale))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _prefill_plan(q, k, v, cu_q, block_table, out, lse, causal, max_q,
                                                               max_k, scale, backend))
    plan(q, k, v, cu_q, cu_k, block_table, out, lse)


@P.custom_op("fray::prefill_attention", mutates_args=("out", "lse"))
def _prefill_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                cu_seqlens_k: Optional[torch.Tensor], block_table: Optional[torch.Tensor], out: torch.Tensor,
                lse: torch.Tensor, causal: bool, max_seqlen_q: int, max_seqlen_k: int, scale: float,
                backend: str) -> None:
    _prefill_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, out, lse, causal, max_seqlen_q, max_seqlen_k,
                  scale, backend)


_prefill_op.register_fake(lambda *args, **kwargs: None)


def _prefill_launch(plan, q, k, v, cu_q, cu_k, block_table, out, return_lse):
    """A cached prefill plan's call: allocate what the caller did not pass, launch."""
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=q.device)
    plan(q, k, v, cu_q, cu_k, block_table, out, lse)
    return (out, lse) if return_lse else out


def prefill_attention(q, k, v, *, causal=True, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                      max_seqlen_k=None, scale=None, return_lse=False, out=None, backend="auto", block_table=None,
                      window_left=None, logits_soft_cap=None, sinks=None):
    """Multi-token (prefill) attention on the GPU: a warp-specialised TMA + wgmma kernel (CUDA) or a
    FlashAttention-2-style Triton kernel.

    Three forms:
      varlen   q [total_q, Hq, D], k, v [total_k, Hkv, D]: every sequence's tokens packed one after
               the other; cu_seqlens_q, cu_seqlens_k int32 [B + 1] on q's device (sequence b's
               queries are rows cu_seqlens_q[b]:cu_seqlens_q[b + 1], its keys likewise);
               max_seqlen_q / max_seqlen_k: Python ints bounding the lengths (needed on CUDA
               tensors, where cu_seqlens is never read on the host; optional on the CPU).
      paged    the varlen form over a paged KV cache (prefix caching, chunked prefill): q and
               cu_seqlens_q as in varlen; k, v the page pools of paged_decode_attention,
               [num_blocks, block_size, Hkv, D] (NHD pages, block size 1, 16, 32, 64 or 128);
               block_table int32 [B, max_blocks] on q's device, last dim contiguous. Sequence b
               has n_k = cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys (cu_seqlens_k is required
               and only counts keys: it indexes no rows of k), and its key t (0 <= t < n_k) is
               k[block_table[b, t // block_size], t % block_size] (v likewise). n_k is at most
               max_seqlen_k, which must not exceed max_blocks * block_size (ValueError).
      batched  q [B, Sq, Hq, D], k, v [B, Sk, Hkv, D] (cu_seqlens, max_seqlen and block_table None).
    q, k, v: one dtype (bf16, fp16, fp32; FP8 refused), last dim contiguous, other strides free.
    Hq a multiple of Hkv (GQA / MQA: query head h reads kv head h // (Hq / Hkv)); D in 64, 128, 256.
    causal: query i of a sequence with n_q queries and n_k keys sees keys j <= i + n_k - n_q
    (aligned bottom-right: the queries are the sequence's last n_q positions, as in chunked
    prefill against a longer KV); False: every key. A query that sees no key (n_k = 0, or
    n_q > n_k under causal for the first n_q - n_k queries) gets a zero row and lse = -inf.
    scale: default 1/sqrt(D). Softmax in fp32, one rounding to q's dtype.
    Returns out (q's shape and dtype; `out` if given) or (out, lse) with return_lse: lse fp32, the
    natural log of sum_j exp(scale q.k_j), shape [Hq, total_q] (varlen, paged) or [B, Hq, Sq]
    (batched).
    Trust boundary (varlen and paged on CUDA tensors): cu_seqlens and block_table are not read on
    the host, so one launch is CUDA-graph capturable and replays with new lengths (and new table
    entries) as long as max_seqlen_q and max_seqlen_k still bound them.
    The kernel clamps offsets into the packed rows and a paged key count to [0, max_blocks *
    block_size]; block-table entries below a sequence's key count are used as given. Query rows
    past cu_seqlens_q[B] (padding of a fixed-size buffer) are not written on the GPU (zeros on the
    CPU), and queries beyond max_seqlen_q in a longer sequence are not computed.
    FRAY_CHECK_INDICES=1 checks cu_seqlens (0 first, non-decreasing, within the rows, lengths <=
    max_seqlen; paged: key counts <= max_blocks * block_size and the used block-table entries in
    [0, num_blocks)) with a host sync (ValueError; a RuntimeError during CUDA-graph capture); CPU
    calls always check them. window_left, logits_soft_cap and sinks (sliding windows,
    soft-capping, attention sinks) are refused with ValueError unless None.
    Backends: "cuda" (cuda/attention/prefill_sm90.cuh, JIT-compiled per dtype x D x causal x block
    size on first use: bf16 / fp16, q / k / v strides multiples of 16 bytes and 16-byte aligned
    pointers, out with even strides; paged K/V with block sizes 16 to 128), "triton" (every dtype,
    layout and form), "auto": CUDA where it takes the call (paged K/V included), else Triton.
    Forcing "cuda" where it cannot run raises ValueError (dtype, layout, block size 1, pointers)
    or RuntimeError (no nvcc / CUTLASS / sm_90a device).
    """
    if not _compiling():
        key = P.signature("prefill_attention", backend, (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, out),
                          (causal, max_seqlen_q, max_seqlen_k, scale, return_lse, window_left, logits_soft_cap,
                           sinks))
        plan = P.PLANS.get(key)
        if plan is not None:
            return _prefill_launch(plan, q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, out, return_lse)
    V.require_backend(backend, B.BACKENDS)
    _refuse_features(window_left, logits_soft_cap, sinks)
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError("%s: expected a bool, got %s" % (name, type(flag).__name__))
    floats = [("q", q), ("k", k), ("v", v)]
    ints = [(n, t) for n, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                                ("block_table", block_table)) if t is not None]
    if V.is_array(q):
        _check_arrays(floats, ints, out)
    else:
        _check_tensors(floats, ints, out)
        _check_out(out, q)
    varlen, _, page = _prefill_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table)
    if V.is_array(out):
        V.require_shape("out", out, q.shape)
    on_cpu = V.is_array(q) or q.device.type == "cpu"
    max_q = _check_max_seqlen("max_seqlen_q", max_seqlen_q, varlen, not on_cpu)
    max_k = _check_max_seqlen("max_seqlen_k", max_seqlen_k, varlen, not on_cpu)
    if block_table is not None:
        _check_paged_capacity(max_k, block_table, page)
    scale = _check_scale(scale, q.shape[-1])
    if on_cpu:
        if not V.is_array(q):
            _cpu_backend(backend, q.device)
        if varlen:
            _cu_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_q, max_k, block_table, page)
        y, lse, _ = ref.prefill_attention(C.to_f64(q), C.to_f64(k), C.to_f64(v),
                                          None if not varlen else C.to_f64(cu_seqlens_q).astype(np.int64),
                                          None if not varlen else C.to_f64(cu_seqlens_k).astype(np.int64),
                                          causal, scale,
                                          None if block_table is None else C.to_f64(block_table).astype(np.int64))
        return _cpu_result(q, out, return_lse, y, lse)
    if not varlen:
        max_q, max_k = q.shape[1], k.shape[1]
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_prefill_lse_shape(q, varlen), dtype=torch.float32, device=q.device)
    if _compiling():
        torch.ops.fray.prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, out, lse, causal, max_q,
                                         max_k, scale, backend)
        return (out, lse) if return_lse else out
    plan = P.PLANS.put(key, _prefill_plan(q, k, v, cu_seqlens_q, block_table, out, lse, causal, max_q, max_k, scale,
                                          backend))
    plan(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, out, lse)
    return (out, lse) if return_lse else out


def _cpu_result(q, out, return_lse, y, lse):
    """Round the float64 reference result to q's dtype and type; fill `out` when given."""
    y = C.like(y, q)
    if V.is_array(q):
        lse = np.asarray(lse).astype(np.float64 if q.dtype == np.float64 else np.float32)
        if out is not None:
            out[...] = y
            y = out
    else:
        lse = torch.from_numpy(np.asarray(lse)).to(torch.float32)
        if out is not None:
            out.copy_(y)
            y = out
    return (y, lse) if return_lse else y


# ---------------------------------------------------------------------------------------------
# MLA decode: DeepSeek's latent attention over a paged latent cache

MLA_HEAD_DIM = 576       # the 512-wide compressed latent, then 64 rotary dims
MLA_HEAD_DIM_V = 512
MLA_MAX_HEADS = 128
MLA_MAX_QUERIES = 8      # s_q: speculative decoding verifies a few draft tokens at once
# 16 and up: a kernel tile (16..64 tokens) never crosses a page (FlashMLA's block size is 64)
MLA_PAGE_SIZES = (16, 32, 64, 128)


def _check_head_dim_v(head_dim_v):
    if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, int):
        raise TypeError("head_dim_v: expected an int, got %s" % type(head_dim_v).__name__)
    if head_dim_v != MLA_HEAD_DIM_V:
        raise ValueError("head_dim_v: expected %d (the values are the first %d of the %d cached columns; the "
                         "kernels are built for DeepSeek's 512 + 64), got %d"
                         % (MLA_HEAD_DIM_V, MLA_HEAD_DIM_V, MLA_HEAD_DIM, head_dim_v))


def _mla_shapes(q, kv, block_table, lens):
    """(capacity, block_size) after the shape checks."""
    if len(q.shape) != 4:
        raise ValueError("q: expected shape [B, s_q, Hq, %d], got %s" % (MLA_HEAD_DIM, tuple(q.shape)))
    batch, s_q, hq, d = q.shape
    if d != MLA_HEAD_DIM:
        raise ValueError("q: expected head dim %d (512 latent + 64 rotary), got %d" % (MLA_HEAD_DIM, d))
    if not 1 <= s_q <= MLA_MAX_QUERIES:
        raise ValueError("q: s_q (dim 1, query tokens per sequence) must lie in 1..%d, got %d" % (MLA_MAX_QUERIES, s_q))
    if not 1 <= hq <= MLA_MAX_HEADS:
        raise ValueError("q: Hq (dim 2) must lie in 1..%d, got %d" % (MLA_MAX_HEADS, hq))
    if len(kv.shape) != 4:
        raise ValueError("kv_cache: expected [num_blocks, block_size, 1, %d], got shape %s"
                         % (MLA_HEAD_DIM, tuple(kv.shape)))
    _, page, hkv, dk = kv.shape
    if hkv != 1:
        raise ValueError("kv_cache: MLA caches one latent row per token shared by every head: dim 2 must be 1, "
                         "got %d" % hkv)
    if dk != d:
        raise ValueError("kv_cache: head dim %d differs from q's %d" % (dk, d))
    if page not in MLA_PAGE_SIZES:
        raise ValueError("kv_cache: block size (dim 1) must be one of %s, got %d" % (MLA_PAGE_SIZES, page))
    _check_block_table(block_table, batch)
    V.require_shape("lens", lens, (batch,))
    return block_table.shape[1] * page, page


def _check_mla_out(out, q):
    if out is None:
        return
    shape = tuple(q.shape[:3]) + (MLA_HEAD_DIM_V,)
    if V.is_array(out):
        V.require_shape("out", out, shape)
        return
    if out.dtype != q.dtype:
        raise TypeError("out: expected dtype %s (that of q), got %s" % (_name(q.dtype), _name(out.dtype)))
    V.require_shape("out", out, shape)
    if out.stride(-1) != 1:
        raise ValueError("out: the last dimension must be contiguous (stride 1), got stride %d" % out.stride(-1))
    V.require_distinct_elements("out", out)


# The CUDA MLA kernel (cuda/attention/mla_sm90.cuh): 64 query rows (query token x head) a CTA,
# 64-token cache tiles in two stages, one JIT translation unit per (dtype, block size).
MLA_CUDA_ROWS, MLA_CUDA_TILE = 64, 64


def mla_cuda_source(dtype, page):
    """(name, translation unit) of the CUDA MLA decode kernel for one (dtype, cache block size)."""
    name = "mla_sm90_%s_page%d" % (V.DTYPE_NAMES[dtype], page)
    src = ('#include "cuda/attention/mla_sm90.cuh"\n'
           "using Config = fray::attention::MlaConfig<%s, %d>;\nFRAY_MLA_ENTRY(Config)\n"
           % (_CUTLASS_T[dtype], page))
    return name, src


def mla_cuda_plan(batch, s_q, hq, dtype, capacity, num_splits, num_sms):
    """(block_h, num_splits, split_size) of one CUDA launch: block_h heads x s_q queries fill a
    CTA's 64 rows; the split count is the Triton kernel's model (fray_triton.mla_decode.
    num_splits_for) at 64 rows and 64-token tiles, or num_splits (at most 128), rounded so that
    every split is whole tiles."""
    from fray_triton import mla_decode as tmla
    block_h = min(hq, MLA_CUDA_ROWS // s_q)
    if num_splits is None:
        num_splits = tmla.num_splits_for(batch, -(-hq // block_h), MLA_CUDA_ROWS, capacity, num_sms, MLA_CUDA_TILE,
                                         MLA_HEAD_DIM * dtype.itemsize, MLA_HEAD_DIM_V * 4)
    tiles = -(-max(capacity, 1) // MLA_CUDA_TILE)
    split_size = -(-tiles // min(num_splits, tmla.MAX_SPLITS)) * MLA_CUDA_TILE
    return block_h, -(-max(capacity, 1) // split_size), split_size


def _mla_cuda_layout_reason(q, kv, out):
    """Why the CUDA MLA kernel cannot take these tensors' dtype / strides, or None (pointers are
    checked per call)."""
    if q.dtype not in _CUTLASS_T:
        return "the CUDA MLA kernel takes bf16 and fp16 (got %s; fp32 runs on Triton)" % V.DTYPE_NAMES[q.dtype]
    for name, t in (("q", q), ("kv_cache", kv)):
        if any(st % 8 for st, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):
            return ("%s: the CUDA kernel loads 16-byte chunks (TMA for the cache), which needs strides that are "
                    "multiples of 8 elements; got strides %s" % (name, tuple(t.stride())))
    if any(st % 2 for st, n in zip(out.stride()[:-1], out.shape[:-1]) if n > 1):
        return "out: the CUDA kernel stores element pairs, which needs even strides; got %s" % (tuple(out.stride()),)
    return None


class _MlaPlan:
    """One MLA signature's launch with every host-side argument fixed (strides, the kernel
    configuration and the split plan); per call only FRAY_CHECK_INDICES, the pointers' alignment
    (CUDA) and the data."""

    __slots__ = ("capacity", "page", "scale", "dev", "launch", "q_strides", "kv_strides", "bt_stride",
                 "out_strides", "lse_strides", "lse_shape", "kernel", "ints", "forced", "parts")

    def __call__(self, q, kv, block_table, lens, out, lse):
        if env.check_indices():  # here rather than in the wrapper: compiled graphs check too
            _device_check_indices(lens, self.capacity, block_table, self.page, kv.shape[0])
        if self.capacity == 0:  # no token can be seen: zero rows, lse -inf, no launch
            out.zero_()
            lse.fill_(float("-inf"))
            return
        if self.kernel is not None:
            if (q.data_ptr() | kv.data_ptr()) % 16 == 0 and out.data_ptr() % 4 == 0:
                po = pl = 0
                if self.parts:  # the splits' partials (outputs, then LSEs), merged by the kernel's second launch
                    parts = torch.empty(self.parts * (MLA_HEAD_DIM_V + 1), dtype=torch.float32, device=q.device)
                    po = parts.data_ptr()
                    pl = po + self.parts * MLA_HEAD_DIM_V * 4
                ptrs = (q.data_ptr(), kv.data_ptr(), block_table.data_ptr(), lens.data_ptr(), out.data_ptr(),
                        lse.data_ptr(), po, pl)
                self.kernel.launch(ptrs, self.ints, (self.scale,), self.dev, B.current_stream(q.device))
                return
            if self.forced:
                raise ValueError("q / kv_cache / out: backend='cuda' loads q and kv_cache in 16-byte chunks "
                                 "(16-byte aligned data pointers) and stores out in element pairs (4-byte "
                                 "aligned); got pointers %#x, %#x, %#x (use backend='triton' or 'auto')"
                                 % (q.data_ptr(), kv.data_ptr(), out.data_ptr()))
        from fray_triton import mla_decode as tmla
        with torch.cuda.device(self.dev):
            tmla.decode(q, kv, block_table, lens, out, lse, self.scale, q_strides=self.q_strides,
                        kv_strides=self.kv_strides, bt_stride=self.bt_stride, out_strides=self.out_strides,
                        lse_strides=self.lse_strides, capacity=self.capacity, page_size=self.page, launch=self.launch)


def _mla_plan(q, kv, block_table, out, lse, scale, num_splits, backend):
    if q.shape[0] == 0:
        return _no_mla
    be = B.resolve("mla_decode", CUDA_FAMILIES["mla_decode"], backend, q.device)
    from fray_triton import mla_decode as tmla
    p = _MlaPlan()
    p.page = kv.shape[1]
    p.capacity = block_table.shape[1] * p.page
    p.scale = scale
    p.dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    batch, s_q, hq = q.shape[:3]
    p.launch = tmla.plan(batch, s_q, hq, kv.dtype, p.capacity, p.page, num_splits or None, B.num_sms(p.dev))
    p.q_strides, p.out_strides, p.lse_strides = q.stride()[:3], out.stride()[:3], lse.stride()
    p.kv_strides, p.bt_stride = (kv.stride(0), kv.stride(1)), block_table.stride(0)
    p.lse_shape = tuple(lse.shape)
    p.kernel, p.ints, p.parts, p.forced = None, None, 0, be == "cuda" and not _auto(backend)
    if be == "cuda" and p.capacity > 0:
        why = _mla_cuda_layout_reason(q, kv, out)
        if why and p.forced:
            raise ValueError("backend='cuda' cannot run mla_decode here: %s (use backend='triton' or 'auto')" % why)
        if not why:
            from fray import jit
            p.kernel = jit.build(*mla_cuda_source(q.dtype, p.page), device=p.dev)
            block_h, splits, split_size = mla_cuda_plan(batch, s_q, hq, q.dtype, p.capacity, num_splits or None,
                                                        B.num_sms(p.dev))
            p.parts = batch * s_q * hq * splits if splits > 1 else 0  # partial rows, one allocation a call
            # a dimension of size 1 is never stepped along: its stride is free in torch, 0 here
            qs, os_ = [tuple(0 if n == 1 else st for st, n in zip(t.stride()[:3], t.shape[:3])) for t in (q, out)]
            p.ints = ((batch, s_q, hq, block_h, splits, split_size, block_table.shape[1], kv.shape[0]) + qs
                      + (kv.stride(0), kv.stride(1), block_table.stride(0)) + os_ + tuple(lse.stride()))
    return p


def _no_mla(q, kv, block_table, lens, out, lse):
    """The plan of an MLA call over an empty batch."""


def _mla_impl(q, kv, block_table, lens, out, lse, scale, num_splits, backend):
    key = P.signature("mla_decode:op", backend, (q, kv, block_table, lens, out, lse), (scale, num_splits))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _mla_plan(q, kv, block_table, out, lse, scale, num_splits, backend))
    plan(q, kv, block_table, lens, out, lse)


@P.custom_op("fray::mla_decode", mutates_args=("out", "lse"))
def _mla_op(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, lens: torch.Tensor,
            out: torch.Tensor, lse: torch.Tensor, scale: float, num_splits: int, backend: str) -> None:
    _mla_impl(q, kv_cache, block_table, lens, out, lse, scale, num_splits, backend)


_mla_op.register_fake(lambda *args, **kwargs: None)


def _mla_launch(plan, q, kv, block_table, lens, out, return_lse):
    """A cached MLA plan's call: allocate what the caller did not pass, launch."""
    if out is None:
        out = torch.empty(q.shape[:3] + (MLA_HEAD_DIM_V,), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    plan(q, kv, block_table, lens, out, lse)
    return (out, lse) if return_lse else out


def mla_decode(q, kv_cache, block_table, lens, *, head_dim_v=512, scale=None, out=None, return_lse=False,
               num_splits=None, backend="auto"):
    """DeepSeek-style multi-head latent attention (MLA) decode over a paged latent cache.

    The up-projections are absorbed into q (and later into the output projection), so every
    head attends over the same cached latent rows: q [B, s_q, Hq, 576] (512 latent + 64 rotary
    dims per head; s_q in 1..8 query tokens per sequence, > 1 for speculative decoding; Hq in
    1..128); kv_cache [num_blocks, block_size, 1, 576] (FlashMLA's layout, block size 64 there;
    16, 32, 64 or 128 here), q's dtype (bf16, fp16, fp32; FP8 refused), last dims contiguous,
    other strides free. block_table int32 [B, max_blocks]: token t of sequence b is
    kv_cache[block_table[b, t // block_size], t % block_size]; lens int32 [B] on q's device; the
    capacity T is max_blocks * block_size. The key is the whole 576-wide row, the value its first
    head_dim_v = 512 columns (the only value supported).
    Causal among the s_q: the new tokens are the sequence's last s_q positions, so query i
    (0-based) sees positions j <= lens[b] - s_q + i (the last query sees all lens[b] tokens); a
    query that sees nothing (lens[b] = 0, or lens[b] < s_q for the early queries) gets a zero row
    and lse = -inf. scale: the softmax scale applied to q.k (FlashMLA's softmax_scale); None means
    1/sqrt(576). Softmax in fp32, one rounding to q's dtype.
    Returns out [B, s_q, Hq, 512] in q's dtype (`out` if given) or (out, lse) with return_lse:
    lse fp32 [B, s_q, Hq], the natural log of sum_j exp(scale q.k_j).
    num_splits: KV splits per sequence (None: chosen on the host from B, Hq, s_q, T and the SM
    count, never from lens; at most 128, each a whole number of 64-token tiles; splits that start
    at or past lens[b] exit at once). Deterministic.
    Trust boundary: lens and block_table are not read on the host, so one launch is CUDA-graph
    capturable and replays with new lengths; the kernel clamps lens[b] to [0, T] and block-table
    entries below lens[b] are used as given. FRAY_CHECK_INDICES=1 checks both with a host sync
    (ValueError; RuntimeError during CUDA-graph capture); CPU calls always check them.
    Backends: "cuda" (cuda/attention/mla_sm90.cuh, JIT-compiled per dtype x block size on first
    use: bf16 / fp16, q and kv_cache strides multiples of 8 elements and 16-byte aligned pointers,
    out with even strides; 64 query rows (heads x queries) a CTA, wgmma with two consumer
    warpgroups splitting the 512 value columns, TMA loads of 64-token cache tiles), "triton" (every
    dtype and layout); "auto": CUDA where it takes the call, else Triton. Forcing "cuda" where it
    cannot run raises ValueError (dtype, strides, pointers).
    Seed name: fray.jit_kernels.flash_mla (FlashMLA's argument order).
    """
    if not _compiling():
        key = P.signature("mla_decode", backend, (q, kv_cache, block_table, lens, out),
                          (head_dim_v, scale, return_lse, num_splits))
        plan = P.PLANS.get(key)
        if plan is not None:
            return _mla_launch(plan, q, kv_cache, block_table, lens, out, return_lse)
    V.require_backend(backend, B.BACKENDS)
    if not isinstance(return_lse, bool):
        raise TypeError("return_lse: expected a bool, got %s" % type(return_lse).__name__)
    _check_head_dim_v(head_dim_v)
    splits = _check_num_splits(num_splits)
    floats, ints = [("q", q), ("kv_cache", kv_cache)], [("block_table", block_table), ("lens", lens)]
    if V.is_array(q):
        _check_arrays(floats, ints, out)
    else:
        V.require_tensor("out", out, allow_none=True)
        _check_tensors(floats, ints, out)
    capacity, page = _mla_shapes(q, kv_cache, block_table, lens)
    _check_mla_out(out, q)
    scale = _check_scale(scale, MLA_HEAD_DIM)
    if V.is_array(q) or q.device.type == "cpu":
        if not V.is_array(q):
            _cpu_backend(backend, q.device)
        _index_values(lens, capacity, block_table, page, kv_cache.shape[0])
        y, lse, _ = ref.mla_decode(C.to_f64(q), C.to_f64(kv_cache), C.to_f64(block_table).astype(np.int64),
                                   C.to_f64(lens).astype(np.int64), head_dim_v, scale)
        return _cpu_result(q, out, return_lse, y, lse)
    if out is None:
        out = torch.empty(q.shape[:3] + (MLA_HEAD_DIM_V,), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    if _compiling():
        torch.ops.fray.mla_decode(q, kv_cache, block_table, lens, out, lse, scale, splits, backend)
        return (out, lse) if return_lse else out
    plan = P.PLANS.put(key, _mla_plan(q, kv_cache, block_table, out, lse, scale, splits, backend))
    plan(q, kv_cache, block_table, lens, out, lse)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

def _random_case(dtype, dev, batch=2, hq=4, hkv=2, capacity=37, d=64, page=16, lens=(37, 16), seed=0):
    """Random q, HND caches, and the same data as NHD pages with a shuffled block table."""
    g = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(batch, hq, d, device=dev, generator=g).to(dtype)
    k = torch.randn(batch, hkv, capacity, d, device=dev, generator=g).to(dtype)
    v = torch.randn(batch, hkv, capacity, d, device=dev, generator=g).to(dtype)
    kp, vp, bt = _paged_kv(*(t.transpose(1, 2).reshape(batch * capacity, hkv, d) for t in (k, v)),
                           [capacity] * batch, page, g, fill=0.0)
    return q, k, v, kp, vp, bt, torch.tensor(lens, dtype=torch.int32, device=dev)


def _paged_kv(k, v, lens_k, page, generator, spare=3, fill=float("nan")):
    """Packed varlen keys k, v [total_k, Hkv, D] (sequence lengths lens_k) moved into NHD page pools
    behind a shuffled block table, the paged form of prefill_attention: (k_pages, v_pages,
    block_table). The pool rows no sequence uses (the tail of a last page, `spare` unused pages)
    hold `fill`: NaN by default, so a kernel that reads one shows it."""
    dev = k.device
    batch = len(lens_k)
    max_blocks = max([1] + [-(-n // page) for n in lens_k])
    num_pages = batch * max_blocks + spare
    bt = torch.randperm(num_pages, device=dev, generator=generator)[: batch * max_blocks].view(batch, max_blocks)
    kp = torch.full((num_pages, page) + tuple(k.shape[1:]), fill, dtype=k.dtype, device=dev)
    vp = torch.full_like(kp, fill)
    start = 0
    for b, n in enumerate(lens_k):
        t = torch.arange(n, device=dev)
        blocks = bt[b, t // page]
        kp[blocks, t % page] = k[start:start + n]
        vp[blocks, t % page] = v[start:start + n]
        start += n
    return kp, vp, bt.to(torch.int32)


def _mla_case(dtype, dev, batch=3, s_q=2, hq=16, lens=(0, 65, 130), page=64, max_blocks=None, seed=0):
    """Random q [B, s_q, Hq, 576] and a paged latent cache with a shuffled block table (3 spare
    pages that no sequence uses); lens as given. max_blocks: default just enough for max(lens)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    if max_blocks is None:
        max_blocks = max(1, -(-max(lens) // page))
    num_pages = batch * max_blocks + 3
    q = torch.randn(batch, s_q, hq, MLA_HEAD_DIM, device=dev, generator=g).to(dtype)
    kv = torch.randn(num_pages, page, 1, MLA_HEAD_DIM, device=dev, generator=g).to(dtype)
    bt = torch.randperm(num_pages, device=dev, generator=g)[: batch * max_blocks].view(batch, max_blocks)
    return q, kv, bt.to(torch.int32), torch.tensor(lens, dtype=torch.int32, device=dev)


def check_cases(device):
    """On a GPU: CUDA and Triton x dtype x layout (contiguous HND/NHD, paged) against the
    reference, kv_append(_paged) of both backends, and prefill_attention (varlen, chunked, empty
    sequences; the same over 16-token pages) and mla_decode (s_q 2, lens 0 / 65 / 130)
    of each backend they have. On the CPU: the references against hand-computed values and the
    Triton kernels under the interpreter."""
    from fray.testing import assert_close

    def check_lse(lse, expected, what):
        """The -inf rows (nothing seen) exactly, the rest within fp32's tolerance."""
        lse, empty = lse.cpu(), torch.from_numpy(np.isinf(expected))
        if not torch.equal(torch.isinf(lse) & (lse < 0), empty):
            raise AssertionError("%s: the lse -inf rows differ from the reference" % what)
        assert_close(lse[~empty], torch.from_numpy(expected)[~empty], torch.float32, what + " lse")

    def run(dtype, paged, nhd, dev, interpreter, backend="triton"):
        q, k, v, kp, vp, bt, lens = _random_case(dtype, dev)
        e, el, mag = ref.decode_attention(q.double(), k.double(), v.double(), lens.tolist(), None, "HND")
        if interpreter:
            from fray_triton import attention as tattn
            out = torch.full_like(q, float("nan"))
            lse = torch.full(q.shape[:2], float("nan"))
            if paged:
                kk, vv, ks = kp, vp, (kp.stride(0), kp.stride(2), kp.stride(1))
            else:
                kk, vv, ks = k, v, (k.stride(0), k.stride(1), k.stride(2))
            tattn.decode(q, kk, vv, lens, bt if paged else None, out, lse, 1.0 / math.sqrt(64),
                         q_strides=q.stride()[:2], k_strides=ks, v_strides=ks, bt_stride=bt.stride(0),
                         out_strides=out.stride()[:2], lse_stride=lse.stride(0), n_kv_heads=2,
                         capacity=bt.shape[1] * 16 if paged else 37, page_size=16, num_splits=3,
                         num_sms=1, block_n=16)
        elif paged:
            out, lse = paged_decode_attention(q, kp, vp, bt, lens, return_lse=True, backend=backend)
        elif nhd:
            out, lse = decode_attention(q, k.transpose(1, 2), v.transpose(1, 2), lens, kv_layout="NHD",
                                        return_lse=True, backend=backend)
        else:
            out, lse = decode_attention(q, k, v, lens, return_lse=True, backend=backend)
        assert_close(out, e, dtype, "decode", scale=mag)
        assert_close(lse, el, torch.float32, "lse")

    def hand():
        q = np.ones((1, 1, 64))
        k = np.zeros((1, 1, 2, 64))
        v = np.zeros((1, 1, 2, 64))
        v[0, 0, 0], v[0, 0, 1] = 2.0, 4.0
        y = decode_attention(q, k, v, np.array([1]))      # one key: its value
        np.testing.assert_allclose(y, np.full((1, 1, 64), 2.0))
        y, lse = decode_attention(q, k, v, np.array([2]), return_lse=True)  # equal keys: the mean
        np.testing.assert_allclose(y, np.full((1, 1, 64), 3.0))
        np.testing.assert_allclose(lse, [[math.log(2.0)]])
        y, lse = decode_attention(q, k, v, np.array([0]), return_lse=True)
        assert (y == 0).all() and lse[0, 0] == -np.inf

    def prefill_run(dtype, dev, interpreter, backend="triton", paged=False):
        lens_q, lens_k = (1, 17, 0, 40, 6), (1, 30, 5, 40, 0)  # chunked, empty q, empty k
        g = torch.Generator(device=dev).manual_seed(2)
        q = torch.randn(sum(lens_q), 4, 64, device=dev, generator=g).to(dtype)
        k = torch.randn(sum(lens_k), 2, 64, device=dev, generator=g).to(dtype)
        v = torch.randn(sum(lens_k), 2, 64, device=dev, generator=g).to(dtype)
        cu_q = torch.tensor(np.cumsum((0,) + lens_q), dtype=torch.int32, device=dev)
        cu_k = torch.tensor(np.cumsum((0,) + lens_k), dtype=torch.int32, device=dev)
        e, el, mag = ref.prefill_attention(C.to_f64(q), C.to_f64(k), C.to_f64(v), cu_q.tolist(), cu_k.tolist())
        bt = None
        if paged:  # the same keys in 16-token pages behind a shuffled block table
            k, v, bt = _paged_kv(k, v, lens_k, 16, g)
        if interpreter:
            from fray_triton import prefill_attention as tprefill
            out = torch.full_like(q, float("nan"))
            lse = torch.full((4, q.shape[0]), float("nan"))
            ks, vs = (t.stride()[:3] if paged else (0,) + t.stride()[:2] for t in (k, v))
            tprefill.prefill(q, k, v, out, lse, cu_q, cu_k, 0.125, causal=True, batch=5, max_seqlen_q=40, seqlen_k=0,
                             q_strides=(0,) + q.stride()[:2], k_strides=ks, v_strides=vs,
                             out_strides=(0,) + out.stride()[:2], lse_strides=(0, lse.stride(0)),
                             block_table=bt, bt_stride=bt.stride(0) if paged else 0, page_size=16,
                             block_m=16, block_n=32 if paged else 16)
        else:
            out, lse = prefill_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=bt,
                                         max_seqlen_q=40, max_seqlen_k=40, return_lse=True, backend=backend)
        assert_close(out, e, dtype, "prefill", scale=mag)
        check_lse(lse, el, "prefill")

    def prefill_hand():
        q, k, v = np.ones((2, 1, 64)), np.zeros((3, 1, 64)), np.zeros((3, 1, 64))
        v[:, 0, :] = np.array([2.0, 4.0, 8.0])[:, None]
        # equal keys, causal bottom-right: query 0 sees keys 0, 1 (mean 3), query 1 all three
        y, lse = prefill_attention(q, k, v, cu_seqlens_q=np.array([0, 2]), cu_seqlens_k=np.array([0, 3]),
                                   return_lse=True)
        np.testing.assert_allclose(y[:, 0, 0], [3.0, 14.0 / 3.0], rtol=1e-15)
        np.testing.assert_allclose(lse[0], [math.log(2.0), math.log(3.0)], rtol=1e-15)
        y, lse = prefill_attention(q, k[:0], v[:0], cu_seqlens_q=np.array([0, 2]), cu_seqlens_k=np.array([0, 0]),
                                   return_lse=True)
        assert (y == 0).all() and (lse == -np.inf).all()

    def mla_run(dtype, dev, interpreter, backend="triton"):
        q, kv, bt, lens = _mla_case(dtype, dev)
        e, el, mag = ref.mla_decode(C.to_f64(q), C.to_f64(kv), bt.cpu(), lens.cpu(), MLA_HEAD_DIM_V, 0.05)
        if interpreter:
            from fray_triton import mla_decode as tmla
            out = torch.full(q.shape[:3] + (MLA_HEAD_DIM_V,), float("nan"), dtype=dtype)
            lse = torch.full(q.shape[:3], float("nan"))
            tmla.decode(q, kv, bt, lens, out, lse, 0.05, q_strides=q.stride()[:3], kv_strides=kv.stride()[:2],
                        bt_stride=bt.stride(0), out_strides=out.stride()[:3], lse_strides=lse.stride(),
                        capacity=bt.shape[1] * kv.shape[1], page_size=kv.shape[1], num_splits=2)
        else:
            out, lse = mla_decode(q, kv, bt, lens, scale=0.05, return_lse=True, backend=backend)
        assert_close(out, e, dtype, "mla_decode", scale=mag)
        check_lse(lse, el, "mla_decode")

    def mla_hand():
        # q reads only the rotary dims and the cached rows' rotary dims are 0: equal scores, so
        # each query averages the latent values it sees (2, 4, 8). s_q = 2, lens 3: query 0 sees
        # tokens 0, 1 (mean 3), query 1 all three (14/3).
        q = np.zeros((1, 2, 1, MLA_HEAD_DIM))
        q[..., MLA_HEAD_DIM_V:] = 1.0
        kv = np.zeros((1, 16, 1, MLA_HEAD_DIM))
        kv[0, :3, 0, :MLA_HEAD_DIM_V] = np.array([2.0, 4.0, 8.0])[:, None]
        bt, lens = np.zeros((1, 1), np.int32), np.array([3], np.int32)
        y, lse = mla_decode(q, kv, bt, lens, return_lse=True)
        np.testing.assert_allclose(y[0, :, 0, :], [[3.0] * 512, [14.0 / 3.0] * 512], rtol=1e-15)
        np.testing.assert_allclose(lse[0, :, 0], [math.log(2.0), math.log(3.0)], rtol=1e-15)
        y, lse = mla_decode(q, kv, bt, np.array([1], np.int32), return_lse=True)  # query 0 sees nothing
        assert (y[0, 0] == 0).all() and lse[0, 0, 0] == -np.inf and lse[0, 1, 0] == 0.0

    mla_shape = "B3 s_q2 Hq16 lens 0,65,130 P64"
    prefill_shape = "varlen q 1,17,0,40,6 k 1,30,5,40,0 Hq4 Hkv2 D64"
    paged_shape = prefill_shape + " paged P16"
    cases = []
    if device.type != "cuda":
        cases.append(("decode_attention", "reference", "fp64", "hand", hand))
        cases.append(("prefill_attention", "reference", "fp64", "hand", prefill_hand))
        cases.append(("mla_decode", "reference", "fp64", "hand", mla_hand))
        for dtype in (torch.float32, torch.bfloat16):
            cases.append(("mla_decode", "triton-interpreter", V.DTYPE_NAMES[dtype], mla_shape,
                          lambda d=dtype: mla_run(d, "cpu", True)))
        for dtype in (torch.float32, torch.bfloat16):
            cases.append(("prefill_attention", "triton-interpreter", V.DTYPE_NAMES[dtype], prefill_shape,
                          lambda d=dtype: prefill_run(d, "cpu", True)))
            cases.append(("prefill_attention", "triton-interpreter", V.DTYPE_NAMES[dtype], paged_shape,
                          lambda d=dtype: prefill_run(d, "cpu", True, paged=True)))
        for dtype in (torch.float32, torch.bfloat16):
            for paged in (False, True):
                cases.append(("paged_decode_attention" if paged else "decode_attention", "triton-interpreter",
                              V.DTYPE_NAMES[dtype], "2x4x37x64",
                              lambda d=dtype, p=paged: run(d, p, False, "cpu", True)))
        return cases
    def append(dtype, paged, backend):
        _, k, v, kp, vp, bt, _ = _random_case(dtype, device)
        g = torch.Generator(device=device).manual_seed(1)
        kn = torch.randn(2, 2, 64, device=device, generator=g).to(dtype)
        vn = torch.randn(2, 2, 64, device=device, generator=g).to(dtype)
        lens = torch.tensor([0, 36], dtype=torch.int32, device=device)
        if paged:
            ek, ev, ck, cv = kp.clone(), vp.clone(), kp.clone(), vp.clone()
            ref.kv_append_paged(ek, ev, bt, kn, vn, lens.tolist())
            kv_append_paged(ck, cv, bt, kn, vn, lens, backend=backend)
        else:
            ek, ev, ck, cv = k.clone(), v.clone(), k.clone(), v.clone()
            ref.kv_append(ek, ev, kn, vn, lens.tolist())
            kv_append(ck, cv, kn, vn, lens, backend=backend)
        if not (torch.equal(ck, ek) and torch.equal(cv, ev)):
            raise AssertionError("kv_append%s (%s): the cache differs from the reference"
                                 % ("_paged" if paged else "", backend))

    def rows(op, backend):
        out = []
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            name = V.DTYPE_NAMES[dtype]
            if op == "prefill_attention":
                if backend == "cuda" and dtype == torch.float32:
                    continue  # the CUDA kernel is 16-bit; fp32 runs on Triton
                out.append((name, prefill_shape, lambda d=dtype, b=backend: prefill_run(d, device, False, b)))
                out.append((name, paged_shape, lambda d=dtype, b=backend: prefill_run(d, device, False, b, paged=True)))
            elif op == "mla_decode":
                out.append((name, mla_shape, lambda d=dtype, b=backend: mla_run(d, device, False, b)))
            elif op.startswith("kv_append"):
                out.append((name, "2x2x37x64", lambda d=dtype, p=op == "kv_append_paged", b=backend: append(d, p, b)))
            else:
                for nhd in ((False, True) if op == "decode_attention" else (False,)):
                    out.append((name, "2x4x37x64" + (" NHD" if nhd else ""),
                                lambda d=dtype, p=op != "decode_attention", n=nhd, b=backend:
                                run(d, p, n, device, False, b)))
        return out
    return cases + B.gpu_check_rows(lambda op: CUDA_FAMILIES.get(op, FAMILY), OPS, device, rows)
