"""Schedule and tile sweep of the CUDA prefill kernel (cuda/attention/prefill_sm90.cuh) at the
issue's bar shapes (B2 Hq32 Hkv8, bf16), next to SDPA's cuDNN and flash backends: for each head
dim, every (key tile, stages, overlap, ping-pong) candidate below is set as the op's
configuration (PREFILL_CUDA_TILES), checked against the Triton kernel on the same inputs, and
timed with the L2 flushed (fray.bench.time_us). Candidates that do not fit shared memory fail to
compile and are reported as such. Prints one line per (shape, candidate); PREFILL_CUDA_TILES is
the place to ship a winner (bench/NOTES.md, prefill).
Run on the GPU machine with the bundle's PYTHONPATH:  python3 bench/micro/prefill_schedules.py
`python3 bench/micro/prefill_schedules.py persistent` instead times the shipped tiles with one CTA
per query tile and with the persistent grid (PREFILL_CUDA_PERSISTENT), at the bar shapes and a
varlen batch of 16 sequences of 128-8192 queries, next to SDPA's cuDNN backend.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fray
from fray import _plan as P
from fray import jit
from fray.bench import time_us
from fray.ops import attention as A

# head dim -> (key tile, stages, overlap, ping-pong); none spills (ptxas, 168 registers a thread)
# since the mask is one bound per row (2026-12-07).
CANDIDATES = {
    64: [(128, 2, True, True), (128, 3, True, True), (128, 3, True, False), (176, 2, True, True), (192, 2, True, True)],
    128: [(128, 2, True, False), (128, 2, True, True), (176, 2, True, False), (176, 2, True, True),
          (160, 2, True, False), (96, 3, True, False), (112, 3, True, True)],
    256: [(64, 2, True, True), (64, 2, True, False), (80, 2, True, True), (80, 2, True, False), (48, 3, True, True)],
}
SHAPES = [(8192, 128, True), (8192, 128, False), (16384, 128, True), (8192, 64, False), (8192, 256, False),
          (8192, 64, True), (8192, 256, True)]


def main():
    dev = "cuda"
    shipped = dict(A.PREFILL_CUDA_TILES)
    # build every candidate first, in parallel (nvcc); failures (shared memory) are reported below
    items = []
    for d, cands in CANDIDATES.items():
        for c in cands:
            for causal in (True, False):
                A.PREFILL_CUDA_TILES[(d, causal)] = c
                items.append(A.prefill_cuda_source(torch.bfloat16, d, causal) + ((),))
    built = dict(zip([it[0] for it in items], jit.build_many(items, device=0)))
    g = torch.Generator(device=dev).manual_seed(0)
    for s, d, causal in SHAPES:
        q = torch.randn(2, s, 32, d, device=dev, generator=g).to(torch.bfloat16)
        k = torch.randn(2, s, 8, d, device=dev, generator=g).to(torch.bfloat16)
        v = torch.randn(2, s, 8, d, device=dev, generator=g).to(torch.bfloat16)
        flops = 4 * 2 * 32 * s * s * d / (2 if causal else 1)
        shape = "B2Hq32Hkv8S%dD%d%s" % (s, d, ":causal" if causal else "")
        want = fray.prefill_attention(q, k, v, causal=causal, backend="triton")
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        for name, backend in (("sdpa:cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa:flash", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel(backend):
                us = time_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True))
            print("%-28s %-26s %9.1f us %5.0f TFLOP/s" % (shape, name, us, flops / us / 1e6), flush=True)
        for c in CANDIDATES[d]:
            A.PREFILL_CUDA_TILES[(d, causal)] = c
            P.PLANS.clear()
            label = "n%d s%d%s%s%s" % (c[0], c[1], " ov" if c[2] else "", " pp" if c[3] else "",
                                      " (shipped)" if c == shipped[(d, causal)] else "")
            kernel = built[A.prefill_cuda_source(torch.bfloat16, d, causal)[0]]
            if isinstance(kernel, Exception):
                print("%-28s %-26s build failed: %s" % (shape, label, str(kernel).splitlines()[-1][:100]), flush=True)
                continue
            out = fray.prefill_attention(q, k, v, causal=causal, backend="cuda")
            err = (out.float() - want.float()).abs().max().item()
            us = time_us(lambda: fray.prefill_attention(q, k, v, causal=causal, out=out, backend="cuda"))
            print("%-28s %-26s %9.1f us %5.0f TFLOP/s  max|cuda - triton| %.3g" % (
                shape, label, us, flops / us / 1e6, err), flush=True)
        A.PREFILL_CUDA_TILES[(d, causal)] = shipped[(d, causal)]


def persistent():
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    items = [A.prefill_cuda_source(torch.bfloat16, d, causal, persistent=pers) + ((),)
             for d in (64, 128, 256) for causal in (True, False) for pers in (False, True)]
    jit.build_many(items, device=0)
    lens = [128 * 2 ** (i % 7) for i in range(16)]  # 128 .. 8192
    cases = [("B2Hq32Hkv8S%dD%d%s" % (s, d, ":causal" if c else ""), s, d, c) for s, d, c in SHAPES]
    cases.append(("varlen16x128-8192D128:causal", None, 128, True))
    for shape, s, d, causal in cases:
        if s is None:
            cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(16)], dtype=torch.int32, device=dev)
            q = torch.randn(sum(lens), 32, d, device=dev, generator=g).to(torch.bfloat16)
            k, v = (torch.randn(sum(lens), 8, d, device=dev, generator=g).to(torch.bfloat16) for _ in range(2))
            kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens))
            flops = sum(4 * 32 * n * n * d / 2 for n in lens)
            sdpa = None
        else:
            q = torch.randn(2, s, 32, d, device=dev, generator=g).to(torch.bfloat16)
            k, v = (torch.randn(2, s, 8, d, device=dev, generator=g).to(torch.bfloat16) for _ in range(2))
            kw = {}
            flops = 4 * 2 * 32 * s * s * d / (2 if causal else 1)
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)  # noqa: E731
        want = fray.prefill_attention(q, k, v, causal=causal, backend="triton", **kw)
        if sdpa is not None:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                us = time_us(sdpa)
            print("%-30s %-14s %9.1f us %5.0f TFLOP/s" % (shape, "sdpa:cudnn", us, flops / us / 1e6), flush=True)
        for pers in (False, True):
            A.PREFILL_CUDA_PERSISTENT = pers
            P.PLANS.clear()
            out = fray.prefill_attention(q, k, v, causal=causal, backend="cuda", **kw)
            err = (out.float() - want.float()).abs().max().item()
            us = time_us(lambda: fray.prefill_attention(q, k, v, causal=causal, out=out, backend="cuda", **kw))
            print("%-30s %-14s %9.1f us %5.0f TFLOP/s  max|cuda - triton| %.3g" % (
                shape, "persistent" if pers else "grid", us, flops / us / 1e6, err), flush=True)
        A.PREFILL_CUDA_PERSISTENT = False


if __name__ == "__main__":
    persistent() if sys.argv[1:] == ["persistent"] else main()
