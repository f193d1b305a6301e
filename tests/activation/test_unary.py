"""fray.silu / gelu / relu / tanh / sigmoid (the unary activations, one kernel over the activation
code): reference, Triton (interpreter on CPU), CUDA (GPU), error contract."""
import os

import numpy as np
import pytest
import torch

import fray
from fray import backend as B
from fray.reference import activation as ref
from fray.testing import assert_close

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")

# name -> (public call, float64 reference, activation code)
UNARY = {
    "silu": (fray.silu, ref.silu, 0),
    "gelu": (fray.gelu, ref.gelu, 1),
    "gelu_tanh": (lambda x, **kw: fray.gelu(x, approximate="tanh", **kw), lambda g: ref.gelu(g, "tanh"), 2),
    "relu": (fray.relu, ref.relu, 3),
    "tanh": (fray.tanh, ref.tanh, 4),
    "sigmoid": (fray.sigmoid, ref.sigmoid, 5),
}


def _ref(name, x):
    return UNARY[name][1](x.to(torch.float64))


def test_reference_hand_computed():
    x = np.array([-2.0, -0.5, 0.0, 0.5, 3.0])
    np.testing.assert_array_equal(ref.relu(x), [0.0, 0.0, 0.0, 0.5, 3.0])
    assert np.isnan(ref.relu(np.array([np.nan])))[0]
    np.testing.assert_allclose(ref.sigmoid(x), 1.0 / (1.0 + np.exp(-x)), rtol=1e-15)
    np.testing.assert_allclose(ref.tanh(x), np.tanh(x), rtol=1e-15)
    np.testing.assert_allclose(ref.sigmoid(np.array([0.0])), [0.5], rtol=0)
    np.testing.assert_allclose(ref.tanh(np.array([0.5])), [0.46211715726000974], rtol=1e-14)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_numpy_in_numpy_out(name):
    fn, want, _ = UNARY[name]
    x = np.linspace(-4, 4, 24, dtype=np.float32).reshape(4, 6)
    y = fn(x)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (4, 6)
    np.testing.assert_array_equal(y, want(x.astype(np.float64)).astype(np.float32))
    out = np.full_like(x, np.nan)
    assert fn(x, out=out) is out
    np.testing.assert_array_equal(out, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_cpu_tensor_runs_reference(name, dtype):
    x = (3 * torch.randn(5, 7, generator=torch.Generator().manual_seed(1))).to(dtype)
    y = UNARY[name][0](x)
    assert y.dtype == dtype and y.shape == x.shape and y.device.type == "cpu"
    assert torch.equal(y, _ref(name, x).to(dtype))
    xt = x.t()  # a dense permutation: accepted (the GPU tests check that out keeps it)
    assert torch.equal(UNARY[name][0](xt), y.t())


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("n", [1, 3, 4097])
def test_triton_interpreter_vs_reference(name, dtype, n):
    from fray_triton import activation as tact
    g = torch.Generator().manual_seed(n)
    x = (4 * torch.randn(n, generator=g)).to(dtype)
    x[0] = 0.01  # the small-|x| branch of tanh
    y = torch.full_like(x, float("nan"))
    tact.unary(x, y, UNARY[name][2], n)
    assert_close(y, _ref(name, x), dtype, "triton %s n=%d" % (name, n))


@needs_interpreter
def test_triton_interpreter_tanh_across_its_branches():
    from fray_triton import activation as tact
    x = torch.tensor([-20.0, -1.0, -0.0625, -0.06, -1e-6, 0.0, 1e-6, 0.03, 0.0625, 0.07, 2.0, 20.0])
    y = torch.empty_like(x)
    tact.unary(x, y, 4, x.numel())
    assert_close(y, torch.tanh(x.double()), torch.float32, "tanh")


def test_errors_name_the_argument():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="x: expected dtype"):
        fray.relu(x.to(torch.int32))
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        fray.tanh([1.0, 2.0])
    with pytest.raises(ValueError, match="x: expected a contiguous tensor"):
        fray.sigmoid(torch.randn(4, 16)[:, ::2])
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 8\)"):
        fray.silu(x, out=torch.empty(4, 4))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        fray.silu(x, out=torch.empty(4, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="approximate: expected 'none' or 'tanh'"):
        fray.gelu(x, approximate="erf")
    with pytest.raises(ValueError, match="backend: 'cuda' needs CUDA tensors"):
        fray.relu(x, backend="cuda")
    with pytest.raises(TypeError, match="x: expected a float16/float32/float64 array"):
        fray.relu(np.ones(3, dtype=np.int64))


def test_cuda_extension_has_the_launcher():
    ext = B.load_extension("activation")
    assert not isinstance(ext, ImportError), ext
    assert hasattr(ext, "unary")
    assert hasattr(torch.ops.fray, "unary")
    for op in ("silu", "gelu", "relu", "tanh", "sigmoid"):
        assert fray.OPS[op] == "activation"


# ---------------------------------------------------------------------------------------------
# GPU

@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_gpu_vs_reference(cuda, name, backend, dtype):
    fn = UNARY[name][0]
    for n in (1, 7, 4097, 1 << 20):
        x = (4 * torch.randn(n, device=cuda)).to(dtype)
        assert_close(fn(x, backend=backend), _ref(name, x), dtype, "%s %s n=%d" % (name, backend, n))
    # misaligned start (the scalar path), a transposed layout, and in place
    base = (4 * torch.randn(4099, device=cuda)).to(dtype)
    x = base[1:]
    assert_close(fn(x, backend=backend), _ref(name, x), dtype, "%s misaligned" % name)
    xt = (4 * torch.randn(64, 48, device=cuda)).to(dtype).t()
    yt = fn(xt, backend=backend)
    assert yt.stride() == xt.stride()
    assert_close(yt, _ref(name, xt), dtype, "%s transposed" % name)
    want = _ref(name, x)
    assert fn(x, out=x, backend=backend) is x
    assert_close(x, want, dtype, "%s in place" % name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_silu_matches_silu_mul_gate(cuda, dtype):
    g = torch.randn(3, 4096, device=cuda).to(dtype)
    assert torch.equal(fray.silu(g, backend="cuda"), fray.silu_mul(g, torch.ones_like(g), backend="cuda"))


@pytest.mark.gpu
def test_gpu_graph_capture_and_compile(cuda):
    x = torch.randn(1000, device=cuda)
    fray.sigmoid(x)  # warm: the plan is built outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fray.sigmoid(x)
    x.copy_(torch.randn(1000, device=cuda))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(y, ref.sigmoid(x.double()), torch.float32, "graph replay")
    f = torch.compile(lambda t: fray.tanh(fray.relu(t)), fullgraph=True)
    assert_close(f(x), ref.tanh(ref.relu(x.double())), torch.float32, "compiled")
