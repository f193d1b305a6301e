"""Property-based tests (hypothesis) of the Triton kernels under Triton's CPU interpreter against
their oracles: random lengths (1 to 5000, odd ones and non-multiples of the 4096-element block
included), every dtype, values spread over 60 decades, and special values sprinkled in (inf, -inf,
NaN, +-0, subnormals of the dtype, +-1e30, the dtype's largest finite value). The oracle is the
op's documented rule: vector_add and mul are bitwise torch.add / torch.mul (fp32 math, one
rounding); axpy and the unary activations are the float64 reference, rounded to the dtype,
within the dtype's tolerance, with NaN where the reference has NaN and the same infinities.

Derandomised (the CI profile): the same examples on every run. A family joins by adding its ops
to SPECS.
"""
import dataclasses
from typing import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fray.reference import activation as ract
from fray.reference import elementwise as rew
from fray.testing import TOLERANCES

settings.register_profile("ci", derandomize=True, max_examples=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")

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


def interpreter_load(x):
    """What a kernel sees of x under Triton's CPU interpreter: its bf16 -> fp32 conversion flushes
    bf16 subnormals to a zero of their sign (test_interpreter_flushes_bf16_subnormals holds it; on
    the GPU the conversion is a bit shift, exact), so the oracle takes the inputs the same way."""
    if x.dtype != torch.bfloat16:
        return x
    sub = (x != 0) & (x.abs() < torch.finfo(x.dtype).tiny)
    return torch.where(sub, x * 0, x)


def test_interpreter_flushes_bf16_subnormals():
    from fray_triton import elementwise
    x = torch.tensor([2.938735877055719e-39, -2.938735877055719e-39, 1.0], dtype=torch.bfloat16)
    out = torch.empty_like(x)
    elementwise.mul(x, torch.ones_like(x), out, 3)
    assert out.tolist() == [0.0, -0.0, 1.0] and torch.signbit(out).tolist() == [False, True, False]
    assert torch.equal(interpreter_load(x), out)


@dataclasses.dataclass
class Spec:
    arity: int
    run: Callable      # (inputs, out) -> None: the Triton kernel under the interpreter
    oracle: Callable   # (inputs, dtype) -> the expected tensor (exact) or float64 (close)
    exact: bool


def _tew():
    from fray_triton import elementwise
    return elementwise


def _tact():
    from fray_triton import activation
    return activation


def _unary(code_name, reference):
    return Spec(1, lambda xs, out: _tact().unary(xs[0], out, getattr(_tact(), code_name), out.numel()),
                lambda xs, dtype: reference(xs[0].double()), False)


SPECS = {
    "vector_add": Spec(2, lambda xs, out: _tew().vector_add(xs[0], xs[1], out, out.numel()),
                       lambda xs, dtype: torch.add(xs[0], xs[1]), True),
    "mul": Spec(2, lambda xs, out: _tew().mul(xs[0], xs[1], out, out.numel()),
                lambda xs, dtype: torch.mul(xs[0], xs[1]), True),
    "axpy": Spec(1, lambda xs, out: _tew().axpy(xs[0], out, out.numel(), -1.75, 0.3),
                 lambda xs, dtype: rew.axpy(xs[0].double(), -1.75, 0.3), False),
    "silu": _unary("SILU", ract.silu),
    "gelu": _unary("GELU_ERF", ract.gelu),
    "gelu_tanh": _unary("GELU_TANH", lambda g: ract.gelu(g, "tanh")),
    "relu": _unary("RELU", ract.relu),
    "tanh": _unary("TANH", ract.tanh),
    "sigmoid": _unary("SIGMOID", ract.sigmoid),
}


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("op", sorted(SPECS))
@given(data=st.data())
def test_triton_kernel_matches_its_oracle(op, data):
    spec = SPECS[op]
    dtype, xs = data.draw(inputs(spec.arity))
    out = torch.full_like(xs[0], float("nan"))
    spec.run(xs, out)
    want = spec.oracle([interpreter_load(x) for x in xs], dtype)
    if spec.exact:
        _bitwise(out, want)
    else:
        _close(out, want, dtype)
