"""The grouped GEMM behind grouped_gemm, routed_grouped_gemm and fused_moe, in Triton.

One kernel, specialised by constexprs, computes C = A_rows @ B_e for tiles of BLOCK_M rows that
all belong to one group (expert) e:
  - which rows: A_MODE 0 takes contiguous row ranges from a tile map (the explicit-metadata
    grouped_gemm: group g owns rows [offsets[g], offsets[g+1]), cut into BLOCK_M tiles by
    _tile_map_kernel); A_MODE 1 gathers token rows x[route // top_k] for the routes of the
    dispatch's sorted, BLOCK_M-padded route list (no expanded copy of x is ever written: each tile
    loads its rows by pointer, and the sentinel routes of the padding load zeros); A_MODE 2 reads
    rows already in that sorted order (the first GEMM's output feeding the second).
  - B: b[e] of a [G, N, K] ("nk", nn.Linear's layout, vLLM's w13 / w2) or [G, K, N] ("kn", the
    seed's) weight stack, through a 3-d TMA descriptor where the layout allows (the copy engine's
    bounds are per expert, so a partial tile never reads the next expert's rows), else by pointer.
  - epilogue: GATED keeps two accumulators, the gate columns [n, n + BLOCK_N) and the up columns
    [I + n, ...), and writes act(round(gate)) * round(up) rounded once (what fray.silu_mul /
    gelu_mul would write from the rounded GEMM output); WEIGHTED multiplies the rounded projection
    by the route's weight and rounds again (the seed's routed epilogue); OUT_MODE 0 stores by row
    (the sorted order or the explicit rows), 1 by route id (route order), 2 adds into an fp32
    [T, N] buffer at the route's token with atomics (the "atomic" combine).
Grid: one program per (row tile, column tile) of the largest tile count any routing can need; a
program whose row tile is past the device-side tile count returns at once, so nothing is read on
the host and the launch can be captured in a CUDA graph. Row tiles run GROUP_M at a time across
the column tiles (the matmul tutorial's grouped order): consecutive programs share an expert's
weight band and a band of rows while both are in L2.

combine_staged sums each token's k weighted route rows in rank order through the dispatch's
inverse map, in fp32, and writes the token's row once in the output dtype: bit-identical run to
run, with no zeroing and no atomics (it weighs unweighted rows itself when given the weights).

gather_rows, gated_rows and scatter_rows serve the CUDA paths, whose grouped GEMM (CUTLASS's, on
fray.jit) takes contiguous expert-sorted rows: the token rows copied into the sorted order, the
gated activation of GEMM 1's [gate | up] rows (rounded as the gated epilogue above rounds them),
and rows copied back into route order.
"""
import os

import torch
import triton
import triton.language as tl

from fray_triton._host import cdiv, next_power_of_2
from fray_triton.activation import _activate
from fray_triton.norm import _round

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

A_CONTIGUOUS, A_GATHER, A_SORTED = 0, 1, 2
OUT_ROWS, OUT_ROUTES, OUT_ATOMIC = 0, 1, 2
ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2}  # fray_triton.activation's codes


@triton.jit
def _load_b(b_ptr, b_desc, e, off_n, off_k, N_b, K, stride_be, stride_bn, stride_bk,
            B_NK: tl.constexpr, USE_DESC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The [BLOCK_K, BLOCK_N] tile of expert e's matrix at (off_k, off_n), zeros past N_b / K."""
    if USE_DESC:
        if B_NK:
            return tl.trans(b_desc.load([e, off_n, off_k]).reshape(BLOCK_N, BLOCK_K))
        else:
            return b_desc.load([e, off_k, off_n]).reshape(BLOCK_K, BLOCK_N)
    else:
        offs_n = off_n + tl.arange(0, BLOCK_N)
        offs_k = off_k + tl.arange(0, BLOCK_K)
        ptr = b_ptr + e.to(tl.int64) * stride_be + (offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn)
        return tl.load(ptr, mask=(offs_k[:, None] < K) & (offs_n[None, :] < N_b), other=0.0)


@triton.jit
def _dot(a, b, acc, DOT_F32: tl.constexpr):
    if DOT_F32:
        # Triton's CPU interpreter computes 16-bit tl.dot wrongly; their products are exact in
        # fp32, so IEEE fp32 products give the GPU's result there.
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit(do_not_specialize=["n_routes", "max_tiles"])
def _moe_gemm_kernel(
    A, B, C, WEIGHTS, ROUTES, TILE_GROUP, TILE_START, TILE_END, NUM_TILES, a_desc, b_desc,
    N, K, N_b, n_half, lda, ldc, stride_be, stride_bn, stride_bk, n_routes, top_k, max_tiles,
    A_MODE: tl.constexpr, OUT_MODE: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr,
    WEIGHTED: tl.constexpr, WEIGHT_INPUT: tl.constexpr, B_NK: tl.constexpr, USE_DESC: tl.constexpr,
    USE_A_DESC: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group_tiles = GROUP_M * num_pid_n
    first_m = (pid // group_tiles) * GROUP_M
    rows_in_group = min(max_tiles - first_m, GROUP_M)
    pid_m = first_m + (pid % group_tiles) % rows_in_group
    pid_n = (pid % group_tiles) // rows_in_group
    if pid_m >= tl.load(NUM_TILES):
        return
    e = tl.load(TILE_GROUP + pid_m)
    dtype = A.dtype.element_ty  # the inputs' dtype: every rounding is to it (OUT_MODE 2 adds into fp32)
    offs = tl.arange(0, BLOCK_M)
    if A_MODE == 0:
        start = tl.load(TILE_START + pid_m)
        row0 = start
        rows = start + offs
        valid = rows < tl.load(TILE_END + pid_m)
        a_rows = rows
        out_rows = rows
    else:
        row0 = pid_m * BLOCK_M
        rows = row0 + offs
        route = tl.load(ROUTES + rows)
        valid = route < n_routes
        if A_MODE == 1:
            a_rows = route // top_k
        else:
            a_rows = rows
        if OUT_MODE == 0:
            out_rows = rows
        elif OUT_MODE == 1:
            out_rows = route
        else:
            out_rows = route // top_k
    if WEIGHTED or WEIGHT_INPUT:
        w_route = tl.load(WEIGHTS + route, mask=valid, other=0.0)
    off_n = pid_n * BLOCK_N
    offs_k = tl.arange(0, BLOCK_K)
    a_base = A + a_rows.to(tl.int64)[:, None] * lda
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if GATED:
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for off_k in range(0, K, BLOCK_K):
        if USE_A_DESC:
            # contiguous rows (A_MODE 0 / 2): the copy engine loads the tile; rows past the tile's
            # group are read too (the next group's, or zeros past the end) and masked at the store
            a = a_desc.load([row0, off_k])
        else:
            a = tl.load(a_base + (off_k + offs_k)[None, :], mask=valid[:, None] & ((off_k + offs_k)[None, :] < K),
                        other=0.0)
        if WEIGHT_INPUT:
            a = _round(a.to(tl.float32) * w_route[:, None], A.dtype.element_ty)
        b = _load_b(B, b_desc, e, off_n, off_k, N_b, K, stride_be, stride_bn, stride_bk, B_NK, USE_DESC,
                    BLOCK_N, BLOCK_K)
        acc = _dot(a, b, acc, DOT_F32)
        if GATED:
            b_up = _load_b(B, b_desc, e, n_half + off_n, off_k, N_b, K, stride_be, stride_bn, stride_bk, B_NK,
                           USE_DESC, BLOCK_N, BLOCK_K)
            acc_up = _dot(a, b_up, acc_up, DOT_F32)
    cols = off_n + tl.arange(0, BLOCK_N)
    mask = valid[:, None] & (cols < N)[None, :]
    # every rounding the unfused ops would make: the GEMM's output, then the epilogue's result
    y = _round(acc, dtype).to(tl.float32)
    if GATED:
        y = _activate(y, ACT, dtype) * _round(acc_up, dtype).to(tl.float32)
    if WEIGHTED:
        y = _round(y * w_route[:, None], dtype).to(tl.float32)
    ptr = C + out_rows.to(tl.int64)[:, None] * ldc + cols[None, :]
    if OUT_MODE == 2:
        tl.atomic_add(ptr, y, mask=mask, sem="relaxed")
    else:
        tl.store(ptr, _round(y, dtype), mask=mask)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _tile_map_kernel(OFFSETS, TILE_GROUP, TILE_START, TILE_END, NUM_TILES, n_groups, m,
                     BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, SPAN: tl.constexpr):
    """Program g writes group g's row tiles at its place in the tile list (the tiles of groups
    0..g-1 come first); program 0 also writes the tile count. The offsets live on the device and
    are not checked there: they are read as their running maximum clamped to [0, m], so that
    groups are disjoint row ranges inside a and the tiles never exceed max_tiles_explicit, whatever
    the values (garbage offsets give garbage rows, never an access out of bounds)."""
    g = tl.program_id(0)
    i = tl.arange(0, BLOCK_G)
    raw = tl.load(OFFSETS + i, mask=i <= n_groups, other=0)
    bound = tl.minimum(tl.maximum(tl.associative_scan(raw, 0, _max), 0), m)
    start = tl.sum(tl.where(i == g, bound, 0), axis=0)
    end = tl.sum(tl.where(i == g + 1, bound, 0), axis=0)
    # bound[j + 1] (clamping commutes with the max), for group j's tiles cdiv(bound[j + 1] -
    # bound[j], BLOCK_M); group g's first tile follows the tiles of the groups before it
    nxt = tl.load(OFFSETS + i + 1, mask=i < n_groups, other=0)
    nxt = tl.minimum(tl.maximum(tl.maximum(tl.associative_scan(raw, 0, _max), nxt), 0), m)
    tiles = tl.where(i < n_groups, (nxt - bound + BLOCK_M - 1) // BLOCK_M, 0)
    first = tl.sum(tl.where(i < g, tiles, 0), axis=0)
    if g == 0:
        tl.store(NUM_TILES, tl.sum(tiles, axis=0))
    mine = (end - start + BLOCK_M - 1) // BLOCK_M
    j = tl.arange(0, SPAN)
    for t0 in range(0, mine, SPAN):
        t = t0 + j
        ok = t < mine
        tl.store(TILE_GROUP + first + t, tl.full([SPAN], 0, tl.int32) + g, mask=ok)
        tl.store(TILE_START + first + t, start + t * BLOCK_M, mask=ok)
        tl.store(TILE_END + first + t, tl.full([SPAN], 0, tl.int32) + end, mask=ok)


@triton.jit
def _combine_kernel(S, INVERSE, WEIGHTS, OUT, N, lds, ldo, TOP_K: tl.constexpr, WEIGHTED: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cm = cols < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        row = tl.load(INVERSE + t * TOP_K + j)
        kept = row >= 0
        v = tl.load(S + row.to(tl.int64) * lds + cols, mask=cm & kept, other=0.0).to(tl.float32)
        if WEIGHTED:
            # the weighted contribution rounded, as the GEMM epilogue's WEIGHTED would; a dropped
            # route adds nothing, whatever its weight (a NaN weight must not reach the sum)
            w = tl.load(WEIGHTS + t * TOP_K + j)
            v = tl.where(kept, _round(v * w, S.dtype.element_ty).to(tl.float32), 0.0)
        acc += v
    tl.store(OUT + t * ldo + cols, _round(acc, OUT.dtype.element_ty), mask=cm)


@triton.jit
def _gather_rows_kernel(X, ROUTES, WEIGHTS, LIMIT, OUT, H, ldx, ldo, n_routes, top_k,
                        WEIGHT_INPUT: tl.constexpr, BLOCK_H: tl.constexpr):
    """OUT[row] = x[route // top_k] for the sorted route list's row (round(x * w_route) with
    WEIGHT_INPUT), zeros for the sentinel rows (a segment's padding, routes an expert_map dropped);
    rows past the used ones are left unwritten (nothing reads them)."""
    row = tl.program_id(0).to(tl.int64)
    if row >= tl.load(LIMIT):  # past the used rows (LIMIT: the dispatch's offsets[E])
        return
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cm = cols < H
    route = tl.load(ROUTES + row)
    ok = route < n_routes
    token = tl.where(ok, route // top_k, 0).to(tl.int64)
    v = tl.load(X + token * ldx + cols, mask=cm & ok, other=0.0)
    if WEIGHT_INPUT:
        w = tl.load(WEIGHTS + route, mask=ok, other=0.0)
        v = _round(v.to(tl.float32) * w, OUT.dtype.element_ty)  # 0 * 0 for a sentinel row
    tl.store(OUT + row * ldo + cols, v.to(OUT.dtype.element_ty), mask=cm)


@triton.jit
def _gated_rows_kernel(G, ROUTES, LIMIT, OUT, I, ldg, ldo, n_routes, ACT: tl.constexpr, BLOCK_I: tl.constexpr):
    """OUT[row] = round(act(gate) * up) of a GEMM 1 output row [gate | up] (already rounded), as
    the gated epilogue computes it; zeros for sentinel rows; rows past the used ones unwritten."""
    row = tl.program_id(0).to(tl.int64)
    if row >= tl.load(LIMIT):
        return
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    ok = tl.load(ROUTES + row) < n_routes
    m = (cols < I) & ok
    dtype = OUT.dtype.element_ty
    g = tl.load(G + row * ldg + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(G + row * ldg + I + cols, mask=m, other=0.0).to(tl.float32)
    y = tl.where(m, _activate(g, ACT, dtype) * u, 0.0)
    tl.store(OUT + row * ldo + cols, _round(y, dtype), mask=cols < I)


@triton.jit
def _scatter_rows_kernel(Y, ROUTES, OUT, N, ldy, ldo, n_routes, BLOCK_N: tl.constexpr):
    """OUT[route] = Y[row] for each sorted row holding a route (sentinel rows skipped)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    route = tl.load(ROUTES + row)
    m = (cols < N) & (route < n_routes)
    v = tl.load(Y + row * ldy + cols, mask=m)
    tl.store(OUT + route.to(tl.int64) * ldo + cols, v, mask=m)


# ---------------------------------------------------------------------------------------------
# host side

def _b_strides(b, b_nk):
    """(stride_e, stride_n, stride_k) of a [G, N, K] or [G, K, N] weight stack."""
    if b_nk:
        return b.stride(0), b.stride(1), b.stride(2)
    return b.stride(0), b.stride(2), b.stride(1)


def descriptor_ok(b, b_nk=True, n_half=0):
    """Whether TMA can read b as it is: 16-byte base, inner dim contiguous, outer strides 16-byte;
    and for a gated [E, K, 2I] (kn) stack, whose up half starts at column n_half of the innermost
    dimension, n_half a 16-byte multiple: at n_half = 100 fp16 (200 bytes) the TMA load of that half
    raised an illegal instruction (the sanitizer sweep's fused_moe_kn_fp16 case, an H100,
    2026-12-07); box starts are aligned everywhere else (multiples of BLOCK_N / BLOCK_K)."""
    es = b.element_size()
    return (not _INTERPRET and b.data_ptr() % 16 == 0 and b.stride(2) == 1
            and (b.stride(1) * es) % 16 == 0 and (b.stride(0) * es) % 16 == 0 and (b.shape[2] * es) % 16 == 0
            and (b_nk or (n_half * es) % 16 == 0))


def pointer_config(config):
    """The config for weights TMA cannot read (strided views; the interpreter): a tile of pointers
    holds a 64-bit address per element, so 128-wide N tiles (two of them when gated) spill (the
    sm_90a compile of test_kernels_compile_for_sm90a counts the spills); 64 x 64 tiles with 8 warps
    from 64 rows up do not."""
    c = dict(config)
    c["BLOCK_N"], c["BLOCK_K"] = min(c["BLOCK_N"], 64), min(c["BLOCK_K"], 64)
    if c["BLOCK_M"] >= 64:
        c["num_warps"] = 8
    return c


def a_descriptor_ok(a):
    """Whether TMA can read a [rows, K] operand as it is (contiguous rows, 16-byte strides)."""
    es = a.element_size()
    return (not _INTERPRET and a.dim() == 2 and a.data_ptr() % 16 == 0 and a.stride(1) == 1
            and (a.stride(0) * es) % 16 == 0 and a.shape[0] > 0 and a.shape[1] > 0)


def _descriptor(t, block):
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor.from_tensor(t, block)


def launch(a, b, c, *, b_nk, n, n_b, k, config, max_tiles, num_tiles, tile_group, a_mode, out_mode,
           routes=None, tile_start=None, tile_end=None, weights=None, n_routes=0, top_k=1, gated=False,
           act=0, n_half=0, weighted=False, weight_input=False, use_desc=None, use_a_desc=None):
    """One grouped-GEMM launch on the current stream (see the module docstring for the modes).

    a: [rows, k] with a unit last stride; b: the weight stack; c: the output (or fp32 buffer for
    OUT_ATOMIC) with a unit last stride; n: output columns (I when gated); n_b: b's N (2I when
    gated); max_tiles: the grid's row-tile bound; num_tiles / tile_group / tile_start / tile_end /
    routes: int32 device tensors; config: BLOCK_M / BLOCK_N / BLOCK_K / GROUP_M / num_warps /
    num_stages. use_desc / use_a_desc: read b / a through TMA descriptors (default: wherever the
    layout allows; a only when its rows are contiguous, A_MODE 0 and 2)."""
    if max_tiles == 0 or n == 0:
        return
    if use_desc is None:
        use_desc = descriptor_ok(b, b_nk, n_half if gated else 0)
    if use_a_desc is None:
        use_a_desc = a_mode != A_GATHER and use_desc and a_descriptor_ok(a)
    if not use_desc:
        config = pointer_config(config)
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    desc = _descriptor(b, [1, bn, bk] if b_nk else [1, bk, bn]) if use_desc else None
    a_desc = _descriptor(a, [bm, bk]) if use_a_desc else None
    sbe, sbn, sbk = _b_strides(b, b_nk)
    dummy = num_tiles
    grid = (max_tiles * cdiv(n, bn),)
    _moe_gemm_kernel[grid](
        a, b, c, weights if weights is not None else a, routes if routes is not None else dummy,
        tile_group, tile_start if tile_start is not None else dummy, tile_end if tile_end is not None else dummy,
        num_tiles, a_desc, desc,
        n, k, n_b, n_half, a.stride(0), c.stride(0), sbe, sbn, sbk, n_routes, top_k, max_tiles,
        A_MODE=a_mode, OUT_MODE=out_mode, GATED=gated, ACT=act, WEIGHTED=weighted, WEIGHT_INPUT=weight_input,
        B_NK=b_nk, USE_DESC=use_desc, USE_A_DESC=use_a_desc, DOT_F32=_INTERPRET,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config["GROUP_M"],
        num_warps=config["num_warps"], num_stages=config["num_stages"])


def tile_map(offsets, n_groups, m, block_m, tile_group, tile_start, tile_end, num_tiles):
    """The explicit form's tile list from group offsets [G + 1] (int32, on the device) over m rows."""
    if n_groups == 0:
        num_tiles.zero_()
        return
    _tile_map_kernel[(n_groups,)](offsets, tile_group, tile_start, tile_end, num_tiles, n_groups, m,
                                  BLOCK_M=block_m, BLOCK_G=max(16, next_power_of_2(n_groups + 1)), SPAN=64,
                                  num_warps=4)


def max_tiles_explicit(m, n_groups, block_m):
    """Row tiles of the explicit form: each group's partial tile adds at most one."""
    return cdiv(m, block_m) + n_groups


def combine_staged(staged, inverse, out, top_k, weights=None):
    """out[t] = sum_j staged[inverse[t * k + j]] (fp32, rank order; -1 skipped), in out's dtype;
    with weights (fp32 [T, k], contiguous) each row is first weighted and rounded to staged's
    dtype: round(staged[row] * w_tj)."""
    t, n = out.shape
    if t == 0 or n == 0:
        return
    block_n = _row_block(n)
    _combine_kernel[(t, cdiv(n, block_n))](staged, inverse, weights if weights is not None else inverse, out, n,
                                           staged.stride(0), out.stride(0), TOP_K=top_k,
                                           WEIGHTED=weights is not None, BLOCK_N=block_n, num_warps=4)


def _row_block(n):
    return min(1024, max(16, next_power_of_2(n)))


def gather_rows(x, routes, top_k, out, limit, weights=None):
    """out[row] = x[routes[row] // top_k] for every row of a sorted route list below limit[0] (an
    int32 device scalar: the dispatch's offsets[E], the rows in use), zeros where the route is the
    sentinel T * k; with weights (fp32, route order) round(x * w) instead."""
    rows, h = out.shape
    if rows == 0 or h == 0:
        return
    bh = _row_block(h)
    _gather_rows_kernel[(rows, cdiv(h, bh))](x, routes, weights if weights is not None else x, limit, out, h,
                                             x.stride(0), out.stride(0), x.shape[0] * top_k, top_k,
                                             WEIGHT_INPUT=weights is not None, BLOCK_H=bh, num_warps=4)


def gated_rows(g, routes, n_routes, out, act, limit):
    """out[row] = round(act(g[row, :I]) * g[row, I:]) for I = out's columns below limit[0] (as
    gather_rows; zeros for sentinel routes); act: an ACT_CODES value."""
    rows, inter = out.shape
    if rows == 0 or inter == 0:
        return
    bi = _row_block(inter)
    _gated_rows_kernel[(rows, cdiv(inter, bi))](g, routes, limit, out, inter, g.stride(0), out.stride(0), n_routes,
                                                ACT=act, BLOCK_I=bi, num_warps=4)


def scatter_rows(y, routes, n_routes, out):
    """out[routes[row]] = y[row] for the rows holding a route; out's other rows are not written."""
    rows, n = y.shape
    if rows == 0 or n == 0:
        return
    bn = _row_block(n)
    _scatter_rows_kernel[(rows, cdiv(n, bn))](y, routes, out, n, y.stride(0), out.stride(0), n_routes,
                                              BLOCK_N=bn, num_warps=4)


def scatter_combine(staged, routes, n_routes, top_k, out):
    """The index_add baseline: staged's valid rows added into fp32 [T, N] by token, then cast."""
    t = out.shape[0]
    token = torch.where(routes < n_routes, routes // top_k, t).long()
    acc = torch.zeros((t + 1, out.shape[1]), dtype=torch.float32, device=out.device)
    acc.index_add_(0, token, staged.float())
    out.copy_(acc[:t])
