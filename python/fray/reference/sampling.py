"""CPU references for the sampling family (numpy; float64 wherever arithmetic happens).

These functions define the semantics every backend must reproduce bit for bit in its choices
(which indices, which token); only the float64 sums inside are allowed to differ from a kernel's
fp32 sums, which can move a decision only when a sum lands within fp32 rounding of a threshold.

Order of values (topk, argmax). Values are compared as numbers with two additions: every NaN is
larger than +inf (so NaNs come first for largest=True and last for largest=False, as torch.sort
does), and -0.0 == +0.0. Equal values are ordered by index, lower first, in both directions.

Sampling of one row (logits l, width V):
  temperature T < 2^-126 (0 or an fp32 subnormal, whose 1 / T overflows fp32): the token is
    argmax(l) (NaN counts as the maximum, ties -> lowest index), its logprob 0.0 (a point mass);
    the other parameters are ignored.
  otherwise, with keep = all tokens:
  1. top-k (0 < k < V): t = the k-th largest logit; keep l >= t (ties at t are all kept).
  2. w = exp((l - max(l)) / T) (unnormalised probabilities; the max has w = 1 and is always kept).
  3. top-p (0 < p < 1): S = sum(w[keep]); walking the kept tokens by decreasing logit (ties by
     index), j = the first position where the running sum reaches p * S; keep the tokens whose
     logit is >= the logit at j. Equivalently: keep i iff sum(w[keep & (l > l[i])]) < p * S,
     which is how kernels test it without sorting (a bisection over logit values).
  4. min-p (0 < m <= 1): keep w >= m (w is the probability relative to the maximum).
  5. u = (philox4x32_10(counter=(offset lo, offset hi, 0, 0), key=(seed lo, seed hi))[0] >> 8)
     * 2^-24, exactly representable in fp32, in [0, 1). Over the kept tokens in index order,
     with c = cumsum(w * keep), the token is the first index with c > u * c[-1]
     (the last kept token if rounding leaves none). logprob = log(w[token] / c[-1]).
NaN logits are only defined for greedy rows; -inf logits are never sampled (w = 0).

Penalties (per row, history token_ids[token_offsets[b]:token_offsets[b + 1]]): for each distinct
id with count n: l = l / rep if l > 0 else l * rep; l -= presence; l -= n * frequency.
"""
import numpy as np

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)
GREEDY_BELOW = 2.0 ** -126  # the smallest normal fp32: every smaller temperature samples greedily


def philox4x32_10(counter, key):
    """Philox-4x32-10 (Salmon et al., SC'11) on uint32 lanes, vectorised over numpy arrays.

    counter: 4 arrays (or ints) of 32-bit values, key: 2 of them; returns 4 uint64 arrays holding
    the 32-bit outputs. Products of two 32-bit values fit uint64 exactly."""
    c = [np.asarray(v, dtype=np.uint64) & _MASK32 for v in counter]
    k0, k1 = (np.asarray(v, dtype=np.uint64) & _MASK32 for v in key)
    m0, m1 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1)
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(PHILOX_W0)) & _MASK32
            k1 = (k1 + np.uint64(PHILOX_W1)) & _MASK32
        p0, p1 = c[0] * m0, c[2] * m1
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _MASK32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _MASK32]
    return c


def uniform(seeds, offsets):
    """The one uniform of each (seed, offset): int64 arrays in, float64 array in [0, 1) out."""
    s = np.asarray(seeds, dtype=np.int64).astype(np.uint64)   # two's complement bits
    o = np.asarray(offsets, dtype=np.int64).astype(np.uint64)
    x = philox4x32_10((o & _MASK32, o >> np.uint64(32), 0, 0), (s & _MASK32, s >> np.uint64(32)))[0]
    return (x >> np.uint64(8)).astype(np.float64) * 2.0 ** -24


def _order_key(x):
    """float64 keys that sort like the documented value order: NaN above +inf, -0 == +0."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.isnan(x), np.inf, x) + 0.0, np.isnan(x)


def topk_indices(x, k, largest=True):
    """int64 indices [..., k] of the top-k along the last axis, in rank order."""
    x = np.asarray(x, dtype=np.float64)
    v, nan = _order_key(x)
    idx = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
    if largest:  # lexsort: last key is primary; NaN first, then larger, then lower index
        order = np.lexsort((idx, -v, ~nan), axis=-1)
    else:
        order = np.lexsort((idx, v, nan), axis=-1)
    return order[..., :k].astype(np.int64)


def topk(x, k, largest=True):
    """(values, indices); values are taken from x itself (so bits, -0.0 and NaN payloads survive)."""
    i = topk_indices(x, k, largest)
    return np.take_along_axis(np.asarray(x), i, axis=-1), i


def argmax(x):
    """int64 index of the maximum along the last axis: NaN is the maximum, ties -> lowest index."""
    return topk_indices(x, 1, True)[..., 0]


def apply_penalties(logits, token_ids, token_offsets, repetition, presence, frequency):
    """Returns penalised float64 logits [B, V]; repetition/presence/frequency: per-row arrays."""
    out = np.array(logits, dtype=np.float64, copy=True)
    ids, offs = np.asarray(token_ids, np.int64), np.asarray(token_offsets, np.int64)
    for b in range(out.shape[0]):
        uniq, counts = np.unique(ids[offs[b]:offs[b + 1]], return_counts=True)
        if uniq.size == 0:
            continue
        l = out[b, uniq]
        l = np.where(l > 0, l / repetition[b], l * repetition[b])
        out[b, uniq] = l - presence[b] - counts * frequency[b]
    return out


def kept_sets(l, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """The kept mask after each filter of one row: dict(top_k=, top_p=, min_p=) plus weights w."""
    l = np.asarray(l, dtype=np.float64)
    V = l.shape[0]
    keep = np.ones(V, dtype=bool)
    if 0 < top_k < V:
        t = np.sort(l)[::-1][top_k - 1]
        keep &= l >= t
    after_k = keep.copy()
    w = np.exp((l - l.max()) / temperature)
    if 0 < top_p < 1:
        S = w[keep].sum()
        order = np.lexsort((np.arange(V), -l))
        order = order[keep[order]]
        c = np.cumsum(w[order])
        j = int(np.searchsorted(c, top_p * S, side="left"))  # first position with c >= p * S
        j = min(j, order.size - 1)
        keep &= l >= l[order[j]]
    after_p = keep.copy()
    if min_p > 0:
        keep &= w >= min_p
    return dict(top_k=after_k, top_p=after_p, min_p=keep.copy(), w=w)


def sample(logits, temperature, top_k, top_p, min_p, seeds, offsets):
    """(tokens int64 [B], logprobs float64 [B]); every parameter a per-row array."""
    logits = np.asarray(logits, dtype=np.float64)
    B = logits.shape[0]
    u = uniform(seeds, offsets)
    tokens = np.zeros(B, dtype=np.int64)
    logprobs = np.zeros(B, dtype=np.float64)
    for b in range(B):
        l = logits[b]
        if not temperature[b] >= GREEDY_BELOW:  # NaN too (the kernels' comparison)
            tokens[b] = argmax(l[None])[0]
            continue
        s = kept_sets(l, temperature[b], int(top_k[b]), float(top_p[b]), float(min_p[b]))
        wk = np.where(s["min_p"], s["w"], 0.0)
        c = np.cumsum(wk)
        hit = np.nonzero((c > u[b] * c[-1]) & (wk > 0))[0]
        tok = int(hit[0]) if hit.size else int(np.nonzero(wk > 0)[0][-1])
        tokens[b], logprobs[b] = tok, np.log(wk[tok] / c[-1])
    return tokens, logprobs
