"""fray.topk: reference rules by hand, Triton (interpreter on CPU) vs reference, errors, GPU."""
import os

import numpy as np
import pytest
import torch

import fray
from fray.reference import sampling as ref

INTERP = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
NAN = float("nan")


# ---------------------------------------------------------------------------------------------
# CPU: the reference's rules, by hand

def test_reference_ties_nan_signed_zero():
    x = np.array([[1.0, NAN, 3.0, -0.0, 0.0, 3.0, NAN]])
    # largest: NaNs first (by index), then 3 (index 2 before 5), 1, then -0 == +0 by index.
    np.testing.assert_array_equal(ref.topk_indices(x, 7), [[1, 6, 2, 5, 0, 3, 4]])
    # smallest: -0 == +0 by index, 1, 3, 3, NaNs last.
    np.testing.assert_array_equal(ref.topk_indices(x, 7, largest=False), [[3, 4, 0, 2, 5, 1, 6]])


def test_reference_k1_and_k_width_and_values_bits():
    x = np.array([[2.0, 5.0, 5.0, -1.0], [-0.0, 0.0, -0.0, -3.0]], dtype=np.float32)
    v, i = fray.topk(x, 1)
    np.testing.assert_array_equal(i, [[1], [0]])
    assert np.signbit(v[1, 0])  # the value is read from x: -0.0 stays -0.0
    v, i = fray.topk(x, 4)
    np.testing.assert_array_equal(i, [[1, 2, 0, 3], [0, 1, 2, 3]])
    np.testing.assert_array_equal(np.signbit(v[1]), [True, False, True, True])


def test_cpu_tensor_matches_reference_and_keeps_dtype():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 50, generator=g).to(torch.bfloat16)  # bf16: many ties
    v, i = fray.topk(x, 7)
    assert v.dtype == torch.bfloat16 and i.dtype == torch.int64 and v.shape == (3, 2, 7)
    np.testing.assert_array_equal(i.numpy(), ref.topk_indices(x.double().numpy(), 7))
    assert torch.equal(v, torch.gather(x, -1, i))
    v2, i2 = fray.topk(x, 7, largest=False)
    np.testing.assert_array_equal(i2.numpy(), ref.topk_indices(x.double().numpy(), 7, largest=False))


# ---------------------------------------------------------------------------------------------
# CPU: Triton under the interpreter

def _triton_topk(x, k, largest, algorithm):
    from fray_triton import sampling as ts
    rows, width = x.shape
    v = torch.full((rows, k), NAN, dtype=x.dtype)
    i = torch.full((rows, k), -7, dtype=torch.int64)
    ts.topk(x, v, i, k, largest, algorithm, x.stride(0), rows, width)
    return v, i


@INTERP
@pytest.mark.parametrize("algorithm", ["sort", "reduce"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("largest", [True, False])
def test_triton_interpreter_vs_reference(algorithm, dtype, largest):
    g = torch.Generator().manual_seed(3)
    for rows, width, k in ((1, 1, 1), (3, 7, 7), (2, 100, 5), (2, 33, 1)):
        x = (torch.randn(rows, width, generator=g) * 3).round().to(dtype)  # rounding makes ties
        if width >= 7:
            x[0, 3], x[0, 5], x[-1, 1], x[-1, 2] = NAN, -0.0, 0.0, NAN
        before = x.clone()
        v, i = _triton_topk(x, k, largest, algorithm)
        bits = torch.int16 if dtype != torch.float32 else torch.int32
        assert torch.equal(x.view(bits), before.view(bits))  # x is untouched
        np.testing.assert_array_equal(i.numpy(), ref.topk_indices(x.double().numpy(), k, largest))
        # (gather on the integer view: torch's CPU bf16 gather rewrites NaN payloads)
        assert torch.equal(v.view(bits), torch.gather(x.view(bits), 1, i))  # values bit for bit


@INTERP
def test_triton_interpreter_reduce_multichunk():
    # width > LOOP_BLOCK: the reduce kernel's chunk loop and its cross-chunk tie-break.
    x = torch.zeros(1, 2500)
    x[0, 2100] = 1.0
    x[0, 5] = 1.0
    _, i = _triton_topk(x, 3, True, "reduce")
    assert i.tolist() == [[5, 2100, 0]]


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="k:"):
        fray.topk(x, 0)
    with pytest.raises(ValueError, match="k:"):
        fray.topk(x, 9)
    with pytest.raises(TypeError, match="k:"):
        fray.topk(x, 2.0)
    with pytest.raises(ValueError, match="algorithm:"):
        fray.topk(x, 2, algorithm="bogus")
    with pytest.raises(TypeError, match="largest:"):
        fray.topk(x, 2, largest=1)
    with pytest.raises(TypeError, match="x:"):
        fray.topk(x.int(), 2)
    with pytest.raises(ValueError, match="x:"):
        fray.topk(torch.randn(2, 0), 1)
    with pytest.raises(ValueError, match="backend:"):
        fray.topk(x, 2, backend="triton")
    with pytest.raises(TypeError, match="x:"):
        fray.topk([1.0, 2.0], 1)


# ---------------------------------------------------------------------------------------------
# GPU (next session, H200)

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width,k,algorithm", [(1, 1, "auto"), (111, 111, "sort"), (4096, 50, "sort"),
                                               (32000, 1, "reduce"), (131072, 64, "reduce"),
                                               (262144, 8, "reduce"), (152064, 1000, "torch"),
                                               (300000, 3, "auto")])
def test_gpu_vs_reference(cuda, dtype, width, k, algorithm):
    g = torch.Generator(device=cuda).manual_seed(width + k)
    x = (torch.randn(3, width, device=cuda, generator=g) * 4).round().to(dtype)
    x[0, 7 % width] = NAN
    for largest in (True, False):
        v, i = fray.topk(x, k, algorithm=algorithm, largest=largest)
        assert v.device == x.device and i.dtype == torch.int64
        np.testing.assert_array_equal(i.cpu().numpy(), ref.topk_indices(x.double().cpu().numpy(), k, largest))
        assert torch.equal(v.cpu().double().nan_to_num(1e9), torch.gather(x, 1, i).cpu().double().nan_to_num(1e9))


@pytest.mark.gpu
def test_gpu_forced_algorithms_raise_and_workspace(cuda):
    x = torch.randn(2, 5000, device=cuda)
    with pytest.raises(ValueError, match="x:"):
        fray.topk(x, 3, algorithm="sort")
    with pytest.raises(ValueError, match="k:"):
        fray.topk(x, 65, algorithm="reduce")
    with pytest.raises(ValueError, match="algorithm:"):
        fray.topk(x, 3, algorithm="partial")
    need = fray.topk_workspace_size(x, 100, algorithm="torch")
    assert need == 2 * 5000 * 12
    with pytest.raises(ValueError, match="workspace:"):
        fray.topk(x, 100, algorithm="torch", workspace=torch.empty(need - 1, dtype=torch.uint8, device=cuda))
    v, i = fray.topk(x, 100, algorithm="torch", workspace=torch.empty(need, dtype=torch.uint8, device=cuda))
    np.testing.assert_array_equal(i.cpu().numpy(), ref.topk_indices(x.double().cpu().numpy(), 100))
    assert fray.topk_workspace_size(x, 3, algorithm="reduce") == 0


@pytest.mark.gpu
def test_gpu_torch_compile_and_alias(cuda):
    x = torch.randn(4, 1000, device=cuda)
    f = torch.compile(lambda t: fray.topk(t, 10), fullgraph=True)
    v, i = f(x)
    np.testing.assert_array_equal(i.cpu().numpy(), ref.topk_indices(x.double().cpu().numpy(), 10))
    if hasattr(fray.triton, "topk"):
        assert torch.equal(fray.triton.topk(x, 10)[1], i)
