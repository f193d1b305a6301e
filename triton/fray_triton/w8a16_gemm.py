"""The W8A16 GEMM in Triton: out[M, N] = x[M, K] @ (w[N, K] * s)^T (+ bias), x bf16 / fp16, w int8 or e4m3.

Semantics are fray.reference.quant.w8a16_gemm's; fray.ops.quant validates, this launcher trusts
its inputs. The weights convert exactly to x's dtype (|q| <= 127 and every e4m3 value are bf16 and
fp16 numbers) and tl.dot accumulates in fp32. Scales (constexpr GROUP): per channel (row stride
lds; 0 broadcasts one scale) multiply the fp32 sum once in the epilogue; per group (GROUP, [N,
ceil(K / 128)]) multiply each 128-deep slice's fp32 product (BLOCK_K is 128) as it is added.

One program per (BLOCK_M, BLOCK_N) tile; masked loads take any M, N, K and row strides.
"""
import os

import triton
import triton.language as tl

from fray_triton._host import cdiv

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
GROUP_K = 128


@triton.jit
def _w8a16_kernel(
    X, W, S, BIAS, OUT, M, N, K, ldx, ldw, lds, ldo,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mm = rm < M
    mn = rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        mk = kk < K
        x = tl.load(X + rm[:, None] * ldx + kk[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
        # No `other=`: Triton cannot cast an integer fill to fp8; masked lanes are zeroed after the
        # (exact) conversion instead.
        wm = mn[:, None] & mk[None, :]
        w = tl.load(W + rn[:, None] * ldw + kk[None, :], mask=wm)
        if DOT_F32:  # the CPU interpreter: exact small values in fp32
            part = tl.dot(x.to(tl.float32), tl.trans(tl.where(wm, w.to(tl.float32), 0.0)))
        else:
            part = tl.dot(x, tl.trans(tl.where(wm, w.to(x.dtype), 0.0).to(x.dtype)))
        if GROUP:
            s = tl.load(S + rn * lds + k0 // 128, mask=mn, other=0.0)
            acc += part * s[None, :]
        else:
            acc += part
    if not GROUP:
        acc = acc * tl.load(S + rn * lds, mask=mn, other=0.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(BIAS + rn, mask=mn, other=0.0).to(tl.float32)[None, :]
    tl.store(OUT + rm[:, None] * ldo + rn[None, :], acc.to(OUT.dtype.element_ty), mask=mm[:, None] & mn[None, :])


def config_for(m):
    """The tile by M (not tuned): decode rows, a mid tile, a large one. BLOCK_K is 128 (the group)."""
    if m <= 16:
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": GROUP_K, "num_warps": 4, "num_stages": 4}
    if m <= 64:
        return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": GROUP_K, "num_warps": 4, "num_stages": 4}
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": GROUP_K, "num_warps": 8, "num_stages": 3}


def w8a16_gemm(x, w, scale, lds, group, bias, out, config):
    """out = the W8A16 product (module docstring). x [M, K], w [N, K] with unit last strides; scale
    fp32 ([N * lds] per channel with lds 0 or 1, or [N, ceil(K / 128)] with row stride lds)."""
    m, k = x.shape
    n = w.shape[0]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    grid = (cdiv(n, bn), cdiv(m, bm))
    _w8a16_kernel[grid](
        x, w, scale, bias if bias is not None else scale, out, m, n, k, x.stride(0), w.stride(0), lds, out.stride(0),
        GROUP=group, HAS_BIAS=bias is not None, DOT_F32=_INTERPRET, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=config["num_warps"], num_stages=config["num_stages"])
