"""fray.mul: reference, Triton (interpreter on CPU), CUDA (GPU), error contract."""
import os

import numpy as np
import pytest
import torch

import fray
from fray import backend as B
from fray.testing import assert_close

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def test_numpy_in_numpy_out():
    a = np.array([[1.5, -2.0], [0.25, 3.0]], dtype=np.float32)
    b = np.array([[2.0, 3.0], [-4.0, 0.5]], dtype=np.float32)
    y = fray.mul(a, b)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_array_equal(y, [[3.0, -6.0], [-1.0, 1.5]])
    assert fray.mul(a, b, out=a) is a
    np.testing.assert_array_equal(a, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cpu_tensor_is_torch_mul(dtype):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(6, 5, generator=g).to(dtype), torch.randn(6, 5, generator=g).to(dtype)
    # float64 product of two 16/24-bit significands is exact: one rounding, as torch.mul's fp32 math
    assert torch.equal(fray.mul(a, b), (a.float() * b.float()).to(dtype))
    assert torch.equal(fray.mul(a.t(), b.t()), fray.mul(a, b).t())


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_triton_interpreter_is_torch_mul(dtype, n):
    from fray_triton import elementwise as tew
    g = torch.Generator().manual_seed(n)
    a, b = torch.randn(n, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)
    y = torch.full_like(a, float("nan"))
    tew.mul(a, b, y, n)
    assert torch.equal(y, (a.float() * b.float()).to(dtype))


def test_errors_name_the_argument():
    a = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"b: expected shape \(4, 8\) \(that of a; no broadcasting\), got \(8,\)"):
        fray.mul(a, torch.randn(8))
    with pytest.raises(TypeError, match="b: expected dtype float32 \\(that of a\\), got float16"):
        fray.mul(a, a.half())
    with pytest.raises(ValueError, match="b: expected the strides of a"):
        fray.mul(torch.randn(8, 8), torch.randn(8, 8).t())
    with pytest.raises(TypeError, match="b: expected a torch.Tensor"):
        fray.mul(a, 2.0)
    with pytest.raises(TypeError, match="b: expected a numpy.ndarray"):
        fray.mul(a.numpy(), a)
    big = torch.randn(33)
    with pytest.raises(ValueError, match="out: overlaps a without being a itself"):
        fray.mul(big[:32], torch.randn(32), out=big[1:])


def test_cuda_extension_has_the_launcher():
    ext = B.load_extension("elementwise")
    assert not isinstance(ext, ImportError), ext
    assert hasattr(ext, "mul") and hasattr(torch.ops.fray, "mul")
    assert fray.OPS["mul"] == "elementwise"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_is_torch_mul(cuda, backend, dtype):
    for n in (1, 7, 4097, 1 << 20):
        a, b = torch.randn(n, device=cuda).to(dtype), torch.randn(n, device=cuda).to(dtype)
        assert torch.equal(fray.mul(a, b, backend=backend), a * b), (backend, dtype, n)
    base = torch.randn(2, 4099, device=cuda).to(dtype)
    a, b = base[0, 1:], base[1, 1:]  # misaligned starts: the scalar path
    assert torch.equal(fray.mul(a, b, backend=backend), a * b)
    want = a * b
    assert fray.mul(a, b, out=b, backend=backend) is b
    assert torch.equal(b, want)
    at, bt = torch.randn(48, 64, device=cuda).to(dtype).t(), torch.randn(48, 64, device=cuda).to(dtype).t()
    assert torch.equal(fray.mul(at, bt, backend=backend), at * bt)
