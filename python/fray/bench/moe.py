"""MoE-family benchmarks: routing and dispatch metadata, the grouped GEMMs and the fused MoE layer.
Fray's Triton kernels, fray.cuda rows where fray reports a CUDA kernel for the op on the device
(grouped_gemm's explicit form and fused_moe, both on CUTLASS's grouped GEMM), and the peers a user
would write instead, in one process.

moe_route bytes: read logits + read bias (fp32, DeepSeek-V3) + write weights and ids
                 = T·E·s(x) + 4·E·[bias] + 8·T·k
  shapes "<recipe>:T<tokens>" for recipe in mixtral (softmax top-2 of 8), qwen3 (softmax top-8 of
  128), deepseek_v3 (sigmoid + correction bias, 8 groups, topk_group 4, top-8 of 256, x2.5) and
  T in 1, 128, 4096; bf16 logits, fixed-seed standard normal.
  Peers: torch.eager = the composite a model file writes (softmax or sigmoid in fp32, for
  DeepSeek-V3 the biased group scores as the sum of each group's top-2, topk of the groups, the
  other groups masked to -inf; torch.topk; gather of the unbiased scores; renormalise; scale);
  torch.compile = that composite compiled (fullgraph=True).
moe_dispatch bytes: read ids + write sorted ids, inverse, offsets, tile map and counts
                 = 4·T·k·[int32 ids] + 4·(rows + T·k + (E + 1) + rows / block_m + 1 + E)
  shapes "<recipe>:T<tokens>" as above, ids from torch.topk of random logits (block_m 64).
  Peers: torch.eager = counts by scatter_add, padded offsets by cumsum, a stable argsort by
  expert, ranks from the unpadded starts, scatters into the padded array and the inverse,
  tile_expert by searchsorted (no host synchronisation either); torch.compile = it compiled.

fused_moe flops (tflops) = 2·R·(H·2I + I·H), R the routes this rank's experts serve (T·k less
  the routes the expert map drops: they cost no GEMM); bytes (gbps, T <= 16 only, where the
  weight stream bounds the time) = X·(2I·H + H·I)·s(w), X the distinct local experts the routes
  hit (counted from the ids). Records carry `routes` (R) and `experts_hit` (X).
  shapes "<model>:T<tokens>" (end to end: router_logits given; route + dispatch + GEMMs +
  combine) and "<model>:T<tokens>:prepared" (topk_weights / topk_ids given), T in 1, 16, 128,
  1024, 4096 for
    mixtral   E8 k2 H4096 I14336 (softmax top-2, renormalised)
    qwen3     E128 k8 H2048 I768 (softmax top-8, renormalised)
    dsv2lite  E64 k6 H2048 I1408 (softmax top-6, not renormalised)
    dsv3ep8   one DeepSeek-V3 rank of 8-way expert parallelism: H7168 I2048, routing as
              moe_route's deepseek_v3 over 256 experts, an expert_map keeping experts 0..31 (this
              rank's 32 local experts; the other 7/8 of the routes are dropped)
  and at T4096 only: seed (the seed's E64 k2 H4096 I14336 in fp16) and e64h4096i1408k6 (the
  issue's headline; any "e<E>h<H>i<I>k<k>" names such a softmax top-k layer). bf16 unless named;
  weights in vLLM's layout (w13 [E, 2I, H] = [gate | up], w2 [E, H, I]) standard normal / sqrt(fan
  in), x and router logits standard normal, fixed seeds; silu.
  Peers: torch.eager = the composite a user writes with torch._grouped_mm (route as moe_route's
  composite, the expert map applied, a stable argsort of the routes by local expert, the gathered
  x rows, _grouped_mm against w13 with offs the device cumsum of the counts, silu(gate)·up,
  _grouped_mm against w2, times the routing weights, index_add_ into fp32 [T, H], cast: no host
  synchronisation; _grouped_mm takes bf16 only, so the fp16 seed shape leaves error rows);
  torch.compile = it compiled (fullgraph=True); torch.loop = an inference engine's naive path,
  per expert torch.where of its routes (a host synchronisation each), F.linear, silu·up,
  F.linear, weight, index_add_ (omitted where it would take over LOOP_LIMIT_MS per call: see
  loop_ms; it leaves an error row under CUDA-graph capture, which its synchronisations forbid).
grouped_gemm flops = 2·rows·N·K, rows = offsets[G] - offsets[0] (the real rows, empty groups
  cost nothing); shapes "G<groups>x<rows>N<n>K<k>" (every group `rows` rows) and
  "...:uneven" (the same total split at random, fixed seed, about one group in eight empty):
  the issue's G64x384N2816K4096 both ways and Mixtral's prefill G8x1024N28672K4096 (4096 tokens
  x top-2 over 8 experts, the w13 GEMM), b [G, N, K] ("nk"), bf16, a standard normal, b standard
  normal / sqrt(K). fray.triton takes the explicit group_offsets [G + 1].
  Peers: torch.eager = torch._grouped_mm(a, b.transpose(-2, -1), offs=the group ends);
  torch.loop = per group torch.mm into its row slice of one output (empty groups skipped).
routed_grouped_gemm flops = 2·T·k·H·N; bytes (T <= 16 only) = X·N·H·s(w), X as for fused_moe;
  shapes "e<E>h<H>n<N>k<k>:T<tokens>": E8 k2 H4096 N14336 and E64 k6 H2048 N1408 at T 16, 1024,
  4096; weights [E, N, H] standard normal / sqrt(H), x and logits standard normal, softmax top-k
  renormalised. fray.triton is combine="auto"; fray.triton:atomic / :staged / :scatter each
  force that combine mode. Peer: torch.eager = the _grouped_mm composite (route, sort, gather,
  _grouped_mm, round(y·w), index_add_ into fp32 [T, N], cast).
"""
import math
import re
from typing import NamedTuple

import torch
import torch.nn.functional as F

import fray
from fray.ops import moe as M

TOKENS = (1, 128, 4096)
BLOCK_M = 64


class Model(NamedTuple):
    """One MoE layer: `experts` local experts (w13 / w2 hold them) of `global_experts` routed over."""
    experts: int
    top_k: int
    hidden: int
    inter: int
    global_experts: int
    dtype: torch.dtype
    route: dict          # moe_route's routing options (DeepSeek-V3's correction bias: `bias`)
    bias: bool = False


_DSV3 = M.RECIPES["deepseek_v3"]
MODELS = {
    "mixtral": Model(8, 2, 4096, 14336, 8, torch.bfloat16, {}),
    "qwen3": Model(128, 8, 2048, 768, 128, torch.bfloat16, {}),
    "dsv2lite": Model(64, 6, 2048, 1408, 64, torch.bfloat16, dict(renormalize=False)),
    "dsv3ep8": Model(_DSV3["experts"] // 8, _DSV3["top_k"], 7168, 2048, _DSV3["experts"], torch.bfloat16,
                     dict(_DSV3["kwargs"]), bias=True),
    "seed": Model(64, 2, 4096, 14336, 64, torch.float16, {}),
}
_GENERIC_RE = re.compile(r"^e(\d+)h(\d+)i(\d+)k(\d+)$")


def model_spec(name):
    """The Model of a shape's model name: one of MODELS, or "e<E>h<H>i<I>k<k>" (bf16, softmax top-k
    renormalised, no expert map)."""
    if name in MODELS:
        return MODELS[name]
    m = _GENERIC_RE.match(name)
    if not m:
        raise ValueError("shapes: unknown model %r (expected %s or e<E>h<H>i<I>k<k>)" % (name, "|".join(MODELS)))
    e, h, i, k = (int(v) for v in m.groups())
    if min(e, h, i, k) < 1 or k > e:
        raise ValueError("shapes: %r needs E, H, I, k >= 1 and k <= E" % name)
    return Model(e, k, h, i, e, torch.bfloat16, {})


class Fused(NamedTuple):
    model: str
    tokens: int
    prepared: bool


class Grouped(NamedTuple):
    groups: int
    rows: int            # per group (uneven: the mean; the total is groups * rows)
    n: int
    k: int
    uneven: bool


class Routed(NamedTuple):
    experts: int
    hidden: int
    n: int
    top_k: int
    tokens: int


FUSED_TOKENS = (1, 16, 128, 1024, 4096)
_FUSED_MODELS = ([(m, t) for m in ("mixtral", "qwen3", "dsv2lite", "dsv3ep8") for t in FUSED_TOKENS]
                 + [("seed", 4096), ("e64h4096i1408k6", 4096)])
SHAPES = {
    "moe_route": [(recipe, t) for recipe in M.RECIPES for t in TOKENS],
    "moe_dispatch": [(recipe, t) for recipe in M.RECIPES for t in TOKENS],
    # one model's shapes in a row: run() builds its weights once for all of them
    "fused_moe": [Fused(m, t, p) for m, t in _FUSED_MODELS for p in (False, True)],
    "grouped_gemm": [Grouped(64, 384, 2816, 4096, False), Grouped(64, 384, 2816, 4096, True),
                     Grouped(8, 4096 * 2 // 8, 28672, 4096, False)],
    "routed_grouped_gemm": [Routed(e, h, n, k, t) for e, h, n, k in ((8, 4096, 14336, 2), (64, 2048, 1408, 6))
                            for t in (16, 1024, 4096)],
}
OPS = tuple(SHAPES)
# `fray bench <op>` finds a benchmark by the op's family module; the GEMM ops live in
# fray.ops.moe_gemm but are benchmarked here (bench/moe), beside routing and dispatch
BENCH_OPS = ("fused_moe", "grouped_gemm", "routed_grouped_gemm")
_SHAPE_RE = re.compile(r"^(mixtral|qwen3|deepseek_v3):T(\d+)$")
_FUSED_RE = re.compile(r"^(%s|e\d+h\d+i\d+k\d+):T(\d+)(:prepared)?$" % "|".join(MODELS))
_GROUPED_RE = re.compile(r"^G(\d+)x(\d+)N(\d+)K(\d+)(:uneven)?$")
_ROUTED_RE = re.compile(r"^e(\d+)h(\d+)n(\d+)k(\d+):T(\d+)$")


def shape_name(op, shape):
    """The recorded shape string of one SHAPES entry (parse_shapes reads it back)."""
    if op == "fused_moe":
        return "%s:T%d%s" % (shape.model, shape.tokens, ":prepared" if shape.prepared else "")
    if op == "grouped_gemm":
        return "G%dx%dN%dK%d%s" % (shape.groups, shape.rows, shape.n, shape.k, ":uneven" if shape.uneven else "")
    if op == "routed_grouped_gemm":
        return "e%dh%dn%dk%d:T%d" % shape
    return "%s:T%d" % shape


def parse_shapes(op, text):
    """--shapes for this family, a comma list of: "<mixtral|qwen3|deepseek_v3>:T<tokens>"
    (moe_route, moe_dispatch); "<model>:T<tokens>[:prepared]" (fused_moe, model one of MODELS or
    e<E>h<H>i<I>k<k>); "G<groups>x<rows>N<n>K<k>[:uneven]" (grouped_gemm);
    "e<E>h<H>n<N>k<k>:T<tokens>" (routed_grouped_gemm)."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if op == "fused_moe":
            m = _FUSED_RE.match(item)
            if not m:
                raise ValueError("shapes: expected <%s|e<E>h<H>i<I>k<k>>:T<tokens>[:prepared], got %r"
                                 % ("|".join(MODELS), item))
            model_spec(m.group(1))  # the generic form's sizes checked here
            out.append(Fused(m.group(1), _positive(int(m.group(2)), item), bool(m.group(3))))
        elif op == "grouped_gemm":
            m = _GROUPED_RE.match(item)
            if not m:
                raise ValueError("shapes: expected G<groups>x<rows>N<n>K<k>[:uneven], got %r" % item)
            g, rows, n, k = (_positive(int(v), item) for v in m.groups()[:4])
            out.append(Grouped(g, rows, n, k, bool(m.group(5))))
        elif op == "routed_grouped_gemm":
            m = _ROUTED_RE.match(item)
            if not m:
                raise ValueError("shapes: expected e<E>h<H>n<N>k<k>:T<tokens>, got %r" % item)
            e, h, n, k, t = (_positive(int(v), item) for v in m.groups())
            if k > e:
                raise ValueError("shapes: %r routes to k > E experts" % item)
            out.append(Routed(e, h, n, k, t))
        else:
            m = _SHAPE_RE.match(item)
            if not m:
                raise ValueError("shapes: expected <mixtral|qwen3|deepseek_v3>:T<tokens>, got %r" % item)
            out.append((m.group(1), int(m.group(2))))
    return out


def _positive(v, item):
    if v < 1:
        raise ValueError("shapes: every size in %r must be >= 1" % item)
    return v
def eager_route(x, top_k, scoring="softmax", renormalize=True, num_expert_group=None, topk_group=None,
                correction_bias=None, routed_scaling_factor=1.0):
    """The torch composite of moe_route (ties as torch.topk breaks them)."""
    xf = x.float()
    s = torch.softmax(xf, dim=-1) if scoring == "softmax" else torch.sigmoid(xf)
    sel = s if correction_bias is None else s + correction_bias.float()
    if num_expert_group:
        t, e = sel.shape
        grouped = sel.view(t, num_expert_group, e // num_expert_group)
        gscore = grouped.topk(min(2, e // num_expert_group), dim=-1).values.sum(-1)
        keep = torch.zeros_like(gscore, dtype=torch.bool).scatter_(1, gscore.topk(topk_group, dim=-1).indices, True)
        sel = grouped.masked_fill(~keep[..., None], float("-inf")).view(t, e)
    ids = sel.topk(top_k, dim=-1).indices
    w = s.gather(1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w * routed_scaling_factor, ids.to(torch.int32)


def eager_dispatch(topk_ids, num_experts, block_m):
    """The torch composite of moe_dispatch without an expert map; same outputs, no host sync."""
    flat = topk_ids.reshape(-1).long()
    n, dev = flat.numel(), flat.device
    rows = M.dispatch_rows(topk_ids.shape[0], topk_ids.shape[1], num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    offsets = torch.cat([counts.new_zeros(1), padded.cumsum(0)])
    starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])
    order = torch.sort(flat, stable=True).indices
    experts = flat[order]
    row = offsets[experts] + torch.arange(n, device=dev) - starts[experts]
    sorted_ids = torch.full((rows,), n, dtype=torch.long, device=dev).scatter_(0, row, order)
    inverse = torch.empty(n, dtype=torch.long, device=dev).scatter_(0, order, row)
    tiles = torch.arange(rows // block_m, device=dev) * block_m
    owner = torch.searchsorted(offsets[1:], tiles, right=True)
    tile_expert = torch.where(tiles < offsets[-1], owner, -1)
    num_tiles = (offsets[-1:] // block_m)
    i32 = torch.int32
    return (sorted_ids.to(i32), offsets.to(i32), tile_expert.to(i32), num_tiles.to(i32), inverse.to(i32),
            counts.to(i32))


# ---------------------------------------------------------------------------------------------
# the grouped-GEMM composites (torch.eager / torch.compile peers of fused_moe and
# routed_grouped_gemm) and the per-expert loop

def _act(name, g):
    """fused_moe's activations on fp32 gate values: silu, gelu (erf form) or gelu_tanh."""
    if name == "silu":
        return F.silu(g)
    if name == "gelu":
        return F.gelu(g)
    if name == "gelu_tanh":
        return F.gelu(g, approximate="tanh")
    raise ValueError("activation: expected silu, gelu or gelu_tanh, got %r" % name)


def sort_routes(topk_ids, experts, expert_map=None):
    """(order, offs, keep) for the grouped-GEMM composites, with no host synchronisation:
    order = the routes (r = token·k + rank) stably sorted by local expert, the routes an expert
    map drops (-1) after every expert; offs = int32 [E], each expert's cumulative end in that
    order (torch._grouped_mm's `offs`); keep = bool [T·k, 1] in that order, False for dropped
    routes (None without a map: every route is kept)."""
    ids = topk_ids.reshape(-1).long()
    if expert_map is not None:
        ids = expert_map.long()[ids]
        ids = torch.where(ids < 0, experts, ids)
    order = torch.argsort(ids, stable=True)
    # counts by scatter_add (torch.bincount synchronises to size its output)
    counts = torch.zeros(experts + 1, dtype=torch.long, device=ids.device).scatter_add_(0, ids, torch.ones_like(ids))
    offs = counts[:experts].cumsum(0).to(torch.int32)
    keep = None if expert_map is None else (ids[order] < experts)[:, None]
    return order, offs, keep


def combine_routes(y, topk_weights, order, keep, top_k, tokens):
    """out[t] = sum over t's routes of round(y_r · w_r), the sum in fp32, cast to y's dtype: y the
    expert outputs in sorted order."""
    w = topk_weights.reshape(-1)[order].float()
    yw = (y.float() * w[:, None]).to(y.dtype)
    if keep is not None:
        # the grouped GEMM does not write the rows past offs[-1] (the dropped routes): whatever is
        # there (NaN included) is selected away, not multiplied by zero
        yw = torch.where(keep, yw, torch.zeros((), dtype=yw.dtype, device=yw.device))
    out = torch.zeros(tokens, y.shape[1], dtype=torch.float32, device=y.device)
    return out.index_add_(0, order // top_k, yw.float()).to(y.dtype)


def eager_experts(x, w13, w2, topk_weights, topk_ids, expert_map=None, activation="silu", grouped_mm=None):
    """fused_moe after routing, as a user writes it with torch._grouped_mm (w13 [E, 2I, H], w2
    [E, H, I]; grouped_mm: a stand-in with _grouped_mm's semantics, for tests)."""
    mm = torch._grouped_mm if grouped_mm is None else grouped_mm
    t, k = topk_ids.shape
    inter = w2.shape[2]
    order, offs, keep = sort_routes(topk_ids, w13.shape[0], expert_map)
    xs = x[order // k]
    # w.transpose(-2, -1) of a contiguous [E, N, K] is the column-major mat_b _grouped_mm wants
    g = mm(xs, w13.transpose(-2, -1), offs=offs).float()
    h = (_act(activation, g[:, :inter]) * g[:, inter:]).to(x.dtype)
    y = mm(h, w2.transpose(-2, -1), offs=offs)
    return combine_routes(y, topk_weights, order, keep, k, t)


def eager_fused_moe(x, w13, w2, router_logits, top_k, expert_map=None, activation="silu", grouped_mm=None,
                    **route):
    """fused_moe end to end: route as moe_route's composite, then eager_experts."""
    w, ids = eager_route(router_logits, top_k, **route)
    return eager_experts(x, w13, w2, w, ids, expert_map, activation, grouped_mm)


def loop_experts(x, w13, w2, topk_weights, topk_ids, expert_map=None, activation="silu"):
    """fused_moe after routing as an inference engine's naive path: one pass per local expert, its
    routes found by torch.where (a host synchronisation each)."""
    t, _ = topk_ids.shape
    inter = w2.shape[2]
    ids = topk_ids.long() if expert_map is None else expert_map.long()[topk_ids.long()]
    out = torch.zeros(t, x.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        tok, rank = torch.where(ids == e)
        if tok.numel() == 0:
            continue
        g = F.linear(x[tok], w13[e]).float()
        h = (_act(activation, g[:, :inter]) * g[:, inter:]).to(x.dtype)
        y = F.linear(h, w2[e])
        out.index_add_(0, tok, (y.float() * topk_weights[tok, rank, None].float()).to(x.dtype).float())
    return out.to(x.dtype)


def eager_routed(x, w, topk_weights, topk_ids, grouped_mm=None):
    """routed_grouped_gemm after routing with torch._grouped_mm (w [E, N, H])."""
    mm = torch._grouped_mm if grouped_mm is None else grouped_mm
    t, k = topk_ids.shape
    order, offs, keep = sort_routes(topk_ids, w.shape[0])
    y = mm(x[order // k], w.transpose(-2, -1), offs=offs)
    return combine_routes(y, topk_weights, order, keep, k, t)


def eager_routed_grouped_gemm(x, w, logits, top_k, grouped_mm=None):
    """routed_grouped_gemm end to end: softmax top-k renormalised, then eager_routed."""
    tw, ids = eager_route(logits, top_k)
    return eager_routed(x, w, tw, ids, grouped_mm)


def loop_grouped_gemm(a, b, offsets):
    """grouped_gemm as per-group torch.mm into the row slices of one output (b [G, N, K]; offsets:
    G + 1 host ints, what a loop over groups knows). Rows outside the groups are left unwritten."""
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    for g in range(b.shape[0]):
        lo, hi = offsets[g], offsets[g + 1]
        if hi > lo:
            torch.mm(a[lo:hi], b[g].t(), out=out[lo:hi])
    return out


def route_counts(topk_ids, expert_map=None):
    """(routes, experts hit): the routes that reach a local expert and the distinct local experts
    they reach (the metrics' R and X; this synchronises, so it runs outside the timing)."""
    ids = topk_ids.reshape(-1).long()
    if expert_map is not None:
        ids = expert_map.long()[ids]
    kept = ids[ids >= 0]
    return int(kept.numel()), int(torch.unique(kept).numel())


def fused_flops(spec, routes):
    """2·R·(H·2I + I·H): both GEMMs of every kept route."""
    return 2.0 * routes * (spec.hidden * 2 * spec.inter + spec.inter * spec.hidden)


def fused_bytes(spec, tokens, hit):
    """The hit experts' w13 and w2 bytes, for T <= 16 (None above: no longer weight-bound)."""
    if tokens > 16:
        return None
    elem = torch.empty(0, dtype=spec.dtype).element_size()
    return hit * (2 * spec.inter * spec.hidden + spec.hidden * spec.inter) * elem


def grouped_flops(shape, offsets):
    """2·rows·N·K over the rows the groups own (offsets: G + 1 host ints)."""
    return 2.0 * (offsets[-1] - offsets[0]) * shape.n * shape.k


def routed_flops(shape):
    """2·T·k·H·N: every route's GEMM row."""
    return 2.0 * shape.tokens * shape.top_k * shape.hidden * shape.n


def routed_bytes(shape, hit, elem=2):
    """The hit experts' weight bytes, for T <= 16 (None above)."""
    return hit * shape.n * shape.hidden * elem if shape.tokens <= 16 else None


# The per-expert loop's time per call, estimated from the shape to leave it out of shapes where it
# would take longer than LOOP_LIMIT_MS (a peer that slow says nothing and costs the run minutes).
LOOP_LIMIT_MS = 50.0
LOOP_EXPERT_US = 60.0   # per expert: torch.where's synchronisation and ~6 launches
LOOP_TFLOPS = 200.0     # cuBLAS on per-expert GEMMs of a few hundred rows, below its peak


def loop_ms(spec, tokens):
    return spec.experts * LOOP_EXPERT_US / 1e3 + fused_flops(spec, tokens * spec.top_k) / (LOOP_TFLOPS * 1e9)


def _capturable(fn, why):
    """fn, refusing to run under CUDA-graph capture: a host synchronisation there would fail and
    invalidate the capture; refused first, the :graph variant gets an error row saying why."""
    def call():
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(why)
        return fn()
    return call


def _fray_backends(op, device):
    """("cuda", "triton") where fray reports a CUDA kernel of op available on the device, else
    ("triton",): a fray.cuda row only where the CUDA backend exists (grouped_gemm's explicit form,
    fused_moe)."""
    from fray import backend as B
    device = torch.device(device)
    if device.type != "cuda":
        return ("triton",)
    family = fray.CUDA_FAMILY.get(op, "moe")
    return (("cuda",) if B.available(op, family, device)["cuda"] is None else ()) + ("triton",)


# ---------------------------------------------------------------------------------------------
# inputs

def randn_experts(e, n, k, dtype, gen, device):
    """[e, n, k] standard normal / sqrt(k) (fan-in k: the GEMM's outputs stay O(1)), drawn one
    expert at a time so no fp32 copy of the whole stack is made (the seed's w13 is 15 GB)."""
    w = torch.empty(e, n, k, dtype=dtype, device=device)
    for i in range(e):
        w[i] = torch.randn(n, k, generator=gen, device=device) / math.sqrt(k)
    return w


def fused_weights(spec, device):
    gen = torch.Generator(device=device).manual_seed(1)
    return (randn_experts(spec.experts, 2 * spec.inter, spec.hidden, spec.dtype, gen, device),
            randn_experts(spec.experts, spec.hidden, spec.inter, spec.dtype, gen, device))


def fused_inputs(shape, device, weights=None):
    """x, router logits (and the routing options), the expert map, the weights and the routing
    the prepared variant takes (from moe_route's composite of the same logits)."""
    spec = model_spec(shape.model)
    t = shape.tokens
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(t, spec.hidden, generator=gen, device=device).to(spec.dtype)
    logits = torch.randn(t, spec.global_experts, generator=gen, device=device).to(spec.dtype)
    route = dict(spec.route)
    if spec.bias:
        g = torch.Generator().manual_seed(1)  # as moe_route's deepseek_v3 recipe
        route["correction_bias"] = (torch.randint(-4, 5, (spec.global_experts,), generator=g).float() / 64).to(device)
    emap = None
    if spec.global_experts != spec.experts:
        # rank 0 of expert parallelism: global experts 0..E-1 are its local 0..E-1
        emap = torch.full((spec.global_experts,), -1, dtype=torch.int32, device=device)
        emap[:spec.experts] = torch.arange(spec.experts, dtype=torch.int32, device=device)
    w13, w2 = weights if weights is not None else fused_weights(spec, device)
    tw, ids = eager_route(logits, spec.top_k, **route)
    return dict(spec=spec, shape=shape, x=x, logits=logits, route=route, emap=emap, w13=w13, w2=w2, tw=tw, ids=ids)


def group_sizes(shape):
    """Rows per group: `rows` each, or (uneven) groups·rows split at random with a fixed seed,
    about one group in eight (at least one, where there are two) empty."""
    g, total = shape.groups, shape.groups * shape.rows
    if not shape.uneven:
        return [shape.rows] * g
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(g, generator=gen).tolist()
    empty = set(perm[:min(g - 1, max(1, g // 8))])
    full = [i for i in range(g) if i not in empty]
    cuts = sorted(torch.randint(0, total + 1, (len(full) - 1,), generator=gen).tolist())
    parts = [hi - lo for lo, hi in zip([0] + cuts, cuts + [total])]
    sizes = [0] * g
    for i, p in zip(full, parts):
        sizes[i] = p
    return sizes


def grouped_inputs(shape, device):
    sizes = group_sizes(shape)
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(offsets[-1], shape.k, generator=gen, device=device).to(torch.bfloat16)
    b = randn_experts(shape.groups, shape.n, shape.k, torch.bfloat16, gen, device)
    offs = torch.tensor(offsets, dtype=torch.int32, device=device)
    return dict(a=a, b=b, offsets=offsets, offs=offs, ends=offs[1:].contiguous())


def routed_inputs(shape, device):
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape.tokens, shape.hidden, generator=gen, device=device).to(torch.bfloat16)
    logits = torch.randn(shape.tokens, shape.experts, generator=gen, device=device).to(torch.bfloat16)
    w = randn_experts(shape.experts, shape.n, shape.hidden, torch.bfloat16, gen, device)
    tw, ids = eager_route(logits, shape.top_k)
    return dict(x=x, logits=logits, w=w, tw=tw, ids=ids)


# ---------------------------------------------------------------------------------------------
# impls

_LOOP_SYNC = "torch.loop synchronises with the host per expert (torch.where): not capturable in a CUDA graph"


def fused_impls(inp, compile_fn=torch.compile, device="cuda"):
    """{impl: zero-argument callable} for one fused_moe shape (fray.* call fray.fused_moe, resolved
    only when called: the op may not exist in this fray)."""
    spec, shape = inp["spec"], inp["shape"]
    x, w13, w2, emap, route = inp["x"], inp["w13"], inp["w2"], inp["emap"], inp["route"]
    logits, tw, ids, k = inp["logits"], inp["tw"], inp["ids"], spec.top_k
    out = {}
    if shape.prepared:
        for b in _fray_backends("fused_moe", device):
            out["fray." + b] = lambda b=b: fray.fused_moe(x, w13, w2, topk_weights=tw, topk_ids=ids, expert_map=emap,
                                                          backend=b)
        out["torch.eager"] = lambda: eager_experts(x, w13, w2, tw, ids, emap)
        compiled = compile_fn(eager_experts, fullgraph=True)
        out["torch.compile"] = lambda: compiled(x, w13, w2, tw, ids, emap)

        def loop():
            return loop_experts(x, w13, w2, tw, ids, emap)
    else:
        for b in _fray_backends("fused_moe", device):
            out["fray." + b] = lambda b=b: fray.fused_moe(x, w13, w2, router_logits=logits, top_k=k, expert_map=emap,
                                                          backend=b, **route)
        out["torch.eager"] = lambda: eager_fused_moe(x, w13, w2, logits, k, emap, **route)
        compiled = compile_fn(eager_fused_moe, fullgraph=True)
        out["torch.compile"] = lambda: compiled(x, w13, w2, logits, k, emap, **route)

        def loop():
            w, i = eager_route(logits, k, **route)
            return loop_experts(x, w13, w2, w, i, emap)
    if loop_ms(spec, shape.tokens) <= LOOP_LIMIT_MS:
        out["torch.loop"] = _capturable(loop, _LOOP_SYNC)
    return out


def grouped_impls(inp, device="cuda"):
    a, b, offs, ends, offsets = inp["a"], inp["b"], inp["offs"], inp["ends"], inp["offsets"]
    out = {}
    for be in _fray_backends("grouped_gemm", device):
        out["fray." + be] = lambda be=be: fray.grouped_gemm(a, b, offs, b_layout="nk", backend=be)
    bt = b.transpose(-2, -1)
    out["torch.eager"] = lambda: torch._grouped_mm(a, bt, offs=ends)
    out["torch.loop"] = lambda: loop_grouped_gemm(a, b, offsets)
    return out


COMBINES = ("atomic", "staged", "scatter")


def routed_impls(inp, device="cuda"):
    """fray.triton (combine="auto") and one fray.triton:<mode> row per combine mode, the torch
    composite."""
    x, w, logits = inp["x"], inp["w"], inp["logits"]
    k = inp["ids"].shape[1]
    out = {}
    for b in _fray_backends("routed_grouped_gemm", device):
        out["fray." + b] = lambda b=b: fray.routed_grouped_gemm(x, w, logits, k, backend=b)
    for mode in COMBINES:
        out["fray.triton:" + mode] = lambda m=mode: fray.routed_grouped_gemm(x, w, logits, k, combine=m,
                                                                           backend="triton")
    out["torch.eager"] = lambda: eager_routed_grouped_gemm(x, w, logits, k)
    return out


def inputs(op, recipe, t, device):
    x, k, kw = M._recipe_args(recipe, 0, torch.bfloat16, device)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(t, x.shape[1], device=device, generator=g).to(torch.bfloat16)
    if op == "moe_route":
        return dict(x=x, k=k, kw=kw)
    ids = x.float().topk(k, dim=-1).indices.to(torch.int32)
    return dict(ids=ids, e=x.shape[1], k=k)


def impls(op, inp, compile_fn=torch.compile):
    out = {}
    if op == "moe_route":
        x, k, kw = inp["x"], inp["k"], inp["kw"]
        out["fray.triton"] = lambda: fray.moe_route(x, k, backend="triton", **kw)
        out["torch.eager"] = lambda: eager_route(x, k, **kw)
        compiled = compile_fn(eager_route, fullgraph=True)
        out["torch.compile"] = lambda: compiled(x, k, **kw)
    else:
        ids, e = inp["ids"], inp["e"]
        out["fray.triton"] = lambda: fray.moe_dispatch(ids, e, BLOCK_M, backend="triton")
        out["torch.eager"] = lambda: eager_dispatch(ids, e, BLOCK_M)
        compiled = compile_fn(eager_dispatch, fullgraph=True)
        out["torch.compile"] = lambda: compiled(ids, e, BLOCK_M)
    return out


def nbytes(op, inp):
    if op == "moe_route":
        x, k = inp["x"], inp["k"]
        bias = 4 * x.shape[1] if "correction_bias" in inp["kw"] else 0
        return x.numel() * x.element_size() + bias + 8 * x.shape[0] * k
    ids, e = inp["ids"], inp["e"]
    n = ids.numel()
    rows = M.dispatch_rows(ids.shape[0], ids.shape[1], e, BLOCK_M)
    return 4 * n + 4 * (rows + n + (e + 1) + rows // BLOCK_M + 1 + e)


def run(op, recorder, shapes=None, graph=True, device="cuda", compile_fn=torch.compile):
    if op not in SHAPES:
        raise ValueError("op: expected one of %s, got %r" % (", ".join(SHAPES), op))
    from fray.bench import bench_impls
    shapes = shapes or SHAPES[op]
    if op == "fused_moe":
        weights = None  # (model, (w13, w2)): consecutive shapes of one model share its weights
        for shape in shapes:
            if weights is None or weights[0] != shape.model:
                weights = None
                _empty_cache(device)
                # Dynamo keeps its compiled entries per code object (not per torch.compile
                # wrapper), at most 8: across every model the composites would reach that limit
                # (T=1 specialised, routing options and dtypes guarded) and later shapes would get
                # error rows. Per model: one static compile at the first T, one dynamic in T after.
                torch._dynamo.reset()
                weights = (shape.model, fused_weights(model_spec(shape.model), device))
            inp = fused_inputs(shape, device, weights[1])
            spec = inp["spec"]
            routes, hit = route_counts(inp["ids"], inp["emap"])
            # decode (T <= 16) runs inside an engine's CUDA graph: a replay row whatever eager took
            # (eager there is host-bound: the launches cost more than the weights take to stream)
            bench_impls(recorder, op, shape_name(op, shape), spec.dtype, fused_impls(inp, compile_fn, device),
                        fused_bytes(spec, shape.tokens, hit), fused_flops(spec, routes),
                        graph="always" if graph and shape.tokens <= 16 else graph,
                        routes=routes, experts_hit=hit)
            del inp
        return
    for shape in shapes:
        if op == "grouped_gemm":
            inp = grouped_inputs(shape, device)
            bench_impls(recorder, op, shape_name(op, shape), torch.bfloat16, grouped_impls(inp, device), None,
                        grouped_flops(shape, inp["offsets"]), graph=graph, rows=inp["offsets"][-1],
                        empty_groups=sum(1 for lo, hi in zip(inp["offsets"], inp["offsets"][1:]) if hi == lo))
        elif op == "routed_grouped_gemm":
            inp = routed_inputs(shape, device)
            _, hit = route_counts(inp["ids"])
            bench_impls(recorder, op, shape_name(op, shape), torch.bfloat16, routed_impls(inp, device),
                        routed_bytes(shape, hit), routed_flops(shape), graph=graph, experts_hit=hit)
        else:
            recipe, t = shape
            inp = inputs(op, recipe, t, device)
            bench_impls(recorder, op, shape_name(op, shape), torch.bfloat16 if op == "moe_route" else "int32",
                        impls(op, inp, compile_fn), nbytes(op, inp), graph=graph)
        del inp
        _empty_cache(device)


def _empty_cache(device):
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
