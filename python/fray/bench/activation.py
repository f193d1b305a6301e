"""Activation-family benchmarks: Fray's backends and the peers a user would pick, in one process.

Shapes are ROWSxD of the output; the input is the fused x = [ROWS, 2 D] (gate | up halves).
bytes (silu_mul and gelu_mul): read gate + up, write out = 2·R·D·s + R·D·s = 3·R·D·s
gelu_mul: the plain shape string is the tanh form, ":erf" the exact form; ":graph" is CUDA-graph
replay (shapes whose fastest impl takes under 50 us).
Peers: torch.eager (the composite a model file writes: F.silu(g) * u, F.gelu(g, approximate) * u
on the halves of x), torch.compile (that composite compiled), liger (Liger-Kernel when importable:
LigerSiLUMulFunction / LigerGELUMulFunction take gate and up as two contiguous tensors, prepared
outside the timing; liger.gate_up is LigerFusedGateUpSiLUMulFunction on x itself). torch has no
fused built-in for either op.
"""
import torch
import torch.nn.functional as F

import fray

# (rows, d, dtype, also time gelu's erf form)
SHAPES = [(16384, 8192, torch.bfloat16, True), (128, 8192, torch.bfloat16, False)]


def _eager_silu_mul(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def _eager_gelu_mul(x, approximate):
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate=approximate) * x[..., d:]


def _liger():
    """{name: autograd Function} of the Liger kernels that exist in the installed version."""
    found = {}
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        found["silu"] = LigerSiLUMulFunction
    except Exception:  # not installed: the row is simply absent (the bundle carries the wheel)
        pass
    try:
        from liger_kernel.ops.swiglu import LigerFusedGateUpSiLUMulFunction
        found["silu_gate_up"] = LigerFusedGateUpSiLUMulFunction
    except Exception:  # older Liger: no fused gate_up variant
        pass
    try:
        from liger_kernel.ops.geglu import LigerGELUMulFunction
        found["gelu_tanh"] = LigerGELUMulFunction
    except Exception:
        pass
    return found


def _impls(op, x, approximate):
    d = x.shape[-1] // 2
    out = torch.empty(x.shape[:-1] + (d,), dtype=x.dtype, device=x.device)
    # Liger takes gate and up as separate contiguous tensors (made here, not timed).
    a, b = x[..., :d].contiguous(), x[..., d:].contiguous()
    liger = _liger()
    impls = {}
    if op == "silu_mul":
        impls["fray.cuda"] = lambda: fray.silu_mul(x, out=out, backend="cuda")
        impls["fray.triton"] = lambda: fray.silu_mul(x, out=out, backend="triton")
        impls["torch.eager"] = lambda: _eager_silu_mul(x)
        compiled = torch.compile(_eager_silu_mul)
        impls["torch.compile"] = lambda: compiled(x)
        if "silu" in liger:
            impls["liger"] = lambda: liger["silu"].apply(a, b)
        if "silu_gate_up" in liger:
            impls["liger.gate_up"] = lambda: liger["silu_gate_up"].apply(x)
    else:
        impls["fray.cuda"] = lambda: fray.gelu_mul(x, approximate=approximate, out=out, backend="cuda")
        impls["fray.triton"] = lambda: fray.gelu_mul(x, approximate=approximate, out=out, backend="triton")
        impls["torch.eager"] = lambda: _eager_gelu_mul(x, approximate)
        compiled = torch.compile(_eager_gelu_mul)
        impls["torch.compile"] = lambda: compiled(x, approximate)
        if approximate == "tanh" and "gelu_tanh" in liger:
            impls["liger"] = lambda: liger["gelu_tanh"].apply(a, b)
    return impls


def _bytes(rows, d, x):
    return 3 * rows * d * x.element_size()


def run(op, recorder, shapes=None, graph=True):
    if op not in ("silu_mul", "gelu_mul"):
        raise ValueError("op: expected silu_mul or gelu_mul, got %r" % op)
    from fray.bench import bench_impls
    # --shapes gives (rows, d, dtype): time gelu's erf form for those too.
    todo = SHAPES if shapes is None else [(r, d, t, True) for r, d, t in shapes]
    for rows, d, dtype, with_erf in todo:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, 2 * d, device="cuda", generator=g).to(dtype)
        nbytes = _bytes(rows, d, x)
        forms = [("", "none")] if op == "silu_mul" else [("", "tanh")] + ([(":erf", "none")] if with_erf else [])
        for form, approximate in forms:
            shape = "%dx%d%s" % (rows, d, form)
            impls = _impls(op, x, approximate)
            bench_impls(recorder, op, shape, dtype, impls, nbytes, graph=graph)
