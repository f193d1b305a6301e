"""Rotary position embedding (RoPE) in Triton.

Semantics match cuda/rope and fray.reference.rope exactly: for a token at position p and each
rotated pair (x, y) of a head, with c = cos[p, i] and s = sin[p, i] (fp32),
  x' = x*c - y*s,  y' = y*c + x*s       (fp32 math, one rounding to the storage dtype)
neox pairs element i with i + rotary_dim/2, gptj pairs 2i with 2i + 1; elements past rotary_dim
pass through (copied when the output is a different tensor).

The op is memory-bound: every element of q and k is read once and written once, and the cos/sin
row of a token is small (rotary_dim floats) and shared by all its heads. So a program takes one
token and a block of heads of q or of k: it loads the token's position and cos/sin row once and
rotates the whole [heads, rotary_dim/2] tile with them. Grid axis 1 enumerates the head blocks of
q followed by those of k, so q and k are rotated by one launch. When a token's tile is small
(few heads, short heads) a program loops over several tokens, so that programs stay a few KB.
"""
import triton
import triton.language as tl

from fray_triton._host import cdiv, next_power_of_2

from fray_triton.norm import _round

# Rotated pairs per program and token: 2048 pairs = 4096 elements (8 KB of bf16 read and 8 KB
# written), e.g. all 32 q heads of a 128-wide head, enough bytes for the loads of one program to
# keep a Hopper SM's share of memory bandwidth busy together with its neighbours.
TILE_PAIRS = 2048
# At most this many tokens per program (the token loop is sequential inside a program).
MAX_TOKENS_PER_PROGRAM = 16


@triton.jit
def _rotate(x, y, c, s):
    # Explicit fma: left to the compiler, x*c - y*s contracts differently in differently
    # specialised variants (e.g. 16-byte-aligned out of place vs 2-byte-aligned in place), and in
    # place must equal out of place bit for bit.
    return tl.fma(x, c, -(y * s)), tl.fma(y, c, x * s)


@triton.jit
def _rotate_heads(X, XO, stride_xh, stride_oh, n_heads, head0, P, pos, COS, SIN, stride_cs,
                  half, rotary_dim, rest,
                  HAS_POS: tl.constexpr, NEOX: tl.constexpr, COPY_REST: tl.constexpr,
                  BLOCK_H: tl.constexpr, HALF_PAD: tl.constexpr, REST_PAD: tl.constexpr):
    """Rotate heads [head0, head0 + BLOCK_H) of one token. X/XO point at the token's first head;
    the position is read from P (when HAS_POS) or is `pos`.

    The head tile is loaded first and the position -> cos/sin chain after it: the tile does not
    depend on the position, so its loads are in flight while the two dependent loads resolve
    (issued in the other order, every program pays three memory latencies back to back)."""
    heads = head0 + tl.arange(0, BLOCK_H)
    hx = heads.to(tl.int64)[:, None] * stride_xh
    ho = heads.to(tl.int64)[:, None] * stride_oh
    hmask = (heads < n_heads)[:, None]
    ci = tl.arange(0, HALF_PAD)
    i = ci[None, :]
    if NEOX:
        # The two halves are separate contiguous runs: two [BLOCK_H, HALF_PAD] tiles.
        m = hmask & (i < half)
        x = tl.load(X + hx + i, mask=m, other=0.0).to(tl.float32)
        y = tl.load(X + hx + half + i, mask=m, other=0.0).to(tl.float32)
    else:
        # Interleaved pairs: load the contiguous [BLOCK_H, 2 * HALF_PAD] span and split the
        # last axis into (even, odd), which keeps the loads and stores contiguous.
        j = tl.arange(0, 2 * HALF_PAD)[None, :]
        m = hmask & (j < rotary_dim)
        v = tl.load(X + hx + j, mask=m, other=0.0).to(tl.float32)
        x, y = tl.split(tl.reshape(v, (BLOCK_H, HALF_PAD, 2)))
    if HAS_POS:
        pos = tl.load(P).to(tl.int64)
    cmask = ci < half
    c = tl.load(COS + pos * stride_cs + ci, mask=cmask, other=0.0)
    s = tl.load(SIN + pos * stride_cs + ci, mask=cmask, other=0.0)
    xo, yo = _rotate(x, y, c[None, :], s[None, :])
    if NEOX:
        tl.store(XO + ho + i, _round(xo, XO.dtype.element_ty), mask=m)
        tl.store(XO + ho + half + i, _round(yo, XO.dtype.element_ty), mask=m)
    else:
        out = tl.reshape(tl.join(xo, yo), (BLOCK_H, 2 * HALF_PAD))
        tl.store(XO + ho + j, _round(out, XO.dtype.element_ty), mask=m)
    if COPY_REST:
        r = tl.arange(0, REST_PAD)[None, :]
        mr = hmask & (r < rest)
        tl.store(XO + ho + rotary_dim + r, tl.load(X + hx + rotary_dim + r, mask=mr), mask=mr)


# The token count, offset and position stride change from call to call: specialising on them
# (== 1, multiples of 16) would only multiply compiled variants.
@triton.jit(do_not_specialize=["n_tokens", "pos_offset", "stride_p"])
def _rope_kernel(
    Q, K, QO, KO, P, COS, SIN,
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_p, pos_offset, stride_cs,
    n_tokens, n_qh, n_kh, n_qb, half, rotary_dim, rest,
    HAS_POS: tl.constexpr, NEOX: tl.constexpr, COPY_REST: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, HALF_PAD: tl.constexpr,
    REST_PAD: tl.constexpr, TOKENS: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    for tt in range(TOKENS):
        t = pid_t * TOKENS + tt
        if t < n_tokens:
            t64 = t.to(tl.int64)
            pos = pos_offset + t64  # unused when HAS_POS
            if pid_h < n_qb:
                _rotate_heads(Q + t64 * stride_qt, QO + t64 * stride_qot, stride_qh, stride_qoh, n_qh,
                              pid_h * BLOCK_HQ, P + t64 * stride_p, pos, COS, SIN, stride_cs,
                              half, rotary_dim, rest,
                              HAS_POS, NEOX, COPY_REST, BLOCK_HQ, HALF_PAD, REST_PAD)
            else:
                _rotate_heads(K + t64 * stride_kt, KO + t64 * stride_kot, stride_kh, stride_koh, n_kh,
                              (pid_h - n_qb) * BLOCK_HK, P + t64 * stride_p, pos, COS, SIN, stride_cs,
                              half, rotary_dim, rest,
                              HAS_POS, NEOX, COPY_REST, BLOCK_HK, HALF_PAD, REST_PAD)


def _head_block(n_heads, half_pad):
    return max(1, min(next_power_of_2(max(n_heads, 1)), TILE_PAIRS // half_pad))


def rope(q, k, q_out, k_out, positions, position_offset, cos, sin, cs_row_stride, rotary_dim, neox):
    """Launch on the current stream.

    q/q_out: [tokens, q_heads, head_dim], k/k_out: [tokens, k_heads, head_dim] or None, any token
    and head strides, last dim contiguous; q_out may be q and k_out may be k (in place).
    positions: int32/int64 [tokens] tensor (any stride) or None for position_offset + token.
    cos, sin: fp32 tensors whose row p starts the token's rotary_dim/2 values, rows
    cs_row_stride floats apart (e.g. the two halves of a [max_position, rotary_dim] cache).
    """
    tokens, n_qh, head_dim = q.shape
    n_kh = k.shape[1] if k is not None else 0
    if tokens == 0 or n_qh + n_kh == 0:
        return
    if k is None:
        k, k_out = q, q_out  # never touched: no k head blocks
    half = rotary_dim // 2
    half_pad = next_power_of_2(half)
    rest = head_dim - rotary_dim
    copy_rest = rest > 0 and (q_out.data_ptr() != q.data_ptr() or k_out.data_ptr() != k.data_ptr())
    block_hq = _head_block(n_qh, half_pad)
    block_hk = _head_block(n_kh, half_pad)
    n_qb = cdiv(n_qh, block_hq)
    n_kb = cdiv(n_kh, block_hk)
    # Tokens per program: fill TILE_PAIRS with the larger of the two head blocks.
    per_token = max(block_hq, block_hk) * half_pad
    # (Not capped by the token count: that would compile one variant per small batch size.)
    tpp = max(1, min(MAX_TOKENS_PER_PROGRAM, TILE_PAIRS // per_token))
    # About 16 pairs per thread (32 B of a 16-bit dtype per half): loads in flight without
    # spilling the fp32 temporaries.
    num_warps = max(1, min(8, per_token // 512))
    has_pos = positions is not None
    grid = (cdiv(tokens, tpp), n_qb + n_kb)
    _rope_kernel[grid](
        q, k, q_out, k_out, positions if has_pos else q, cos, sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        positions.stride(0) if has_pos else 0, int(position_offset), cs_row_stride,
        tokens, n_qh, n_kh, n_qb, half, rotary_dim, rest,
        HAS_POS=has_pos, NEOX=bool(neox), COPY_REST=copy_rest,
        BLOCK_HQ=block_hq, BLOCK_HK=block_hk, HALF_PAD=half_pad,
        REST_PAD=next_power_of_2(max(rest, 1)), TOKENS=tpp, num_warps=num_warps)
