"""The mixture-of-experts family, second part: the grouped GEMM and the layers built on it.

grouped_gemm         out rows = a rows @ B_g for row groups given by offsets (the seed's
                     explicit-metadata form) or by a moe_dispatch (token rows gathered per route)
routed_grouped_gemm  a one-matrix MoE: route, dispatch, grouped GEMM with the routing weight in its
                     epilogue, and a combine ("atomic", "staged" or "scatter")
fused_moe            the MoE layer: route -> dispatch -> grouped GEMM 1 with the gated activation in
                     its epilogue -> grouped GEMM 2 with the routing weight -> combine

Every rounding the unfused chain would make is made where it would make it (the GEMMs' outputs,
the activation's, the weighted contribution's, the sum's; fray.reference.moe spells them out), so
that the fused kernels compute the same function as route + gemm + silu_mul + gemm + weighting.

Nothing is read back on the host: the dispatch metadata stays on the device, every buffer's size
is a function of (T, k, E, block_m), and the grid covers the most row tiles any routing can need
(programs past the used tiles return at once), so the layer captures in a CUDA graph and traces
under torch.compile (custom ops fray::grouped_gemm, fray::grouped_gemm_routes, fray::routed_gemm
and fray::fused_moe with fakes). Ids, offsets and dispatch tensors on the GPU are trusted
(FRAY_CHECK_INDICES=1 checks ids and offsets with one synchronisation); numpy arrays and CPU
tensors run the float64 reference and are always checked. The kernels are Triton's
(fray_triton.moe_gemm); the explicit grouped GEMM also has a CUDA kernel (CUTLASS's pointer-array
grouped GEMM on fray.jit, cuda/moe/grouped_gemm_sm90.cuh), which "auto" takes where its TMA loads
can, and fused_moe has a CUDA path on it (backend="cuda"): the token rows copied into expert order
(the CUTLASS kernel reads contiguous rows by TMA, it cannot gather), GEMM 1, the gated activation,
GEMM 2, and the staged combine weighing the rows.
"""
import math
from typing import Optional

import numpy as np
import torch

from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray import env
from fray.ops import moe as M
from fray.reference import moe as ref

FAMILY = "moe"
OPS = ("grouped_gemm", "routed_grouped_gemm", "fused_moe")
CUDA_FAMILIES = {op: FAMILY for op in OPS}
__all__ = list(OPS)
# grouped_gemm's explicit form has a CUDA kernel (CUTLASS on fray.jit, cuda/moe), which "auto"
# prefers (tuned: 895 us against Triton's 1138 and torch._grouped_mm's 1132 at 64 groups x 384
# rows, N 2816, K 4096 on an H100, 2026-12-07) wherever its TMA loads take the operands; the
# dispatch form runs on it only when asked (backend="cuda": the CUDA kernel cannot gather rows, so
# they are copied in and out around it), and "auto" runs Triton there.
B.register_preference("grouped_gemm", ("cuda", "triton"))
# fused_moe's and routed_grouped_gemm's CUDA paths (the CUDA grouped GEMM between a row gather, the
# gated activation and the staged combine) are taken when asked for; "auto" stays on Triton until
# the GPU has measured both.
for _op in ("routed_grouped_gemm", "fused_moe"):
    B.register_preference(_op, ("triton", "cuda"))

LAYOUTS = ("nk", "kn")
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
COMBINES = ("auto", "atomic", "staged", "scatter")
DTYPES = (torch.float16, torch.bfloat16)
_NP_DTYPES = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
              np.dtype(np.float64): torch.float64}
_INTS = (int, np.integer)
MIN_BLOCK_M, MAX_BLOCK_M = 16, 256  # tl.dot's smallest M; the largest row tile worth a program


# ---------------------------------------------------------------------------------------------
# configurations: BLOCK_M follows the rows each expert gets on average (a decode step gives an
# expert a few rows: a 16-row tile wastes least; prefill gives it hundreds: 128-row tiles reuse
# each weight tile across the most rows); the rest suits the GEMM's N and K.

def block_m_for(rows_per_group):
    if rows_per_group <= 16:
        return 16
    if rows_per_group <= 32:
        return 32
    if rows_per_group <= 96:
        return 64
    return 128


def gemm_config(block_m, n, k, gated=False, rows_contiguous=False):
    """(BLOCK_N, BLOCK_K, GROUP_M, warps, stages) for a grouped GEMM with BLOCK_M rows per tile.
    Measured on an H100 (bench/NOTES.md, "MoE grouped GEMM"): at 128-row tiles 128 x 128 x 64 with
    8 warps won the gated GEMM of the T4096 E64 H4096 I1408 k6 layer with 4 stages (1033 us against
    1084 with 3); 128 x 256 and 128 x 128 x 128 do not fit its shared memory. Where the rows are
    contiguous (rows_contiguous: the second GEMM's sorted rows, the explicit form's), the copy
    engine loads them and 128 x 256 x 64 with 4 stages ran that layer's second GEMM in 614 us
    against 700 for 128 x 128 x 64 with 3. Decode tiles (16 rows) streamed the weights at
    2.4-2.8 TB/s with every N / K tried (16..128 x 64..256)."""
    if _interpreting():
        return dict(BLOCK_M=block_m, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1)
    if block_m <= 32:
        # weight streaming: few rows, so each program reads a 64-wide band of the expert's matrix
        # with deep K tiles in flight
        return dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
    if block_m == 64:
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)
    if rows_contiguous and not gated:
        return dict(BLOCK_M=block_m, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=4)
    return dict(BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=4 if gated else 3)


def grid_tiles(n_routes, num_experts, block_m, tiles):
    """The row tiles a grid needs for a dispatch Fray built (every expert's routes padded to a
    multiple of block_m): an expert with c routes fills ceil(c / block_m) <= floor(c / block_m) + 1
    tiles, so all of them fill at most min(E, R) + floor(R / block_m), often far fewer than the
    dispatch's buffers hold (T*k + E*(block_m - 1) rows, sized for any routing). Programs past the
    device-side tile count return at once, but at decode a grid sized by the buffers launched
    thousands of them for a few live tiles."""
    return min(tiles, min(num_experts, n_routes) + n_routes // block_m)


def _interpreting():
    import os
    return os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------------------------------------
# validation

def _name(dtype):
    return str(dtype).replace("torch.", "")


def _int(name, value, lo, hi=None):
    if isinstance(value, bool) or not isinstance(value, _INTS):
        raise TypeError("%s: expected an int, got %s" % (name, type(value).__name__))
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ValueError("%s: expected a value in %s, got %d" % (name, "[%d, %d]" % (lo, hi) if hi is not None
                                                                 else ">= %d" % lo, v))
    return v


def _choice(name, value, allowed):
    if not isinstance(value, str) or value not in allowed:
        raise ValueError("%s: expected one of %s, got %r" % (name, ", ".join(repr(a) for a in allowed), value))
    return value


def _operand(name, t, ndim, like=None, like_name=None):
    """A float operand: a bf16 / fp16 tensor (CUDA or CPU) or a float numpy array, with ndim dims,
    of like's kind, device and dtype."""
    if like is not None and V.is_array(like) != V.is_array(t):
        raise TypeError("%s: expected a %s like %s, got %s" % (
            name, "numpy.ndarray" if V.is_array(like) else "torch.Tensor", like_name, type(t).__name__))
    if V.is_array(t):
        if t.dtype not in _NP_DTYPES:
            raise TypeError("%s: expected a float16/float32/float64 array, got %s" % (name, t.dtype))
    else:
        V.require_tensor(name, t)
        V.require_device_family(name, t)
        if like is not None:
            V.require_same_device([(like_name, like), (name, t)])
        if t.dtype not in DTYPES:
            raise TypeError("%s: expected dtype bfloat16 or float16, got %s" % (name, _name(t.dtype)))
    if like is not None and t.dtype != like.dtype:
        raise TypeError("%s: expected %s's dtype %s, got %s" % (name, like_name, like.dtype, t.dtype))
    if t.ndim != ndim:
        raise ValueError("%s: expected %d dimensions, got shape %s" % (name, ndim, tuple(t.shape)))


def _unit_last(name, t):
    if not V.is_array(t) and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError("%s: the last dimension must be contiguous (stride 1), got strides %s" % (name, t.stride()))


def _matrix_dims(name, b, layout):
    """(G, N, K) of a weight stack in `layout`."""
    g, d1, d2 = b.shape
    return (g, d1, d2) if layout == "nk" else (g, d2, d1)


def _check_out(out, shape, like, name="out"):
    if out is None:
        return
    if V.is_array(like):
        if not V.is_array(out):
            raise TypeError("%s: expected a numpy.ndarray like the inputs, got %s" % (name, type(out).__name__))
    else:
        V.require_tensor(name, out)
        V.require_same_device([("x", like), (name, out)])
    if out.dtype != like.dtype:
        raise TypeError("%s: expected dtype %s, got %s" % (name, like.dtype, out.dtype))
    if tuple(out.shape) != tuple(shape):
        raise ValueError("%s: expected shape %s, got %s" % (name, tuple(shape), tuple(out.shape)))
    if not V.is_array(out):
        _unit_last(name, out)
        V.require_distinct_elements(name, out)


def _side_tensor(name, t, like, dtypes, like_name="the first operand"):
    """A metadata / routing tensor beside `like`: same device, one of `dtypes`, contiguous."""
    V.require_tensor(name, t)
    V.require_same_device([(like_name, like), (name, t)])
    if t.dtype not in dtypes:
        raise TypeError("%s: expected dtype %s, got %s" % (name, " or ".join(_name(d) for d in dtypes),
                                                          _name(t.dtype)))
    if not t.is_contiguous():
        raise ValueError("%s: expected a contiguous tensor, got strides %s" % (name, t.stride()))


def _int_tensor(name, t, like, dtypes=(torch.int32,), ndim=1):
    if V.is_array(like):
        if not V.is_array(t):
            raise TypeError("%s: expected a numpy.ndarray like the inputs, got %s" % (name, type(t).__name__))
        if not np.issubdtype(t.dtype, np.integer):
            raise TypeError("%s: expected an integer array, got %s" % (name, t.dtype))
    else:
        _side_tensor(name, t, like, dtypes)
    if t.ndim != ndim:
        raise ValueError("%s: expected %d dimension(s), got shape %s" % (name, ndim, tuple(t.shape)))


def _check_offsets_values(offs, m):
    offs = np.asarray(offs, np.int64)
    if offs.size and (offs.min() < 0 or offs.max() > m or (np.diff(offs) < 0).any()):
        raise ValueError("group_offsets: expected nondecreasing values in [0, %d] (the rows of a), got %s"
                         % (m, offs.tolist() if offs.size <= 16 else "values in [%d, %d]" % (offs.min(), offs.max())))


def _check_dispatch(d, t, top_k, num_groups, like):
    """A moe_dispatch result matching T tokens, top_k and the weights' expert count; its block_m."""
    if not isinstance(d, tuple) or len(d) != 6:
        raise TypeError("dispatch: expected the MoeDispatch that fray.moe_dispatch returns, got %s" % type(d).__name__)
    for name, v in zip(M.MoeDispatch._fields, d):
        _int_tensor("dispatch." + name, v, like)
    rows, tiles = d.sorted_route_ids.shape[0], d.tile_expert.shape[0]
    if d.expert_offsets.shape[0] != num_groups + 1:
        raise ValueError("dispatch: built for %d experts (expert_offsets has %d entries), but the weights hold %d"
                         % (d.expert_offsets.shape[0] - 1, d.expert_offsets.shape[0], num_groups))
    if d.inverse.shape[0] != t * top_k:
        raise ValueError("dispatch: built for %d routes (inverse), but x has %d tokens x top_k %d"
                         % (d.inverse.shape[0], t, top_k))
    block_m = rows // tiles if tiles else 0
    if not tiles or block_m * tiles != rows or block_m & (block_m - 1) or rows != M.dispatch_rows(
            t, top_k, num_groups, block_m):
        raise ValueError("dispatch: sorted_route_ids (%d rows) and tile_expert (%d tiles) do not form a moe_dispatch "
                         "of %d routes over %d experts" % (rows, tiles, t * top_k, num_groups))
    if not MIN_BLOCK_M <= block_m <= MAX_BLOCK_M:
        raise ValueError("dispatch: block_m %d is outside [%d, %d] (the grouped GEMM's row tile); build it with "
                         "fray.moe_dispatch(..., block_m=%d or more)" % (block_m, MIN_BLOCK_M, MAX_BLOCK_M, MIN_BLOCK_M))
    return block_m


def _check_dispatch_values(d, n_routes, num_groups):
    """A dispatch's contents (numpy arrays): what the kernels index with must stay in range."""
    routes, tiles, num = (np.asarray(v) for v in (d.sorted_route_ids, d.tile_expert, d.num_tiles))
    if routes.size and (routes.min() < 0 or routes.max() > n_routes):
        raise ValueError("dispatch: sorted_route_ids hold values in [%d, %d], expected [0, %d] (T * k the padding)"
                         % (routes.min(), routes.max(), n_routes))
    if not 0 <= int(num[0]) <= tiles.size:
        raise ValueError("dispatch: num_tiles is %d, expected [0, %d]" % (int(num[0]), tiles.size))
    used = tiles[:int(num[0])]
    if used.size and (used.min() < 0 or used.max() >= num_groups):
        raise ValueError("dispatch: tile_expert holds experts in [%d, %d] among the used tiles, expected [0, %d)"
                         % (used.min(), used.max(), num_groups))


def _check_routes(topk_weights, topk_ids, t, like):
    """Prepared routing: fp32 weights and int32 / int64 ids [T, k]; returns k."""
    if V.is_array(like):
        if not V.is_array(topk_weights) or not V.is_array(topk_ids):
            raise TypeError("topk_weights / topk_ids: expected numpy arrays like x")
        if not np.issubdtype(topk_ids.dtype, np.integer):
            raise TypeError("topk_ids: expected an integer array, got %s" % topk_ids.dtype)
        if topk_weights.dtype not in (np.float32, np.float64):
            raise TypeError("topk_weights: expected a float32/float64 array, got %s" % topk_weights.dtype)
    else:
        _side_tensor("topk_weights", topk_weights, like, (torch.float32,), "x")
        _side_tensor("topk_ids", topk_ids, like, (torch.int32, torch.int64), "x")
    if topk_ids.ndim != 2 or topk_ids.shape[0] != t:
        raise ValueError("topk_ids: expected shape (%d, top_k), got %s" % (t, tuple(topk_ids.shape)))
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError("topk_weights: expected topk_ids' shape %s, got %s" % (tuple(topk_ids.shape),
                                                                               tuple(topk_weights.shape)))
    return topk_ids.shape[1]


def _to64(a):
    return np.asarray(a, np.float64) if V.is_array(a) else a.detach().double().numpy()


def _ref_dtype(x):
    return _NP_DTYPES[x.dtype] if V.is_array(x) else x.dtype


def _as_output(values, like, out, rows=None):
    """float64 values rounded to like's dtype into out (or a new array / tensor); rows: which rows
    to write (the rest of a new output are zeros)."""
    res = ref.round_to(values, _ref_dtype(like))
    if V.is_array(like):
        dst = np.zeros(values.shape, like.dtype) if out is None else out
        if rows is None:
            dst[...] = res
        else:
            dst[rows] = res[rows]
        return dst
    src = torch.from_numpy(res).to(like.dtype)
    dst = torch.zeros(values.shape, dtype=like.dtype) if out is None else out
    if rows is None:
        dst.copy_(src)
    else:
        keep = torch.from_numpy(np.asarray(rows, bool))
        dst[keep] = src[keep]
    return dst


# ---------------------------------------------------------------------------------------------
# GPU launches (fray_triton.moe_gemm); validated callers only

def _routing_dispatch(ids, emap, num_experts, block_m):
    from fray_triton import moe as tmoe
    outs = M._dispatch_outputs(ids, num_experts, block_m)
    tmoe.dispatch(ids, emap, num_experts, block_m, *outs)
    return outs[:6]


# The CUDA explicit grouped GEMM (cuda/moe/grouped_gemm_sm90.cuh): CUTLASS's pointer-array kernel,
# one configuration per JIT translation unit, chosen per bucket by fray.tune.
_CT = {torch.bfloat16: "cutlass::bfloat16_t", torch.float16: "cutlass::half_t"}
CUDA_CANDIDATES = [
    {"tile": "128x128x64", "cluster": "1x1", "schedule": "coop"},
    {"tile": "128x256x64", "cluster": "1x1", "schedule": "coop"},
    {"tile": "128x128x64", "cluster": "2x1", "schedule": "coop"},
    {"tile": "64x128x64", "cluster": "1x1", "schedule": "pingpong"},
    {"tile": "64x256x64", "cluster": "1x1", "schedule": "pingpong"},
]
_TMA_ELEMS = 8  # 16 bytes of bf16 / fp16


def cuda_kernel_source(config, dtype, layout):
    """(name, translation unit) of one grouped-GEMM configuration."""
    tm, tn, tk = (int(v) for v in config["tile"].split("x"))
    cm, cn = (int(v) for v in config["cluster"].split("x"))
    coop = config["schedule"] == "coop"
    name = "grouped_gemm_sm90_%s_%s_%s_c%s_%s" % (V.DTYPE_NAMES[dtype], layout, config["tile"], config["cluster"],
                                                 "coop" if coop else "pp")
    src = ('#include "cuda/moe/grouped_gemm_sm90.cuh"\n'
           "using Config = fray::moe::Sm90GroupedConfig<%s, fray::moe::kLayout%s, %d, %d, %d, %d, %d, "
           "fray::gemm::%s>;\nFRAY_GROUPED_GEMM_ENTRY(Config)\n" % (
               _CT[dtype], layout.upper(), tm, tn, tk, cm, cn, "kCooperative" if coop else "kPingpong"))
    return name, src


def cuda_ok(a, b, out, layout):
    """Whether the TMA kernel takes these operands as they are (16-byte bases, rows and strides)."""
    def aligned(t, *strides):
        return t.data_ptr() % 16 == 0 and all(st % _TMA_ELEMS == 0 for st in strides)
    g, n, k = _matrix_dims("b", b, layout)
    inner_ok = b.stride(2) == 1
    ldb = b.stride(1)
    return (inner_ok and n % _TMA_ELEMS == 0 and k % _TMA_ELEMS == 0 and aligned(a, a.stride(0))
            and aligned(b, ldb, b.stride(0)) and aligned(out, out.stride(0)))


def _cuda_bucket(m, n, k, g, layout):
    return "%s:rows_per_group%d:n%d:k%d" % (layout, 1 << max(0, (max(1, m // max(g, 1)) - 1).bit_length()), n, k)


def _explicit_cuda(a, b, offsets, out, layout):
    from fray import jit, tune
    m, k = a.shape
    g, n, _ = _matrix_dims("b", b, layout)
    dev = a.device.index if a.device.index is not None else torch.cuda.current_device()
    if not cuda_ok(a, b, out, layout):
        raise ValueError("a / b / out: the CUDA grouped GEMM reads and writes by TMA: it needs 16-byte aligned "
                         "tensors, N and K multiples of 8, contiguous matrix rows and row strides multiples of 8 "
                         "elements (use backend='triton' for other layouts)")
    ints = (m, n, k, g, a.stride(0), b.stride(1), b.stride(0), out.stride(0))

    def launcher(kern, a_, b_, offs_, out_):
        ptrs = (a_.data_ptr(), b_.data_ptr(), offs_.data_ptr(), out_.data_ptr())
        stream = B.current_stream(a_.device)
        ws = torch.empty(kern.workspace_bytes(ptrs, ints, (), dev, stream), dtype=torch.uint8, device=a_.device)
        return lambda: kern.launch(ptrs + (ws.data_ptr(),), ints, (), dev, B.current_stream(a_.device))

    def build(configs):
        return jit.build_many([cuda_kernel_source(c, a.dtype, layout) + ((),) for c in configs], device=dev)

    tuning = {}

    def scratch():
        if "out" not in tuning:
            tuning["out"] = torch.empty_like(out)
            tuning["ref"] = torch.empty_like(out)
            _explicit(a, b, offsets, tuning["ref"], layout)  # the Triton kernel's result: the check's oracle
        return tuning["out"]

    def run(config, kern):
        launcher(kern, a, b, offsets, scratch())()

    def check(config, kern):
        o = scratch()
        o.fill_(float("nan"))
        launcher(kern, a, b, offsets, o)()
        offs = offsets.cpu().tolist()
        lo, hi = max(0, min(offs[0], m)), max(0, min(offs[-1], m))
        got, want = o[lo:hi].float(), tuning["ref"][lo:hi].float()
        # two roundings to the dtype apart at most (each kernel rounds its fp32 sum once)
        bound = 2.0 ** -6 * want.abs() + 1e-3 * want.abs().max().clamp(min=1e-30)
        if not bool(((got - want).abs() <= bound).all()):
            raise AssertionError("grouped_gemm_sm90 %s differs from the Triton kernel" % config)

    config = tune.choose("grouped_gemm_sm90", _cuda_bucket(m, n, k, g, layout), V.DTYPE_NAMES[a.dtype],
                         CUDA_CANDIDATES, build=build, run=run, check=check, default=CUDA_CANDIDATES[0],
                         flops=2.0 * m * n * k, bytes=float(g * n * k * a.element_size()), device=dev)
    tuning.clear()
    name, src = cuda_kernel_source(config, a.dtype, layout)
    launcher(jit.build(name, src, device=dev), a, b, offsets, out)()


def _explicit(a, b, offsets, out, layout):
    from fray_triton import moe_gemm as tg
    m, k = a.shape
    g, n, _ = _matrix_dims("b", b, layout)
    # rows per group, as for a dispatch (64-row tiles at 384 rows a group ran 1539 us where the
    # fused layer's 128-row GEMM 1 of the same shape ran 1038, H100 2026-12-07)
    block_m = block_m_for(max(1, m // max(g, 1)))
    cfg = gemm_config(block_m, n, k, rows_contiguous=True)
    max_tiles = tg.max_tiles_explicit(m, g, block_m)
    dev, i32 = a.device, torch.int32
    tile_group = torch.empty(max_tiles, dtype=i32, device=dev)
    tile_start = torch.empty(max_tiles, dtype=i32, device=dev)
    tile_end = torch.empty(max_tiles, dtype=i32, device=dev)
    num_tiles = torch.empty(1, dtype=i32, device=dev)
    tg.tile_map(offsets, g, m, block_m, tile_group, tile_start, tile_end, num_tiles)
    tg.launch(a, b, out, b_nk=layout == "nk", n=n, n_b=n, k=k, config=cfg, max_tiles=max_tiles,
              num_tiles=num_tiles, tile_group=tile_group, tile_start=tile_start, tile_end=tile_end,
              a_mode=tg.A_CONTIGUOUS, out_mode=tg.OUT_ROWS)


def _routes(x, b, sorted_ids, tile_expert, num_tiles, out, top_k, layout):
    from fray_triton import moe_gemm as tg
    t, k = x.shape
    _, n, _ = _matrix_dims("b", b, layout)
    tiles = tile_expert.shape[0]
    block_m = sorted_ids.shape[0] // tiles
    tg.launch(x, b, out, b_nk=layout == "nk", n=n, n_b=n, k=k, config=gemm_config(block_m, n, k),
              max_tiles=tiles, num_tiles=num_tiles, tile_group=tile_expert, routes=sorted_ids,
              a_mode=tg.A_GATHER, out_mode=tg.OUT_ROUTES, n_routes=t * top_k, top_k=top_k)


def _routes_cuda(x, b, sorted_ids, offsets, out, top_k, layout, gemm=None):
    """grouped_gemm's dispatch form on the CUDA grouped GEMM: the token rows copied into the
    dispatch's padded order (the padding rows zeros), one GEMM over the padded expert segments
    (the dispatch's expert_offsets), the rows copied back into route order."""
    from fray_triton import moe_gemm as tg
    gemm = _explicit_cuda if gemm is None else gemm
    t, kdim = x.shape
    e, n, _ = _matrix_dims("b", b, layout)
    rows = sorted_ids.shape[0]
    xs = torch.empty((rows, kdim), dtype=x.dtype, device=x.device)
    ys = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if gemm is _explicit_cuda and not cuda_ok(xs, b, ys, layout):
        _refuse_cuda_weights("b", "K and N")
    tg.gather_rows(x, sorted_ids, top_k, xs, offsets[e:])  # offsets[E]: the used (padded) rows
    gemm(xs, b, offsets, ys, layout)
    tg.scatter_rows(ys, sorted_ids, t * top_k, out)


def _combine_mode(combine, top_k):
    # "auto": atomics cost no staging buffer and no second pass, and with k <= 4 contributions per
    # element they rarely contend (the seed's provisional rule); beyond, the staged gather.
    if combine == "auto":
        return "atomic" if top_k <= 4 else "staged"
    return combine


def _launch_combined(a, b, out, mode, routes, inverse, top_k, common):
    """A weighted grouped-GEMM launch (common: tg.launch's arguments but the output and its mode)
    and the combine of each token's k weighted rows into out [T, N]."""
    from fray_triton import moe_gemm as tg
    t, n = out.shape
    if mode == "atomic":
        acc = torch.zeros((t, n), dtype=torch.float32, device=out.device)
        tg.launch(a, b, acc, out_mode=tg.OUT_ATOMIC, **common)
        out.copy_(acc)
        return
    # scatter_combine reads every row of staged (index_add_ over all of them, the padding rows
    # into a discarded row): zeros, so that no padding row is read uninitialised (initcheck)
    alloc = torch.zeros if mode == "scatter" else torch.empty
    staged = alloc((routes.shape[0], n), dtype=out.dtype, device=out.device)
    tg.launch(a, b, staged, out_mode=tg.OUT_ROWS, **common)
    if mode == "staged":
        tg.combine_staged(staged, inverse, out, top_k)
    else:
        tg.scatter_combine(staged, routes, t * top_k, top_k, out)


def _second_gemm(h, b, weights, routes, tile_expert, num_tiles, inverse, out, t, top_k, layout, combine,
                 weighted, block_m):
    """GEMM 2 over rows already in sorted order, the routing weight in the epilogue, and the
    combine into out [T, N]."""
    from fray_triton import moe_gemm as tg
    e, n, k = _matrix_dims("b", b, layout)
    common = dict(b_nk=layout == "nk", n=n, n_b=n, k=k, config=gemm_config(block_m, n, k, rows_contiguous=True),
                  max_tiles=grid_tiles(t * top_k, e, block_m, tile_expert.shape[0]), num_tiles=num_tiles,
                  tile_group=tile_expert, routes=routes, a_mode=tg.A_SORTED, weights=weights, n_routes=t * top_k,
                  top_k=top_k, weighted=weighted)
    _launch_combined(h, b, out, _combine_mode(combine, top_k), routes, inverse, top_k, common)


def _fused(x, w13, w2, weights, ids, emap, out, activation, weight_on_input, layout, combine):
    from fray_triton import moe_gemm as tg
    t, hdim = x.shape
    top_k = ids.shape[1]
    e, n13, _ = _matrix_dims("w13", w13, layout)
    inter = n13 // 2
    block_m = block_m_for(max(1, t * top_k // e))
    sorted_ids, _, tile_expert, num_tiles, inverse, _ = _routing_dispatch(ids, emap, e, block_m)
    rows = sorted_ids.shape[0]
    h = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    tg.launch(x, w13, h, b_nk=layout == "nk", n=inter, n_b=n13, k=hdim,
              config=gemm_config(block_m, inter, hdim, gated=True),
              max_tiles=grid_tiles(t * top_k, e, block_m, tile_expert.shape[0]), num_tiles=num_tiles,
              tile_group=tile_expert, routes=sorted_ids, a_mode=tg.A_GATHER, out_mode=tg.OUT_ROWS, weights=weights,
              n_routes=t * top_k, top_k=top_k, gated=True, act=tg.ACT_CODES[activation], n_half=inter,
              weight_input=weight_on_input)
    _second_gemm(h, w2, weights, sorted_ids, tile_expert, num_tiles, inverse, out, t, top_k, layout, combine,
                 not weight_on_input, block_m)


def _sorted_dispatch(ids, emap, num_experts):
    """The routes sorted by expert with no padding (moe_dispatch at block_m 1, without its tile
    map, which the CUDA grouped GEMM does not read): (sorted_route_ids [T*k], the sentinel T*k past
    the kept routes; expert_offsets [E + 1], expert e's routes at rows [offsets[e], offsets[e+1]);
    inverse [T*k], route -> row or -1)."""
    from fray_triton import moe as tmoe
    n = ids.numel()
    dev, i32 = ids.device, torch.int32
    sorted_ids = torch.empty((n,), dtype=i32, device=dev)
    offsets = torch.empty((num_experts + 1,), dtype=i32, device=dev)
    inverse = torch.empty((n,), dtype=i32, device=dev)
    tmoe.dispatch(ids, emap, num_experts, 1, sorted_ids, offsets, torch.empty((1,), dtype=i32, device=dev),
                  torch.empty((1,), dtype=i32, device=dev), inverse, torch.zeros((num_experts,), dtype=i32, device=dev),
                  torch.zeros(tmoe.block_counts_shape(n, num_experts), dtype=i32, device=dev), max_tiles=0)
    return sorted_ids, offsets, inverse


CUDA_COMBINES = ("auto", "staged")


def _require_cuda_combine(combine):
    if combine not in CUDA_COMBINES:
        raise ValueError("combine: backend='cuda' combines staged (its GEMMs write whole rows, no atomics): expected "
                         "'auto' or 'staged', got %r (use backend='triton' for %r)" % (combine, combine))


def _refuse_cuda_weights(names, dims):
    raise ValueError("%s: backend='cuda' reads the weights by TMA: it needs %s multiples of 8 and 16-byte aligned "
                     "stacks with contiguous rows (use backend='triton' for these)" % (names, dims))


def _fused_cuda(x, w13, w2, weights, ids, emap, out, activation, weight_on_input, layout, combine, gemm=None):
    """fused_moe on the CUDA grouped GEMM (CUTLASS's pointer-array kernel, cuda/moe): the token
    rows copied into expert-sorted order, GEMM 1 into [rows, 2I], the gated activation, GEMM 2
    into [rows, H], and the staged combine weighing each row. The same roundings as the Triton
    path (fray.reference.moe.fused_moe): g, the activation's product, y, y * w, the fp32 sum.
    gemm: the explicit grouped GEMM to run (the CUDA kernel; the tests put the Triton one there
    to check the rest under the interpreter)."""
    from fray_triton import moe_gemm as tg
    _require_cuda_combine(combine)
    gemm = _explicit_cuda if gemm is None else gemm
    t, hdim = x.shape
    top_k = ids.shape[1]
    e, n13, _ = _matrix_dims("w13", w13, layout)
    inter = n13 // 2
    rows = t * top_k
    xs = torch.empty((rows, hdim), dtype=x.dtype, device=x.device)
    g = torch.empty((rows, n13), dtype=x.dtype, device=x.device)
    h = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    if gemm is _explicit_cuda and not (cuda_ok(xs, w13, g, layout) and cuda_ok(h, w2, xs, layout)):
        _refuse_cuda_weights("w13 / w2", "H and I")
    sorted_ids, offsets, inverse = _sorted_dispatch(ids, emap, e)
    kept = offsets[e:]  # offsets[E]: the kept routes; the rows past them are neither written nor read
    tg.gather_rows(x, sorted_ids, top_k, xs, kept, weights=weights if weight_on_input else None)
    gemm(xs, w13, offsets, g, layout)
    tg.gated_rows(g, sorted_ids, rows, h, tg.ACT_CODES[activation], kept)
    y = xs  # the sorted token rows are dead once GEMM 1 has read them
    gemm(h, w2, offsets, y, layout)
    tg.combine_staged(y, inverse, out, top_k, None if weight_on_input else weights)


def _routed_cuda(x, b, weights, ids, out, layout, combine, gemm=None):
    """routed_grouped_gemm on the CUDA grouped GEMM, as _fused_cuda: the token rows copied into
    expert-sorted order, one GEMM (its output rounded), and the staged combine weighing each row
    (round(y * w)) and summing a token's rows in rank order."""
    from fray_triton import moe_gemm as tg
    _require_cuda_combine(combine)
    gemm = _explicit_cuda if gemm is None else gemm
    t, kdim = x.shape
    top_k = ids.shape[1]
    e, n, _ = _matrix_dims("b", b, layout)
    rows = t * top_k
    xs = torch.empty((rows, kdim), dtype=x.dtype, device=x.device)
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if gemm is _explicit_cuda and not cuda_ok(xs, b, y, layout):
        _refuse_cuda_weights("expert_weights", "K and N")
    sorted_ids, offsets, inverse = _sorted_dispatch(ids, None, e)
    tg.gather_rows(x, sorted_ids, top_k, xs, offsets[e:])
    gemm(xs, b, offsets, y, layout)
    tg.combine_staged(y, inverse, out, top_k, weights)


def _routed(x, b, weights, ids, out, layout, combine):
    from fray_triton import moe_gemm as tg
    t, _ = x.shape
    top_k = ids.shape[1]
    e, n, kdim = _matrix_dims("b", b, layout)
    block_m = block_m_for(max(1, t * top_k // e))
    sorted_ids, _, tile_expert, num_tiles, inverse, _ = _routing_dispatch(ids, None, e, block_m)
    common = dict(b_nk=layout == "nk", n=n, n_b=n, k=kdim, config=gemm_config(block_m, n, kdim),
                  max_tiles=grid_tiles(t * top_k, e, block_m, tile_expert.shape[0]), num_tiles=num_tiles,
                  tile_group=tile_expert, routes=sorted_ids, a_mode=tg.A_GATHER, weights=weights, n_routes=t * top_k,
                  top_k=top_k, weighted=True)
    _launch_combined(x, b, out, _combine_mode(combine, top_k), sorted_ids, inverse, top_k, common)


# The custom ops: what a torch.compile'd graph calls (and what eager calls run too).

def _route_backend(backend, x):
    """The backend of a layer's routing step: moe_route has a Triton kernel only, so a layer run on
    "cuda" (asked by backend= or by FRAY_BACKEND) routes on Triton."""
    asked = env.backend_override() if backend == "auto" else backend
    if asked == "cuda" and not V.is_array(x) and x.device.type == "cuda":
        return "triton"
    return backend


def _auto(backend):
    """Whether the caller left the backend to Fray (neither backend= nor FRAY_BACKEND names one)."""
    return backend == "auto" and env.backend_override() is None


@P.custom_op("fray::grouped_gemm", mutates_args=("out",))
def _grouped_gemm_op(a: torch.Tensor, b: torch.Tensor, group_offsets: torch.Tensor, out: torch.Tensor,
                     b_layout: str, backend: str) -> None:
    be = B.resolve("grouped_gemm", FAMILY, backend, a.device)
    if be == "cuda" and _auto(backend) and not cuda_ok(a, b, out, b_layout):
        be = "triton"
    with torch.cuda.device(a.device):
        (_explicit_cuda if be == "cuda" else _explicit)(a, b, group_offsets, out, b_layout)


@P.custom_op("fray::grouped_gemm_routes", mutates_args=("out",))
def _grouped_gemm_routes_op(x: torch.Tensor, b: torch.Tensor, sorted_route_ids: torch.Tensor,
                            expert_offsets: torch.Tensor, tile_expert: torch.Tensor, num_tiles: torch.Tensor,
                            out: torch.Tensor, top_k: int, b_layout: str, backend: str) -> None:
    # "auto" keeps the dispatch form on Triton, which gathers inside its loads (the CUDA path
    # copies the rows in and out around its GEMM over the dispatch's padded expert segments)
    cuda = B.resolve("grouped_gemm", FAMILY, backend, x.device) == "cuda" and not _auto(backend)
    with torch.cuda.device(x.device):
        if cuda:
            _routes_cuda(x, b, sorted_route_ids, expert_offsets, out, top_k, b_layout)
        else:
            _routes(x, b, sorted_route_ids, tile_expert, num_tiles, out, top_k, b_layout)


@P.custom_op("fray::routed_gemm", mutates_args=("out",))
def _routed_gemm_op(x: torch.Tensor, b: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    out: torch.Tensor, b_layout: str, combine: str, backend: str) -> None:
    fn = _routed_cuda if B.resolve("routed_grouped_gemm", FAMILY, backend, x.device) == "cuda" else _routed
    with torch.cuda.device(x.device):
        fn(x, b, topk_weights, topk_ids, out, b_layout, combine)


@P.custom_op("fray::fused_moe", mutates_args=("out",))
def _fused_moe_op(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor], out: torch.Tensor, activation: str,
                  apply_router_weight_on_input: bool, w_layout: str, combine: str, backend: str) -> None:
    fn = _fused_cuda if B.resolve("fused_moe", FAMILY, backend, x.device) == "cuda" else _fused
    if env.check_indices():
        M._device_check_ids(topk_ids, expert_map, w13.shape[0])
    with torch.cuda.device(x.device):
        fn(x, w13, w2, topk_weights, topk_ids, expert_map, out, activation, apply_router_weight_on_input, w_layout,
           combine)


for _custom in (_grouped_gemm_op, _grouped_gemm_routes_op, _routed_gemm_op, _fused_moe_op):
    _custom.register_fake(lambda *args, **kwargs: None)


class _FusedPlan:
    """An eager fused_moe call whose arguments were validated once for this signature
    (fray._plan): routing (moe_route's own plan), the output, the launches."""

    __slots__ = ("route", "args", "shape", "trivial", "fn")

    def __init__(self, route, args, shape, trivial, fn):
        self.route, self.args, self.shape, self.trivial, self.fn = route, args, shape, trivial, fn

    def __call__(self, x, w13, w2, logits, w, ids, bias, emap, out):
        if self.route is not None:
            w, ids = M.moe_route(logits, correction_bias=bias, **self.route)
        return self.launch(x, w13, w2, w, ids, emap, out)

    def launch(self, x, w13, w2, w, ids, emap, out):
        if out is None:
            out = torch.empty(self.shape, dtype=x.dtype, device=x.device)
        if self.trivial:
            return out.zero_() if out.numel() else out
        with torch.cuda.device(x.device):
            self.fn(x, w13, w2, w, ids, emap, out, *self.args)
        return out


_compiling = P.compiling


# ---------------------------------------------------------------------------------------------
# public API

def grouped_gemm(a, b, group_offsets=None, *, dispatch=None, top_k=None, b_layout="nk", out=None, backend="auto"):
    """A grouped GEMM: row groups of a times their group's matrix, fp32 accumulation, one rounding.

    Explicit metadata (the seed's form): a [M, K]; b [G, N, K] (b_layout="nk", nn.Linear's weight
    per group) or [G, K, N] ("kn"); group_offsets int32 [G + 1], nondecreasing in [0, M]: group g
    owns rows [offsets[g], offsets[g+1]), and out[i] = a[i] @ B_g for those rows; rows outside
    [offsets[0], offsets[G]) are not written. Returns out [M, N] in a's dtype.

    From a dispatch: dispatch=fray.moe_dispatch(topk_ids, G, block_m) (block_m in [16, 256]) and
    top_k=k; a is x [T, K], one row per token, and the kernel gathers row r // k for route r itself
    (no expanded copy of x). Returns out [T * k, N] in route order: out[r] = x[r // k] @ B_{e(r)};
    the rows of routes an expert_map dropped are not written.

    bf16 / fp16 (a and b alike); a and out need a contiguous last dimension, b may have any
    strides (the TMA paths take a contiguous b). CUDA tensors, on the current stream, with no host
    synchronisation after the first call for a shape bucket (which builds and tunes the CUDA
    kernel), CUDA-graph capturable: backend="auto" runs the explicit form on the CUDA kernel
    (CUTLASS's pointer-array GEMM, JIT-compiled) wherever its TMA loads take the operands (16-byte
    aligned bases and row strides, N and K multiples of 8, contiguous b), else on the Triton
    kernel, and the dispatch form on the Triton kernel, which gathers the rows inside its loads
    (backend="cuda" runs the dispatch form on the CUDA kernel too: the rows copied into the
    dispatch's padded order, the GEMM over its padded segments, the rows copied back; K and N
    multiples of 8); offsets and dispatch tensors are trusted there (FRAY_CHECK_INDICES=1 checks
    the offsets with one synchronisation). CPU tensors and numpy arrays: the float64 reference.
    """
    V.require_backend(backend, B.BACKENDS)
    layout = _choice("b_layout", b_layout, LAYOUTS)
    if (group_offsets is None) == (dispatch is None):
        raise ValueError("group_offsets / dispatch: pass exactly one (explicit group offsets, or a moe_dispatch "
                         "with top_k)")
    _operand("a", a, 2)
    _unit_last("a", a)
    _operand("b", b, 3, a, "a")
    g, n, k = _matrix_dims("b", b, layout)
    if k != a.shape[1]:
        raise ValueError("b: expected K = %d (a's columns) in layout %r, got shape %s" % (a.shape[1], layout,
                                                                                         tuple(b.shape)))
    array = V.is_array(a)
    on_cpu = array or a.device.type == "cpu"
    if group_offsets is not None:
        if top_k is not None:
            raise ValueError("top_k: only with dispatch= (the explicit form's rows are a's own)")
        _int_tensor("group_offsets", group_offsets, a)
        if group_offsets.shape[0] != g + 1:
            raise ValueError("group_offsets: expected shape (%d,) (G + 1 for b's %d groups), got %s"
                             % (g + 1, g, tuple(group_offsets.shape)))
        m = a.shape[0]
        _check_out(out, (m, n), a)
        if on_cpu:
            V.require_cpu_backend(backend, "a")
            offs = group_offsets if array else group_offsets.numpy()
            _check_offsets_values(offs, m)
            res, rows = ref.grouped_gemm(_to64(a), _to64(b), offs, layout)
            return _as_output(res, a, out, rows)
        if env.check_indices():
            V.device_index_check("group_offsets", lambda: _check_offsets_values(group_offsets.cpu().numpy(), m))
        out = torch.empty((m, n), dtype=a.dtype, device=a.device) if out is None else out
        if m and n:
            if g == 0:
                return out
            _grouped_gemm_op(a, b, group_offsets, out, layout, backend)
        return out
    top_k = _int("top_k", top_k, 1, M.MAX_TOP_K)
    t = a.shape[0]
    block_m = _check_dispatch(dispatch, t, top_k, g, a)
    _check_out(out, (t * top_k, n), a)
    if on_cpu:
        V.require_cpu_backend(backend, "a")
        _check_dispatch_values(dispatch if array else M.MoeDispatch(*(v.numpy() for v in dispatch)), t * top_k, g)
        routes = np.asarray(dispatch.sorted_route_ids if array else dispatch.sorted_route_ids.numpy(), np.int64)
        tiles = np.asarray(dispatch.tile_expert if array else dispatch.tile_expert.numpy(), np.int64)
        ids = np.full(t * top_k, -1, np.int64)
        for row, r in enumerate(routes):
            if r < t * top_k:
                ids[r] = tiles[row // block_m]
        res, written = ref.routes_gemm(_to64(a), _to64(b), ids.reshape(t, top_k), layout, None)
        return _as_output(res, a, out, written)
    if env.check_indices():
        V.device_index_check("dispatch", lambda: _check_dispatch_values(
            M.MoeDispatch(*(v.cpu().numpy() for v in dispatch)), t * top_k, g))
    out = torch.empty((t * top_k, n), dtype=a.dtype, device=a.device) if out is None else out
    if t and n:
        _grouped_gemm_routes_op(a, b, dispatch.sorted_route_ids, dispatch.expert_offsets, dispatch.tile_expert,
                                dispatch.num_tiles, out, top_k, layout, backend)
    return out


def routed_grouped_gemm(x, expert_weights, logits, top_k, *, combine="auto", b_layout="nk", renormalize=True,
                        out=None, backend="auto"):
    """A one-matrix MoE: route each token to its top_k experts by softmax over logits [T, E] (as
    fray.moe_route, renormalised unless renormalize=False), then
        out[t] = sum_j round(round(x[t] @ W_{e_tj}) * w_tj)
    the projection rounded to x's dtype, times the routing weight, rounded again, summed in fp32
    and rounded once (the seed's routed_grouped_gemm).

    x [T, K] bf16 / fp16; expert_weights [E, N, K] ("nk") or [E, K, N] ("kn"). combine: "atomic"
    (fp32 atomics into a zeroed [T, N] buffer, then a cast: the order of the adds is not fixed, so
    results may differ run to run within fp32 rounding), "staged" (the weighted route rows are
    written in expert order, then each token's k rows are gathered through the dispatch's inverse
    map and summed in rank order: bit-identical run to run, no zeroing, no atomics), "scatter"
    (those rows index_add'ed into fp32 with torch: the baseline), "auto" (atomic for top_k <= 4,
    else staged). Returns out [T, N]. backend "cuda": the CUDA grouped GEMM over the token rows
    copied into expert order, then the staged combine weighing the rows (fused_moe's CUDA path;
    K and N multiples of 8, combine "auto" / "staged" only); "auto" takes Triton.
    """
    V.require_backend(backend, B.BACKENDS)
    layout = _choice("b_layout", b_layout, LAYOUTS)
    combine = _choice("combine", combine, COMBINES)
    _operand("x", x, 2)
    _unit_last("x", x)
    _operand("expert_weights", expert_weights, 3, x, "x")
    e, n, k = _matrix_dims("expert_weights", expert_weights, layout)
    if k != x.shape[1]:
        raise ValueError("expert_weights: expected K = %d (x's columns) in layout %r, got shape %s"
                         % (x.shape[1], layout, tuple(expert_weights.shape)))
    if V.is_array(x) != V.is_array(logits):
        raise TypeError("logits: expected a %s like x, got %s" % ("numpy.ndarray" if V.is_array(x) else "torch.Tensor",
                                                                  type(logits).__name__))
    if not V.is_array(logits):
        V.require_tensor("logits", logits)
        V.require_same_device([("x", x), ("logits", logits)])
    if logits.ndim != 2 or tuple(logits.shape) != (x.shape[0], e):
        raise ValueError("logits: expected shape (%d, %d) (tokens, experts), got %s" % (x.shape[0], e,
                                                                                       tuple(logits.shape)))
    top_k = _int("top_k", top_k, 1, min(e, M.MAX_TOP_K))
    t = x.shape[0]
    _check_out(out, (t, n), x)
    weights, ids = M.moe_route(logits, top_k, renormalize=renormalize, backend=_route_backend(backend, x))
    if V.is_array(x) or x.device.type == "cpu":
        res, _, _ = ref.routed_gemm(_to64(x), _to64(expert_weights), np.asarray(weights, np.float64),
                                    np.asarray(ids), _ref_dtype(x), layout)
        return _as_output(res, x, out)
    out = torch.empty((t, n), dtype=x.dtype, device=x.device) if out is None else out
    if t and n:
        if k == 0:
            return out.zero_()
        _routed_gemm_op(x, expert_weights, weights, ids, out, layout, combine, backend)
    return out


def fused_moe(x, w13, w2, *, router_logits=None, topk_weights=None, topk_ids=None, top_k=None, activation="silu",
              renormalize=True, scoring="softmax", num_expert_group=None, topk_group=None, correction_bias=None,
              routed_scaling_factor=1.0, expert_map=None, apply_router_weight_on_input=False, w_layout="nk",
              combine="auto", out=None, backend="auto"):
    """The mixture-of-experts layer: route -> dispatch -> GEMM 1 with the gated activation in its
    epilogue -> GEMM 2 with the routing weight in its epilogue -> combine. Returns out [T, H].

    x [T, H] bf16 / fp16. Weights (layouts named by w_layout, never guessed): "nk" (vLLM's,
    nn.Linear's): w13 [E, 2I, H], w2 [E, H, I]; "kn" (the seed's): w13 [E, H, 2I], w2 [E, I, H].
    w13's first I outputs are the gate, the next I the up projection.
    Routing: router_logits [T, E_global] with top_k and the moe_route options (scoring,
    renormalize, num_expert_group, topk_group, correction_bias, routed_scaling_factor), or prepared
    topk_weights fp32 [T, k] and topk_ids int32 / int64 [T, k]. expert_map int32 [E_global]:
    global id -> local id in [0, E) (the experts w13 / w2 hold) or -1 (not on this rank: the route
    contributes zero).
    Per token t, for each route (t, j) of a kept expert e:
        xin = x[t], or round(x[t] * w_tj) when apply_router_weight_on_input
        g = round(xin @ W13_e); h = round(act(g[:I]) * g[I:]); y = round(h @ W2_e)
        y = round(y * w_tj) unless the weight went on the input
        out[t] = round(sum_j y)   (fp32 sum; rank order for combine="staged")
    act: "silu", "gelu" (erf) or "gelu_tanh". combine: as routed_grouped_gemm's ("auto": atomic
    for top_k <= 4, else staged; "staged" is bit-identical run to run).
    backend: "triton" (what "auto" takes) fuses the row gather into GEMM 1's loads, the activation
    into its epilogue and the weight into GEMM 2's; "cuda" runs both GEMMs on CUTLASS's grouped
    GEMM (fray.jit, built and tuned on the first call per shape bucket) with the routes sorted
    unpadded, the token rows copied into that order, the activation and the weighing combine as
    separate passes: the same roundings; H and I multiples of 8, weight stacks with contiguous
    16-byte aligned rows, combine "auto" / "staged" (staged: bit-identical run to run).
    """
    key = None
    if not _compiling() and not env.check_indices():
        key = P.signature("fused_moe", backend, (x, w13, w2, router_logits, topk_weights, topk_ids, correction_bias,
                                                 expert_map, out),
                          (top_k, activation, renormalize, scoring, num_expert_group, topk_group, routed_scaling_factor,
                           apply_router_weight_on_input, w_layout, combine))
        plan = P.PLANS.get(key)
        if plan is not None:
            return plan(x, w13, w2, router_logits, topk_weights, topk_ids, correction_bias, expert_map, out)
    V.require_backend(backend, B.BACKENDS)
    layout = _choice("w_layout", w_layout, LAYOUTS)
    activation = _choice("activation", activation, ACTIVATIONS)
    combine = _choice("combine", combine, COMBINES)
    if not isinstance(apply_router_weight_on_input, (bool, np.bool_)):
        raise TypeError("apply_router_weight_on_input: expected a bool, got %s"
                        % type(apply_router_weight_on_input).__name__)
    _operand("x", x, 2)
    _unit_last("x", x)
    _operand("w13", w13, 3, x, "x")
    _operand("w2", w2, 3, x, "x")
    t, hdim = x.shape
    e, n13, k13 = _matrix_dims("w13", w13, layout)
    if k13 != hdim or n13 % 2:
        raise ValueError("w13: expected [E, 2I, %d] (w_layout 'nk') or [E, %d, 2I] ('kn') for x's H = %d, got shape %s"
                         % (hdim, hdim, hdim, tuple(w13.shape)))
    inter = n13 // 2
    e2, n2, k2 = _matrix_dims("w2", w2, layout)
    if (e2, n2, k2) != (e, hdim, inter):
        want = (e, hdim, inter) if layout == "nk" else (e, inter, hdim)
        raise ValueError("w2: expected shape %s (E, H, I in w_layout %r), got %s" % (want, layout, tuple(w2.shape)))
    if (router_logits is None) == (topk_ids is None) or (topk_ids is None) != (topk_weights is None):
        raise ValueError("router_logits / topk_weights, topk_ids: pass router_logits (with top_k) or both "
                         "topk_weights and topk_ids")
    if expert_map is not None:
        M._check_expert_map(expert_map, x, e)
    e_global = e if expert_map is None else expert_map.shape[0]
    if router_logits is not None:
        if V.is_array(x) != V.is_array(router_logits):
            raise TypeError("router_logits: expected a %s like x, got %s" % (
                "numpy.ndarray" if V.is_array(x) else "torch.Tensor", type(router_logits).__name__))
        if not V.is_array(router_logits):
            V.require_tensor("router_logits", router_logits)
            V.require_same_device([("x", x), ("router_logits", router_logits)])
        if router_logits.ndim != 2 or tuple(router_logits.shape) != (t, e_global):
            raise ValueError("router_logits: expected shape (%d, %d) (tokens, experts%s), got %s" % (
                t, e_global, "" if expert_map is None else " of expert_map", tuple(router_logits.shape)))
        if top_k is None:
            raise ValueError("top_k: required with router_logits")
        topk_weights, topk_ids = M.moe_route(
            router_logits, top_k, scoring=scoring, renormalize=renormalize, num_expert_group=num_expert_group,
            topk_group=topk_group, correction_bias=correction_bias, routed_scaling_factor=routed_scaling_factor,
            backend=_route_backend(backend, x))
    k = _check_routes(topk_weights, topk_ids, t, x)
    _int("topk_ids' columns (top_k)", k, 1, M.MAX_TOP_K)
    if router_logits is None and top_k is not None and _int("top_k", top_k, 1) != k:
        raise ValueError("top_k: %d does not match topk_ids' %d columns" % (top_k, k))
    _check_out(out, (t, hdim), x)
    if V.is_array(x) or x.device.type == "cpu":
        V.require_cpu_backend(backend, "x")
        ids = np.asarray(topk_ids if V.is_array(topk_ids) else topk_ids.numpy(), np.int64)
        emap = None if expert_map is None else np.asarray(expert_map if V.is_array(expert_map) else
                                                         expert_map.numpy())
        M._check_dispatch_values(ids, emap, e)
        w = np.asarray(topk_weights if V.is_array(topk_weights) else topk_weights.numpy(), np.float64)
        res, _, _ = ref.fused_moe(_to64(x), _to64(w13), _to64(w2), w, ids, _ref_dtype(x), activation, emap,
                                  bool(apply_router_weight_on_input), layout)
        return _as_output(res, x, out)
    if _compiling():
        out = torch.empty((t, hdim), dtype=x.dtype, device=x.device) if out is None else out
        if t and hdim:
            if inter == 0 or e == 0:
                return out.zero_()
            _fused_moe_op(x, w13, w2, topk_weights, topk_ids, expert_map, out, activation,
                          bool(apply_router_weight_on_input), layout, combine, backend)
        return out
    cuda = B.resolve("fused_moe", FAMILY, backend, x.device) == "cuda"
    if cuda:
        _require_cuda_combine(combine)
    if env.check_indices():
        M._device_check_ids(topk_ids, expert_map, e)
    route = None
    if router_logits is not None:
        route = dict(top_k=top_k, scoring=scoring, renormalize=renormalize, num_expert_group=num_expert_group,
                     topk_group=topk_group, routed_scaling_factor=routed_scaling_factor,
                     backend=_route_backend(backend, x))
    plan = _FusedPlan(route, (activation, bool(apply_router_weight_on_input), layout, combine), (t, hdim),
                      not (t and hdim) or inter == 0 or e == 0, _fused_cuda if cuda else _fused)
    # this call's routing ran above (validation needs its result): launch from there
    return P.PLANS.put(key, plan).launch(x, w13, w2, topk_weights, topk_ids, expert_map, out)


# ---------------------------------------------------------------------------------------------
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

def _case_inputs(t, hdim, inter, e, k, dtype, device, seed=0):
    """x, w13 [E, 2I, H], w2 [E, H, I] scaled so values stay O(1), and routing (weights, ids)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hdim, generator=g).to(dtype).to(device)
    w13 = (torch.randn(e, 2 * inter, hdim, generator=g) / math.sqrt(hdim)).to(dtype).to(device)
    w2 = (torch.randn(e, hdim, inter, generator=g) / math.sqrt(inter)).to(dtype).to(device)
    logits = M._random_logits(t, e, torch.float32, device, seed)
    return x, w13, w2, logits


def _f64(t):
    return t.detach().double().cpu().numpy()


def check_fused(x, w13, w2, w, ids, out, what, activation="silu", expert_map=None, weight_on_input=False,
                layout="nk"):
    from fray.testing import assert_moe_close
    exp, mag, terms = ref.fused_moe(_f64(x), _f64(w13), _f64(w2), _f64(w), ids.cpu().numpy(), x.dtype, activation,
                                    None if expert_map is None else expert_map.cpu().numpy(), weight_on_input, layout)
    assert_moe_close(out, exp, mag, terms, x.dtype, what)


def check_routed(x, b, w, ids, out, what, layout="nk"):
    from fray.testing import assert_moe_close
    exp, mag, terms = ref.routed_gemm(_f64(x), _f64(b), _f64(w), ids.cpu().numpy(), x.dtype, layout)
    assert_moe_close(out, exp, mag, terms, x.dtype, what)


def check_grouped(a, b, offsets, out, what, layout="nk"):
    from fray.testing import assert_gemm_close
    offs = offsets.cpu().numpy()
    exp, rows = ref.grouped_gemm(_f64(a), _f64(b), offs, layout)
    groups = np.full(a.shape[0], -1)
    for g in range(b.shape[0]):
        groups[offs[g]:offs[g + 1]] = g
    terms = ref.term_scale(_f64(a), _f64(b), groups, layout)
    keep = torch.from_numpy(rows)
    assert_gemm_close(out.cpu()[keep], exp[rows], terms[rows], out.dtype, a.shape[1], what)


def check_cases(device):
    """On a GPU: each op at a decode and a prefill-like shape, bf16 and fp16. On the CPU: the
    reference on hand-computed values and the kernels under Triton's interpreter."""
    def fused(backend, dtype, t, hdim, inter, e, k, dev):
        x, w13, w2, logits = _case_inputs(t, hdim, inter, e, k, dtype, dev)
        w, ids = M.moe_route(logits, k)
        out = torch.empty_like(x)
        if backend == "triton-interpreter":
            _fused(x, w13, w2, w, ids, None, out, "silu", False, "nk", "staged")
        else:
            out = fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, backend=backend)
        check_fused(x, w13, w2, w, ids, out, "fused_moe")

    def routed(backend, dtype, t, hdim, n, e, k, dev):
        x, w13, _, logits = _case_inputs(t, hdim, n // 2, e, k, dtype, dev)
        w, ids = M.moe_route(logits, k)
        if backend == "triton-interpreter":
            out = torch.empty((t, n), dtype=dtype)
            _routed(x, w13, w, ids, out, "nk", "staged")
        else:
            out = routed_grouped_gemm(x, w13, logits, k, backend=backend)
        check_routed(x, w13, w, ids, out, "routed_grouped_gemm")

    def grouped(backend, dtype, m, k, n, g, dev):
        gen = torch.Generator().manual_seed(m + g)
        a = torch.randn(m, k, generator=gen).to(dtype).to(dev)
        b = (torch.randn(g, n, k, generator=gen) / math.sqrt(k)).to(dtype).to(dev)
        cuts = torch.sort(torch.randint(0, m + 1, (g + 1,), generator=gen)).values.to(torch.int32).to(dev)
        out = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
        if backend == "triton-interpreter":
            _explicit(a, b, cuts, out, "nk")
        else:
            grouped_gemm(a, b, cuts, out=out, backend=backend)
        check_grouped(a, b, cuts, out, "grouped_gemm")

    def hand():
        # two groups of one row: [1, 2] @ [[1, 0], [0, 1]]^T and [3, 4] @ [[0, 1], [1, 0]]^T
        a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
        b = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]], np.float32)
        got = grouped_gemm(a, b, np.array([0, 1, 2], np.int32))
        assert got.tolist() == [[1.0, 2.0], [4.0, 3.0]], got
        # one token, two experts with weights 0.75 / 0.25: identity and doubling matrices
        x = np.array([[1.0, -2.0]], np.float32)
        routed = routed_grouped_gemm(x, np.stack([np.eye(2), 2 * np.eye(2)]).astype(np.float32),
                                     np.array([[math.log(3.0), 0.0]]), 2)
        assert np.allclose(routed, [[1.25, -2.5]]), routed

    if device.type != "cuda":
        cases = [("grouped_gemm+routed", "reference", "fp64", "hand", hand)]
        for dtype in (torch.float16, torch.bfloat16):
            name = V.DTYPE_NAMES[dtype]
            cases += [("grouped_gemm", "triton-interpreter", name, "M37K48N40G3",
                       lambda d=dtype: grouped("triton-interpreter", d, 37, 48, 40, 3, "cpu")),
                      ("routed_grouped_gemm", "triton-interpreter", name, "T5H32N40E4k2",
                       lambda d=dtype: routed("triton-interpreter", d, 5, 32, 40, 4, 2, "cpu")),
                      ("fused_moe", "triton-interpreter", name, "T5H32I24E4k2",
                       lambda d=dtype: fused("triton-interpreter", d, 5, 32, 24, 4, 2, "cpu"))]
        return cases

    def rows(op, backend):
        out = []
        for dtype in (torch.bfloat16, torch.float16):
            name = V.DTYPE_NAMES[dtype]
            if op == "fused_moe":
                for t, h, i, e, k in ((1, 512, 384, 16, 4), (333, 512, 384, 16, 4)):
                    out.append((name, "T%dH%dI%dE%dk%d" % (t, h, i, e, k),
                                lambda b=backend, d=dtype, s=(t, h, i, e, k): fused(b, d, *s, device)))
            elif op == "routed_grouped_gemm":
                for t, h, n, e, k in ((1, 512, 640, 8, 2), (333, 512, 640, 8, 2)):
                    out.append((name, "T%dH%dN%dE%dk%d" % (t, h, n, e, k),
                                lambda b=backend, d=dtype, s=(t, h, n, e, k): routed(b, d, *s, device)))
            else:
                for m, k, n, g in ((7, 256, 320, 3), (1000, 512, 384, 8)):
                    out.append((name, "M%dK%dN%dG%d" % (m, k, n, g),
                                lambda b=backend, d=dtype, s=(m, k, n, g): grouped(b, d, *s, device)))
        return out
    return B.gpu_check_rows(FAMILY, OPS, device, rows)
