"""fray.rmsnorm_quant: the CPU op against the unfused rmsnorm -> quantize pair (exact), the Triton
kernels under the interpreter (int8: the tile and the looped wide row, residual, static scales)
against the float64 value within the op's roundings, the error contract; on the GPU, int8 and
e4m3 from bf16 / fp16 / fp32 at decode and prefill shapes, wide rows, residual in place, static
scales, strided rows, out=, NaN rows, CUDA graphs and torch.compile."""
import os

import numpy as np
import pytest
import torch

import fray
from fray.ops import quant as Q

INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
I8, E4M3 = torch.int8, torch.float8_e4m3fn
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def _x(shape, dtype, seed=0, scale=3.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


def _w(h, dtype, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(h, generator=g) + 0.5).to(dtype).to(device)


def _check(q, s, x, w, residual=None, static=None, eps=1e-6, weight_offset=0.0, what=""):
    y = Q.fused_quant_reference("rmsnorm", x, weight=w, residual=residual, eps=eps, weight_offset=weight_offset)
    Q.assert_fused_quant_close(q, s, y, x.dtype, static=static, what=what)


def _triton(x, w, dtype=I8, residual=None, scale=None, eps=1e-6, weight_offset=0.0):
    """The Triton launcher on CPU tensors (the interpreter), outputs poisoned first."""
    from fray_triton import rmsnorm_quant as tk
    h = x.shape[-1]
    rows = x.numel() // h
    q = torch.full(x.shape, 99, dtype=torch.int8).to(dtype)
    s = scale if scale is not None else torch.full(tuple(x.shape[:-1]) + (1,), -1.0)
    s_stride = 0 if scale is not None and scale.numel() == 1 else 1
    tk.rmsnorm_quant(x, residual, w, q, s, eps, weight_offset, Q.QMAX[dtype], dtype == E4M3, scale is not None,
                     x.stride(-2) if x.dim() > 1 else h, 0 if residual is None else residual.stride(-2), h, s_stride,
                     rows, h)
    return q, s


# ---------------------------------------------------------------------------------------------
# CPU: the op (the float64 reference) is the unfused pair, exactly

@pytest.mark.parametrize("dtype", [I8, E4M3])
@pytest.mark.parametrize("xdt", [BF16, FP16, FP32])
def test_cpu_is_rmsnorm_then_quantize(dtype, xdt):
    x, w = _x((2, 3, 200), xdt), _w(200, xdt)
    q, s = fray.rmsnorm_quant(x, w, 1e-5, dtype=dtype, weight_offset=1.0)
    assert q.shape == x.shape and q.dtype == dtype and s.shape == (2, 3, 1) and s.dtype == FP32
    y = fray.rmsnorm(x, w, 1e-5, weight_offset=1.0)
    eq, es = fray.quantize(y.reshape(6, 200), dtype, granularity="token")
    assert torch.equal(q.reshape(6, 200).float(), eq.float()) and torch.equal(s.reshape(6, 1), es)
    r = _x((2, 3, 200), xdt, seed=5)
    r0 = r.clone()
    q, s = fray.rmsnorm_quant(x, w, dtype=dtype, residual=r)
    ys, ss = fray.add_rmsnorm(x, r0, w)
    assert torch.equal(r, ss)  # the rounded sum, written into residual
    eq, es = fray.quantize(ys.reshape(6, 200), dtype, granularity="token")
    assert torch.equal(q.reshape(6, 200).float(), eq.float()) and torch.equal(s.reshape(6, 1), es)


def test_cpu_static_scales_and_out():
    x, w = _x((4, 64), BF16), _w(64, BF16)
    y = fray.rmsnorm(x, w)
    st = torch.tensor(0.01)
    out = torch.empty(4, 64, dtype=I8)
    q, s = fray.rmsnorm_quant(x, w, scale=st, out=out)
    assert q is out and s is st
    assert torch.equal(q, fray.quantize(y, granularity="tensor", scale=st)[0])  # saturates at +-127
    rows = torch.tensor([[0.02], [0.03], [0.5], [1.0]])
    q, s = fray.rmsnorm_quant(x, w, scale=rows)
    assert s is rows and torch.equal(q, fray.quantize(y, granularity="token", scale=rows)[0])


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernels under the interpreter (int8; its float8 conversion does not round as
# the hardware does)

@INTERPRETER
@pytest.mark.parametrize("xdt", [BF16, FP16, FP32])
@pytest.mark.parametrize("rows,h", [(1, 1), (5, 300), (70, 64), (2, 16400)])
def test_triton_int8(xdt, rows, h):
    x, w = _x((rows, h), xdt, seed=h), _w(h, xdt)
    if rows > 2:
        x[1] = 0.0  # a zero row: scale 1, q 0
    q, s = _triton(x, w, weight_offset=0.5)
    _check(q, s, x, w, weight_offset=0.5, what="triton %dx%d" % (rows, h))
    if rows > 2:
        assert s[1].item() == 1.0 and not q[1].any()


@INTERPRETER
@pytest.mark.parametrize("h", [300, 16400])
def test_triton_residual_and_static(h):
    x, w, r = _x((3, h), BF16), _w(h, BF16), _x((3, h), BF16, seed=7)
    r0 = r.clone()
    q, s = _triton(x, w, residual=r)
    assert torch.equal(r, (x.float() + r0.float()).to(BF16))
    _check(q, s, x, w, residual=r0, what="residual h=%d" % h)
    for st in (torch.tensor([0.004]), torch.tensor([[0.01], [0.02], [0.5]])):
        q, s = _triton(x, w, scale=st)
        assert s is st
        _check(q, s, x, w, static=st, what="static %s h=%d" % (tuple(st.shape), h))


@INTERPRETER
def test_triton_nan_row():
    x, w = _x((3, 128), FP32), _w(128, FP32)
    x[1, 5] = float("nan")
    q, s = _triton(x, w)
    assert s[1].item() == 1.0 and not q[1].any()  # a NaN row: amax over no finite values, q 0
    _check(q[[0, 2]], s[[0, 2]], x[[0, 2]], w)


def test_bench_peers_compute_the_op():
    """bench/quant's peers (the torch composites, fray unfused) give the op's result on the CPU: q
    within one step (the composite's fp32 rstd is not the reference's float64 one), the residual
    sum exactly."""
    from fray.bench import quant as bq
    assert bq.parse_shapes("rmsnorm_quant", "plain:8x64,residual:4x32") == [("plain", 8, 64), ("residual", 4, 32)]
    with pytest.raises(ValueError, match="<plain|residual>"):
        bq.parse_shapes("rmsnorm_quant", "fused:8x64")
    for variant in ("plain", "residual"):
        inp = bq.fused_inputs("rmsnorm_quant", variant, 8, 256, device="cpu")
        r0 = None if inp["r"] is None else inp["r"].clone()
        want = fray.rmsnorm_quant(inp["x"], inp["w"], residual=None if r0 is None else r0.clone())
        for name, fn in bq.fused_impls("rmsnorm_quant", inp, I8, compile_fn=lambda f, fullgraph: f).items():
            if name == "fray.triton":
                continue  # backend="triton" on CPU tensors: refused (the GPU benchmark runs it)
            if inp["r"] is not None:
                inp["r"].copy_(r0)
            got = fn()
            q, sc = (got[0], got[1]) if isinstance(got, tuple) else got
            assert (q.float() - want[0].float()).abs().max() <= 1, name
            assert torch.allclose(sc.reshape(-1), want[1].reshape(-1), rtol=2 ** -7), name
    assert bq.fused_bytes("rmsnorm_quant", inp) == 8 * 256 * 2 * 3 + 8 * 256 + 4 * 8


# ---------------------------------------------------------------------------------------------
# error contract

def test_errors():
    x, w = _x((4, 64), BF16), _w(64, BF16)
    with pytest.raises(TypeError, match="dtype: expected torch.int8 or torch.float8_e4m3fn"):
        fray.rmsnorm_quant(x, w, dtype=torch.float16)
    with pytest.raises(ValueError, match="residual: must not be x itself"):
        fray.rmsnorm_quant(x, w, residual=x)
    with pytest.raises(TypeError, match="residual: expected dtype bfloat16"):
        fray.rmsnorm_quant(x, w, residual=x.float())
    with pytest.raises(TypeError, match="scale: expected dtype float32"):
        fray.rmsnorm_quant(x, w, scale=torch.tensor(1.0, dtype=BF16))
    with pytest.raises(ValueError, match=r"scale: expected one static scale \(\[\] or \[1\]\) or a contiguous one"):
        fray.rmsnorm_quant(x, w, scale=torch.ones(4))
    with pytest.raises(TypeError, match="out: expected dtype int8"):
        fray.rmsnorm_quant(x, w, out=torch.empty(4, 64, dtype=E4M3))
    with pytest.raises(ValueError, match="out: expected shape"):
        fray.rmsnorm_quant(x, w, out=torch.empty(4, 63, dtype=I8))
    with pytest.raises(ValueError, match="weight: expected shape"):
        fray.rmsnorm_quant(x, w[:63])
    with pytest.raises(ValueError, match="eps"):
        fray.rmsnorm_quant(x, w, -1.0)
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        fray.rmsnorm_quant(x.numpy() if x.dtype != BF16 else x.float().numpy(), w)
    with pytest.raises(ValueError, match="backend"):
        fray.rmsnorm_quant(x, w, backend="cuda")


# ---------------------------------------------------------------------------------------------
# GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [I8, E4M3], ids=["int8", "e4m3"])
@pytest.mark.parametrize("xdt", [BF16, FP16, FP32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shape", [(1, 4096), (7, 1000), (128, 8192), (3, 20000), (2, 5, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_matches_reference(cuda, dtype, xdt, shape):
    x, w = _x(shape, xdt, seed=shape[-1], device=cuda), _w(shape[-1], xdt, device=cuda)
    q, s = fray.rmsnorm_quant(x, w, dtype=dtype)
    assert q.shape == x.shape and q.dtype == dtype and s.shape == tuple(shape[:-1]) + (1,) and q.is_cuda
    _check(q, s, x, w, what="gpu %s" % (shape,))
    # beside the unfused pair on the same backend: q within one step, scales within one ulp of x's dtype
    eq, es = fray.quantize(fray.rmsnorm(x, w, backend="triton").reshape(-1, shape[-1]), dtype, granularity="token")
    d = (q.reshape(eq.shape).float() - eq.float()).abs()
    assert (d <= (1 if dtype == I8 else 2.0 ** -3 * eq.float().abs() + 2.0 ** -9)).all()
    assert torch.allclose(s.reshape(es.shape), es, rtol=Q._ULP_REL[xdt] + 1e-5, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [I8, E4M3], ids=["int8", "e4m3"])
@pytest.mark.parametrize("h", [4096, 20000])
def test_gpu_residual_static_strided_out(cuda, dtype, h):
    x, w, r = _x((9, h), BF16, device=cuda), _w(h, BF16, device=cuda), _x((9, h), BF16, seed=3, device=cuda)
    r0 = r.clone()
    q, s = fray.rmsnorm_quant(x, w, dtype=dtype, residual=r)
    assert torch.equal(r, (x.float() + r0.float()).to(BF16))
    _check(q, s, x, w, residual=r0, what="residual")
    st = torch.tensor(0.01, device=cuda)
    q, s = fray.rmsnorm_quant(x, w, dtype=dtype, scale=st)
    assert s is st
    _check(q, s, x, w, static=st, what="static")
    wide = _x((9, h + 64), BF16, seed=4, device=cuda)
    xs = wide[:, 32:32 + h]  # rows of a wider buffer, 64-byte-offset base
    out = torch.empty(9, h, dtype=dtype, device=cuda)
    q, s = fray.rmsnorm_quant(xs, w, dtype=dtype, out=out)
    assert q is out
    _check(q, s, xs, w, what="strided")


@pytest.mark.gpu
def test_gpu_nan_and_zero_rows(cuda):
    x, w = _x((4, 512), BF16, device=cuda), _w(512, BF16, device=cuda)
    x[1, 7] = float("nan")
    x[2] = 0.0
    for dtype in (I8, E4M3):
        q, s = fray.rmsnorm_quant(x, w, dtype=dtype)
        assert s[1].item() == 1.0 and s[2].item() == 1.0
        assert (q[1].float().isnan().all() if dtype == E4M3 else not q[1].any()) and not q[2].float().any()
        _check(q[[0, 3]], s[[0, 3]], x[[0, 3]], w)


@pytest.mark.gpu
def test_gpu_graph_capture_and_compile(cuda):
    x, w, r = _x((16, 4096), BF16, device=cuda), _w(4096, BF16, device=cuda), _x((16, 4096), BF16, seed=2,
                                                                                 device=cuda)
    q0, s0 = fray.rmsnorm_quant(x, w, dtype=E4M3)  # warm-up: the plan and the kernel
    rr = r.clone()
    fray.rmsnorm_quant(x, w, residual=rr)
    g = torch.cuda.CUDAGraph()
    rg = r.clone()
    with torch.cuda.graph(g):
        qg, sg = fray.rmsnorm_quant(x, w, dtype=E4M3)
        qr, sr = fray.rmsnorm_quant(x, w, residual=rg)
    rg.copy_(r)
    g.replay()
    assert torch.equal(qg.float(), q0.float()) and torch.equal(sg, s0)
    q1, s1 = fray.rmsnorm_quant(x, w, residual=r.clone())
    assert torch.equal(qr, q1) and torch.equal(sr, s1) and torch.equal(rg, (x.float() + r.float()).to(BF16))

    @torch.compile(fullgraph=True)
    def f(x, w):
        q, s = fray.rmsnorm_quant(x * 2, w, dtype=torch.int8)
        return q, s * 2

    qc, sc = f(x, w)
    qe, se = fray.rmsnorm_quant(x * 2, w)
    assert torch.equal(qc, qe) and torch.equal(sc, se * 2)
