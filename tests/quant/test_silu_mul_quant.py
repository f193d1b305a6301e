"""fray.silu_mul_quant: the CPU op against the unfused silu_mul -> quantize pair (exact), the
Triton kernels under the interpreter (int8: the tile and the looped wide row, split and fused
layouts, static scales) against the float64 value within the op's roundings, the error
contract; on the GPU, int8 and e4m3 from bf16 / fp16 / fp32 at decode and prefill shapes, wide
rows, static scales, strided rows, out=, NaN rows, CUDA graphs and torch.compile."""
import os

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


def _check(q, s, x, up=None, static=None, what=""):
    Q.assert_fused_quant_close(q, s, Q.fused_quant_reference("silu_mul", x, up=up), x.dtype, static=static, what=what)


def _triton(x, up=None, dtype=I8, scale=None):
    from fray_triton import silu_mul_quant as tk
    d = x.shape[-1] if up is not None else x.shape[-1] // 2
    rows = x.numel() // x.shape[-1]
    q = torch.full(tuple(x.shape[:-1]) + (d,), 99, dtype=torch.int8).to(dtype)
    s = scale if scale is not None else torch.full(tuple(x.shape[:-1]) + (1,), -1.0)
    sx = x.stride(-2) if x.dim() > 1 else x.shape[-1]
    tk.silu_mul_quant(x, x.narrow(-1, d, d) if up is None else up, q, s, Q.QMAX[dtype], dtype == E4M3,
                      scale is not None, sx, sx if up is None else up.stride(-2), d,
                      0 if scale is not None and scale.numel() == 1 else 1, rows, d)
    return q, s


@pytest.mark.parametrize("dtype", [I8, E4M3])
@pytest.mark.parametrize("xdt", [BF16, FP16, FP32])
def test_cpu_is_silu_mul_then_quantize(dtype, xdt):
    x = _x((2, 3, 400), xdt)
    q, s = fray.silu_mul_quant(x, dtype=dtype)
    assert q.shape == (2, 3, 200) and q.dtype == dtype and s.shape == (2, 3, 1)
    eq, es = fray.quantize(fray.silu_mul(x).reshape(6, 200), dtype, granularity="token")
    assert torch.equal(q.reshape(6, 200).float(), eq.float()) and torch.equal(s.reshape(6, 1), es)
    g, u = _x((5, 33), xdt, seed=1), _x((5, 33), xdt, seed=2)
    q, s = fray.silu_mul_quant(g, u, dtype=dtype)
    eq, es = fray.quantize(fray.silu_mul(g, u), dtype, granularity="token")
    assert torch.equal(q.float(), eq.float()) and torch.equal(s, es)
    st = torch.tensor([0.05])
    q, s = fray.silu_mul_quant(g, u, dtype=dtype, scale=st)
    assert s is st and torch.equal(q.float(), fray.quantize(fray.silu_mul(g, u), dtype, granularity="tensor",
                                                            scale=st.reshape(()))[0].float())


@INTERPRETER
@pytest.mark.parametrize("xdt", [BF16, FP16, FP32])
@pytest.mark.parametrize("rows,d", [(1, 1), (5, 300), (70, 64), (2, 16400)])
def test_triton_int8(xdt, rows, d):
    x = _x((rows, 2 * d), xdt, seed=d)
    if rows > 2:
        x[1] = 0.0
    q, s = _triton(x)
    _check(q, s, x, what="fused %dx%d" % (rows, d))
    if rows > 2:
        assert s[1].item() == 1.0 and not q[1].any()
    g, u = _x((rows, d), xdt, seed=1), _x((rows, d), xdt, seed=2)
    q, s = _triton(g, u)
    _check(q, s, g, u, what="split %dx%d" % (rows, d))


@INTERPRETER
@pytest.mark.parametrize("d", [300, 16400])
def test_triton_static(d):
    x = _x((3, 2 * d), BF16)
    for st in (torch.tensor([0.004]), torch.tensor([[0.01], [0.02], [0.5]])):
        q, s = _triton(x, scale=st)
        assert s is st
        _check(q, s, x, static=st, what="static %s" % (tuple(st.shape),))


def test_bench_peers_compute_the_op():
    from fray.bench import quant as bq
    inp = bq.fused_inputs("silu_mul_quant", "fused", 8, 256, device="cpu")
    want = fray.silu_mul_quant(inp["x"])
    for name, fn in bq.fused_impls("silu_mul_quant", inp, I8, compile_fn=lambda f, fullgraph: f).items():
        if name == "fray.triton":
            continue
        q, sc = fn()
        assert (q.float() - want[0].float()).abs().max() <= 1, name
        assert torch.allclose(sc.reshape(-1), want[1].reshape(-1), rtol=2 ** -7), name
    assert bq.fused_bytes("silu_mul_quant", inp) == 8 * 512 * 2 + 8 * 256 + 4 * 8


def test_errors():
    x = _x((4, 64), BF16)
    with pytest.raises(TypeError, match="dtype: expected torch.int8 or torch.float8_e4m3fn"):
        fray.silu_mul_quant(x, dtype=BF16)
    with pytest.raises(ValueError, match="the last dimension holds the gate and up halves"):
        fray.silu_mul_quant(x[:, :63])
    with pytest.raises(ValueError, match="up: expected shape"):
        fray.silu_mul_quant(x, x[:, :32])
    with pytest.raises(ValueError, match="out: expected shape"):
        fray.silu_mul_quant(x, out=torch.empty(4, 64, dtype=I8))
    with pytest.raises(ValueError, match="scale: expected one static scale"):
        fray.silu_mul_quant(x, scale=torch.ones(4, 32))
    with pytest.raises(ValueError, match="backend"):
        fray.silu_mul_quant(x, backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [I8, E4M3], ids=["int8", "e4m3"])
@pytest.mark.parametrize("xdt", [BF16, FP16, FP32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shape", [(1, 2 * 14336), (7, 2000), (128, 2 * 11008), (3, 2 * 20000), (2, 5, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_matches_reference(cuda, dtype, xdt, shape):
    x = _x(shape, xdt, seed=shape[-1], device=cuda)
    q, s = fray.silu_mul_quant(x, dtype=dtype)
    d = shape[-1] // 2
    assert q.shape == tuple(shape[:-1]) + (d,) and q.dtype == dtype and s.shape == tuple(shape[:-1]) + (1,)
    _check(q, s, x, what="gpu %s" % (shape,))
    eq, es = fray.quantize(fray.silu_mul(x, backend="triton").reshape(-1, d), dtype, granularity="token")
    diff = (q.reshape(eq.shape).float() - eq.float()).abs()
    assert (diff <= (1 if dtype == I8 else 2.0 ** -3 * eq.float().abs() + 2.0 ** -9)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [I8, E4M3], ids=["int8", "e4m3"])
def test_gpu_split_static_strided_out_nan(cuda, dtype):
    g, u = _x((9, 5000), BF16, seed=1, device=cuda), _x((9, 5000), BF16, seed=2, device=cuda)
    q, s = fray.silu_mul_quant(g, u, dtype=dtype)
    _check(q, s, g, u, what="split")
    st = torch.tensor(0.02, device=cuda)
    q, s = fray.silu_mul_quant(g, u, dtype=dtype, scale=st)
    assert s is st
    _check(q, s, g, u, static=st, what="static")
    buf = _x((9, 2 * 5000 + 64), BF16, seed=3, device=cuda)
    xs = buf[:, 32:32 + 10000]
    out = torch.empty(9, 5000, dtype=dtype, device=cuda)
    q, s = fray.silu_mul_quant(xs, dtype=dtype, out=out)
    assert q is out
    _check(q, s, xs, what="strided")
    # NaN is left out of a row's amax (fray.quantize's rule): row 1's scale is that of the same row
    # with a 0 there, its other outputs too, and the NaN itself becomes 0 (int8) or NaN (e4m3); a
    # row with no finite value gets scale 1
    xn = _x((3, 1024), BF16, device=cuda)
    x0 = xn.clone()
    xn[1, 3] = float("nan")
    x0[1, 3] = 0.0
    xn[2] = float("nan")
    q, s = fray.silu_mul_quant(xn, dtype=dtype)
    q0, s0 = fray.silu_mul_quant(x0, dtype=dtype)
    assert s[1].item() == s0[1].item() and s[2].item() == 1.0
    keep = torch.arange(512, device=cuda) != 3
    assert torch.equal(q[1, keep].float(), q0[1, keep].float())
    assert q[1, 3].float().item() == 0.0 if dtype == I8 else torch.isnan(q[1, 3].float()).item()
    _check(q[[0]], s[[0]], xn[[0]])


@pytest.mark.gpu
def test_gpu_graph_capture_and_compile(cuda):
    x = _x((16, 2 * 14336), BF16, device=cuda)
    q0, s0 = fray.silu_mul_quant(x, dtype=E4M3)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        qg, sg = fray.silu_mul_quant(x, dtype=E4M3)
    g.replay()
    assert torch.equal(qg.float(), q0.float()) and torch.equal(sg, s0)

    @torch.compile(fullgraph=True)
    def f(x):
        q, s = fray.silu_mul_quant(x + 1, dtype=torch.int8)
        return q, s * 2

    qc, sc = f(x)
    qe, se = fray.silu_mul_quant(x + 1)
    assert torch.equal(qc, qe) and torch.equal(sc, se * 2)


def test_kernels_compile_for_sm90a():
    """The two kernels through Triton's compiled path for sm_90a (no GPU): the interpreter lets a
    kernel read any module global, the compiler only tl.constexpr ones (a plain SILU code passed
    every CPU test and failed every GPU one)."""
    from fray.testing import compile_triton_sm90, sm90_spec
    types = {"G": "*bf16", "U": "*bf16", "Q": "*i8", "S": "*fp32", "qmax": "fp32"}
    specs = [sm90_spec("fray_triton.silu_mul_quant", "_tile_kernel", types,
                       dict(STATIC=False, FP8=False, BLOCK_N=1024, ROWS=4), num_warps=4),
             sm90_spec("fray_triton.silu_mul_quant", "_loop_kernel", dict(types, Q="*fp8e4nv"),
                       dict(STATIC=False, FP8=True, BLOCK_N=4096), num_warps=8)]
    assert all(r["spills"] == 0 for r in compile_triton_sm90(specs))
