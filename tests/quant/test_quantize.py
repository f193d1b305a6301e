"""fray.quantize: reference (hand-computed rounding, saturation, subnormals, zero groups, NaN / inf),
Triton int8 (interpreter on CPU), error contract, GPU (large shapes, torch.compile, CUDA graphs, fp8;
the CUDA quantizers bit for bit against the reference and Triton)."""
import os

import numpy as np
import pytest
import torch

import fray
from fray.ops import quant
from fray.reference import quant as ref

INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
CASES = quant.CASES
I8, E4M3 = torch.int8, torch.float8_e4m3fn


def _x(m, k, dtype=torch.bfloat16, seed=0, scale=4.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g) * scale).to(dtype)


def _kw(granularity, block):
    return dict(granularity=granularity, block=block or (1, 128))


def _triton(x, dtype, granularity, block, scale=None):
    from fray_triton import quant as tq
    q, s, amax = quant._quantize_outputs(x, dtype, granularity, block, scale, None)
    q.fill_(99)  # poisoned: every element must be written
    if scale is None:
        s.fill_(-1.0)
    tq.quantize(x, q, s, granularity, block, quant.QMAX[dtype], dtype == E4M3, scale is not None, amax)
    return q, s


# ---------------------------------------------------------------------------------------------
# CPU: reference

def test_hand_computed_ties_to_even():
    # amax 254 -> scale 2: 1/2 = 0.5 -> 0, 3/2 = 1.5 -> 2, 5/2 = 2.5 -> 2, -7/2 = -3.5 -> -4
    x = np.array([[1.0, 3.0, 5.0, -7.0, 254.0, -254.0]], np.float32)
    q, s = fray.quantize(x, granularity="token")
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (1, 1)
    assert q.tolist() == [[0, 2, 2, -4, 127, -127]] and s.tolist() == [[2.0]]


def test_ties_after_the_fp32_division():
    # a static scale of 2: the odd integers land exactly on k + 0.5 and go to the even neighbour
    x = torch.arange(-9, 10, 2, dtype=torch.float32)[None, :]  # odd integers
    q, _ = fray.quantize(x, granularity="tensor", scale=torch.tensor(2.0))
    assert q.tolist() == [[int(np.rint(v / 2)) for v in x[0].tolist()]]
    assert q[0, :].tolist() == [-4, -4, -2, -2, 0, 0, 2, 2, 4, 4]


def test_saturation_int8_never_minus_128():
    s = torch.tensor([[1.0]])
    x = torch.tensor([[127.4, 127.5, 128.0, 1e30, -127.5, -128.0, -1e30, 126.5]])
    q, _ = fray.quantize(x, granularity="token", scale=s)
    assert q.tolist() == [[127, 127, 127, 127, -127, -127, -127, 126]]


def test_saturation_e4m3():
    s = torch.tensor([[1.0]])
    x = torch.tensor([[448.0, 449.0, 463.0, 480.0, 1e30, -448.0, -1e30, 416.0, 432.0, 400.0]])
    q, _ = fray.quantize(x, E4M3, granularity="token", scale=s)
    assert q.dtype == E4M3
    # the step in [256, 512) is 32: 432 lies halfway between 416 (mantissa 101) and 448 (110) and
    # goes to the even 448; 400, between 384 (100) and 416, goes to 384
    assert q.float().tolist() == [[448.0, 448.0, 448.0, 448.0, 448.0, -448.0, -448.0, 416.0, 448.0, 384.0]]


def test_e4m3_rounding_matches_torch_cast():
    y = np.linspace(-450.0, 450.0, 40001).astype(np.float32).astype(np.float64)
    c = np.clip(y, -448, 448)
    expected = torch.from_numpy(c).float().to(E4M3).double().numpy()
    assert np.array_equal(ref.round_e4m3(c), expected)
    tiny = np.array([2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -9, 5 * 2.0 ** -10, 2.0 ** -6 * 1.0625])
    assert np.array_equal(ref.round_e4m3(tiny), torch.from_numpy(tiny).float().to(E4M3).double().numpy())


def test_zero_groups_get_scale_one():
    x = torch.zeros(3, 4)
    x[1] = torch.tensor([0.0, -0.0, 0.0, 2.54])
    q, s = fray.quantize(x, granularity="token")
    assert s.flatten().tolist() == [1.0, float(np.float32(np.float32(2.54) / np.float32(127))), 1.0]
    assert q[0].tolist() == [0, 0, 0, 0] and q[1, 3].item() == 127


def test_subnormals():
    tiny = float(np.float32(2.0 ** -140))   # an fp32 subnormal: amax / 127 underflows toward 0
    sub = float(np.float32(2.0 ** -126) * 3)  # a normal amax whose scale is subnormal
    x = torch.tensor([[tiny, -tiny], [sub, sub / 2]])
    q, s = fray.quantize(x, granularity="token")
    s0 = np.float32(np.float32(tiny) / np.float32(127))
    assert s[0, 0].item() == (1.0 if s0 == 0 else float(s0))
    assert s[1, 0].item() == float(np.float32(np.float32(sub) / np.float32(127))) and q[1, 0].item() == 127
    assert q[1, 1].item() == int(np.rint(np.float32(np.float32(sub / 2) / s[1, 0].numpy())))
    # bf16 subnormals in a block
    xb = torch.full((2, 130), 2.0 ** -130).to(torch.bfloat16)
    q, s = fray.quantize(xb, granularity="block", block=(1, 128))
    assert s.shape == (2, 2) and (q == 127).all()


def test_nan_and_inf_rule():
    # NaN and +-inf are left out of the amax; inf saturates, NaN -> 0 (int8) / NaN (e4m3)
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), 254.0, 1.0]])
    q, s = fray.quantize(x, granularity="token")
    assert s.item() == 2.0 and q.tolist() == [[0, 127, -127, 127, 0]]
    q8, s8 = fray.quantize(x, E4M3, granularity="token")
    assert s8.item() == np.float32(np.float32(254.0) / np.float32(448.0))
    v = q8.float()[0]
    assert torch.isnan(v[0]) and v[1] == 448 and v[2] == -448 and v[3] == 448
    # a group of NaN / inf only: scale 1
    q, s = fray.quantize(torch.tensor([[float("nan"), float("inf")]]), granularity="tensor")
    assert s.shape == () and s.item() == 1.0 and q.tolist() == [[0, 127]]


@pytest.mark.parametrize("granularity,block", CASES)
@pytest.mark.parametrize("m,k", [(1, 1), (5, 3), (37, 200), (130, 257)])
def test_scale_shapes_and_groups(granularity, block, m, k):
    x = _x(m, k, torch.float32, seed=m + k)
    q, s = fray.quantize(x, **_kw(granularity, block))
    assert tuple(s.shape) == ref.scale_shape(granularity, m, k, block) and s.dtype == torch.float32
    # each group's amax element maps to +-127, scales = fp32(amax / 127)
    a = ref.amax(x.double().numpy(), granularity, block)
    e = (a.astype(np.float32) / np.float32(127)).astype(np.float32)
    assert np.array_equal(s.numpy(), np.where(e == 0, 1, e))
    assert q.abs().max().item() == 127
    # a brute-force check of one element per group kind
    se = ref.expand(s.numpy(), granularity, m, k, block)
    assert np.array_equal(q.numpy(), np.clip(np.rint(x.numpy() / se), -127, 127).astype(np.int8))


def test_static_scale_tensor_shapes():
    x = _x(4, 6, torch.float32)
    for s in (torch.tensor(0.05), torch.tensor([0.05])):
        q, got = fray.quantize(x, scale=s)
        assert got is s
        assert torch.equal(q, torch.clamp(torch.round(x / 0.05), -127, 127).to(I8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_input_dtypes_and_out(dtype):
    x = _x(9, 33, dtype)
    out = torch.empty(9, 33, dtype=I8)
    q, s = fray.quantize(x, granularity="channel", out=out)
    assert q is out
    e, es = ref.quantize(x.double().numpy(), "int8", "channel")
    assert np.array_equal(q.numpy(), e) and np.array_equal(s.numpy(), es)


def test_numpy_in_numpy_out():
    x = np.random.default_rng(0).standard_normal((7, 9)).astype(np.float16)
    q, s = fray.quantize(x, granularity="block", block=(128, 128))
    assert isinstance(q, np.ndarray) and q.dtype == np.int8 and s.shape == (1, 1)


def test_mn_major_layout_on_the_cpu_and_its_refusals():
    x = _x(7, 300, torch.float32, seed=2)
    q, s = fray.quantize(x, granularity="block", block=(1, 128))
    q2, s2 = fray.quantize(x, granularity="block", block=(1, 128), scale_layout="mn_major")
    assert s2.stride() == (1, 8) and torch.equal(s2, s) and torch.equal(q2, q)
    qa, sa = fray.quantize(x.numpy(), granularity="block", block=(1, 128), scale_layout="mn_major")
    assert sa.strides == (4, 32) and np.array_equal(sa, s.numpy()) and np.array_equal(qa, q.numpy())
    for kw, needle in ((dict(granularity="token"), "granularity='token'"),
                       (dict(granularity="block", block=(128, 128)), r"block=\(128, 128\)"),
                       (dict(granularity="block", scale=torch.ones(7, 3)), "a static scale")):
        with pytest.raises(ValueError, match="scale_layout: 'mn_major' is the layout of dynamic .*" + needle):
            fray.quantize(x, scale_layout="mn_major", **kw)
    with pytest.raises(ValueError, match="scale_layout: expected one of 'row', 'mn_major', got 'col'"):
        fray.quantize(x, granularity="block", scale_layout="col")


@INTERPRETER
@pytest.mark.parametrize("m,k", [(1, 1), (37, 200), (6, 16500)])
def test_triton_mn_major_scales(m, k):
    """Both dynamic block kernels (rows in registers; past ROW_MAX, per group) write the scales
    through their strides: DeepGEMM's layout holds the row-major scales' bits, padding untouched."""
    from fray_triton import quant as tq
    x = _x(m, k, torch.bfloat16, seed=k)
    kb = -(-k // 128)
    outs = []
    for layout in ("row", "mn_major"):
        q = torch.empty(m, k, dtype=I8)
        if layout == "row":
            s = torch.empty(m, kb)
        else:
            buf = torch.full((kb, -(-m // 4) * 4), -7.0)
            s = quant.mn_major_view(m, kb, lambda shape: buf)
            assert s.stride() == (1, buf.shape[1]) and s.data_ptr() == buf.data_ptr()
        tq.quantize(x, q, s, "block", (1, 128), 127.0, False, False)
        outs.append((q, s))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert (buf[:, m:] == -7.0).all()
    quant._assert_quantize_matches(x, I8, "block", (1, 128), *outs[1])


# ---------------------------------------------------------------------------------------------
# CPU: Triton under the interpreter (int8; its float8 conversion does not round as the hardware does)

@INTERPRETER
@pytest.mark.parametrize("granularity,block", CASES)
@pytest.mark.parametrize("m,k", [(1, 1), (37, 200), (130, 131), (3, 16500)])
def test_triton_int8_matches_reference(granularity, block, m, k):
    """(3, 16500): past the register-resident rows (fray_triton.quant.ROW_MAX), the per-group kernel."""
    x = _x(m, k, torch.bfloat16, seed=k)
    x[0, 0] = float("nan")
    if k > 1:
        x[-1, -1] = -float("inf")
    x[m // 2] = 0.0  # a zero row
    q, s = _triton(x, I8, granularity, block)
    quant._assert_quantize_matches(x, I8, granularity, block, q, s)


@INTERPRETER
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_ties_saturation_and_static(dtype):
    x = torch.tensor([[1.0, 3.0, 5.0, -7.0, 255.0, -256.0, 300.0, -1.0]] * 3, dtype=dtype)
    s = torch.tensor([[2.0]] * 3)
    q, got = _triton(x, I8, "token", None, scale=s)
    assert got is s and q[0].tolist() == [0, 2, 2, -4, 127, -127, 127, 0]
    q, s = _triton(x, I8, "tensor", None)
    quant._assert_quantize_matches(x, I8, "tensor", None, q, s)


@INTERPRETER
@pytest.mark.parametrize("granularity,block", CASES)
def test_triton_static_scales(granularity, block):
    x = _x(20, 140, torch.float32)
    shape = ref.scale_shape(granularity, 20, 140, block)
    s = (torch.rand(shape, generator=torch.Generator().manual_seed(1)) * 0.05 + 0.01).float()
    q, _ = _triton(x, I8, granularity, block, scale=s)
    e, _ = ref.quantize(x.double().numpy(), "int8", granularity, block, s.numpy())
    assert np.array_equal(q.numpy(), e)


# ---------------------------------------------------------------------------------------------
# error contract

@pytest.mark.parametrize("call,exc,needle", [
    (lambda x: fray.quantize(x.double()), TypeError, "x:"),
    (lambda x: fray.quantize(x.to(torch.int8)), TypeError, "x:"),
    (lambda x: fray.quantize(x[0]), ValueError, "x:"),
    (lambda x: fray.quantize(x[None]), ValueError, "x:"),
    (lambda x: fray.quantize(x.t()), ValueError, "x:"),
    (lambda x: fray.quantize([[1.0]]), TypeError, "x:"),
    (lambda x: fray.quantize(x, torch.float16), TypeError, "dtype:"),
    (lambda x: fray.quantize(x, torch.float8_e5m2), TypeError, "dtype:"),
    (lambda x: fray.quantize(x, granularity="row"), ValueError, "granularity:"),
    (lambda x: fray.quantize(x, granularity="block", block=(64, 128)), ValueError, "block:"),
    (lambda x: fray.quantize(x, granularity="block", block=128), ValueError, "block:"),
    (lambda x: fray.quantize(x, granularity="block", block=None), ValueError, "block:"),
    (lambda x: fray.quantize(x, granularity="token", scale=torch.ones(1, 1)), ValueError, "scale:"),
    (lambda x: fray.quantize(x, granularity="channel", scale=torch.ones(4, 1)), ValueError, "scale:"),
    (lambda x: fray.quantize(x, granularity="block", block=(1, 128), scale=torch.ones(4, 1)), ValueError, "scale:"),
    (lambda x: fray.quantize(x, granularity="token", scale=torch.ones(4, 1, dtype=torch.float16)), TypeError,
     "scale:"),
    (lambda x: fray.quantize(x, scale=0.5), TypeError, "scale:"),
    (lambda x: fray.quantize(x, out=torch.empty(4, 200, dtype=torch.float32)), TypeError, "out:"),
    (lambda x: fray.quantize(x, out=torch.empty(4, 100, dtype=torch.int8)), ValueError, "out:"),
    (lambda x: fray.quantize(x.numpy(), torch.float8_e4m3fn), TypeError, "dtype:"),
    (lambda x: fray.quantize(x, backend="triton"), ValueError, "backend:"),
    (lambda x: fray.quantize(x, backend="nope"), ValueError, "backend:"),
])
def test_errors_name_the_argument(call, exc, needle):
    x = _x(4, 200, torch.float32)
    with pytest.raises(exc, match=needle):
        call(x)


# ---------------------------------------------------------------------------------------------
# GPU

BIG = (16384, 8192)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [I8, E4M3])
@pytest.mark.parametrize("granularity,block", CASES)
def test_gpu_large_vs_reference(cuda, dtype, granularity, block):
    x = _x(*BIG, torch.bfloat16, seed=3).to(cuda)
    q, s = fray.quantize(x, dtype, **_kw(granularity, block))
    quant._assert_quantize_matches(x, dtype, granularity, block, q, s)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [I8, E4M3])
def test_gpu_awkward_shapes_nan_inf(cuda, dtype):
    for granularity, block in CASES:
        x = _x(333, 1000, torch.bfloat16, seed=5)
        x[0, 0], x[1, 1], x[2] = float("nan"), float("inf"), 0.0
        q, s = fray.quantize(x.to(cuda), dtype, **_kw(granularity, block))
        quant._assert_quantize_matches(x, dtype, granularity, block, q, s)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k", [(1, 4096), (1000, 7168), (33, 20000)])
def test_gpu_mn_major_scales(cuda, m, k):
    """scale_layout="mn_major" (DeepGEMM's TMA-aligned layout): the same scales and q as row-major
    (both kernels: rows held in registers and, past ROW_MAX, the per-group one), eager, compiled
    and replayed from a CUDA graph; dequantize and scaled_gemm take them as they are."""
    x = _x(m, k, torch.bfloat16, seed=m).to(cuda)
    q, s = fray.quantize(x, E4M3, granularity="block", block=(1, 128))
    q2, s2 = fray.quantize(x, E4M3, granularity="block", block=(1, 128), scale_layout="mn_major")
    assert s2.stride() == (1, -(-m // 4) * 4) and torch.equal(s2, s)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
    f = torch.compile(lambda t: fray.quantize(t, E4M3, granularity="block", block=(1, 128), scale_layout="mn_major"),
                      fullgraph=True)
    q3, s3 = f(x)
    assert s3.stride() == s2.stride() and torch.equal(s3, s) and torch.equal(q3.view(torch.uint8), q.view(torch.uint8))
    static = x.clone()
    fray.quantize(static, E4M3, granularity="block", block=(1, 128), scale_layout="mn_major")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q4, s4 = fray.quantize(static, E4M3, granularity="block", block=(1, 128), scale_layout="mn_major")
    static.copy_(_x(m, k, torch.bfloat16, seed=m + 1).to(cuda))
    graph.replay()
    torch.cuda.synchronize()
    qr, sr = fray.quantize(static, E4M3, granularity="block", block=(1, 128))
    assert torch.equal(s4, sr) and torch.equal(q4.view(torch.uint8), qr.view(torch.uint8))
    back = fray.dequantize(q2, s2, granularity="block", block=(1, 128), dtype=torch.float32)
    assert torch.equal(back, fray.dequantize(q, s, granularity="block", block=(1, 128), dtype=torch.float32))
    if k % 128 == 0:
        w = _x(256, k, torch.bfloat16, seed=3).to(cuda)
        wq, ws = fray.quantize(w, E4M3, granularity="block", block=(128, 128))
        assert torch.equal(fray.scaled_gemm(q2, wq, s2, ws), fray.scaled_gemm(q, wq, s, ws))



# The CUDA quantizers (cuda/quant): granularity token and block (1, 128), dynamic and static.
CUDA_CASES = quant.CUDA_CASES


def _special_x(m, k, dtype, seed):
    """x with NaN, +-inf, a zero row, fp32 subnormals, values that tie after the division and
    magnitudes past the int8 / e4m3 range (saturating under a static scale), as a view whose rows
    start one element into a wider buffer (unaligned: the element path) when `seed` is odd."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 4
    flat = x.view(-1)
    n = flat.numel()
    for i, v in enumerate((float("nan"), float("inf"), -float("inf"), 1e-40, -1e-40, 2.5, -3.5, 1e6)):
        flat[(i * 7919) % n] = v
    if m > 2:
        x[2] = 0.0
    x = x.to(dtype)
    if seed % 2:
        wide = torch.full((m, k + 3), 7.0, dtype=dtype)
        wide[:, 1:k + 1] = x
        return wide[:, 1:k + 1]
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("qdtype", [I8, E4M3])
@pytest.mark.parametrize("xdtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("granularity,block", CUDA_CASES)
def test_gpu_cuda_quantizers_match_the_reference(cuda, qdtype, xdtype, granularity, block):
    """backend="cuda" bit for bit against the exact reference and the Triton kernel: rows of 1 to
    16500 elements (one group, a partial last group, the register-held chunks and the re-read
    tail), aligned and unaligned rows, special values; static scales too."""
    for seed, (m, k) in enumerate([(1, 1), (1, 7), (5, 3), (37, 200), (130, 257), (3, 16500), (64, 8192),
                                   (9, 8200)]):
        x = _special_x(m, k, xdtype, seed).to(cuda)
        what = "cuda %s %s->%s %dx%d%s" % (granularity, xdtype, qdtype, m, k, " unaligned" if seed % 2 else "")
        q, s = fray.quantize(x, qdtype, **_kw(granularity, block), backend="cuda")
        quant._assert_quantize_matches(x, qdtype, granularity, block, q, s, what)
        qt, st = fray.quantize(x, qdtype, **_kw(granularity, block), backend="triton")
        assert torch.equal(s, st) and torch.equal(q.view(torch.uint8), qt.view(torch.uint8)), what + ": != triton"
        given = (torch.rand(s.shape, generator=torch.Generator().manual_seed(seed)) * 0.05 + 1e-3).to(cuda)
        out = torch.full((m, k), 5, dtype=torch.int8, device=cuda).view(qdtype)  # poisoned bytes
        q2, s2 = fray.quantize(x, qdtype, **_kw(granularity, block), scale=given, out=out, backend="cuda")
        assert q2 is out and s2 is given
        eq = ref.quantize(x.double().cpu().numpy(), quant._REF_NAME[qdtype], granularity, block,
                          given.cpu().numpy())[0]
        assert np.array_equal(q2.cpu().float().numpy(), eq, equal_nan=True), what + ": static scales"


@pytest.mark.gpu
def test_gpu_cuda_quantizers_mn_major_graph_compile_and_refusals(cuda):
    """The CUDA block quantizer writes DeepGEMM's MN-major scale layout, replays from a CUDA graph
    with new inputs, runs under torch.compile, and backend="cuda" refuses what it has no kernel for."""
    m, k = 1000, 7168
    x = _x(m, k, torch.bfloat16, seed=11).to(cuda)
    q, s = fray.quantize(x, E4M3, granularity="block", block=(1, 128), backend="cuda")
    q2, s2 = fray.quantize(x, E4M3, granularity="block", block=(1, 128), scale_layout="mn_major", backend="cuda")
    assert s2.stride() == (1, -(-m // 4) * 4) and torch.equal(s2, s)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
    f = torch.compile(lambda t: fray.quantize(t, I8, granularity="token", backend="cuda"), fullgraph=True)
    q3, s3 = f(x)
    quant._assert_quantize_matches(x, I8, "token", None, q3, s3, "cuda token under torch.compile")
    static = x.clone()
    fray.quantize(static, I8, granularity="token", backend="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q4, s4 = fray.quantize(static, I8, granularity="token", backend="cuda")
    new = _x(m, k, torch.bfloat16, seed=12)
    static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    quant._assert_quantize_matches(new, I8, "token", None, q4, s4, "cuda token replayed")
    for granularity, block in (("tensor", None), ("channel", None), ("block", (128, 128))):
        with pytest.raises(ValueError, match="backend='cuda'"):
            fray.quantize(x, I8, **_kw(granularity, block), backend="cuda")

@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph(cuda):
    def f(x):
        q, s = fray.quantize(x, granularity="block", block=(1, 128))
        q8, s8 = fray.quantize(x, torch.float8_e4m3fn, granularity="channel")
        return q, s, q8, s8

    x = _x(1000, 2048, torch.bfloat16).to(cuda)
    got = torch.compile(f, fullgraph=True)(x)
    expected = f(x)
    assert all(torch.equal(a.view(torch.uint8) if a.dtype == E4M3 else a,
                           b.view(torch.uint8) if b.dtype == E4M3 else b) for a, b in zip(got, expected))


@pytest.mark.gpu
@pytest.mark.parametrize("granularity,block", [("tensor", None), ("token", None), ("block", (128, 128))])
def test_gpu_cuda_graph_replay(cuda, granularity, block):
    static = _x(512, 1024, torch.bfloat16).to(cuda)
    fray.quantize(static, **_kw(granularity, block))  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = fray.quantize(static, **_kw(granularity, block))
    for seed in range(3):
        new = _x(512, 1024, torch.bfloat16, seed=seed + 1)
        static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        quant._assert_quantize_matches(new, I8, granularity, block, q, s)


@pytest.mark.gpu
@pytest.mark.parametrize("granularity,block", CASES)
def test_gpu_fp8_round_trip(cuda, granularity, block):
    x = _x(*BIG, torch.bfloat16, seed=7).to(cuda)
    q, s = fray.quantize(x, E4M3, **_kw(granularity, block))
    back = fray.dequantize(q, s, granularity=granularity, block=block, dtype=torch.float32)
    # e4m3 keeps 3 mantissa bits: half an ulp is 1/16 relative, plus the subnormal step near 0
    se = torch.from_numpy(ref.expand(s.cpu().numpy(), granularity, *BIG, block)).to(cuda)
    err = (back - x.float()).abs()
    assert (err <= x.float().abs() / 16 + se * 2.0 ** -10).all()


def test_kernels_compile_for_sm90a():
    """Every quantize / dequantize kernel through Triton's compiled path for sm_90a, int8 and fp8
    from each input dtype (the interpreter runs neither the fp8 casts nor the type checks of
    compiled code: a kernel that returned int8 on one constexpr branch and fp8 on the other passed
    every interpreter test)."""
    from fray.testing import compile_triton_sm90, sm90_spec
    from fray_triton import quant as Q
    m, specs = "fray_triton.quant", []
    for qtype in ("*i8", "*fp8e4nv"):
        for xtype in ("*bf16", "*fp16", "*fp32"):
            fp8 = qtype != "*i8"
            io = {"X": xtype, "Q": qtype, "S": "*fp32", "qmax": "fp32"}
            specs += [sm90_spec(m, "_quant_groups_kernel", io, dict(FP8=fp8, SHARED=False, BM=16, CK=1024)),
                      sm90_spec(m, "_quant_groups_kernel", io, dict(FP8=fp8, SHARED=True, BM=128, CK=64), num_warps=8),
                      sm90_spec(m, "_dequant_kernel", {"Q": qtype, "S": "*fp32", "X": xtype}, dict(BM=Q.TM, BK=Q.TK))]
            specs += [sm90_spec(m, "_quant_scaled_kernel", dict(io, A="*i32" if a else "*fp32"),
                                dict(FP8=fp8, FROM_AMAX=a, BM=Q.TM, BK=Q.TK)) for a in (True, False)]
        specs.append(sm90_spec(m, "_amax_kernel", {"X": "*bf16", "A": "*i32"}, dict(CHANNEL=qtype == "*i8", BM=Q.TM,
                                                                                        BK=Q.TK)))
    assert len(compile_triton_sm90(specs)) == len(specs)
