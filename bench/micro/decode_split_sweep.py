"""Split-count sweep of fray.decode_attention (CUDA and Triton) on the issue's decode shapes, next
to SDPA: B1 under CUDA-graph replay (20 calls per graph, as the benchmark's ":graph" rows), B32 and
B64 Hq64 with the L2 flushed before each call. Prints one line per (shape, backend, splits).
Run on the GPU machine with the bundle's PYTHONPATH:  python3 bench/micro/decode_split_sweep.py
"""
import sys

import torch
import torch.nn.functional as F

import fray
from fray.bench import graph_us, median, time_us

SHAPES = [  # (B, Hq, Hkv, T, splits to try, graph timing, varlen)
    (1, 32, 8, 4096, [None, 8, 16, 24, 32, 48, 64], True, False),
    (32, 32, 8, 4096, [None, 1, 2], False, False),
    (64, 64, 8, 8192, [None, 1, 2, 4], False, False),
    (64, 32, 8, 8192, [None, 1, 2, 4], False, True),
]


def main():
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    for batch, hq, hkv, t, splits, graph, varlen in SHAPES:
        q = torch.randn(batch, hq, 128, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(batch, hkv, t, 128, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(batch, hkv, t, 128, device=dev, dtype=torch.bfloat16, generator=g)
        lens = torch.full((batch,), t, device=dev, dtype=torch.int32)
        if varlen:  # uniform in [1, T], the benchmark's generator and seed
            lens = torch.randint(1, t + 1, (batch,), generator=torch.Generator().manual_seed(1)).to(dev, torch.int32)
        out = torch.empty_like(q)
        gb = 2 * int(lens.sum()) * hkv * 128 * k.element_size() / 1e3
        timer = graph_us if graph else time_us
        name = "B%dHq%dHkv%dT%s%d%s" % (batch, hq, hkv, "var" if varlen else "", t, ":graph" if graph else "")
        q4 = q[:, :, None, :]
        mask = (torch.arange(t, device=dev)[None, :] < lens[:, None].long())[:, None, None, :]
        sdpa = lambda: F.scaled_dot_product_attention(q4, k, v, attn_mask=mask if varlen else None, enable_gqa=True)
        sd = timer(sdpa)
        print("%-28s %-8s %-6s %8.2f us %7.0f GB/s" % (name, "sdpa", "-", sd, gb / sd), flush=True)
        ref = sdpa()[:, :, 0].float()
        for backend in ("cuda", "triton"):
            for s in splits:
                fn = lambda: fray.decode_attention(q, k, v, lens, out=out, num_splits=s, backend=backend)
                fn()
                err = (out.float() - ref).abs().max().item()
                us = median([timer(fn) for _ in range(3)])
                print("%-28s %-8s %-6s %8.2f us %7.0f GB/s  maxerr %.2e" % (name, backend, s, us, gb / us, err),
                      flush=True)


if __name__ == "__main__":
    sys.exit(main())
