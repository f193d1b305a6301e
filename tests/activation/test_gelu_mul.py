"""fray.gelu_mul (erf and tanh forms): reference, Triton (interpreter on CPU), CUDA (GPU), errors."""
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
FORMS = ["none", "tanh"]
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _ref(gate, up, approximate):
    return ref.gelu_mul(gate.to(torch.float64), up.to(torch.float64), approximate)


def _ref_fused(x, approximate):
    gate, up = ref.split(x)
    return _ref(gate, up, approximate)


# ---------------------------------------------------------------------------------------------
# CPU: reference against hand-computed values

def test_reference_hand_computed():
    # gelu(1) = Phi(1) = 0.8413447461; gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.8411919906
    np.testing.assert_allclose(ref.gelu(np.array([0.0, 1.0, -1.0])), [0.0, 0.8413447461, -0.1586552539],
                               rtol=1e-9, atol=0)
    np.testing.assert_allclose(ref.gelu(np.array([0.0, 1.0, -1.0]), "tanh"), [0.0, 0.8411919906, -0.1588080094],
                               rtol=1e-9, atol=0)
    # gelu(-x) = gelu(x) - x for both forms (Phi(-x) = 1 - Phi(x); tanh is odd)
    x = np.linspace(-5, 5, 41)
    for form in FORMS:
        np.testing.assert_allclose(ref.gelu(-x, form), ref.gelu(x, form) - x, atol=1e-14)
    np.testing.assert_allclose(ref.gelu_mul(np.array([2.0]), np.array([-3.0])),
                               [-3.0 * 2.0 * 0.5 * (1 + math.erf(2.0 / math.sqrt(2.0)))], rtol=1e-12)
    t = ref.gelu(torch.tensor([1.0], dtype=torch.float64), "tanh")
    np.testing.assert_allclose(t.numpy(), [0.8411919906], rtol=1e-9)


def test_numpy_in_numpy_out():
    x = np.array([[1.0, 0.0, 2.0, 5.0]], dtype=np.float32)  # gate = [1, 0], up = [2, 5]
    y = fray.gelu_mul(x)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (1, 2)
    np.testing.assert_allclose(y, [[2 * 0.8413447461, 0.0]], rtol=1e-6)
    yt = fray.gelu_mul(x, approximate="tanh")
    np.testing.assert_allclose(yt, [[2 * 0.8411919906, 0.0]], rtol=1e-6)
    out = np.full((1, 2), np.nan, dtype=np.float32)
    assert fray.gelu_mul(x[:, :2].copy(), x[:, 2:].copy(), approximate="tanh", out=out) is out
    np.testing.assert_array_equal(out, yt)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", FORMS)
def test_cpu_tensor_runs_reference(dtype, approximate):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 66, generator=g).to(dtype)
    y = fray.gelu_mul(x, approximate=approximate)
    assert y.dtype == dtype and y.shape == (5, 3, 33) and y.device.type == "cpu"
    assert_close(y, _ref_fused(x, approximate), dtype, "cpu reference")
    assert torch.equal(fray.gelu_mul(x[..., :33], x[..., 33:], approximate=approximate), y)


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernel under TRITON_INTERPRET=1 (set by the Bazel CPU target)

def _triton(gate, up, sg, su, rows, d, dtype, approximate):
    from fray_triton import activation as tact
    out = torch.full((rows, d), float("nan")).to(dtype)
    tact.gelu_mul(gate, up, out, approximate, sg, su, d, rows, d)
    return out


@needs_interpreter
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # exp(-2z) = inf for g << 0 is fine
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("rows,d", [(1, 1), (3, 3), (4, 33), (2, 128), (5, 300), (2, 4097)])
def test_triton_interpreter_vs_reference(dtype, approximate, rows, d):
    g = torch.Generator().manual_seed(rows * 100003 + d)
    x = (3 * torch.randn(rows, 2 * d, generator=g)).to(dtype)
    y = _triton(x, x[:, d:], 2 * d, 2 * d, rows, d, dtype, approximate)
    assert_close(y, _ref_fused(x, approximate), dtype, "triton fused %dx%d" % (rows, d))
    gate, up = x[:, :d].contiguous(), x[:, d:].contiguous()
    assert_close(_triton(gate, up, d, d, rows, d, dtype, approximate), _ref(gate, up, approximate), dtype,
                 "triton two %dx%d" % (rows, d))


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="approximate: expected 'none' or 'tanh', got 'erf'"):
        fray.gelu_mul(x, approximate="erf")
    with pytest.raises(TypeError, match="approximate: expected 'none' or 'tanh', got bool"):
        fray.gelu_mul(x, approximate=True)
    with pytest.raises(ValueError, match="x: the last dimension holds the gate and up halves and must be even, got 5"):
        fray.gelu_mul(torch.randn(2, 5))
    with pytest.raises(TypeError, match="x: expected dtype"):
        fray.gelu_mul(x.to(torch.float64))
    with pytest.raises(ValueError, match=r"up: expected shape \(4, 8\), got \(8,\)"):
        fray.gelu_mul(x, torch.randn(8))
    with pytest.raises(TypeError, match="up: expected dtype float32"):
        fray.gelu_mul(x, x.to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 4\)"):
        fray.gelu_mul(x, out=torch.empty(4, 5))
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.gelu_mul(x, backend="triton")
    with pytest.raises(ValueError, match=r"up: expected shape \(2, 4\), got \(2, 3\)"):
        fray.gelu_mul(np.ones((2, 4)), np.ones((2, 3)))


def test_cuda_extension_imports():
    ext = B.load_extension("activation")
    assert not isinstance(ext, ImportError), ext
    assert "90a" in ext.archs().split(",")
    assert hasattr(torch.ops.fray, "gelu_mul")
    assert fray.OPS["gelu_mul"] == "activation"


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
    g = torch.Generator(device=cuda).manual_seed(d * 37 + rows)
    x = torch.randn(rows, 2 * d, device=cuda, generator=g).to(dtype)
    gate = torch.randn(rows, d, device=cuda, generator=g).to(dtype)
    up = torch.randn(rows, d, device=cuda, generator=g).to(dtype)
    out = torch.empty(rows, d, device=cuda, dtype=dtype)
    for approximate in FORMS:
        out.fill_(float("nan"))  # poisoned: every element must be written
        assert fray.gelu_mul(x, approximate=approximate, out=out, backend=backend) is out
        assert_close(out, _ref_fused(x, approximate), dtype, "%s %s fused %dx%d" % (backend, approximate, rows, d))
        out.fill_(float("nan"))
        assert fray.gelu_mul(gate, up, approximate=approximate, out=out, backend=backend) is out
        assert_close(out, _ref(gate, up, approximate), dtype, "%s %s two %dx%d" % (backend, approximate, rows, d))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("offset", [8, 3])
def test_gpu_strided_misaligned_nd(cuda, backend, approximate, offset):
    d = 4096
    g = torch.Generator(device=cuda).manual_seed(offset)
    big = torch.randn(3, 5, 2 * d + 24, device=cuda, generator=g).to(torch.bfloat16)
    x = big[..., offset:offset + 2 * d]  # rows strided by 2d + 24; offset 3 breaks 16-byte alignment
    y = fray.gelu_mul(x, approximate=approximate, backend=backend)
    assert y.shape == (3, 5, d)
    assert_close(y, _ref_fused(x, approximate), torch.bfloat16, "%s strided fused" % backend)
    gate, up = big[..., offset:offset + d], big[..., offset + d + 1:offset + 2 * d + 1]
    assert_close(fray.gelu_mul(gate, up, approximate=approximate, backend=backend),
                 _ref(gate, up, approximate), torch.bfloat16, "%s strided two" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_extreme_values(cuda, backend):
    # tanh form: exp(-2z) overflows for g << 0 -> -0, not NaN; erf saturates at +-1.
    gate = torch.linspace(-60.0, 60.0, 2401, device=cuda).reshape(1, -1)
    up = torch.full_like(gate, -1.25)
    for dtype in DTYPES:
        for approximate in FORMS:
            y = fray.gelu_mul(gate.to(dtype), up.to(dtype), approximate=approximate, backend=backend)
            assert_close(y, _ref(gate.to(dtype), up.to(dtype), approximate), dtype,
                         "%s extreme %s %s" % (backend, approximate, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_cuda_graph_capture_and_replay(cuda, backend):
    x = torch.randn(128, 2 * 4096, device=cuda, dtype=torch.bfloat16)
    outs = {a: torch.empty(128, 4096, device=cuda, dtype=torch.bfloat16) for a in FORMS}
    for a in FORMS:
        fray.gelu_mul(x, approximate=a, out=outs[a], backend=backend)  # warm-up (Triton compiles)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for a in FORMS:
            fray.gelu_mul(x, approximate=a, out=outs[a], backend=backend)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        for out in outs.values():
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for a in FORMS:
            assert_close(outs[a], _ref_fused(x, a), torch.bfloat16, "%s graph replay %s" % (backend, a))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda", "triton"])
def test_gpu_torch_compile_fullgraph(cuda, backend):
    x = torch.randn(33, 2 * 1000, device=cuda, dtype=torch.bfloat16)
    gate, up = x[:, :1000].contiguous(), x[:, 1000:].contiguous()

    def f(x, gate, up):
        return (fray.gelu_mul(x * 2.0, backend=backend),
                fray.gelu_mul(gate, up - 1.0, approximate="tanh", backend=backend), x + 1.0)

    compiled = torch.compile(f, fullgraph=True)
    y1, y2, z = compiled(x, gate, up)
    assert_close(y1, _ref_fused(x * 2.0, "none"), torch.bfloat16, "compiled fused erf")
    assert_close(y2, _ref(gate, up - 1.0, "tanh"), torch.bfloat16, "compiled two tanh")
    e1, e2, ez = f(x, gate, up)
    assert torch.equal(y1, e1) and torch.equal(y2, e2) and torch.equal(z, ez)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_non_default_stream(cuda, backend):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.randn(4096, 2 * 8192, device=cuda, dtype=torch.bfloat16)
        y = fray.gelu_mul(x, approximate="tanh", backend=backend)
    stream.synchronize()
    assert_close(y, _ref_fused(x, "tanh"), torch.bfloat16, "%s side stream" % backend)


@pytest.mark.gpu
def test_gpu_aliases_and_auto(cuda):
    x = torch.randn(16, 512, device=cuda, dtype=torch.bfloat16)
    for a in FORMS:
        expected = _ref_fused(x, a)
        assert_close(fray.triton.gelu_mul(x, approximate=a), expected, torch.bfloat16, "fray.triton.gelu_mul")
        assert_close(fray.gelu_mul(x, approximate=a), expected, torch.bfloat16, "auto")
    assert B.resolve("gelu_mul", "activation", "auto", x.device) in ("cuda", "triton")
    assert fray.gelu_mul(torch.empty(0, 512, device=cuda, dtype=torch.bfloat16)).shape == (0, 256)
