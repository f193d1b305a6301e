"""fray.argmax: torch.argmax semantics (NaN is the max, ties -> earliest), Triton, errors; on a GPU
every backend (CUDA, Triton) x dtype x awkward shape, graphs, torch.compile."""
import os

import numpy as np
import pytest
import torch

import fray
from fray.reference import sampling as ref

INTERP = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
NAN = float("nan")


def test_reference_by_hand_and_matches_torch():
    x = torch.tensor([[1.0, 3.0, 3.0], [NAN, 5.0, NAN], [-0.0, 0.0, -1.0], [-2.0, -1.0, -1.0]])
    assert ref.argmax(x.double().numpy()).tolist() == [1, 0, 0, 1]
    assert fray.argmax(x).tolist() == torch.argmax(x, dim=-1).tolist() == [1, 0, 0, 1]
    assert fray.argmax(np.array([4.0, 4.0])) == 0
    assert fray.argmax(torch.randn(2, 3, 5)).shape == (2, 3)


@INTERP
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_interpreter_vs_reference(dtype):
    from fray_triton import sampling as ts
    g = torch.Generator().manual_seed(1)
    for rows, width in ((1, 1), (4, 7), (3, 1500)):
        x = (torch.randn(rows, width, generator=g) * 2).round().to(dtype)
        if width > 5:
            x[1, 4] = NAN
            x[2, :] = -0.0
            x[2, 3] = 0.0
        out = torch.full((rows,), -1, dtype=torch.int64)
        ts.argmax(x, out, x.stride(0), rows, width)
        np.testing.assert_array_equal(out.numpy(), ref.argmax(x.double().numpy()))
        np.testing.assert_array_equal(out.numpy(), torch.argmax(x.float(), dim=-1).numpy())


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="x:"):
        fray.argmax(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="x:"):
        fray.argmax(torch.zeros(3, 0))
    with pytest.raises(ValueError, match="backend:"):
        fray.argmax(torch.zeros(3), backend="cuda")


def _argmax_ref(x64):
    """ref.argmax without its sort (fast enough for 40M-element checks): the first NaN if a row
    has one, else the first maximum (+0.0 and -0.0 compare equal)."""
    nan = np.isnan(x64)
    first_max = np.argmax(np.where(nan, np.inf, x64), axis=-1)
    return np.where(nan.any(axis=-1), np.argmax(nan, axis=-1), first_max)


def test_fast_reference_matches_reference():
    g = np.random.default_rng(0)
    x = np.round(g.standard_normal((50, 301)) * 2)
    x[3, 7] = x[3, 200] = np.nan
    x[4, :] = -0.0
    x[4, 9] = 0.0
    x[5, 11] = x[5, 3] = np.inf
    x[6, :] = -np.inf
    np.testing.assert_array_equal(_argmax_ref(x), ref.argmax(x))


# ---------------------------------------------------------------------------------------------
# GPU (H200)

BACKENDS = ["cuda", "triton"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (rows, width): one warp per row (<= 256 vectors), one CTA per row, and clusters of 2..16 CTAs per
# row (few wide rows); widths 1, 7, 256, 4097 and odd ones, up to beyond topk's 262144.
SHAPES = [(1, 1), (5, 7), (4096, 256), (3, 999), (3, 4097), (5, 32000), (1, 131072), (3, 131071),
          (256, 152064), (2, 262144), (2, 300001)]


def _logits(rows, width, dtype, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = (torch.randn(rows, width, generator=g, device=dev) * 3).round()
    if rows >= 3 and width >= 3:
        x[1, width // 2] = float("nan")       # a NaN wins
        x[1, width - 1] = float("nan")
        x[2] = -0.0                           # all ties: index 0 (-0.0 == +0.0)
        x[2, width - 2] = 0.0
    return x.to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows,width", SHAPES)
def test_gpu_vs_reference(cuda, backend, dtype, rows, width):
    x = _logits(rows, width, dtype, cuda, rows * 131 + width)
    i = fray.argmax(x, backend=backend)
    assert i.device == x.device and i.dtype == torch.int64 and i.shape == (rows,)
    np.testing.assert_array_equal(i.cpu().numpy(), _argmax_ref(x.double().cpu().numpy()))
    if width <= 4097:
        np.testing.assert_array_equal(i.cpu().numpy(), ref.argmax(x.double().cpu().numpy()))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_special_values_and_layouts(cuda, backend, dtype):
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype]
    x = torch.full((4, 70000), float("-inf"), device=cuda).to(dtype)
    x[0, 60000] = float("inf")
    x[0, 69999] = float("inf")
    x[1, 12345] = 1.0
    x.view(bits)[2, 500] = -1  # all-ones bits: a sign-bit NaN with a payload is still the maximum
    x[2, 400] = float("inf")
    i = fray.argmax(x, backend=backend)
    assert i.tolist() == [60000, 12345, 500, 0]
    big = (torch.randn(5, 140000, device=cuda) * 3).round().to(dtype)
    for v in (big[:, 1:131073], big[:, :4097], big[:3, 3:1002], big[:4, :6000].reshape(2, 2, 6000),
              big[0, :5000].expand(3, 5000)):
        got = fray.argmax(v, backend=backend)
        assert got.shape == v.shape[:-1]
        np.testing.assert_array_equal(got.cpu().numpy(), _argmax_ref(v.double().cpu().numpy()))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_graph_and_compile(cuda, backend):
    for rows, width in ((8, 5000), (1, 131072), (256, 152064)):
        x = torch.randn(rows, width, device=cuda)
        fray.argmax(x, backend=backend)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fray.argmax(x, backend=backend)
        x.copy_(torch.randn(rows, width, device=cuda))
        graph.replay()
        assert torch.equal(out, torch.argmax(x, dim=-1))
    f = torch.compile(lambda t: fray.argmax(t, backend=backend), fullgraph=True)
    x = torch.randn(3, 70001, device=cuda).to(torch.bfloat16)
    assert torch.equal(f(x), torch.argmax(x, dim=-1))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = fray.argmax(x, backend=backend)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(out, torch.argmax(x, dim=-1))
