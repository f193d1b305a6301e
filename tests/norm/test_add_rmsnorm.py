"""fray.add_rmsnorm (fused residual add + RMSNorm) and the seed's jit_kernels.fused_rmsnorm."""
import numpy as np
import pytest
import torch

import fray
from fray.reference import norm as ref
from fray.testing import assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _ref(x, r, w, eps, offset=0.0):
    """(normed, sum) in float64, the sum rounded to x's dtype as the kernels store it."""
    return ref.add_rmsnorm(x.to(torch.float64), r.to(torch.float64), w.to(torch.float64), eps, offset,
                           round_sum=lambda s: s.to(x.dtype).to(torch.float64))


def test_reference_hand_computed():
    # x + r = [3, 4] -> normed [3, 4] / sqrt(12.5) * w
    y, s = ref.add_rmsnorm(np.array([[1.0, 1.0]]), np.array([[2.0, 3.0]]), np.array([1.0, 2.0]), 0.0)
    np.testing.assert_allclose(s, [[3.0, 4.0]], rtol=0)
    np.testing.assert_allclose(y, [[3.0 / 12.5 ** 0.5, 8.0 / 12.5 ** 0.5]], rtol=1e-15)


def test_sum_is_rounded_before_normalising():
    # bf16: 256 + 1 is not representable (spacing 2 above 256), so s rounds to 256 and the
    # normalised row must be computed from the rounded value.
    x = torch.tensor([[256.0, 1.0]], dtype=torch.bfloat16)
    r = torch.tensor([[1.0, 0.0]], dtype=torch.bfloat16)
    w = torch.ones(2, dtype=torch.bfloat16)
    y, s = fray.add_rmsnorm(x, r, w, eps=0.0)
    assert s.tolist() == [[256.0, 1.0]]
    rms = ((256.0 ** 2 + 1.0) / 2) ** 0.5
    assert_close(y, torch.tensor([[256.0 / rms, 1.0 / rms]], dtype=torch.float64), torch.bfloat16, "rounded sum")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_inplace_and_out_of_place(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 2, 40, generator=g).to(dtype)
    r = torch.randn(4, 2, 40, generator=g).to(dtype)
    w = torch.randn(40, generator=g).to(dtype)
    ey, es = _ref(x, r, w, 1e-6)
    y, s = fray.add_rmsnorm(x, r, w)
    assert_close(y, ey, dtype, "normed")
    assert_close(s, es, dtype, "sum")
    x2, r2 = x.clone(), r.clone()
    a, b = fray.add_rmsnorm(x2, r2, w, inplace=True)
    assert a is x2 and b is r2
    assert torch.equal(x2, y) and torch.equal(r2, s)


def test_numpy_and_seed_alias_cpu():
    x = np.array([[1.0, 1.0]], dtype=np.float32)
    r = np.array([[2.0, 3.0]], dtype=np.float32)
    y, s = fray.add_rmsnorm(x, r, np.array([1.0, 2.0], dtype=np.float32), eps=0.0)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_allclose(s, [[3.0, 4.0]])
    out = fray.jit_kernels.fused_rmsnorm(x, r, np.array([1.0, 2.0], dtype=np.float32), epsilon=0.0)
    np.testing.assert_allclose(r, [[3.0, 4.0]])  # residual updated in place
    np.testing.assert_allclose(out, y, rtol=1e-6)


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1",
                    reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,hidden", [(1, 1), (3, 7), (4, 64), (3, 200), (2, 16500)])
@pytest.mark.parametrize("inplace", [False, True])
def test_triton_interpreter_vs_reference(dtype, rows, hidden, inplace):
    from fray_triton import norm as tnorm
    g = torch.Generator().manual_seed(rows * 7919 + hidden)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    r = torch.randn(rows, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    ey, es = _ref(x, r, w, 1e-6)
    if inplace:
        y, s = x.clone(), r.clone()
        xin, rin = y, s
    else:
        y, s = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        xin, rin = x, r
    tnorm.add_rmsnorm(xin, rin, w, y, s, 1e-6, 0.0, hidden, hidden, hidden, hidden, rows, hidden)
    assert_close(y, ey, dtype, "triton normed")
    assert_close(s, es, dtype, "triton sum")


def test_errors_name_the_argument():
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8)
    with pytest.raises(TypeError, match="residual: expected dtype float32"):
        fray.add_rmsnorm(x, r.half(), w)
    with pytest.raises(ValueError, match=r"residual: expected shape \(4, 8\), got \(4, 9\)"):
        fray.add_rmsnorm(x, torch.randn(4, 9), w)
    with pytest.raises(TypeError, match="residual: expected a tensor on cpu"):
        fray.add_rmsnorm(x, torch.empty(4, 8, device="meta"), w)
    with pytest.raises(TypeError, match="inplace: expected a bool"):
        fray.add_rmsnorm(x, r, w, inplace=1)
    with pytest.raises(ValueError, match="rows overlap"):
        fray.add_rmsnorm(x, torch.randn(1, 8).expand(4, 8), w, inplace=True)


# ---------------------------------------------------------------------------------------------
# GPU

HIDDEN = [1, 3, 111, 128, 4096, 4097, 8192, 16384, 65536]
ROWS = [1, 7, 1024]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
def test_gpu_vs_reference(cuda, backend, dtype, hidden, rows):
    g = torch.Generator(device=cuda).manual_seed(hidden * 17 + rows)
    x = torch.randn(rows, hidden, device=cuda, generator=g).to(dtype)
    r = torch.randn(rows, hidden, device=cuda, generator=g).to(dtype)
    w = torch.randn(hidden, device=cuda, generator=g).to(dtype)
    ey, es = _ref(x, r, w, 1e-6)
    y, s = fray.add_rmsnorm(x, r, w, eps=1e-6, backend=backend)
    assert_close(y, ey, dtype, "%s normed %dx%d" % (backend, rows, hidden))
    assert_close(s, es, dtype, "%s sum %dx%d" % (backend, rows, hidden))
    # in place: x <- normed, residual <- sum
    a, b = fray.add_rmsnorm(x, r, w, eps=1e-6, inplace=True, backend=backend)
    assert a is x and b is r
    assert torch.equal(x, y) and torch.equal(r, s)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("offset", [8, 3])
def test_gpu_strided_fp32_weight_gemma(cuda, backend, offset):
    hidden = 4096
    big_x = torch.randn(9, hidden + 40, device=cuda, dtype=torch.bfloat16)
    big_r = torch.randn(9, hidden + 16, device=cuda, dtype=torch.bfloat16)
    x, r = big_x[:, offset:offset + hidden], big_r[:, offset:offset + hidden]
    w = torch.randn(hidden, device=cuda)
    ey, es = _ref(x, r, w, 1e-5, 1.0)
    y, s = fray.add_rmsnorm(x, r, w, eps=1e-5, backend=backend, weight_offset=1.0)
    assert_close(y, ey, torch.bfloat16, "normed")
    assert_close(s, es, torch.bfloat16, "sum")
    fray.add_rmsnorm(x, r, w, eps=1e-5, inplace=True, backend=backend, weight_offset=1.0)
    assert torch.equal(x, y) and torch.equal(r, s)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_cuda_graph_capture_and_replay(cuda, backend):
    x = torch.randn(1, 8192, device=cuda, dtype=torch.bfloat16)
    r = torch.randn(1, 8192, device=cuda, dtype=torch.bfloat16)
    w = torch.randn(8192, device=cuda, dtype=torch.bfloat16)
    xs, rs = x.clone(), r.clone()
    fray.add_rmsnorm(xs, rs, w, inplace=True, backend=backend)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fray.add_rmsnorm(xs, rs, w, inplace=True, backend=backend)
    for _ in range(3):
        x, r = torch.randn_like(x), torch.randn_like(r)
        xs.copy_(x)
        rs.copy_(r)
        graph.replay()
        torch.cuda.synchronize()
        ey, es = _ref(x, r, w, 1e-6)
        assert_close(xs, ey, torch.bfloat16, "graph normed")
        assert_close(rs, es, torch.bfloat16, "graph sum")


@pytest.mark.gpu
@pytest.mark.parametrize("inplace", [False, True])
def test_gpu_torch_compile_fullgraph(cuda, inplace):
    x = torch.randn(20, 512, device=cuda, dtype=torch.bfloat16)
    r = torch.randn(20, 512, device=cuda, dtype=torch.bfloat16)
    w = torch.randn(512, device=cuda, dtype=torch.bfloat16)

    def f(x, r, w):
        x = x + 0.5
        y, s = fray.add_rmsnorm(x, r, w, eps=1e-5, inplace=inplace)
        return y * 2.0, s

    ey, es = _ref(x + 0.5, r, w, 1e-5)
    y, s = torch.compile(f, fullgraph=True)(x, r.clone(), w)
    assert_close(y / 2.0, ey, torch.bfloat16, "compiled normed")
    assert_close(s, es, torch.bfloat16, "compiled sum")


@pytest.mark.gpu
def test_gpu_seed_fused_rmsnorm_and_stream(cuda):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.randn(64, 4096, device=cuda, dtype=torch.float16)
        r = torch.randn(64, 4096, device=cuda, dtype=torch.float16)
        w = torch.randn(4096, device=cuda, dtype=torch.float16)
        ey, es = _ref(x, r, w, 1e-5)
        out = fray.jit_kernels.fused_rmsnorm(x, r, w, epsilon=1e-5)
    stream.synchronize()
    assert_close(out, ey, torch.float16, "fused_rmsnorm out")
    assert_close(r, es, torch.float16, "fused_rmsnorm residual")
    y, s = fray.triton.add_rmsnorm(x, x, w, eps=1e-5)  # s = 2x exactly
    ey, es = _ref(x, x, w, 1e-5)
    assert_close(y, ey, torch.float16, "fray.triton.add_rmsnorm normed")
    assert_close(s, es, torch.float16, "fray.triton.add_rmsnorm sum")


def test_rmsnorm_kernels_compile_for_sm90a():
    """Both builds of each RMSNorm kernel (specialised on alignment, and the one that specialises
    on none, which unaligned calls take so that the row's reduction order never depends on which
    buffer is the output) through Triton's compiled path for sm_90a."""
    from fray.testing import compile_triton_sm90, sm90_spec
    io = {"X": "*bf16", "R": "*bf16", "W": "*fp32", "Y": "*bf16", "S": "*bf16", "eps": "fp32", "w_offset": "fp32"}
    aligned = ("X", "R", "W", "Y", "S", "stride_x", "stride_r", "stride_y", "stride_s")
    specs = []
    for name, extra in (("_rmsnorm_tile_kernel", dict(ROWS=1)), ("_rmsnorm_tile_kernel_any", dict(ROWS=1)),
                        ("_rmsnorm_loop_kernel", {}), ("_rmsnorm_loop_kernel_any", {})):
        block = 4096
        specs.append(sm90_spec("fray_triton.norm", name, io, dict(HAS_RESIDUAL=True, BLOCK_N=block, **extra),
                               num_warps=8, divisible=() if name.endswith("_any") else aligned))
    assert all(r["spills"] == 0 for r in compile_triton_sm90(specs))
