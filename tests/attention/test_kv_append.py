"""fray.kv_append and fray.kv_append_paged: in-place writes of one token's K/V at position lens[b]."""
import os

import numpy as np
import pytest
import torch

import fray
from fray.ops import attention as A
from fray.reference import attention as ref
from fray.testing import assert_close

INTERPRET = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                               reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _new(dtype, dev, batch=2, hkv=2, d=64, seed=1):
    g = torch.Generator(device=dev).manual_seed(seed)
    return (torch.randn(batch, hkv, d, device=dev, generator=g).to(dtype),
            torch.randn(batch, hkv, d, device=dev, generator=g).to(dtype))


def test_reference_hand_checked():
    k = np.zeros((2, 1, 4, 2))
    v = np.zeros((2, 1, 4, 2))
    kn = np.array([[[1.0, 2.0]], [[3.0, 4.0]]])
    ref.kv_append(k, v, kn, -kn, [0, 3])
    assert k[0, 0, 0].tolist() == [1.0, 2.0] and k[1, 0, 3].tolist() == [3.0, 4.0]
    assert v[1, 0, 3].tolist() == [-3.0, -4.0] and np.count_nonzero(k) == 4
    kn_nhd = np.zeros((2, 4, 1, 2))
    ref.kv_append(kn_nhd, kn_nhd.copy(), kn, kn, [0, 3], "NHD")
    assert kn_nhd[1, 3, 0].tolist() == [3.0, 4.0]
    pages = np.zeros((5, 2, 1, 2))
    ref.kv_append_paged(pages, pages.copy(), np.array([[4, 1], [2, 0]]), kn, kn, [3, 0])
    assert pages[1, 1, 0].tolist() == [1.0, 2.0] and pages[2, 0, 0].tolist() == [3.0, 4.0]


@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
def test_append_then_decode_cpu(kv_layout):
    # Appending the token at lens[b], then attending over lens[b] + 1 positions, equals attention
    # over the cache with that position overwritten.
    q, k, v, kp, vp, bt, lens = A._random_case(torch.bfloat16, "cpu", lens=(36, 16))
    kn, vn = _new(torch.bfloat16, "cpu")
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 36], k2[1, :, 16], v2[0, :, 36], v2[1, :, 16] = kn[0], kn[1], vn[0], vn[1]
    kc, vc = (k.clone(), v.clone()) if kv_layout == "HND" else (k.transpose(1, 2).clone(), v.transpose(1, 2).clone())
    assert fray.kv_append(kc, vc, kn, vn, lens, kv_layout=kv_layout) == (kc, vc)
    assert lens.tolist() == [36, 16]
    if kv_layout == "NHD":
        kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
    assert torch.equal(kc, k2) and torch.equal(vc, v2)
    fray.kv_append_paged(kp, vp, bt, kn, vn, lens)
    y = fray.paged_decode_attention(q, kp, vp, bt, lens + 1)
    assert torch.equal(y, fray.decode_attention(q, k2, v2, lens + 1))


def _triton_append(kc, vc, kn, vn, lens, bt=None, kv_layout="HND"):
    from fray_triton import attention as tattn
    if bt is not None:
        ks, vs = (kc.stride(0), kc.stride(2), kc.stride(1)), (vc.stride(0), vc.stride(2), vc.stride(1))
        cap, page = bt.shape[1] * kc.shape[1], kc.shape[1]
    elif kv_layout == "NHD":
        ks, vs, cap, page = (kc.stride(0), kc.stride(2), kc.stride(1)), (vc.stride(0), vc.stride(2), vc.stride(1)), \
            kc.shape[1], 1
    else:
        ks, vs, cap, page = kc.stride()[:3], vc.stride()[:3], kc.shape[2], 1
    tattn.append(kc, vc, kn, vn, lens, bt, k_strides=ks, v_strides=vs, bt_stride=0 if bt is None else bt.stride(0),
                 capacity=cap, page_size=page)


@INTERPRET
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_layout", ["HND", "NHD", "paged"])
def test_triton_interpreter_vs_reference(dtype, kv_layout):
    _, k, v, kp, vp, bt, _ = A._random_case(dtype, "cpu")
    kn, vn = _new(dtype, "cpu")
    # positions: the first slot, a block boundary, the last slot; and out of range (not written)
    cap = bt.shape[1] * 16 if kv_layout == "paged" else 37   # paged: 3 pages of 16 slots
    for lens in ((0, 36), (16, 15), (37, -1), (cap - 1, cap)):
        lens_t = torch.tensor(lens, dtype=torch.int32)
        if kv_layout == "paged":
            ek, ev, ck, cv = kp.clone(), vp.clone(), kp.clone(), vp.clone()
            valid = [b for b, p in enumerate(lens) if 0 <= p < cap]
            for b in valid:
                ref.kv_append_paged(ek, ev, bt[b:b + 1], kn[b:b + 1], vn[b:b + 1], [lens[b]])
            _triton_append(ck, cv, kn, vn, lens_t, bt)
        else:
            base_k, base_v = (k, v) if kv_layout == "HND" else (k.transpose(1, 2).contiguous(),
                                                               v.transpose(1, 2).contiguous())
            ek, ev, ck, cv = base_k.clone(), base_v.clone(), base_k.clone(), base_v.clone()
            for b, p in enumerate(lens):
                if 0 <= p < cap:
                    ref.kv_append(ek[b:b + 1], ev[b:b + 1], kn[b:b + 1], vn[b:b + 1], [p], kv_layout)
            _triton_append(ck, cv, kn, vn, lens_t, kv_layout=kv_layout)
        assert torch.equal(ck, ek) and torch.equal(cv, ev), "%s lens=%s" % (kv_layout, lens)


@INTERPRET
def test_triton_interpreter_strided_new_and_odd_head_dim():
    k = torch.zeros(2, 3, 10, 40)
    v = torch.zeros(2, 3, 10, 40)
    big = torch.randn(2, 3, 100)
    kn, vn = big[..., :40], big[..., 50:90]   # row strides 300 / 100, D = 40 (append takes any D)
    lens = torch.tensor([9, 4], dtype=torch.int32)
    _triton_append(k, v, kn, vn, lens)
    ek, ev = torch.zeros_like(k), torch.zeros_like(v)
    ek[0, :, 9], ek[1, :, 4], ev[0, :, 9], ev[1, :, 4] = kn[0], kn[1], vn[0], vn[1]
    assert torch.equal(k, ek) and torch.equal(v, ev)


def test_errors_and_index_checks(monkeypatch):
    _, k, v, kp, vp, bt, lens = A._random_case(torch.float32, "cpu")
    kn, vn = _new(torch.float32, "cpu")
    with pytest.raises(TypeError, match="k_new: expected dtype float32"):
        fray.kv_append(k, v, kn.half(), vn, lens)
    with pytest.raises(ValueError, match=r"k_new: expected shape \(2, 2, 64\)"):
        fray.kv_append(k, v, kn[:, :1], vn, lens)
    with pytest.raises(ValueError, match=r"v_new: expected shape"):
        fray.kv_append(k, v, kn, vn[:, :, :32], lens)
    with pytest.raises(ValueError, match="k_new: expected shape \\[B, Hkv, D\\]"):
        fray.kv_append(k, v, kn[:, :, None], vn, lens)
    with pytest.raises(ValueError, match="kv_layout: expected"):
        fray.kv_append(k, v, kn, vn, lens, kv_layout="BHTD")
    with pytest.raises(TypeError, match="lens: expected dtype int32"):
        fray.kv_append(k, v, kn, vn, lens.long())
    with pytest.raises(TypeError, match="block_table: expected dtype int32"):
        fray.kv_append_paged(kp, vp, bt.long(), kn, vn, lens)
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.kv_append(k, v, kn, vn, lens, backend="triton")
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match=r"lens: kv_append writes position lens\[b\], so values must lie in "
                                         r"\[0, T=37\); got values in \[16, 37\]"):
        fray.kv_append(k, v, kn, vn, torch.tensor([37, 16], dtype=torch.int32))
    bad = bt.clone()
    bad[1, 1] = 99
    with pytest.raises(ValueError, match=r"block_table: entry \[1, 1\] = 99"):
        fray.kv_append_paged(kp, vp, bad, kn, vn, torch.tensor([0, 16], dtype=torch.int32))
    fray.kv_append_paged(kp, vp, bad, kn, vn, torch.tensor([0, 15], dtype=torch.int32))  # block 1 unused


# ---------------------------------------------------------------------------------------------
# GPU

BACKENDS = ["cuda", "triton"]


def _append_both(kv_layout, kc, vc, kn, vn, lens, bt, backend):
    """The reference (on copies, skipping out-of-range positions as the kernels do) and the kernel."""
    ek, ev = kc.clone(), vc.clone()
    cap = bt.shape[1] * kc.shape[1] if kv_layout == "paged" else (kc.shape[2] if kv_layout == "HND" else kc.shape[1])
    for b, p in enumerate(lens.tolist()):
        if 0 <= p < cap:
            if kv_layout == "paged":
                ref.kv_append_paged(ek, ev, bt[b:b + 1], kn[b:b + 1], vn[b:b + 1], [p])
            else:
                ref.kv_append(ek[b:b + 1], ev[b:b + 1], kn[b:b + 1], vn[b:b + 1], [p], kv_layout)
    if kv_layout == "paged":
        fray.kv_append_paged(kc, vc, bt, kn, vn, lens, backend=backend)
    else:
        fray.kv_append(kc, vc, kn, vn, lens, kv_layout=kv_layout, backend=backend)
    torch.cuda.synchronize()
    return ek, ev


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kv_layout", ["HND", "NHD", "paged"])
@pytest.mark.parametrize("d", [64, 256])
def test_gpu_vs_reference(cuda, backend, dtype, kv_layout, d):
    _, k, v, kp, vp, bt, _ = A._random_case(dtype, cuda, batch=4, hq=8, hkv=8, capacity=200, d=d, page=32)
    kn, vn = _new(dtype, cuda, batch=4, hkv=8, d=d)
    if kv_layout == "paged":
        kc, vc = kp.clone(), vp.clone()
    else:
        kc, vc = (k.clone(), v.clone()) if kv_layout == "HND" else (k.transpose(1, 2).contiguous(),
                                                                     v.transpose(1, 2).contiguous())
    cap = bt.shape[1] * 32 if kv_layout == "paged" else 200
    # the first slot, a block boundary, the last slot; then out of range (not written)
    for lens in ([0, 31, 32, 199], [cap - 1, cap, -1, 2 ** 30]):
        lens_t = torch.tensor(lens, dtype=torch.int32, device=cuda)
        ek, ev = _append_both(kv_layout, kc, vc, kn, vn, lens_t, bt, backend)
        assert torch.equal(kc, ek) and torch.equal(vc, ev), "%s %s lens=%s" % (backend, kv_layout, lens)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d,offset", [(40, 0), (64, 1), (128, 2), (96, 4)])
def test_gpu_strided_new_odd_head_dim_and_alignment(cuda, backend, d, offset):
    """k_new / v_new slices of wider rows, head dims that are not 16-byte multiples and caches that
    start off a 16-byte boundary (the CUDA kernel picks narrower words for those)."""
    g = torch.Generator(device=cuda).manual_seed(d + offset)
    flat = torch.zeros(3 * 4 * 10 * d + offset, device=cuda, dtype=torch.float16)
    kc = flat[offset:].view(3, 4, 10, d)
    vc = torch.zeros(3, 10, 4, d, device=cuda, dtype=torch.float16)
    big = torch.randn(3, 4, 2 * d + 10, device=cuda, generator=g).to(torch.float16)
    kn, vn = big[..., :d], big[..., d + 10:]
    lens = torch.tensor([9, 0, 4], dtype=torch.int32, device=cuda)
    ek, ev = kc.clone(), vc.clone()
    for b, p in enumerate(lens.tolist()):
        ek[b, :, p], ev[b, p] = kn[b], vn[b]
    fray.kv_append(kc, kc.clone(), kn, vn, lens, backend=backend)  # HND
    fray.kv_append(vc.clone(), vc, kn, vn, lens, kv_layout="NHD", backend=backend)
    torch.cuda.synchronize()
    assert torch.equal(kc, ek) and torch.equal(vc, ev)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_decode_step_graph(cuda, backend):
    """One decode step as an engine captures it: append the new token, advance lens, attend;
    replayed with new data, with lens living on the device throughout."""
    q, k, v, kp, vp, bt, _ = A._random_case(torch.bfloat16, cuda, batch=3, hq=8, hkv=2, capacity=256,
                                            d=128, page=16)
    lens = torch.tensor([0, 100, 200], dtype=torch.int32, device=cuda)
    kn, vn = _new(torch.bfloat16, cuda, batch=3, hkv=2, d=128)
    out, out_p = torch.empty_like(q), torch.empty_like(q)

    def step():
        fray.kv_append(k, v, kn, vn, lens, backend=backend)
        fray.kv_append_paged(kp, vp, bt, kn, vn, lens, backend=backend)
        lens.add_(1)
        fray.decode_attention(q, k, v, lens, out=out, backend=backend)
        fray.paged_decode_attention(q, kp, vp, bt, lens, out=out_p, backend=backend)

    step()  # warm-up: Triton compiles here
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    lens.copy_(torch.tensor([5, 50, 250], dtype=torch.int32))
    for _ in range(3):
        before = lens.clone()
        kn.copy_(torch.randn_like(kn))
        vn.copy_(torch.randn_like(vn))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(lens, before + 1)
        for b in range(3):
            assert torch.equal(k[b, :, int(before[b])], kn[b]) and torch.equal(v[b, :, int(before[b])], vn[b])
        e = ref.decode_attention(q.double(), k.double(), v.double(), lens.tolist())
        assert_close(out, e[0], torch.bfloat16, "%s graph step" % backend, scale=e[2])
        assert_close(out_p, e[0], torch.bfloat16, "%s graph step paged" % backend, scale=e[2])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_torch_compile_and_check_indices(cuda, monkeypatch, backend):
    _, k, v, kp, vp, bt, _ = A._random_case(torch.float16, cuda)
    kn, vn = _new(torch.float16, cuda)
    lens = torch.tensor([3, 36], dtype=torch.int32, device=cuda)

    def f(k, v, kp, vp, kn, vn, lens):
        fray.kv_append(k, v, kn * 2.0, vn, lens, backend=backend)
        fray.kv_append_paged(kp, vp, bt, kn * 3.0, vn, lens, backend=backend)
        return k.sum()

    torch.compile(f, fullgraph=True)(k, v, kp, vp, kn, vn, lens)
    assert torch.equal(k[0, :, 3], kn[0] * 2.0) and torch.equal(k[1, :, 36], kn[1] * 2.0)
    assert torch.equal(kp[bt[1, 2], 4], kn[1] * 3.0)
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match="lens: kv_append writes position"):
        fray.kv_append(k, v, kn, vn, lens + 1, backend=backend)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1"):
        with torch.cuda.graph(graph):
            fray.kv_append(k, v, kn, vn, lens, backend=backend)
