"""The scaled GEMM on 8-bit operands in Triton: out[M, N] = (a[M, K] * sa) @ (b[N, K] * sb)^T (+ bias).

Semantics are fray.reference.quant.scaled_gemm's; fray.ops.quant validates, this launcher trusts
its inputs. Scale kinds (constexpr per operand): 0 one scalar, 1 a vector (a per row of a [M], b
per row of b, i.e. per output channel [N]), 2 blocks (a [M, ceil(K / 128)], b [ceil(N / 128),
ceil(K / 128)], both row-major). int8 accumulates exactly in int32 (tl.dot with an int32
accumulator); e4m3 in fp32. Vector / scalar scales apply once in the epilogue, in the CUDA
kernel's order: fp32(acc) * sb, then * sa (+ bias), one rounding to out's dtype. Block scales
apply per 128-deep slice of K: each slice's fp32 product is multiplied by sa[m, kb] * sb[n // 128,
kb] and summed in fp32 registers (BLOCK_K is 128 there).

One program per (BLOCK_M, BLOCK_N) tile, grouped along M for L2 reuse; masked loads take any M,
N, K and row strides.
"""
import os

import torch
import triton
import triton.language as tl

from fray_triton._host import cdiv

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK_SCALE = 128


@triton.jit
def _scaled_gemm_kernel(
    A, B, SA, SB, BIAS, OUT, M, N, K, lda, ldb, ldo, kblocks, sa_rs, sa_cs,
    KIND_A: tl.constexpr, KIND_B: tl.constexpr, INT8: tl.constexpr, HAS_BIAS: tl.constexpr,
    DOT_F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m

    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mm = rm < M
    mn = rn < N
    if KIND_A == 2:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kb in range(0, kblocks):
            part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(kb * 128, tl.minimum(kb * 128 + 128, K), BLOCK_K):
                kk = k0 + rk
                mk = kk < K
                a = tl.load(A + rm[:, None] * lda + kk[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
                b = tl.load(B + rn[:, None] * ldb + kk[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
                if DOT_F32:
                    part += tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)))
                else:
                    part += tl.dot(a, tl.trans(b))
            sa = tl.load(SA + rm * sa_rs + kb * sa_cs, mask=mm, other=0.0)
            sb = tl.load(SB + (rn // 128) * kblocks + kb, mask=mn, other=0.0)
            acc += part * (sa[:, None] * sb[None, :])
        y = acc
    else:
        if INT8:
            iacc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
        else:
            iacc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            mk = kk < K
            a = tl.load(A + rm[:, None] * lda + kk[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
            b = tl.load(B + rn[:, None] * ldb + kk[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
            if DOT_F32:  # the CPU interpreter: exact small-integer / fp8 values in fp32 (K small)
                iacc += tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32))).to(iacc.dtype)
            else:
                iacc += tl.dot(a, tl.trans(b), out_dtype=iacc.dtype)
        y = iacc.to(tl.float32)
        if KIND_B == 1:
            y = y * tl.load(SB + rn, mask=mn, other=0.0)[None, :]
        else:
            y = y * tl.load(SB)
        if KIND_A == 1:
            sa = tl.load(SA + rm, mask=mm, other=0.0)[:, None]
        else:
            sa = tl.load(SA)
        y = y * sa
    if HAS_BIAS:
        y = y + tl.load(BIAS + rn, mask=mn, other=0.0).to(tl.float32)[None, :]
    tl.store(OUT + rm[:, None] * ldo + rn[None, :], y.to(OUT.dtype.element_ty), mask=mm[:, None] & mn[None, :])


def scaled_gemm(a, b, a_scale, b_scale, kind_a, kind_b, bias, out, config):
    """out = the scaled product (see the module docstring). a [M, K], b [N, K] int8 or e4m3 with a
    unit last stride; scales fp32 contiguous, but a's block scales [M, ceil(K / 128)] by their
    strides (row-major, or MN-major as DeepGEMM lays them out); config: BLOCK_M, BLOCK_N, BLOCK_K,
    GROUP_M, num_warps, num_stages (BLOCK_K 128 for block scales)."""
    M, K = a.shape
    N = b.shape[0]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    if kind_a == 2:
        bk = 128 if not _INTERPRET else min(bk, 128)
    grid = (cdiv(M, bm) * cdiv(N, bn),)
    _scaled_gemm_kernel[grid](
        a, b, a_scale, b_scale, bias if bias is not None else a_scale, out, M, N, K, a.stride(0), b.stride(0),
        out.stride(0), cdiv(K, BLOCK_SCALE), a_scale.stride(0) if kind_a == 2 else 0,
        a_scale.stride(1) if kind_a == 2 else 0, KIND_A=kind_a, KIND_B=kind_b, INT8=a.dtype == torch.int8,
        HAS_BIAS=bias is not None, DOT_F32=_INTERPRET, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        GROUP_M=config["GROUP_M"], num_warps=config["num_warps"], num_stages=config["num_stages"])
