"""Property-based tests (hypothesis) of the kernels against their oracles: random lengths (1 to
5000, odd ones and non-multiples of the 4096-element block included), every dtype, values spread
over 60 decades, and special values sprinkled in (inf, -inf, NaN, +-0, subnormals of the dtype,
+-1e30, the dtype's largest finite value). The oracle is the op's documented rule: vector_add and
mul are bitwise torch.add / torch.mul (fp32 math, one rounding); axpy and the unary activations
are the float64 reference, rounded to the dtype, within the dtype's tolerance, with NaN where the
reference has NaN and the same infinities.

Each property is one body taking (device, backend), run by two kinds of tests:
  the CPU tests (test_triton_*): the Triton kernels under Triton's CPU interpreter (an autouse
    fixture sets TRITON_INTERPRET=1 for them), derandomised with the CI profile "ci": the same
    examples on every run;
  the GPU tests (test_gpu_*, marked gpu: selected with -m gpu, failing where torch sees no CUDA
    device): the same strategies and oracles on a GPU, once per backend the op has ("triton":
    the same kernel entry points, compiled; "cuda": the public op with backend="cuda"), with the
    profile "gpu" (derandomised, up to 200 examples: see the comment there).
The interpreter flushes bf16 subnormal inputs to zeros of their sign (interpreter_load); the GPU
converts them exactly, so the oracles take the inputs as the kernel sees them on each device
(sees()). The JIT-compiled CUDA kernels (gemm, scaled_gemm, grouped_gemm: one nvcc translation
unit per configuration, dtype and variant, each seconds to minutes to build) are drawn on the GPU
over a few translation units only (see each test), their configurations fray.tune's heuristic
ones (FRAY_AUTOTUNE=0: nothing is tuned). A family joins by adding its ops to SPECS.
"""
import dataclasses
from typing import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fray.reference import activation as ract
from fray.reference import elementwise as rew
from fray.testing import TOLERANCES

from property_support import gpu, interpreter_load, on, sees, triton_mode


# ---------------------------------------------------------------------------------------------
# where a property runs

@pytest.fixture(autouse=True)
def _triton_mode(request, monkeypatch):
    triton_mode(request, monkeypatch)


DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _specials(dtype):
    fi = torch.finfo(dtype)
    return [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e30, -1e30, fi.max, -fi.max,
            fi.tiny / 4, -fi.tiny / 4, fi.tiny, 1.0, -1.0]


@st.composite
def inputs(draw, arity):
    """(dtype, [tensor] * arity): one length, values N(0, 1) * 10^e with e per example, and a few
    special values at drawn positions."""
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.one_of(st.integers(1, 40), st.integers(41, 5000)))
    out = []
    for i in range(arity):
        seed = draw(st.integers(0, 2 ** 31 - 1))
        exp = draw(st.integers(-30, 30))
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, generator=g, dtype=torch.float64) * 10.0 ** exp
        specials = _specials(dtype)
        for _ in range(draw(st.integers(0, min(n, 8)))):
            x[draw(st.integers(0, n - 1))] = specials[draw(st.integers(0, len(specials) - 1))]
        out.append(x.to(dtype))
    return dtype, out


def _bitwise(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "NaN positions differ"
    g, w = got[~nan], want[~nan]
    assert torch.equal(g, w), "first difference at %d: %r vs %r" % (
        int((g != w).nonzero()[0]), float(g[(g != w)][0]), float(w[(g != w)][0]))


def _close(got, want64, dtype):
    """got vs the float64 reference rounded to dtype: NaN where it is NaN, the same infinities,
    finite values within the dtype's tolerance."""
    want = want64.to(dtype).to(torch.float64)
    torch.testing.assert_close(got.to(torch.float64), want, equal_nan=True, **TOLERANCES[dtype])


def test_interpreter_flushes_bf16_subnormals():
    from fray_triton import elementwise
    x = torch.tensor([2.938735877055719e-39, -2.938735877055719e-39, 1.0], dtype=torch.bfloat16)
    out = torch.empty_like(x)
    elementwise.mul(x, torch.ones_like(x), out, 3)
    assert out.tolist() == [0.0, -0.0, 1.0] and torch.signbit(out).tolist() == [False, True, False]
    assert torch.equal(interpreter_load(x), out)


@st.composite
def rows_of(draw, arity, exp_range=(-30, 30), specials=None, cols=None, rows=None, dtypes=DTYPES):
    """(dtype, [x [rows, cols]] * arity, weight [cols] fp of the dtype): rows 1-9, cols 1-3000,
    values as in inputs(); `specials` limits the sprinkled values (norms: none that overflow an
    fp32 sum of squares, a limit fp32 accumulation shares with torch)."""
    dtype = draw(st.sampled_from(dtypes))
    rows = draw(rows or st.integers(1, 9))
    cols = draw(cols or st.one_of(st.integers(1, 40), st.integers(41, 3000)))
    pool = specials if specials is not None else _specials(dtype)
    xs = []
    for _ in range(arity):
        g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31 - 1)))
        x = torch.randn(rows, cols, generator=g, dtype=torch.float64) * 10.0 ** draw(st.integers(*exp_range))
        for _ in range(draw(st.integers(0, min(rows * cols, 8)))):
            x[draw(st.integers(0, rows - 1)), draw(st.integers(0, cols - 1))] = pool[draw(st.integers(0, len(pool) - 1))]
        xs.append(x.to(dtype))
    w = torch.randn(cols, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))), dtype=torch.float64)
    return dtype, xs, w.to(dtype)


NORM_SPECIALS = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e-40, -1e-40, 1.0]


@dataclasses.dataclass
class Spec:
    arity: int
    run: Callable      # (inputs, out) -> None: the Triton kernel
    oracle: Callable   # (inputs, dtype) -> the expected tensor (exact) or float64 (close)
    exact: bool
    op: Callable       # (inputs, out, backend) -> None: the public op (GPU, backend "cuda")


def _tew():
    from fray_triton import elementwise
    return elementwise


def _tact():
    from fray_triton import activation
    return activation


def _fray():
    import fray
    return fray


def _unary(code_name, reference, public, **kw):
    return Spec(1, lambda xs, out: _tact().unary(xs[0], out, getattr(_tact(), code_name), out.numel()),
                lambda xs, dtype: reference(xs[0].double()), False,
                lambda xs, out, backend: getattr(_fray(), public)(xs[0], out=out, backend=backend, **kw))


SPECS = {
    "vector_add": Spec(2, lambda xs, out: _tew().vector_add(xs[0], xs[1], out, out.numel()),
                       lambda xs, dtype: torch.add(xs[0], xs[1]), True,
                       lambda xs, out, backend: _fray().vector_add(xs[0], xs[1], out=out, backend=backend)),
    "mul": Spec(2, lambda xs, out: _tew().mul(xs[0], xs[1], out, out.numel()),
                lambda xs, dtype: torch.mul(xs[0], xs[1]), True,
                lambda xs, out, backend: _fray().mul(xs[0], xs[1], out=out, backend=backend)),
    "axpy": Spec(1, lambda xs, out: _tew().axpy(xs[0], out, out.numel(), -1.75, 0.3),
                 lambda xs, dtype: rew.axpy(xs[0].double(), -1.75, 0.3), False,
                 lambda xs, out, backend: _fray().axpy(xs[0], -1.75, 0.3, out=out, backend=backend)),
    "silu": _unary("SILU", ract.silu, "silu"),
    "gelu": _unary("GELU_ERF", ract.gelu, "gelu", approximate="none"),
    "gelu_tanh": _unary("GELU_TANH", lambda g: ract.gelu(g, "tanh"), "gelu", approximate="tanh"),
    "relu": _unary("RELU", ract.relu, "relu"),
    "tanh": _unary("TANH", ract.tanh, "tanh"),
    "sigmoid": _unary("SIGMOID", ract.sigmoid, "sigmoid"),
}


def _tnorm():
    from fray_triton import norm
    return norm


def _tsm():
    from fray_triton import softmax
    return softmax


def _scaled_close(got, want64, dtype, scale):
    """_close with the bound relative to max(|expected|, scale) (fray.testing.assert_close's rule for
    results that are sums able to cancel)."""
    want = want64.to(dtype).to(torch.float64)
    got = got.to(torch.float64)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN positions differ"
    ok = ~torch.isnan(want)
    tol = TOLERANCES[dtype]
    bound = tol["atol"] + tol["rtol"] * torch.maximum(want.abs(), scale.to(torch.float64))
    err = (got - want).abs()
    bad = ok & ~((err <= bound) | (got == want))
    assert not bad.any(), "%d elements off; worst %r vs %r" % (int(bad.sum()), float(got[bad][0]), float(want[bad][0]))


# ---------------------------------------------------------------------------------------------
# norms

def _norm_property(data, device, backend, op):
    from fray.reference import norm as rnorm
    from fray.testing import layernorm_scale
    dtype, xs, w = data.draw(rows_of(2 if op == "add_rmsnorm" else 1, (-8, 8), NORM_SPECIALS))
    x = xs[0]
    rows, cols = x.shape
    y = torch.full_like(x, float("nan"))
    load = sees(device)
    xe = load(x)
    we = load(w)
    if op == "rmsnorm":
        def launch(x, w, y):
            if backend == "triton":
                _tnorm().rmsnorm(x, w, y, 1e-6, 0.0, cols, cols, rows, cols)
            else:
                _fray().rmsnorm(x, w, 1e-6, out=y, backend=backend)
        on(device, launch, x, w, y)
        _close(y, rnorm.rmsnorm(xe.double(), we.double(), 1e-6), dtype)
    elif op == "add_rmsnorm":
        r = xs[1]
        s = torch.full_like(x, float("nan"))

        def launch(x, r, w, y, s):
            if backend == "triton":
                _tnorm().add_rmsnorm(x, r, w, y, s, 1e-6, 0.0, cols, cols, cols, cols, rows, cols)
            else:
                got_y, got_s = _fray().add_rmsnorm(x, r, w, 1e-6, backend=backend)
                y.copy_(got_y)
                s.copy_(got_s)
        on(device, launch, x, r, w, y, s)
        ey, es = rnorm.add_rmsnorm(xe.double(), load(r).double(), we.double(), 1e-6,
                                   round_sum=lambda v: load(v.to(dtype)).double())
        _close(s, es, dtype)
        _close(y, ey, dtype)
    else:
        b = w.flip(0)

        def launch(x, w, b, y):
            if backend == "triton":
                _tnorm().layernorm(x, w, b, y, 1e-5, cols, cols, rows, cols)
            else:
                _fray().layernorm(x, w, b, 1e-5, out=y, backend=backend)
        on(device, launch, x, w, b, y)
        be = load(b)
        want = rnorm.layernorm(xe.double(), we.double(), be.double(), 1e-5)
        scale = layernorm_scale(xe.double().nan_to_num(0.0, 0.0, 0.0), we.double(), be.double(), 1e-5)
        _scaled_close(y, want, dtype, scale)


@pytest.mark.parametrize("op", ["rmsnorm", "add_rmsnorm", "layernorm"])
@given(data=st.data())
def test_triton_norm_matches_its_oracle(op, data):
    _norm_property(data, "cpu", "triton", op)


@pytest.mark.parametrize("op", ["rmsnorm", "add_rmsnorm", "layernorm"])
@gpu(max_examples=60)
def test_gpu_norm_matches_its_oracle(op, backend, data):
    _norm_property(data, "cuda", backend, op)


# ---------------------------------------------------------------------------------------------
# softmax

# The Triton softmax's three kernels: one tile of rows (<= 16384 columns), the two-pass loop
# (wider), the persistent one (16-bit, 8193-32768 columns, when the SM count is passed). On the
# CUDA backend (fray.online_softmax) the same three shape classes.
SOFTMAX_KERNELS = {
    "tile": dict(),
    "loop": dict(cols=st.integers(16385, 20000), rows=st.integers(1, 2)),
    "persist": dict(cols=st.integers(8193, 9000), rows=st.integers(1, 5), dtypes=(torch.float16, torch.bfloat16)),
}


def _softmax_property(data, device, backend, kernel):
    from fray.reference import softmax as rsm
    dtype, xs, _ = data.draw(rows_of(1, **SOFTMAX_KERNELS[kernel]))
    x = xs[0]
    rows, cols = x.shape
    y = torch.full_like(x, float("nan"))
    m, lse = torch.full((rows,), float("nan")), torch.full((rows,), float("nan"))

    def launch(x, y, m, lse):
        if backend == "triton":
            _tsm().softmax(x, y, 1.0, cols, cols, rows, cols, row_max=m, row_lse=lse,
                           num_sms=2 if kernel == "persist" else None)
        else:
            _, got_m, got_lse = _fray().online_softmax(x, out=y, backend=backend)
            m.copy_(got_m)
            lse.copy_(got_lse)
    on(device, launch, x, y, m, lse)
    ey, em, el = rsm.online_softmax(sees(device)(x).double())
    _close(y, ey, dtype)
    _close(m, torch.as_tensor(em), torch.float32)
    _close(lse, torch.as_tensor(el), torch.float32)


@pytest.mark.parametrize("kernel", sorted(SOFTMAX_KERNELS))
@given(data=st.data())
def test_triton_softmax_matches_its_oracle(kernel, data):
    _softmax_property(data, "cpu", "triton", kernel)


@pytest.mark.parametrize("kernel", sorted(SOFTMAX_KERNELS))
@gpu(max_examples=100)
def test_gpu_softmax_matches_its_oracle(kernel, backend, data):
    _softmax_property(data, "cuda", backend, kernel)


# ---------------------------------------------------------------------------------------------
# the flat ops (SPECS), argmax, silu_mul / gelu_mul, topk

def _flat_property(data, device, backend, op):
    spec = SPECS[op]
    dtype, xs = data.draw(inputs(spec.arity))
    out = torch.full_like(xs[0], float("nan"))
    on(device, spec.run if backend == "triton" else lambda xs, out: spec.op(xs, out, backend), xs, out)
    want = spec.oracle([sees(device)(x) for x in xs], dtype)
    if spec.exact:
        _bitwise(out, want)
    else:
        _close(out, want, dtype)


@pytest.mark.parametrize("op", sorted(SPECS))
@given(data=st.data())
def test_triton_kernel_matches_its_oracle(op, data):
    _flat_property(data, "cpu", "triton", op)


@pytest.mark.parametrize("op", sorted(SPECS))
@gpu()
def test_gpu_kernel_matches_its_oracle(op, backend, data):
    _flat_property(data, "cuda", backend, op)


def _argmax_property(data, device, backend):
    """argmax: NaN is the maximum (the first NaN wins), ties go to the lowest index, -0.0 == +0.0
    (torch.argmax's rules; the reference's), at any width, exactly."""
    from fray.reference import sampling as rsa
    dtype, xs, _ = data.draw(rows_of(1, cols=st.one_of(st.integers(1, 40), st.integers(41, 9000))))
    x = xs[0]
    if data.draw(st.booleans()):  # ties: a few distinct values only
        x = (x.double().nan_to_num(0.0) * 0 + torch.randint(0, 3, x.shape, generator=torch.Generator().manual_seed(
            data.draw(st.integers(0, 99))), dtype=torch.float64)).to(dtype)
    rows, cols = x.shape
    out = torch.full((rows,), -1, dtype=torch.int64)

    def launch(x, out):
        if backend == "triton":
            from fray_triton import sampling as tsa
            tsa.argmax(x, out, cols, rows, cols)
        else:
            out.copy_(_fray().argmax(x, backend=backend))
    on(device, launch, x, out)
    want = torch.as_tensor(rsa.argmax(sees(device)(x).double().numpy()))
    assert torch.equal(out, want), "argmax %s vs %s" % (out.tolist(), want.tolist())


@given(data=st.data())
def test_triton_argmax_matches_its_oracle(data):
    _argmax_property(data, "cpu", "triton")


@gpu()
def test_gpu_argmax_matches_its_oracle(backend, data):
    _argmax_property(data, "cuda", backend)


def _act_mul_property(data, device, backend, act):
    """silu_mul / gelu_mul's kernel over x = [gate | up] rows (the one-tensor layout)."""
    dtype, xs, _ = data.draw(rows_of(1, cols=st.one_of(st.integers(1, 20), st.integers(21, 1500)).map(lambda d: 2 * d)))
    x = xs[0]
    rows, two_d = x.shape
    d = two_d // 2
    out = torch.full((rows, d), float("nan"), dtype=dtype)

    def launch(x, out):
        if backend == "triton":
            tact = _tact()
            code = {"silu": tact.SILU, "gelu": tact.GELU_ERF, "gelu_tanh": tact.GELU_TANH}[act]
            tact.act_mul(x, x[:, d:], out, code, two_d, two_d, d, rows, d)
        elif act == "silu":
            _fray().silu_mul(x, out=out, backend=backend)
        else:
            _fray().gelu_mul(x, approximate="tanh" if act == "gelu_tanh" else "none", out=out, backend=backend)
    on(device, launch, x, out)
    g, u = (sees(device)(t).double() for t in (x[:, :d], x[:, d:]))
    want = ract.silu_mul(g, u) if act == "silu" else ract.gelu_mul(g, u, "tanh" if act == "gelu_tanh" else "none")
    _close(out, want, dtype)


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@given(data=st.data())
def test_triton_act_mul_matches_its_oracle(act, data):
    _act_mul_property(data, "cpu", "triton", act)


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@gpu(max_examples=60)
def test_gpu_act_mul_matches_its_oracle(act, backend, data):
    _act_mul_property(data, "cuda", backend, act)


def _topk_property(data, device, backend, algorithm):
    """topk: the reference's rank order exactly (NaN first when largest, ties to the lower index,
    -0.0 == +0.0) and the values bit for bit from x. Triton's algorithms "sort" and "reduce", CUDA's
    "partial" (k up to 256 here, as sort's). (Under the interpreter the sort kernel's widths stop
    at 700: its bitonic network takes the interpreter ~7 s a row at 4096.)"""
    from fray.reference import sampling as rsa
    from fray_triton import sampling as tsa
    widest = 700 if algorithm == "sort" and device == "cpu" else 4096
    dtype, xs, _ = data.draw(rows_of(1, cols=st.one_of(st.integers(1, 40), st.integers(41, widest))))
    x = xs[0]
    if data.draw(st.booleans()):  # tie-heavy rows
        x = torch.randint(-2, 3, x.shape, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))),
                          dtype=torch.float64).to(dtype)
    rows, cols = x.shape
    k = data.draw(st.integers(1, min(cols, tsa.REDUCE_MAX_K if algorithm == "reduce" else 256)))
    largest = data.draw(st.booleans())
    values = torch.empty(rows, k, dtype=dtype)
    indices = torch.full((rows, k), -1, dtype=torch.int64)

    def launch(x, values, indices):
        if backend == "triton":
            tsa.topk(x, values, indices, k, largest, algorithm, cols, rows, cols)
        else:
            got_v, got_i = _fray().topk(x, k, algorithm=algorithm, largest=largest, backend=backend)
            values.copy_(got_v)
            indices.copy_(got_i)
    on(device, launch, x, values, indices)
    # order as the kernel compares (what it sees), values as stored in x
    want = torch.as_tensor(rsa.topk_indices(sees(device)(x).double().numpy(), k, largest))
    assert torch.equal(indices, want), "indices %s vs %s" % (indices.tolist()[:2], want.tolist()[:2])
    bits = {2: torch.int16, 4: torch.int32}[x.element_size()]
    assert torch.equal(values.view(bits), torch.gather(x, 1, want).view(bits))


@pytest.mark.parametrize("algorithm", ["sort", "reduce"])
@settings(max_examples=12)
@given(data=st.data())
def test_triton_topk_matches_its_oracle(algorithm, data):
    _topk_property(data, "cpu", "triton", algorithm)


@pytest.mark.parametrize("backend,algorithm", [("triton", "sort"), ("triton", "reduce"), ("cuda", "partial")])
@pytest.mark.gpu
@settings(settings.get_profile("gpu"), max_examples=60)
@given(data=st.data())
def test_gpu_topk_matches_its_oracle(backend, algorithm, data):
    _topk_property(data, "cuda", backend, algorithm)


# ---------------------------------------------------------------------------------------------
# GEMMs: gemm, scaled_gemm, the explicit grouped GEMM; fused_moe

def _gemm_property(data, device, backend):
    """gemm: the float64 product (+ bias) within fray.testing's GEMM bound (the output's rounding plus
    the fp32 accumulation's, growing with sqrt(K)) at random M, N, K from 1 to 100 (none need be a
    multiple of the 32-wide blocks), both b layouts, with or without bias, the input dtype or fp32
    out, rows of a and b wider than their data (row strides free), values N(0, 1) * 10^e with e per
    operand (bf16: 16 decades; fp16 narrower, where its 65504 would overflow the sums).
    Backend "cuda" (fray.gemm, JIT): bf16 in and out, [N, K] weights, no bias (the draws of the
    others are made and overridden), so that its examples build four translation units: the
    heuristic's small-M kernels at M <= 8, <= 16 and <= 32, CUTLASS's 128x128 tile above."""
    from fray.testing import assert_gemm_close
    dtype = data.draw(st.sampled_from((torch.float16, torch.bfloat16)))
    jit = backend == "cuda"
    dtype = torch.bfloat16 if jit else dtype
    m, n, k = (data.draw(st.integers(1, 100)) for _ in range(3))
    nk = data.draw(st.booleans()) or jit
    lo, hi = (-8, 8) if dtype == torch.bfloat16 else (-3, 1)
    odt = data.draw(st.sampled_from((dtype, torch.float32)))
    odt = dtype if jit else odt
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))

    def operand(rows, cols):
        pad = data.draw(st.integers(0, 3))
        x = torch.randn(rows, cols + pad, generator=g, dtype=torch.float64) * 10.0 ** data.draw(st.integers(lo, hi))
        return x.to(dtype)[:, :cols]

    a = operand(m, k)
    b = operand(n, k) if nk else operand(k, n)
    bias = operand(1, n)[0].contiguous() if data.draw(st.booleans()) and not jit else None
    out = torch.full((m, n), float("nan"), dtype=odt)
    config = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": data.draw(st.sampled_from((1, 2))),
              "num_warps": 4, "num_stages": 2}

    def launch(a, b, out, bias):
        if backend == "triton":
            from fray_triton import matmul as tm
            tm.gemm(a, b, out, bias, config, nk, 4, use_desc=False)
        else:
            _fray().gemm(a, b, b_layout="nk" if nk else "kn", bias=bias, out=out, backend=backend)
    on(device, launch, a, b, out, bias)
    a64, b64 = a.double(), (b.double().t() if nk else b.double())
    exp, terms = a64 @ b64, a64.abs() @ b64.abs()
    if bias is not None:
        exp, terms = exp + bias.double(), terms + bias.double().abs()
    assert_gemm_close(out, exp, terms, odt, k, "%dx%dx%d %s %s" % (m, n, k, "nk" if nk else "kn", dtype))


@settings(max_examples=15)
@given(data=st.data())
def test_triton_gemm_matches_its_oracle(data):
    _gemm_property(data, "cpu", "triton")


@gpu(max_examples=50)
def test_gpu_gemm_matches_its_oracle(backend, data):
    _gemm_property(data, "cuda", backend)


def _scaled_gemm_property(data, device, backend):
    """scaled_gemm (int8): the float64 reference within the op's bound at random M, N, K from 1 to
    300 (K past two 128-deep scale blocks; none a multiple of the blocks), every scale kind
    (tensor / vector / block, and tensor x vector mixes), scales spanning 2^-20 to 2^4 (2^-4 for
    fp16 out, whose range the larger products would overflow), rows of a and b wider than their
    data, with or without bias, every output dtype, and operands that hit int8's edges (+-127) as
    well as uniform ones.
    Backend "cuda" (fray.scaled_gemm, JIT): the operands its TMA kernels take (the op's docstring:
    K a multiple of 16, 16-byte output rows, 16-byte row strides: K and the padding rounded up to
    16, N to 8) and one translation unit: vector x vector scales, bf16 out, no bias (the draws of
    the others are made and overridden)."""
    from fray.ops import quant as Q
    jit = backend == "cuda"
    m, n = data.draw(st.integers(1, 100)), data.draw(st.integers(1, 100))
    k = data.draw(st.integers(1, 300))
    kind_a, kind_b = data.draw(st.sampled_from((("tensor", "tensor"), ("vector", "vector"), ("tensor", "vector"),
                                                ("vector", "tensor"), ("block", "block"))))
    odt = data.draw(st.sampled_from((torch.bfloat16, torch.float16, torch.float32)))
    if jit:
        n, k, kind_a, kind_b, odt = -(-n // 8) * 8, -(-k // 16) * 16, "vector", "vector", torch.bfloat16
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    edges = data.draw(st.booleans())

    def operand(rows):
        pad = data.draw(st.integers(0, 3)) * (16 if jit else 1)
        if edges:  # +-127 and 0 only: the int32 sums' extremes
            x = (torch.randint(-1, 2, (rows, k + pad), generator=g) * 127).to(torch.int8)
        else:
            x = torch.randint(-127, 128, (rows, k + pad), generator=g, dtype=torch.int8)
        return x[:, :k]

    def scales(shape):
        # fp16 out: sums up to 300 * 127^2 times two scales stay under 65504 (finite) only below 2^-4
        e = data.draw(st.integers(-20, -4 if odt == torch.float16 else 4))
        return (torch.rand(shape, generator=g) + 0.5) * 2.0 ** e

    kb = -(-k // 128)
    a, b = operand(m), operand(n)
    sa = scales({"tensor": (), "vector": (m, 1), "block": (m, kb)}[kind_a])
    sb = scales({"tensor": (), "vector": (n, 1), "block": (-(-n // 128), kb)}[kind_b])
    bias = torch.randn(n, generator=g).to(odt) if data.draw(st.booleans()) and not jit else None
    out = torch.full((m, n), float("nan"), dtype=odt)
    config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": data.draw(st.sampled_from((1, 2))),
              "num_warps": 4, "num_stages": 2}

    def launch(a, b, sa, sb, bias, out):
        if backend == "triton":
            from fray_triton import scaled_gemm as ts
            ts.scaled_gemm(a, b, sa, sb, Q._KIND_CODE[kind_a], Q._KIND_CODE[kind_b], bias, out, config)
        else:
            _fray().scaled_gemm(a, b, sa, sb, out_dtype=odt, bias=bias, out=out, backend=backend)
    on(device, launch, a, b, sa, sb, bias, out)
    Q.assert_scaled_gemm_close(out, a, b, sa, sb, kind_a, kind_b, bias,
                               what="%dx%dx%d %s/%s %s" % (m, n, k, kind_a, kind_b, odt))


@settings(max_examples=15)
@given(data=st.data())
def test_triton_scaled_gemm_matches_its_oracle(data):
    _scaled_gemm_property(data, "cpu", "triton")


@gpu(max_examples=50)
def test_gpu_scaled_gemm_matches_its_oracle(backend, data):
    _scaled_gemm_property(data, "cuda", backend)


def _grouped_gemm_property(data, device, backend):
    """The explicit grouped GEMM: random rows (1..90), K and N (1..80, none a multiple of the
    32-wide tiles), 1..6 groups of random sizes (empty ones included) starting anywhere in a, rows
    of a wider than their data, strided or contiguous weights in either layout, against the float64
    product rounded once; rows outside the groups stay unwritten.
    Backend "cuda" (fray.grouped_gemm, JIT): the operands its TMA loads take (the op's docstring:
    N and K multiples of 8, contiguous weights, 16-byte row strides: N, K and the padding rounded
    up to 8) and one translation unit: bf16, [G, N, K] weights (the draws of the others are made
    and overridden)."""
    import numpy as np

    from fray.ops import moe_gemm as MG
    jit = backend == "cuda"
    m, k, n = data.draw(st.integers(1, 90)), data.draw(st.integers(1, 80)), data.draw(st.integers(1, 80))
    if jit:
        k, n = -(-k // 8) * 8, -(-n // 8) * 8
    groups = data.draw(st.integers(1, 6))
    layout = "nk" if jit else data.draw(st.sampled_from(("nk", "kn")))
    dtype = data.draw(st.sampled_from((torch.bfloat16, torch.float16)))
    dtype = torch.bfloat16 if jit else dtype
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    cuts = np.sort(np.array([data.draw(st.integers(0, m)) for _ in range(groups + 1)], np.int32))
    pad = data.draw(st.integers(0, 3)) * (8 if jit else 1)
    a = torch.randn(m, k + pad, generator=g).to(dtype)[:, :k]
    b = (torch.randn(groups, n, k, generator=g) / max(k, 1) ** 0.5).to(dtype)
    if layout == "kn":
        b = b.transpose(1, 2).contiguous() if data.draw(st.booleans()) else b.transpose(1, 2)
    offs = torch.from_numpy(cuts)
    out = torch.full((m, n), float("nan"), dtype=dtype)

    def launch(a, b, offs, out):
        if backend == "triton":
            MG._explicit(a, b, offs, out, layout)
        else:
            _fray().grouped_gemm(a, b, offs, b_layout=layout, out=out, backend=backend)
    on(device, launch, a, b, offs, out)
    MG.check_grouped(a, b, offs, out, "grouped %dx%dx%d %s" % (m, k, n, cuts.tolist()), layout)
    outside = torch.ones(m, dtype=torch.bool)
    outside[int(cuts[0]):int(cuts[-1])] = False
    assert torch.isnan(out[outside].float()).all()


@settings(max_examples=15)
@given(data=st.data())
def test_triton_grouped_gemm_matches_its_oracle(data):
    _grouped_gemm_property(data, "cpu", "triton")


@gpu(max_examples=50)
def test_gpu_grouped_gemm_matches_its_oracle(backend, data):
    _grouped_gemm_property(data, "cuda", backend)


def _fused_moe_property(data, device, backend="triton"):
    """fused_moe: random T (1..40), H and I (1..48), E (1..6), top_k up to E, every activation,
    combine mode and layout, the weight on the input or the output, ties in the router (equal
    weights) and an expert map dropping some experts, against the float64 per-token reference with
    every rounding of the unfused chain.
    Backend "cuda" (the CUDA path: CUTLASS's grouped GEMM on fray.jit): what its TMA loads take, H
    and I rounded up to multiples of 8, the staged combine it has, and one weight layout and dtype
    per GEMM translation unit: bf16, "nk" (the draws of the others are made and overridden)."""
    from fray.ops import moe_gemm as MG
    jit = backend == "cuda"
    t, hdim, inter = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 48)), data.draw(st.integers(1, 48))
    if jit:
        hdim, inter = -(-hdim // 8) * 8, -(-inter // 8) * 8
    e = data.draw(st.integers(1, 6))
    k = data.draw(st.integers(1, e))
    dtype = data.draw(st.sampled_from((torch.bfloat16, torch.float16)))
    layout = data.draw(st.sampled_from(("nk", "kn")))
    if jit:
        dtype, layout = torch.bfloat16, "nk"
    activation = data.draw(st.sampled_from(("silu", "gelu", "gelu_tanh")))
    combine = data.draw(st.sampled_from(MG.CUDA_COMBINES if jit else ("atomic", "staged", "scatter")))
    won = data.draw(st.booleans())
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    x = torch.randn(t, hdim, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * inter, hdim, generator=g) / hdim ** 0.5).to(dtype)
    w2 = (torch.randn(e, hdim, inter, generator=g) / inter ** 0.5).to(dtype)
    if layout == "kn":
        w13, w2 = w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    w = torch.rand(t, k, generator=g) + 0.05
    if data.draw(st.booleans()):
        w = torch.full((t, k), 1.0 / k)  # ties
    emap = None
    if data.draw(st.booleans()):  # global ids over e + 2 experts, two of them on no rank here
        perm = torch.randperm(e + 2, generator=g)
        emap = torch.full((e + 2,), -1, dtype=torch.int32)
        emap[perm[:e]] = torch.arange(e, dtype=torch.int32)
        ids = torch.stack([torch.randperm(e + 2, generator=g)[:k] for _ in range(t)]).int()
    out = torch.full((t, hdim), float("nan"), dtype=dtype)
    fused = MG._fused_cuda if jit else MG._fused
    on(device, lambda *ts: fused(*ts, activation, won, layout, combine), x, w13, w2, w.float(), ids, emap, out)
    MG.check_fused(x, w13, w2, w.float(), ids, out, "fused T%d H%d I%d E%d k%d %s %s %s" % (
        t, hdim, inter, e, k, layout, activation, combine), activation, emap, won, layout)


@settings(max_examples=12)
@given(data=st.data())
def test_triton_fused_moe_matches_its_oracle(data):
    _fused_moe_property(data, "cpu")


@gpu(max_examples=10)
def test_gpu_fused_moe_matches_its_oracle(backend, data):
    _fused_moe_property(data, "cuda", backend)
