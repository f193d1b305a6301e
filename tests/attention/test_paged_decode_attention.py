"""fray.paged_decode_attention: NHD pages [num_blocks, block_size, Hkv, D] through an int32 block
table; reference, Triton (interpreter on CPU, GPU), error contract, block-table checks."""
import math
import os

import pytest
import torch

import fray
from fray.ops import attention as A
from fray.reference import attention as ref
from fray.testing import assert_close

INTERPRET = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                               reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _expected(q, k, v, lens, scale=None):
    """From the contiguous HND caches the pages were filled from."""
    return ref.decode_attention(q.double(), k.double(), v.double(), lens.tolist(), scale, "HND")


def _check(out, lse, expected, dtype, what):
    e, el, mag = expected
    assert_close(out, e, dtype, what, scale=mag)
    el, lse = torch.as_tensor(el).cpu(), lse.cpu()
    empty = torch.isinf(el)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "%s: lse -inf rows differ" % what
    assert_close(lse[~empty], el[~empty], torch.float32, what + " lse")


def test_reference_paged_equals_contiguous():
    for page in (1, 16, 32):
        q, k, v, kp, vp, bt, lens = A._random_case(torch.float32, "cpu", page=page, lens=(37, 17))
        e = _expected(q, k, v, lens)
        p = ref.paged_decode_attention(q.double(), kp.double(), vp.double(), bt, lens.tolist())
        for a, b in zip(e, p):
            torch.testing.assert_close(a, b, rtol=1e-15, atol=1e-15)


def test_public_api_cpu():
    q, k, v, kp, vp, bt, lens = A._random_case(torch.bfloat16, "cpu", lens=(33, 0))
    y, lse = fray.paged_decode_attention(q, kp, vp, bt, lens, return_lse=True)
    assert y.dtype == torch.bfloat16 and y.shape == q.shape
    _check(y, lse, _expected(q, k, v, lens), torch.bfloat16, "cpu paged")
    assert torch.equal(y, fray.decode_attention(q, k, v, lens))


def _triton(q, kp, vp, bt, lens, num_splits=3, block_n=16):
    from fray_triton import attention as tattn
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"))
    ks = (kp.stride(0), kp.stride(2), kp.stride(1))
    tattn.decode(q, kp, vp, lens, bt, out, lse, 1.0 / math.sqrt(q.shape[-1]), q_strides=q.stride()[:2],
                 k_strides=ks, v_strides=ks, bt_stride=bt.stride(0), out_strides=out.stride()[:2],
                 lse_stride=lse.stride(0), n_kv_heads=kp.shape[2], capacity=bt.shape[1] * kp.shape[1],
                 page_size=kp.shape[1], num_splits=num_splits, num_sms=132, block_n=block_n)
    return out, lse


@INTERPRET
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page", [1, 16, 32])
def test_triton_interpreter_vs_reference(dtype, page):
    # B=2, Hq=4, Hkv=2, T=37, D=64; lens 1, a block boundary (16 / 32) and T; shuffled pages.
    for lens in ((1, 37), (16, 32)):
        q, k, v, kp, vp, bt, lens_t = A._random_case(dtype, "cpu", page=page, lens=lens, seed=page)
        out, lse = _triton(q, kp, vp, bt, lens_t)
        _check(out, lse, _expected(q, k, v, lens_t), dtype, "paged %d lens=%s" % (page, lens))


@INTERPRET
def test_triton_interpreter_ignores_unused_block_table_entries():
    q, k, v, kp, vp, bt, lens = A._random_case(torch.float32, "cpu", lens=(5, 20))
    bt = bt.clone()
    bt[0, 1:] = 10 ** 6   # past lens[0]: never read
    bt[1, 2] = -7
    out, lse = _triton(q, kp, vp, bt, lens, num_splits=1)
    _check(out, lse, _expected(q, k, v, lens), torch.float32, "garbage past lens")


def test_errors_and_block_table_checks(monkeypatch):
    q, k, v, kp, vp, bt, lens = A._random_case(torch.float32, "cpu")
    with pytest.raises(ValueError, match="k_pages: block size .* must be one of"):
        fray.paged_decode_attention(q, kp[:, :8], vp[:, :8], bt, lens)
    with pytest.raises(TypeError, match="block_table: expected dtype int32, got int64"):
        fray.paged_decode_attention(q, kp, vp, bt.long(), lens)
    with pytest.raises(ValueError, match=r"block_table: expected shape \[B=2, max_blocks\]"):
        fray.paged_decode_attention(q, kp, vp, bt[:1], lens)
    with pytest.raises(TypeError, match="v_pages: expected dtype float32"):
        fray.paged_decode_attention(q, kp, vp.half(), bt, lens)
    with pytest.raises(ValueError, match="window_left: sliding-window"):
        fray.paged_decode_attention(q, kp, vp, bt, lens, window_left=4)
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    # capacity is max_blocks * block_size = 3 * 16 = 48
    with pytest.raises(ValueError, match=r"lens: values must lie in \[0, T=48\]"):
        fray.paged_decode_attention(q, kp, vp, bt, torch.tensor([49, 0], dtype=torch.int32))
    bad = bt.clone()
    bad[0, 1] = kp.shape[0]
    with pytest.raises(ValueError, match=r"block_table: entry \[0, 1\] = %d lies outside" % kp.shape[0]):
        fray.paged_decode_attention(q, kp, vp, bad, lens)
    bad = bt.clone()
    bad[1, 2] = -1  # lens[1] = 16 uses one block only: entry 2 is never read, and not checked
    fray.paged_decode_attention(q, kp, vp, bad, lens)


# ---------------------------------------------------------------------------------------------
# GPU

BACKENDS = ["cuda", "triton"]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page", [1, 16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_paged_equals_contiguous(cuda, backend, page, dtype):
    q, k, v, kp, vp, bt, _ = A._random_case(dtype, cuda, batch=5, hq=16, hkv=4, capacity=1000, d=128,
                                            page=page, seed=page)
    lens = torch.tensor([0, 1, page, 1000, 777], dtype=torch.int32, device=cuda)
    e = _expected(q, k, v, lens)
    for splits in (None, 1, 5):
        out = torch.full_like(q, float("nan"))
        y, lse = fray.paged_decode_attention(q, kp, vp, bt, lens, out=out, return_lse=True, num_splits=splits,
                                             backend=backend)
        assert y is out
        _check(y, lse, e, dtype, "%s paged %d splits=%s" % (backend, page, splits))
        c, clse = fray.decode_attention(q, k, v, lens, return_lse=True, num_splits=splits, backend=backend)
        assert_close(y.double(), c.double(), dtype, "%s paged vs contiguous" % backend, scale=e[2])
        assert torch.equal(torch.isinf(lse), torch.isinf(clse))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("hq,hkv", [(8, 1), (6, 2)])
def test_gpu_fp32_head_dims(cuda, backend, d, hq, hkv):
    q, k, v, kp, vp, bt, lens = A._random_case(torch.float32, cuda, batch=2, hq=hq, hkv=hkv, capacity=300, d=d,
                                               page=16, lens=(300, 45))
    y, lse = fray.paged_decode_attention(q, kp, vp, bt, lens, return_lse=True, backend=backend)
    _check(y, lse, _expected(q, k, v, lens), torch.float32, "%s fp32 D=%d" % (backend, d))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_ignores_unused_block_table_entries(cuda, backend):
    q, k, v, kp, vp, bt, lens = A._random_case(torch.bfloat16, cuda, batch=2, hq=8, hkv=2, capacity=300, d=128,
                                               page=16, lens=(5, 200))
    bt = bt.clone()
    bt[0, 1:] = 10 ** 6   # past lens[0]: never read
    bt[1, 13:] = -7
    for splits in (None, 1):
        y, lse = fray.paged_decode_attention(q, kp, vp, bt, lens, return_lse=True, num_splits=splits,
                                             backend=backend)
        _check(y, lse, _expected(q, k, v, lens), torch.bfloat16, "%s garbage past lens" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_b1_ignores_what_lies_past_lens(cuda, page, dtype):
    # B = 1, T = 4096 (short splits whose grid fits one CTA per SM): past lens[0], block-table
    # entries are garbage (negative, past the pool) or point at pages of NaN bits, and the rows past
    # lens in the last valid page are NaN too. None of it may reach the output.
    for n in (1, 17, 64, 1000, 4095, 4096):
        q, k, v, kp, vp, bt, lens = A._random_case(dtype, cuda, batch=1, hq=32, hkv=8, capacity=4096, d=128,
                                                   page=page, lens=(n,), seed=n)
        bt = bt.clone()
        used = -(-n // page)  # blocks holding rows < n
        past = bt[0, used:].clone()
        kp[past.long()] = float("nan")
        vp[past.long()] = float("nan")
        if n % page:
            kp[bt[0, used - 1].long(), n % page:] = float("nan")
            vp[bt[0, used - 1].long(), n % page:] = float("nan")
        if past.numel() >= 3:
            bt[0, used::3] = -1
            bt[0, used + 1::3] = 10 ** 6
        for splits in (None, 16):
            y, lse = fray.paged_decode_attention(q, kp, vp, bt, lens, return_lse=True, num_splits=splits,
                                                 backend="cuda")
            _check(y, lse, _expected(q, k, v, lens), dtype, "B1 paged P%d len %d splits=%s" % (page, n, splits))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_graph_capture_and_compile(cuda, backend):
    q, k, v, kp, vp, bt, lens = A._random_case(torch.bfloat16, cuda, batch=3, hq=8, hkv=2, capacity=400,
                                               d=128, page=16, lens=(400, 3, 0))
    out = torch.empty_like(q)
    fray.paged_decode_attention(q, kp, vp, bt, lens, out=out, backend=backend)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fray.paged_decode_attention(q, kp, vp, bt, lens, out=out, backend=backend)
    for new in ([17, 400, 16], [0, 1, 399]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        e = _expected(q, k, v, lens)
        assert_close(out, e[0], torch.bfloat16, "%s paged graph replay %s" % (backend, new), scale=e[2])
    compiled = torch.compile(lambda *a: fray.paged_decode_attention(*a, backend=backend) * 1.0, fullgraph=True)
    assert torch.equal(compiled(q, kp, vp, bt, lens), fray.paged_decode_attention(q, kp, vp, bt, lens,
                                                                                  backend=backend))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_check_indices(cuda, monkeypatch, backend):
    q, k, v, kp, vp, bt, lens = A._random_case(torch.float16, cuda)
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    bad = bt.clone()
    bad[0, 0] = -5
    with pytest.raises(ValueError, match=r"block_table: entry \[0, 0\] = -5"):
        fray.paged_decode_attention(q, kp, vp, bad, lens, backend=backend)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1"):
        with torch.cuda.graph(graph):
            fray.paged_decode_attention(q, kp, vp, bt, lens, backend=backend)
