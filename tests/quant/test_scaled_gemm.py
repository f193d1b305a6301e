"""fray.scaled_gemm: the float64 reference (hand values, against dequantize), the Triton kernel under
the interpreter (int8; every scale kind), the error contract, the CUDA TUs built for sm_90a, and on
the GPU both backends against the float64 reference (int8 exact, e4m3 within the accumulator's
bound), every tuning candidate, CUDA graphs, side streams and torch.compile."""
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
KINDS = ("tensor", "vector", "block")


_operands = Q.scaled_gemm_operands


def _assert_close(out, a, b, sa, sb, kind_a, kind_b, bias, fast_accum=False, what=""):
    Q.assert_scaled_gemm_close(out, a, b, sa, sb, kind_a, kind_b, bias, fast_accum, what)


# ---------------------------------------------------------------------------------------------
# CPU: reference

def test_reference_hand_values():
    a = np.array([[1.0, -2.0], [3.0, 4.0]])
    b = np.array([[5.0, 6.0], [-7.0, 8.0], [1.0, 1.0]])
    # tensor x vector: (a @ b.T) * sb[n] * sa, + bias
    out = ref.scaled_gemm(a, b, np.float64(0.5), np.array([[1.0], [2.0], [4.0]]), "tensor", "vector",
                          np.array([0.25, 0.0, -1.0]))
    np.testing.assert_array_equal(out, [[-3.25, -23.0, -3.0], [19.75, 11.0, 13.0]])
    # vector x tensor
    out = ref.scaled_gemm(a, b, np.array([[1.0], [0.5]]), np.float64(2.0), "vector", "tensor")
    np.testing.assert_array_equal(out, [[-14.0, -46.0, -2.0], [39.0, 11.0, 7.0]])


def test_reference_block_scales_per_slice():
    # K = 130: two K blocks (128 + 2), N = 130: two N blocks; every product is one of four scale pairs
    m, n, k = 3, 130, 130
    a = np.ones((m, k))
    b = np.ones((n, k))
    sa = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    sb = np.array([[1.0, 100.0], [0.5, 1000.0]])
    out = ref.scaled_gemm(a, b, sa, sb, "block", "block")
    # row 0, n < 128: 128 * 1 * 1 + 2 * 10 * 100; n >= 128: 128 * 1 * 0.5 + 2 * 10 * 1000
    assert out[0, 0] == 128 + 2000 and out[0, 129] == 64 + 20000
    assert out[2, 127] == 128 * 3 + 2 * 30 * 100


@pytest.mark.parametrize("dtype,ga,gb", [(d, ga, gb) for d in (I8, E4M3) for ga, gb in (
    ("tensor", "tensor"), ("token", "token"), ("token", "tensor"))] + [(E4M3, "block", "block")])
def test_reference_equals_the_dequantized_product(dtype, ga, gb):
    """fray.quantize's outputs go in as they are: the product of the dequantized operands."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(9, 300, generator=g), torch.randn(140, 300, generator=g)
    qa, sa = fray.quantize(x, dtype, granularity=ga, block=(1, 128))
    qb, sb = fray.quantize(w, dtype, granularity=gb, block=(128, 128))
    out = fray.scaled_gemm(qa, qb, sa, sb, out_dtype=torch.float32)
    da = fray.dequantize(qa, sa, granularity=ga, block=(1, 128), dtype=torch.float32).double()
    db = fray.dequantize(qb, sb, granularity=gb, block=(128, 128), dtype=torch.float32).double()
    exp = da @ db.t()
    assert torch.allclose(out.double(), exp, rtol=1e-5, atol=1e-5 * float(exp.abs().max()))


def test_scale_kinds_from_shapes():
    m, n, k = 5, 300, 260
    kinds = Q._scale_kinds
    assert kinds(torch.ones(()), torch.ones(1), m, n, k) == ("tensor", "tensor")
    assert kinds(torch.ones(m, 1), torch.ones(n, 1), m, n, k) == ("vector", "vector")
    assert kinds(torch.ones(m), torch.ones(n), m, n, k) == ("vector", "vector")
    assert kinds(torch.ones(m, 3), torch.ones(3, 3), m, n, k) == ("block", "block")
    # K <= 128: a per-row scale is the per-row-and-block one
    assert kinds(torch.ones(m, 1), torch.ones(3, 1), m, n, 100) == ("block", "block")
    with pytest.raises(ValueError, match="a_scale, b_scale: block scales are for both operands"):
        kinds(torch.ones(m, 3), torch.ones(n, 1), m, n, k)
    with pytest.raises(ValueError, match=r"a_scale: expected .*got shape \(5, 2\)"):
        kinds(torch.ones(m, 2), torch.ones(n, 1), m, n, k)
    with pytest.raises(ValueError, match=r"b_scale: expected .*got shape \(1, 300\)"):
        kinds(torch.ones(m, 1), torch.ones(1, n), m, n, k)


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernel under the interpreter (int8: numpy has no float8)

@INTERPRETER
@pytest.mark.parametrize("kind_a,kind_b", [("tensor", "tensor"), ("vector", "vector"), ("tensor", "vector"),
                                           ("vector", "tensor"), ("block", "block")])
@pytest.mark.parametrize("odt", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("m,n,k", [(1, 40, 64), (7, 17, 200), (33, 130, 131)])
def test_triton_interpreter_int8(kind_a, kind_b, odt, m, n, k):
    from fray_triton import scaled_gemm as ts
    a, b, sa, sb, bias = _operands(m, n, k, I8, kind_a, kind_b, seed=m + n, bias_dtype=odt)
    out = torch.full((m, n), float("nan"), dtype=odt)
    # block scales on int8 operands: the API refuses them, the kernel's block path is dtype-blind
    ts.scaled_gemm(a, b, sa, sb, Q._KIND_CODE[kind_a], Q._KIND_CODE[kind_b], bias, out,
                   {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2})
    _assert_close(out, a, b, sa, sb, kind_a, kind_b, bias, what="interpreter %s/%s" % (kind_a, kind_b))


def _mn_major(s):
    """s [M, KB] in DeepGEMM's TMA-aligned MN-major layout, the padding NaN (never to be read)."""
    view = Q.mn_major_view(*s.shape, lambda shape: torch.full(shape, float("nan"), dtype=s.dtype, device=s.device))
    view.copy_(s)
    assert view.stride() == (1, -(-s.shape[0] // 4) * 4) and torch.equal(view, s)
    return view


@INTERPRETER
@pytest.mark.parametrize("m,n,k", [(7, 17, 200), (33, 130, 300)])
def test_triton_interpreter_mn_major_block_scales(m, n, k):
    """a's block scales MN-major (DeepGEMM's layout, padding NaN) give the row-major scales' bits."""
    from fray_triton import scaled_gemm as ts
    a, b, sa, sb, _ = _operands(m, n, k, I8, "block", "block", seed=m)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
    outs = []
    for s in (sa, _mn_major(sa)):
        out = torch.full((m, n), float("nan"), dtype=torch.float32)
        ts.scaled_gemm(a, b, s, sb, 2, 2, None, out, cfg)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    _assert_close(outs[1], a, b, sa, sb, "block", "block", None, what="interpreter mn-major")


def test_mn_major_block_scales_accepted_and_others_refused():
    a, b, sa, sb, _ = _operands(6, 130, 300, E4M3, "block", "block", seed=4)
    assert torch.equal(fray.scaled_gemm(a, b, _mn_major(sa), sb), fray.scaled_gemm(a, b, sa, sb))
    assert Q.mn_major(_mn_major(sa)) and not Q.mn_major(sa)
    one = _mn_major(sa[:1])                                      # M = 1: strides (1, 4)
    assert not one.is_contiguous() and torch.equal(fray.scaled_gemm(a[:1], b, one, sb), fray.scaled_gemm(a[:1], b, sa[:1], sb))
    with pytest.raises(ValueError, match=r"a_scale: expected a contiguous \(row-major\) scale tensor or a's block "
                                         r"scales MN-major"):
        fray.scaled_gemm(a, b, torch.ones(6, 6)[:, ::2], sb)     # [6, 3] with strides (6, 2)
    with pytest.raises(ValueError, match=r"b_scale: expected a contiguous \(row-major\) scale tensor, got"):
        fray.scaled_gemm(a, b, sa, _mn_major(sb))


# ---------------------------------------------------------------------------------------------
# CPU: the error contract

def _call(**over):
    a, b, sa, sb, _ = _operands(4, 32, 64, I8, "vector", "vector")
    kw = dict(a=a, b=b, a_scale=sa, b_scale=sb)
    kw.update(over)
    return fray.scaled_gemm(kw.pop("a"), kw.pop("b"), kw.pop("a_scale"), kw.pop("b_scale"), **kw)


@pytest.mark.parametrize("over,exc,msg", [
    (dict(a=torch.zeros(4, 64)), TypeError, "a: expected dtype int8 or float8_e4m3fn, got float32"),
    (dict(b=torch.zeros(32, 64, dtype=E4M3)), TypeError, "b: expected dtype int8"),
    (dict(a_scale=torch.ones(4, 1, dtype=torch.float16)), TypeError, "a_scale: expected float32 scales"),
    (dict(b=torch.zeros(32, 60, dtype=I8)), ValueError, r"b: expected \[N, K\] with K = 64"),
    (dict(a=torch.zeros(4, 64, 1, dtype=I8)), ValueError, "a: expected a 2-d"),
    (dict(a_scale=torch.ones(3, 1)), ValueError, "a_scale: expected one scale"),
    (dict(a_scale=torch.ones(4, 1), b_scale=torch.ones(1, 1) * torch.ones(1, 2)), ValueError, "b_scale: expected"),
    (dict(a_scale=torch.ones(4, 1), b_scale=torch.ones(1, 1).expand(1, 1).t()), None, None),
    (dict(a_scale=torch.ones(4, 1), b_scale=torch.ones(1, 1)), None, None),
    (dict(b_scale=torch.ones(1, 1), a_scale=torch.ones(4, 2)[:, :1]), ValueError, "a_scale: expected a contiguous"),
    (dict(out_dtype=torch.int8), TypeError, "out_dtype: expected"),
    (dict(bias=torch.zeros(32, dtype=torch.float16)), TypeError, r"bias: expected dtype bfloat16 \(out_dtype\)"),
    (dict(bias=torch.zeros(31, dtype=torch.bfloat16)), ValueError, "bias"),
    (dict(out=torch.empty(4, 31, dtype=torch.bfloat16)), ValueError, "out"),
    (dict(out=torch.empty(4, 32, dtype=torch.float16)), TypeError, "out: expected dtype bfloat16"),
    (dict(fast_accum=True), ValueError, "fast_accum: a choice for float8_e4m3fn"),
    (dict(fast_accum=1), TypeError, "fast_accum: expected a bool"),
    (dict(a=torch.zeros(4, 128, dtype=I8)[:, ::2]), ValueError, "a: the last dimension must be contiguous"),
    (dict(backend="cuda"), ValueError, "backend"),
    (dict(backend="fast"), ValueError, "backend"),
])
def test_error_contract(over, exc, msg):
    if exc is None:
        _call(**over)
        return
    with pytest.raises(exc, match=msg):
        _call(**over)


def test_errors_block_int8_and_large_k():
    a, b, sa, sb, _ = _operands(2, 130, 300, E4M3, "block", "block")
    with pytest.raises(TypeError, match="a: block scales are for float8_e4m3fn operands, got int8"):
        fray.scaled_gemm(a.float().to(I8), b.float().to(I8), sa, sb)
    with pytest.raises(ValueError, match="fast_accum: a choice for float8_e4m3fn with tensor / vector"):
        fray.scaled_gemm(a, b, sa, sb, fast_accum=True)
    k = Q.INT8_MAX_K + 16
    with pytest.raises(ValueError, match="a: int8 accumulates in int32, exact up to K = 131072; got K = 131088"):
        fray.scaled_gemm(torch.zeros(1, k, dtype=I8), torch.zeros(1, k, dtype=I8), torch.ones(()), torch.ones(()))


def test_cpu_tensors_and_empty_shapes():
    a, b, sa, sb, bias = _operands(3, 24, 48, E4M3, "vector", "tensor", bias_dtype=torch.float32)
    out = fray.scaled_gemm(a, b, sa, sb, out_dtype=torch.float32, bias=bias)
    _assert_close(out, a, b, sa, sb, "vector", "tensor", bias, what="cpu")
    z = fray.scaled_gemm(torch.zeros(0, 48, dtype=I8), torch.zeros(24, 48, dtype=I8), torch.ones(()), torch.ones(()))
    assert z.shape == (0, 24) and z.dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------
# CPU: the CUDA translation units

def test_kernel_sources_name_their_configuration():
    name, src = Q.scaled_kernel_source(Q.PROMOTED_LARGE[0], E4M3, torch.bfloat16, "block", "block", True, False)
    assert name == "scaled_gemm_sm90_e4m3_bf16_bb_bias_128x128x128_c1x2_coop_s0_rauto_w1"
    assert ("Sm90ScaledGemmConfig<cutlass::float_e4m3_t, cutlass::bfloat16_t, fray::gemm::kScaleBlock, "
            "fray::gemm::kScaleBlock, true, 128, 128, 128, 1, 2, fray::gemm::kCooperative, 0, "
            "fray::gemm::kRasterHeuristic, 1, fray::gemm::kPersistent, false>") in src
    name, src = Q.scaled_kernel_source(Q.SCALED_SMALL[0], I8, torch.float32, "tensor", "vector", False, False)
    assert name == "scaled_gemm_sm90_int8_fp32_tv_64x128x128_c1x1_pp_s0_rauto_w1"
    assert "int8_t, float, fray::gemm::kScaleTensor, fray::gemm::kScaleVector, false, 64, 128, 128" in src
    assert Q.promoted(E4M3, "block", False) and Q.promoted(E4M3, "vector", False)
    assert not Q.promoted(E4M3, "vector", True) and not Q.promoted(I8, "vector", False)
    for prom in (False, True):
        for m in (1, 128, 129, 8192):
            cs = Q.scaled_candidates(m, prom)
            assert cs and all(int(c["tile"].split("x")[2]) == 128 for c in cs)
            if prom:  # 64 x 128 a warpgroup at most (two accumulators), N a multiple of 128 (block scales)
                for c in cs:
                    tm, tn, _ = (int(v) for v in c["tile"].split("x"))
                    assert tn == 128 and tm // (2 if c["schedule"] == "coop" else 1) <= 64


def test_block_scaled_tu_compiles_for_sm90a(tmp_path, monkeypatch):
    """The block-scaled e4m3 kernel (CUTLASS's blockwise FP8 mainloop and the bias epilogue) built
    for sm_90a without a GPU, with the FFMA-interleave pass (FRAY_DISABLE_FFMA_INTERLEAVE=0): the
    contract's exports, describe(), fp8 wgmma (QGMMA) in its SASS, and the promotion's FFMA runs
    found and edited by the pass."""
    from fray import jit
    monkeypatch.setenv("FRAY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FRAY_DISABLE_FFMA_INTERLEAVE", "0")
    name, src = Q.scaled_kernel_source(Q.PROMOTED_LARGE[0], E4M3, torch.bfloat16, "block", "block", True, False)
    sass_pass = Q.scaled_sass_pass(E4M3, "block")
    assert sass_pass == "ffma_interleave" and Q.scaled_sass_pass(E4M3, "vector") is None
    assert Q.scaled_sass_pass(I8, "vector") is None
    so = jit.compile_only(name, src, sass_pass=sass_pass)
    import json
    report = json.loads((so.parent / "manifest.json").read_text())["sass_pass"]
    assert report["runs"] >= 1 and report["edits"] >= 16, report
    lib = ctypes.CDLL(str(so))
    lib.fray_jit_describe.restype = ctypes.c_char_p
    assert lib.fray_jit_describe().decode().startswith(
        "scaled_gemm_sm90 e4m3 out=bf16 scales=block/block bias 128x128x128 c1x2 coop stages=auto:")
    sass = testing.dump_sass(so)
    assert set(re.findall(r"arch = (sm_\w+)", sass)) == {"sm_90a"}, sass[:500]
    assert re.search(r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3", sass), "no fp8 wgmma in the SASS"


# ---------------------------------------------------------------------------------------------
# GPU

# (kind_a, kind_b, dtype, bias, out dtype): the epilogue variants; each runs at small and large M.
VARIANTS = [
    ("vector", "vector", I8, False, torch.bfloat16),
    ("vector", "vector", I8, True, torch.bfloat16),
    ("tensor", "tensor", I8, False, torch.float16),
    ("tensor", "vector", I8, False, torch.bfloat16),
    ("vector", "tensor", E4M3, True, torch.float16),
    ("vector", "vector", E4M3, False, torch.bfloat16),
    ("tensor", "tensor", E4M3, False, torch.bfloat16),
    ("block", "block", E4M3, False, torch.bfloat16),
    ("block", "block", E4M3, True, torch.float32),
]
GPU_SHAPES = [(1, 256, 512), (7, 1000, 4096), (128, 4096, 1024), (1000, 264, 4112), (2048, 4096, 2048)]


def _vid(v):
    return "%s%s_%s%s_%s" % (v[0][0], v[1][0], "int8" if v[2] == I8 else "e4m3", "_bias" if v[3] else "",
                             str(v[4]).replace("torch.", ""))


@pytest.fixture
def no_tuning(monkeypatch):
    monkeypatch.setenv("FRAY_AUTOTUNE", "0")


@pytest.fixture(scope="module")
def warm_kernels():
    """Builds every kernel the matrix and the candidate test need in parallel, once, before the
    tests run them one by one."""
    if not torch.cuda.is_available():
        return
    from fray import jit
    items = set()
    for ka, kb, dt, bias, odt in VARIANTS:
        for m in (1, 4096):
            c = Q.scaled_candidates(m, Q.promoted(dt, ka, False))[0]
            items.add(Q.scaled_kernel_source(c, dt, odt, ka, kb, bias, False) + ((),))
    for c in Q.SCALED_LARGE + Q.SCALED_SMALL:
        items.add(Q.scaled_kernel_source(c, I8, torch.bfloat16, "vector", "vector", False, False) + ((),))
    for c in Q.PROMOTED_LARGE + Q.PROMOTED_SMALL:
        for kind in ("vector", "block"):
            items.add(Q.scaled_kernel_source(c, E4M3, torch.bfloat16, kind, kind, False, False) + ((),))
    items.add(Q.scaled_kernel_source(Q.SCALED_LARGE[0], E4M3, torch.bfloat16, "vector", "vector", False, True) + ((),))
    items.add(Q.scaled_kernel_source(Q.SCALED_SMALL[0], E4M3, torch.bfloat16, "vector", "vector", False, True) + ((),))
    items = sorted(items)
    import random
    random.Random(os.getpid()).shuffle(items)
    jit.build_many(items)  # a failed build fails the tests that use it, with its message


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[_vid(v) for v in VARIANTS])
@pytest.mark.parametrize("m,n,k", GPU_SHAPES, ids=["%dx%dx%d" % s for s in GPU_SHAPES])
def test_scaled_gemm_gpu(cuda, no_tuning, warm_kernels, variant, m, n, k, backend):
    kind_a, kind_b, dtype, with_bias, odt = variant
    a, b, sa, sb, bias = _operands(m, n, k, dtype, kind_a, kind_b, device=cuda, seed=m * 3 + k,
                                   bias_dtype=odt if with_bias else None)
    out = torch.full((m, n), float("nan"), dtype=odt, device=cuda)
    fray.scaled_gemm(a, b, sa, sb, out_dtype=odt, bias=bias, out=out, backend=backend)
    _assert_close(out, a, b, sa, sb, kind_a, kind_b, bias, what="%s %s %dx%dx%d" % (backend, _vid(variant), m, n, k))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_int8_is_exact_gpu(cuda, no_tuning, warm_kernels, backend):
    """Unit scales, fp32 out and |acc| < 2^24: the output is the int64 product, bit for bit."""
    m, n, k = 300, 512, 512
    g = torch.Generator().manual_seed(11)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    exp = (a.long() @ b.long().t()).double()
    assert exp.abs().max() < 2 ** 24
    one = torch.ones((), device=cuda)
    out = fray.scaled_gemm(a.to(cuda), b.to(cuda), one, one, out_dtype=torch.float32, backend=backend)
    assert torch.equal(out.cpu().double(), exp)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 4096])
def test_fast_accum_gpu(cuda, no_tuning, warm_kernels, m):
    n, k = 1024, 4096
    a, b, sa, sb, _ = _operands(m, n, k, E4M3, "vector", "vector", device=cuda, seed=2)
    out = fray.scaled_gemm(a, b, sa, sb, fast_accum=True, backend="cuda")
    _assert_close(out, a, b, sa, sb, "vector", "vector", None, fast_accum=True, what="fast_accum m=%d" % m)


@pytest.mark.gpu
@pytest.mark.parametrize("dt,kind", [(I8, "vector"), (E4M3, "vector"), (E4M3, "block")], ids=["int8", "e4m3", "block"])
def test_every_candidate_gpu(cuda, warm_kernels, dt, kind):
    """Each tuning candidate's kernel against the float64 reference at a shape with partial tiles."""
    from fray import jit
    m, n, k = 300, 640, 1152
    ka = kb = kind
    a, b, sa, sb, _ = _operands(m, n, k, dt, ka, kb, device=cuda, seed=9)
    lists = (Q.PROMOTED_LARGE + Q.PROMOTED_SMALL) if Q.promoted(dt, kind, False) else (Q.SCALED_LARGE + Q.SCALED_SMALL)
    for c in lists:
        name, src = Q.scaled_kernel_source(c, dt, torch.bfloat16, ka, kb, False, False)
        kern = jit.build(name, src)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=cuda)
        ptrs = (a.data_ptr(), b.data_ptr(), sa.data_ptr(), sb.data_ptr(), 0, out.data_ptr())
        ints = (m, n, k, k, k, n)
        stream = torch.cuda.current_stream().cuda_stream
        ws = kern.workspace_bytes(ptrs, ints, (), 0, stream)
        buf = torch.empty(max(ws, 1), dtype=torch.uint8, device=cuda)
        kern.launch(ptrs + ((buf.data_ptr(),) if ws else ()), ints, (), 0, stream)
        _assert_close(out, a, b, sa, sb, ka, kb, None, what=kern.describe())


@pytest.mark.gpu
def test_ffma_interleave_gives_the_same_bits_gpu(cuda):
    """Every block-scaled candidate built through the FFMA-interleave pass (fray.jit.sass: only
    scheduling hints change) gives bit for bit what the same kernel without it gives, and both
    match the float64 reference; the pass found FFMA runs to edit in each."""
    import json
    from fray import jit
    m, n, k = 300, 640, 1152
    a, b, sa, sb, _ = _operands(m, n, k, E4M3, "block", "block", device=cuda, seed=13)
    stream = torch.cuda.current_stream().cuda_stream

    def run(kern):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=cuda)
        ptrs = (a.data_ptr(), b.data_ptr(), sa.data_ptr(), sb.data_ptr(), 0, out.data_ptr())
        ints = (m, n, k, k, k, n)
        ws = kern.workspace_bytes(ptrs, ints, (), 0, stream)
        buf = torch.empty(max(ws, 1), dtype=torch.uint8, device=cuda)
        kern.launch(ptrs + ((buf.data_ptr(),) if ws else ()), ints, (), 0, stream)
        return out
    configs = Q.PROMOTED_LARGE + Q.PROMOTED_SMALL
    sources = [Q.scaled_kernel_source(c, E4M3, torch.bfloat16, "block", "block", False, False) for c in configs]
    # every candidate with and without the pass, built in one parallel batch (not the module's
    # warm-up: this test needs only these)
    built = jit.build_many([s + ((), "ffma_interleave") for s in sources] + [s + ((),) for s in sources])
    for (name, _), kern, plain_kern in zip(sources, built[:len(sources)], built[len(sources):]):
        assert not isinstance(kern, Exception), kern
        assert not isinstance(plain_kern, Exception), plain_kern
        report = json.loads((kern.path.parent / "manifest.json").read_text())["sass_pass"]
        assert report["edits"] > 0, (name, report)
        got, plain = run(kern), run(plain_kern)
        assert torch.equal(got, plain), name
        _assert_close(got, a, b, sa, sb, "block", "block", None, what=name + " ffma_interleave")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_mn_major_block_scales_gpu(cuda, no_tuning, backend):
    """DeepGEMM-layout (MN-major, TMA-aligned) activation block scales give the row-major ones'
    bits on both backends, eagerly and replayed from a CUDA graph (the CUDA backend's copy)."""
    m, n, k = 300, 640, 1152
    a, b, sa, sb, _ = _operands(m, n, k, E4M3, "block", "block", device=cuda, seed=21)
    want = fray.scaled_gemm(a, b, sa, sb, backend=backend)
    mn = _mn_major(sa)
    assert torch.equal(fray.scaled_gemm(a, b, mn, sb, backend=backend), want)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=cuda)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fray.scaled_gemm(a, b, mn, sb, out=out, backend=backend)   # warm-up: the plan and its kernel
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            fray.scaled_gemm(a, b, mn, sb, out=out, backend=backend)
    torch.cuda.current_stream().wait_stream(s)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.gpu
def test_cuda_refuses_what_tma_cannot_take_and_auto_falls_back(cuda, no_tuning):
    a, b, sa, sb, _ = _operands(5, 64, 100, I8, "vector", "vector", device=cuda)
    with pytest.raises(ValueError, match=r"backend='cuda' cannot take this call: K = 100 is not a multiple of 16"):
        fray.scaled_gemm(a, b, sa, sb, backend="cuda")
    out = fray.scaled_gemm(a, b, sa, sb)  # auto: the Triton kernel
    _assert_close(out, a, b, sa, sb, "vector", "vector", None, what="auto K=100")
    a, b, sa, sb, _ = _operands(5, 63, 128, I8, "vector", "vector", device=cuda)
    with pytest.raises(ValueError, match="N = 63 output columns"):
        fray.scaled_gemm(a, b, sa, sb, backend="cuda")


@pytest.mark.gpu
def test_mixed_devices(cuda):
    a, b, sa, sb, _ = _operands(4, 32, 64, I8, "vector", "vector", device=cuda)
    with pytest.raises(TypeError, match="a_scale: expected a tensor on cuda"):
        fray.scaled_gemm(a, b, sa.cpu(), sb)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("kinds,dtype", [(("vector", "vector"), I8), (("block", "block"), E4M3)], ids=["int8", "block"])
def test_graph_capture_side_stream_and_compile(cuda, no_tuning, warm_kernels, backend, kinds, dtype):
    m, n, k = 64, 1024, 1024
    a, b, sa, sb, _ = _operands(m, n, k, dtype, *kinds, device=cuda, seed=4)
    exp = fray.scaled_gemm(a, b, sa, sb, backend=backend)  # warm: the plan and its kernel
    out = torch.empty_like(exp)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            fray.scaled_gemm(a, b, sa, sb, out=out, backend=backend)
    torch.cuda.current_stream().wait_stream(side)
    a2, b2, sa2, sb2, _ = _operands(m, n, k, dtype, *kinds, device=cuda, seed=5)
    for t, v in ((a, a2), (b, b2), (sa, sa2), (sb, sb2)):
        t.copy_(v)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(out, a, b, sa, sb, *kinds, None, what="graph replay")

    def f(x, w, s1, s2):
        return fray.scaled_gemm(x, w, s1, s2, backend=backend) * 2

    y = torch.compile(f, fullgraph=True)(a, b, sa, sb)
    assert torch.equal(y, fray.scaled_gemm(a, b, sa, sb, backend=backend) * 2)
