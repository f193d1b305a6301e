"""The Triton GEMM: C[M, N] = A[M, K] @ B (+ bias[N]), fp32 accumulation, one rounding to C's dtype.

A persistent kernel: min(#SMs, #tiles) programs walk the output tiles in a grouped order
(GROUP_M tile rows share a band of B, so a band of A and B stays in L2 while it is reused: a
plain row-major walk re-reads all of B for every tile row). On Hopper the operands come through
TMA tensor descriptors (host-built TensorDescriptor: the copy engine does the address math and the
out-of-bounds zero fill, and Triton pipelines the loads over num_stages shared-memory buffers
feeding wgmma). TMA needs 16-byte aligned bases and row strides; other layouts (K or N not a
multiple of 8 elements, odd slices) take the pointer path with masked loads, the same kernel with
USE_DESC off. B is [N, K] (B_NK, nn.Linear's weight, transposed in registers by tl.trans, which
wgmma takes for free) or [K, N].

Configs (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) are fray.tune candidates,
chosen per shape bucket by python/fray/ops/gemm.py.
"""
import os

import torch
import triton
import triton.language as tl

from fray_triton._host import cdiv

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, a_desc, b_desc, c_desc, M, N, K, lda, ldb, ldc,
                 HAS_BIAS: tl.constexpr, B_NK: tl.constexpr, USE_DESC: tl.constexpr, DOT_F32: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 num_programs):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    group_tiles = GROUP_M * num_pid_n
    for tile in range(pid, num_tiles, num_programs):
        group = tile // group_tiles
        first_m = group * GROUP_M
        rows = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile % group_tiles) % rows
        pid_n = (tile % group_tiles) // rows
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, k_tiles):
            off_k = kt * BLOCK_K
            if USE_DESC:
                a = a_desc.load([off_m, off_k])
                if B_NK:
                    b = tl.trans(b_desc.load([off_n, off_k]))
                else:
                    b = b_desc.load([off_k, off_n])
            else:
                offs_k = off_k + tl.arange(0, BLOCK_K)
                a = tl.load(a_ptr + offs_m[:, None].to(tl.int64) * lda + offs_k[None, :],
                            mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
                if B_NK:
                    b = tl.load(b_ptr + offs_n[None, :].to(tl.int64) * ldb + offs_k[:, None],
                                mask=(offs_n[None, :] < N) & (offs_k[:, None] < K), other=0.0)
                else:
                    b = tl.load(b_ptr + offs_k[:, None].to(tl.int64) * ldb + offs_n[None, :],
                                mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
            if DOT_F32:
                # Triton's CPU interpreter computes bf16 tl.dot wrongly; bf16 products are exact
                # in fp32, so IEEE fp32 products give the GPU's result there.
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
            acc += bias.to(tl.float32)[None, :]
        c = acc.to(c_ptr.dtype.element_ty)
        if USE_DESC:
            c_desc.store([off_m, off_n], c)
        else:
            tl.store(c_ptr + offs_m[:, None].to(tl.int64) * ldc + offs_n[None, :], c,
                     mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _aligned(t):
    es = t.element_size()
    return t.data_ptr() % 16 == 0 and (t.shape[0] <= 1 or (t.stride(0) * es) % 16 == 0) and (t.shape[1] * es) % 16 == 0


def descriptors_usable(a, b, out):
    """Whether TMA can take all three operands (16-byte aligned bases, row strides and rows)."""
    return _aligned(a) and _aligned(b) and _aligned(out)


def gemm(a, b, out, bias, config, b_nk, num_sms, use_desc=None):
    """out[M, N] = a[M, K] @ (b[N, K].T if b_nk else b[K, N]) (+ bias). a, b, out 2-d with a unit
    last stride (validated by the caller); config: a fray.tune candidate dict."""
    M, K = a.shape
    N = out.shape[1]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    if use_desc is None:
        use_desc = descriptors_usable(a, b, out)
    a_desc = b_desc = c_desc = None
    if use_desc:
        from triton.tools.tensor_descriptor import TensorDescriptor
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        b_desc = TensorDescriptor.from_tensor(b, [bn, bk] if b_nk else [bk, bn])
        c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    tiles = cdiv(M, bm) * cdiv(N, bn)
    programs = max(1, min(num_sms, tiles))
    _gemm_kernel[(programs,)](
        a, b, bias if bias is not None else a, out, a_desc, b_desc, c_desc, M, N, K,
        a.stride(0), b.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, B_NK=b_nk, USE_DESC=use_desc,
        DOT_F32=_INTERPRET and a.dtype == torch.bfloat16,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config["GROUP_M"], num_programs=programs,
        num_warps=config["num_warps"], num_stages=config["num_stages"])
