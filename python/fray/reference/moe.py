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


# ---------------------------------------------------------------------------------------------
# the grouped GEMM, the routed GEMM and the whole MoE layer: float64 math with every rounding the
# kernels make (each GEMM's output, the activation's, the weighted contribution's, the sum's) done
# to `dtype` (a torch dtype) at the same places, so that a kernel off by one rounding differs from
# this by about one ulp, and one computing something else differs by far more

def round_to(v, dtype):
    """float64 values rounded to the torch dtype (round to nearest even), back in float64."""
    import torch
    return torch.from_numpy(np.ascontiguousarray(v, np.float64)).to(dtype).double().numpy()


def _mat(b, g, b_layout):
    """Group g's matrix as [K, N]."""
    return b[g].T if b_layout == "nk" else b[g]


def term_scale(a_rows, b, groups, b_layout):
    """|a_i| @ |B_g(i)| per row (the GEMM bound's terms, fray.testing.gemm_bound); groups[i] < 0
    leaves row i zero."""
    n = b.shape[1] if b_layout == "nk" else b.shape[2]
    out = np.zeros((a_rows.shape[0], n))
    for i, g in enumerate(groups):
        if g >= 0:
            out[i] = np.abs(a_rows[i]) @ np.abs(_mat(b, g, b_layout))
    return out


def grouped_gemm(a, b, offsets, b_layout):
    """Rows [offsets[g], offsets[g+1]) of a @ B_g, unrounded: (out [M, N], written rows mask)."""
    m = a.shape[0]
    n = b.shape[1] if b_layout == "nk" else b.shape[2]
    out = np.zeros((m, n))
    written = np.zeros(m, bool)
    for g in range(b.shape[0]):
        lo, hi = int(offsets[g]), int(offsets[g + 1])
        if hi > lo:
            out[lo:hi] = a[lo:hi] @ _mat(b, g, b_layout)
            written[lo:hi] = True
    return out, written


def local_ids(topk_ids, expert_map=None):
    ids = np.asarray(topk_ids, np.int64)
    return ids if expert_map is None else np.asarray(expert_map, np.int64)[ids]


def routes_gemm(x, b, topk_ids, b_layout, expert_map=None):
    """Route r = t * k + j: x[t] @ B_{e(r)} (unrounded) as out [T * k, N] and the written-rows
    mask (routes dropped by expert_map are not written)."""
    t, k = np.asarray(topk_ids).shape
    local = local_ids(topk_ids, expert_map).reshape(-1)
    n = b.shape[1] if b_layout == "nk" else b.shape[2]
    out = np.zeros((t * k, n))
    for r in range(t * k):
        if local[r] >= 0:
            out[r] = x[r // k] @ _mat(b, local[r], b_layout)
    return out, local >= 0


def _act(g, activation):
    from fray.reference import activation as ra
    if activation == "silu":
        return ra.silu(g)
    return ra.gelu(g, "tanh" if activation == "gelu_tanh" else "none")


def fused_moe(x, w13, w2, topk_weights, topk_ids, dtype, activation="silu", expert_map=None,
              apply_router_weight_on_input=False, w_layout="nk"):
    """The MoE layer per token: (out float64 [T, H] rounded to dtype, mag [T, H], terms [T, H]).

    For each route (t, j) of a kept expert e: xin = x[t] (round(x[t] * w) when the weight goes on
    the input), g = round(xin @ W13_e), h = round(act(g[:I]) * g[I:]), y = round(h @ W2_e),
    y = round(y * w) (unless applied on the input); out[t] = round(sum_j y), the sum in rank order.
    mag: sum_j |y|, the scale of a rounding taken the other way in one contribution; terms:
    sqrt(sum_j sum_i (w_tj h_ji W2_e[i, :])^2), the root-sum-square of the second GEMM's products,
    the scale of one-ulp changes in a few h_ji (fray.testing.assert_moe_close)."""
    t, k = np.asarray(topk_ids).shape
    local = local_ids(topk_ids, expert_map)
    w = np.asarray(topk_weights, np.float64)
    h_dim = x.shape[1]
    out = np.zeros((t, h_dim))
    mag = np.zeros((t, h_dim))
    terms = np.zeros((t, h_dim))
    for tok in range(t):
        for j in range(k):
            e = local[tok, j]
            if e < 0:
                continue
            xin = round_to(x[tok] * w[tok, j], dtype) if apply_router_weight_on_input else x[tok]
            g = round_to(xin @ _mat(w13, e, w_layout), dtype)
            i = g.shape[0] // 2
            h = round_to(_act(g[:i], activation) * g[i:], dtype)
            m2 = _mat(w2, e, w_layout)
            y = round_to(h @ m2, dtype)
            scale = 1.0 if apply_router_weight_on_input else w[tok, j]
            if not apply_router_weight_on_input:
                y = round_to(y * scale, dtype)
            out[tok] += y
            mag[tok] += np.abs(y)
            terms[tok] += (((scale * h)[:, None] * m2) ** 2).sum(axis=0)
    return round_to(out, dtype), mag, np.sqrt(terms)


def routed_gemm(x, b, topk_weights, topk_ids, dtype, b_layout="nk"):
    """The one-matrix routed GEMM: (out, mag, terms) as fused_moe's, for
    out[t] = round(sum_j round(round(x[t] @ B_e) * w_tj)); terms are zero (no rounded value feeds
    a second GEMM here, and the fp32 sum's own error is far under mag's)."""
    t, k = np.asarray(topk_ids).shape
    ids = np.asarray(topk_ids, np.int64)
    w = np.asarray(topk_weights, np.float64)
    n = b.shape[1] if b_layout == "nk" else b.shape[2]
    out = np.zeros((t, n))
    mag = np.zeros((t, n))
    terms = np.zeros((t, n))
    for tok in range(t):
        for j in range(k):
            m = _mat(b, ids[tok, j], b_layout)
            y = round_to(round_to(x[tok] @ m, dtype) * w[tok, j], dtype)
            out[tok] += y
            mag[tok] += np.abs(y)
    return round_to(out, dtype), mag, terms
