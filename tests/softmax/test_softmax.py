"""fray.softmax: reference, Triton (interpreter on CPU), CUDA (GPU), error contract."""
import math
import os

import numpy as np
import pytest
import torch

import fray
from fray import backend as B
from fray.reference import softmax as ref
from fray.testing import assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _ref(x, temperature=1.0, dim=-1):
    return ref.softmax(x.to(torch.float64), temperature, axis=dim)


def _assert_softmax(y, x, dtype, what, temperature=1.0, dim=-1):
    """y vs the float64 reference; rows whose reference is NaN (all -inf) must be NaN."""
    e = _ref(x, temperature, dim)
    nan = torch.isnan(e)
    y64 = y.detach().to("cpu", torch.float64)
    nan = nan.to("cpu")
    assert torch.equal(torch.isnan(y64), nan), "%s: NaN pattern differs from the reference" % what
    assert_close(y64[~nan], e.to("cpu")[~nan], dtype, what)


# ---------------------------------------------------------------------------------------------
# CPU: reference against hand-computed values

def test_reference_hand_computed():
    # exp(0) = 1, exp(ln 3) = 3: [1, 3] / 4.
    np.testing.assert_allclose(ref.softmax(np.array([0.0, math.log(3.0)])), [0.25, 0.75], rtol=1e-15)
    # temperature 2: exp(ln 3 / 2) = sqrt(3).
    r3 = math.sqrt(3.0)
    np.testing.assert_allclose(ref.softmax(np.array([0.0, math.log(3.0)]), temperature=2.0),
                               [1 / (1 + r3), r3 / (1 + r3)], rtol=1e-15)
    # shift invariance, and a large offset does not overflow
    np.testing.assert_allclose(ref.softmax(np.array([1000.0, 1000.0 + math.log(3.0)])), [0.25, 0.75], rtol=1e-12)
    # axis 0 of a 2-d array: columns [0, ln 3] and [ln 3, 0]
    y = ref.softmax(np.array([[0.0, math.log(3.0)], [math.log(3.0), 0.0]]), axis=0)
    np.testing.assert_allclose(y, [[0.25, 0.75], [0.75, 0.25]], rtol=1e-15)


def test_reference_inf_rows():
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, math.log(3.0)], [np.inf, 0.0, 1.0]])
    y = ref.softmax(x)
    assert np.isnan(y[0]).all()             # all -inf: NaN, as torch.softmax
    np.testing.assert_allclose(y[1], [0.25, 0.0, 0.75], rtol=1e-15)
    assert np.isnan(y[2]).all()             # +inf: NaN
    t = torch.tensor(x)
    assert torch.equal(torch.isnan(torch.softmax(t, -1)), torch.from_numpy(np.isnan(y)))


def test_numpy_in_numpy_out():
    x = np.array([[0.0, math.log(3.0)], [2.0, 2.0]], dtype=np.float32)
    y = fray.softmax(x)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (2, 2)
    np.testing.assert_allclose(y, [[0.25, 0.75], [0.5, 0.5]], rtol=1e-6)
    y16 = fray.softmax(x, out_dtype=torch.float16)
    assert y16.dtype == np.float16
    y64 = fray.softmax(x.astype(np.float16), out_dtype=np.float64, temperature=2.0)
    assert y64.dtype == np.float64
    out = np.empty_like(x)
    assert fray.softmax(x, dim=0, out=out) is out
    np.testing.assert_allclose(out[:, 0], [1 / (1 + math.exp(2.0)), math.exp(2.0) / (1 + math.exp(2.0))], rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_tensor_runs_reference(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 3, 33, generator=g) * 3).to(dtype)
    y = fray.softmax(x, temperature=0.7)
    assert y.dtype == dtype and y.shape == x.shape and y.device.type == "cpu"
    assert_close(y, _ref(x, 0.7), dtype, "cpu reference")
    out = torch.full_like(x, float("nan"))
    assert fray.softmax(x, temperature=0.7, out=out) is out
    assert torch.equal(out, y)
    y32 = fray.softmax(x, out_dtype=torch.float32)
    assert y32.dtype == torch.float32
    assert_close(y32, _ref(x), torch.float32, "cpu out_dtype")


def test_cpu_dim_on_transposed_view():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(4, 6, 5, generator=g)        # contiguous [4, 6, 5]
    x = base.transpose(1, 2)                        # [4, 5, 6], dim 2 -> stride 5, dim 1 -> stride 1
    y = fray.softmax(x, dim=1)
    assert y.shape == x.shape
    assert_close(y, _ref(x, dim=1), torch.float32, "dim=1")
    with pytest.raises(ValueError, match=r"x: the softmax dimension \(dim=0\) must have stride 1"):
        fray.softmax(x, dim=0)
    with pytest.raises(ValueError, match="x: the last dimension must be contiguous"):
        fray.softmax(x, dim=-1)


def test_cpu_neg_inf_rows_and_empty():
    x = torch.tensor([[float("-inf")] * 4, [0.0, float("-inf"), math.log(3.0), float("-inf")]])
    y = fray.softmax(x)
    assert torch.isnan(y[0]).all()
    assert_close(y[1], torch.tensor([0.25, 0.0, 0.75, 0.0], dtype=torch.float64), torch.float32, "partial -inf")
    for shape in ((4, 0), (0, 8), (2, 0, 3)):
        e = fray.softmax(torch.empty(shape, dtype=torch.bfloat16))
        assert e.shape == shape and e.dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernels under TRITON_INTERPRET=1 (set by the Bazel CPU target)

def _triton_softmax(x2d, temperature=1.0, out_dtype=None, num_sms=None):
    from fray_triton import softmax as tsoftmax
    out = torch.full(x2d.shape, float("nan"), dtype=out_dtype or x2d.dtype)
    tsoftmax.softmax(x2d, out, temperature, x2d.stride(0), out.stride(0), x2d.shape[0], x2d.shape[1],
                     num_sms=num_sms)
    return out


@INTERPRETER
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (4, 33), (5, 300), (2, 40000), (1, 70001)])
def test_triton_interpreter_vs_reference(dtype, rows, cols):
    # 40000 > MAX_SINGLE_BLOCK: the two-pass kernel (per-lane online pass, then the row backwards);
    # 70001: its wide tile
    from fray_triton import softmax as tsoftmax
    assert 40000 > tsoftmax.MAX_SINGLE_BLOCK and 70001 >= tsoftmax.WIDE_LOOP_FROM > 40000
    g = torch.Generator().manual_seed(rows * 100003 + cols)
    x = (torch.randn(rows, cols, generator=g) * 3).to(dtype)
    assert_close(_triton_softmax(x), _ref(x), dtype, "triton %dx%d" % (rows, cols))
    assert_close(_triton_softmax(x, temperature=2.5), _ref(x, 2.5), dtype, "triton T=2.5")


@INTERPRETER
def test_triton_interpreter_persistent():
    # 16-bit rows of 8193..32768 with an SM count: the persistent kernel, here 2 programs over 5
    # rows (each walks several), a strided view, -inf rows and a temperature
    from fray_triton import softmax as tsoftmax
    cols = 8200
    assert tsoftmax.PERSIST_FROM <= cols <= tsoftmax.PERSIST_MAX
    g = torch.Generator().manual_seed(cols)
    big = (torch.randn(5, cols + 8, generator=g) * 3).to(torch.bfloat16)
    x = big[:, :cols]
    x[1] = float("-inf")
    x[3, : cols // 2] = float("-inf")
    y = _triton_softmax(x, temperature=0.8, out_dtype=torch.float32, num_sms=1)
    _assert_softmax(y, x, torch.float32, "triton persistent", temperature=0.8)


@INTERPRETER
@pytest.mark.parametrize("cols", [6, 40000])
def test_triton_interpreter_inf_rows_out_dtype_strided(cols):
    g = torch.Generator().manual_seed(cols)
    big = (torch.randn(4, cols + 16, generator=g) * 3).to(torch.bfloat16)
    x = big[:, 8:8 + cols]                       # row stride cols + 16
    x[1] = float("-inf")                         # all -inf row -> NaN
    x[2, ::2] = float("-inf")                    # partly -inf row -> zeros there
    y = _triton_softmax(x, out_dtype=torch.float32)  # fp32 output from bf16 input
    _assert_softmax(y, x, torch.float32, "triton -inf rows")


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="x: expected dtype"):
        fray.softmax(x.to(torch.int32))
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        fray.softmax([1.0, 2.0])
    with pytest.raises(ValueError, match="x: expected at least 1 dimension"):
        fray.softmax(torch.tensor(1.0))
    for bad in (0.0, -1.0, float("inf"), float("nan"), 1e-40):
        with pytest.raises(ValueError, match="temperature: expected a finite value > 0"):
            fray.softmax(x, temperature=bad)
    with pytest.raises(TypeError, match="temperature: expected a float"):
        fray.softmax(x, temperature="hot")
    with pytest.raises(ValueError, match=r"dim: expected a value in \[-2, 1\]"):
        fray.softmax(x, dim=2)
    with pytest.raises(TypeError, match="dim: expected an int"):
        fray.softmax(x, dim=1.0)
    with pytest.raises(TypeError, match="out_dtype: expected None, torch.float32"):
        fray.softmax(x, out_dtype=torch.float64)
    with pytest.raises(TypeError, match="out_dtype: expected None, torch.float32"):
        fray.softmax(x, out_dtype="fp32")
    with pytest.raises(TypeError, match="out_dtype: bfloat16 has no numpy counterpart"):
        fray.softmax(x.numpy(), out_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"out: expected dtype bfloat16 \(out_dtype\), got float32"):
        fray.softmax(x, out_dtype=torch.bfloat16, out=torch.empty(4, 8))
    with pytest.raises(TypeError, match=r"out: expected dtype float32 \(that of x\)"):
        fray.softmax(x, out=torch.empty(4, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 8\), got \(4, 9\)"):
        fray.softmax(x, out=torch.empty(4, 9))
    with pytest.raises(TypeError, match="out: expected a tensor on cpu"):
        fray.softmax(x, out=torch.empty(4, 8, device="meta"))
    with pytest.raises(TypeError, match="out: expected a numpy.ndarray"):
        fray.softmax(x.numpy(), out=torch.empty(4, 8))
    with pytest.raises(ValueError, match="out: rows overlap"):
        fray.softmax(torch.randn(2, 8), out=torch.empty(12).as_strided((2, 8), (4, 1)))
    with pytest.raises(ValueError, match="x: the last dimension must be contiguous"):
        fray.softmax(torch.randn(8, 4).t())
    with pytest.raises(ValueError, match="backend: expected one of"):
        fray.softmax(x, backend="cutlass")
    with pytest.raises(ValueError, match="backend: 'cuda' needs CUDA tensors"):
        fray.softmax(x, backend="cuda")


# ---------------------------------------------------------------------------------------------
# CPU: the CUDA extension builds, links and imports (no GPU needed)

def test_cuda_extension_imports():
    ext = B.load_extension("softmax")
    assert not isinstance(ext, ImportError), ext
    assert "90a" in ext.archs().split(",")
    assert ext.cuda_runtime_version() >= 13000
    assert ext.num_kernel_instances() > 0
    assert hasattr(torch.ops.fray, "softmax") and hasattr(torch.ops.fray, "online_softmax")


# ---------------------------------------------------------------------------------------------
# GPU

WIDTHS = [1, 3, 111, 4097, 16384, 32768, 65536, 131072, 262144]
ROWS = [1, 7, 64]
# Around the CUDA kernel boundaries (16-byte vectors: 8 bf16/fp16 or 4 fp32 elements):
# 16384 last register row; then the shared-memory kernel with slices <= 64 KB per block:
# bf16 16392 / 32768 one block, 32776 a cluster of 2, 131080 of 8 (32 KB); fp32 16388 a
# cluster of 2; then 8 blocks of up to 224 KB: bf16 262152 (64 KB + 16 B each), 917504 (224 KB);
# beyond: streaming (bf16 917512, fp32 458756). Odd widths are unaligned (scalar): 32767 a
# register cluster of 16, 32769 and 65537 streaming.
THRESHOLD_WIDTHS = [16388, 16392, 32767, 32769, 32776, 65537, 131080, 262152, 458752, 458756, 917504, 917512]


def _randn(shape, device, seed, dtype, scale=3.0):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, device=device, generator=g) * scale).to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", WIDTHS)
@pytest.mark.parametrize("rows", ROWS)
def test_gpu_vs_reference(cuda, backend, dtype, cols, rows):
    x = _randn((rows, cols), cuda, cols * 31 + rows, dtype)
    out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    y = fray.softmax(x, out=out, backend=backend)
    torch.cuda.synchronize()
    assert y is out
    assert_close(y, _ref(x), dtype, "%s %dx%d" % (backend, rows, cols))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", THRESHOLD_WIDTHS)
def test_gpu_wide_row_thresholds(cuda, backend, dtype, cols):
    x = _randn((3, cols), cuda, cols * 7 + 1, dtype)
    x[1, : cols // 2] = float("-inf")  # -inf over whole blocks of a cluster
    x[2] = float("-inf")               # all -inf: NaN
    out = torch.full_like(x, float("nan"))
    fray.softmax(x, out=out, backend=backend)
    _assert_softmax(out, x, dtype, "%s %s %d" % (backend, dtype, cols))
    assert torch.isnan(out[2]).all() and (out[1, : cols // 2] == 0).all()
    # other output dtype (16-bit -> fp32, fp32 -> bf16) and a temperature
    odt = torch.bfloat16 if dtype == torch.float32 else torch.float32
    y = torch.full(x.shape, float("nan"), dtype=odt, device=cuda)
    fray.softmax(x, temperature=0.7, out_dtype=odt, out=y, backend=backend)
    _assert_softmax(y, x, odt, "%s %s -> %s T=0.7 %d" % (backend, dtype, odt, cols), temperature=0.7)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cols", [8193, 16384, 20000, 32768])
def test_gpu_many_rows_persistent(cuda, backend, dtype, cols):
    # More rows than the Triton persistent kernel's programs (1-2 per SM), so each program walks
    # several rows with the next ones' loads in flight: strided rows, -inf rows spread over the
    # batch, a temperature and an fp32 output.
    rows = 700
    big = _randn((rows, cols + 16), cuda, cols * 5 + 3, dtype)
    x = big[:, 8:8 + cols]
    x[::97] = float("-inf")
    x[1::89, : cols // 3] = float("-inf")
    out = torch.full_like(x, float("nan"))
    fray.softmax(x, out=out, backend=backend)
    _assert_softmax(out, x, dtype, "%s %s %dx%d" % (backend, dtype, rows, cols))
    y = torch.full(x.shape, float("nan"), dtype=torch.float32, device=cuda)
    fray.softmax(x, temperature=0.7, out_dtype=torch.float32, out=y, backend=backend)
    _assert_softmax(y, x, torch.float32, "%s %s -> fp32 T=0.7 %dx%d" % (backend, dtype, rows, cols),
                    temperature=0.7)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("cols", [1000, 4096, 65536, 262144, 65537, 300000])
def test_gpu_out_dtype_and_temperature(cuda, backend, cols):
    # 65537 (odd: scalar loads) and 300000 (> 16 x 16384) run the CUDA streaming kernel.
    x = _randn((3, cols), cuda, cols, torch.bfloat16)
    y = fray.softmax(x, out_dtype=torch.float32, backend=backend)
    assert y.dtype == torch.float32
    assert_close(y, _ref(x), torch.float32, "%s bf16 -> fp32" % backend)
    x32 = _randn((3, cols), cuda, cols + 1, torch.float32)
    for temperature in (0.5, 3.0):
        out = torch.full(x32.shape, float("nan"), dtype=torch.float16, device=cuda)
        fray.softmax(x32, temperature=temperature, out_dtype=torch.float16, out=out, backend=backend)
        assert_close(out, _ref(x32, temperature), torch.float16, "%s fp32 -> fp16 T=%g" % (backend, temperature))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [64, 4096, 5000, 32768, 131072, 262144])
@pytest.mark.parametrize("offset", [8, 3])
def test_gpu_strided_rows_and_in_place(cuda, backend, dtype, cols, offset):
    big = _randn((3, 5, cols + 24), cuda, cols + offset, dtype)
    # 3-d view, rows strided by cols + 24; offset 8 keeps 16-byte alignment, 3 breaks it
    x = big[..., offset:offset + cols]
    expected = _ref(x)
    y = fray.softmax(x, backend=backend)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, expected, dtype, "%s strided" % backend)
    assert fray.softmax(x, out=x, backend=backend) is x
    assert_close(x, expected, dtype, "%s in place" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("cols", [5, 4096, 32768, 65536, 262144])
def test_gpu_neg_inf_rows(cuda, backend, cols):
    x = _randn((4, cols), cuda, cols, torch.bfloat16)
    x[1] = float("-inf")                 # all -inf: NaN (torch.softmax's result)
    x[2, 1::2] = float("-inf")           # partly -inf: exact zeros there
    x[3, : cols // 2] = float("-inf")    # -inf over whole threads / blocks of a cluster
    y = fray.softmax(x, backend=backend)
    _assert_softmax(y, x, torch.bfloat16, "%s -inf rows" % backend)
    assert torch.equal(torch.isnan(y[1]), torch.ones(cols, dtype=torch.bool, device=cuda))
    assert (y[2, 1::2] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_dim_transposed_view(cuda, backend):
    base = _randn((4, 30, 1000), cuda, 5, torch.float16)  # contiguous
    x = base.transpose(1, 2)  # [4, 1000, 30], strides (30000, 1, 1000): dim 1 has stride 1
    y = fray.softmax(x, dim=1, backend=backend)
    assert y.shape == x.shape
    assert_close(y, _ref(x, dim=1), torch.float16, "%s dim=1" % backend)
    with pytest.raises(ValueError, match="the softmax dimension"):
        fray.softmax(x, dim=0, backend=backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("rows,cols,dtype", [(64, 4096, torch.bfloat16), (16, 32768, torch.bfloat16),
                                             (8, 131072, torch.bfloat16), (4, 262144, torch.bfloat16),
                                             (4, 262144, torch.float32), (4, 32767, torch.bfloat16)])
def test_gpu_cuda_graph_capture_and_replay(cuda, backend, rows, cols, dtype):
    # CUDA backend: 32768 (bf16) is one shared-memory block per row, 131072 a cluster of 4, 262144
    # one of 8 (fp32: 128 KB slices); the launcher sets the dynamic shared-memory limit, also while
    # capturing. 32767 (unaligned) is a register cluster of 16 (non-portable size opt-in).
    x = torch.randn(rows, cols, device=cuda, dtype=dtype)
    out = torch.empty_like(x)
    fray.softmax(x, out=out, temperature=1.5, backend=backend)  # warm-up (Triton compiles here)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fray.softmax(x, out=out, temperature=1.5, backend=backend)
    for _ in range(3):
        x.copy_(torch.randn_like(x) * 3)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, _ref(x, 1.5), dtype, "%s graph replay" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda", "triton"])
def test_gpu_torch_compile_fullgraph(cuda, backend):
    x = torch.randn(33, 1000, device=cuda, dtype=torch.float16)

    def f(x):
        # ops before and after the custom op, so that the compiler has something to fuse
        return fray.softmax(x * 2.0, temperature=0.8, out_dtype=torch.float32, backend=backend), x + 1.0

    compiled = torch.compile(f, fullgraph=True)
    y, z = compiled(x)
    assert y.dtype == torch.float32
    assert_close(y, _ref(x * 2.0, 0.8), torch.float32, "compiled")
    ey, ez = f(x)
    assert torch.equal(y, ey) and torch.equal(z, ez)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_non_default_stream(cuda, backend):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.randn(4096, 8192, device=cuda, dtype=torch.bfloat16)
        y = fray.softmax(x, backend=backend)
    stream.synchronize()
    assert_close(y, _ref(x), torch.bfloat16, "%s side stream" % backend)


@pytest.mark.gpu
def test_gpu_aliases_and_auto(cuda):
    x = torch.randn(16, 256, device=cuda, dtype=torch.bfloat16)
    expected = _ref(x)
    assert_close(fray.triton.softmax(x), expected, torch.bfloat16, "fray.triton.softmax")
    assert_close(fray.jit_kernels.softmax(x), expected, torch.bfloat16, "fray.jit_kernels.softmax")
    assert_close(fray.softmax(x), expected, torch.bfloat16, "auto")
    assert B.resolve("softmax", "softmax", "auto", x.device) in ("cuda", "triton")
    empty = fray.softmax(torch.empty(0, 256, device=cuda, dtype=torch.bfloat16))
    assert empty.shape == (0, 256)
    assert fray.softmax(torch.empty(4, 0, device=cuda)).shape == (4, 0)
