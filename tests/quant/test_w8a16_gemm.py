"""fray.w8a16_gemm: the float64 reference (hand values, against dequantize), the Triton kernel under
the interpreter (int8 weights, every scale kind), the error contract, the CUDA TUs built for
sm_90a, and on the GPU both backends against the float64 reference (bf16 / fp16 x int8 / e4m3,
every scale kind, bias), exactness, every tuning candidate, the fallbacks, CUDA graphs, side
streams and torch.compile."""
import ctypes
import os
import re

import numpy as np
import pytest
import torch

import fray
from fray import testing
from fray.ops import quant as Q
from fray.reference import quant as ref

INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
I8, E4M3 = torch.int8, torch.float8_e4m3fn
BF16, FP16 = torch.bfloat16, torch.float16
KINDS = ("tensor", "channel", "group")


# ---------------------------------------------------------------------------------------------
# CPU: reference

def test_reference_hand_values():
    x = np.array([[1.0, -2.0], [3.0, 4.0]])
    w = np.array([[5.0, 6.0], [-7.0, 8.0], [1.0, 1.0]])
    # x @ w.T = [[-7, -23, -1], [39, 11, 7]], times a scale per output channel, + bias
    out = ref.w8a16_gemm(x, w, np.array([1.0, 2.0, 4.0]), "channel", np.array([0.25, 0.0, -1.0]))
    np.testing.assert_array_equal(out, [[-6.75, -46.0, -5.0], [39.25, 22.0, 27.0]])
    np.testing.assert_array_equal(ref.w8a16_gemm(x, w, np.float64(0.5), "tensor"), [[-3.5, -11.5, -0.5],
                                                                                    [19.5, 5.5, 3.5]])


def test_reference_group_scales_per_slice():
    # K = 130: two groups (128 + 2); every product of row n takes s[n, k // 128]
    n, k = 2, 130
    x = np.ones((1, k))
    w = np.ones((n, k))
    s = np.array([[1.0, 100.0], [0.5, 1000.0]])
    out = ref.w8a16_gemm(x, w, s, "group")
    assert out[0, 0] == 128 + 200 and out[0, 1] == 64 + 2000


@pytest.mark.parametrize("wdt", [I8, E4M3], ids=["int8", "e4m3"])
@pytest.mark.parametrize("kind", KINDS)
def test_reference_equals_the_dequantized_product(wdt, kind):
    """Weights quantized by fray.quantize, scales as it writes them: the reference is x @ (q * s)^T with s
    laid out as dequantize reads it."""
    gran, block = {"tensor": ("tensor", None), "channel": ("token", None), "group": ("block", (1, 128))}[kind]
    g = torch.Generator().manual_seed(3)
    w_full = torch.randn(40, 300, generator=g)
    x = torch.randn(5, 300, generator=g)
    q, s = fray.quantize(w_full, wdt, granularity=gran, block=block or (1, 128))
    assert Q._w8a16_kind(s, 40, 300) == kind
    # dequantize's layout of the scales, in float64 (dequantize itself rounds q * s to fp32)
    wd = q.float().double().numpy() * ref.expand(s.double().numpy(), gran, 40, 300, block)
    exp = x.double().numpy() @ wd.T
    got = ref.w8a16_gemm(x.double().numpy(), q.float().double().numpy(), s.double().numpy(), kind)
    np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)


def test_scale_kinds_from_shapes():
    n, k = 300, 260  # 3 groups of K
    assert Q._w8a16_kind(torch.ones(()), n, k) == "tensor"
    assert Q._w8a16_kind(torch.ones(1), n, k) == "tensor"
    assert Q._w8a16_kind(torch.ones(n), n, k) == "channel"
    assert Q._w8a16_kind(torch.ones(n, 1), n, k) == "channel"
    assert Q._w8a16_kind(torch.ones(n, 3), n, k) == "group"
    with pytest.raises(ValueError, match=r"w_scale: expected one scale .*\[300, 3\]\), got shape \(300, 2\)"):
        Q._w8a16_kind(torch.ones(n, 2), n, k)
    with pytest.raises(ValueError, match="w_scale: expected"):
        Q._w8a16_kind(torch.ones(1, n), n, k)


@INTERPRETER
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("m,n,k", [(1, 40, 64), (7, 17, 200), (20, 130, 131)])
def test_triton_interpreter_int8(kind, bias, m, n, k):
    from fray_triton import w8a16_gemm as tw
    x, w, s, b = Q.w8a16_operands(m, n, k, FP16, I8, kind, seed=m + k, bias=bias)
    out = torch.full((m, n), float("nan"), dtype=FP16)
    tw.w8a16_gemm(x, w, s, Q._w8a16_lds(kind, s), kind == "group", b, out, tw.config_for(m))
    Q.assert_w8a16_close(out, x, w, s, kind, b, what="interpreter %s %dx%dx%d" % (kind, m, n, k))


# ---------------------------------------------------------------------------------------------
# CPU: the error contract

def _call(**over):
    x, w, s, _ = Q.w8a16_operands(4, 32, 64, BF16, I8, "channel")
    args = dict(x=x, w=w, w_scale=s)
    args.update(over)
    return fray.w8a16_gemm(args.pop("x"), args.pop("w"), args.pop("w_scale"), **args)


@pytest.mark.parametrize("over,exc,msg", [
    (dict(x=torch.zeros(4, 64)), TypeError, "x: expected dtype bfloat16 or float16, got float32"),
    (dict(w=torch.zeros(32, 64, dtype=torch.bfloat16)), TypeError, "w: expected dtype int8 or float8_e4m3fn"),
    (dict(w_scale=torch.ones(32, dtype=torch.float16)), TypeError, "w_scale: expected float32 scales"),
    (dict(x=torch.zeros(4, 2, 64, dtype=torch.bfloat16)), ValueError, r"x: expected a 2-d \[M, K\] operand"),
    (dict(w=torch.zeros(32, 63, dtype=torch.int8)), ValueError, r"w: expected \[N, K\] with K = 64"),
    (dict(x=torch.zeros(64, 4, dtype=torch.bfloat16).t()), ValueError, "x: the last dimension must be contiguous"),
    (dict(w_scale=torch.ones(33)), ValueError, r"w_scale: expected one scale"),
    (dict(w_scale=torch.ones(32, 2)[:, :1]), ValueError, "w_scale: expected a contiguous"),
    (dict(bias=torch.zeros(32)), TypeError, "bias: expected dtype bfloat16"),
    (dict(bias=torch.zeros(31, dtype=torch.bfloat16)), ValueError, "bias"),
    (dict(out=torch.zeros(4, 32, dtype=torch.float16)), TypeError, "out: expected dtype bfloat16"),
    (dict(out=torch.zeros(4, 31, dtype=torch.bfloat16)), ValueError, "out"),
    (dict(backend="cuda"), ValueError, "backend"),
    (dict(backend="nope"), ValueError, "backend"),
    (dict(x=[[1.0]]), TypeError, "x: expected a torch.Tensor"),
])
def test_error_contract(over, exc, msg):
    with pytest.raises(exc, match=msg):
        _call(**over)


def test_cpu_tensors_and_empty_shapes():
    for kind in KINDS:
        x, w, s, b = Q.w8a16_operands(3, 20, 300, BF16, I8, kind, bias=True)
        out = fray.w8a16_gemm(x, w, s, bias=b)
        exp = ref.w8a16_gemm(x.double().numpy(), w.double().numpy(), s.double().numpy(), kind, b.double().numpy())
        assert out.dtype == BF16 and torch.equal(out, torch.from_numpy(exp).to(BF16))
    x, w, s, _ = Q.w8a16_operands(0, 20, 64, FP16, E4M3, "channel")
    assert fray.w8a16_gemm(x, w, s).shape == (0, 20)
    out = torch.empty(2, 20, dtype=FP16)
    fray.w8a16_gemm(torch.zeros(2, 64, dtype=FP16), w, s, out=out)
    assert torch.equal(out, torch.zeros(2, 20, dtype=FP16))


# ---------------------------------------------------------------------------------------------
# CPU: the CUDA translation units

def test_kernel_sources_name_their_configuration():
    name, src = Q.w8a16_kernel_source(Q.W8A16_CANDIDATES[0], BF16, I8, "group", True, 1)
    assert name == "gemm_w8a16_bf16_int8_group_bias_m8_r32_w8_k1024_s3_z1"
    assert ("SmallMBulkConfig<__nv_bfloat16, __nv_bfloat16, true, 1, 2, 8, 1024, 3, 1, false, int8_t, "
            "fray::gemm::small_m::kScaleGroup>") in src
    # one scale and one per channel are the same kernel (the row stride 0 broadcasts)
    n_t, src_t = Q.w8a16_kernel_source(Q.W8A16_CANDIDATES[2], FP16, E4M3, "tensor", False, 16)
    n_c, src_c = Q.w8a16_kernel_source(Q.W8A16_CANDIDATES[2], FP16, E4M3, "channel", False, 16)
    assert src_t == src_c and n_t == n_c == "gemm_w8a16_fp16_e4m3_channel_m16_r16_w8_k1024_s4_z1"
    assert "2, 1, 8, 1024, 4, 1, false, __nv_fp8_e4m3, fray::gemm::small_m::kScaleChannel>" in src_c
    assert all(c["tile_k"] % Q.W8A16_GROUP == 0 for c in Q.W8A16_CANDIDATES)


@pytest.mark.parametrize("xdt,wdt,kind", [(BF16, I8, "group"), (FP16, E4M3, "channel")], ids=["bf16_int8_group",
                                                                                            "fp16_e4m3_channel"])
def test_tu_compiles_for_sm90a(tmp_path, monkeypatch, xdt, wdt, kind):
    """A W8A16 kernel built for sm_90a without a GPU: the contract's exports, describe(), and the
    16-bit mma (HMMA) fed by the in-register weight conversion in its SASS."""
    from fray import jit
    monkeypatch.setenv("FRAY_CACHE_DIR", str(tmp_path / "cache"))
    name, src = Q.w8a16_kernel_source(Q.W8A16_CANDIDATES[5], xdt, wdt, kind, False, 16)
    so = jit.compile_only(name, src)
    lib = ctypes.CDLL(str(so))
    lib.fray_jit_describe.restype = ctypes.c_char_p
    desc = lib.fray_jit_describe().decode()
    assert desc.startswith("gemm_small_m bulk %s w=%s scale=%s" % (
        "bf16" if xdt == BF16 else "fp16", "int8" if wdt == I8 else "e4m3",
        "group128" if kind == "group" else "channel")), desc
    sass = testing.dump_sass(so)
    assert set(re.findall(r"arch = (sm_\w+)", sass)) == {"sm_90a"}, sass[:500]
    assert re.search(r"HMMA\.16816\.F32", sass), "no m16n8k16 mma in the SASS"
    assert "UBLKCP" in sass or "BLKCP" in sass or "UTMALDG" in sass or "cp.async.bulk" in sass.lower(), \
        "no bulk copy in the SASS"


# ---------------------------------------------------------------------------------------------
# GPU

GPU_SHAPES = [(1, 4096, 4096), (7, 1000, 4112), (16, 2112, 7168), (3, 264, 256)]
VARIANTS = [(xdt, wdt, kind, bias) for xdt in (BF16, FP16) for wdt in (I8, E4M3) for kind in KINDS
            for bias in (False, True) if not (bias and kind == "tensor")]


def _vid(v):
    return "%s_%s_%s%s" % ("bf16" if v[0] == BF16 else "fp16", "int8" if v[1] == I8 else "e4m3", v[2],
                           "_bias" if v[3] else "")


@pytest.fixture
def no_tuning(monkeypatch):
    monkeypatch.setenv("FRAY_AUTOTUNE", "0")


@pytest.fixture(scope="module")
def warm_kernels():
    """Builds every kernel the tests below run, in parallel, once."""
    if not torch.cuda.is_available():
        return
    from fray import jit
    items = set()
    for xdt, wdt, kind, bias in VARIANTS:
        for m in (1, 16):
            items.add(Q.w8a16_kernel_source(Q.W8A16_CANDIDATES[0], xdt, wdt, kind, bias, m) + ((),))
    for c in Q.W8A16_CANDIDATES:
        for wdt, kind in ((I8, "group"), (E4M3, "channel")):
            items.add(Q.w8a16_kernel_source(c, BF16, wdt, kind, False, 16) + ((),))
    jit.build_many(sorted(items))  # a failed build fails the tests that use it, with its message


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[_vid(v) for v in VARIANTS])
@pytest.mark.parametrize("m,n,k", GPU_SHAPES, ids=["%dx%dx%d" % s for s in GPU_SHAPES])
def test_w8a16_gemm_gpu(cuda, no_tuning, warm_kernels, variant, m, n, k, backend):
    xdt, wdt, kind, bias = variant
    x, w, s, b = Q.w8a16_operands(m, n, k, xdt, wdt, kind, cuda, seed=m * 3 + k, bias=bias)
    out = torch.full((m, n), float("nan"), dtype=xdt, device=cuda)
    fray.w8a16_gemm(x, w, s, bias=b, out=out, backend=backend)
    Q.assert_w8a16_close(out, x, w, s, kind, b, what="%s %s %dx%dx%d" % (backend, _vid(variant), m, n, k))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 40, 300])
def test_triton_at_larger_m_gpu(cuda, no_tuning, m):
    x, w, s, b = Q.w8a16_operands(m, 520, 1000, BF16, E4M3, "group", cuda, seed=m, bias=True)
    out = fray.w8a16_gemm(x, w, s, bias=b)  # auto: Triton past M = 16 and at K % 16 != 0
    Q.assert_w8a16_close(out, x, w, s, "group", b, what="auto m=%d" % m)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("wdt", [I8, E4M3], ids=["int8", "e4m3"])
def test_exact_gpu(cuda, no_tuning, warm_kernels, backend, wdt):
    """Small integers, unit scale: every partial sum is an integer below 2^8, so the bf16 output is
    the int64 product, bit for bit."""
    m, n, k = 16, 512, 1024
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-1, 2, (m, k), generator=g) * (torch.rand(m, k, generator=g) < 0.06)
    w = torch.randint(-3, 4, (n, k), generator=g)
    exp = (x.long() @ w.long().t()).double()
    assert exp.abs().max() < 256
    out = fray.w8a16_gemm(x.to(BF16).to(cuda), w.to(wdt).to(cuda), torch.ones(n, device=cuda), backend=backend)
    assert torch.equal(out.cpu().double(), exp)


@pytest.mark.gpu
@pytest.mark.parametrize("wdt,kind", [(I8, "group"), (E4M3, "channel")], ids=["int8_group", "e4m3_channel"])
def test_every_candidate_gpu(cuda, warm_kernels, wdt, kind):
    """Each tuning candidate's kernel against the float64 reference where the last K tile is partial
    and N is not a multiple of the CTA's rows."""
    from fray import jit
    m, n, k = 16, 1000, 4112
    x, w, s, _ = Q.w8a16_operands(m, n, k, BF16, wdt, kind, cuda, seed=9)
    for c in Q.W8A16_CANDIDATES:
        name, src = Q.w8a16_kernel_source(c, BF16, wdt, kind, False, 16)
        kern = jit.build(name, src)
        for mm in (16, 9):
            out = torch.full((mm, n), float("nan"), dtype=BF16, device=cuda)
            kern.launch((x.data_ptr(), w.data_ptr(), 0, out.data_ptr(), s.data_ptr()),
                        (mm, n, k, k, k, n, Q._w8a16_lds(kind, s)), (), 0, torch.cuda.current_stream().cuda_stream)
            Q.assert_w8a16_close(out, x[:mm], w, s, kind, None, what="%s m=%d" % (kern.describe(), mm))


@pytest.mark.gpu
def test_cuda_refusals_auto_fallback_and_strided_x(cuda, no_tuning):
    x, w, s, _ = Q.w8a16_operands(17, 64, 128, BF16, I8, "channel", cuda)
    with pytest.raises(ValueError, match=r"backend='cuda' cannot take this call: M = 17 rows of x"):
        fray.w8a16_gemm(x, w, s, backend="cuda")
    Q.assert_w8a16_close(fray.w8a16_gemm(x, w, s), x, w, s, "channel", what="auto M=17")
    x, w, s, _ = Q.w8a16_operands(5, 64, 100, BF16, I8, "group", cuda)
    with pytest.raises(ValueError, match="K = 100 is not a multiple of 16"):
        fray.w8a16_gemm(x, w, s, backend="cuda")
    Q.assert_w8a16_close(fray.w8a16_gemm(x, w, s), x, w, s, "group", what="auto K=100")
    # x as a column slice of a wider buffer (row stride 320, a multiple of 8): the CUDA kernel takes it
    xb, w, s, _ = Q.w8a16_operands(4, 96, 320, BF16, E4M3, "channel", cuda)
    x = xb[:, :256]
    w = w[:, :256].contiguous()
    out = fray.w8a16_gemm(x, w, s, backend="cuda")
    Q.assert_w8a16_close(out, x, w, s, "channel", what="strided x")


@pytest.mark.gpu
def test_mixed_devices(cuda):
    x, w, s, _ = Q.w8a16_operands(4, 32, 64, BF16, I8, "channel", cuda)
    with pytest.raises(TypeError, match="w_scale: expected a tensor on cuda"):
        fray.w8a16_gemm(x, w, s.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("wdt,kind", [(I8, "channel"), (E4M3, "group")], ids=["int8", "e4m3_group"])
def test_graph_capture_side_stream_and_compile(cuda, no_tuning, warm_kernels, backend, wdt, kind):
    m, n, k = 16, 1024, 1024
    x, w, s, _ = Q.w8a16_operands(m, n, k, BF16, wdt, kind, cuda, seed=4)
    exp = fray.w8a16_gemm(x, w, s, backend=backend)  # warm: the plan and its kernel
    out = torch.empty_like(exp)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            fray.w8a16_gemm(x, w, s, out=out, backend=backend)
    torch.cuda.current_stream().wait_stream(side)
    x2, w2, s2, _ = Q.w8a16_operands(m, n, k, BF16, wdt, kind, cuda, seed=5)
    for t, v in ((x, x2), (w, w2), (s, s2)):
        t.copy_(v)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    Q.assert_w8a16_close(out, x, w, s, kind, what="graph replay")

    def f(a, b, c):
        return fray.w8a16_gemm(a, b, c, backend=backend) * 2

    y = torch.compile(f, fullgraph=True)(x, w, s)
    assert torch.equal(y, fray.w8a16_gemm(x, w, s, backend=backend) * 2)
