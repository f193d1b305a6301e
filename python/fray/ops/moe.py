"""The mixture-of-experts family, first part: routing (moe_route) and dispatch metadata (moe_dispatch).

moe_route picks each token's top_k experts from its router logits (softmax or sigmoid scores,
optional correction bias and DeepSeek-V3 grouped selection) and returns their weights and ids;
moe_dispatch turns the ids into what a grouped GEMM over expert-sorted tokens needs: the routes
sorted by expert and padded to block_m per expert, the expert of each block_m tile, and the
inverse permutation. Output sizes depend on (T, k, E, block_m) alone, never on the routing, so
nothing is read back on the host and both run under CUDA-graph capture.

Validation happens here, once; the kernels (fray_triton.moe) trust their inputs. The ids given to
moe_dispatch live on the GPU and are not checked there (a sync would be needed): an id outside
[0, E) (or outside expert_map) is undefined behaviour unless FRAY_CHECK_INDICES=1, which checks them
(one host synchronisation). GPU entry points are torch custom ops (fray::moe_route,
fray::moe_dispatch) with fake implementations, so torch.compile(fullgraph=True) traces through
them. CPU tensors and numpy arrays run the reference (float64 scores, exact integer metadata).
Routing and dispatch have no CUDA C++ kernel yet: "auto" runs Triton on CUDA tensors.
"""
import math
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray import env
from fray.reference import moe as ref

FAMILY = "moe"
OPS = ("moe_route", "moe_dispatch")
__all__ = ["moe_route", "moe_dispatch"]
for _op in OPS:
    B.register_preference(_op, ("triton",), missing={"cuda": "no CUDA kernel for %s yet (use 'triton')" % _op})


def _cuda_reason(device):
    """The family's CUDA kernels are JIT-compiled (cuda/moe, fray.jit): what gemm's need."""
    from fray.ops import gemm
    return gemm._cuda_reason(device)


B.register_cuda_check(FAMILY, _cuda_reason)

MAX_EXPERTS = 4096     # one routing program holds a token's whole row; the scan holds E counts
MAX_TOP_K = 64         # the kernel unrolls its k argmax rounds
MAX_GROUPS = 64        # and its topk_group rounds over the groups
MAX_BLOCK_M = 1024
SCORINGS = ("softmax", "sigmoid")
_INTS = (int, np.integer)
_REALS = (int, float, np.integer, np.floating)
_INT32_MAX = 2 ** 31 - 1
_ID_DTYPES = (torch.int32, torch.int64)


class MoeDispatch(NamedTuple):
    """What moe_dispatch returns (a tuple: unpack it or use the names). Route r = token * k + rank."""
    sorted_route_ids: Any     # int32 [rows]: routes by expert, segments padded with the sentinel T*k
    expert_offsets: Any       # int32 [E + 1]: padded segment starts; [E] is the padded total
    tile_expert: Any          # int32 [rows / block_m]: the expert of each tile, -1 past num_tiles
    num_tiles: Any            # int32 [1]: tiles in use (expert_offsets[E] / block_m), on the device
    inverse: Any              # int32 [T * k]: route -> its row in sorted_route_ids, -1 if dropped
    counts: Any               # int32 [E]: routes per (local) expert


def dispatch_rows(num_tokens, top_k, num_experts, block_m):
    """Rows of sorted_route_ids: T*k + E*(block_m - 1) rounded up to a multiple of block_m."""
    return ref.dispatch_rows(num_tokens * top_k, num_experts, block_m)


# ---------------------------------------------------------------------------------------------
# validation

def _name(dtype):
    return str(dtype).replace("torch.", "")


def _int(name, value, lo, hi=None, what=""):
    if isinstance(value, bool) or not isinstance(value, _INTS):
        raise TypeError("%s: expected an int, got %s" % (name, type(value).__name__))
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        rng = "[%d, %d]" % (lo, hi) if hi is not None else ">= %d" % lo
        raise ValueError("%s: expected a value in %s%s, got %d" % (name, rng, what, v))
    return v


def _bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError("%s: expected a bool, got %s" % (name, type(value).__name__))
    return bool(value)


def _check_logits(x):
    if V.is_array(x):
        if x.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError("router_logits: expected a float16/float32/float64 array, got %s" % x.dtype)
    else:
        V.require_tensor("router_logits", x)
        V.require_device_family("router_logits", x)
        V.require_float_dtype("router_logits", x)
    if x.ndim != 2:
        raise ValueError("router_logits: expected 2 dimensions [tokens, experts], got shape %s" % (tuple(x.shape),))
    e = x.shape[1]
    if not 1 <= e <= MAX_EXPERTS:
        raise ValueError("router_logits: expected 1 to %d experts (dim 1), got %d" % (MAX_EXPERTS, e))
    if not V.is_array(x) and e > 1 and x.stride(1) != 1:
        raise ValueError("router_logits: the expert dimension must be contiguous (stride 1), got stride %d"
                         % x.stride(1))
    return x.shape[0], e


def _check_route_args(e, top_k, scoring, renormalize, num_expert_group, topk_group, routed_scaling_factor,
                      return_counts):
    if not isinstance(scoring, str) or scoring not in SCORINGS:
        raise ValueError("scoring: expected 'softmax' or 'sigmoid', got %r" % (scoring,))
    top_k = _int("top_k", top_k, 1, min(e, MAX_TOP_K), " (at most the %d experts and %d)" % (e, MAX_TOP_K))
    renormalize = _bool("renormalize", renormalize)
    return_counts = _bool("return_counts", return_counts)
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, _REALS):
        raise TypeError("routed_scaling_factor: expected a float, got %s" % type(routed_scaling_factor).__name__)
    scale = float(routed_scaling_factor)
    if not math.isfinite(scale):
        raise ValueError("routed_scaling_factor: expected a finite value, got %r" % (routed_scaling_factor,))
    groups = 0
    if num_expert_group is None:
        if topk_group is not None:
            raise ValueError("topk_group: given without num_expert_group (grouped selection needs both)")
    else:
        groups = _int("num_expert_group", num_expert_group, 1, min(e, MAX_GROUPS))
        if e % groups:
            raise ValueError("num_expert_group: the %d experts do not split into %d equal groups" % (e, groups))
        if topk_group is None:
            raise ValueError("topk_group: required with num_expert_group=%d" % groups)
        topk_group = _int("topk_group", topk_group, 1, groups, " (at most num_expert_group)")
        if top_k > topk_group * (e // groups):
            raise ValueError("top_k: %d experts cannot be chosen from %d kept groups of %d experts"
                             % (top_k, topk_group, e // groups))
    return top_k, renormalize, groups, topk_group or 0, scale, return_counts


def _check_bias(bias, x, e):
    if bias is None:
        return
    if V.is_array(x):
        if not V.is_array(bias):
            raise TypeError("correction_bias: expected a numpy.ndarray like router_logits, got %s"
                            % type(bias).__name__)
        if bias.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError("correction_bias: expected a float16/float32/float64 array, got %s" % bias.dtype)
    else:
        if not isinstance(bias, torch.Tensor):
            raise TypeError("correction_bias: expected a torch.Tensor like router_logits, got %s" % type(bias).__name__)
        V.require_same_device([("router_logits", x), ("correction_bias", bias)])
        V.require_float_dtype("correction_bias", bias)
        if e > 1 and bias.dim() == 1 and bias.stride(0) != 1:
            raise ValueError("correction_bias: expected a contiguous tensor, got stride %d" % bias.stride(0))
    if tuple(bias.shape) != (e,):
        raise ValueError("correction_bias: expected shape (%d,) (one per expert), got %s" % (e, tuple(bias.shape)))


def _check_ids(x):
    if V.is_array(x):
        if not np.issubdtype(x.dtype, np.integer):
            raise TypeError("topk_ids: expected an integer array, got %s" % x.dtype)
    else:
        V.require_tensor("topk_ids", x)
        V.require_device_family("topk_ids", x)
        if x.dtype not in _ID_DTYPES:
            raise TypeError("topk_ids: expected dtype int32 or int64, got %s" % _name(x.dtype))
        if not x.is_contiguous():
            raise ValueError("topk_ids: expected a contiguous tensor, got strides %s" % (x.stride(),))
    if x.ndim != 2:
        raise ValueError("topk_ids: expected 2 dimensions [tokens, top_k], got shape %s" % (tuple(x.shape),))
    return x.shape[0], x.shape[1]


def _check_beside_ids(name, t, ids, np_dtype, dtype):
    """An index tensor or array beside topk_ids: of its kind (numpy or torch) and device, in dtype."""
    if V.is_array(ids):
        if not V.is_array(t):
            raise TypeError("%s: expected a numpy.ndarray like topk_ids, got %s" % (name, type(t).__name__))
        if t.dtype != np_dtype:
            raise TypeError("%s: expected dtype %s, got %s" % (name, _name(dtype), t.dtype))
    else:
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: expected a torch.Tensor like topk_ids, got %s" % (name, type(t).__name__))
        V.require_same_device([("topk_ids", ids), (name, t)])
        if t.dtype != dtype:
            raise TypeError("%s: expected dtype %s, got %s" % (name, _name(dtype), _name(t.dtype)))


def _check_expert_map(m, ids, num_experts):
    if m is None:
        return
    _check_beside_ids("expert_map", m, ids, np.int32, torch.int32)
    if not V.is_array(ids):
        if m.dim() == 1 and m.shape[0] > 1 and m.stride(0) != 1:
            raise ValueError("expert_map: expected a contiguous tensor, got stride %d" % m.stride(0))
    if m.ndim != 1 or m.shape[0] < 1:
        raise ValueError("expert_map: expected shape (E_global,) with E_global >= 1 (global -> local id or "
                         "-1), got %s" % (tuple(m.shape),))


def _check_route_positions(pos, ids, n_routes):
    """route_positions: an int64 buffer of T*k elements, contiguous, beside topk_ids, not
    overlapping itself."""
    if pos is None:
        return
    _check_beside_ids("route_positions", pos, ids, np.int64, torch.int64)
    contiguous = pos.flags.c_contiguous if V.is_array(pos) else pos.is_contiguous()
    if pos.ndim != 1 or pos.shape[0] != n_routes:
        raise ValueError("route_positions: expected shape (%d,) (T * k), got %s" % (n_routes, tuple(pos.shape)))
    if not contiguous:
        raise ValueError("route_positions: expected a contiguous buffer, got strides %s" % (pos.strides if V.is_array(pos)
                                                                                          else pos.stride(),))


def _check_dispatch_values(ids, m, num_experts):
    """The ids' and map's value ranges (numpy arrays; on the GPU only with FRAY_CHECK_INDICES=1)."""
    if ids.size == 0 and m is None:
        return
    hi = num_experts if m is None else m.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= hi):
        raise ValueError("topk_ids: expected ids in [0, %d)%s, got values in [%d, %d]"
                         % (hi, "" if m is None else " (the length of expert_map)", ids.min(), ids.max()))
    if m is not None and (m.min() < -1 or m.max() >= num_experts):
        raise ValueError("expert_map: expected local ids in [-1, %d), got values in [%d, %d]"
                         % (num_experts, m.min(), m.max()))


def _check_dispatch_args(t, k, num_experts, block_m):
    num_experts = _int("num_experts", num_experts, 1, MAX_EXPERTS)
    block_m = _int("block_m", block_m, 1, MAX_BLOCK_M)
    if block_m & (block_m - 1):
        raise ValueError("block_m: expected a power of two, got %d" % block_m)
    rows = dispatch_rows(t, k, num_experts, block_m)
    if rows > _INT32_MAX or ref.dispatch_rows(t * k, 1, 128) // 128 * num_experts > _INT32_MAX:
        raise ValueError("topk_ids: %d routes of %d experts overflow the int32 metadata" % (t * k, num_experts))
    return num_experts, block_m


# ---------------------------------------------------------------------------------------------
# GPU implementations: launch plans (fray._plan), built once per call signature

def _route_launch(x, bias, top_k, scoring, renormalize, groups, topk_group, scale, backend):
    """The launch plan taking (logits, bias, weights, ids, counts)."""
    if x.shape[0] == 0:
        return P.NOOP
    B.resolve("moe_route", FAMILY, backend, x.device)
    from fray_triton import moe as tmoe
    sigmoid = scoring == "sigmoid"
    return P.TritonPlan(lambda x_, b_, w_, i_, c_: tmoe.route(x_, b_, w_, i_, c_, top_k, sigmoid, renormalize,
                                                              groups, topk_group, scale), x.device)


def _dispatch_launch(ids, emap, num_experts, block_m, backend):
    """The launch plan taking (ids, expert_map, sorted, offsets, tile_expert, num_tiles, inverse,
    counts, block_counts, route_positions or None)."""
    B.resolve("moe_dispatch", FAMILY, backend, ids.device)
    from fray_triton import moe as tmoe
    return P.TritonPlan(lambda i_, m_, s_, o_, te_, nt_, inv_, c_, bc_, pos_: tmoe.dispatch(
        i_, m_, num_experts, block_m, s_, o_, te_, nt_, inv_, c_, bc_, positions=pos_), ids.device)


class _RoutePlan:
    """A moe_route plan with what allocating its outputs needs."""

    __slots__ = ("launch", "top_k", "counts")

    def __init__(self, launch, top_k, counts):
        self.launch, self.top_k, self.counts = launch, top_k, counts

    def __call__(self, x, bias):
        w, ids, counts = _route_outputs(x, self.top_k, self.counts)
        self.launch((x, bias, w, ids, counts))
        return (w, ids, counts) if self.counts else (w, ids)


def _route_outputs(x, top_k, counts=True):
    """(weights, ids, zeroed counts or None) on x's device."""
    t, e = x.shape
    return (torch.empty((t, top_k), dtype=torch.float32, device=x.device),
            torch.empty((t, top_k), dtype=torch.int32, device=x.device),
            torch.zeros((e,), dtype=torch.int32, device=x.device) if counts else None)


class _DispatchPlan:
    """A moe_dispatch plan with what allocating its outputs needs."""

    __slots__ = ("launch", "num_experts", "block_m")

    def __init__(self, launch, num_experts, block_m):
        self.launch, self.num_experts, self.block_m = launch, num_experts, block_m

    def __call__(self, ids, emap, positions):
        out = _dispatch_outputs(ids, self.num_experts, self.block_m)
        self.launch((ids, emap) + out + (positions,))
        return MoeDispatch(*out[:6])


def _dispatch_outputs(ids, num_experts, block_m):
    """(sorted, offsets, tile_expert, num_tiles, inverse, counts, block_counts) on ids' device."""
    from fray_triton import moe as tmoe
    t, k = ids.shape
    n = t * k
    rows = dispatch_rows(t, k, num_experts, block_m)
    dev, i32 = ids.device, torch.int32
    return (torch.empty((rows,), dtype=i32, device=dev),
            torch.empty((num_experts + 1,), dtype=i32, device=dev),
            torch.empty((rows // block_m,), dtype=i32, device=dev),
            torch.empty((1,), dtype=i32, device=dev),
            torch.empty((n,), dtype=i32, device=dev),
            torch.zeros((num_experts,), dtype=i32, device=dev),
            torch.zeros(tmoe.block_counts_shape(n, num_experts), dtype=i32, device=dev))


def _device_check_ids(ids, emap, num_experts):
    """FRAY_CHECK_INDICES=1: the ids' and map's ranges, at the cost of one synchronisation."""
    V.device_index_check("topk_ids / expert_map", lambda: _check_dispatch_values(
        ids.cpu().numpy(), None if emap is None else emap.cpu().numpy(), num_experts))


def _moe_route_impl(x, bias, w, ids, counts, top_k, scoring, renormalize, groups, topk_group, scale, backend):
    key = P.signature("moe_route:op", backend, (x, bias, w, ids, counts),
                      (top_k, scoring, renormalize, groups, topk_group, scale))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _route_launch(x, bias, top_k, scoring, renormalize, groups,
                                                              topk_group, scale, backend))
    plan((x, bias, w, ids, counts))


def _moe_dispatch_impl(ids, emap, outs, positions, num_experts, block_m, backend):
    if env.check_indices():  # here rather than in the wrapper: compiled graphs check too
        _device_check_ids(ids, emap, num_experts)
    key = P.signature("moe_dispatch:op", backend, (ids, emap, positions), (num_experts, block_m))
    plan = P.PLANS.get(key) or P.PLANS.put(key, _dispatch_launch(ids, emap, num_experts, block_m, backend))
    plan((ids, emap) + tuple(outs) + (positions,))


@P.custom_op("fray::moe_route", mutates_args=("topk_weights", "topk_ids", "counts"))
def _moe_route_op(router_logits: torch.Tensor, correction_bias: Optional[torch.Tensor], topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, counts: Optional[torch.Tensor], top_k: int, scoring: str, renormalize: bool,
                  num_expert_group: int, topk_group: int, routed_scaling_factor: float, backend: str) -> None:
    _moe_route_impl(router_logits, correction_bias, topk_weights, topk_ids, counts, top_k, scoring, renormalize,
                    num_expert_group, topk_group, routed_scaling_factor, backend)


@P.custom_op("fray::moe_dispatch", mutates_args=("sorted_route_ids", "expert_offsets", "tile_expert",
                                                             "num_tiles", "inverse", "counts", "workspace",
                                                             "route_positions"))
def _moe_dispatch_op(topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor], sorted_route_ids: torch.Tensor,
                     expert_offsets: torch.Tensor, tile_expert: torch.Tensor, num_tiles: torch.Tensor,
                     inverse: torch.Tensor, counts: torch.Tensor, workspace: torch.Tensor,
                     route_positions: Optional[torch.Tensor], num_experts: int, block_m: int, backend: str) -> None:
    _moe_dispatch_impl(topk_ids, expert_map, (sorted_route_ids, expert_offsets, tile_expert, num_tiles, inverse,
                                              counts, workspace), route_positions, num_experts, block_m, backend)


for _op in (_moe_route_op, _moe_dispatch_op):
    _op.register_fake(lambda *args, **kwargs: None)


_compiling = P.compiling


# ---------------------------------------------------------------------------------------------
# public API

def moe_route(router_logits, top_k, *, scoring="softmax", renormalize=True, num_expert_group=None, topk_group=None,
              correction_bias=None, routed_scaling_factor=1.0, return_counts=False, backend="auto"):
    """Each token's top_k experts: returns (topk_weights fp32 [T, k], topk_ids int32 [T, k]), plus
    counts int32 [E] (routes per expert, this call's alone) with return_counts=True.

    router_logits: [T, E] fp32/fp16/bf16 (E <= 4096, the expert dim contiguous). scoring:
    "softmax" (over the E logits) or "sigmoid" (each logit alone), computed in fp32.
    correction_bias: [E] float, added to the scores to choose experts and never to weigh them
    (DeepSeek-V3's load-balancing bias). num_expert_group / topk_group: grouped selection; the
    experts split into num_expert_group consecutive equal groups, a group scores the sum of its
    two best (biased) scores, the topk_group best groups are kept and top_k experts are chosen
    among them. Weights are the chosen experts' unbiased scores, divided by their sum when
    renormalize, then times routed_scaling_factor.

    Order and ties: each row's experts come in decreasing selection score; equal scores go to the
    lower expert id (for groups too), so the result is deterministic. NaN: under softmax a NaN
    (or +inf) logit makes the token's whole row NaN (as fray.softmax): every selection score then counts as
    -inf, the row picks experts 0..k-1 (of its kept groups) and its weights are NaN; under sigmoid
    only that expert's score is NaN and it ranks last. A zero sum of chosen scores (sigmoid of
    -inf logits) renormalises to NaN. The kernel chooses on fp32 scores: experts whose fp32 scores
    round equal (sigmoids of logits beyond ~17 all round to 1) tie and go to the lower id, where
    the float64 reference may still tell them apart. Recipes: Mixtral moe_route(x, 2) over 8 experts; Qwen3-MoE
    moe_route(x, 8) over 128; DeepSeek-V3 moe_route(x, 8, scoring="sigmoid", correction_bias=b,
    num_expert_group=8, topk_group=4, routed_scaling_factor=2.5) over 256. top_k <= 64.

    CUDA tensors run the Triton kernel on the current stream (one program per token, no host
    synchronisation); CPU tensors and numpy arrays run the float64 reference (numpy in, numpy
    out: float32 weights and int32 ids).
    """
    if not _compiling():
        key = P.signature("moe_route", backend, (router_logits, correction_bias),
                          (top_k, scoring, renormalize, num_expert_group, topk_group, routed_scaling_factor,
                           return_counts))
        plan = P.PLANS.get(key)
        if plan is not None:
            return plan(router_logits, correction_bias)
    V.require_backend(backend, B.BACKENDS)
    t, e = _check_logits(router_logits)
    top_k, renormalize, groups, topk_group, scale, return_counts = _check_route_args(
        e, top_k, scoring, renormalize, num_expert_group, topk_group, routed_scaling_factor, return_counts)
    _check_bias(correction_bias, router_logits, e)
    array = V.is_array(router_logits)
    if array or router_logits.device.type == "cpu":
        V.require_cpu_backend(backend, "router_logits")
        to64 = (lambda a: np.asarray(a, np.float64)) if array else (lambda a: a.detach().double().numpy())
        w, ids, counts = ref.moe_route(to64(router_logits), top_k, scoring, renormalize, groups or None,
                                       topk_group or None, None if correction_bias is None else to64(correction_bias),
                                       scale)
        res = (w.astype(np.float32), ids.astype(np.int32), counts.astype(np.int32))
        if not array:
            res = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in res)
        return res if return_counts else res[:2]
    if _compiling():
        w, ids, counts = _route_outputs(router_logits, top_k, return_counts)
        torch.ops.fray.moe_route(router_logits, correction_bias, w, ids, counts, top_k, scoring, renormalize, groups,
                                 topk_group, scale, backend)
        return (w, ids, counts) if return_counts else (w, ids)
    launch = _route_launch(router_logits, correction_bias, top_k, scoring, renormalize, groups, topk_group, scale,
                           backend)
    return P.PLANS.put(key, _RoutePlan(launch, top_k, return_counts))(router_logits, correction_bias)


def moe_dispatch(topk_ids, num_experts, block_m, *, expert_map=None, route_positions=None, backend="auto"):
    """Expert-sorted, block_m-padded dispatch metadata for topk_ids [T, k] (int32 or int64).

    Returns MoeDispatch (a NamedTuple: sorted_route_ids, expert_offsets, tile_expert, num_tiles,
    inverse, counts), all int32. Route r = token * k + rank (its place in topk_ids.view(-1)).
    sorted_route_ids [rows]: the routes sorted by expert, in route order within an expert, each
    expert's segment padded to a multiple of block_m with the sentinel T*k (an expert without
    routes has an empty segment); rows = T*k + E*(block_m - 1) rounded up to block_m, the most any
    routing can need, so every size depends on (T, k, E, block_m) only. expert_offsets [E + 1]: the
    padded segment starts, expert_offsets[E] the padded total. tile_expert [rows / block_m]: the
    expert of each block_m tile, -1 for the tiles past the used ones. num_tiles [1]: the used tiles
    (expert_offsets[E] / block_m), left on the device. inverse [T*k]: each route's row in
    sorted_route_ids (-1 for a dropped route). counts [E]: routes per expert.

    num_experts: E, the local expert count (<= 4096). block_m: a power of two <= 1024 (the grouped
    GEMM's M tile). expert_map: int32 [E_global], global id -> local id in [0, E) or -1 (an expert
    not on this rank: its routes are left out of sorted_route_ids and get inverse -1); topk_ids
    then hold global ids in [0, E_global). Ids on the GPU are trusted (FRAY_CHECK_INDICES=1 checks
    them with one synchronisation); numpy arrays and CPU tensors are checked and run the exact
    reference. route_positions: an int64 [T*k] buffer (the seed's) that also receives the inverse
    map, as int64 (-1 for a dropped route); the return value is the same either way.

    CUDA tensors: up to 128 routes (a decode step) whose routes x experts tile fits 16384 entries,
    one Triton launch; else a fill and four launches; on the current stream, no host
    synchronisation, deterministic (the same bits run to run). Cost there: the scatter compares
    each route with the up to 127 earlier routes of its 128-route block, and one program walks
    cdiv(T*k, 128) x E block counts serially; correctness and determinism over speed.
    """
    if not _compiling():
        key = P.signature("moe_dispatch", backend, (topk_ids, expert_map, route_positions), (num_experts, block_m))
        plan = P.PLANS.get(key)
        if plan is not None:
            return plan(topk_ids, expert_map, route_positions)
    V.require_backend(backend, B.BACKENDS)
    t, k = _check_ids(topk_ids)
    num_experts, block_m = _check_dispatch_args(t, k, num_experts, block_m)
    _check_expert_map(expert_map, topk_ids, num_experts)
    _check_route_positions(route_positions, topk_ids, t * k)
    array = V.is_array(topk_ids)
    if array or topk_ids.device.type == "cpu":
        V.require_cpu_backend(backend, "topk_ids")
        ids = topk_ids if array else topk_ids.numpy()
        emap = expert_map if (array or expert_map is None) else expert_map.numpy()
        _check_dispatch_values(ids, emap, num_experts)
        res = [a.astype(np.int32) for a in ref.moe_dispatch(ids, num_experts, block_m, emap)]
        if route_positions is not None:
            route_positions[...] = (res[4] if array else torch.from_numpy(res[4]))
        if not array:
            res = [torch.from_numpy(a) for a in res]
        return MoeDispatch(*res)
    if _compiling():
        outs = _dispatch_outputs(topk_ids, num_experts, block_m)
        torch.ops.fray.moe_dispatch(topk_ids, expert_map, *outs, route_positions, num_experts, block_m, backend)
        return MoeDispatch(*outs[:6])
    plan = _DispatchPlan(_dispatch_launch(topk_ids, expert_map, num_experts, block_m, backend), num_experts, block_m)
    if env.check_indices():  # checked on every call: no plan is kept
        _device_check_ids(topk_ids, expert_map, num_experts)
        return plan(topk_ids, expert_map, route_positions)
    return P.PLANS.put(key, plan)(topk_ids, expert_map, route_positions)


# ---------------------------------------------------------------------------------------------
# `fray check` cases: (op, backend, dtype, shape, callable raising on a mismatch)

def _random_logits(t, e, dtype, device, seed=0, span=None):
    """Logits on a grid drawn without repeats per row (step 1/8, or 2 * span / e to fit [-span,
    span): sigmoids saturate to 1 in fp32 beyond ~17), so that scores are well apart and the fp32
    kernel and the float64 reference choose the same experts."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.stack([torch.randperm(e, generator=g) for _ in range(t)]) if t else torch.zeros(0, e)
    step = 1 / 8 if span is None else 2 * span / e
    return ((perm.float() - e / 2) * step).to(dtype).to(device)


RECIPES = {
    "mixtral": dict(experts=8, top_k=2, kwargs={}),
    "qwen3": dict(experts=128, top_k=8, kwargs={}),
    "deepseek_v3": dict(experts=256, top_k=8, kwargs=dict(scoring="sigmoid", num_expert_group=8, topk_group=4,
                                                         routed_scaling_factor=2.5)),
}


def _recipe_args(name, t, dtype, device, seed=0):
    r = RECIPES[name]
    sigmoid = r["kwargs"].get("scoring") == "sigmoid"
    x = _random_logits(t, r["experts"], dtype, device, seed, span=8.0 if sigmoid else None)
    kw = dict(r["kwargs"])
    if name == "deepseek_v3":
        g = torch.Generator().manual_seed(1)
        kw["correction_bias"] = (torch.randint(-4, 5, (r["experts"],), generator=g).float() / 64).to(device)
    return x, r["top_k"], kw


NEAR_TIE = 1e-6  # float64 selection scores closer than this may order either way in fp32


def _assert_route_matches(x, top_k, w, ids, counts=None, what="moe_route", **kw):
    """The kernel's (w, ids[, counts]) against the float64 reference of x under moe_route's kwargs.

    Ids must match exactly, except in rows where the float64 reference itself holds a near-tie
    (two candidate experts, or two candidate groups, whose scores differ by less than NEAR_TIE but
    are not equal): fp32 may order those either way, so there the ids need only be distinct and
    the weights are checked against the float64 weights of the ids the kernel chose. At most 1% of
    the rows (and 2) may be such rows, so that the check can still fail. Counts must be the
    bincount of the kernel's own ids."""
    from fray.testing import assert_close
    x64 = x.detach().double().cpu().numpy()
    bias = kw.get("correction_bias")
    bias = None if bias is None else bias.detach().double().cpu().numpy()
    scoring, renorm = kw.get("scoring", "softmax"), kw.get("renormalize", True)
    groups, topk_group = kw.get("num_expert_group"), kw.get("topk_group")
    scale = kw.get("routed_scaling_factor", 1.0)
    ew, ei, _ = ref.moe_route(x64, top_k, scoring, renorm, groups, topk_group, bias, scale)
    got_i = ids.detach().cpu().numpy().astype(np.int64)
    got_w = w.detach().double().cpu().numpy()
    s = ref.scores(x64, scoring)
    sel = np.where(np.isnan(s if bias is None else s + bias), -np.inf, s if bias is None else s + bias)
    tied = []
    for row in np.nonzero((got_i != ei).any(axis=1))[0]:
        eligible = sel[row]
        cand = []
        if groups:
            gs = sel[row].reshape(groups, -1)
            gscore = np.sort(gs, axis=1)[:, ::-1][:, :2].sum(axis=1)
            cand.append(np.sort(gscore)[::-1][:topk_group + 1])
            eligible = gs[np.argsort(-gscore, kind="stable")[:topk_group]].reshape(-1)
        cand.append(np.sort(eligible)[::-1][:top_k + 1])
        gaps = np.concatenate([-np.diff(c) for c in cand])
        near = ((gaps > 0) & (gaps < NEAR_TIE)).any()
        assert near and len(set(got_i[row].tolist())) == top_k, "%s: row %d ids %s != reference %s" % (
            what, row, got_i[row].tolist(), ei[row].tolist())
        tied.append(row)
        sw = s[row, got_i[row]]
        ew[row] = (sw / sw.sum() if renorm else sw) * scale
    assert len(tied) <= max(2, len(x64) // 100), "%s: %d rows differ from the reference at near-ties" % (
        what, len(tied))
    nan = np.isnan(ew)
    assert np.array_equal(np.isnan(got_w), nan), "%s: NaN weights differ from the reference" % what
    assert_close(torch.from_numpy(got_w[~nan]), torch.from_numpy(ew[~nan]), torch.float32, what + " weights")
    if counts is not None:
        expected = np.bincount(got_i.reshape(-1), minlength=x64.shape[1])
        assert np.array_equal(counts.detach().cpu().numpy(), expected), "%s: counts differ" % what


def check_cases(device):
    """On a GPU: the Triton backend for the three recipes (every dtype) and dispatch at a few
    shapes. On the CPU: the reference on hand-computed values and the kernels under Triton's
    interpreter."""
    def route(recipe, backend, dtype, t, dev):
        x, k, kw = _recipe_args(recipe, t, dtype, dev)
        bias = kw.get("correction_bias")
        if backend == "triton-interpreter":
            from fray_triton import moe as tmoe
            w, ids, c = _route_outputs(x, k)
            tmoe.route(x, bias, w, ids, c, k, kw.get("scoring") == "sigmoid", True, kw.get("num_expert_group", 0),
                       kw.get("topk_group", 0), kw.get("routed_scaling_factor", 1.0))
        else:
            w, ids, c = moe_route(x, k, return_counts=True, backend=backend, **kw)
        _assert_route_matches(x, k, w, ids, c, "moe_route " + recipe, **kw)

    def dispatch(backend, t, k, e, block_m, dev):
        g = torch.Generator().manual_seed(t * 31 + e)
        ids = torch.randint(0, e, (t, k), generator=g, dtype=torch.int32).to(dev)
        expected = ref.moe_dispatch(ids.cpu().numpy(), e, block_m)
        if backend == "triton-interpreter":
            from fray_triton import moe as tmoe
            outs = _dispatch_outputs(ids, e, block_m)
            tmoe.dispatch(ids, None, e, block_m, *outs)
            got = outs[:6]
        else:
            got = moe_dispatch(ids, e, block_m, backend=backend)
        for name, a, b in zip(MoeDispatch._fields, got, expected):
            assert np.array_equal(a.cpu().numpy(), b), "moe_dispatch: %s differs from the reference" % name

    def hand():
        # softmax of [0, ln 3, 0, ln 2] = [1, 3, 1, 2] / 7: top-2 experts 1 and 3, renormalised 3/5, 2/5
        w, ids = moe_route(np.array([[0.0, math.log(3.0), 0.0, math.log(2.0)]]), 2)
        assert ids.tolist() == [[1, 3]], ids
        np.testing.assert_allclose(w, [[0.6, 0.4]], rtol=1e-6)
        # ties: equal logits go to the lower ids
        assert moe_route(np.zeros((1, 4)), 2)[1].tolist() == [[0, 1]]
        d = moe_dispatch(np.array([[1, 0], [1, 1]], np.int32), 2, 2)
        assert d.sorted_route_ids.tolist() == [1, 4, 0, 2, 3, 4] and d.expert_offsets.tolist() == [0, 2, 6]
        assert d.tile_expert.tolist() == [0, 1, 1] and d.num_tiles.tolist() == [3]
        assert d.inverse.tolist() == [2, 0, 3, 4] and d.counts.tolist() == [1, 3]

    if device.type != "cuda":
        cases = [("moe_route+dispatch", "reference", "fp64", "hand", hand)]
        for recipe in RECIPES:
            for dtype in (torch.float32, torch.bfloat16):
                cases.append(("moe_route", "triton-interpreter", V.DTYPE_NAMES[dtype], "%s:T3" % recipe,
                              lambda r=recipe, d=dtype: route(r, "triton-interpreter", d, 3, "cpu")))
        cases.append(("moe_dispatch", "triton-interpreter", "int32", "T37k2E8m16",
                      lambda: dispatch("triton-interpreter", 37, 2, 8, 16, "cpu")))
        return cases
    def rows(op, backend):
        if op == "moe_route":
            return [(V.DTYPE_NAMES[dtype], "%s:T%d" % (recipe, t),
                     lambda r=recipe, b=backend, d=dtype, t_=t: route(r, b, d, t_, device))
                    for recipe in RECIPES for dtype in (torch.float32, torch.float16, torch.bfloat16) for t in (1, 333)]
        return [("int32", "T%dk%dE%dm%d" % (t, k, e, bm),
                 lambda b=backend, t_=t, k_=k, e_=e, m_=bm: dispatch(b, t_, k_, e_, m_, device))
                for t, k, e, bm in ((1, 1, 8, 16), (333, 8, 256, 64), (4096, 8, 128, 128))]
    return B.gpu_check_rows(FAMILY, OPS, device, rows)
