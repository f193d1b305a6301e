"""fray.rope: reference, Triton (interpreter on CPU), CUDA (GPU), error contract, seed aliases."""
import math
import os

import numpy as np
import pytest
import torch

import fray
from fray import backend as B
from fray.ops import rope as ops
from fray.reference import rope as ref
from fray.testing import assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
STYLES = ["neox", "gptj"]
interpreter_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                      reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _tables(max_position, rotary_dim, theta, device):
    """(fp32 table the op uses, its cos and sin halves in float64)."""
    table = ops.cos_sin_cache(max_position, rotary_dim, theta, device)
    half = rotary_dim // 2
    return table, table[:, :half].double(), table[:, half:].double()


def _expected(x, positions, cos, sin, style):
    """float64 reference next to the data (positions: int tensor or offset)."""
    if not isinstance(positions, torch.Tensor):
        positions = positions + torch.arange(x.shape[0], device=x.device)
    return ref.rope(x.double(), positions.long(), cos, sin, style)


# ---------------------------------------------------------------------------------------------
# CPU: reference against hand-computed values

def test_reference_cache_hand_computed():
    # rotary_dim 4, theta 100: frequencies 100^0 = 1 and 100^(-2/4) = 0.1.
    table = ref.cos_sin_cache(4, 4, theta=100.0)
    np.testing.assert_allclose(table[3], [math.cos(3.0), math.cos(0.3), math.sin(3.0), math.sin(0.3)], rtol=1e-15)
    np.testing.assert_allclose(table[0], [1.0, 1.0, 0.0, 0.0], rtol=0, atol=0)
    # the torch-built fp32 table the op uses matches to fp32 rounding
    t = ops.cos_sin_cache(64, 8, 10000.0, "cpu")
    assert t.dtype == torch.float32 and t.shape == (64, 8)
    np.testing.assert_allclose(t.numpy(), ref.cos_sin_cache(64, 8, 10000.0), rtol=0, atol=6e-8)
    assert ops.cos_sin_cache(64, 8, 10000.0, "cpu") is t  # built once


def test_reference_hand_computed():
    # 2 dims: the single pair (x0, x1) rotates by p radians.
    cos, sin = np.array([[1.0], [math.cos(1.0)]]), np.array([[0.0], [math.sin(1.0)]])
    out = ref.rope(np.array([[[1.0, 0.0]], [[1.0, 0.0]]]), np.array([0, 1]), cos, sin)
    np.testing.assert_allclose(out, [[[1.0, 0.0]], [[math.cos(1.0), math.sin(1.0)]]], rtol=1e-15)
    # rotary_dim 4, theta 100, position 5: pairs rotate by 5 and 0.5 radians.
    table = ref.cos_sin_cache(6, 4, theta=100.0)
    c, s = table[:, :2], table[:, 2:]
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]])
    neox = ref.rope(x, np.array([5]), c, s, "neox")  # pairs (x0, x2) and (x1, x3)
    np.testing.assert_allclose(neox[0, 0], [
        1 * math.cos(5) - 3 * math.sin(5), 2 * math.cos(0.5) - 4 * math.sin(0.5),
        3 * math.cos(5) + 1 * math.sin(5), 4 * math.cos(0.5) + 2 * math.sin(0.5)], rtol=1e-14)
    gptj = ref.rope(x, np.array([5]), c, s, "gptj")  # pairs (x0, x1) and (x2, x3)
    np.testing.assert_allclose(gptj[0, 0], [
        1 * math.cos(5) - 2 * math.sin(5), 2 * math.cos(5) + 1 * math.sin(5),
        3 * math.cos(0.5) - 4 * math.sin(0.5), 4 * math.cos(0.5) + 3 * math.sin(0.5)], rtol=1e-14)


def test_reference_position_zero_identity_partial_and_styles():
    g = np.random.default_rng(0)
    x = g.standard_normal((5, 3, 12))
    table = ref.cos_sin_cache(10, 8, 10000.0)
    c, s = table[:, :4], table[:, 4:]
    for style in STYLES:
        np.testing.assert_array_equal(ref.rope(x, np.zeros(5, dtype=np.int64), c, s, style), x)
        out = ref.rope(x, np.arange(5), c, s, style)
        np.testing.assert_array_equal(out[..., 8:], x[..., 8:])  # partial rotary: the tail passes through
        # a rotation keeps the norm of every pair
        np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13)
    # gptj on interleaved data equals neox on the de-interleaved data
    perm = np.r_[0:8:2, 1:8:2, 8:12]
    gptj = ref.rope(x, np.arange(5), c, s, "gptj")
    neox = ref.rope(x[..., perm], np.arange(5), c, s, "neox")
    np.testing.assert_allclose(gptj[..., perm], neox, rtol=1e-14)


def test_numpy_in_numpy_out_offset_and_inplace():
    q = np.array([[[1.0, 0.0]], [[1.0, 0.0]]], dtype=np.float32)
    k = np.array([[[0.0, 2.0]], [[0.0, 2.0]]], dtype=np.float32)
    qo, ko = fray.rope(q, k, 0, max_position=4)
    assert isinstance(qo, np.ndarray) and qo.dtype == np.float32
    np.testing.assert_allclose(qo[:, 0], [[1.0, 0.0], [math.cos(1), math.sin(1)]], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ko[:, 0], [[0.0, 2.0], [-2 * math.sin(1), 2 * math.cos(1)]], rtol=1e-6, atol=1e-7)
    qo2, _ = fray.rope(q, None, np.array([0, 1]), max_position=4)
    np.testing.assert_array_equal(qo2, qo)
    a, b = fray.rope(q, k, 0, max_position=4, inplace=True)
    assert a is q and b is k
    np.testing.assert_array_equal(q, qo)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", STYLES)
def test_cpu_tensor_runs_reference(dtype, style):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(6, 4, 16, generator=g).to(dtype)
    k = torch.randn(6, 2, 16, generator=g).to(dtype)
    pos = torch.tensor([0, 5, 2, 9, 9, 1], dtype=torch.int32)
    qo, ko = fray.rope(q, k, pos, max_position=10, rotary_dim=8, style=style)
    assert qo.dtype == dtype and qo.shape == q.shape and ko.shape == k.shape
    exact = ref.cos_sin_cache(10, 8, 10000.0)
    cos, sin = torch.from_numpy(exact[:, :4]), torch.from_numpy(exact[:, 4:])
    assert_close(qo, ref.rope(q.double(), pos.long(), cos, sin, style), dtype, "cpu q")
    assert_close(ko, ref.rope(k.double(), pos.long(), cos, sin, style), dtype, "cpu k")
    q2, k2 = q.clone(), k.clone()
    a, b = fray.rope(q2, k2, pos, max_position=10, rotary_dim=8, style=style, inplace=True)
    assert a is q2 and b is k2 and torch.equal(q2, qo) and torch.equal(k2, ko)


def test_cpu_passed_cache_tensor_and_pair():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(3, 2, 8, generator=g)
    table = torch.randn(7, 8, generator=g)  # any table (e.g. a scaled variant) is used as given
    pos = torch.tensor([6, 0, 3])
    qo, ko = fray.rope(q, None, pos, max_position=7, cos_sin_cache=table)
    assert ko is None
    assert_close(qo, ref.rope(q.double(), pos, table[:, :4].double(), table[:, 4:].double(), "neox"),
                 torch.float32, "passed cache")
    qo2, _ = fray.rope(q, None, pos, max_position=7, cos_sin_cache=(table[:, :4].contiguous(), table[:, 4:].contiguous()))
    assert torch.equal(qo, qo2)
    # rotary_dim defaults to the passed table's width: a 4-wide table rotates 4 of 8 dims
    qo3, _ = fray.rope(q, None, pos, max_position=7, cos_sin_cache=table[:, :4].contiguous())
    assert torch.equal(qo3[..., 4:], q[..., 4:])


def test_seed_alias_cpu():
    if not hasattr(fray.jit_kernels, "fused_rope"):
        pytest.skip("fray.jit_kernels.fused_rope alias not added yet")
    g = torch.Generator().manual_seed(8)
    q, k = torch.randn(3, 2, 8, generator=g), torch.randn(3, 1, 8, generator=g)
    table = ops.cos_sin_cache(16, 8, 10000.0, "cpu")
    pos = torch.tensor([4, 0, 15], dtype=torch.int32)
    eq, ek = fray.rope(q, k, pos, max_position=16, cos_sin_cache=table)
    a, b = fray.jit_kernels.fused_rope(q, k, table[:, :4].contiguous(), table[:, 4:].contiguous(), pos)
    assert a is q and b is k and torch.equal(q, eq) and torch.equal(k, ek)


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernel under TRITON_INTERPRET=1 (set by the Bazel CPU target)

def _triton(q, k, positions, table, rotary_dim, style, inplace=False, offset=0):
    from fray_triton import rope as trope
    half = rotary_dim // 2
    if inplace:
        qo, ko = q, k
    else:
        qo = torch.full(q.shape, float("nan"), dtype=q.dtype)
        ko = torch.full(k.shape, float("nan"), dtype=k.dtype) if k is not None else None
    trope.rope(q, k, qo, ko, positions, offset, table[:, :half], table[:, half:], table.stride(0),
               rotary_dim, style == "neox")
    return qo, ko


@interpreter_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("tokens,hq,hk,d,rd", [(1, 1, 1, 2, 2), (3, 3, 1, 12, 8), (5, 4, 2, 64, 64),
                                              (2, 2, 1, 256, 128), (4, 5, 3, 6, 4)])
def test_triton_interpreter_vs_reference(dtype, style, tokens, hq, hk, d, rd):
    g = torch.Generator().manual_seed(tokens * 1009 + d)
    q = torch.randn(tokens, hq, d, generator=g).to(dtype)
    k = torch.randn(tokens, hk, d, generator=g).to(dtype)
    table, cos, sin = _tables(300, rd, 10000.0, "cpu")
    pos = torch.randint(0, 300, (tokens,), generator=g)
    qo, ko = _triton(q, k, pos, table, rd, style)
    assert_close(qo, _expected(q, pos, cos, sin, style), dtype, "triton q")
    assert_close(ko, _expected(k, pos, cos, sin, style), dtype, "triton k")


@interpreter_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("style", STYLES)
def test_triton_interpreter_fused_qkv_views_inplace_offset_int32(dtype, style):
    tokens, hq, hk, d, rd = 5, 4, 2, 16, 8
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(tokens, (hq + 2 * hk) * d + 3, generator=g).to(dtype)  # odd token stride
    q = qkv[:, :hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d:(hq + hk) * d].view(tokens, hk, d)
    v_before = qkv[:, (hq + hk) * d:].clone()
    table, cos, sin = _tables(64, rd, 500.0, "cpu")
    pos = torch.tensor([7, 0, 63, 8, 8], dtype=torch.int32)
    eq, ek = _expected(q, pos, cos, sin, style), _expected(k, pos, cos, sin, style)
    qo, ko = _triton(q, k, pos, table, rd, style)  # out of place: the tail is copied
    assert_close(qo, eq, dtype, "fused q")
    assert_close(ko, ek, dtype, "fused k")
    a, b = _triton(q, k, pos, table, rd, style, inplace=True)
    assert_close(q, eq, dtype, "fused q in place")
    assert_close(k, ek, dtype, "fused k in place")
    assert torch.equal(qkv[:, (hq + hk) * d:], v_before)  # v (and the padding) untouched
    # int offset, k = None
    q2 = torch.randn(3, 2, 16, generator=g).to(dtype)
    qo2, ko2 = _triton(q2, None, None, table, rd, style, offset=60)
    assert ko2 is None
    assert_close(qo2, _expected(q2, 60, cos, sin, style), dtype, "offset")


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    q = torch.randn(4, 2, 8)
    k = torch.randn(4, 1, 8)
    pos = torch.arange(4)
    kw = dict(max_position=16)
    with pytest.raises(ValueError, match=r"rotary_dim: expected an even value in \[2, head_dim=8\], got 5"):
        fray.rope(q, k, pos, rotary_dim=5, **kw)
    with pytest.raises(ValueError, match="rotary_dim: expected an even value"):
        fray.rope(q, k, pos, rotary_dim=10, **kw)
    with pytest.raises(ValueError, match="rotary_dim: expected an even value"):
        fray.rope(torch.randn(4, 2, 7), None, pos, **kw)  # odd head_dim needs an explicit rotary_dim
    with pytest.raises(TypeError, match="rotary_dim: expected an int"):
        fray.rope(q, k, pos, rotary_dim=4.0, **kw)
    with pytest.raises(TypeError, match="positions: expected dtype int32 or int64, got float32"):
        fray.rope(q, k, pos.float(), **kw)
    with pytest.raises(TypeError, match="positions: expected a tensor on cpu"):
        fray.rope(q, k, torch.empty(4, dtype=torch.int64, device="meta"), **kw)
    with pytest.raises(ValueError, match=r"positions: expected shape \(4,\)"):
        fray.rope(q, k, torch.arange(5), **kw)
    with pytest.raises(TypeError, match="positions: expected an int32/int64 tensor or an int offset"):
        fray.rope(q, k, [0, 1, 2, 3], **kw)
    with pytest.raises(TypeError, match="positions: expected an int32/int64 tensor or an int offset, got bool"):
        fray.rope(q, k, True, **kw)
    with pytest.raises(ValueError, match="positions: offset 13 \\+ 4 tokens must lie within max_position=16"):
        fray.rope(q, k, 13, **kw)
    with pytest.raises(ValueError, match="positions: offset -1"):
        fray.rope(q, k, -1, **kw)
    with pytest.raises(ValueError, match=r"positions: values must lie in \[0, max_position=16\)"):
        fray.rope(q, k, torch.tensor([0, 1, 16, 2]), **kw)  # the CPU path always checks
    with pytest.raises(TypeError, match="max_position: expected an int"):
        fray.rope(q, k, pos, max_position=16.0)
    with pytest.raises(ValueError, match="max_position: expected an int >= 1"):
        fray.rope(q, k, 0, max_position=0)
    with pytest.raises(ValueError, match="max_position: expected an int <= 2147483648"):
        fray.rope(q, k, 0, max_position=2 ** 70)  # (the census found numpy's error, naming nothing)
    with pytest.raises(TypeError, match="k: expected dtype float32"):
        fray.rope(q, k.half(), pos, **kw)
    with pytest.raises(ValueError, match=r"k: expected shape \[4, heads, 8\]"):
        fray.rope(q, torch.randn(4, 1, 6), pos, **kw)
    with pytest.raises(TypeError, match="k: expected a tensor on cpu"):
        fray.rope(q, torch.empty(4, 1, 8, device="meta"), pos, **kw)
    with pytest.raises(TypeError, match="q: expected dtype"):
        fray.rope(q.to(torch.int32), None, pos, **kw)
    with pytest.raises(ValueError, match=r"q: expected 3 dimensions"):
        fray.rope(torch.randn(4, 16), None, pos, **kw)
    with pytest.raises(ValueError, match="q: the last dimension must be contiguous"):
        fray.rope(torch.randn(4, 8, 2).transpose(1, 2), None, pos, **kw)
    with pytest.raises(ValueError, match="q: in place needs every element addressed once"):
        fray.rope(torch.randn(1, 1, 8).expand(4, 2, 8), None, pos, inplace=True, **kw)
    with pytest.raises(TypeError, match="q: expected a torch.Tensor"):
        fray.rope([[1.0, 2.0]], None, pos, **kw)
    with pytest.raises(ValueError, match="style: expected 'neox' or 'gptj', got 'llama'"):
        fray.rope(q, k, pos, style="llama", **kw)
    with pytest.raises(ValueError, match="theta: expected a finite value > 0"):
        fray.rope(q, k, pos, theta=0.0, **kw)
    with pytest.raises(TypeError, match="inplace: expected a bool"):
        fray.rope(q, k, pos, inplace=1, **kw)
    with pytest.raises(ValueError, match="backend: expected one of"):
        fray.rope(q, k, pos, backend="cutlass", **kw)
    with pytest.raises(ValueError, match="backend: 'cuda' needs CUDA tensors"):
        fray.rope(q, k, pos, backend="cuda", **kw)
    with pytest.raises(TypeError, match="cos_sin_cache: expected dtype float32, got float64"):
        fray.rope(q, k, pos, cos_sin_cache=torch.zeros(16, 8, dtype=torch.float64), **kw)
    with pytest.raises(ValueError, match=r"cos_sin_cache: expected shape \(16, 8\)"):
        fray.rope(q, k, pos, cos_sin_cache=torch.zeros(15, 8), rotary_dim=8, **kw)
    with pytest.raises(ValueError, match="cos_sin_cache: the last dimension must be contiguous"):
        fray.rope(q, k, pos, cos_sin_cache=torch.zeros(8, 16).t(), **kw)
    with pytest.raises(ValueError, match=r"sin: expected shape \(16, 4\)"):
        fray.rope(q, k, pos, cos_sin_cache=(torch.zeros(16, 4), torch.zeros(16, 3)), **kw)
    with pytest.raises(TypeError, match="cos_sin_cache: expected a float32 tensor or a"):
        fray.rope(q, k, pos, cos_sin_cache="yarn", **kw)
    with pytest.raises(TypeError, match="positions: expected a numpy integer array"):
        fray.rope(q.numpy(), None, pos, **kw)
    with pytest.raises(TypeError, match="positions: expected an integer array"):
        fray.rope(q.numpy(), None, np.zeros(4), **kw)


def test_empty_inputs():
    qo, ko = fray.rope(torch.empty(0, 2, 8), torch.empty(0, 1, 8), torch.empty(0, dtype=torch.int64),
                       max_position=4)
    assert qo.shape == (0, 2, 8) and ko.shape == (0, 1, 8)


# ---------------------------------------------------------------------------------------------
# CPU: the CUDA extension builds, links and imports (no GPU needed)

def test_cuda_extension_imports():
    ext = B.load_extension("rope")
    assert not isinstance(ext, ImportError), ext
    assert "90a" in ext.archs().split(",")
    assert ext.cuda_runtime_version() >= 13000
    assert ext.num_kernel_instances() == 12
    assert hasattr(torch.ops.fray, "rope") and hasattr(torch.ops.fray, "rope_")
    ptrs = (0,) * 7
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        ext.rope(ptrs, (0,) * 8 + (0, 0, 0, 1, 1, 0, 8, 3, 1, 2, 0), (), -1, 0)
    with pytest.raises(ValueError, match="unsupported q dtype code 7"):
        ext.rope(ptrs, (0,) * 8 + (0, 0, 0, 1, 1, 0, 8, 8, 1, 7, 0), (), -1, 0)


# ---------------------------------------------------------------------------------------------
# GPU

BACKENDS = ["cuda", "triton"]
HEAD_DIMS = [64, 128, 256]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("tokens", [1, 7, 1000])
def test_gpu_vs_reference(cuda, backend, dtype, head_dim, partial, style, tokens):
    rd = head_dim // 2 if partial else head_dim
    g = torch.Generator(device=cuda).manual_seed(tokens * 7 + head_dim + partial)
    q = torch.randn(tokens, 4, head_dim, device=cuda, generator=g).to(dtype)
    k = torch.randn(tokens, 2, head_dim, device=cuda, generator=g).to(dtype)
    pos = torch.randint(0, 8192, (tokens,), device=cuda, generator=g)
    _, cos, sin = _tables(8192, rd, 10000.0, cuda)
    qo, ko = fray.rope(q, k, pos, max_position=8192, rotary_dim=rd, style=style, backend=backend)
    torch.cuda.synchronize()
    assert qo.shape == q.shape and qo.is_contiguous() and qo.dtype == dtype
    what = "%s %s d=%d rd=%d %s t=%d" % (backend, dtype, head_dim, rd, style, tokens)
    assert_close(qo, _expected(q, pos, cos, sin, style), dtype, what + " q")
    assert_close(ko, _expected(k, pos, cos, sin, style), dtype, what + " k")


def _fused(tokens, hq, hk, d, dtype, device, pad=0, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(tokens, pad + (hq + 2 * hk) * d, device=device, generator=g).to(dtype)
    q = qkv[:, pad:pad + hq * d].view(tokens, hq, d)
    k = qkv[:, pad + hq * d:pad + (hq + hk) * d].view(tokens, hk, d)
    return qkv, q, k


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pad", [0, 1])  # pad 1: q/k 2-byte aligned only -> the CUDA scalar path
@pytest.mark.parametrize("style", STYLES)
def test_gpu_fused_qkv_views_inplace_and_out(cuda, backend, dtype, pad, style):
    tokens, hq, hk, d = 333, 32, 8, 128
    qkv, q, k = _fused(tokens, hq, hk, d, dtype, cuda, pad, seed=pad)
    pos = torch.randint(0, 4096, (tokens,), device=cuda, dtype=torch.int32)
    _, cos, sin = _tables(4096, d, 10000.0, cuda)
    eq, ek = _expected(q, pos, cos, sin, style), _expected(k, pos, cos, sin, style)
    before = qkv.clone()
    qo, ko = fray.rope(q, k, pos, max_position=4096, style=style, backend=backend)
    assert torch.equal(qkv, before)  # out of place leaves the buffer alone
    assert_close(qo, eq, dtype, "fused out q")
    assert_close(ko, ek, dtype, "fused out k")
    a, b = fray.rope(q, k, pos, max_position=4096, style=style, backend=backend, inplace=True)
    assert a is q and b is k
    assert torch.equal(q, qo) and torch.equal(k, ko)  # in place == out of place, bit for bit
    v = pad + (hq + hk) * d
    assert torch.equal(qkv[:, v:], before[:, v:]) and torch.equal(qkv[:, :pad], before[:, :pad])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("style", STYLES)
def test_gpu_partial_inplace_offset_int32_k_none(cuda, backend, style):
    dtype, d, rd = torch.bfloat16, 128, 64
    g = torch.Generator(device=cuda).manual_seed(5)
    q = torch.randn(50, 6, d, device=cuda, generator=g).to(dtype)
    k = torch.randn(50, 2, d, device=cuda, generator=g).to(dtype)
    _, cos, sin = _tables(1000, rd, 10000.0, cuda)
    # int offset == the explicit positions tensor (int32 and int64)
    a, _ = fray.rope(q, k, 900, max_position=1000, rotary_dim=rd, style=style, backend=backend)
    p64 = torch.arange(900, 950, device=cuda)
    b, _ = fray.rope(q, k, p64, max_position=1000, rotary_dim=rd, style=style, backend=backend)
    c, _ = fray.rope(q, k, p64.int(), max_position=1000, rotary_dim=rd, style=style, backend=backend)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert_close(a, _expected(q, 900, cos, sin, style), dtype, "offset")
    assert torch.equal(a[..., rd:], q[..., rd:])  # the tail passes through
    # k = None
    qo, ko = fray.rope(q, None, p64, max_position=1000, rotary_dim=rd, style=style, backend=backend)
    assert ko is None and torch.equal(qo, a)
    # in place, partial: the tail stays, the head equals the out-of-place result
    q2, k2 = q.clone(), k.clone()
    fray.rope(q2, k2, p64, max_position=1000, rotary_dim=rd, style=style, backend=backend, inplace=True)
    assert torch.equal(q2, a)
    # non-contiguous positions (every other entry of a longer tensor)
    wide = torch.stack([p64, torch.zeros_like(p64)], dim=1).reshape(-1)[::2]
    d2, _ = fray.rope(q, k, wide, max_position=1000, rotary_dim=rd, style=style, backend=backend)
    assert torch.equal(d2, a)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_passed_cache_and_seed_alias(cuda, backend):
    g = torch.Generator(device=cuda).manual_seed(6)
    q = torch.randn(64, 8, 128, device=cuda, generator=g).to(torch.bfloat16)
    k = torch.randn(64, 2, 128, device=cuda, generator=g).to(torch.bfloat16)
    pos = torch.randint(0, 300, (64,), device=cuda, generator=g)
    angles = torch.rand(300, 64, device=cuda, generator=g, dtype=torch.float64) * 6.3  # e.g. a scaled table
    table = torch.cat([angles.cos(), angles.sin()], dim=-1).float()
    cos, sin = table[:, :64].double(), table[:, 64:].double()
    qo, ko = fray.rope(q, k, pos, max_position=300, cos_sin_cache=table, backend=backend)
    assert_close(qo, _expected(q, pos, cos, sin, "neox"), torch.bfloat16, "passed cache q")
    assert_close(ko, _expected(k, pos, cos, sin, "neox"), torch.bfloat16, "passed cache k")
    pair = (table[:, :64].contiguous(), table[:, 64:].contiguous())
    qp, kp = fray.rope(q, k, pos, max_position=300, cos_sin_cache=pair, backend=backend)
    assert torch.equal(qp, qo) and torch.equal(kp, ko)
    if backend == "cuda" and hasattr(fray.jit_kernels, "fused_rope"):  # seed contract: in place, (cos, sin)
        q2, k2 = q.clone(), k.clone()
        fray.jit_kernels.fused_rope(q2, k2, pair[0], pair[1], pos)
        assert torch.equal(q2, qo) and torch.equal(k2, ko)
    if backend == "triton" and hasattr(fray.triton, "rope"):
        qt, kt = fray.triton.rope(q, k, pos, max_position=300, cos_sin_cache=table)
        assert torch.equal(qt, qo) and torch.equal(kt, ko)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inplace", [False, True])
def test_gpu_cuda_graph_positions_change_between_replays(cuda, backend, inplace):
    tokens, hq, hk, d = 96, 8, 2, 128
    qkv, q, k = _fused(tokens, hq, hk, d, torch.bfloat16, cuda, seed=9)
    pos = torch.zeros(tokens, dtype=torch.int64, device=cuda)
    src_q, src_k = q.clone(), k.clone()
    _, cos, sin = _tables(2048, d, 10000.0, cuda)
    fray.rope(q, k, pos, max_position=2048, backend=backend)  # warm-up: table built, Triton compiled
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qo, ko = fray.rope(q, k, pos, max_position=2048, backend=backend, inplace=inplace)
    for step in range(3):
        pos.copy_(torch.randint(0, 2048, (tokens,), device=cuda))
        q.copy_(src_q.roll(step, 0))
        k.copy_(src_k.roll(step, 0))
        eq, ek = _expected(q, pos, cos, sin, "neox"), _expected(k, pos, cos, sin, "neox")
        if not inplace:
            qo.fill_(float("nan"))
            ko.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(qo, eq, torch.bfloat16, "%s graph replay %d q" % (backend, step))
        assert_close(ko, ek, torch.bfloat16, "%s graph replay %d k" % (backend, step))


@pytest.mark.gpu
def test_gpu_table_build_refused_during_capture(cuda):
    q = torch.randn(4, 2, 64, device=cuda)
    pos = torch.arange(4, device=cuda)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="cannot be built during CUDA-graph capture"):
        with torch.cuda.graph(graph):
            fray.rope(q, None, pos, max_position=777, theta=12345.0, backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend,inplace", [("auto", False), ("cuda", True), ("triton", True)])
def test_gpu_torch_compile_fullgraph(cuda, backend, inplace):
    g = torch.Generator(device=cuda).manual_seed(12)
    q = torch.randn(33, 4, 64, device=cuda, generator=g).to(torch.float16)
    k = torch.randn(33, 2, 64, device=cuda, generator=g).to(torch.float16)
    pos = torch.randint(0, 512, (33,), device=cuda, generator=g)

    def f(q, k, pos):
        # ops before and after the custom op, so that the compiler has something to fuse
        q2, k2 = q * 2.0, k + 1.0
        a, b = fray.rope(q2, k2, pos, max_position=512, style="gptj", backend=backend, inplace=inplace)
        return a, b * 3.0

    compiled = torch.compile(f, fullgraph=True)
    a, b = compiled(q, k, pos)
    ea, eb = f(q, k, pos)
    assert torch.equal(a, ea) and torch.equal(b, eb)
    _, cos, sin = _tables(512, 64, 10000.0, cuda)
    assert_close(a, _expected(q * 2.0, pos, cos, sin, "gptj"), torch.float16, "compiled")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_non_default_stream(cuda, backend):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        q = torch.randn(4096, 32, 128, device=cuda, dtype=torch.bfloat16)
        k = torch.randn(4096, 8, 128, device=cuda, dtype=torch.bfloat16)
        pos = torch.randint(0, 8192, (4096,), device=cuda)
        qo, ko = fray.rope(q, k, pos, max_position=8192, backend=backend)
    stream.synchronize()
    _, cos, sin = _tables(8192, 128, 10000.0, cuda)
    assert_close(qo, _expected(q, pos, cos, sin, "neox"), torch.bfloat16, "%s side stream q" % backend)
    assert_close(ko, _expected(k, pos, cos, sin, "neox"), torch.bfloat16, "%s side stream k" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_check_indices(cuda, backend, monkeypatch):
    q = torch.randn(8, 2, 64, device=cuda)
    bad = torch.tensor([0, 1, 2, 3, 4, 5, 6, 64], device=cuda)
    good = torch.arange(8, device=cuda)
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match=r"positions: values must lie in \[0, max_position=64\), got values in \[0, 64\]"):
        fray.rope(q, None, bad, max_position=64, backend=backend)
    with pytest.raises(ValueError, match="positions: values must lie"):
        fray.rope(q, None, -good, max_position=64, backend=backend)
    qo, _ = fray.rope(q, None, good, max_position=64, backend=backend)
    _, cos, sin = _tables(64, 64, 10000.0, cuda)
    assert_close(qo, _expected(q, good, cos, sin, "neox"), torch.float32, "checked")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1"):
        with torch.cuda.graph(graph):
            fray.rope(q, None, good, max_position=64, backend=backend)


@pytest.mark.gpu
def test_gpu_auto_empty_and_cache_per_device(cuda):
    q = torch.randn(16, 4, 128, device=cuda, dtype=torch.bfloat16)
    pos = torch.arange(16, device=cuda)
    assert B.resolve("rope", "rope", "auto", q.device) in ("cuda", "triton")
    a, _ = fray.rope(q, None, pos, max_position=16)
    b, _ = fray.rope(q, None, pos, max_position=16, backend="cuda")
    assert torch.equal(a, b) or B.resolve("rope", "rope", "auto", q.device) == "triton"
    t1 = ops.cos_sin_cache(16, 128, 10000.0, cuda)
    assert ops.cos_sin_cache(16, 128, 10000.0, q.device) is t1 and t1.device.type == "cuda"
    empty_q, empty_k = fray.rope(q[:0], None, pos[:0], max_position=16)
    assert empty_q.shape == (0, 4, 128) and empty_k is None
