"""fray.topk: reference rules by hand, Triton (interpreter on CPU) vs reference, the CUDA extension's
argument checks and the planner (CPU), errors; on a GPU every backend x dtype x awkward shape."""
import os

import numpy as np
import pytest
import torch

import fray
from fray import backend as B
from fray.ops import sampling as S
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
# CPU: the CUDA extension's adapter (argument checks run before any CUDA call) and the planner

def _ext():
    ext = B.load_extension("topk")
    if isinstance(ext, ImportError):
        pytest.skip("fray._C._topk is not built here (%s)" % ext)
    return ext


def test_extension_metadata():
    ext = _ext()
    assert ext.max_width() == S.TOPK_MAX_WIDTH == 262144
    assert ext.max_sort_k() == S.CUDA_SORT_MAX_K == 4096
    assert ext.num_kernel_instances() == 48  # 3 dtypes x (8 topk + 4 streaming topk + 4 argmax)
    assert ext.archs()


@pytest.mark.parametrize("kwargs,match", [
    (dict(k=0), "k must be"), (dict(k=9), "k must be"), (dict(width=262145, k=1), "width must be"),
    (dict(width=0, k=1), "width must be"), (dict(rows=-1), "rows must be"), (dict(dtype=3), "dtype code"),
    (dict(width=8192, k=4097), "sorted output needs k"), (dict(rank_keys=64), "index order only"),
])
def test_extension_rejects_bad_arguments(kwargs, match):
    args = dict(x=0, x_row_stride=8, dtype=0, rows=2, width=8, k=2, largest=True, sorted=True, values=0,
                indices=0, rank_keys=0)
    args.update(kwargs)
    a = args
    with pytest.raises(ValueError, match=match):  # slots: cuda/topk/topk.h
        _ext().topk((a["x"], a["values"], a["indices"], a["rank_keys"]),
                    (a["x_row_stride"], a["dtype"], a["rows"], a["width"], a["k"], a["largest"], a["sorted"]), (),
                    -1, 0)
    with pytest.raises(ValueError, match="width must be"):
        _ext().argmax((0, 0), (0, 0, 1, 0), (), -1, 0)
    with pytest.raises(ValueError, match="topk expects 4 ptrs, 7 ints, 0 floats; got 4, 6, 0"):
        _ext().topk((0, 0, 0, 0), (8, 0, 2, 8, 2, 1), (), -1, 0)


PLAN_WIDTHS = [1, 2, 7, 8, 9, 255, 256, 999, 2047, 2048, 2049, 4095, 4096, 4097, 5000, 8191, 8192, 16383, 16385,
               32768, 32769, 65536, 65537, 131071, 131072, 140000, 152064, 200003, 262143, 262144]


def _blocks_per_sm(ext, threads, smem):
    """CTAs per SM as the plan estimates them (threads, registers at the launch-bounds cap, shared memory)."""
    _, _, _, smem_per_sm, reserved, regs, _ = ext.stream_limits()
    static_bound = ext.launch_limits()[4]
    return min(32, 2048 // threads, 65536 // (threads * regs), smem_per_sm // (smem + static_bound + reserved))


def _check_plan(ext, rows, width, k, sorted, dtype, num_sms):
    max_cluster, portable, default_smem, max_smem, static_bound, max_blocks = ext.launch_limits()
    s_threads, s_blocks, s_cap, smem_per_sm, reserved, regs, s_static = ext.stream_limits()
    cluster, slice_, threads, bits, sort_size, smem, optin, stream = ext.topk_plan(rows, width, k, sorted, dtype,
                                                                                   num_sms)
    key_bytes = 4 if dtype == 0 else 2
    what = "rows %d width %d k %d sorted %s dtype %d sms %d -> %r" % (
        rows, width, k, sorted, dtype, num_sms, (cluster, slice_, threads, bits, sort_size, smem, optin, stream))
    assert cluster in (1, 2, 4, 8, 16) and cluster <= max_cluster, what
    assert slice_ % 8 == 0 and cluster * slice_ >= width, what
    assert sort_size == ((1 << (k - 1).bit_length()) if sorted else 0) and sort_size <= S.CUDA_SORT_MAX_K, what
    if stream:
        # The streaming kernel: only for rows that do not fit one CTA's 64 KB of keys, k <= its
        # entry buffer, and only when the row-in-shared-memory plan would need more than one wave
        # (or, for 16-bit rows, spreads a row over >= 4 CTAs while streaming fills 2 x SMs).
        assert width * key_bytes > 64 * 1024 and k <= s_cap, what
        assert threads == s_threads and bits == 11, what
        assert smem == 8 * s_cap + 4 * (2048 + (2048 // cluster if cluster > 1 else 0)), what
        # s_blocks CTAs per SM (its launch bounds) fit, and rows x C is one wave (or C is 1).
        assert s_static <= static_bound and s_blocks * (smem + s_static + reserved) <= smem_per_sm, what
        assert 65536 // (s_threads * s_blocks) // 8 * 8 == regs and s_blocks * s_threads <= 2048, what
        assert cluster == 1 or rows * cluster <= num_sms * s_blocks, what
        assert cluster == 1 or -(-width // cluster) >= 2048, what
    else:
        assert slice_ * key_bytes <= 64 * 1024, what
        assert threads in (32, 64, 128, 256, 512), what
        assert bits in (8, 11), what
        nb, done = [], 0  # every pass's bins split evenly over the cluster (merged 1/C shares)
        while done < 8 * key_bytes:
            nb.append(1 << min(bits, 8 * key_bytes - done))
            done += bits
        assert all(n % cluster == 0 for n in nb), what
        hist = 4 * ((1 << bits) + ((1 << bits) // cluster if cluster > 1 else 0))
        assert smem >= slice_ * key_bytes + max(hist, 8 * sort_size), what
        assert (slice_ * key_bytes) % 16 == 0, what  # the histograms / sort buffer after the keys stay aligned
        # The row-in-shared-memory kernel keeps the rows it can run in one wave (and short rows, and k
        # beyond the streaming kernel's buffer).
        one_wave = rows * cluster <= num_sms * _blocks_per_sm(ext, threads, smem)
        assert one_wave or width * key_bytes <= 64 * 1024 or k > s_cap, what
    # Launchable: static + dynamic shared memory within the opt-in limit, and the opt-in is set
    # whenever they may pass the 48 KB default (48 KB of dynamic memory alone already does).
    assert smem + static_bound <= max_smem, what
    assert optin == (smem + static_bound > default_smem), what
    # grid.x = rows per launch x cluster: a multiple of the cluster size, below 2^31.
    assert max_blocks % cluster == 0 and max_blocks < 2 ** 31 - 1, what
    assert min(rows, max_blocks // cluster) * cluster <= max_blocks, what
    return cluster, smem, optin


def test_topk_plans_are_launchable():
    ext = _ext()
    n = 0
    for dtype in (0, 1, 2):
        for width in PLAN_WIDTHS:
            for k in sorted({1, 8, 50, 1024, 1500, 4096, width}):
                if k > width:
                    continue
                for rows in (1, 2, 6, 64, 4096):
                    for num_sms in (132, 114, 1):
                        for srt in ((True, False) if k <= S.CUDA_SORT_MAX_K else (False,)):
                            _check_plan(ext, rows, width, k, srt, dtype, num_sms)
                            n += 1
    assert n > 10000


def test_topk_plan_picks_the_streaming_kernel():
    ext = _ext()
    plan = lambda rows, width, k=50, dtype=0, srt=True, sms=132: ext.topk_plan(rows, width, k, srt, dtype, sms)
    # 64 x 131072 fp32: 32 MB of keys, two waves of the row-in-shared-memory kernel -> streaming,
    # 8 CTAs per row (512 CTAs <= 132 SMs x 5).
    assert plan(64, 131072)[7] and plan(64, 131072)[0] == 8
    assert plan(64, 131072, 1)[7] and plan(64, 131072, 1024)[7] and plan(64, 131072, 4096)[7]
    assert plan(64, 131072, 50, srt=False)[7] and plan(64, 262144)[7] and plan(48, 150000)[7]
    assert plan(128, 131072, dtype=1)[7] and plan(64, 262144, dtype=2)[7]
    # One wave already, short rows, or k above the streaming buffer: the row-in-shared-memory kernel.
    assert not plan(1, 131072)[7] and not plan(4096, 256, 8)[7] and not plan(3, 131072)[7]
    # 16-bit rows the row-in-shared-memory plan spreads over >= 4 CTAs stream when the streaming
    # plan fills the GPU twice over: 64 x 131072 bf16 (C 8, 512 CTAs), not 3 x 131072 (48 CTAs).
    assert plan(64, 131072, dtype=2)[7] and plan(64, 131072, dtype=2)[0] == 8
    assert not plan(3, 131072, dtype=2)[7] and not plan(8, 131072, dtype=1)[7]
    assert not plan(64, 131072, 5000, srt=False)[7] and not plan(8192, 2048, 8)[7]
    for args in ((64, 131072), (64, 131072, 4096), (1, 131072), (4096, 256, 8), (300, 131072), (64, 262144)):
        _check_plan(ext, *(args + (50,))[:3], True, 0, 132)


def test_topk_plan_fits_stream_clusters_in_one_wave():
    # Whole clusters must fit in a GPC, so the device holds fewer than SMs x 5 / C of them (the
    # H200 held 62 clusters of 8 when the kernel ran 4 CTAs per SM: these counts). With the counts
    # the plan takes the largest C whose clusters for all rows are resident at once.
    ext = _ext()
    h200 = [528, 264, 124, 62, 28]  # cluster sizes 1, 2, 4, 8, 16
    plan = lambda rows, width, fit, k=50: ext.topk_plan(rows, width, k, True, 0, 132, fit)
    assert plan(64, 131072, [])[0] == 8            # no counts: SMs x 5 / C (82 clusters of 8)
    assert plan(64, 131072, h200)[0] == 4          # 64 clusters of 8 > 62: C 4
    assert plan(62, 131072, h200)[0] == 8          # 62 fit
    assert plan(64, 262144, h200)[0] == 4 and plan(64, 131072, h200, 4096)[0] == 4
    assert plan(128, 131072, h200)[0] == 2 and plan(300, 131072, h200)[0] == 1
    assert plan(64, 131072, [0, 0, 0, 0, 0])[0] == 8  # failed queries: the estimate
    for rows, width in ((64, 131072), (62, 131072), (64, 262144), (128, 131072)):
        c = plan(rows, width, h200)
        assert c[7] and rows <= h200[c[0].bit_length() - 1]
        _check_plan(ext, rows, width, 50, True, 0, 132)
    with pytest.raises(ValueError, match="max_clusters must list 5 counts"):
        plan(64, 131072, [1, 2])


def test_topk_plan_regressions():
    # The H200 failures: exactly 48 KB of dynamic shared memory with 16-CTA clusters, launched
    # without the opt-in while the kernel's static shared memory pushed the total past 48 KB.
    ext = _ext()
    for rows, width, k, dtype in ((2, 131072, 4096, 1), (2, 131072, 4096, 2), (6, 131072, 1500, 0)):
        cluster, smem, optin = _check_plan(ext, rows, width, k, True, dtype, 132)
        assert (cluster, smem, optin) == (16, 48 * 1024, True)


def test_static_algorithm_checks():
    S._check_topk_algorithm(300000, 5, "auto", "cuda")  # auto takes torch beyond 262144
    S._check_topk_algorithm(300000, 5, "torch", "triton")
    with pytest.raises(ValueError, match="x:"):
        S._check_topk_algorithm(262145, 5, "partial", "auto")
    with pytest.raises(ValueError, match="algorithm:"):
        S._check_topk_algorithm(1000, 5, "partial", "triton")
    with pytest.raises(ValueError, match="algorithm:"):
        S._check_topk_algorithm(1000, 5, "sort", "cuda")
    with pytest.raises(ValueError, match="x:"):
        S._check_topk_algorithm(5000, 5, "sort", "auto")
    with pytest.raises(ValueError, match="k:"):
        S._check_topk_algorithm(5000, 65, "reduce", "triton")


def test_workspace_size_formulas_cpu():
    x = torch.zeros(3, 10000, dtype=torch.bfloat16)  # planned as on a GPU with the CUDA backend
    assert fray.topk_workspace_size(x, 100) == 0
    assert fray.topk_workspace_size(x, 5000) == 3 * 5000 * 16
    assert fray.topk_workspace_size(x, 5000, sorted=False) == 0
    assert fray.topk_workspace_size(x, 5000, algorithm="torch") == 3 * 10000 * (8 + 2)
    assert fray.topk_workspace_size(x, 50, algorithm="reduce") == 0
    assert fray.topk_workspace_size(x, 5000, backend="triton") == 3 * 10000 * 10  # Triton auto: torch
    assert fray.topk_workspace_size(torch.zeros(2, 300000), 3) == 2 * 300000 * 12


# ---------------------------------------------------------------------------------------------
# GPU (H200): every backend x dtype x awkward shapes, exact agreement with the reference

BACKENDS = ["cuda", "triton"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
# (rows, width, k): widths 1, 7, 256, 4097, 131072, 262144 and odd ones; k in {1, 8, 50, 1024,
# 4096, width}; several row counts so the CUDA kernel runs as one CTA per row, as a cluster of
# 2..16 CTAs per row, with 11- and 8-bit digits, and k > 4096 (the integer rank-key sort).
SHAPES = [
    (1, 1, 1), (5, 7, 1), (3, 7, 7), (64, 256, 8), (4096, 256, 8), (7, 256, 256), (3, 1000, 50),
    (3, 4097, 1), (3, 4097, 50), (3, 4097, 1024), (2, 4097, 4096), (2, 4097, 4097), (2, 33333, 1024),
    (3, 131071, 50), (3, 131072, 1), (3, 131072, 8), (2, 131072, 4096), (64, 131072, 50),
    (1, 131072, 131072), (2, 262144, 50), (2, 262144, 4096), (1, 262144, 262144), (40, 262144, 1),
]


def _logits(rows, width, dtype, dev, seed):
    """Rounded normals (many ties, -0.0 next to +0.0) with NaN, +-inf and signed zeros sprinkled
    in; NaN rows, inf rows and constant rows among them."""
    g = torch.Generator(device=dev).manual_seed(seed)
    x = (torch.randn(rows, width, generator=g, device=dev) * 4).round()
    n = max(1, width // 64)
    for value in (float("nan"), float("inf"), float("-inf"), -0.0, 0.0):
        cols = torch.randint(0, width, (rows, n), generator=g, device=dev)
        x.scatter_(1, cols, value)
    if rows >= 4:
        x[1] = float("nan")
        x[2] = 5.0
        x[3, width // 2:] = float("-inf")
    return x.to(dtype)


def _expect(x, k, largest):
    return ref.topk_indices(x.double().cpu().numpy(), k, largest)


def _assert_topk(x, v, i, k, largest, what, sorted=True, index_order=False, exp=None):
    assert v.shape == i.shape == x.shape[:-1] + (k,) and i.dtype == torch.int64 and v.dtype == x.dtype
    exp = _expect(x, k, largest) if exp is None else exp
    got = i.cpu().numpy()
    if sorted:
        np.testing.assert_array_equal(got, exp, err_msg=what)
    else:
        np.testing.assert_array_equal(np.sort(got, -1), np.sort(exp, -1), err_msg=what)
        if index_order:
            assert (np.diff(got, axis=-1) > 0).all(), what + ": CUDA sorted=False is index order"
    bits = _BITS[x.dtype]
    assert torch.equal(v.view(bits), torch.gather(x.view(bits), -1, i)), what + ": values are x's bits"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows,width,k", SHAPES)
def test_gpu_vs_reference(cuda, backend, dtype, rows, width, k):
    x = _logits(rows, width, dtype, cuda, rows * 7919 + width + k)
    x64 = x.double().cpu().numpy()
    for largest in (True, False):
        what = "%s %s %dx%d k=%d largest=%s" % (backend, dtype, rows, width, k, largest)
        exp = ref.topk_indices(x64, k, largest)
        v, i = fray.topk(x, k, largest=largest, backend=backend)
        _assert_topk(x, v, i, k, largest, what, exp=exp)
        v, i = fray.topk(x, k, largest=largest, sorted=False, backend=backend)
        _assert_topk(x, v, i, k, largest, what + " unsorted", sorted=False, index_order=backend == "cuda", exp=exp)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width,k", [(7, 7), (5000, 50), (131072, 50), (131072, 5000)])
def test_gpu_cuda_nan_payloads_and_signed_zero(cuda, dtype, width, k):
    # Sign-bit NaNs and payload NaNs are NaNs (above +inf), -0.0 == +0.0 (ties by index), and the
    # values come back bit for bit.
    bits = _BITS[dtype]
    nbits = 32 if dtype == torch.float32 else 16
    nans = [0xFFC00001, 0x7F800001, 0xFFFFFFFF] if nbits == 32 else (
        [0xFC01, 0x7E01, 0xFFFF] if dtype == torch.float16 else [0xFF81, 0x7FC1, 0xFFFF])
    x = torch.zeros(2, width, device=cuda).to(dtype)
    x[:, ::3] = -0.0
    x[:, 1] = 1.0
    xb = x.view(bits)
    for j, pattern in enumerate(nans):
        signed = pattern - (1 << nbits) if pattern >= 1 << (nbits - 1) else pattern
        xb[0, (j * 997 + 5) % width] = signed
    for largest in (True, False):
        v, i = fray.topk(x, k, largest=largest, backend="cuda")
        _assert_topk(x, v, i, k, largest, "nan payloads %s largest=%s" % (dtype, largest))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_cuda_streaming_prefilter_gather_and_fallback(cuda, dtype):
    # Streaming rows with k <= 1024: the first pass counts vector maxima; when <= 1024 elements
    # are admitted over the row one CTA finishes it (unrounded normals, the usual case), otherwise
    # the cluster-wide radix continues (rows of ties below). Both orders, largest and smallest.
    g = torch.Generator(device=cuda).manual_seed(77)
    x = torch.randn(64, 131072, generator=g, device=cuda) * 3
    x[5, :3000] = 7.5                     # 3000 tied at the top: more than the gather holds
    x[6, ::64] = float("inf")             # 2048 infinities spread over every CTA's slice
    x[7, -1] = float("nan")               # one NaN, in the last CTA's last vector
    x = x.to(dtype)
    x64 = x.double().cpu().numpy()
    for k in (1, 50, 1000, 1024):
        for largest in (True, False):
            what = "%s 64x131072 k=%d largest=%s" % (dtype, k, largest)
            exp = ref.topk_indices(x64, k, largest)
            v, i = fray.topk(x, k, largest=largest, backend="cuda")
            _assert_topk(x, v, i, k, largest, what, exp=exp)
            v, i = fray.topk(x, k, largest=largest, sorted=False, backend="cuda")
            _assert_topk(x, v, i, k, largest, what + " unsorted", sorted=False, index_order=True, exp=exp)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_all_equal_and_masked_rows(cuda, backend):
    # Every key equal (the radix passes never narrow the candidates) and -inf-masked vocabularies.
    for width, k in ((4097, 4096), (131072, 50), (262144, 1024)):
        x = torch.full((3, width), 2.5, device=cuda)
        x[1] = float("-inf")
        x[1, width - 3:] = 1.0
        x[2] = float("nan")
        for largest in (True, False):
            v, i = fray.topk(x, k, largest=largest, backend=backend)
            _assert_topk(x, v, i, k, largest, "%s constant %d k=%d" % (backend, width, k))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_strided_unaligned_and_batched_layouts(cuda, backend, dtype):
    g = torch.Generator(device=cuda).manual_seed(11)
    big = (torch.randn(6, 140000, generator=g, device=cuda) * 3).round().to(dtype)
    cases = [
        big[:, 1:131073],                              # rows start off 16-byte alignment: scalar loads
        big[:, :4097],                                 # row stride 140000 > width
        big[:4, 3:3 + 999],                            # odd width, odd offset
        big[:, :6000].reshape(2, 3, 6000),             # leading dims collapse to rows
        big[0, :5000].expand(3, 5000),                 # row stride 0
    ]
    for j, x in enumerate(cases):
        for k in (1, 50, min(x.shape[-1], 1500)):
            v, i = fray.topk(x, k, backend=backend)
            _assert_topk(x, v, i, k, True, "%s layout %d k=%d" % (backend, j, k))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_graph_capture_and_side_stream(cuda, backend):
    shapes = [(64, 131072, 50), (4096, 256, 8), (2, 20000, 5000)]
    for rows, width, k in shapes:
        x = torch.randn(rows, width, device=cuda)
        fray.topk(x, k, backend=backend)  # warm-up (Triton compiles, extension loads)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            v, i = fray.topk(x, k, backend=backend)
        x.copy_(torch.randn(rows, width, device=cuda))
        graph.replay()
        torch.cuda.synchronize()
        _assert_topk(x, v, i, k, True, "%s graph %dx%d k=%d" % (backend, rows, width, k))
    s = torch.cuda.Stream()
    x = torch.randn(8, 50000, device=cuda)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        v, i = fray.topk(x, 64, largest=False, backend=backend)
    torch.cuda.current_stream().wait_stream(s)
    _assert_topk(x, v, i, 64, False, "%s side stream" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto"] + BACKENDS)
def test_gpu_torch_compile_fullgraph(cuda, backend):
    x = torch.randn(4, 70000, device=cuda).to(torch.bfloat16)
    f = torch.compile(lambda t: fray.topk(t, 60, backend=backend), fullgraph=True)
    v, i = f(x)
    _assert_topk(x, v, i, 60, True, "compiled %s" % backend)
    g = torch.compile(lambda t: fray.topk(t, 5000, sorted=True, largest=False, backend=backend), fullgraph=True)
    v, i = g(x)
    _assert_topk(x, v, i, 5000, False, "compiled %s k=5000" % backend)


@pytest.mark.gpu
def test_gpu_auto_takes_cuda_and_aliases(cuda):
    x = torch.randn(4, 1000, device=cuda)
    assert B.resolve("topk", S.TOPK_FAMILY, "auto", x.device) == "cuda"
    assert B.resolve("argmax", S.TOPK_FAMILY, "auto", x.device) == "cuda"
    v, i = fray.topk(x, 10)
    np.testing.assert_array_equal(i.cpu().numpy(), _expect(x, 10, True))
    assert torch.equal(fray.triton.topk(x, 10)[1], i)
    assert torch.equal(fray.topk(x, 10, algorithm="partial")[1], i)


@pytest.mark.gpu
def test_gpu_forced_algorithms_raise_and_workspace(cuda):
    x = torch.randn(2, 5000, device=cuda)
    with pytest.raises(ValueError, match="x:"):
        fray.topk(x, 3, algorithm="sort")
    with pytest.raises(ValueError, match="k:"):
        fray.topk(x, 65, algorithm="reduce")
    with pytest.raises(ValueError, match="algorithm:"):
        fray.topk(x, 3, algorithm="partial", backend="triton")
    with pytest.raises(ValueError, match="algorithm:"):
        fray.topk(x, 3, algorithm="reduce", backend="cuda")
    with pytest.raises(ValueError, match="backend:"):
        fray.topk(x, 3, backend="reference")
    # "torch": whole-row sort buffers
    need = fray.topk_workspace_size(x, 100, algorithm="torch")
    assert need == 2 * 5000 * 12
    with pytest.raises(ValueError, match="workspace:"):
        fray.topk(x, 100, algorithm="torch", workspace=torch.empty(need - 1, dtype=torch.uint8, device=cuda))
    v, i = fray.topk(x, 100, algorithm="torch", workspace=torch.empty(need, dtype=torch.uint8, device=cuda))
    _assert_topk(x, v, i, 100, True, "torch with workspace")
    # "partial": nothing up to k = 4096, the rank keys above
    assert fray.topk_workspace_size(x, 4096, algorithm="partial") == 0
    assert fray.topk_workspace_size(x, 3, algorithm="reduce") == 0
    need = fray.topk_workspace_size(x, 4500, algorithm="partial")
    assert need == 2 * 4500 * 16 == fray.topk_workspace_size(x, 4500)
    assert fray.topk_workspace_size(x, 4500, sorted=False) == 0
    with pytest.raises(ValueError, match="workspace:"):
        fray.topk(x, 4500, workspace=torch.empty(need - 8, dtype=torch.uint8, device=cuda))
    with pytest.raises(TypeError, match="workspace:"):
        fray.topk(x, 4500, workspace=torch.empty(need // 8, dtype=torch.int64, device=cuda))
    ws = torch.empty(need, dtype=torch.uint8, device=cuda)
    v, i = fray.topk(x, 4500, largest=False, workspace=ws)
    _assert_topk(x, v, i, 4500, False, "partial with workspace")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        v, i = fray.topk(x, 4500, workspace=ws)
    x.copy_(torch.randn(2, 5000, device=cuda))
    graph.replay()
    torch.cuda.synchronize()
    _assert_topk(x, v, i, 4500, True, "partial k > 4096 in a graph")


# ---------------------------------------------------------------------------------------------
# GPU (H200): the streaming kernel (cuda/topk/topk_stream.cuh). Every shape below is one the plan
# gives to it on this device (asserted), so these tests cannot silently fall back to the
# row-in-shared-memory kernel: fp32 64 x 131072 (two waves of 8 x 64 KB slices otherwise), 16-bit
# rows of twice as many elements per byte need 128 rows or 262144 columns.

_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
STREAM_SHAPES = {  # dtype class -> (rows, width, k)
    "f32": [(64, 131072, 1), (64, 131072, 50), (64, 131072, 1024), (64, 131072, 4096), (64, 262144, 50),
            (48, 150000, 50), (48, 150000, 4096)],
    "f16": [(128, 131072, 50), (128, 131072, 4096), (64, 262144, 50), (48, 150000, 1), (48, 150000, 1024),
            (64, 131072, 50)],
}


def _stream_cases():
    for dtype in DTYPES:
        for rows, width, k in STREAM_SHAPES["f32" if dtype == torch.float32 else "f16"]:
            yield pytest.param(dtype, rows, width, k, id="%s-%dx%d-k%d" % (str(dtype)[6:], rows, width, k))


@pytest.mark.gpu
def test_gpu_stream_plan_is_one_wave(cuda):
    # The launcher's cluster counts (cudaOccupancyMaxActiveClusters): every row's cluster of the
    # 64-row shapes is resident at once.
    fit = _ext().stream_fit(cuda.index if cuda.index is not None else torch.cuda.current_device())
    assert len(fit) == 5 and all(n > 0 for n in fit[1:]), fit
    sms = torch.cuda.get_device_properties(cuda).multi_processor_count
    for rows, width, k in ((64, 131072, 50), (64, 131072, 4096), (64, 262144, 50)):
        plan = _ext().topk_plan(rows, width, k, True, 0, sms, fit)
        assert plan[7] and rows <= fit[plan[0].bit_length() - 1], (rows, width, k, plan, fit)


_FIRST_CALL_CAPTURED = r"""
import torch, fray
x = torch.randn(64, 131072, device="cuda", generator=torch.Generator("cuda").manual_seed(5))
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):  # the process's first topk call: no cluster counts queried yet
    v, i = fray.topk(x, 50, backend="cuda")
g.replay()
ev, ei = fray.topk(x, 50, backend="cuda")  # eager: queries the counts, may pick another C
torch.cuda.synchronize()
assert torch.equal(v, ev) and torch.equal(i, ei)
x.copy_(torch.randn(64, 131072, device="cuda", generator=torch.Generator("cuda").manual_seed(6)))
g.replay()
ev, ei = fray.topk(x, 50, backend="cuda")
torch.cuda.synchronize()
assert torch.equal(v, ev) and torch.equal(i, ei)
print("ok")
"""


@pytest.mark.gpu
def test_gpu_stream_first_call_under_graph_capture(cuda):
    # A fresh process whose first streaming topk call is captured: the launcher must not query
    # the occupancy API inside the capture (it uses the plan's estimate), and the graph must
    # replay the same results as eager calls made afterwards with the queried counts.
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _FIRST_CALL_CAPTURED], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


def _assert_stream_plan(x, k, sorted=True):
    rows, width = x.shape[0] if x.dim() == 2 else x.numel() // x.shape[-1], x.shape[-1]
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    plan = _ext().topk_plan(rows, width, k, sorted, _CODES[x.dtype], sms)
    assert plan[7], "plan %r for %dx%d k=%d %s on %d SMs is not the streaming kernel" % (
        plan, rows, width, k, x.dtype, sms)


def _check_both_orders(x, k, what):
    x64 = x.double().cpu().numpy()
    for largest in (True, False):
        exp = ref.topk_indices(x64, k, largest)
        v, i = fray.topk(x, k, largest=largest, backend="cuda")
        _assert_topk(x, v, i, k, largest, "%s largest=%s" % (what, largest), exp=exp)
        v, i = fray.topk(x, k, largest=largest, sorted=False, backend="cuda")
        _assert_topk(x, v, i, k, largest, "%s largest=%s unsorted" % (what, largest), sorted=False,
                     index_order=True, exp=exp)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rows,width,k", list(_stream_cases()))
def test_gpu_stream_vs_reference(cuda, dtype, rows, width, k):
    # _logits: rounded normals (ties), NaN / +-inf / +-0 sprinkled, an all-NaN row, a constant row and
    # a half -inf row (the last three overflow the per-CTA entry buffer); then plain normals (few ties,
    # winners spread over every CTA of a row).
    x = _logits(rows, width, dtype, cuda, rows * 7919 + width + k)
    _assert_stream_plan(x, k)
    _assert_stream_plan(x, k, sorted=False)
    _check_both_orders(x, k, "stream logits %s %dx%d k=%d" % (dtype, rows, width, k))
    g = torch.Generator(device=cuda).manual_seed(k)
    x = torch.randn(rows, width, generator=g, device=cuda).to(dtype)
    _check_both_orders(x, k, "stream normal %s %dx%d k=%d" % (dtype, rows, width, k))


def _adversarial_rows(rows, width, dtype, dev, seed):
    """Rows that overflow the streaming kernel's entry buffer or end in ties at the k-th key."""
    g = torch.Generator(device=dev).manual_seed(seed)
    nbits = 32 if dtype == torch.float32 else 16
    bits = _BITS[dtype]
    x = (torch.randn(rows, width, generator=g, device=dev) * 4).round()
    cols = torch.arange(width, device=dev)
    for r in range(rows):
        kind = r % 10
        if kind == 0:    # all equal
            x[r] = 2.5
        elif kind == 1:  # -inf-masked vocabulary: a few finite values
            x[r] = float("-inf")
            x[r, torch.randint(0, width, (20,), generator=g, device=dev)] = torch.randn(20, generator=g, device=dev)
        elif kind == 2:  # -inf-masked with more finite values than k
            x[r] = float("-inf")
            x[r, torch.randint(0, width, (6000,), generator=g, device=dev)] = 1.0
        elif kind == 3:  # +0 / -0 mix and a few 1.0
            x[r] = torch.where(torch.rand(width, generator=g, device=dev) < 0.5, -0.0, 0.0)
            x[r, torch.randint(0, width, (5,), generator=g, device=dev)] = 1.0
        elif kind == 4:  # constant blocks of 1000
            x[r] = ((cols // 1000) % 7 - 3).float()
        elif kind == 5:  # a block of equal maxima at the start (one CTA's entries overflow)
            x[r, :20000] = 10.0
        elif kind == 6:  # half the row ties at one value, a few larger
            x[r] = torch.where(torch.rand(width, generator=g, device=dev) < 0.5, 1.0, -1.0)
            x[r, torch.randint(0, width, (20,), generator=g, device=dev)] = 2.0
    x = x.to(dtype)
    xb = x.view(bits)
    for r in range(rows):
        kind = r % 10
        if kind in (7, 8):  # many NaNs (kind 8: all), any sign and payload
            n = width // 2 if kind == 7 else width
            c = torch.randperm(width, generator=g, device=dev)[:n] if kind == 7 else cols
            payload = torch.randint(1, 1 << (22 if nbits == 32 else 6), (n,), generator=g, device=dev)
            exp = (0xFF << 23) if nbits == 32 else (0x1F << 10 if dtype == torch.float16 else 0xFF << 7)
            sign = torch.randint(0, 2, (n,), generator=g, device=dev) << (nbits - 1)
            v = (sign | exp | payload).to(torch.int64)
            v = torch.where(v >= 1 << (nbits - 1), v - (1 << nbits), v)
            xb[r, c] = v.to(bits)
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 50, 4096])
def test_gpu_stream_adversarial_rows(cuda, dtype, k):
    rows = 64 if dtype == torch.float32 else 128
    x = _adversarial_rows(rows, 131072, dtype, cuda, 1000 + k)
    _assert_stream_plan(x, k)
    _check_both_orders(x, k, "stream adversarial %s k=%d" % (dtype, k))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_stream_unaligned_and_broadcast_rows(cuda, dtype):
    rows = 64 if dtype == torch.float32 else 128
    g = torch.Generator(device=cuda).manual_seed(5)
    big = (torch.randn(rows, 131080, generator=g, device=cuda) * 3).round().to(dtype)
    cases = [
        big[:, 1:131073],                      # rows start off 16-byte alignment: element loads
        big[0, 3:3 + 131072].expand(rows, 131072),  # row stride 0, odd offset
        big[0, :131072].expand(rows, 131072),  # row stride 0, aligned
    ]
    for j, x in enumerate(cases):
        # One reference per order (rank-order prefixes serve every k; broadcast rows: one row).
        x64 = x[:1].double().cpu().numpy() if x.stride(0) == 0 else x.double().cpu().numpy()
        exp_hi = np.broadcast_to(ref.topk_indices(x64, 1024, True), (rows, 1024))
        exp_lo = np.broadcast_to(ref.topk_indices(x64, 1024, False), (rows, 1024))
        for k in (1, 50, 1024):
            _assert_stream_plan(x, k)
            v, i = fray.topk(x, k, backend="cuda")
            _assert_topk(x, v, i, k, True, "stream layout %d %s k=%d" % (j, dtype, k), exp=exp_hi[:, :k])
            v, i = fray.topk(x, k, largest=False, sorted=False, backend="cuda")
            _assert_topk(x, v, i, k, False, "stream layout %d %s k=%d unsorted" % (j, dtype, k), sorted=False,
                         index_order=True, exp=exp_lo[:, :k])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_stream_rank_keys(cuda, dtype):
    # The extension's rank-key output (index order) from the streaming kernel: fray.topk only asks for
    # it with k > 4096 (the row-in-shared-memory kernel), so call the extension directly.
    ext = _ext()
    rows = 64 if dtype == torch.float32 else 128
    x = _logits(rows, 131072, dtype, cuda, 77)
    for k in (50, 4096):
        _assert_stream_plan(x, k, sorted=False)
        for largest in (True, False):
            keys = torch.full((rows, k), -1, dtype=torch.int64, device=cuda)
            vals = torch.empty((rows, k), dtype=dtype, device=cuda)
            idx = torch.empty((rows, k), dtype=torch.int64, device=cuda)
            # Launcher slots: cuda/topk/topk.h (ptrs x, values, indices, rank_keys; ints x_row_stride,
            # dtype, rows, width, k, largest, sorted).
            ext.topk((x, vals, idx, keys), (x.stride(0), _CODES[dtype], rows, 131072, k, largest, False), (),
                     cuda.index or 0, torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            exp = ref.topk_indices(x.double().cpu().numpy(), k, largest)
            got = keys.cpu().numpy()
            assert (got >= 0).all()
            order_idx = S.RANK_KEY_INDEX_MASK - (got & S.RANK_KEY_INDEX_MASK)
            np.testing.assert_array_equal(order_idx, np.sort(exp, -1), err_msg="rank keys: index order")
            ranked = np.take_along_axis(order_idx, np.argsort(-got, axis=-1, kind="stable"), -1)
            np.testing.assert_array_equal(ranked, exp, err_msg="rank keys rank k=%d largest=%s" % (k, largest))
