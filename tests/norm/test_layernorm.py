"""fray.layernorm: reference, Triton (interpreter on CPU), CUDA (GPU), error contract."""
import math
import os

import numpy as np
import pytest
import torch

import fray
from fray import backend as B
from fray.reference import norm as ref
from fray.testing import assert_close, layernorm_scale

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _ref(x, w, b, eps):
    return ref.layernorm(x.to(torch.float64), w.to(torch.float64),
                         None if b is None else b.to(torch.float64), eps)


_scale = layernorm_scale


# ---------------------------------------------------------------------------------------------
# CPU: reference against hand-computed values

def test_reference_hand_computed():
    # x = [1, 3]: mean 2, biased variance 1 -> x_hat = [-1, 1]; w = [1, 2], b = [0.5, 0].
    y = ref.layernorm(np.array([[1.0, 3.0]]), np.array([1.0, 2.0]), np.array([0.5, 0.0]), 0.0)
    np.testing.assert_allclose(y, [[-0.5, 2.0]], rtol=1e-15)
    # x = [2, 4, 9]: mean 5, var (9 + 1 + 16) / 3 = 26/3 (biased, not 13); eps = 1/3 -> sqrt(9) = 3.
    y = ref.layernorm(np.array([2.0, 4.0, 9.0]), np.ones(3), None, 1.0 / 3.0)
    np.testing.assert_allclose(y, [-1.0, -1.0 / 3.0, 4.0 / 3.0], rtol=1e-14)
    # A constant row normalises to 0 (then + b): x_hat = 0 / sqrt(eps).
    y = ref.layernorm(np.full((1, 4), 7.0), np.ones(4), np.arange(4.0), 1e-5)
    np.testing.assert_allclose(y, [[0.0, 1.0, 2.0, 3.0]], atol=1e-12)


def test_numpy_in_numpy_out():
    x = np.array([[1.0, 3.0], [2.0, 6.0]], dtype=np.float32)
    y = fray.layernorm(x, np.array([1.0, 2.0], dtype=np.float32), np.array([0.5, 0.0], dtype=np.float32), eps=0.0)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (2, 2)
    np.testing.assert_allclose(y, [[-0.5, 2.0], [-0.5, 2.0]], rtol=1e-6)
    y = fray.layernorm(x[:1], np.array([1.0, 1.0], dtype=np.float32))  # no bias, default eps
    np.testing.assert_allclose(y, [[-1.0, 1.0]], rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_cpu_tensor_runs_reference(dtype, with_bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 33, generator=g).to(dtype)
    w = torch.randn(33, generator=g).to(dtype)
    b = torch.randn(33, generator=g).to(dtype) if with_bias else None
    y = fray.layernorm(x, w, b, eps=1e-5)
    assert y.dtype == dtype and y.shape == x.shape and y.device.type == "cpu"
    assert_close(y, _ref(x, w, b, 1e-5), dtype, "cpu reference", scale=_scale(x, w, b, 1e-5))
    out = torch.full_like(x, float("nan"))
    assert fray.layernorm(x, w, b, 1e-5, out=out) is out
    assert torch.equal(out, y)


def test_matches_torch_layer_norm_fp64():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 50, generator=g, dtype=torch.float64) * 3 + 10
    w = torch.randn(50, generator=g, dtype=torch.float64)
    b = torch.randn(50, generator=g, dtype=torch.float64)
    expected = torch.nn.functional.layer_norm(x, (50,), w, b, 1e-5)
    torch.testing.assert_close(torch.from_numpy(ref.layernorm(x.numpy(), w.numpy(), b.numpy(), 1e-5)), expected,
                               rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernels under TRITON_INTERPRET=1 (set by the Bazel CPU target)

def _triton_layernorm(x2d, w, b, eps):
    from fray_triton import norm as tnorm
    out = torch.full_like(x2d, float("nan"))
    tnorm.layernorm(x2d, w, b, out, eps, x2d.stride(0), out.stride(0), x2d.shape[0], x2d.shape[1])
    return out


needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,hidden", [(1, 1), (3, 7), (4, 33), (2, 128), (5, 300), (2, 16385)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_triton_interpreter_vs_reference(dtype, rows, hidden, with_bias):
    g = torch.Generator().manual_seed(rows * 100003 + hidden)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    b = torch.randn(hidden, generator=g).to(dtype) if with_bias else None
    assert_close(_triton_layernorm(x, w, b, 1e-5), _ref(x, w, b, 1e-5), dtype, "triton %dx%d" % (rows, hidden))


@needs_interpreter
@pytest.mark.parametrize("hidden", [256, 300, 16385])  # even tile, masked tile, three-pass loop
def test_triton_interpreter_large_mean_fp32(hidden):
    # 100 + N(0, 1): an fp32 mean of x would shift every output by ~4e-6 (ulp(100) / 2).
    g = torch.Generator().manual_seed(hidden)
    x = 100.0 + torch.randn(4, hidden, generator=g)
    w = torch.randn(hidden, generator=g)
    b = torch.randn(hidden, generator=g)
    assert_close(_triton_layernorm(x, w, b, 1e-5), _ref(x, w, b, 1e-5), torch.float32, "triton large mean")


@needs_interpreter
def test_triton_interpreter_strided_rows_fp32_weight():
    g = torch.Generator().manual_seed(7)
    big = torch.randn(6, 96, generator=g).to(torch.bfloat16)
    x = big[:, 8:72]  # row stride 96, 64 columns
    w, b = torch.randn(64, generator=g), torch.randn(64, generator=g)  # fp32 weight/bias with bf16 x
    assert_close(_triton_layernorm(x, w, b, 1e-5), _ref(x, w, b, 1e-5), torch.bfloat16, "triton strided")


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    with pytest.raises(TypeError, match="x: expected dtype"):
        fray.layernorm(x.to(torch.int32), w, b)
    with pytest.raises(TypeError, match="weight: expected dtype"):
        fray.layernorm(x, w.to(torch.float16), b)
    with pytest.raises(ValueError, match=r"weight: expected shape \(8,\), got \(7,\)"):
        fray.layernorm(x, torch.randn(7), b)
    with pytest.raises(TypeError, match="bias: expected dtype float32 \\(that of weight\\), got float16"):
        fray.layernorm(x, w, b.half())
    with pytest.raises(TypeError, match="bias: expected dtype bfloat16 \\(that of weight\\)"):
        fray.layernorm(x.bfloat16(), w.bfloat16(), b)  # fp32 bias with a bf16 weight
    with pytest.raises(ValueError, match=r"bias: expected shape \(8,\), got \(9,\)"):
        fray.layernorm(x, w, torch.randn(9))
    with pytest.raises(ValueError, match="bias: expected a contiguous 1-d tensor"):
        fray.layernorm(x, w, torch.randn(16)[::2])
    with pytest.raises(TypeError, match="bias: expected a tensor on cpu"):
        fray.layernorm(x, w, torch.empty(8, device="meta"))
    with pytest.raises(TypeError, match="bias: expected a torch.Tensor"):
        fray.layernorm(x, w, [0.0] * 8)
    with pytest.raises(TypeError, match="bias: expected a numpy.ndarray"):
        fray.layernorm(x.numpy(), w.numpy(), b)
    with pytest.raises(ValueError, match=r"bias: expected shape \(8,\)"):
        fray.layernorm(x.numpy(), w.numpy(), np.zeros(3))
    with pytest.raises(ValueError, match="x: the last dimension must be contiguous"):
        fray.layernorm(torch.randn(8, 4).t(), w)
    with pytest.raises(ValueError, match="eps: expected a finite value >= 0"):
        fray.layernorm(x, w, b, eps=math.inf)
    with pytest.raises(TypeError, match="eps: expected a float"):
        fray.layernorm(x, w, b, eps="1e-5")
    with pytest.raises(ValueError, match="backend: expected one of"):
        fray.layernorm(x, w, backend="apex")
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.layernorm(x, w, backend="triton")
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        fray.layernorm(x, w, out=torch.empty(4, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out: rows overlap"):
        fray.layernorm(x, w, out=torch.empty(1, 8).expand(4, 8))
    with pytest.raises(ValueError, match="x: the normalised"):
        fray.layernorm(torch.empty(4, 0), torch.empty(0))


# ---------------------------------------------------------------------------------------------
# CPU: the CUDA extension builds, links and imports (no GPU needed)

def test_cuda_extension_imports():
    ext = B.load_extension("norm")
    assert not isinstance(ext, ImportError), ext
    assert "90a" in ext.archs().split(",")
    assert hasattr(ext, "layernorm")
    assert hasattr(torch.ops.fray, "layernorm")
    assert "layernorm" in fray.OPS and fray.OPS["layernorm"] == "norm"


# ---------------------------------------------------------------------------------------------
# GPU

HIDDEN = [1, 3, 111, 4096, 4097, 8192, 65536]
ROWS = [1, 7, 1024]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gpu_vs_reference(cuda, backend, dtype, hidden, rows, with_bias):
    g = torch.Generator(device=cuda).manual_seed(hidden * 31 + rows)
    x = torch.randn(rows, hidden, device=cuda, generator=g).to(dtype)
    w = torch.randn(hidden, device=cuda, generator=g).to(dtype)
    b = torch.randn(hidden, device=cuda, generator=g).to(dtype) if with_bias else None
    out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    y = fray.layernorm(x, w, b, eps=1e-5, out=out, backend=backend)
    torch.cuda.synchronize()
    assert y is out
    assert_close(y, _ref(x, w, b, 1e-5), dtype, "%s %dx%d bias=%s" % (backend, rows, hidden, with_bias), scale=_scale(x, w, b, 1e-5))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("hidden", [111, 4096, 8192, 65536])  # fp32 65536: the multi-pass kernels
@pytest.mark.parametrize("mean", [100.0, -3000.0])
def test_gpu_large_mean_fp32(cuda, backend, hidden, mean):
    # mean + N(0, 1): outputs near 0 need the mean to better than fp32's ulp(mean).
    g = torch.Generator(device=cuda).manual_seed(hidden)
    x = mean + torch.randn(64, hidden, device=cuda, generator=g)
    w = torch.randn(hidden, device=cuda, generator=g)
    b = torch.randn(hidden, device=cuda, generator=g)
    y = fray.layernorm(x, w, b, eps=1e-5, backend=backend)
    assert_close(y, _ref(x, w, b, 1e-5), torch.float32, "%s mean %g" % (backend, mean), scale=_scale(x, w, b, 1e-5))
    y = fray.layernorm(x, w, None, eps=1e-5, backend=backend)  # no bias: x_hat * w itself
    assert_close(y, _ref(x, w, None, 1e-5), torch.float32, "%s mean %g, no bias" % (backend, mean), scale=_scale(x, w, None, 1e-5))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 4096, 5000, 131072])
@pytest.mark.parametrize("offset", [8, 3])
def test_gpu_strided_fp32_weight_nd(cuda, backend, dtype, hidden, offset):
    g = torch.Generator(device=cuda).manual_seed(hidden + offset)
    big = (torch.randn(3, 5, hidden + 24, device=cuda, generator=g) + 2.0).to(dtype)
    # 3-d view, rows strided by hidden + 24; offset 8 keeps 16-byte alignment, 3 breaks it
    x = big[..., offset:offset + hidden]
    w = torch.randn(hidden, device=cuda, generator=g)  # fp32 weight and bias with 16-bit x
    b = torch.randn(hidden, device=cuda, generator=g)
    y = fray.layernorm(x, w, b, eps=1e-5, backend=backend)
    assert y.shape == x.shape and y.dtype == dtype
    expected = _ref(x, w, b, 1e-5)
    assert_close(y, expected, dtype, "%s strided" % backend)
    # in place (out is x)
    assert fray.layernorm(x, w, b, eps=1e-5, out=x, backend=backend) is x
    assert_close(x, expected, dtype, "%s in place" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_matches_torch(cuda, backend):
    x = torch.randn(256, 2048, device=cuda, dtype=torch.bfloat16)
    w = torch.randn(2048, device=cuda, dtype=torch.bfloat16)
    b = torch.randn(2048, device=cuda, dtype=torch.bfloat16)
    y = fray.layernorm(x, w, b, backend=backend)
    expected = torch.nn.functional.layer_norm(x.float(), (2048,), w.float(), b.float(), 1e-5)
    assert_close(y, expected.double(), torch.bfloat16, "%s vs F.layer_norm" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_cuda_graph_capture_and_replay(cuda, backend):
    x = torch.randn(128, 4096, device=cuda, dtype=torch.bfloat16)
    w = torch.randn(4096, device=cuda, dtype=torch.bfloat16)
    b = torch.randn(4096, device=cuda, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    fray.layernorm(x, w, b, out=out, backend=backend)  # warm-up (Triton compiles here)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fray.layernorm(x, w, b, out=out, backend=backend)
    for i in range(3):
        x.copy_(torch.randn_like(x) + i)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, _ref(x, w, b, 1e-5), torch.bfloat16, "%s graph replay" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda", "triton"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gpu_torch_compile_fullgraph(cuda, backend, with_bias):
    x = torch.randn(33, 1000, device=cuda, dtype=torch.float16)
    w = torch.randn(1000, device=cuda, dtype=torch.float16)
    b = torch.randn(1000, device=cuda, dtype=torch.float16) if with_bias else None

    def f(x, w, b):
        # ops before and after the custom op, so that the compiler has something to fuse
        return fray.layernorm(x * 2.0, w, b, eps=1e-5, backend=backend), x + 1.0

    compiled = torch.compile(f, fullgraph=True)
    y, z = compiled(x, w, b)
    assert_close(y, _ref(x * 2.0, w, b, 1e-5), torch.float16, "compiled", scale=_scale(x * 2.0, w, b, 1e-5))
    ey, ez = f(x, w, b)
    assert torch.equal(y, ey) and torch.equal(z, ez)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_non_default_stream(cuda, backend):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.randn(4096, 8192, device=cuda, dtype=torch.bfloat16)
        w = torch.randn(8192, device=cuda, dtype=torch.bfloat16)
        b = torch.randn(8192, device=cuda, dtype=torch.bfloat16)
        y = fray.layernorm(x, w, b, backend=backend)
    stream.synchronize()
    assert_close(y, _ref(x, w, b, 1e-5), torch.bfloat16, "%s side stream" % backend)


@pytest.mark.gpu
def test_gpu_auto_and_empty(cuda):
    x = torch.randn(16, 256, device=cuda, dtype=torch.bfloat16)
    w = torch.randn(256, device=cuda, dtype=torch.bfloat16)
    assert_close(fray.layernorm(x, w), _ref(x, w, None, 1e-5), torch.bfloat16, "auto")
    assert B.resolve("layernorm", "norm", "auto", x.device) in ("cuda", "triton")
    empty = fray.layernorm(torch.empty(0, 256, device=cuda, dtype=torch.bfloat16), w)
    assert empty.shape == (0, 256)
