"""fray.dequantize: reference (hand-computed), Triton (interpreter on CPU), error contract, GPU
(large shapes, torch.compile, CUDA graphs)."""
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


def _q(m, k, dtype=I8, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == I8:
        return torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int32).to(I8)
    return (torch.randn(m, k, generator=g) * 100).clamp(-448, 448).to(E4M3)


def _s(granularity, block, m, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(ref.scale_shape(granularity, m, k, block), generator=g) * 0.1 + 1e-3


def _expected(q, s, granularity, block, dtype):
    return torch.from_numpy(ref.dequantize(q.float().numpy(), s.numpy(), granularity, block)).to(dtype)


def test_hand_computed():
    x = fray.dequantize(np.array([[3, -127], [1, 0]], np.int8), np.array([[0.5], [0.25]], np.float32),
                        granularity="token", dtype=torch.float32)
    assert x.dtype == np.float32 and x.tolist() == [[1.5, -63.5], [0.25, 0.0]]
    # one rounding to bf16: 127 * 0.1 = 12.7 (fp32) -> the nearest bf16
    x = fray.dequantize(torch.tensor([[127]], dtype=I8), torch.tensor(0.1), granularity="tensor")
    assert x.dtype == torch.bfloat16 and x.item() == torch.tensor(np.float32(127) * np.float32(0.1)).bfloat16().item()


@pytest.mark.parametrize("granularity,block", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_round_trip(granularity, block, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 200, generator=g) * 3
    q, s = fray.quantize(x, granularity=granularity, block=block or (1, 128))
    back = fray.dequantize(q, s, granularity=granularity, block=block, dtype=dtype)
    assert back.dtype == dtype and back.shape == x.shape
    se = torch.from_numpy(ref.expand(s.numpy(), granularity, 37, 200, block).copy())
    assert ((back.float() - x).abs() <= se * 0.5 + x.abs() * 2.0 ** -7).all()


def test_fp8_and_out():
    q, s = _q(5, 130, E4M3), _s("block", (1, 128), 5, 130)
    out = torch.empty(5, 130, dtype=torch.float16)
    got = fray.dequantize(q, s, granularity="block", block=(1, 128), dtype=torch.float16, out=out)
    assert got is out and torch.equal(out, _expected(q, s, "block", (1, 128), torch.float16))


# int8 and fp32 / fp16 outputs only: the interpreter's float8 conversions are wrong and its
# fp32 -> bf16 conversion truncates; float8 q and bf16 outputs are checked on the GPU
@INTERPRETER
@pytest.mark.parametrize("granularity,block", CASES)
@pytest.mark.parametrize("qdtype", [I8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_matches_reference(granularity, block, qdtype, dtype):
    from fray_triton import quant as tq
    m, k = 130, 131
    q, s = _q(m, k, qdtype, seed=k), _s(granularity, block, m, k)
    out = torch.full((m, k), float("nan"), dtype=dtype)
    tq.dequantize(q, s, out, granularity, block)
    assert torch.equal(out, _expected(q, s, granularity, block, dtype))


@pytest.mark.parametrize("call,exc,needle", [
    (lambda q, s: fray.dequantize(q.float(), s, granularity="token"), TypeError, "q:"),
    (lambda q, s: fray.dequantize(q[0], s, granularity="token"), ValueError, "q:"),
    (lambda q, s: fray.dequantize(q[None], s, granularity="token"), ValueError, "q:"),
    (lambda q, s: fray.dequantize(q, s.double(), granularity="token"), TypeError, "scale:"),
    (lambda q, s: fray.dequantize(q, s[:2], granularity="token"), ValueError, "scale:"),
    (lambda q, s: fray.dequantize(q, s, granularity="channel"), ValueError, "scale:"),
    (lambda q, s: fray.dequantize(q, s, granularity="tok"), ValueError, "granularity:"),
    (lambda q, s: fray.dequantize(q, s, granularity="block"), ValueError, "block:"),
    (lambda q, s: fray.dequantize(q, s, granularity="block", block=(2, 128)), ValueError, "block:"),
    (lambda q, s: fray.dequantize(q, s, granularity="token", dtype=torch.int8), TypeError, "dtype:"),
    (lambda q, s: fray.dequantize(q, 0.5, granularity="token"), TypeError, "scale:"),
    (lambda q, s: fray.dequantize(q, s, granularity="token", out=torch.empty(4, 9)), TypeError, "out:"),
    (lambda q, s: fray.dequantize(q, s, granularity="token", backend="cuda"), ValueError, "backend:"),
])
def test_errors_name_the_argument(call, exc, needle):
    q = _q(4, 9)
    with pytest.raises(exc, match=needle):
        call(q, _s("token", None, 4, 9))


@pytest.mark.gpu
@pytest.mark.parametrize("qdtype", [I8, E4M3])
@pytest.mark.parametrize("granularity,block", CASES)
def test_gpu_large_vs_reference(cuda, qdtype, granularity, block):
    m, k = 16384, 8192
    q, s = _q(m, k, qdtype), _s(granularity, block, m, k)
    got = fray.dequantize(q.to(cuda), s.to(cuda), granularity=granularity, block=block)
    assert torch.equal(got.cpu(), _expected(q, s, granularity, block, torch.bfloat16))


@pytest.mark.gpu
def test_gpu_torch_compile_and_graph(cuda):
    q, s = _q(1000, 2048).to(cuda), _s("block", (128, 128), 1000, 2048).to(cuda)

    def f(q, s):
        return fray.dequantize(q, s, granularity="block", block=(128, 128))

    assert torch.equal(torch.compile(f, fullgraph=True)(q, s), f(q, s))
    f(q, s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(q, s)
    new = _q(1000, 2048, seed=9)
    q.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), _expected(new, s.cpu(), "block", (128, 128), torch.bfloat16))
