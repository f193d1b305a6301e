"""MoE-family benchmarks (routing and dispatch metadata): Fray's Triton kernels (the family has
no CUDA C++ backend yet) and the peers a user would write instead, in one process.

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
"""
import re

import torch

import fray
from fray.ops import moe as M

TOKENS = (1, 128, 4096)
BLOCK_M = 64
SHAPES = {
    "moe_route": [(recipe, t) for recipe in M.RECIPES for t in TOKENS],
    "moe_dispatch": [(recipe, t) for recipe in M.RECIPES for t in TOKENS],
}
OPS = tuple(SHAPES)
_SHAPE_RE = re.compile(r"^(mixtral|qwen3|deepseek_v3):T(\d+)$")


def parse_shapes(op, text):
    """--shapes for this family: a comma list of "<recipe>:T<tokens>" (mixtral:T128, ...)."""
    out = []
    for item in text.split(","):
        m = _SHAPE_RE.match(item.strip())
        if not m:
            raise ValueError("shapes: expected <mixtral|qwen3|deepseek_v3>:T<tokens>, got %r" % item)
        out.append((m.group(1), int(m.group(2))))
    return out


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
        raise ValueError("op: expected moe_route or moe_dispatch, got %r" % op)
    from fray.bench import bench_impls
    for recipe, t in shapes or SHAPES[op]:
        inp = inputs(op, recipe, t, device)
        bench_impls(recorder, op, "%s:T%d" % (recipe, t), torch.bfloat16 if op == "moe_route" else "int32",
                    impls(op, inp, compile_fn), nbytes(op, inp), graph=graph)
        if device == "cuda":
            torch.cuda.empty_cache()
