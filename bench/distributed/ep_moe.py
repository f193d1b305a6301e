"""The expert-parallel MoE layer under torch.distributed: Fray's path against the all-to-all +
torch._grouped_mm composite, DeepSeek-V3's layer with its 256 experts split over the ranks.

A plain script like all_reduce_add_rmsnorm.py beside it, and for the same reason (ranks must time
in lockstep, which the family protocol's adaptive do_bench does not): it takes that script's
group set-up (init_group), lockstep timer (time_lockstep: warm-up, then a fixed count of calls,
each timed with CUDA events after an L2 flush) and slowest (the slowest rank's figure), and
fray.bench's Recorder (the JSON-lines keys), time_rounds (the impls interleaved, 3 rounds) and
flags (--out, --shapes).

    python3 bench/distributed/ep_moe.py --out results.jsonl                      # world size 1
    torchrun --nproc-per-node=8 bench/distributed/ep_moe.py --out results.jsonl
    bazel run //bench/distributed:ep_moe -- --out=$PWD/results.jsonl

Without torchrun's variables (RANK, WORLD_SIZE) it makes a one-process NCCL group of its own.
Only rank 0 writes records and prints the table.

The layer: DeepSeek-V3's routed experts, hidden 7168, moe intermediate 2048, bf16, routing as
moe_route's deepseek_v3 recipe (sigmoid scores + correction bias, 8 groups, the best 4 kept,
top-8, weights renormalised x2.5) over E = 256 experts; rank r of W holds experts
[r*E/W, (r+1)*E/W) (fray.distributed.expert_map), w13 [E/W, 2I, H] and w2 [E/W, H, I] standard
normal / sqrt(fan in), drawn from a seed of the rank's own. Each rank has T tokens (x standard
normal, seeded by rank; router logits standard normal in fp32, seeded by rank: see rank_tokens).
--experts_per_rank (default E/W = 256/W: the whole layer, 88 MB of bf16 weights an expert,
22.5 GB a rank at W 1, 2.8 GB at W 8) sets the experts a rank holds; any other value routes
with the same recipe over experts_per_rank * W experts (a multiple of 8, at least 16), and the
shape names then carry ":e<E>".
Shapes: T 4096 (the bar) and 128 (decode-like) tokens per rank, named with the world size
("T4096:w8"; --shapes T4096,T128 selects them). Records carry world_size, experts,
experts_per_rank, routes (the rows the busiest rank's experts serve) and experts_hit (the most
distinct local experts any rank's rows reach).
Rows: op ep_moe
  fray.nccl    fray.moe_route -> fray.distributed.moe_dispatch -> fray.fused_moe on the received
               rows (topk_ids = their global ids [R, 1], their weights, expert_map = this rank's)
               -> fray.distributed.moe_combine (fp32 sum of each token's routes in rank order)
  torch.eager  the composite: moe_route's torch composite (fray.bench.moe.eager_route), the
               routes sorted by destination rank (stable argsort), the counts exchanged
               (all_to_all_single) and read to the host, the token rows and the (id, weight)
               pairs sent with all_to_all_single, this rank's experts by the torch._grouped_mm
               composite bench/moe times (fray.bench.moe.eager_experts: sort by local expert,
               _grouped_mm, silu * up, _grouped_mm, times the weight), the rows sent back with
               all_to_all_single, put back in route order and each token's k rows summed in fp32
and op ep_exchange, impl fray.nccl: moe_dispatch + moe_combine of the received rows alone (no
experts; the exchange's floor, its own op so that the table does not count it as a peer).
Both layers synchronise with the host once (the split sizes all_to_all_single takes as lists),
so neither is CUDA-graph capturable and --graph does nothing here.
tflops = 2·R·(H·2I + I·H) with R the busiest rank's routes; bytes (gbps, T <= 128 only, where
the weight stream bounds the time) = X·3·H·I·2, X the busiest rank's experts hit. ep_exchange:
bytes = 2·T·k·H·2 (every route's row out and back).
Before timing a shape, both layers run once on every rank and must agree: every token routed
alike by both (all but 1% of a rank's tokens may differ, a near-tie the fp32 Triton kernel and
the torch composite may break apart: those are left out) must have every output within
2^-5 + 2^-5·|composite| of the composite's. Otherwise every rank exits non-zero, naming the
worst token, before any timing.
The bar (issue 24, multi-GPU H200): fray.nccl >= 1.2x torch.eager at T4096 per rank.
NVLink multicast stays off: importing fray.distributed (first, below) sets NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 before NCCL starts; export them
before torchrun as well.
"""
import fray.distributed as fd  # noqa: I001  (first: the multicast switches before NCCL starts)

import os
import re
import sys

import torch
import torch.distributed as dist
from absl import app, flags

import fray
from fray.bench import Recorder, median, time_rounds
from fray.bench import moe as bm
from fray.bench.main import FLAGS
from fray.ops import moe as M

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # the sibling script, whether run directly, under Bazel or loaded by a test
    sys.path.insert(0, _HERE)
from all_reduce_add_rmsnorm import init_group, slowest, time_lockstep  # noqa: E402

flags.DEFINE_integer("experts_per_rank", None, "ep_moe: experts each rank holds (default 256 / world size, "
                     "DeepSeek-V3's whole layer; fewer route over experts_per_rank * world size experts)")

RECIPE = M.RECIPES["deepseek_v3"]
HIDDEN, INTER = 7168, 2048
TOKENS = (4096, 128)
ROUNDS = 3
BYTES_MAX_TOKENS = 128   # gbps only at or below this many tokens per rank (weight-bound there)
RTOL = ATOL = 2.0 ** -5  # bf16: a few units in the last place of O(1) outputs
REROUTED_MAX = 0.01      # the share of a rank's tokens the two routings may disagree on
FLUSH_BYTES = 256 * 1024 * 1024


# ---------------------------------------------------------------------------------------------
# the layer and its inputs

def layer(world, experts_per_rank=None, hidden=HIDDEN, inter=INTER):
    """The bench/moe Model of one rank: `experts` local experts of `global_experts` routed over
    with DeepSeek-V3's recipe."""
    e = RECIPE["experts"]
    groups, topk_group, k = RECIPE["kwargs"]["num_expert_group"], RECIPE["kwargs"]["topk_group"], RECIPE["top_k"]
    if experts_per_rank is None:
        if e % world:
            raise ValueError("experts_per_rank: DeepSeek-V3's %d experts do not split evenly over %d ranks; "
                             "pass --experts_per_rank" % (e, world))
        experts_per_rank = e // world
    if experts_per_rank < 1:
        raise ValueError("experts_per_rank: expected a value >= 1, got %d" % experts_per_rank)
    total = experts_per_rank * world
    if total % groups or total // groups * topk_group < k:
        raise ValueError("experts_per_rank: %d over %d ranks gives %d experts; DeepSeek-V3's routing (%d groups, "
                         "%d kept, top-%d) needs a multiple of %d, at least %d"
                         % (experts_per_rank, world, total, groups, topk_group, k, groups, groups * k // topk_group))
    return bm.Model(experts_per_rank, k, hidden, inter, total, torch.bfloat16, dict(RECIPE["kwargs"]), bias=True)


def routing(model, device):
    """moe_route's keyword arguments: the recipe's, and its correction bias (multiples of 1/64
    in [-1/16, 1/16], the same seed as the deepseek_v3 recipe's, the same on every rank)."""
    g = torch.Generator().manual_seed(1)
    bias = torch.randint(-4, 5, (model.global_experts,), generator=g).float() / 64
    return dict(model.route, correction_bias=bias.to(device))


def rank_weights(model, rank, device):
    """(w13 [El, 2I, H], w2 [El, H, I]) of `rank`'s experts: standard normal / sqrt(fan in), from
    a seed of the rank's own (rank r's are global experts r*El .. (r+1)*El - 1)."""
    gen = torch.Generator(device=device).manual_seed(1 + rank)
    return (bm.randn_experts(model.experts, 2 * model.inter, model.hidden, model.dtype, gen, device),
            bm.randn_experts(model.experts, model.hidden, model.inter, model.dtype, gen, device))


def rank_tokens(model, tokens, rank, device):
    """(x [T, H], router logits [T, E]) of `rank`'s tokens: x standard normal, the logits standard
    normal in fp32 (as a router in fp32 gives them; no exact ties). Not moe_route's tie-free grid:
    every row of it is a permutation of the same values, so every token's best scores are nearly
    equal and the fixed correction bias alone picks among them (at a span of 8, where most sigmoid
    scores sit near 1, 89 of 256 experts got all of T4096's routes; these logits reach all 256,
    the busiest with ~320 of 32768)."""
    gen = torch.Generator(device=device).manual_seed(rank)
    x = torch.randn(tokens, model.hidden, generator=gen, device=device).to(model.dtype)
    return x, torch.randn(tokens, model.global_experts, generator=gen, device=device)


def shape_name(model, tokens, world):
    name = "T%d:w%d" % (tokens, world)
    return name if model.global_experts == RECIPE["experts"] else name + ":e%d" % model.global_experts


_SHAPE_RE = re.compile(r"^T(\d+)$")


def parse_shapes(text):
    """--shapes: a comma list of T<tokens per rank>."""
    out = []
    for item in text.split(","):
        m = _SHAPE_RE.match(item.strip())
        if not m or int(m.group(1)) < 1:
            raise ValueError("shapes: expected T<tokens per rank> (tokens >= 1), got %r" % item)
        out.append(int(m.group(1)))
    return out


# ---------------------------------------------------------------------------------------------
# the two layers

def fray_layer(x, logits, w13, w2, model, route, emap, group=None):
    tw, ids = fray.moe_route(logits, model.top_k, **route)
    recv_x, recv_ids, recv_w, handle = fd.moe_dispatch(x, ids, tw, model.global_experts, group)
    y = fray.fused_moe(recv_x, w13, w2, topk_weights=recv_w[:, None], topk_ids=recv_ids[:, None], expert_map=emap)
    return fd.moe_combine(y, handle, group)


def composite_layer(x, logits, w13, w2, model, route, emap, group=None, grouped_mm=None):
    """The layer as plain torch writes it (see the module docstring); grouped_mm: a stand-in
    with torch._grouped_mm's semantics (tests)."""
    tw, ids = bm.eager_route(logits, model.top_k, **route)
    t, k = ids.shape
    world, dev = dist.get_world_size(group), x.device
    flat = ids.reshape(-1).long()
    dest = torch.div(flat, model.experts, rounding_mode="floor")
    order = torch.argsort(dest, stable=True)
    counts = torch.zeros(world, dtype=torch.long, device=dev).scatter_add_(0, dest, torch.ones_like(dest))
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    splits = torch.cat([counts, recv_counts]).tolist()  # all_to_all_single takes uneven splits as lists
    send_splits, recv_splits = splits[:world], splits[world:]
    rows = sum(recv_splits)
    recv_x = x.new_empty((rows, x.shape[1]))
    dist.all_to_all_single(recv_x, x[order // k], recv_splits, send_splits, group=group)
    # each route's global id and routing weight (its fp32 bits) as one int32 pair: one exchange
    meta = torch.stack([flat.to(torch.int32), tw.reshape(-1).view(torch.int32)], dim=1)[order]
    recv_meta = torch.empty((rows, 2), dtype=torch.int32, device=dev)
    dist.all_to_all_single(recv_meta, meta, recv_splits, send_splits, group=group)
    y = bm.eager_experts(recv_x, w13, w2, recv_meta[:, 1:].view(torch.float32), recv_meta[:, :1], emap,
                         grouped_mm=grouped_mm)
    back = y.new_empty((t * k, y.shape[1]))
    dist.all_to_all_single(back, y, send_splits, recv_splits, group=group)
    routed = torch.empty_like(back)
    routed[order] = back
    return routed.view(t, k, -1).sum(1, dtype=torch.float32).to(x.dtype)


def exchange(x, tw, ids, model, group=None):
    """moe_dispatch + moe_combine of the received rows as they came (no experts)."""
    recv_x, _, _, handle = fd.moe_dispatch(x, ids, tw, model.global_experts, group)
    return fd.moe_combine(recv_x, handle, group)


def impls(x, logits, w13, w2, model, route, emap, group=None, grouped_mm=None):
    """{(op, impl): zero-argument callable}: every row timed at one shape."""
    tw, ids = fray.moe_route(logits, model.top_k, **route)
    return {
        ("ep_moe", "fray.nccl"): lambda: fray_layer(x, logits, w13, w2, model, route, emap, group),
        ("ep_moe", "torch.eager"): lambda: composite_layer(x, logits, w13, w2, model, route, emap, group, grouped_mm),
        ("ep_exchange", "fray.nccl"): lambda: exchange(x, tw, ids, model, group),
    }


# ---------------------------------------------------------------------------------------------
# the check and the metrics

def compare(got, want, ids_got, ids_want):
    """This rank's agreement of the two layers' outputs [T, H]: dict(rerouted = tokens the two
    routings send to different experts (left out), bad = tokens routed alike with an output
    outside RTOL / ATOL, worst = (token, |got - want|, bound) of the largest excess, max_diff)."""
    same = (ids_got.long().sort(1).values == ids_want.long().sort(1).values).all(1)
    g, w = got.float(), want.float()
    diff = (g - w).abs()
    bound = ATOL + RTOL * w.abs()
    excess = torch.where(same[:, None], diff - bound, torch.full_like(diff, float("-inf")))
    excess = torch.where(torch.isnan(g) | torch.isnan(w), torch.full_like(diff, float("inf")), excess)
    bad = (excess > 0).any(1) & same
    out = dict(rerouted=int((~same).sum()), bad=int(bad.sum()), tokens=got.shape[0],
               max_diff=float(diff[same].max()) if bool(same.any()) else 0.0, worst=None)
    if out["bad"]:
        flat = int(excess.argmax())
        t, c = divmod(flat, got.shape[1])
        out["worst"] = (t, c, float(g[t, c]), float(w[t, c]), float(bound[t, c]))
    return out


def verdict(result):
    """None when this rank's comparison passes, else why not."""
    if result["bad"]:
        t, c, g, w, b = result["worst"]
        return ("%d of %d tokens differ beyond bf16 tolerance (worst: token %d, column %d: fray %g, composite %g, "
                "allowed %g)" % (result["bad"], result["tokens"], t, c, g, w, b))
    if result["rerouted"] > int(REROUTED_MAX * result["tokens"]):
        return ("the two routings disagree on %d of %d tokens (at most %d allowed)"
                % (result["rerouted"], result["tokens"], int(REROUTED_MAX * result["tokens"])))
    return None


def check(x, logits, w13, w2, model, route, emap, group=None, grouped_mm=None):
    """Both layers once on this rank's tokens (every rank calls it): compare()'s dict."""
    got = fray_layer(x, logits, w13, w2, model, route, emap, group)
    want = composite_layer(x, logits, w13, w2, model, route, emap, group, grouped_mm)
    _, ids_got = fray.moe_route(logits, model.top_k, **route)
    _, ids_want = bm.eager_route(logits, model.top_k, **route)
    return compare(got, want, ids_got, ids_want)


def _max_over_ranks(values, device, group=None):
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def load(x, tw, ids, model, group=None):
    """(R, X): the routes the busiest rank's experts serve, the most distinct local experts any
    rank's rows reach (a dispatch, outside the timing)."""
    _, recv_ids, _, _ = fd.moe_dispatch(x, ids, tw, model.global_experts, group)
    r, hit = _max_over_ranks([recv_ids.numel(), torch.unique(recv_ids).numel()], x.device, group)
    return int(r), int(hit)


def run(recorder, shapes=None, model=None, timer=None, device=None, grouped_mm=None):
    """Check, then time, every row at every shape; records go to `recorder` (None on ranks other
    than 0). model: layer(world) unless given; timer: fn -> µs, the same on every rank (default:
    the slowest rank's time_lockstep with an L2 flush). Exits (SystemExit, every rank) when the
    two layers disagree at a shape."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    rank, world = dist.get_rank(), dist.get_world_size()
    model = model or layer(world)
    if timer is None:
        flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device)
        timer = lambda fn: slowest(time_lockstep(fn, flush), device)  # noqa: E731
    w13, w2 = rank_weights(model, rank, device)
    emap = fd.expert_map(model.global_experts, rank, world, device=device)
    route = routing(model, device)
    for tokens in shapes or TOKENS:
        shape = shape_name(model, tokens, world)
        x, logits = rank_tokens(model, tokens, rank, device)
        result = check(x, logits, w13, w2, model, route, emap, grouped_mm=grouped_mm)
        why = verdict(result)
        if _max_over_ranks([0.0 if why is None else 1.0], device)[0]:
            raise SystemExit("ep_moe %s: the layers disagree%s" % (
                shape, "" if why is None else " on rank %d: %s" % (rank, why)))
        tw, ids = fray.moe_route(logits, model.top_k, **route)
        routes, hit = load(x, tw, ids, model)
        rows = impls(x, logits, w13, w2, model, route, emap, grouped_mm=grouped_mm)
        timed = time_rounds(rows, timer, ROUNDS)
        if recorder is not None:
            extra = dict(world_size=world, experts=model.global_experts, experts_per_rank=model.experts,
                         routes=routes, experts_hit=hit, max_diff=round(result["max_diff"], 6),
                         rerouted=result["rerouted"])
            weights = hit * 3 * model.hidden * model.inter * w13.element_size()
            sizes = {"ep_moe": (weights if tokens <= BYTES_MAX_TOKENS else None, bm.fused_flops(model, routes)),
                     "ep_exchange": (2 * tokens * model.top_k * model.hidden * x.element_size(), None)}
            for (op, impl), rounds in timed.items():
                nbytes, flops = sizes[op]
                if isinstance(rounds, Exception):
                    recorder.add(op, impl, shape, model.dtype, None, note="error: %s" % str(rounds)[:200], **extra)
                else:
                    recorder.add(op, impl, shape, model.dtype, median(rounds), nbytes, flops,
                                 rounds=[round(u, 3) for u in rounds], **extra)
        del x, logits, rows
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _main(argv):
    del argv
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks need a CUDA GPU; none is visible")
    rank, world = init_group()
    try:
        try:
            model = layer(world, FLAGS.experts_per_rank)
            shapes = parse_shapes(FLAGS.shapes) if FLAGS.shapes else None
        except ValueError as exc:  # a flag's value: the message names it
            raise SystemExit("ep_moe: %s" % exc)
        rec = Recorder(FLAGS.out) if rank == 0 else None
        with torch.no_grad():
            run(rec, shapes, model)
        if rec is not None:
            rec.table()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    app.run(_main)
