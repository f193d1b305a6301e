"""Softmax-family benchmarks: Fray's backends and the peers a user would pick, in one process.

softmax bytes:        read x + write y                               = 2·R·W·s(x)
online_softmax bytes: read x + write y + write row max and lse (fp32) = 2·R·W·s(x) + 8·R
Shapes: "16384x8192" and a width sweep at 256 MiB of bf16 input, "ROWSxWIDTH" with
ROWS = 2^28 / (2·WIDTH) for WIDTH in 256, 1024, 4096, 32768, 131072, 262144 (softmax); "16384x8192"
(online_softmax).
Peers: torch.eager (the composite a model file writes: max subtraction, exp, sum, divide, in
fp32), torch.compile (that composite compiled), torch.builtin (torch.softmax; for online_softmax
torch.softmax + amax + logsumexp), liger (Liger-Kernel's softmax, when importable; it refuses rows
wider than 65536, which leaves an error row).
Every impl allocates its output in each call (the caching allocator's block), Fray's included: where
the output lies against x moves these copy-rate kernels by ~1.5% on the H200 (the shipped softmax
kernel measured 133.6-134.0 us into a buffer allocated right after x and 131.5-132.7 into others,
bench/NOTES.md), so all of them get the allocator's placement rather than Fray a preallocated one.
"""
import torch

import fray

SWEEP_BYTES = 1 << 28  # bf16 input per sweep shape
SWEEP_WIDTHS = (256, 1024, 4096, 32768, 131072, 262144)
SHAPES = {
    "softmax": [(16384, 8192, torch.bfloat16)] + [(SWEEP_BYTES // (2 * w), w, torch.bfloat16) for w in SWEEP_WIDTHS],
    "online_softmax": [(16384, 8192, torch.bfloat16)],
}


def _eager_softmax(x):
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def _eager_online_softmax(x):
    xf = x.float()
    m = xf.amax(dim=-1, keepdim=True)
    e = torch.exp(xf - m)
    s = e.sum(dim=-1, keepdim=True)
    return (e / s).to(x.dtype), m[..., 0], (m + torch.log(s))[..., 0]


def _builtin_online_softmax(x):
    return torch.softmax(x, dim=-1), x.amax(dim=-1).float(), torch.logsumexp(x.float(), dim=-1)


def _liger():
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
    except Exception:  # not installed: the row is simply absent (the bundle carries the wheel)
        return None
    return LigerSoftmaxFunction


def _impls(op, x):
    impls = {}
    if op == "softmax":
        impls["fray.cuda"] = lambda: fray.softmax(x, backend="cuda")
        impls["fray.triton"] = lambda: fray.softmax(x, backend="triton")
        impls["torch.eager"] = lambda: _eager_softmax(x)
        compiled = torch.compile(_eager_softmax)
        impls["torch.compile"] = lambda: compiled(x)
        impls["torch.builtin"] = lambda: torch.softmax(x, dim=-1)
        liger = _liger()
        if liger is not None:
            impls["liger"] = lambda: liger.apply(x)
    else:
        impls["fray.cuda"] = lambda: fray.online_softmax(x, backend="cuda")
        impls["fray.triton"] = lambda: fray.online_softmax(x, backend="triton")
        impls["torch.eager"] = lambda: _eager_online_softmax(x)
        compiled = torch.compile(_eager_online_softmax)
        impls["torch.compile"] = lambda: compiled(x)
        impls["torch.builtin"] = lambda: _builtin_online_softmax(x)
    return impls


def _bytes(op, rows, width, x):
    return 2 * rows * width * x.element_size() + (8 * rows if op == "online_softmax" else 0)


def run(op, recorder, shapes=None, graph=True):
    if op not in SHAPES:
        raise ValueError("op: expected softmax or online_softmax, got %r" % op)
    from fray.bench import bench_impls
    for rows, width, dtype in shapes or SHAPES[op]:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(rows, width, device="cuda", generator=g) * 3).to(dtype)
        shape = "%dx%d" % (rows, width)
        nbytes = _bytes(op, rows, width, x)
        impls = _impls(op, x)
        bench_impls(recorder, op, shape, dtype, impls, nbytes, graph=graph)
        del impls, x
        torch.cuda.empty_cache()
