"""fray.axpy (out = a * x + b, scalars a and b): reference, Triton (interpreter on CPU), CUDA (GPU),
error contract."""
import os

import numpy as np
import pytest
import torch

import fray
from fray import backend as B
from fray.reference import elementwise as ref
from fray.testing import assert_close

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _fma(x, a, b):
    """The float64 a * x + b with a and b rounded to fp32, as the kernels take them; their one fp32
    fma is within half an fp32 ulp of it."""
    return ref.axpy(x.double(), a, b)


def test_numpy_in_numpy_out():
    x = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    y = fray.axpy(x, 2.0, 0.5)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_array_equal(y, [2.5, -3.5, 1.5])
    np.testing.assert_array_equal(fray.axpy(x), x)  # a = 1, b = 0
    np.testing.assert_array_equal(fray.axpy(x, b=1.0), x + 1)


def test_scalars_round_to_fp32():
    # the kernels take fp32 scalars; the reference rounds them the same way
    x = np.array([3.0])
    assert fray.axpy(x, 0.1)[0] == 3.0 * float(np.float32(0.1))


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_triton_interpreter_vs_reference(dtype, n):
    from fray_triton import elementwise as tew
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    y = torch.full_like(x, float("nan"))
    tew.axpy(x, y, n, -1.75, 0.3)
    assert_close(y, _fma(x, -1.75, 0.3), dtype, "triton axpy n=%d" % n)


def test_errors_name_the_argument():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="a: expected a Python float, got str"):
        fray.axpy(x, "2")
    with pytest.raises(TypeError, match="b: expected a Python float, got bool"):
        fray.axpy(x, 1.0, True)
    with pytest.raises(ValueError, match="a: expected a value finite in fp32, got 1e\\+39"):
        fray.axpy(x, 1e39)
    with pytest.raises(TypeError, match="x: expected dtype"):
        fray.axpy(x.int())
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 8\)"):
        fray.axpy(x, out=torch.empty(8))


def test_cuda_extension_has_the_launcher():
    ext = B.load_extension("elementwise")
    assert not isinstance(ext, ImportError), ext
    assert hasattr(ext, "axpy") and hasattr(torch.ops.fray, "axpy")
    assert fray.OPS["axpy"] == "elementwise"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_vs_reference(cuda, backend, dtype):
    for n in (1, 7, 4097, 1 << 20):
        x = torch.randn(n, device=cuda).to(dtype)
        assert_close(fray.axpy(x, -1.75, 0.3, backend=backend), _fma(x, -1.75, 0.3), dtype, "n=%d" % n)
    # the plan holds a and b: a second call with other scalars must use them
    x = torch.randn(4097, device=cuda).to(dtype)
    assert_close(fray.axpy(x, 0.5, -2.0, backend=backend), _fma(x, 0.5, -2.0), dtype, "other scalars")
    x = torch.randn(4099, device=cuda).to(dtype)[1:]
    want = _fma(x, 3.0, 1.0)
    assert fray.axpy(x, 3.0, 1.0, out=x, backend=backend) is x
    assert_close(x, want, dtype, "in place, misaligned")
