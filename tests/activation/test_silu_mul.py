"""fray.silu_mul: reference, Triton (interpreter on CPU), CUDA (GPU), error contract."""
import math
import os

import numpy as np
import pytest
import torch

import fray
from fray import backend as B
from fray.reference import activation as ref
from fray.testing import assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _ref(gate, up):
    return ref.silu_mul(gate.to(torch.float64), up.to(torch.float64))


def _ref_fused(x):
    return _ref(*ref.split(x))


# ---------------------------------------------------------------------------------------------
# CPU: reference against hand-computed values

def test_reference_hand_computed():
    # silu(g) = g / (1 + e^-g): silu(0) = 0, silu(1) = 1 / (1 + 1/e), silu(-1) = -1 / (1 + e).
    np.testing.assert_allclose(ref.silu(np.array([0.0, 1.0, -1.0])), [0.0, 0.7310585786, -0.2689414214],
                               rtol=1e-9, atol=0)
    np.testing.assert_allclose(ref.silu_mul(np.array([1.0, 2.0]), np.array([3.0, -0.5])),
                               [3 * 0.7310585786, -0.5 * 2 / (1 + math.exp(-2.0))], rtol=1e-10)
    # torch tensors (the GPU tests' path) give the same values
    t = ref.silu(torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64))
    np.testing.assert_allclose(t.numpy(), [0.0, 0.7310585786, -0.2689414214], rtol=1e-9, atol=0)
    g, u = ref.split(np.arange(6.0).reshape(1, 6))
    np.testing.assert_array_equal(g, [[0.0, 1.0, 2.0]])
    np.testing.assert_array_equal(u, [[3.0, 4.0, 5.0]])


def test_numpy_in_numpy_out():
    x = np.array([[0.0, 1.0, 2.0, 3.0], [1.0, -1.0, 0.5, 0.5]], dtype=np.float32)
    y = fray.silu_mul(x)  # gate = x[:, :2], up = x[:, 2:]
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (2, 2)
    np.testing.assert_allclose(y, [[0.0, 3 * 0.7310585786], [0.5 * 0.7310585786, 0.5 * -0.2689414214]], rtol=1e-6)
    y2 = fray.silu_mul(x[:, :2].copy(), x[:, 2:].copy())
    np.testing.assert_array_equal(y2, y)
    out = np.full((2, 2), np.nan, dtype=np.float32)
    assert fray.silu_mul(x, out=out) is out
    np.testing.assert_array_equal(out, y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_tensor_runs_reference(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 66, generator=g).to(dtype)
    y = fray.silu_mul(x)
    assert y.dtype == dtype and y.shape == (5, 3, 33) and y.device.type == "cpu"
    assert_close(y, _ref_fused(x), dtype, "cpu reference")
    gate, up = x[..., :33], x[..., 33:]
    assert torch.equal(fray.silu_mul(gate, up), y)  # two-tensor form, strided views
    out = torch.full((5, 3, 33), float("nan")).to(dtype)
    assert fray.silu_mul(x, out=out, backend="reference") is out
    assert torch.equal(out, y)
    empty = fray.silu_mul(torch.empty(0, 8, dtype=dtype))
    assert empty.shape == (0, 4) and empty.dtype == dtype


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernel under TRITON_INTERPRET=1 (set by the Bazel CPU target)

def _triton(gate, up, sg, su, rows, d, dtype):
    from fray_triton import activation as tact
    out = torch.full((rows, d), float("nan")).to(dtype)
    tact.silu_mul(gate, up, out, sg, su, d, rows, d)
    return out


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,d", [(1, 1), (3, 3), (4, 33), (2, 128), (5, 300), (2, 4097), (1, 8192)])
def test_triton_interpreter_vs_reference(dtype, rows, d):
    g = torch.Generator().manual_seed(rows * 100003 + d)
    x = (3 * torch.randn(rows, 2 * d, generator=g)).to(dtype)
    # one-tensor form: gate = x, up = x[:, d:], both with x's row stride
    y = _triton(x, x[:, d:], 2 * d, 2 * d, rows, d, dtype)
    assert_close(y, _ref_fused(x), dtype, "triton fused %dx%d" % (rows, d))
    # two-tensor form
    gate, up = x[:, :d].contiguous(), x[:, d:].contiguous()
    assert_close(_triton(gate, up, d, d, rows, d, dtype), _ref(gate, up), dtype, "triton two %dx%d" % (rows, d))


@needs_interpreter
def test_triton_interpreter_strided_misaligned_rows():
    g = torch.Generator().manual_seed(7)
    big = torch.randn(6, 150, generator=g).to(torch.bfloat16)
    x = big[:, 3:3 + 2 * 37]  # row stride 150, odd offset, 37 outputs per row
    y = _triton(x, x[:, 37:], 150, 150, 6, 37, torch.bfloat16)
    assert_close(y, _ref_fused(x), torch.bfloat16, "triton strided")


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="x: the last dimension holds the gate and up halves and must be even, got 7"):
        fray.silu_mul(torch.randn(4, 7))
    with pytest.raises(TypeError, match="x: expected dtype"):
        fray.silu_mul(x.to(torch.int32))
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        fray.silu_mul([1.0, 2.0])
    with pytest.raises(ValueError, match="x: expected at least 1 dimension"):
        fray.silu_mul(torch.tensor(1.0))
    with pytest.raises(ValueError, match="x: the last dimension must be contiguous"):
        fray.silu_mul(torch.randn(8, 4).t())
    with pytest.raises(ValueError, match="x: leading dimensions must collapse"):
        fray.silu_mul(torch.randn(4, 5, 8)[:, :3])
    with pytest.raises(ValueError, match=r"up: expected shape \(4, 8\), got \(4, 9\)"):
        fray.silu_mul(x, torch.randn(4, 9))
    with pytest.raises(TypeError, match="up: expected dtype float32 \\(that of x\\), got float16"):
        fray.silu_mul(x, torch.randn(4, 8, dtype=torch.float16))
    with pytest.raises(TypeError, match="up: expected a tensor on cpu"):
        fray.silu_mul(x, torch.empty(4, 8, device="meta"))
    with pytest.raises(TypeError, match="up: expected a torch.Tensor"):
        fray.silu_mul(x, 2.0)
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 4\), got \(4, 8\)"):
        fray.silu_mul(x, out=torch.empty(4, 8))
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 8\)"):
        fray.silu_mul(x, torch.randn(4, 8), out=torch.empty(4, 4))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        fray.silu_mul(x, out=torch.empty(4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out: rows overlap"):
        fray.silu_mul(x, out=torch.empty(1, 4).expand(4, 4))
    with pytest.raises(ValueError, match="backend: expected one of"):
        fray.silu_mul(x, backend="cutlass")
    with pytest.raises(ValueError, match="backend: 'cuda' needs CUDA tensors"):
        fray.silu_mul(x, backend="cuda")
    with pytest.raises(TypeError, match="up: expected a numpy.ndarray"):
        fray.silu_mul(x.numpy(), x)
    with pytest.raises(ValueError, match="x: the last dimension holds"):
        fray.silu_mul(np.ones((2, 3)))
    with pytest.raises(TypeError, match="x: expected a float16/float32/float64 array"):
        fray.silu_mul(np.ones((2, 4), dtype=np.int64))
    with pytest.raises(TypeError, match="out"):
        fray.silu_mul(x, out=np.empty((4, 4), dtype=np.float32))


# ---------------------------------------------------------------------------------------------
# CPU: the CUDA extension builds, links and imports (no GPU needed)

def test_cuda_extension_imports():
    ext = B.load_extension("activation")
    assert not isinstance(ext, ImportError), ext
    assert "90a" in ext.archs().split(",")
    assert ext.cuda_runtime_version() >= 13000
    assert ext.num_kernel_instances() == 18 + 36  # act_mul 3 dtypes x 3 x 2; unary 3 dtypes x 6 x 2
    assert hasattr(torch.ops.fray, "silu_mul")
    assert fray.OPS["silu_mul"] == "activation"


# ---------------------------------------------------------------------------------------------
# GPU

D = [1, 3, 111, 128, 4097, 8192]
ROWS = [1, 7, 1024]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", D)
@pytest.mark.parametrize("rows", ROWS)
def test_gpu_vs_reference(cuda, backend, dtype, d, rows):
    g = torch.Generator(device=cuda).manual_seed(d * 31 + rows)
    x = torch.randn(rows, 2 * d, device=cuda, generator=g).to(dtype)
    out = torch.full((rows, d), float("nan"), device=cuda, dtype=dtype)  # poisoned: all must be written
    y = fray.silu_mul(x, out=out, backend=backend)
    assert y is out
    assert_close(y, _ref_fused(x), dtype, "%s fused %dx%d" % (backend, rows, d))
    gate = torch.randn(rows, d, device=cuda, generator=g).to(dtype)
    up = torch.randn(rows, d, device=cuda, generator=g).to(dtype)
    out.fill_(float("nan"))
    assert fray.silu_mul(gate, up, out=out, backend=backend) is out
    assert_close(out, _ref(gate, up), dtype, "%s two %dx%d" % (backend, rows, d))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 4096, 5000])
@pytest.mark.parametrize("offset", [8, 3])
def test_gpu_strided_misaligned_nd(cuda, backend, dtype, d, offset):
    g = torch.Generator(device=cuda).manual_seed(d + offset)
    big = torch.randn(3, 5, 2 * d + 24, device=cuda, generator=g).to(dtype)
    # 3-d view, rows strided by 2d + 24; offset 8 keeps 16-byte alignment (16-bit types), 3 breaks it
    x = big[..., offset:offset + 2 * d]
    out_buf = torch.full((3, 5, d + 16), float("nan"), device=cuda, dtype=dtype)
    out = out_buf[..., 8:8 + d]  # strided output
    assert fray.silu_mul(x, out=out, backend=backend) is out
    assert_close(out, _ref_fused(x), dtype, "%s strided fused" % backend)
    assert out_buf[..., :8].isnan().all() and out_buf[..., 8 + d:].isnan().all()  # nothing outside out
    gate, up = big[..., offset:offset + d], big[..., offset + d + 1:offset + 2 * d + 1]  # up misaligned by 1
    y = fray.silu_mul(gate, up, backend=backend)
    assert y.shape == (3, 5, d) and y.dtype == dtype
    assert_close(y, _ref(gate, up), dtype, "%s strided two" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_in_place_into_gate(cuda, backend):
    x = torch.randn(64, 2 * 1024, device=cuda, dtype=torch.bfloat16)
    expected = _ref_fused(x)
    gate = x[:, :1024]
    assert fray.silu_mul(x, out=gate, backend=backend) is gate
    assert_close(gate, expected, torch.bfloat16, "%s in place" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_extreme_values(cuda, backend):
    # exp(-g) overflows to inf for g < -88: the result must be -0, not NaN; large g gives g * up.
    gate = torch.linspace(-200.0, 200.0, 4001, device=cuda).reshape(1, -1)
    up = torch.full_like(gate, 0.75)
    for dtype in DTYPES:
        y = fray.silu_mul(gate.to(dtype), up.to(dtype), backend=backend)
        assert_close(y, _ref(gate.to(dtype), up.to(dtype)), dtype, "%s extreme %s" % (backend, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_many_rows(cuda, backend):
    # more row blocks than a grid's y dimension holds (65535): the CUDA kernel loops over them
    rows = 65536 * 256 + 1000
    x = torch.randn(rows, 2, device=cuda)
    y = fray.silu_mul(x, backend=backend)
    assert_close(y, _ref_fused(x), torch.float32, "%s %d rows" % (backend, rows))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_cuda_graph_capture_and_replay(cuda, backend):
    x = torch.randn(128, 2 * 4096, device=cuda, dtype=torch.bfloat16)
    out = torch.empty(128, 4096, device=cuda, dtype=torch.bfloat16)
    fray.silu_mul(x, out=out, backend=backend)  # warm-up (Triton compiles here)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fray.silu_mul(x, out=out, backend=backend)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, _ref_fused(x), torch.bfloat16, "%s graph replay" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda", "triton"])
def test_gpu_torch_compile_fullgraph(cuda, backend):
    x = torch.randn(33, 2 * 1000, device=cuda, dtype=torch.float16)
    gate, up = x[:, :1000].contiguous(), x[:, 1000:].contiguous()

    def f(x, gate, up):
        # ops before and after the custom op, so that the compiler has something to fuse
        return fray.silu_mul(x * 2.0, backend=backend), fray.silu_mul(gate, up + 1.0, backend=backend), x + 1.0

    compiled = torch.compile(f, fullgraph=True)
    y1, y2, z = compiled(x, gate, up)
    assert_close(y1, _ref_fused(x * 2.0), torch.float16, "compiled fused")
    assert_close(y2, _ref(gate, up + 1.0), torch.float16, "compiled two")
    e1, e2, ez = f(x, gate, up)
    assert torch.equal(y1, e1) and torch.equal(y2, e2) and torch.equal(z, ez)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_non_default_stream(cuda, backend):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.randn(4096, 2 * 8192, device=cuda, dtype=torch.bfloat16)
        y = fray.silu_mul(x, backend=backend)
    stream.synchronize()
    assert_close(y, _ref_fused(x), torch.bfloat16, "%s side stream" % backend)


@pytest.mark.gpu
def test_gpu_aliases_and_auto(cuda):
    x = torch.randn(16, 512, device=cuda, dtype=torch.bfloat16)
    expected = _ref_fused(x)
    assert_close(fray.triton.silu_mul(x), expected, torch.bfloat16, "fray.triton.silu_mul")
    assert_close(fray.silu_mul(x), expected, torch.bfloat16, "auto")
    assert B.resolve("silu_mul", "activation", "auto", x.device) in ("cuda", "triton")
    empty = fray.silu_mul(torch.empty(0, 512, device=cuda, dtype=torch.bfloat16))
    assert empty.shape == (0, 256)
    zero_d = fray.silu_mul(torch.empty(4, 0, device=cuda, dtype=torch.bfloat16))
    assert zero_d.shape == (4, 0)
