"""fray.grouped_gemm: reference (hand-computed), Triton (interpreter on CPU), error contract, GPU
(both forms, both layouts, awkward group sizes, strided b, CUDA-graph replay, torch.compile)."""
import os

import numpy as np
import pytest
import torch

import fray
from fray import env
from fray.ops import moe as M
from fray.ops import moe_gemm as MG
from fray.reference import moe as ref
from fray.testing import assert_gemm_close

INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _operands(m, k, n, g, dtype, device="cpu", seed=0, layout="nk"):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(dtype)
    b = (torch.randn(g, n, k, generator=gen) / k ** 0.5).to(dtype)
    if layout == "kn":
        b = b.transpose(1, 2).contiguous()
    return a.to(device), b.to(device)


def _offsets(m, sizes):
    """Group offsets from sizes (the rest of the m rows after them belong to no group)."""
    offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    assert offs[-1] <= m
    return torch.from_numpy(offs)


def _check_explicit(a, b, offs, out, layout, what):
    MG.check_grouped(a, b, offs, out, what, layout)
    outside = np.ones(a.shape[0], bool)
    o = offs.cpu().numpy()
    outside[o[0]:o[-1]] = False
    assert torch.isnan(out.cpu()[torch.from_numpy(outside)].float()).all(), "%s: rows outside the groups written" % what


def _check_routes(x, b, ids, out, layout, what, emap=None):
    k = ids.shape[1]
    exp, written = ref.routes_gemm(x.double().cpu().numpy(), b.double().cpu().numpy(), ids.cpu().numpy(), layout,
                                   None if emap is None else emap.cpu().numpy())
    groups = ref.local_ids(ids.cpu().numpy(), None if emap is None else emap.cpu().numpy()).reshape(-1)
    terms = ref.term_scale(np.repeat(x.double().cpu().numpy(), k, axis=0), b.double().cpu().numpy(), groups, layout)
    keep = torch.from_numpy(written)
    assert_gemm_close(out.cpu()[keep], exp[written], terms[written], x.dtype, x.shape[1], what)
    assert torch.isnan(out.cpu()[~keep].float()).all(), "%s: dropped routes written" % what


# ---------------------------------------------------------------------------------------------
# CPU: reference

def test_reference_hand_computed():
    a = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    b = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 1.0]]], np.float32)  # nk: [G, N, K]
    got = fray.grouped_gemm(a, b, np.array([0, 1, 3], np.int32))
    assert got.tolist() == [[1.0, 2.0], [4.0, 7.0], [6.0, 11.0]]
    got = fray.grouped_gemm(a, b.transpose(0, 2, 1).copy(), np.array([0, 1, 3], np.int32), b_layout="kn")
    assert got.tolist() == [[1.0, 2.0], [4.0, 7.0], [6.0, 11.0]]
    # rows outside the groups stay zero in a new output, untouched in a given one
    out = np.full((3, 2), 9.0, np.float32)
    fray.grouped_gemm(a, b, np.array([1, 1, 2], np.int32), out=out)
    assert out.tolist() == [[9.0, 9.0], [4.0, 7.0], [9.0, 9.0]]
    # the dispatch form: 2 tokens, top_k 2, routes [0->1, 1->0, 2->1, 3->0]: row r = x[r // 2] @ B_e
    ids = np.array([[1, 0], [1, 0]], np.int32)
    d = fray.moe_dispatch(ids, 2, 16)
    got = fray.grouped_gemm(a[:2], b, dispatch=d, top_k=2)
    assert got.tolist() == [[2.0, 3.0], [1.0, 2.0], [4.0, 7.0], [3.0, 4.0]]


def test_reference_cpu_tensors_round_once():
    a, b = _operands(9, 40, 24, 3, torch.bfloat16)
    offs = _offsets(9, [2, 0, 7])
    got = fray.grouped_gemm(a, b, offs)
    assert got.dtype == torch.bfloat16
    exp, rows = ref.grouped_gemm(a.double().numpy(), b.double().numpy(), offs.numpy(), "nk")
    assert rows.all()
    assert torch.equal(got, torch.from_numpy(exp).to(torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernels under the interpreter

@INTERPRETER
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sizes,m", [([5, 0, 33, 1], 41), ([16, 16], 40), ([0, 0], 3), ([1], 1)])
def test_triton_interpreter_explicit(layout, dtype, sizes, m):
    a, b = _operands(m, 48, 40, len(sizes), dtype, layout=layout)
    offs = _offsets(m, sizes) + (1 if sum(sizes) < m else 0)  # groups need not start at row 0
    out = torch.full((m, 40), float("nan"), dtype=dtype)
    MG._explicit(a, b, offs, out, layout)
    _check_explicit(a, b, offs, out, layout, "interpreter %s %s" % (sizes, layout))


@INTERPRETER
def test_triton_interpreter_explicit_garbage_offsets_stay_in_bounds():
    """Offsets are trusted on the device: decreasing or out-of-range values must still never make
    the kernels touch rows outside a or tiles past the tile list (they are clamped)."""
    from fray_triton import moe_gemm as tg
    m, g, bm = 20, 4, 16
    offs = torch.tensor([5, 100, 2, -7, 30], dtype=torch.int32)
    cap = tg.max_tiles_explicit(m, g, bm)
    tiles = [torch.full((cap + 8,), -99, dtype=torch.int32) for _ in range(3)]
    num = torch.zeros(1, dtype=torch.int32)
    tg.tile_map(offs, g, m, bm, *tiles, num)
    n = int(num)
    assert n <= cap and (tiles[0][cap:] == -99).all()
    assert ((tiles[1][:n] >= 0) & (tiles[2][:n] <= m) & (tiles[1][:n] < tiles[2][:n])).all()


def _routes_path(path, x, b, d, out, k, layout):
    """MG._routes, or ("cuda") the dispatch form's CUDA path with the Triton explicit GEMM in the
    CUDA one's place (the row copies around it are what the interpreter checks)."""
    if path == "triton":
        return MG._routes(x, b, d[0], d[2], d[3], out, k, layout)
    return MG._routes_cuda(x, b, d[0], d[1], out, k, layout, gemm=MG._explicit)


@INTERPRETER
@pytest.mark.parametrize("path", ["triton", "cuda"])
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("t,k,e,bm", [(1, 1, 4, 16), (7, 2, 4, 16), (20, 3, 8, 32), (9, 3, 3, 16)])
def test_triton_interpreter_routes(path, layout, t, k, e, bm):
    dtype = torch.bfloat16
    x, b = _operands(t, 40, 24, e, dtype, seed=t, layout=layout)
    ids = torch.stack([torch.randperm(e, generator=torch.Generator().manual_seed(i))[:k] for i in range(t)]).int()
    d = M._dispatch_outputs(ids, e, bm)
    from fray_triton import moe as tmoe
    tmoe.dispatch(ids, None, e, bm, *d)
    out = torch.full((t * k, 24), float("nan"), dtype=dtype)
    _routes_path(path, x, b, d, out, k, layout)
    _check_routes(x, b, ids, out, layout, "%s routes T=%d k=%d" % (path, t, k))


@INTERPRETER
@pytest.mark.parametrize("path", ["triton", "cuda"])
def test_triton_interpreter_routes_with_expert_map(path):
    t, k, e_global, e = 12, 2, 8, 3
    x, b = _operands(t, 32, 16, e, torch.float16, seed=2)
    ids = torch.stack([torch.randperm(e_global, generator=torch.Generator().manual_seed(i))[:k]
                       for i in range(t)]).int()
    emap = torch.full((e_global,), -1, dtype=torch.int32)
    emap[torch.tensor([1, 4, 6])] = torch.tensor([2, 0, 1], dtype=torch.int32)
    d = M._dispatch_outputs(ids, e, 16)
    from fray_triton import moe as tmoe
    tmoe.dispatch(ids, emap, e, 16, *d)
    out = torch.full((t * k, 16), float("nan"), dtype=torch.float16)
    _routes_path(path, x, b, d, out, k, "nk")
    _check_routes(x, b, ids, out, "nk", "expert_map " + path, emap)


def test_kernels_compile_for_sm90a():
    """Every specialisation the ops launch, through Triton's compiled path for sm_90a (no GPU):
    type errors, shared memory and register spills that the interpreter never sees. The TMA path
    (contiguous weights) for each row tile and mode, and the pointer path's configs."""
    from fray.testing import compile_triton_sm90, sm90_spec
    from fray_triton import moe_gemm as tg
    types = {"A": "*bf16", "B": "*bf16", "C": "*bf16", "WEIGHTS": "*fp32", "ROUTES": "*i32", "TILE_GROUP": "*i32",
             "TILE_START": "*i32", "TILE_END": "*i32", "NUM_TILES": "*i32"}
    modes = (dict(A_MODE=1, OUT_MODE=0, GATED=True, WEIGHTED=False, WEIGHT_INPUT=False),
             dict(A_MODE=2, OUT_MODE=0, GATED=False, WEIGHTED=True, WEIGHT_INPUT=False),
             dict(A_MODE=2, OUT_MODE=2, GATED=False, WEIGHTED=True, WEIGHT_INPUT=False),
             dict(A_MODE=0, OUT_MODE=0, GATED=False, WEIGHTED=False, WEIGHT_INPUT=False))
    specs, labels = [], []
    for bm in (16, 32, 64, 128):
        for desc in (True, False):
            for mode in modes:
                cfg = MG.gemm_config(bm, 4096, 4096, mode["GATED"])
                if not desc:
                    cfg = tg.pointer_config(cfg)
                bn, bk = cfg["BLOCK_N"], cfg["BLOCK_K"]
                t = dict(types, b_desc="tensordesc<bf16[1,%d,%d]>" % (bn, bk) if desc else "constexpr")
                c = dict(mode, B_NK=True, USE_DESC=desc, DOT_F32=False, ACT=0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                         GROUP_M=cfg["GROUP_M"])
                tt = dict(t, C="*fp32") if mode["OUT_MODE"] == 2 else t
                if not desc:
                    c["b_desc"] = None
                specs.append(sm90_spec("fray_triton.moe_gemm", "_moe_gemm_kernel", tt, c, num_warps=cfg["num_warps"],
                                       num_stages=cfg["num_stages"], divisible=("A", "B", "C", "lda", "ldc")))
                labels.append((bm, desc, mode["A_MODE"], mode["OUT_MODE"]))
    results = compile_triton_sm90(specs)
    for label, r in zip(labels, results):
        assert r["spills"] == 0, (label, r)
        assert r["wgmma"] == (label[0] >= 64), (label, r)  # wgmma needs 64 rows a warpgroup


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    a, b = _operands(6, 32, 16, 2, torch.bfloat16)
    offs = torch.tensor([0, 3, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="group_offsets / dispatch: pass exactly one"):
        fray.grouped_gemm(a, b)
    with pytest.raises(ValueError, match="b_layout: expected one of"):
        fray.grouped_gemm(a, b, offs, b_layout="mn")
    with pytest.raises(TypeError, match="a: expected dtype bfloat16 or float16, got float32"):
        fray.grouped_gemm(a.float(), b, offs)
    with pytest.raises(TypeError, match="b: expected a's dtype"):
        fray.grouped_gemm(a, b.half(), offs)
    with pytest.raises(ValueError, match="b: expected K = 32"):
        fray.grouped_gemm(a, b[:, :, :16], offs)
    with pytest.raises(ValueError, match="b: expected 3 dimensions"):
        fray.grouped_gemm(a, b[0], offs)
    with pytest.raises(ValueError, match="a: the last dimension must be contiguous"):
        fray.grouped_gemm(a.t().contiguous().t(), b, offs)
    with pytest.raises(ValueError, match=r"group_offsets: expected shape \(3,\)"):
        fray.grouped_gemm(a, b, offs[:2])
    with pytest.raises(TypeError, match="group_offsets: expected dtype int32, got int64"):
        fray.grouped_gemm(a, b, offs.long())
    with pytest.raises(ValueError, match="group_offsets: expected nondecreasing values in"):
        fray.grouped_gemm(a, b, torch.tensor([0, 4, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"group_offsets: expected nondecreasing values in \[0, 6\]"):
        fray.grouped_gemm(a, b, torch.tensor([0, 4, 7], dtype=torch.int32))
    with pytest.raises(ValueError, match="top_k: only with dispatch="):
        fray.grouped_gemm(a, b, offs, top_k=2)
    with pytest.raises(ValueError, match=r"out: expected shape \(6, 16\)"):
        fray.grouped_gemm(a, b, offs, out=torch.empty(6, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out: elements overlap"):
        fray.grouped_gemm(a, b, offs, out=torch.empty(16, dtype=torch.bfloat16).expand(6, 16))
    ids = torch.zeros(6, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="dispatch: built for 4 experts"):
        fray.grouped_gemm(a, b, dispatch=fray.moe_dispatch(ids, 4, 16), top_k=2)
    with pytest.raises(ValueError, match="dispatch: built for 12 routes"):
        fray.grouped_gemm(a, b, dispatch=fray.moe_dispatch(ids, 2, 16), top_k=3)
    with pytest.raises(ValueError, match=r"dispatch: block_m 8 is outside \[16, 256\]"):
        fray.grouped_gemm(a, b, dispatch=fray.moe_dispatch(ids, 2, 8), top_k=2)
    with pytest.raises(TypeError, match="dispatch: expected the MoeDispatch"):
        fray.grouped_gemm(a, b, dispatch=[1, 2], top_k=2)
    with pytest.raises(TypeError, match="top_k: expected an int"):
        fray.grouped_gemm(a, b, dispatch=fray.moe_dispatch(ids, 2, 16), top_k=None)
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.grouped_gemm(a, b, offs, backend="triton")
    # a dispatch's contents are what the kernels index with: checked on the CPU (on the GPU with
    # FRAY_CHECK_INDICES=1)
    d = fray.moe_dispatch(ids, 2, 16)
    bad = d._replace(sorted_route_ids=d.sorted_route_ids.clone())
    bad.sorted_route_ids[0] = 13
    with pytest.raises(ValueError, match=r"dispatch: sorted_route_ids hold values in \[.*, 13\], expected \[0, 12\]"):
        fray.grouped_gemm(a, b, dispatch=bad, top_k=2)
    bad = d._replace(tile_expert=d.tile_expert.clone())
    bad.tile_expert[0] = 2
    with pytest.raises(ValueError, match=r"dispatch: tile_expert holds experts in \[.*, 2\]"):
        fray.grouped_gemm(a, b, dispatch=bad, top_k=2)
    bad = d._replace(num_tiles=torch.tensor([99], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"dispatch: num_tiles is 99"):
        fray.grouped_gemm(a, b, dispatch=bad, top_k=2)


def test_custom_ops_are_registered():
    assert hasattr(torch.ops.fray, "grouped_gemm") and hasattr(torch.ops.fray, "grouped_gemm_routes")


# ---------------------------------------------------------------------------------------------
# GPU

GPU_EXPLICIT = [  # (m, k, n, group sizes): empty groups, groups shorter than a tile, one row, K odd
    (1, 64, 128, [1]), (7, 256, 320, [3, 0, 4]), (1000, 512, 384, [100, 0, 1, 499, 200, 200]),
    (4096, 1024, 768, [512] * 8), (333, 136, 200, [33, 300]), (64, 4104, 256, [64])]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k,n,sizes", GPU_EXPLICIT)
def test_gpu_explicit(cuda, backend, layout, dtype, m, k, n, sizes, monkeypatch):
    if backend == "cuda":
        if n % 8 or k % 8:
            pytest.skip("the TMA kernel needs N and K multiples of 8 (ValueError; test_gpu_check_indices)")
        monkeypatch.setenv("FRAY_AUTOTUNE", "0")  # the default configuration: one JIT build per dtype x layout
    a, b = _operands(m, k, n, len(sizes), dtype, cuda, seed=m, layout=layout)
    offs = _offsets(m, sizes).to(cuda)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=cuda)
    fray.grouped_gemm(a, b, offs, b_layout=layout, out=out, backend=backend)
    _check_explicit(a, b, offs, out, layout, "explicit %s %s" % (backend, sizes))


@pytest.mark.gpu
def test_gpu_cuda_every_candidate_and_graph_replay(cuda):
    """Each CUTLASS configuration the tuner may choose, at groups with empty members and rows off the
    tiles; then the default one under CUDA-graph replay with the groups changing."""
    from fray import jit
    from fray.ops import moe_gemm as mg
    a, b = _operands(700, 264, 200, 5, torch.bfloat16, cuda, seed=3)
    offs = _offsets(700, [0, 300, 1, 0, 390]).to(cuda) + 2
    for config in mg.CUDA_CANDIDATES:
        out = torch.full((700, 200), float("nan"), dtype=torch.bfloat16, device=cuda)
        name, src = mg.cuda_kernel_source(config, torch.bfloat16, "nk")
        kern = jit.build(name, src)
        ints = (700, 200, 264, 5, a.stride(0), b.stride(1), b.stride(0), out.stride(0))
        ptrs = (a.data_ptr(), b.data_ptr(), offs.data_ptr(), out.data_ptr())
        stream = torch.cuda.current_stream().cuda_stream
        ws = torch.empty(kern.workspace_bytes(ptrs, ints, (), 0, stream), dtype=torch.uint8, device=cuda)
        kern.launch(ptrs + (ws.data_ptr(),), ints, (), 0, stream)
        _check_explicit(a, b, offs, out, "nk", "candidate %s" % config)
    _replay_with_new_offsets(a, b, offs, "cuda", ([700, 0, 0, 0, 0], [1, 2, 3, 4, 5], [0, 0, 350, 0, 350]))


def _replay_with_new_offsets(a, b, offs, backend, size_lists):
    """One call captured in a CUDA graph (after a warm-up outside it), replayed with each list of
    group sizes written into offs: every replay must compute the new groups."""
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=a.dtype, device=a.device)
    fray.grouped_gemm(a, b, offs, out=out, backend=backend)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fray.grouped_gemm(a, b, offs, out=out, backend=backend)
    for sizes in size_lists:
        offs.copy_(_offsets(a.shape[0], sizes))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check_explicit(a, b, offs, out, "nk", "%s replay %s" % (backend, sizes))


@pytest.mark.gpu
def test_gpu_strided_b_and_row_strided_a(cuda):
    a, b = _operands(300, 256, 192, 4, torch.bfloat16, cuda)
    wide = torch.zeros(300, 512, dtype=torch.bfloat16, device=cuda)
    wide[:, :256] = a
    bt = b.transpose(1, 2).contiguous().transpose(1, 2)  # [G, N, K] with K strided: the pointer path
    offs = _offsets(300, [50, 150, 0, 100]).to(cuda)
    out = torch.full((300, 192), float("nan"), dtype=torch.bfloat16, device=cuda)
    fray.grouped_gemm(wide[:, :256], bt, offs, out=out)
    _check_explicit(a, b, offs, out, "nk", "strided")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("t,k,e,bm", [(1, 1, 8, 16), (1, 8, 64, 16), (37, 2, 8, 16), (512, 6, 64, 64),
                                      (4096, 2, 8, 128), (333, 8, 128, 32)])
@pytest.mark.parametrize("backend", ["auto", "cuda"])
def test_gpu_routes(cuda, backend, layout, t, k, e, bm):
    x, b = _operands(t, 512, 384, e, torch.bfloat16, cuda, seed=t, layout=layout)
    logits = M._random_logits(t, e, torch.float32, cuda, seed=t)
    _, ids = fray.moe_route(logits, k)
    d = fray.moe_dispatch(ids, e, bm)
    out = torch.full((t * k, 384), float("nan"), dtype=torch.bfloat16, device=cuda)
    fray.grouped_gemm(x, b, dispatch=d, top_k=k, b_layout=layout, out=out, backend=backend)
    _check_routes(x, b, ids, out, layout, "%s routes T=%d" % (backend, t))


@pytest.mark.gpu
def test_gpu_graph_replay_follows_new_offsets(cuda):
    a, b = _operands(512, 256, 256, 4, torch.bfloat16, cuda)
    offs = _offsets(512, [128] * 4).to(cuda)
    _replay_with_new_offsets(a, b, offs, "triton", ([0, 512, 0, 0], [1, 2, 300, 209], [100, 0, 100, 0]))


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph(cuda):
    a, b = _operands(200, 256, 128, 3, torch.float16, cuda)
    offs = _offsets(200, [20, 100, 80]).to(cuda)
    f = torch.compile(lambda a_, b_, o_: fray.grouped_gemm(a_, b_, o_) * 2, fullgraph=True)
    assert torch.equal(f(a, b, offs), fray.grouped_gemm(a, b, offs) * 2)


@pytest.mark.gpu
def test_gpu_check_indices(cuda, monkeypatch):
    a, b = _operands(8, 64, 32, 2, torch.bfloat16, cuda)
    monkeypatch.setattr(env, "check_indices", lambda: True)
    with pytest.raises(ValueError, match="group_offsets: expected nondecreasing values"):
        fray.grouped_gemm(a, b, torch.tensor([0, 9, 8], dtype=torch.int32, device=cuda))
    d = fray.moe_dispatch(torch.zeros(8, 1, dtype=torch.int32, device=cuda), 2, 16)
    with pytest.raises(ValueError, match="b: backend='cuda' reads the weights by TMA"):
        fray.grouped_gemm(a[:, :60], b[:, :, :60], dispatch=d, top_k=1, backend="cuda")
    with pytest.raises(ValueError, match="the CUDA grouped GEMM reads and writes by TMA"):
        fray.grouped_gemm(a[:, :60], b[:, :, :60], torch.tensor([0, 4, 8], dtype=torch.int32, device=cuda),
                          backend="cuda")
    d.tile_expert[0] = 5
    with pytest.raises(ValueError, match="dispatch: tile_expert holds experts"):
        fray.grouped_gemm(a, b, dispatch=d, top_k=1)


def test_cuda_tu_compiles_for_sm90a(tmp_path, monkeypatch):
    """One real JIT build of the CUTLASS grouped GEMM (the default configuration) for sm_90a,
    loaded by the dynamic linker without a GPU: the contract's exports are there, describe() names
    the configuration, and the SASS holds wgmma (HGMMA) and the TMA loads (UTMALDG)."""
    import ctypes
    import re

    from fray import jit, testing
    monkeypatch.setenv("FRAY_CACHE_DIR", str(tmp_path / "cache"))
    name, src = MG.cuda_kernel_source(MG.CUDA_CANDIDATES[0], torch.bfloat16, "nk")
    so = jit.compile_only(name, src)
    lib = ctypes.CDLL(str(so))
    for sym in ("fray_jit_launch", "fray_jit_workspace_bytes", "fray_jit_describe"):
        assert hasattr(lib, sym), sym
    lib.fray_jit_describe.restype = ctypes.c_char_p
    assert lib.fray_jit_describe().decode().startswith("grouped_gemm_sm90 bf16 b=nk 128x128x64 c1x1 coop stages=")
    sass = testing.dump_sass(so)
    assert set(re.findall(r"arch = (sm_\w+)", sass)) == {"sm_90a"}, sass[:500]
    assert "HGMMA" in sass and "UTMALDG" in sass
