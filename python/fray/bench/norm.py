"""Norm-family benchmarks: Fray's backends and the peers a user would pick, in one process.

rmsnorm bytes:     read x + read w + write y          = 2·R·H·s(x) + H·s(w)
add_rmsnorm bytes: read x, r, w + write y, r          = 4·R·H·s(x) + H·s(w)
layernorm bytes:   read x + read w, b + write y       = 2·R·H·s(x) + 2·H·s(w)   (with bias)
Peers: torch.eager (the composite a model file writes), torch.compile (that composite compiled),
torch.builtin (F.rms_norm / F.layer_norm), liger (Liger-Kernel, when importable).
"""
import torch
import torch.nn.functional as F

import fray

SHAPES = [(r, h, torch.bfloat16) for r in (1, 128, 4096, 16384) for h in (4096, 8192)]
SHAPES.append((16384, 8192, torch.float16))
LAYERNORM_SHAPES = [(16384, 8192, torch.bfloat16), (4096, 8192, torch.bfloat16)]
OPS = ("rmsnorm", "add_rmsnorm", "layernorm")
EPS = 1e-6
LN_EPS = 1e-5  # torch's layer_norm default


def _eager_rmsnorm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def _eager_add_rmsnorm(x, r, w):
    s = x + r
    return _eager_rmsnorm(s, w), s


def _eager_layernorm(x, w, b):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    return ((xf - mean) * torch.rsqrt(var + LN_EPS) * w.float() + b.float()).to(x.dtype)


def _liger():
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception:  # not installed: the row is simply absent (the bundle carries the wheel)
        return None, None
    return LigerRMSNormFunction, LigerFusedAddRMSNormFunction


def _liger_layernorm():
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except Exception:  # not installed: the row is simply absent
        return None
    return LigerLayerNormFunction


def _impls(op, x, r, w):
    impls = {}
    if op == "layernorm":
        b = r[0]  # a [hidden] bias of w's dtype
        liger_ln = _liger_layernorm()
        out = torch.empty_like(x)
        impls["fray.cuda"] = lambda: fray.layernorm(x, w, b, LN_EPS, out=out, backend="cuda")
        impls["fray.triton"] = lambda: fray.layernorm(x, w, b, LN_EPS, out=out, backend="triton")
        impls["torch.eager"] = lambda: _eager_layernorm(x, w, b)
        compiled = torch.compile(_eager_layernorm)
        impls["torch.compile"] = lambda: compiled(x, w, b)
        impls["torch.builtin"] = lambda: F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)
        if liger_ln is not None:
            impls["liger"] = lambda: liger_ln.apply(x, w, b, LN_EPS)
        return impls
    liger_rms, liger_add = _liger()
    if op == "rmsnorm":
        out = torch.empty_like(x)
        impls["fray.cuda"] = lambda: fray.rmsnorm(x, w, EPS, out=out, backend="cuda")
        impls["fray.triton"] = lambda: fray.rmsnorm(x, w, EPS, out=out, backend="triton")
        impls["torch.eager"] = lambda: _eager_rmsnorm(x, w)
        compiled = torch.compile(_eager_rmsnorm)
        impls["torch.compile"] = lambda: compiled(x, w)
        impls["torch.builtin"] = lambda: F.rms_norm(x, (x.shape[-1],), w, EPS)
        if liger_rms is not None:
            impls["liger"] = lambda: liger_rms.apply(x, w, EPS, 0.0, "llama", False)
    else:
        # Out-of-place for every impl so that repeated calls see the same data.
        impls["fray.cuda"] = lambda: fray.add_rmsnorm(x, r, w, EPS, backend="cuda")
        impls["fray.triton"] = lambda: fray.add_rmsnorm(x, r, w, EPS, backend="triton")
        impls["torch.eager"] = lambda: _eager_add_rmsnorm(x, r, w)
        compiled = torch.compile(_eager_add_rmsnorm)
        impls["torch.compile"] = lambda: compiled(x, r, w)
        impls["torch.builtin"] = lambda: (lambda s: (F.rms_norm(s, (s.shape[-1],), w, EPS), s))(x + r)
        if liger_add is not None:
            impls["liger"] = lambda: liger_add.apply(x, r, w, EPS, 0.0, "llama", False)
    return impls


def _bytes(op, rows, hidden, x, w):
    n = rows * hidden * x.element_size()
    if op == "layernorm":
        return 2 * n + 2 * hidden * w.element_size()
    return (2 if op == "rmsnorm" else 4) * n + hidden * w.element_size()


def run(op, recorder, shapes=None, graph=True):
    if op not in OPS:
        raise ValueError("op: expected one of %s, got %r" % (", ".join(OPS), op))
    from fray.bench import bench_impls
    default = LAYERNORM_SHAPES if op == "layernorm" else SHAPES
    for rows, hidden, dtype in shapes or default:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, hidden, device="cuda", generator=g).to(dtype)
        r = torch.randn(rows, hidden, device="cuda", generator=g).to(dtype)
        w = torch.randn(hidden, device="cuda", generator=g).to(dtype)
        shape = "%dx%d" % (rows, hidden)
        nbytes = _bytes(op, rows, hidden, x, w)
        impls = _impls(op, x, r, w)
        bench_impls(recorder, op, shape, dtype, impls, nbytes, graph=graph)
