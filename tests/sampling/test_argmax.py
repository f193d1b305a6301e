"""fray.argmax: torch.argmax semantics (NaN is the max, ties -> earliest), Triton, errors, GPU."""
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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 4097, 32000, 152064])
def test_gpu_vs_torch(cuda, dtype, width):
    x = (torch.randn(5, width, device=cuda) * 3).round().to(dtype)
    x[1, width // 2] = NAN
    i = fray.argmax(x)
    assert i.device == x.device and i.dtype == torch.int64
    assert torch.equal(i, torch.argmax(x, dim=-1))


@pytest.mark.gpu
def test_gpu_graph_and_compile(cuda):
    x = torch.randn(8, 5000, device=cuda)
    fray.argmax(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fray.argmax(x)
    x.copy_(torch.randn(8, 5000, device=cuda))
    graph.replay()
    assert torch.equal(out, torch.argmax(x, dim=-1))
    f = torch.compile(lambda t: fray.argmax(t), fullgraph=True)
    assert torch.equal(f(x), torch.argmax(x, dim=-1))
