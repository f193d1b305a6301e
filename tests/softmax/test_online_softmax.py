"""fray.online_softmax: (softmax, row max, row log-sum-exp); reference, Triton, CUDA, errors."""
import math
import os

import numpy as np
import pytest
import torch

import fray
from fray.reference import softmax as ref
from fray.testing import assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
NEG_INF = float("-inf")


def _check(y, m, lse, x, dtype, what):
    """Against the float64 reference; all -inf rows: y NaN, max = lse = -inf."""
    ey, em, el = (t.to("cpu") for t in ref.online_softmax(x.to(torch.float64)))
    y, m, lse = (t.detach().to("cpu", torch.float64) for t in (y, m, lse))
    assert m.shape == x.shape[:-1] and lse.shape == x.shape[:-1], what
    dead = em == NEG_INF
    assert (m[dead] == NEG_INF).all() and (lse[dead] == NEG_INF).all(), "%s: -inf rows" % what
    assert torch.isnan(y[dead]).all(), "%s: -inf rows must be NaN" % what
    assert_close(y[~dead], ey[~dead], dtype, what + " y")
    assert_close(m[~dead], em[~dead], torch.float32, what + " max")
    assert_close(lse[~dead], el[~dead], torch.float32, what + " lse")


# ---------------------------------------------------------------------------------------------
# CPU

def test_reference_hand_computed():
    y, m, lse = ref.online_softmax(np.array([[0.0, math.log(3.0)], [2.0, 2.0], [NEG_INF, NEG_INF]]))
    np.testing.assert_allclose(y[:2], [[0.25, 0.75], [0.5, 0.5]], rtol=1e-15)
    assert np.isnan(y[2]).all()
    np.testing.assert_allclose(m, [math.log(3.0), 2.0, NEG_INF], rtol=1e-15)
    # lse = log(1 + 3) = log 4; log(2 e^2) = 2 + log 2; all -inf: -inf (torch.logsumexp)
    np.testing.assert_allclose(lse, [math.log(4.0), 2.0 + math.log(2.0), NEG_INF], rtol=1e-15)
    t = torch.tensor([[0.0, math.log(3.0)], [NEG_INF, NEG_INF]], dtype=torch.float64)
    _, tm, tl = ref.online_softmax(t)
    assert torch.allclose(tl, torch.logsumexp(t, -1), rtol=1e-15)
    assert torch.equal(tm, t.amax(-1))


def test_numpy_and_cpu_tensors():
    x = np.array([[0.0, math.log(3.0)]], dtype=np.float16)
    y, m, lse = fray.online_softmax(x)
    assert y.dtype == np.float16 and m.dtype == np.float32 and lse.dtype == np.float32
    np.testing.assert_allclose(lse, [math.log(4.0)], rtol=1e-3)
    g = torch.Generator().manual_seed(3)
    for dtype in DTYPES:
        xt = (torch.randn(2, 3, 50, generator=g) * 3).to(dtype)
        xt[1, 2] = NEG_INF
        out = torch.full_like(xt, float("nan"))
        y, m, lse = fray.online_softmax(xt, out=out)
        assert y is out and m.dtype == torch.float32 and m.shape == (2, 3)
        _check(y, m, lse, xt, dtype, "cpu %s" % dtype)
    y, m, lse = fray.online_softmax(torch.empty(3, 0))
    assert y.shape == (3, 0) and (m == NEG_INF).all() and (lse == NEG_INF).all()
    y, m, lse = fray.online_softmax(torch.tensor([0.0, math.log(3.0)]))  # 1-d: 0-d statistics
    assert m.shape == () and abs(lse.item() - math.log(4.0)) < 1e-6


@INTERPRETER
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (5, 300), (3, 40000)])
def test_triton_interpreter_vs_reference(dtype, rows, cols):
    from fray_triton import softmax as tsoftmax
    g = torch.Generator().manual_seed(rows * 7919 + cols)
    big = (torch.randn(rows, cols + 8, generator=g) * 3).to(dtype)
    x = big[:, :cols]  # strided rows
    if rows > 1:
        x[1] = NEG_INF
    y = torch.full_like(x, float("nan"))
    m = torch.full((rows,), float("nan"))
    lse = torch.full((rows,), float("nan"))
    tsoftmax.softmax(x, y, 1.0, x.stride(0), y.stride(0), rows, cols, row_max=m, row_lse=lse)
    _check(y, m, lse, x, dtype, "triton %dx%d" % (rows, cols))


def test_errors_name_the_argument():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="x: expected dtype"):
        fray.online_softmax(x.to(torch.float64))
    with pytest.raises(TypeError, match=r"out: expected dtype float32 \(that of x\), got bfloat16"):
        fray.online_softmax(x, out=torch.empty(4, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 8\)"):
        fray.online_softmax(x, out=torch.empty(8, 4))
    with pytest.raises(ValueError, match="x: the last dimension must be contiguous"):
        fray.online_softmax(torch.randn(8, 4).t())
    with pytest.raises(ValueError, match="x: expected at least 1 dimension"):
        fray.online_softmax(torch.tensor(0.5))
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.online_softmax(x, backend="triton")
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        fray.online_softmax((1.0, 2.0))


# ---------------------------------------------------------------------------------------------
# GPU

WIDTHS = [1, 3, 111, 4097, 16384, 32768, 65536, 131072, 262144]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", WIDTHS)
@pytest.mark.parametrize("rows", [64])  # single rows: test_softmax covers them (same kernels)
def test_gpu_vs_reference(cuda, backend, dtype, cols, rows):
    g = torch.Generator(device=cuda).manual_seed(cols * 17 + rows)
    x = (torch.randn(rows, cols, device=cuda, generator=g) * 3).to(dtype)
    if rows > 1:
        x[3] = NEG_INF
        x[5, : cols // 2] = NEG_INF
    out = torch.full_like(x, float("nan"))
    y, m, lse = fray.online_softmax(x, out=out, backend=backend)
    torch.cuda.synchronize()
    assert y is out and m.dtype == torch.float32 and lse.shape == (rows,)
    _check(y, m, lse, x, dtype, "%s %dx%d" % (backend, rows, cols))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cols", [8193, 32768])
def test_gpu_many_rows_persistent(cuda, backend, dtype, cols):
    # More rows than the Triton persistent kernel has programs: each program walks several rows.
    rows = 700
    g = torch.Generator(device=cuda).manual_seed(cols + 11)
    x = (torch.randn(rows, cols, device=cuda, generator=g) * 3).to(dtype)
    x[::97] = NEG_INF
    x[1::89, : cols // 3] = NEG_INF
    y, m, lse = fray.online_softmax(x, backend=backend)
    _check(y, m, lse, x, dtype, "%s %dx%d" % (backend, rows, cols))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [16388, 16392, 32776, 131080, 262152, 458756, 917504])
def test_gpu_wide_row_thresholds(cuda, backend, dtype, cols):
    # CUDA: the shared-memory kernel's boundaries (see test_softmax.THRESHOLD_WIDTHS); strided
    # 16-byte-aligned rows; fp32 458756 and 917504 stream, 16-bit 917504 is 8 blocks of 224 KB.
    g = torch.Generator(device=cuda).manual_seed(cols)
    big = (torch.randn(2, 3, cols + 16, device=cuda, generator=g) * 3).to(dtype)
    x = big[..., 8:8 + cols]
    x[0, 1] = NEG_INF
    x[1, 2, : cols // 2] = NEG_INF
    out = torch.full(x.shape, float("nan"), dtype=dtype, device=cuda)
    y, m, lse = fray.online_softmax(x, out=out, backend=backend)
    assert m.shape == (2, 3)
    _check(y, m, lse, x, dtype, "%s %s %d" % (backend, dtype, cols))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [3, 111, 4097, 32768, 65537, 131072, 300000])
def test_gpu_special_rows(cuda, backend, dtype, cols):
    # NaN / +inf / -inf rows through every kernel (register rows and clusters, shared memory,
    # streaming): y, row_max and row_lse match the reference's NaN / inf pattern and values; a
    # row holding a NaN has row_max NaN (a NaN-skipping max gives the largest other value).
    x = torch.randn(10, cols, device=cuda).to(dtype)
    at = [0, cols // 2, cols - 1]
    x[1, at[1]] = float("nan")                                   # one NaN
    x[2, at[2]] = float("nan"); x[2, at[0]] = float("inf")       # NaN and +inf
    x[3, at[1]] = float("inf")                                   # +inf
    x[4] = NEG_INF; x[4, at[2]] = float("nan")                   # -inf and a NaN
    x[5] = NEG_INF                                               # all -inf
    x[6, at[0]] = float("nan"); x[6, at[2]] = 1e4                # NaN first, a large max last
    x[7, :] = float("nan")                                       # all NaN
    y, m, lse = fray.online_softmax(x, backend=backend)
    ey, em, el = (t.to("cpu") for t in ref.online_softmax(x.to("cpu", torch.float64)))
    what = "%s %s %d" % (backend, dtype, cols)
    for got, exp, name in ((y, ey, "y"), (m, em, "row_max"), (lse, el, "row_lse")):
        got = got.to("cpu", torch.float64)
        nan = torch.isnan(exp)
        assert torch.equal(torch.isnan(got), nan), "%s: %s NaN pattern" % (what, name)
        fin = torch.isfinite(exp)
        assert torch.equal(got[~fin & ~nan], exp[~fin & ~nan]), "%s: %s infinities" % (what, name)
        assert_close(got[fin], exp[fin], dtype if name == "y" else torch.float32, what + " " + name)
    assert torch.equal(m.to("cpu", torch.float64).isnan(), x.to("cpu").isnan().any(-1)), what


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("cols", [65537, 300000])
def test_gpu_streaming_widths(cuda, backend, cols):
    # CUDA: 65537 (scalar loads, wider than a scalar cluster) and 300000 (> 16 x 16384) stream.
    big = torch.randn(3, 2, cols + 8, device=cuda, dtype=torch.bfloat16) * 3
    x = big[..., 8:]
    x[1, 0] = NEG_INF
    y, m, lse = fray.online_softmax(x, backend=backend)
    assert m.shape == (3, 2)
    _check(y, m, lse, x, torch.bfloat16, "%s %d" % (backend, cols))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_graph_compile_stream(cuda, backend):
    x = torch.randn(64, 32768, device=cuda, dtype=torch.float16)
    out = torch.empty_like(x)
    fray.online_softmax(x, out=out, backend=backend)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, m, lse = fray.online_softmax(x, out=out, backend=backend)
    for _ in range(2):
        x.copy_(torch.randn_like(x) * 4)
        out.fill_(float("nan"))
        m.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, m, lse, x, torch.float16, "%s graph" % backend)

    def f(x):
        # ops before and after the custom op, so that the compiler has something to fuse
        y, m, lse = fray.online_softmax(x * 2.0, backend=backend)
        return y, m, lse, lse - m

    compiled = torch.compile(f, fullgraph=True)
    cy, cm, cl, cd = compiled(x)
    _check(cy, cm, cl, x * 2.0, torch.float16, "%s compiled" % backend)
    for a, b in zip((cy, cm, cl, cd), f(x)):
        assert torch.equal(a, b)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        xs = torch.randn(512, 8192, device=cuda, dtype=torch.bfloat16)
        sy, sm, sl = fray.online_softmax(xs, backend=backend)
    stream.synchronize()
    _check(sy, sm, sl, xs, torch.bfloat16, "%s side stream" % backend)


@pytest.mark.gpu
def test_gpu_seed_alias(cuda):
    x = torch.randn(16, 1000, device=cuda, dtype=torch.bfloat16)
    y, m, lse = fray.jit_kernels.online_softmax(x)
    _check(y, m, lse, x, torch.bfloat16, "fray.jit_kernels.online_softmax")
