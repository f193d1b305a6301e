"""How the CUDA sampling kernel's time grows with the batch (standalone; not a Bazel target).

    python bench/micro/sample_waves.py [VOCAB]

fp32 standard-normal logits, temperature 0.8. For batch sizes around the resident cluster
count (30 clusters of 8 blocks at 152064) it times: top-p 0.9 (the benchmark's call), no
filter (top_p 1: load + the kept-mass pass + draw), and greedy rows (temperature 0: the load
pass alone). Medians with the L2 flushed (fray.bench.time_us), as the benchmarks.
"""
import sys

import torch

import fray
from fray.bench import time_us

V = int(sys.argv[1]) if len(sys.argv) > 1 else 152064
torch.manual_seed(0)
big = torch.randn(256, V, device="cuda", dtype=torch.float32)


def call(b, **kw):
    x = big[:b]
    seeds = torch.arange(b, device="cuda", dtype=torch.int64) + 1234
    offsets = torch.zeros(b, device="cuda", dtype=torch.int64)
    return lambda: fray.sample(x, seeds=seeds, offsets=offsets, backend="cuda", **kw)


rows = []
for b in (1, 8, 16, 24, 30, 31, 32, 45, 60, 61, 64, 90, 120, 150, 180, 210, 240, 241, 256):
    t_p = time_us(call(b, temperature=0.8, top_p=0.9))
    t_1 = time_us(call(b, temperature=0.8)) if b in (1, 30, 60, 64, 120, 240, 256) else float("nan")
    t_g = time_us(call(b, temperature=0.0)) if b in (1, 30, 60, 64, 120, 240, 256) else float("nan")
    rows.append((b, t_p, t_1, t_g))
    print("B %4d  top-p %8.1f us  no-filter %8.1f  greedy %8.1f" % (b, t_p, t_1, t_g), flush=True)
print("\nsample_waves V=%d: B, top-p us, us/row, no-filter us, greedy us" % V)
for b, t_p, t_1, t_g in rows:
    print("%4d %8.1f %7.2f %8.1f %8.1f" % (b, t_p, t_p / b, t_1, t_g))
