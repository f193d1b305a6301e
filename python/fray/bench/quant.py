"""Quant-family benchmarks: fray.quantize's Triton kernels (the family has no CUDA C++ backend
yet) against the torch composite a model file writes, in one process.

quantize bytes: read x + write q + write the fp32 scales = M·K·s(x) + M·K·s(q) + 4·groups
  shapes "<granularity>:<M>x<K>" for granularity in token, block1x128 at 16384x8192, bf16 x to
  int8 and float8_e4m3fn (the dtype column says which), fixed-seed standard normal.
  Peers: torch.eager = amax per group in fp32 (finite values), divide, round (ties to even),
  clamp, cast; torch.compile = that composite compiled (fullgraph=True).
"""
import re

import torch

import fray

SHAPES = {"quantize": [("token", 16384, 8192), ("block1x128", 16384, 8192)]}
OPS = tuple(SHAPES)
QDTYPES = (torch.int8, torch.float8_e4m3fn)
_SHAPE_RE = re.compile(r"^(token|block1x128):(\d+)x(\d+)$")


def parse_shapes(op, text):
    """--shapes for this family: a comma list of "<token|block1x128>:<M>x<K>"."""
    out = []
    for item in text.split(","):
        m = _SHAPE_RE.match(item.strip())
        if not m:
            raise ValueError("shapes: expected <token|block1x128>:<M>x<K>, got %r" % item)
        out.append((m.group(1), int(m.group(2)), int(m.group(3))))
    return out


def eager_quantize(x, dtype, granularity):
    """The torch composite of quantize (token, or block (1, 128) with K a multiple of 128)."""
    qmax = 127.0 if dtype == torch.int8 else 448.0
    m, k = x.shape
    xf = x.float() if granularity == "token" else x.float().view(m, k // 128, 128)
    a = torch.where(xf.abs() < float("inf"), xf.abs(), 0.0).amax(dim=-1, keepdim=True)
    s = a / qmax
    s = torch.where(s == 0, 1.0, s)
    y = (xf / s).clamp(-qmax, qmax)
    q = (torch.round(y).to(dtype) if dtype == torch.int8 else y.to(dtype)).view(m, k)
    return q, s.view(m, -1)


def _args(granularity):
    return ("token", (1, 128)) if granularity == "token" else ("block", (1, 128))


def impls(op, inp, compile_fn=torch.compile):
    x, dtype, g = inp["x"], inp["dtype"], inp["granularity"]
    gran, block = _args(g)
    out = {"fray.triton": lambda: fray.quantize(x, dtype, granularity=gran, block=block, backend="triton"),
           "torch.eager": lambda: eager_quantize(x, dtype, gran)}
    compiled = compile_fn(eager_quantize, fullgraph=True)
    out["torch.compile"] = lambda: compiled(x, dtype, gran)
    return out


def nbytes(op, inp):
    x, dtype, g = inp["x"], inp["dtype"], inp["granularity"]
    m, k = x.shape
    groups = m if g == "token" else m * -(-k // 128)
    return m * k * x.element_size() + m * k * torch.empty(0, dtype=dtype).element_size() + 4 * groups


def run(op, recorder, shapes=None, graph=True, device="cuda", compile_fn=torch.compile):
    if op not in SHAPES:
        raise ValueError("op: expected quantize, got %r" % op)
    from fray.bench import bench_impls
    for g, m, k in shapes or SHAPES[op]:
        gen = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
        for dtype in QDTYPES:
            inp = dict(x=x, dtype=dtype, granularity=g)
            bench_impls(recorder, op, "%s:%dx%d" % (g, m, k), "bf16->%s" % str(dtype).replace("torch.", ""),
                        impls(op, inp, compile_fn), nbytes(op, inp), graph=graph)
        if device == "cuda":
            torch.cuda.empty_cache()
