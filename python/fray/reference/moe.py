"""Mixture-of-experts routing and dispatch references (float64 scores, exact integer metadata).

moe_route:    scores = softmax(logits) or sigmoid(logits) per token; the selection score is
              scores + correction_bias (the bias chooses, it never weighs). Grouped selection
              (num_expert_group G): the E experts form G consecutive groups of E / G, a group's
              score is the sum of its two best selection scores (its one score when groups hold
              a single expert), the topk_group best groups are kept and top_k experts are chosen
              among them. Ties go to the lower id (groups and experts alike); a NaN selection
              score counts as -inf. The ids come out in decreasing
              selection score; the weights are the unbiased scores of the chosen experts,
              divided by their sum when renormalize, then times routed_scaling_factor.
moe_dispatch: route r = token * k + rank; routes sorted by (local) expert, stable in r within an
              expert, each expert's segment padded to a multiple of block_m with the sentinel T*k;
              see fray.ops.moe.moe_dispatch for the outputs.
Inputs are numpy arrays (float64 logits; integer ids).
"""
import numpy as np


def scores(logits, scoring):
    x = np.asarray(logits, np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if scoring == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        m = x.max(axis=-1, keepdims=True)
        # an all -inf row shifts by 0 (0 / 0: NaN); NaN or +inf anywhere makes the row NaN
        e = np.exp(x - np.where(m == -np.inf, 0.0, m))
        return e / e.sum(axis=-1, keepdims=True)


def _order(values, n):
    """The indices of the n largest values, largest first, ties to the lower index, NaN as -inf."""
    key = np.where(np.isnan(values), -np.inf, values)
    return np.lexsort((np.arange(len(values)), -key))[:n]  # the last key is the primary one


def moe_route(logits, top_k, scoring="softmax", renormalize=True, num_expert_group=None, topk_group=None,
              correction_bias=None, routed_scaling_factor=1.0):
    """(weights float64 [T, k], ids int64 [T, k], counts int64 [E])."""
    s = scores(logits, scoring)
    t, e = s.shape
    sel = s if correction_bias is None else s + np.asarray(correction_bias, np.float64)[None, :]
    weights = np.zeros((t, top_k))
    ids = np.zeros((t, top_k), np.int64)
    for i in range(t):
        row = sel[i]
        eligible = np.arange(e)
        if num_expert_group:
            gs = e // num_expert_group
            groups = np.where(np.isnan(row), -np.inf, row).reshape(num_expert_group, gs)
            best = -np.sort(-groups, axis=1)[:, :min(2, gs)].sum(axis=1)
            kept = np.sort(_order(best, topk_group))
            eligible = (kept[:, None] * gs + np.arange(gs)[None, :]).reshape(-1)
        chosen = eligible[_order(row[eligible], top_k)]
        ids[i] = chosen
        w = s[i, chosen]
        if renormalize:
            with np.errstate(invalid="ignore", divide="ignore"):
                w = w / w.sum()
        weights[i] = w * routed_scaling_factor
    counts = np.bincount(ids.reshape(-1), minlength=e) if t else np.zeros(e, np.int64)
    return weights, ids, counts


def dispatch_rows(num_routes, num_experts, block_m):
    """Rows of the padded sorted array: the bound T*k + E*(block_m - 1) rounded up to block_m."""
    bound = num_routes + num_experts * (block_m - 1)
    return -(-bound // block_m) * block_m


def moe_dispatch(topk_ids, num_experts, block_m, expert_map=None):
    """(sorted_route_ids, expert_offsets, tile_expert, num_tiles, inverse, counts), int64 arrays."""
    ids = np.asarray(topk_ids, np.int64).reshape(-1)
    n = ids.size
    local = ids if expert_map is None else np.asarray(expert_map, np.int64)[ids]
    counts = np.bincount(local[local >= 0], minlength=num_experts)[:num_experts]
    padded = -(-counts // block_m) * block_m
    offsets = np.concatenate([[0], np.cumsum(padded)]).astype(np.int64)
    rows = dispatch_rows(n, num_experts, block_m)
    sorted_ids = np.full(rows, n, np.int64)
    inverse = np.full(n, -1, np.int64)
    fill = offsets[:-1].copy()
    for r in range(n):
        x = local[r]
        if x < 0:
            continue
        sorted_ids[fill[x]] = r
        inverse[r] = fill[x]
        fill[x] += 1
    tiles = rows // block_m
    num_tiles = int(offsets[-1] // block_m)
    tile_expert = np.full(tiles, -1, np.int64)
    for x in range(num_experts):
        tile_expert[offsets[x] // block_m:offsets[x + 1] // block_m] = x
    return sorted_ids, offsets, tile_expert, np.array([num_tiles], np.int64), inverse, counts.astype(np.int64)
