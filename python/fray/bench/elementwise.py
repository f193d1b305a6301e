"""Elementwise-family benchmarks: Fray's backends and the peers a user would pick, in one process.

vector_add bytes: read a + read b + write out = 3·N·s   (N elements of s bytes)
Peers: torch.builtin (torch.add, which is also what the eager composite a + b runs) and
torch.compile (a + b compiled). Liger-Kernel has no vector add.
Shape strings are the element count ("268435456"); a ":graph" suffix marks CUDA-graph replay,
timed for shapes under GRAPH_BELOW_US. --shapes=ROWSxCOLS[:dtype] (the flag every bench binary
takes) means ROWS·COLS elements.
"""
import torch

import fray

SHAPES = [(1 << 28, torch.bfloat16), (1 << 20, torch.bfloat16)]
OPS = ("vector_add",)


def _eager_add(a, b):
    return a + b


def _impls(a, b):
    out = torch.empty_like(a)
    compiled = torch.compile(_eager_add)
    return {
        "fray.cuda": lambda: fray.vector_add(a, b, out=out, backend="cuda"),
        "fray.triton": lambda: fray.vector_add(a, b, out=out, backend="triton"),
        "torch.builtin": lambda: torch.add(a, b),
        "torch.compile": lambda: compiled(a, b),
    }


def run(op, recorder, shapes=None, graph=True):
    if op not in OPS:
        raise ValueError("op: expected one of %s, got %r" % (", ".join(OPS), op))
    from fray.bench import bench_impls
    if shapes:  # from --shapes: (rows, cols, dtype)
        shapes = [(rows * cols, dtype) for rows, cols, dtype in shapes]
    for n, dtype in shapes or SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(n, device="cuda", generator=g).to(dtype)
        b = torch.randn(n, device="cuda", generator=g).to(dtype)
        nbytes = 3 * n * a.element_size()
        impls = _impls(a, b)
        bench_impls(recorder, op, str(n), dtype, impls, nbytes, graph=graph)
        del a, b, impls
