"""The CUDA MLA decode kernel's two consumer schedules (cuda/attention/mla_sm90.cuh, MlaConfig's
kTurns) side by side at the issue's bar shapes and two small ones, bf16, 64-token pages, next to
the Triton kernel: each schedule is checked against Triton on the same inputs (max |diff|) and
timed with the L2 flushed (fray.bench.time_us). MLA_CUDA_TURNS in python/fray/ops/attention.py is
the place to ship the faster one once both pass (bench/NOTES.md, MLA).
Run on the GPU machine with the bundle's PYTHONPATH:  python3 bench/micro/mla_schedules.py
"""
import torch

import fray
from fray import _plan as P
from fray import jit
from fray.bench import time_us
from fray.ops import attention as A

SHAPES = [(128, 128, 2, 4096), (128, 16, 1, 16384), (32, 128, 1, 4096), (32, 16, 1, 4096), (1, 128, 1, 4096)]


def main():
    jit.build_many([A.mla_cuda_source(torch.bfloat16, 64, turns=t) + ((),) for t in (False, True)], device=0)
    for batch, hq, s_q, t in SHAPES:
        q, kv, bt, lens = A._mla_case(torch.bfloat16, "cuda", batch=batch, s_q=s_q, hq=hq, lens=(t,) * batch)
        flops = 2.0 * hq * (576 + 512) * batch * sum(t - s_q + 1 + i for i in range(s_q))
        gbytes = batch * t * 576 * 2 / 1e9
        shape = "B%dHq%dSq%dT%d" % (batch, hq, s_q, t)
        want = fray.mla_decode(q, kv, bt, lens, backend="triton")
        us = time_us(lambda: fray.mla_decode(q, kv, bt, lens, backend="triton"))
        print("%-20s %-14s %9.1f us %6.0f TFLOP/s %5.2f TB/s" % (shape, "triton", us, flops / us / 1e6,
                                                                   gbytes / us * 1e3), flush=True)
        for turns in (False, True):
            A.MLA_CUDA_TURNS = turns
            P.PLANS.clear()
            got = fray.mla_decode(q, kv, bt, lens, backend="cuda")
            err = (got.float() - want.float()).abs().max().item()
            us = time_us(lambda: fray.mla_decode(q, kv, bt, lens, backend="cuda"))
            print("%-20s %-14s %9.1f us %6.0f TFLOP/s %5.2f TB/s  max|cuda - triton| %.3g" % (
                shape, "cuda turns" if turns else "cuda", us, flops / us / 1e6, gbytes / us * 1e3, err), flush=True)
        A.MLA_CUDA_TURNS = False


if __name__ == "__main__":
    main()
