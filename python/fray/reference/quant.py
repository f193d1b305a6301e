"""Quantize / dequantize references (numpy, exact).

The groups of x [M, K] share one scale: "tensor" (all of x), "token" (a row), "channel" (a
column), "block" (a (bm, bk) tile, the last ones clipped at M and K). Dynamic scales:

  amax  = max |x| over the group's finite values (NaN and +-inf are left out; 0 if none)
  scale = fp32(fp32(amax) / qmax)      qmax = 127 (int8) or 448 (float8_e4m3fn)
          a scale of 0 (amax 0, or an amax so small that the division underflows) becomes 1
  y     = fp32(fp32(x) / scale)        one IEEE fp32 division, correctly rounded
  q     = y rounded to the nearest (ties to even) int8 or e4m3 value, saturated to [-qmax, qmax]
          (int8 never takes -128); +-inf saturate to +-qmax; NaN becomes 0 in int8, NaN in e4m3

The fp32 division is done by numpy's float32 arithmetic (IEEE, correctly rounded, as the
kernels' div_rn); everything after it is exact in float64, so int8 results are exact.
dequantize: x = fp32(fp32(q) * scale) (the caller rounds it once more to the output dtype).
"""
import numpy as np

QMAX = {"int8": 127.0, "float8_e4m3fn": 448.0}
GRANULARITIES = ("tensor", "token", "channel", "block")


def cdiv(a, b):
    return -(-a // b)


def scale_shape(granularity, m, k, block=None):
    """The scale tensor's shape for x [m, k]."""
    if granularity == "tensor":
        return ()
    if granularity == "token":
        return (m, 1)
    if granularity == "channel":
        return (1, k)
    return (cdiv(m, block[0]), cdiv(k, block[1]))


def expand(s, granularity, m, k, block=None):
    """A scale of scale_shape(...) broadcast to [m, k]."""
    s = np.asarray(s)
    if granularity == "tensor":
        return np.broadcast_to(s.reshape(1, 1), (m, k))
    if granularity in ("token", "channel"):
        return np.broadcast_to(s.reshape(scale_shape(granularity, m, k)), (m, k))
    bm, bk = block
    return np.repeat(np.repeat(s, bm, axis=0), bk, axis=1)[:m, :k]


def amax(x, granularity, block=None):
    """float64 amax per group of x (float64 [m, k]) over the finite values."""
    a = np.where(np.isfinite(x), np.abs(x), 0.0)
    m, k = x.shape
    if granularity == "tensor":
        return np.array(a.max() if a.size else 0.0)
    if granularity == "token":
        return a.max(axis=1, keepdims=True) if k else np.zeros((m, 1))
    if granularity == "channel":
        return a.max(axis=0, keepdims=True) if m else np.zeros((1, k))
    bm, bk = block
    gm, gk = cdiv(m, bm), cdiv(k, bk)
    pad = np.zeros((gm * bm, gk * bk))
    pad[:m, :k] = a
    return pad.reshape(gm, bm, gk, bk).max(axis=(1, 3))


def dynamic_scale(x, granularity, qmax, block=None):
    """fp32 scales of x (float64 [m, k]); see the module docstring."""
    s = (amax(x, granularity, block).astype(np.float32) / np.float32(qmax)).astype(np.float32)
    return np.where(s == 0, np.float32(1.0), s).astype(np.float32)


def round_e4m3(y):
    """y (float64, |y| <= 448 or NaN) rounded to the nearest e4m3 value, ties to even."""
    a = np.abs(y)
    _, e = np.frexp(np.where(a > 0, a, 1.0))  # a = f * 2**e with f in [0.5, 1)
    # 3 mantissa bits below the leading one: the step is 2**(e - 4); below 2**-6 the subnormal step 2**-9
    step = np.ldexp(1.0, np.maximum(e - 4, -9))
    with np.errstate(invalid="ignore"):
        return np.rint(y / step) * step


def quantize(x, dtype, granularity, block=None, scale=None):
    """(q as float64 values, scale fp32): x float64 [m, k] holding fp32-representable values,
    dtype "int8" or "float8_e4m3fn", scale an fp32 array of scale_shape or None (dynamic)."""
    qmax = QMAX[dtype]
    m, k = x.shape
    if scale is None:
        scale = dynamic_scale(x, granularity, qmax, block)
    scale = np.asarray(scale, np.float32).reshape(scale_shape(granularity, m, k, block))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        y = (x.astype(np.float32) / expand(scale, granularity, m, k, block)).astype(np.float64)
    y = np.clip(y, -qmax, qmax)  # NaN stays NaN
    if dtype == "int8":
        q = np.where(np.isnan(y), 0.0, np.rint(y))
    else:
        q = round_e4m3(y)
    return q, scale


def dequantize(q, scale, granularity, block=None):
    """fp32 x = q * scale (q any real array [m, k], scale fp32 of scale_shape)."""
    m, k = q.shape
    s = expand(np.asarray(scale, np.float32).reshape(scale_shape(granularity, m, k, block)), granularity, m, k,
               block)
    with np.errstate(invalid="ignore", over="ignore"):
        return (np.asarray(q, np.float32) * s).astype(np.float32)


SCALE_KINDS = ("tensor", "vector", "block")
SCALE_BLOCK = 128


def scaled_gemm(a, b, a_scale, b_scale, kind_a, kind_b, bias=None):
    """The scaled GEMM (float64): out[m, n] = sum_k (a[m, k] sa(m, k)) (b[n, k] sb(n, k)) + bias[n].

    a [M, K] and b [N, K] hold the 8-bit values as float64 (int8 integers or e4m3 values, exact);
    the scales are fp32 values held as float64. kind "tensor": one scale; "vector": a per row of a
    ([M] or [M, 1]), b per row of b = per output channel ([N] or [N, 1]); "block": a per row and
    128 of K ([M, ceil(K / 128)]), b per 128 x 128 block ([ceil(N / 128), ceil(K / 128)]). For
    tensor and vector scales the integer (or fp8) product is formed first and scaled once, exactly
    in float64: int8 results are then exact up to the output rounding."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    m, k = a.shape
    n = b.shape[0]
    sa = np.asarray(a_scale, np.float64)
    sb = np.asarray(b_scale, np.float64)
    if kind_a == "block":
        kb = cdiv(k, SCALE_BLOCK)
        sa_full = np.repeat(sa.reshape(m, kb), SCALE_BLOCK, axis=1)[:, :k]
        sb_full = np.repeat(np.repeat(sb.reshape(cdiv(n, SCALE_BLOCK), kb), SCALE_BLOCK, axis=0)[:n],
                            SCALE_BLOCK, axis=1)[:, :k]
        out = (a * sa_full) @ (b * sb_full).T
    else:
        acc = a @ b.T
        ra = sa.reshape(m, 1) if kind_a == "vector" else sa.reshape(())
        cb = sb.reshape(1, n) if kind_b == "vector" else sb.reshape(())
        out = acc * cb * ra
    if bias is not None:
        out = out + np.asarray(bias, np.float64).reshape(1, n)
    return out


def scaled_gemm_terms(a, b, a_scale, b_scale, kind_a, kind_b):
    """sum_k |a sa| |b sb|: the magnitude the accumulation error bound scales with."""
    return scaled_gemm(np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64)),
                       np.abs(np.asarray(a_scale, np.float64)), np.abs(np.asarray(b_scale, np.float64)),
                       kind_a, kind_b)


W8A16_GROUP = 128
W8A16_KINDS = ("tensor", "channel", "group")


def w8a16_gemm(x, w, w_scale, kind, bias=None):
    """The W8A16 GEMM (float64): out[m, n] = sum_k x[m, k] w[n, k] s(n, k) + bias[n].

    x [M, K] holds the activations, w [N, K] the 8-bit weight values (int8 integers or e4m3
    values), both as float64; w_scale is fp32 held as float64. kind "tensor": one scale;
    "channel": one per output channel ([N] or [N, 1]); "group": one per output channel and 128 of
    K ([N, ceil(K / 128)], fray.quantize(w, granularity="block", block=(1, 128)))."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, k = w.shape
    s = np.asarray(w_scale, np.float64)
    if kind == "group":
        out = x @ (w * np.repeat(s.reshape(n, -1), W8A16_GROUP, axis=1)[:, :k]).T
    else:
        out = (x @ w.T) * (s.reshape(1, n) if kind == "channel" else s.reshape(()))
    if bias is not None:
        out = out + np.asarray(bias, np.float64).reshape(1, n)
    return out


def w8a16_gemm_terms(x, w, w_scale, kind):
    """sum_k |x| |w s|: the magnitude the accumulation error bound scales with."""
    return w8a16_gemm(np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64)),
                      np.abs(np.asarray(w_scale, np.float64)), kind)


# The fused producers: the norm / activation value rounded to the input dtype (what the unfused op
# stores), then quantized per row (or by a static scale), as fray.quantize(granularity="token").

def _quantize_rows(y, dtype, scale):
    """(q, scale) of y [m, k] (float64 values of the input dtype): dynamic per-row scales, or a
    static fp32 scale (one value, or one per row)."""
    if scale is None:
        return quantize(y, dtype, "token")
    scale = np.asarray(scale, np.float32)
    if scale.size == 1 and y.shape[0] != 1:
        q, _ = quantize(y, dtype, "tensor", scale=scale.reshape(()))
        return q, scale
    q, _ = quantize(y, dtype, "token", scale=scale.reshape(-1, 1))
    return q, scale


def rmsnorm_quant(x, weight, eps, dtype, round_to, weight_offset=0.0, residual=None, scale=None):
    """(q, scale, sum): x, residual [m, k] and weight [k] float64; round_to rounds float64 values
    to the input dtype. sum = round_to(x + residual) (None without a residual) is what is
    normalised; y = round_to(rmsnorm(sum or x)); (q, scale) = the rows of y quantized to dtype."""
    from fray.reference import norm
    s = None
    if residual is not None:
        s = round_to(x + residual)
        x = s
    y = round_to(norm.rmsnorm(x, weight, eps, weight_offset))
    q, sc = _quantize_rows(y, dtype, scale)
    return q, sc, s


def silu_mul_quant(gate, up, dtype, round_to, scale=None):
    """(q, scale): y = round_to(silu(gate) * up) (float64 [m, k] inputs) quantized per row."""
    from fray.reference import activation
    return _quantize_rows(round_to(activation.silu_mul(gate, up)), dtype, scale)
