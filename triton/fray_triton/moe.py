"""Mixture-of-experts routing (top-k over expert scores) and dispatch metadata in Triton.

Semantics are fray.reference.moe's; fray.ops.moe validates, these launchers trust their inputs.

route: one program per token holds the token's whole row of E router logits (E <= 4096) in
registers as a [groups, experts per group] tile, so the grouped (DeepSeek-V3) selection needs no
second pass: scores in fp32, each group's top-2 sum, topk_group rounds of argmax over the groups,
then top_k rounds of argmax over the kept experts. An argmax is a max and then the lowest id
holding it, which is what makes ties go to the lower id and the order deterministic. k rounds of
a full-row reduction cost k * E per token; at the recipes' k <= 8 that is well under the cost of
reading the row from memory once the row is a few KB, and routing is a sliver of an MoE layer.

dispatch: at most 128 routes (decode) with a [routes, experts] tile of at most 16384 entries, one
program does it all in registers (_dispatch_small_kernel: fewer launches is what decode needs);
otherwise four launches, no host synchronisation, every size a function of (T, k, E, block_m):
  0. the sentinel fill of sorted_ids;
  1. histogram: a program per BLOCK_R routes adds 1 per route into counts[e] and into its own
     row of a [blocks, E] table (integer atomics: the result does not depend on their order);
  2. scan (one program): padded segment starts, tile_expert, num_tiles, and per (block, expert)
     the first row that block's routes of that expert take (an exclusive prefix over blocks);
  3. scatter: a program per block ranks each route among the block's earlier routes of the same
     expert ([BLOCK_R, BLOCK_R] comparison) and writes it at its row: stable, so the output is
     the same bits run to run.
Cost: the scatter compares BLOCK_R routes per route (T*k*BLOCK_R), the scan walks blocks x E
serially in one program (cdiv(T*k, BLOCK_R) * E / its width steps), and the tile map compares
tiles x E; correctness and determinism were chosen over speed here.
"""
import triton
import triton.language as tl

from fray_triton._host import cdiv, next_power_of_2

BLOCK_R = 128   # routes per histogram / scatter program (the scatter's tile is BLOCK_R^2)
SCAN_TILES = 16  # tiles per step of the scan's tile -> expert map ([SCAN_TILES, BLOCK_E] compares)
SCAN_ELEMS = 8192  # [blocks, E] entries per step of the scan's block prefix sum


@triton.jit
def _argmax_lowest(v, ids, eligible):
    """The lowest id holding the max of v over `eligible` (v: fp32 with NaN already -inf)."""
    vv = tl.where(eligible, v, float("-inf"))
    m = tl.max(tl.max(vv, axis=1), axis=0)
    hit = eligible & (vv == m)
    return tl.min(tl.min(tl.where(hit, ids, 1 << 30), axis=1), axis=0)


@triton.jit
def _route_kernel(
    X, BIAS, W, IDS, COUNTS,
    stride_x, n_experts, group_size, scale,
    TOP_K: tl.constexpr, SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr,
    N_GROUPS: tl.constexpr, TOPK_GROUP: tl.constexpr, GROUPED: tl.constexpr, TOP2: tl.constexpr,
    COUNT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    j = tl.arange(0, BLOCK_S)
    ids = g[:, None] * group_size + j[None, :]
    valid = (g[:, None] < N_GROUPS) & (j[None, :] < group_size)
    x = tl.load(X + tok * stride_x + ids, mask=valid, other=float("-inf")).to(tl.float32)
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        m = tl.max(tl.max(x, axis=1), axis=0)
        # an all -inf row shifts by 0 (0 / 0: NaN, as softmax); a NaN anywhere makes m NaN
        shift = tl.where(m == float("-inf"), 0.0, m)
        e = tl.where(valid, tl.exp(x - shift), 0.0)
        s = e / tl.sum(tl.sum(e, axis=1), axis=0)
    sel = s
    if HAS_BIAS:
        sel = s + tl.load(BIAS + ids, mask=valid, other=0.0).to(tl.float32)
    sel = tl.where(sel != sel, float("-inf"), sel)  # NaN counts as -inf
    eligible = valid
    if GROUPED:
        # group score: the sum of the group's two best selection scores
        gv = tl.where(valid, sel, float("-inf"))
        gscore = tl.max(gv, axis=1)
        if TOP2:  # groups of one expert score that expert alone
            first = tl.min(tl.where(gv == gscore[:, None], j[None, :], BLOCK_S), axis=1)
            gscore += tl.max(tl.where(j[None, :] == first[:, None], float("-inf"), gv), axis=1)
        gscore = tl.where(gscore != gscore, float("-inf"), gscore)
        gvalid = g < N_GROUPS
        kept = g < 0
        for _ in tl.static_range(TOPK_GROUP):
            cand = gvalid & ~kept
            gs = tl.where(cand, gscore, float("-inf"))
            gm = tl.max(gs, axis=0)
            pick = tl.min(tl.where(cand & (gs == gm), g, BLOCK_G), axis=0)
            kept = kept | (g == pick)
        eligible = valid & kept[:, None]
    kk = tl.arange(0, BLOCK_K)
    w_vec = tl.zeros([BLOCK_K], dtype=tl.float32)
    id_vec = tl.zeros([BLOCK_K], dtype=tl.int32)
    for r in tl.static_range(TOP_K):
        pick = _argmax_lowest(sel, ids, eligible)
        at = ids == pick
        w = tl.sum(tl.sum(tl.where(at, s, 0.0), axis=1), axis=0)
        w_vec = tl.where(kk == r, w, w_vec)
        id_vec = tl.where(kk == r, pick, id_vec)
        eligible = eligible & ~at
    if RENORM:
        w_vec = w_vec / tl.sum(tl.where(kk < TOP_K, w_vec, 0.0), axis=0)
    w_vec = w_vec * scale
    kmask = kk < TOP_K
    tl.store(W + tok * TOP_K + kk, w_vec, mask=kmask)
    tl.store(IDS + tok * TOP_K + kk, id_vec, mask=kmask)
    if COUNT:
        tl.atomic_add(COUNTS + id_vec, 1, mask=kmask)


def route(logits, bias, weights, ids, counts, top_k, sigmoid, renormalize, num_groups, topk_group, scale):
    """logits [T, E] (row stride logits.stride(0), unit column stride); weights fp32 / ids int32
    [T, top_k] contiguous; counts int32 [E] zeroed (or None); num_groups 0: ungrouped."""
    t, e = logits.shape
    grouped = num_groups > 0
    n_groups = num_groups if grouped else 1
    group_size = e // n_groups
    block_g = next_power_of_2(n_groups)
    block_s = next_power_of_2(group_size)
    warps = 1 if block_g * block_s <= 256 else (4 if block_g * block_s <= 2048 else 8)
    _route_kernel[(t,)](
        logits, bias if bias is not None else logits, weights, ids, counts if counts is not None else ids,
        logits.stride(0), e, group_size, scale,
        TOP_K=top_k, SIGMOID=sigmoid, HAS_BIAS=bias is not None, RENORM=renormalize,
        N_GROUPS=n_groups, TOPK_GROUP=topk_group if grouped else 1, GROUPED=grouped, TOP2=group_size > 1,
        COUNT=counts is not None,
        BLOCK_G=block_g, BLOCK_S=block_s, BLOCK_K=next_power_of_2(top_k), num_warps=warps,
    )


# ---------------------------------------------------------------------------------------------
# dispatch

@triton.jit
def _local_expert(IDS, MAP, r, ok, HAS_MAP: tl.constexpr):
    e = tl.load(IDS + r, mask=ok, other=0).to(tl.int32)
    if HAS_MAP:
        e = tl.load(MAP + e, mask=ok, other=-1).to(tl.int32)
    return tl.where(ok, e, -1)


@triton.jit
def _histogram_kernel(IDS, MAP, COUNTS, BLOCK_COUNTS, n_routes, n_experts,
                      HAS_MAP: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    r = b * BLOCK + tl.arange(0, BLOCK)
    e = _local_expert(IDS, MAP, r, r < n_routes, HAS_MAP)
    ok = e >= 0
    tl.atomic_add(COUNTS + e, 1, mask=ok)
    tl.atomic_add(BLOCK_COUNTS + b.to(tl.int64) * n_experts + e, 1, mask=ok)


@triton.jit
def _scan_kernel(COUNTS, BLOCK_COUNTS, OFFSETS, TILE_EXPERT, NUM_TILES, n_experts, n_blocks, max_tiles,
                 BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, TILES: tl.constexpr, CHUNK: tl.constexpr):
    x = tl.arange(0, BLOCK_E)
    xm = x < n_experts
    c = tl.load(COUNTS + x, mask=xm, other=0)
    padded = (c + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    start = end - padded
    total = tl.sum(padded, axis=0)
    tl.store(OFFSETS + x, start, mask=xm)
    tl.store(OFFSETS + n_experts, total)
    n_tiles = total // BLOCK_M
    tl.store(NUM_TILES, n_tiles)
    # tile i starts at row i * BLOCK_M; its expert is the number of experts ending at or before it
    # (empty experts end where they start, so they are stepped over)
    tt = tl.arange(0, TILES)
    for t0 in range(0, max_tiles, TILES):
        tile = t0 + tt
        row = tile * BLOCK_M
        before = tl.where(xm[None, :] & (end[None, :] <= row[:, None]), 1, 0)
        owner = tl.sum(before, axis=1)
        owner = tl.where(tile < n_tiles, owner, -1)
        tl.store(TILE_EXPERT + tile, owner, mask=tile < max_tiles)
    # per block, the first row its routes of each expert take: in place over the block counts, an
    # exclusive prefix sum down the [blocks, E] table, CHUNK blocks a step (one block a step made
    # 192 dependent load / store rounds at T4096 k6: 27 us on an H100)
    run = start
    cb = tl.arange(0, CHUNK)
    for b0 in range(0, n_blocks, CHUNK):
        rows = b0 + cb
        m = (rows < n_blocks)[:, None] & xm[None, :]
        p = BLOCK_COUNTS + rows[:, None] * n_experts + x[None, :]  # blocks * E < 2^31 (fray.ops.moe checks)
        cnt = tl.load(p, mask=m, other=0)
        incl = tl.cumsum(cnt, axis=0)
        tl.store(p, run[None, :] + incl - cnt, mask=m)
        run = run + tl.sum(cnt, axis=0)


@triton.jit
def _scatter_kernel(IDS, MAP, BLOCK_BASE, SORTED, INVERSE, POSITIONS, n_routes, n_experts,
                    HAS_MAP: tl.constexpr, HAS_POS: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    r = b * BLOCK + i
    ok = r < n_routes
    e = _local_expert(IDS, MAP, r, ok, HAS_MAP)
    kept = e >= 0
    # rank among the block's earlier routes of the same expert (dropped routes have e = -1 and
    # are never counted for a kept one)
    same = (e[:, None] == e[None, :]) & (i[None, :] < i[:, None])
    rank = tl.sum(tl.where(same, 1, 0), axis=1)
    base = tl.load(BLOCK_BASE + b.to(tl.int64) * n_experts + e, mask=kept, other=0)
    row = base + rank
    tl.store(SORTED + row, r, mask=kept)
    tl.store(INVERSE + r, tl.where(kept, row, -1), mask=ok)
    if HAS_POS:
        tl.store(POSITIONS + r, tl.where(kept, row, -1).to(tl.int64), mask=ok)


@triton.jit
def _dispatch_small_kernel(IDS, MAP, SORTED, OFFSETS, TILE_EXPERT, NUM_TILES, INVERSE, COUNTS, POSITIONS,
                           n_routes, n_experts, n_rows, max_tiles,
                           HAS_MAP: tl.constexpr, HAS_POS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
                           BLOCK_E: tl.constexpr, TILES: tl.constexpr, FILL: tl.constexpr):
    """The whole dispatch of a few routes (decode) in one program: the three kernels' work with
    every route and expert in registers ([BLOCK_R, BLOCK_E] and [BLOCK_R, BLOCK_R] compares)."""
    r = tl.arange(0, BLOCK_R)
    ok = r < n_routes
    e = _local_expert(IDS, MAP, r, ok, HAS_MAP)
    x = tl.arange(0, BLOCK_E)
    xm = x < n_experts
    hit = (e[:, None] == x[None, :]) & xm[None, :]
    c = tl.sum(hit.to(tl.int32), axis=0)
    padded = (c + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    start = end - padded
    total = tl.sum(padded, axis=0)
    tl.store(COUNTS + x, c, mask=xm)
    tl.store(OFFSETS + x, start, mask=xm)
    tl.store(OFFSETS + n_experts, total)
    n_tiles = total // BLOCK_M
    tl.store(NUM_TILES, n_tiles)
    tt = tl.arange(0, TILES)
    for t0 in range(0, max_tiles, TILES):  # as the scan's tile map
        tile = t0 + tt
        before = tl.where(xm[None, :] & (end[None, :] <= (tile * BLOCK_M)[:, None]), 1, 0)
        owner = tl.where(tile < n_tiles, tl.sum(before, axis=1), -1)
        tl.store(TILE_EXPERT + tile, owner, mask=tile < max_tiles)
    # every row the sentinel, then (after the CTA's barrier orders the stores) each kept route at
    # its row: its segment's start plus its rank among the earlier routes of its expert (stable)
    f = tl.arange(0, FILL)
    for r0 in range(0, n_rows, FILL):
        tl.store(SORTED + r0 + f, tl.full([FILL], 0, tl.int32) + n_routes, mask=r0 + f < n_rows)
    tl.debug_barrier()
    kept = (e >= 0) & (e < n_experts)
    same = (e[:, None] == e[None, :]) & (r[None, :] < r[:, None])
    rank = tl.sum(same.to(tl.int32), axis=1)
    row = tl.sum(tl.where(hit, start[None, :], 0), axis=1) + rank
    tl.store(SORTED + row, r, mask=kept)
    tl.store(INVERSE + r, tl.where(kept, row, -1), mask=ok)
    if HAS_POS:
        tl.store(POSITIONS + r, tl.where(kept, row, -1).to(tl.int64), mask=ok)


SMALL_ROUTES = 128     # routes the one-program dispatch takes (T*k at decode: T <= 16, k <= 8)
SMALL_ELEMS = 16384    # its [routes, experts] compare tile (128 routes x 128 experts, 16 x 1024)


def small_dispatch(num_routes, num_experts):
    """Whether dispatch runs as one program (no histogram / scan / scatter, no block table)."""
    return (num_routes <= SMALL_ROUTES
            and max(16, next_power_of_2(num_routes)) * max(16, next_power_of_2(num_experts)) <= SMALL_ELEMS)


def dispatch(topk_ids, expert_map, num_experts, block_m, sorted_ids, offsets, tile_expert, num_tiles, inverse,
             counts, block_counts, max_tiles=None, positions=None):
    """topk_ids contiguous [T, k]; counts and block_counts (block_counts_shape, int32) zeroed; the
    other outputs are written whole (sorted_ids: the sentinel T*k where no route lands). max_tiles:
    the tile_expert entries to write (default all; 0 for a caller that needs only the offsets).
    positions: an int64 [T*k] buffer that gets the inverse map too (the seed's route_positions)."""
    n = topk_ids.numel()
    blocks = cdiv(n, BLOCK_R)
    has_map = expert_map is not None
    emap = expert_map if has_map else topk_ids
    tiles = tile_expert.numel() if max_tiles is None else max_tiles
    block_e = max(next_power_of_2(num_experts), 16)
    if small_dispatch(n, num_experts):
        block_r = max(16, next_power_of_2(n))
        _dispatch_small_kernel[(1,)](topk_ids, emap, sorted_ids, offsets, tile_expert, num_tiles, inverse, counts,
                                     inverse if positions is None else positions, n, num_experts, sorted_ids.numel(),
                                     tiles, HAS_MAP=has_map, HAS_POS=positions is not None, BLOCK_M=block_m,
                                     BLOCK_R=block_r, BLOCK_E=block_e, TILES=SCAN_TILES, FILL=1024,
                                     num_warps=4 if block_r * block_e <= 8192 else 8)
        return
    sorted_ids.fill_(n)
    if blocks:
        _histogram_kernel[(blocks,)](topk_ids, emap, counts, block_counts, n, num_experts,
                                     HAS_MAP=has_map, BLOCK=BLOCK_R, num_warps=4)
    _scan_kernel[(1,)](counts, block_counts, offsets, tile_expert, num_tiles, num_experts, blocks,
                       tiles, BLOCK_M=block_m, BLOCK_E=block_e, TILES=SCAN_TILES,
                       CHUNK=max(1, min(128, SCAN_ELEMS // block_e)), num_warps=4 if block_e <= 1024 else 8)
    if blocks:
        _scatter_kernel[(blocks,)](topk_ids, emap, block_counts, sorted_ids, inverse,
                                   inverse if positions is None else positions, n, num_experts,
                                   HAS_MAP=has_map, HAS_POS=positions is not None, BLOCK=BLOCK_R, num_warps=4)


def block_counts_shape(num_routes, num_experts):
    """The per-block count table the three-kernel dispatch needs (a placeholder for the small one)."""
    if small_dispatch(num_routes, num_experts):
        return (1,)
    return (cdiv(num_routes, BLOCK_R), num_experts)
