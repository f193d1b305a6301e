"""The floor under the small-M GEMM bars: how fast the weight bytes alone can be read after each L2 flush.

A decode GEMM (M = 1..64, b [N, K]) is a read of b. This times, at the issue's small-M shapes, torch.mm
(cuBLAS), fray.gemm (backend "cuda", tuned as shipped) and a plain read of b's bytes with no
arithmetic (the Triton kernel of decode_flush_methods.py), under the three flush methods of that
script: write flush (do_bench, 256 MB zeroed before each call: the benchmark's), read flush (a 256 MB
buffer summed before each call: the L2 holds clean lines) and none. The plain read under the write
flush is the fastest any GEMM can be under the benchmark's method.

    PYTHONPATH=<site with fray> python3 bench/micro/gemm_small_m_floor.py   # on the GPU machine; JSON lines to $OUT
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_flush_methods import flush_methods, plain_read  # noqa: E402

import fray  # noqa: E402
from fray.bench import environment, median  # noqa: E402

SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (16, 14336, 4096), (64, 4096, 4096)]


def main():
    dev = "cuda"
    methods = flush_methods(dev, event_write_flush=False)
    meta = environment()
    out_path = os.path.join(os.environ.get("OUT", "."), "gemm_small_m_floor.jsonl")
    g = torch.Generator(device=dev).manual_seed(0)
    with open(out_path, "w") as f:
        for m, n, k in SHAPES:
            a = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            w = torch.randn(n, k, device=dev, generator=g).to(torch.bfloat16)
            o = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            wt = w.t()
            half = w.reshape(2, -1)
            impls = {
                "torch.mm": lambda: torch.mm(a, wt, out=o),
                "fray.cuda": lambda: fray.gemm(a, w, out=o, backend="cuda"),
                "plain read": plain_read(half[0], half[1]),
            }
            impls["fray.cuda"]()
            torch.cuda.synchronize()
            mb = n * k * 2 / 1e6
            res = {(mt, i): [] for mt in methods for i in impls}
            for _ in range(3):
                for mt, timer in methods.items():
                    for i, fn in impls.items():
                        res[(mt, i)].append(timer(fn))
            shape = "%dx%dx%d" % (m, n, k)
            print("\n%s bf16 (%.1f MB of weights): us (TB/s), median of 3 rounds" % (shape, mb))
            print("%-12s" % "method" + "".join("%20s" % i for i in impls) + "   torch.mm/fray")
            for mt in methods:
                cells = []
                for i in impls:
                    us = median(res[(mt, i)])
                    cells.append("%10.2f (%4.2f)" % (us, mb / us))
                    f.write(json.dumps(dict(op="gemm_floor", impl=i, shape="%s:%s" % (shape, mt), dtype="bf16",
                                            us=round(us, 3), gbps=round(mb * 1e3 / us, 1),
                                            rounds=[round(u, 3) for u in res[(mt, i)]], **meta)) + "\n")
                ratio = median(res[(mt, "torch.mm")]) / median(res[(mt, "fray.cuda")])
                print("%-12s" % mt + "".join("%20s" % c for c in cells) + "   %.3fx" % ratio, flush=True)


if __name__ == "__main__":
    main()
