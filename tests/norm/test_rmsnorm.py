"""fray.rmsnorm: reference, Triton (interpreter on CPU), CUDA (GPU), error contract."""
import math

import numpy as np
import pytest
import torch

import fray
from fray import backend as B
from fray.reference import norm as ref
from fray.testing import assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _ref(x, w, eps, offset=0.0):
    return ref.rmsnorm(x.to(torch.float64), w.to(torch.float64), eps, offset)


# ---------------------------------------------------------------------------------------------
# CPU: reference against hand-computed values

def test_reference_hand_computed():
    # x = [3, 4]: mean(x^2) = 12.5, rms = sqrt(12.5) = 3.5355339...; w = [1, 2].
    y = ref.rmsnorm(np.array([[3.0, 4.0]]), np.array([1.0, 2.0]), 0.0)
    rms = math.sqrt(12.5)
    np.testing.assert_allclose(y, [[3.0 / rms, 8.0 / rms]], rtol=1e-15)
    # eps enters under the root: x = [1], eps = 3 -> 1 / sqrt(1 + 3) = 0.5.
    np.testing.assert_allclose(ref.rmsnorm(np.array([1.0]), np.array([1.0]), 3.0), [0.5], rtol=1e-15)
    # Gemma's (1 + w): w = [0, 1] with offset 1 equals w = [1, 2].
    y1 = ref.rmsnorm(np.array([[3.0, 4.0]]), np.array([0.0, 1.0]), 0.0, weight_offset=1.0)
    np.testing.assert_allclose(y1, y, rtol=1e-15)


def test_numpy_in_numpy_out():
    x = np.array([[3.0, 4.0], [1.0, -1.0]], dtype=np.float32)
    y = fray.rmsnorm(x, np.array([1.0, 2.0], dtype=np.float32), eps=0.0)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (2, 2)
    np.testing.assert_allclose(y, [[3 / math.sqrt(12.5), 8 / math.sqrt(12.5)], [1.0, -2.0]], rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_tensor_runs_reference(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 33, generator=g).to(dtype)
    w = torch.randn(33, generator=g).to(dtype)
    y = fray.rmsnorm(x, w, eps=1e-6)
    assert y.dtype == dtype and y.shape == x.shape and y.device.type == "cpu"
    assert_close(y, _ref(x, w, 1e-6), dtype, "cpu reference")
    out = torch.full_like(x, float("nan"))
    assert fray.rmsnorm(x, w, eps=1e-6, out=out) is out
    assert torch.equal(out, y)


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernels under TRITON_INTERPRET=1 (set by the Bazel CPU target)

def _triton_rmsnorm(x2d, w, eps, offset=0.0):
    from fray_triton import norm as tnorm
    out = torch.full_like(x2d, float("nan"))
    tnorm.rmsnorm(x2d, w, out, eps, offset, x2d.stride(0), out.stride(0), x2d.shape[0], x2d.shape[1])
    return out


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1",
                    reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,hidden", [(1, 1), (3, 7), (4, 33), (2, 128), (5, 300), (2, 16385)])
def test_triton_interpreter_vs_reference(dtype, rows, hidden):
    g = torch.Generator().manual_seed(rows * 100003 + hidden)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    assert_close(_triton_rmsnorm(x, w, 1e-6), _ref(x, w, 1e-6), dtype, "triton %dx%d" % (rows, hidden))


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1",
                    reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
def test_triton_interpreter_strided_rows_fp32_weight_gemma():
    g = torch.Generator().manual_seed(7)
    big = torch.randn(6, 96, generator=g).to(torch.bfloat16)
    x = big[:, 8:72]  # row stride 96, 64 columns
    w = torch.randn(64, generator=g)  # fp32 weight with bf16 x
    y = _triton_rmsnorm(x, w, 1e-5, offset=1.0)
    assert_close(y, _ref(x, w, 1e-5, 1.0), torch.bfloat16, "triton strided")


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    x = torch.randn(4, 8)
    w = torch.randn(8)
    with pytest.raises(TypeError, match="x: expected dtype"):
        fray.rmsnorm(x.to(torch.int32), w)
    with pytest.raises(TypeError, match="weight: expected dtype"):
        fray.rmsnorm(x, w.to(torch.float16))
    with pytest.raises(ValueError, match=r"weight: expected shape \(8,\), got \(7,\)"):
        fray.rmsnorm(x, torch.randn(7))
    with pytest.raises(TypeError, match="weight: expected a tensor on cpu"):
        fray.rmsnorm(x, torch.empty(8, device="meta"))
    with pytest.raises(TypeError, match="weight: expected a numpy.ndarray"):
        fray.rmsnorm(x.numpy(), w)
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        fray.rmsnorm([1.0, 2.0], w)
    with pytest.raises(ValueError, match="x: the last dimension must be contiguous"):
        fray.rmsnorm(torch.randn(8, 4).t(), w)
    with pytest.raises(ValueError, match="eps: expected a finite value >= 0"):
        fray.rmsnorm(x, w, eps=-1.0)
    with pytest.raises(ValueError, match="backend: expected one of"):
        fray.rmsnorm(x, w, backend="cutlass")
    with pytest.raises(ValueError, match="backend: 'cuda' needs CUDA tensors"):
        fray.rmsnorm(x, w, backend="cuda")
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        fray.rmsnorm(x, w, out=torch.empty(4, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 8\)"):
        fray.rmsnorm(x, w, out=torch.empty(4, 9))
    with pytest.raises(ValueError, match="x: the normalised"):
        fray.rmsnorm(torch.empty(4, 0), torch.empty(0))


def test_row_collapse_rules():
    from fray import _validate as V
    big = torch.empty(4, 5, 16)
    assert V.row_stride("x", big[:, :, :8]) == 16          # 3-d slice collapses, stride 16
    assert V.row_stride("x", torch.empty(1, 1, 8)) == 8
    with pytest.raises(ValueError, match="evenly strided rows"):
        V.row_stride("x", big[:, :3, :8])                  # 5 -> 3 rows breaks the collapse
    with pytest.raises(ValueError, match="rows overlap"):
        V.row_stride("out", torch.empty(1, 8).expand(3, 8), writable=True)


# ---------------------------------------------------------------------------------------------
# CPU: the CUDA extension builds, links and imports (no GPU needed)

def test_cuda_extension_imports():
    ext = B.load_extension("norm")
    assert not isinstance(ext, ImportError), ext
    assert "90a" in ext.archs().split(",")
    assert ext.cuda_runtime_version() >= 13000
    assert ext.num_kernel_instances() > 0
    assert hasattr(torch.ops.fray, "rmsnorm") and hasattr(torch.ops.fray, "add_rmsnorm_")


def test_cuda_adapter_refuses_weight_dtypes_by_op_name():
    # The launcher checks before it touches a device: null pointers never reach a launch.
    ext = B.load_extension("norm")
    bf16, f16 = 2, 1
    with pytest.raises(ValueError, match="fray: rmsnorm weight dtype float16 .* x dtype bfloat16"):
        ext.rmsnorm((0, 0, 0, 0, 0), (8, 8, 0, 0, 1, 8, bf16, f16), (1e-6, 0.0), 0, 0)
    with pytest.raises(ValueError, match="fray: add_rmsnorm weight dtype float16"):
        ext.rmsnorm((0, 0, 0, 16, 0), (8, 8, 8, 8, 1, 8, bf16, f16), (1e-6, 0.0), 0, 0)
    with pytest.raises(ValueError, match="fray: layernorm weight dtype float16"):
        ext.layernorm((0, 0, 0, 0), (8, 8, 1, 8, bf16, f16), (1e-5,), 0, 0)


def test_generic_binder_refuses_malformed_calls():
    ext = B.load_extension("norm")
    with pytest.raises(ValueError, match="rmsnorm expects 5 ptrs, 8 ints, 2 floats; got 4, 8, 2"):
        ext.rmsnorm((0, 0, 0, 0), (8, 8, 0, 0, 1, 8, 2, 2), (1e-6, 0.0), 0, 0)
    with pytest.raises(TypeError, match="ints must be a tuple, got list"):
        ext.layernorm((0, 0, 0, 0), [8, 8, 1, 8, 2, 2], (1e-5,), 0, 0)
    with pytest.raises(TypeError, match="takes .ptrs, ints, floats, device, stream., got 4"):
        ext.layernorm((0, 0, 0, 0), (8, 8, 1, 8, 2, 2), (1e-5,), 0)
    with pytest.raises(TypeError):
        ext.layernorm((0, 0, 0, 0), (8, 8, 1, 8, 2, 2), ("eps",), 0, 0)


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
    g = torch.Generator(device=cuda).manual_seed(hidden * 31 + rows)
    x = torch.randn(rows, hidden, device=cuda, generator=g).to(dtype)
    w = torch.randn(hidden, device=cuda, generator=g).to(dtype)
    out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    y = fray.rmsnorm(x, w, eps=1e-6, out=out, backend=backend)
    torch.cuda.synchronize()
    assert y is out
    assert_close(y, _ref(x, w, 1e-6), dtype, "%s %dx%d" % (backend, rows, hidden))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 4096, 5000, 131072])
@pytest.mark.parametrize("offset", [8, 3])
def test_gpu_strided_fp32_weight_gemma_nd(cuda, backend, dtype, hidden, offset):
    g = torch.Generator(device=cuda).manual_seed(hidden + offset)
    big = torch.randn(3, 5, hidden + 24, device=cuda, generator=g).to(dtype)
    # 3-d view, rows strided by hidden + 24; offset 8 keeps 16-byte alignment, 3 breaks it
    x = big[..., offset:offset + hidden]
    w = torch.randn(hidden, device=cuda, generator=g)  # fp32 weight
    y = fray.rmsnorm(x, w, eps=1e-5, backend=backend, weight_offset=1.0)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, _ref(x, w, 1e-5, 1.0), dtype, "%s strided" % backend)
    # in place (out is x)
    expected = _ref(x, w, 1e-5, 1.0)
    assert fray.rmsnorm(x, w, eps=1e-5, out=x, backend=backend, weight_offset=1.0) is x
    assert_close(x, expected, dtype, "%s in place" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_cuda_graph_capture_and_replay(cuda, backend):
    x = torch.randn(128, 4096, device=cuda, dtype=torch.bfloat16)
    w = torch.randn(4096, device=cuda, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    fray.rmsnorm(x, w, out=out, backend=backend)  # warm-up (Triton compiles here)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fray.rmsnorm(x, w, out=out, backend=backend)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, _ref(x, w, 1e-6), torch.bfloat16, "%s graph replay" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda", "triton"])
def test_gpu_torch_compile_fullgraph(cuda, backend):
    x = torch.randn(33, 1000, device=cuda, dtype=torch.float16)
    w = torch.randn(1000, device=cuda, dtype=torch.float16)

    def f(x, w):
        # ops before and after the custom op, so that the compiler has something to fuse
        return fray.rmsnorm(x * 2.0, w, eps=1e-5, backend=backend), x + 1.0

    compiled = torch.compile(f, fullgraph=True)
    y, z = compiled(x, w)
    assert_close(y, _ref(x * 2.0, w, 1e-5), torch.float16, "compiled")
    ey, ez = f(x, w)
    assert torch.equal(y, ey) and torch.equal(z, ez)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_non_default_stream(cuda, backend):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.randn(4096, 8192, device=cuda, dtype=torch.bfloat16)
        w = torch.randn(8192, device=cuda, dtype=torch.bfloat16)
        y = fray.rmsnorm(x, w, backend=backend)
    stream.synchronize()
    assert_close(y, _ref(x, w, 1e-6), torch.bfloat16, "%s side stream" % backend)


@pytest.mark.gpu
def test_gpu_aliases_and_auto(cuda):
    x = torch.randn(16, 256, device=cuda, dtype=torch.bfloat16)
    w = torch.randn(256, device=cuda, dtype=torch.bfloat16)
    expected = _ref(x, w, 1e-6)
    assert_close(fray.triton.rmsnorm(x, w), expected, torch.bfloat16, "fray.triton.rmsnorm")
    assert_close(fray.rmsnorm(x, w), expected, torch.bfloat16, "auto")
    assert B.resolve("rmsnorm", "norm", "auto", x.device) in ("cuda", "triton")
    empty = fray.rmsnorm(torch.empty(0, 256, device=cuda, dtype=torch.bfloat16), w)
    assert empty.shape == (0, 256)


def _round_kernel():
    import triton
    import triton.language as tl

    from fray_triton.norm import _round

    @triton.jit
    def kernel(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, _round(tl.load(X + i), Y.dtype.element_ty))

    kernel.fn.__globals__["_round"] = _round  # jit resolves names in the defining module
    return kernel


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1",
                    reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
def test_triton_bf16_rounding_helper():
    """fray_triton.norm._round: round-to-nearest-even to bf16, carries into the exponent, inf and
    every NaN payload (the GPU's canonical NaN is 0x7FFFFFFF) stay what they are."""
    kernel = _round_kernel()
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F80C000, 0x3FFFFFFF, 0x7F800000, 0x7FFFFFFF,
                         0xFFC00001, 0x00000001], dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    y = torch.empty(8, dtype=torch.bfloat16)
    kernel[(1,)](x, y, N=8)
    # ties to even (1.00390625 -> 1.0, 1.01171875 -> 1.015625), above half rounds up, mantissa
    # carry into the exponent (1.99999 -> 2.0), inf, NaNs, subnormal -> 0
    assert y[:5].tolist() == [1.0, 1.015625, 1.0078125, 2.0, float("inf")]
    assert torch.isnan(y[5:7]).all()
    assert y[7].item() == 0.0
