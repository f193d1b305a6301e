"""Top-k, argmax, penalties and filtered sampling in Triton (correctness-first groundwork).

Semantics are those of fray.reference.sampling (read its docstring first). Every kernel here
turns a float into an order-preserving int32 key (`_ord`: NaN canonicalised above +inf, -0.0
folded onto +0.0) and, where an index tie-break is needed, into one unique int64 key
ord * 2^32 + (2^32 - 1 - index): a plain integer max then yields "largest value, lowest index",
which is the whole tie/NaN/signed-zero contract in one comparison.

Design of this round (performance is the next round's job):
- argmax: one program per row, a loop over LOOP_BLOCK-wide chunks keeping the best key.
- topk "sort": the row's keys fit one tile (width <= SORT_MAX_WIDTH); one tl.sort, gather values.
- topk "reduce": k passes over the row, each finding the best key below the previous one;
  any width, cost k * width, so it is only offered for k <= REDUCE_MAX_K.
- sample: one program per row, multi-pass over the row in chunks: the max, top-k and top-p
  thresholds by 32-step bisections over the int32 key space (each step one pass: count, or sum of
  weights, above a candidate key), then one inverse-CDF pass in index order. Bisection needs no
  sort and no workspace, so every width runs the same code; it costs ~70 passes, which L2 mostly
  absorbs for one row but is the obvious target for the CUDA version.
- penalties: one program per row; each history entry counts its equal entries and whether it
  is the first of them (O(L^2 / BLOCK_H) vector ops), and only first occurrences update, so the
  scatter never writes one id twice.
"""
import torch
import triton
import triton.language as tl

from fray_triton._host import next_power_of_2

from fray_triton.norm import _round  # the shared RTNE helper

LOOP_BLOCK = 1024          # chunk of a row per pass: 4 KB of fp32, 8 elements a thread at 4 warps
SORT_MAX_WIDTH = 4096      # one tl.sort tile of int64 keys: 32 KB, still register/SMEM resident
REDUCE_MAX_K = 64          # k passes over the row; beyond this "sort" or torch is cheaper
PENALTY_BLOCK = 64         # history entries per tile; a 64x64 equality tile per step

# Below every real _ord (the smallest would be -NaN's, which _ord canonicalises away). A constexpr:
# compiled Triton refuses plain globals inside @jit functions (the interpreter does not check).
_KEY_PAD_ORD = tl.constexpr(-2147483647)


@triton.jit
def _ord(x):
    """fp16/bf16/fp32 -> int32 key with the documented order (NaN top, -0 == +0)."""
    xf = x.to(tl.float32)
    xf = tl.where(xf == 0.0, 0.0, xf)
    bits = xf.to(tl.int32, bitcast=True)
    bits = tl.where(xf != xf, 0x7FC00000, bits)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _key(o, idx):
    return o.to(tl.int64) * 4294967296 + (4294967295 - idx.to(tl.int64))


@triton.jit
def _key_index(key):
    return 4294967295 - (key & 4294967295)


# ---------------------------------------------------------------------------------------------
# argmax

@triton.jit
def _argmax_kernel(X, OUT, stride_x, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -9223372036854775807, tl.int64)
    for start in range(0, n_cols, BLOCK):
        c = start + cols
        m = c < n_cols
        x = tl.load(X + row * stride_x + c, mask=m, other=0.0)
        k = _key(tl.where(m, _ord(x), _KEY_PAD_ORD), c)
        best = tl.maximum(best, k)
    tl.store(OUT + row, _key_index(tl.max(best, axis=0)))


def argmax(x, out, x_row_stride, n_rows, n_cols):
    """out[r] = argmax of row r (int64); x row-strided [n_rows, n_cols]."""
    _argmax_kernel[(n_rows,)](x, out, x_row_stride, n_cols, BLOCK=LOOP_BLOCK, num_warps=4)


# ---------------------------------------------------------------------------------------------
# topk

@triton.jit
def _topk_sort_kernel(XB, VALS, IDX, stride_x, n_cols, k, LARGEST: tl.constexpr, BLOCK: tl.constexpr,
                      DT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(XB + row * stride_x + cols, mask=m, other=0).to(DT, bitcast=True)
    o = _ord(x)
    if not LARGEST:
        o = -1 - o  # reverses the order; NaN (the top key) becomes the bottom one
    keys = _key(tl.where(m, o, _KEY_PAD_ORD), cols)
    keys = tl.sort(keys, 0, descending=True)
    idx = _key_index(keys)
    out_m = cols < k
    vals = tl.load(XB + row * stride_x + idx, mask=out_m, other=0)
    tl.store(IDX + row * k + cols, idx, mask=out_m)
    tl.store(VALS + row * k + cols, vals, mask=out_m)


@triton.jit
def _topk_reduce_kernel(XB, VALS, IDX, stride_x, n_cols, k, LARGEST: tl.constexpr, BLOCK: tl.constexpr,
                        DT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    prev = 9223372036854775807
    for j in range(0, k):
        best = tl.full([BLOCK], -9223372036854775807, tl.int64)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            m = c < n_cols
            x = tl.load(XB + row * stride_x + c, mask=m, other=0).to(DT, bitcast=True)
            o = _ord(x)
            if not LARGEST:
                o = -1 - o
            kk = _key(tl.where(m, o, _KEY_PAD_ORD), c)
            best = tl.maximum(best, tl.where(kk < prev, kk, -9223372036854775807))
        prev = tl.max(best, axis=0)
        i = _key_index(prev)
        tl.store(IDX + row * k + j, i)
        tl.store(VALS + row * k + j, tl.load(XB + row * stride_x + i))


def topk(x, values, indices, k, largest, algorithm, x_row_stride, n_rows, n_cols):
    """values [n_rows, k] (x's dtype), indices [n_rows, k] int64, contiguous; rank order.
    algorithm: "sort" (n_cols <= SORT_MAX_WIDTH) or "reduce" (k <= REDUCE_MAX_K).
    The kernels see x and values only through integer views (bitcast to the float type inside):
    values are copied bit for bit, NaN payloads included, and Triton's CPU interpreter, which
    round-trips bf16 arguments through fp32, never touches a bf16 buffer."""
    bits = {2: torch.int16, 4: torch.int32}[x.element_size()]
    dt = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[x.dtype]
    xb, values = x.view(bits), values.view(bits)
    if algorithm == "sort":
        block = max(16, next_power_of_2(n_cols))
        _topk_sort_kernel[(n_rows,)](xb, values, indices, x_row_stride, n_cols, k, LARGEST=bool(largest),
                                     BLOCK=block, DT=dt, num_warps=4 if block <= 1024 else 8)
    else:
        _topk_reduce_kernel[(n_rows,)](xb, values, indices, x_row_stride, n_cols, k, LARGEST=bool(largest),
                                       BLOCK=LOOP_BLOCK, DT=dt, num_warps=4)


# ---------------------------------------------------------------------------------------------
# Philox-4x32-10 on int64 lanes holding 32-bit values. 32x32-bit products are split at 16 bits
# so every intermediate stays below 2^49: no unsigned types, no overflow, and the interpreter
# computes exactly what the GPU does.

@triton.jit
def _mulhilo(a, M: tl.constexpr):
    A = a * (M >> 16)
    Bl = a * (M & 0xFFFF)
    hi = (A + (Bl >> 16)) >> 16
    lo = (((A & 0xFFFF) << 16) + Bl) & 0xFFFFFFFF
    return hi, lo


@triton.jit
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    for _ in tl.static_range(10):
        hi0, lo0 = _mulhilo(c0, 0xD2511F53)
        hi1, lo1 = _mulhilo(c2, 0xCD9E8D57)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
        k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0, c1, c2, c3


@triton.jit
def _philox_test_kernel(CTR, KEY, OUT):
    i = tl.arange(0, 4)
    c = tl.load(CTR + i)
    z = c * 0
    c0 = tl.sum(tl.where(i == 0, c, z), 0)
    c1 = tl.sum(tl.where(i == 1, c, z), 0)
    c2 = tl.sum(tl.where(i == 2, c, z), 0)
    c3 = tl.sum(tl.where(i == 3, c, z), 0)
    r0, r1, r2, r3 = philox4x32_10(c0, c1, c2, c3, tl.load(KEY), tl.load(KEY + 1))
    tl.store(OUT, r0)
    tl.store(OUT + 1, r1)
    tl.store(OUT + 2, r2)
    tl.store(OUT + 3, r3)


def philox(counter, key, out):
    """Test hook: counter int64[4], key int64[2] (32-bit values) -> out int64[4]."""
    _philox_test_kernel[(1,)](counter, key, out)


# ---------------------------------------------------------------------------------------------
# sampling

@triton.jit
def _row_sum_w(X, row_off, n_cols, lmax, inv_t, lo_ord, above, BLOCK: tl.constexpr):
    """sum of w over tokens with lo_ord <= ord and ord > above."""
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        c = start + cols
        m = c < n_cols
        l = tl.load(X + row_off + c, mask=m, other=0.0).to(tl.float32)
        o = _ord(l).to(tl.int64)
        w = tl.exp((l - lmax) * inv_t)
        acc += tl.where(m & (o >= lo_ord) & (o > above), w, 0.0)
    return tl.sum(acc, 0)


@triton.jit
def _sample_kernel(X, TOK, LOGP, TEMP, TOPK, TOPP, MINP, SEED, OFFS, stride_x, n_cols,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_off = row * stride_x
    cols = tl.arange(0, BLOCK)
    temp = tl.load(TEMP + row).to(tl.float32)
    top_k = tl.load(TOPK + row).to(tl.int64)
    top_p = tl.load(TOPP + row).to(tl.float32)
    min_p = tl.load(MINP + row).to(tl.float32)

    # Pass 1: the best key (greedy answer and the max logit in one go).
    best = tl.full([BLOCK], -9223372036854775807, tl.int64)
    for start in range(0, n_cols, BLOCK):
        c = start + cols
        m = c < n_cols
        x = tl.load(X + row_off + c, mask=m, other=0.0)
        best = tl.maximum(best, _key(tl.where(m, _ord(x), _KEY_PAD_ORD), c))
    best_idx = _key_index(tl.max(best, 0))
    lmax = tl.load(X + row_off + best_idx).to(tl.float32)
    token = best_idx
    logp = 0.0
    if temp >= 1.1754943508222875e-38:  # 2^-126; 0 and subnormals (1 / t overflows) are greedy
        inv_t = tl.math.div_rn(1.0, temp)  # IEEE, as the CUDA kernel's 1.0f / temp (plain / is approximate)
        # top-k: the largest t with count(ord >= t) >= k; the invariant count(lo) >= k holds at
        # lo = -2^31 (everything), fails at hi = 2^31 (nothing); 32 halvings pin t = lo.
        lo_k = tl.full([], -2147483648, tl.int64)
        if (top_k > 0) & (top_k < n_cols):
            hi = tl.full([], 2147483648, tl.int64)
            for _ in range(32):
                mid = lo_k + ((hi - lo_k) >> 1)
                cnt = tl.zeros([BLOCK], tl.int32)
                for start in range(0, n_cols, BLOCK):
                    c = start + cols
                    m = c < n_cols
                    o = _ord(tl.load(X + row_off + c, mask=m, other=0.0)).to(tl.int64)
                    cnt += (m & (o >= mid)).to(tl.int32)
                ok = tl.sum(cnt, 0) >= top_k
                lo_k = tl.where(ok, mid, lo_k)
                hi = tl.where(ok, hi, mid)
        # top-p: the smallest v with G(v) = sum(w[kept & ord > v]) < p * S; G(-2^31 - 1) = S
        # fails, G(2^31 - 1) = 0 holds; keep ord >= v.
        lo_p = tl.full([], -2147483648, tl.int64)
        if top_p < 1.0:
            s_k = _row_sum_w(X, row_off, n_cols, lmax, inv_t, lo_k, -2147483649, BLOCK)
            target = top_p * s_k
            lo = tl.full([], -2147483649, tl.int64)
            hi = tl.full([], 2147483647, tl.int64)
            for _ in range(32):
                mid = lo + ((hi - lo) >> 1)
                ok = _row_sum_w(X, row_off, n_cols, lmax, inv_t, lo_k, mid, BLOCK) < target
                hi = tl.where(ok, mid, hi)
                lo = tl.where(ok, lo, mid)
            lo_p = hi
        lo_ord = tl.maximum(lo_k, lo_p)
        # Inverse CDF over the kept tokens in index order.
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            m = c < n_cols
            l = tl.load(X + row_off + c, mask=m, other=0.0).to(tl.float32)
            w = tl.exp((l - lmax) * inv_t)
            kept = m & (_ord(l).to(tl.int64) >= lo_ord) & (w >= min_p)
            s += tl.where(kept, w, 0.0)
        total = tl.sum(s, 0)
        seed = tl.load(SEED + row)
        offs = tl.load(OFFS + row)
        zero = seed * 0
        r0, r1, r2, r3 = philox4x32_10(offs & 0xFFFFFFFF, (offs >> 32) & 0xFFFFFFFF, zero, zero,
                                       seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
        u = (r0 >> 8).to(tl.float32) * (1.0 / 16777216.0)
        target = u * total
        running = 0.0
        choice = tl.full([], -1, tl.int64)
        last = tl.full([], -1, tl.int64)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            m = c < n_cols
            l = tl.load(X + row_off + c, mask=m, other=0.0).to(tl.float32)
            w = tl.exp((l - lmax) * inv_t)
            kept = m & (_ord(l).to(tl.int64) >= lo_ord) & (w >= min_p)
            wk = tl.where(kept, w, 0.0)
            cum = tl.cumsum(wk, 0) + running
            first = tl.min(tl.where((cum > target) & (wk > 0.0), c.to(tl.int64), 9223372036854775807), 0)
            choice = tl.where((choice < 0) & (first != 9223372036854775807), first, choice)
            last = tl.maximum(last, tl.max(tl.where(wk > 0.0, c.to(tl.int64), -1), 0))
            running += tl.sum(wk, 0)
        token = tl.where(choice < 0, last, choice)
        lt = tl.load(X + row_off + token).to(tl.float32)
        logp = tl.log(tl.exp((lt - lmax) * inv_t) / total)
    tl.store(TOK + row, token)
    tl.store(LOGP + row, logp)


def sample(logits, tokens, logprobs, temperature, top_k, top_p, min_p, seeds, offsets,
           x_row_stride, n_rows, n_cols):
    """Per-row parameter tensors (fp32 temperature/top_p/min_p, int64 top_k/seeds/offsets);
    tokens int64 [n_rows], logprobs fp32 [n_rows]."""
    _sample_kernel[(n_rows,)](logits, tokens, logprobs, temperature, top_k, top_p, min_p, seeds, offsets,
                              x_row_stride, n_cols, BLOCK=LOOP_BLOCK, num_warps=4)


# ---------------------------------------------------------------------------------------------
# penalties

@triton.jit
def _penalty_kernel(X, IDS, OFFS, REP, PRES, FREQ, stride_x, n_cols, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    start = tl.load(OFFS + row)
    end = tl.load(OFFS + row + 1)
    rep = tl.load(REP + row).to(tl.float32)
    pres = tl.load(PRES + row).to(tl.float32)
    freq = tl.load(FREQ + row).to(tl.float32)
    h = tl.arange(0, BLOCK_H)
    for a in range(start, end, BLOCK_H):
        pa = a + h
        ma = pa < end
        ida = tl.load(IDS + pa, mask=ma, other=-1).to(tl.int64)
        count = tl.zeros([BLOCK_H], tl.int32)
        earlier = tl.zeros([BLOCK_H], tl.int32)
        for b in range(start, end, BLOCK_H):
            pb = b + h
            mb = pb < end
            idb = tl.load(IDS + pb, mask=mb, other=-2).to(tl.int64)
            eq = (ida[:, None] == idb[None, :]) & mb[None, :]
            count += tl.sum(eq.to(tl.int32), 1)
            earlier += tl.sum((eq & (pb[None, :] < pa[:, None])).to(tl.int32), 1)
        act = ma & (earlier == 0) & (ida >= 0) & (ida < n_cols)
        ptr = X + row * stride_x + ida
        l = tl.load(ptr, mask=act, other=0.0).to(tl.float32)
        # the documented rule step by step: IEEE division (plain / is approximate) and, with
        # enable_fp_fusion off at the launch, no product contracted into an FMA
        l = tl.where(l > 0.0, tl.math.div_rn(l, rep), l * rep) - pres - count.to(tl.float32) * freq
        tl.store(ptr, _round(l, X.dtype.element_ty), mask=act)


# The penalty kernel's compile options: no FMA contraction (the documented rule rounds each step;
# tests/sampling compiles the kernel with these and checks its PTX).
PENALTY_OPTIONS = {"num_warps": 4, "enable_fp_fusion": False}


def apply_penalties(logits, token_ids, token_offsets, repetition, presence, frequency,
                    x_row_stride, n_rows, n_cols):
    """In place on row-strided logits; per-row fp32 parameter tensors; ids outside [0, n_cols)
    are ignored (validated on the host only where that costs no sync)."""
    _penalty_kernel[(n_rows,)](logits, token_ids, token_offsets, repetition, presence, frequency,
                               x_row_stride, n_cols, BLOCK_H=PENALTY_BLOCK, **PENALTY_OPTIONS)

