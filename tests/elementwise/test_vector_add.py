"""fray.vector_add: reference, Triton (interpreter on CPU), CUDA (GPU), error contract."""
import os

import numpy as np
import pytest
import torch

import fray
from fray import backend as B
from fray.reference import elementwise as ref
from fray.testing import assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _ref(a, b):
    return ref.vector_add(a.to(torch.float64), b.to(torch.float64))


# ---------------------------------------------------------------------------------------------
# CPU: reference against hand-computed values

def test_reference_hand_computed():
    np.testing.assert_array_equal(ref.vector_add(np.array([1.0, -2.5, 1e300]), np.array([0.5, 2.5, 1e300])),
                                  [1.5, 0.0, 2e300])


def test_numpy_in_numpy_out():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float16)
    b = np.array([[0.5, -2.0], [0.25, 1e4]], dtype=np.float16)
    y = fray.vector_add(a, b)
    assert isinstance(y, np.ndarray) and y.dtype == np.float16 and y.shape == (2, 2)
    np.testing.assert_array_equal(y, np.array([[1.5, 0.0], [3.25, 10004.0]], dtype=np.float16))
    out = np.empty_like(a)
    assert fray.vector_add(a, b, out=out) is out
    np.testing.assert_array_equal(out, y)


def test_bf16_rounds_once_to_nearest_even():
    # bf16 spacing is 2 at 256: 257 is halfway between 256 and 258 and goes to the even
    # mantissa (256); 259 is halfway between 258 and 260 and goes to 260; 1 + 2^-8 is halfway
    # between 1 and 1 + 2^-7 and goes to 1.
    a = torch.tensor([256.0, 256.0, 1.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 3.0, 2.0 ** -8], dtype=torch.bfloat16)
    assert fray.vector_add(a, b).tolist() == [256.0, 260.0, 1.0]
    assert torch.equal(fray.vector_add(a, b), torch.add(a, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_tensor_runs_reference(dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 3, 33, generator=g).to(dtype)
    b = torch.randn(5, 3, 33, generator=g).to(dtype)
    y = fray.vector_add(a, b)
    assert y.dtype == dtype and y.shape == a.shape and y.device.type == "cpu"
    assert_close(y, _ref(a, b), dtype, "cpu reference")
    assert torch.equal(y, a + b)  # one rounding of an exact sum: torch.add's result
    out = torch.full_like(a, float("nan"))
    assert fray.vector_add(a, b, out=out) is out
    assert torch.equal(out, y)
    # in place, and a dense non-contiguous layout shared by both
    at, bt = a.transpose(0, 2), b.transpose(0, 2)
    assert torch.equal(fray.vector_add(at, bt), at + bt)
    assert fray.vector_add(a, b, out=a) is a and torch.equal(a, y)
    # empty and 0-d
    assert fray.vector_add(torch.empty(0, 4, dtype=dtype), torch.empty(0, 4, dtype=dtype)).shape == (0, 4)
    assert fray.vector_add(torch.tensor(1.5, dtype=dtype), torch.tensor(2.0, dtype=dtype)).item() == 3.5


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernel under TRITON_INTERPRET=1 (set by the Bazel CPU target)

@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 3, 111, 4096, 4097, 10000])
def test_triton_interpreter_vs_reference(dtype, n):
    from fray_triton import elementwise as tew
    g = torch.Generator().manual_seed(n)
    a = (torch.randn(n, generator=g) * 100).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    out = torch.full_like(a, float("nan"))
    tew.vector_add(a, b, out, n)
    assert_close(out, _ref(a, b), dtype, "triton n=%d" % n)
    assert torch.equal(out, a + b), "not bitwise torch.add (one rounding of the fp32 sum)"
    tew.vector_add(a, b, a, n)  # in place
    assert torch.equal(a, out)


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    with pytest.raises(TypeError, match="a: expected dtype"):
        fray.vector_add(a.to(torch.int32), b.to(torch.int32))
    with pytest.raises(TypeError, match="b: expected dtype float32 \\(that of a\\), got float16"):
        fray.vector_add(a, b.half())
    with pytest.raises(TypeError, match="out: expected dtype float32 \\(that of a\\), got bfloat16"):
        fray.vector_add(a, b, out=torch.empty(4, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"b: expected shape \(4, 8\) \(that of a; no broadcasting\), got \(8,\)"):
        fray.vector_add(a, torch.randn(8))
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 8\)"):
        fray.vector_add(a, b, out=torch.empty(8, 4))
    with pytest.raises(ValueError, match="a: expected a contiguous tensor"):
        fray.vector_add(torch.randn(4, 16)[:, ::2], b)
    with pytest.raises(ValueError, match="b: expected a contiguous tensor"):
        fray.vector_add(a, torch.randn(1, 8).expand(4, 8))
    with pytest.raises(ValueError, match="b: expected the strides of a"):
        fray.vector_add(a, torch.randn(8, 4).t())  # dense, but a different layout than a's
    with pytest.raises(ValueError, match="out: expected a contiguous tensor"):
        fray.vector_add(a, b, out=torch.empty(4, 16)[:, :8])
    with pytest.raises(ValueError, match="out: overlaps a without being a itself"):
        buf = torch.randn(40)
        fray.vector_add(buf[:32].view(4, 8), b, out=buf[8:40].view(4, 8))
    with pytest.raises(TypeError, match="b: expected a tensor on cpu"):
        fray.vector_add(a, torch.empty(4, 8, device="meta"))
    with pytest.raises(TypeError, match="b: expected a torch.Tensor"):
        fray.vector_add(a, [1.0] * 8)
    with pytest.raises(TypeError, match="b: expected a numpy.ndarray"):
        fray.vector_add(a.numpy(), b)
    with pytest.raises(ValueError, match="b: expected shape"):
        fray.vector_add(a.numpy(), np.zeros(3, dtype=np.float32))
    with pytest.raises(TypeError, match="b: expected dtype float32"):
        fray.vector_add(a.numpy(), b.numpy().astype(np.float64))
    with pytest.raises(ValueError, match="backend: expected one of"):
        fray.vector_add(a, b, backend="cublas")
    with pytest.raises(ValueError, match="backend: 'cuda' needs CUDA tensors"):
        fray.vector_add(a, b, backend="cuda")


# ---------------------------------------------------------------------------------------------
# CPU: the CUDA extension builds, links and imports (no GPU needed)

def test_cuda_extension_imports():
    ext = B.load_extension("elementwise")
    assert not isinstance(ext, ImportError), ext
    assert "90a" in ext.archs().split(",")
    assert ext.cuda_runtime_version() >= 13000
    assert hasattr(torch.ops.fray, "vector_add") and hasattr(torch.ops.fray, "vector_add_")
    assert fray.OPS["vector_add"] == "elementwise"


# ---------------------------------------------------------------------------------------------
# GPU

SIZES = [1, 3, 111, 4097, (1 << 20) + 3, 1 << 26]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_gpu_vs_reference(cuda, backend, dtype, n):
    g = torch.Generator(device=cuda).manual_seed(n)
    a = torch.randn(n, device=cuda, generator=g).to(dtype)
    b = torch.randn(n, device=cuda, generator=g).to(dtype)
    out = torch.full_like(a, float("nan"))  # poisoned: every element must be written
    y = fray.vector_add(a, b, out=out, backend=backend)
    torch.cuda.synchronize()
    assert y is out
    assert_close(y, _ref(a, b), dtype, "%s n=%d" % (backend, n))
    assert torch.equal(y, torch.add(a, b)), "not bitwise torch.add"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_in_place_and_misaligned(cuda, backend, dtype):
    n = 100003
    a = torch.randn(n + 16, device=cuda).to(dtype)
    b = torch.randn(n + 16, device=cuda).to(dtype)
    expected = torch.add(a, b)
    # element offsets of a / b / out: all 1 share a misalignment (scalar head, 128-bit body);
    # 1 / 2 / 1 do not (scalar kernel); 0 / 0 / 0 is the plain aligned case
    for oa, ob, oo in ((1, 1, 1), (1, 2, 1), (0, 0, 0)):
        buf = torch.full((n + 16,), float("nan"), device=cuda, dtype=dtype)
        out = buf[oo:oo + n]
        fray.vector_add(a[oa:oa + n], b[ob:ob + n], out=out, backend=backend)
        assert torch.equal(out, torch.add(a[oa:oa + n], b[ob:ob + n])), "offsets %d/%d/%d" % (oa, ob, oo)
    x, y = a.clone(), b.clone()
    assert fray.vector_add(x, y, out=x, backend=backend) is x  # a += b
    assert torch.equal(x, expected)
    x = a.clone()
    assert fray.vector_add(b, x, out=x, backend=backend) is x  # b += a
    assert torch.equal(x, expected)
    x = a.clone()
    fray.vector_add(x, x, out=x, backend=backend)  # x = 2x, exact
    assert torch.equal(x, a * 2)
    # a dense, non-contiguous layout shared by all three
    at, bt = a[:4096].view(64, 64).t(), b[:4096].view(64, 64).t()
    yt = fray.vector_add(at, bt, backend=backend)
    assert yt.stride() == at.stride() and torch.equal(yt, at + bt)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_cuda_graph_capture_and_replay(cuda, backend):
    a = torch.randn(1 << 20, device=cuda, dtype=torch.bfloat16)
    b = torch.randn(1 << 20, device=cuda, dtype=torch.bfloat16)
    out = torch.empty_like(a)
    fray.vector_add(a, b, out=out, backend=backend)  # warm-up (Triton compiles here)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fray.vector_add(a, b, out=out, backend=backend)
        fray.vector_add(out, b, out=out, backend=backend)  # in place inside the graph too
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch.add(torch.add(a, b), b)), "%s graph replay" % backend


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda", "triton"])
@pytest.mark.parametrize("inplace", [False, True])
def test_gpu_torch_compile_fullgraph(cuda, backend, inplace):
    a = torch.randn(33, 1000, device=cuda, dtype=torch.float16)
    b = torch.randn(33, 1000, device=cuda, dtype=torch.float16)

    def f(a, b):
        # ops before and after the custom op, so that the compiler has something to fuse
        x = a * 2.0
        y = fray.vector_add(x, b, out=x if inplace else None, backend=backend)
        return y + 1.0, x

    y, x = torch.compile(f, fullgraph=True)(a, b)
    ey, ex = f(a, b)
    assert torch.equal(y, ey) and torch.equal(x, ex)
    assert torch.equal(y, torch.add(a * 2.0, b) + 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_non_default_stream(cuda, backend):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        a = torch.randn(1 << 24, device=cuda, dtype=torch.bfloat16)
        b = torch.randn(1 << 24, device=cuda, dtype=torch.bfloat16)
        y = fray.vector_add(a, b, backend=backend)
    stream.synchronize()
    assert torch.equal(y, torch.add(a, b)), "%s side stream" % backend


@pytest.mark.gpu
def test_gpu_auto_and_empty(cuda):
    a = torch.randn(16, 256, device=cuda, dtype=torch.bfloat16)
    assert torch.equal(fray.vector_add(a, a), a * 2)
    assert B.resolve("vector_add", "elementwise", "auto", a.device) in ("cuda", "triton")
    e = torch.empty(0, 256, device=cuda, dtype=torch.bfloat16)
    assert fray.vector_add(e, e).shape == (0, 256)
    s = torch.tensor(1.25, device=cuda)
    assert fray.vector_add(s, s).item() == 2.5


def test_flat_kernels_compile_for_sm90a():
    """The flat streaming kernels (fray_triton._flat's shape: vector_add / mul, axpy, the unary
    activations) through Triton's compiled path for sm_90a, both offset widths, 16-byte vectors
    when aligned, no spills."""
    from fray.testing import compile_triton_sm90, sm90_spec
    specs = []
    for t in ("*bf16", "*fp16", "*fp32"):
        for wide in (False, True):
            specs += [sm90_spec("fray_triton.elementwise", "_binary_kernel", {"A": t, "B": t, "OUT": t},
                                dict(OP=op, BLOCK=4096, WIDE=wide), divisible=("A", "B", "OUT", "n")) for op in (0, 1)]
            specs.append(sm90_spec("fray_triton.elementwise", "_axpy_kernel", {"X": t, "OUT": t, "alpha": "fp32",
                                                                               "beta": "fp32"},
                                   dict(BLOCK=4096, WIDE=wide), divisible=("X", "OUT", "n")))
            specs.append(sm90_spec("fray_triton.activation", "_unary_kernel", {"X": t, "OUT": t},
                                   dict(ACT=0, BLOCK=4096, WIDE=wide), divisible=("X", "OUT", "n")))
    assert all(r["spills"] == 0 for r in compile_triton_sm90(specs))
