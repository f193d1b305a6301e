"""fray.moe_dispatch: reference (hand-computed, brute force, invariants), Triton (interpreter on CPU),
error contract, GPU (torch.compile, CUDA-graph replay, determinism)."""
import os

import numpy as np
import pytest
import torch

import fray
from fray import env
from fray.ops import moe
from fray.reference import moe as ref

INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
FIELDS = moe.MoeDispatch._fields


def _brute(ids, num_experts, block_m, expert_map=None):
    """An independent reference: Python's stable sort of the kept routes by expert."""
    flat = [int(v) for v in np.asarray(ids).reshape(-1)]
    n = len(flat)
    local = flat if expert_map is None else [int(expert_map[v]) for v in flat]
    rows = -(-(n + num_experts * (block_m - 1)) // block_m) * block_m
    out, offsets, tiles = [], [0], []
    for x in range(num_experts):
        seg = [r for r in range(n) if local[r] == x]
        seg += [n] * (-len(seg) % block_m)
        tiles += [x] * (len(seg) // block_m)
        out += seg
        offsets.append(len(out))
    num_tiles = len(tiles)
    out += [n] * (rows - len(out))
    tiles += [-1] * (rows // block_m - len(tiles))
    inverse = [-1] * n
    for row, r in enumerate(out):
        if r < n:
            inverse[r] = row
    counts = [local.count(x) for x in range(num_experts)]
    return [np.array(a) for a in (out, offsets, tiles, [num_tiles], inverse, counts)]


def _assert_equal(got, expected, what):
    for name, a, b in zip(FIELDS, got, expected):
        a = a.cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        assert a.dtype == np.int32, "%s: %s has dtype %s" % (what, name, a.dtype)
        assert np.array_equal(a, b), "%s: %s\n%s\n!= expected\n%s" % (what, name, a, b)


def _triton(ids, num_experts, block_m, expert_map=None):
    from fray_triton import moe as tmoe
    outs = moe._dispatch_outputs(ids, num_experts, block_m)
    for o in outs[:5]:
        o.fill_(-99)  # poisoned: every element must be written
    tmoe.dispatch(ids, expert_map, num_experts, block_m, *outs)
    return outs[:6]


def _random_ids(t, k, e, seed, skew=False):
    g = torch.Generator().manual_seed(seed)
    if skew:  # most routes to a few experts, many experts without any
        return (torch.randint(0, 4, (t, k), generator=g) ** 2 % e).int()
    # distinct experts per token, as a router gives
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int() if t else torch.zeros(0, k).int()


# ---------------------------------------------------------------------------------------------
# CPU: reference

def test_reference_hand_computed():
    # routes: r0 -> 1, r1 -> 0, r2 -> 1, r3 -> 1; block_m 2: segments [r1, pad] [r0, r2, r3, pad]
    d = fray.moe_dispatch(np.array([[1, 0], [1, 1]], np.int32), 2, 2)
    assert d.sorted_route_ids.tolist() == [1, 4, 0, 2, 3, 4]
    assert d.expert_offsets.tolist() == [0, 2, 6]
    assert d.tile_expert.tolist() == [0, 1, 1] and d.num_tiles.tolist() == [3]
    assert d.inverse.tolist() == [2, 0, 3, 4] and d.counts.tolist() == [1, 3]
    # 3 experts, block_m 4, expert 1 without routes: rows = 4 + 3 * 3 = 13 -> 16
    d = fray.moe_dispatch(np.array([[2, 0], [0, 2]]), 3, 4)
    assert d.sorted_route_ids.tolist() == [1, 2, 4, 4, 0, 3, 4, 4] + [4] * 8
    assert d.expert_offsets.tolist() == [0, 4, 4, 8]
    assert d.tile_expert.tolist() == [0, 2, -1, -1] and d.num_tiles.tolist() == [2]
    assert d.inverse.tolist() == [4, 0, 1, 5] and d.counts.tolist() == [2, 0, 2]


def test_reference_expert_map_drops_routes():
    # 6 global experts, this rank holds 1 -> 0 and 4 -> 1
    emap = np.array([-1, 0, -1, -1, 1, -1], np.int32)
    ids = np.array([[1, 4], [0, 1], [5, 2]], np.int32)
    d = fray.moe_dispatch(ids, 2, 2, expert_map=emap)
    assert d.counts.tolist() == [2, 1]
    assert d.sorted_route_ids.tolist()[:4] == [0, 3, 1, 6] and d.expert_offsets.tolist() == [0, 2, 4]
    assert d.inverse.tolist() == [0, 2, -1, 1, -1, -1]
    assert d.tile_expert.tolist()[:3] == [0, 1, -1]


@pytest.mark.parametrize("case", range(8))
def test_reference_vs_brute_force_and_invariants(case):
    t, k, e, bm = [(1, 1, 1, 1), (1, 8, 256, 64), (5, 2, 8, 4), (37, 3, 16, 8), (64, 8, 128, 16),
                   (13, 4, 64, 128), (50, 2, 4, 32), (3, 6, 6, 2)][case]
    ids = _random_ids(t, k, e, case, skew=case % 2 == 1).numpy()
    d = ref.moe_dispatch(ids, e, bm)
    for name, a, b in zip(FIELDS, d, _brute(ids, e, bm)):
        assert np.array_equal(a, b), name
    s, off, tiles, nt, inv, counts = d
    n = t * k
    assert len(s) == ref.dispatch_rows(n, e, bm) and len(s) % bm == 0 and len(tiles) == len(s) // bm
    assert (off % bm == 0).all() and off[-1] == nt[0] * bm
    assert sorted(s[s < n].tolist()) == list(range(n))          # each route exactly once
    assert (s[inv] == np.arange(n)).all()                       # inverse inverts
    flat = ids.reshape(-1)
    assert ((off[flat] <= inv) & (inv < off[flat + 1])).all()     # each route inside its expert's segment
    for x in range(e):
        seg = s[off[x]:off[x + 1]]
        real = seg[seg < n]
        assert (flat[real] == x).all() and (np.diff(real) > 0).all() and len(real) == counts[x]


def test_numpy_and_cpu_tensors():
    ids = torch.tensor([[3, 1], [1, 0]], dtype=torch.int64)
    d = fray.moe_dispatch(ids, 4, 2)
    assert isinstance(d, moe.MoeDispatch) and isinstance(d, tuple) and len(d) == 6
    assert all(isinstance(a, torch.Tensor) and a.dtype == torch.int32 for a in d)
    _assert_equal(d, _brute(ids, 4, 2), "cpu tensor")
    a = fray.moe_dispatch(ids.numpy().astype(np.int32), 4, 2, expert_map=np.arange(4, dtype=np.int32))
    assert all(isinstance(v, np.ndarray) for v in a)
    _assert_equal(a, _brute(ids, 4, 2), "numpy with the identity map")
    empty = fray.moe_dispatch(np.zeros((0, 2), np.int32), 3, 4)
    assert empty.sorted_route_ids.tolist() == [0] * 12 and empty.num_tiles.tolist() == [0]
    assert empty.tile_expert.tolist() == [-1] * 3 and empty.expert_offsets.tolist() == [0, 0, 0, 0]


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernels under the interpreter

TRITON_CASES = [
    # (t, k, e, block_m, skew): T*k not a multiple of block_m; several 128-route blocks; E = 1
    (1, 1, 1, 1, False), (1, 8, 256, 64, False), (7, 2, 8, 16, False), (100, 3, 16, 8, True),
    (65, 8, 64, 32, False), (45, 4, 512, 128, True), (33, 1, 2, 1, False), (300, 2, 3, 4, True),
]


@INTERPRETER
@pytest.mark.parametrize("t,k,e,bm,skew", TRITON_CASES)
def test_triton_interpreter_vs_reference(t, k, e, bm, skew):
    ids = _random_ids(t, k, e, t + e, skew)
    _assert_equal(_triton(ids, e, bm), ref.moe_dispatch(ids.numpy(), e, bm), "T=%d k=%d E=%d m=%d" % (t, k, e, bm))
    _assert_equal(_triton(ids.long(), e, bm), ref.moe_dispatch(ids.numpy(), e, bm), "int64 ids")


@INTERPRETER
@pytest.mark.parametrize("t,k,e,bm,mapped", [(1, 8, 256, 16, False), (16, 8, 128, 16, True), (1, 1, 1, 1, False),
                                             (5, 6, 64, 64, True), (16, 1, 1024, 16, False), (9, 2, 8, 1, True)])
def test_triton_interpreter_one_program_dispatch_matches_the_three_kernels(monkeypatch, t, k, e, bm, mapped):
    """The one-program dispatch (up to 128 routes: decode) against the reference and against the
    histogram / scan / scatter kernels on the same ids, with and without an expert map."""
    from fray_triton import moe as tmoe
    assert tmoe.small_dispatch(t * k, e)
    ids = _random_ids(t, k, e + 4 if mapped else e, t + e)
    emap = None
    if mapped:  # e local experts among e + 4 global ones, in a shuffled order
        emap = torch.full((e + 4,), -1, dtype=torch.int32)
        emap[torch.randperm(e + 4, generator=torch.Generator().manual_seed(e))[:e]] = torch.arange(e, dtype=torch.int32)
    expected = ref.moe_dispatch(ids.numpy(), e, bm, None if emap is None else emap.numpy())
    small = _triton(ids, e, bm, emap)
    _assert_equal(small, expected, "one program T=%d k=%d E=%d m=%d" % (t, k, e, bm))
    monkeypatch.setattr(tmoe, "small_dispatch", lambda n, x: False)
    _assert_equal(_triton(ids, e, bm, emap), [a.numpy() for a in small], "three kernels")


@INTERPRETER
@pytest.mark.parametrize("t,k,e", [(5, 2, 8), (100, 3, 16)])  # the one-program and the three-kernel path
def test_route_positions_get_the_inverse_as_int64(t, k, e):
    """The seed's route_positions buffer: the inverse map as int64 (-1 for a dropped route) in the
    caller's buffer; the returned dispatch is unchanged; numpy and CPU tensors fill it too."""
    from fray_triton import moe as tmoe
    ids = _random_ids(t, k, e + 2, t)
    emap = torch.full((e + 2,), -1, dtype=torch.int32)
    emap[:e] = torch.arange(e - 1, -1, -1, dtype=torch.int32)  # two experts elsewhere
    outs = moe._dispatch_outputs(ids, e, 16)
    pos = torch.full((t * k,), -99, dtype=torch.int64)
    tmoe.dispatch(ids, emap, e, 16, *outs, positions=pos)
    expected = ref.moe_dispatch(ids.numpy(), e, 16, emap.numpy())
    _assert_equal(outs[:6], expected, "with positions")
    assert pos.tolist() == expected[4].tolist() and (pos == -1).any()
    cpu = torch.full((t * k,), -99, dtype=torch.int64)
    assert torch.equal(fray.moe_dispatch(ids, e, 16, expert_map=emap, route_positions=cpu).inverse.long(), cpu)
    arr = np.full(t * k, -99, np.int64)
    d = fray.moe_dispatch(ids.numpy(), e, 16, expert_map=emap.numpy(), route_positions=arr)
    assert arr.tolist() == d.inverse.tolist() == expected[4].tolist()


def test_route_positions_errors_name_the_argument():
    ids = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(TypeError, match="route_positions: expected dtype int64, got int32"):
        fray.moe_dispatch(ids, 8, 16, route_positions=torch.empty(8, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"route_positions: expected shape \(8,\) \(T \* k\), got \(7,\)"):
        fray.moe_dispatch(ids, 8, 16, route_positions=torch.empty(7, dtype=torch.int64))
    with pytest.raises(ValueError, match="route_positions: expected a contiguous buffer"):
        fray.moe_dispatch(ids, 8, 16, route_positions=torch.empty(16, dtype=torch.int64)[::2])
    with pytest.raises(TypeError, match="route_positions: expected a torch.Tensor like topk_ids"):
        fray.moe_dispatch(ids, 8, 16, route_positions=np.empty(8, np.int64))
    with pytest.raises(TypeError, match="route_positions: expected a numpy.ndarray like topk_ids"):
        fray.moe_dispatch(ids.numpy(), 8, 16, route_positions=torch.empty(8, dtype=torch.int64))


@INTERPRETER
def test_triton_interpreter_all_routes_to_one_expert_and_empty_experts():
    ids = torch.full((200, 2), 5, dtype=torch.int32)  # 400 routes, 4 blocks, one expert
    got = _triton(ids, 8, 16)
    _assert_equal(got, _brute(ids, 8, 16), "all to expert 5")
    assert got[2][:25].tolist() == [5] * 25 and got[3].item() == 25
    ids = torch.tensor([[7]], dtype=torch.int32)  # T = 1: one route to the last expert
    _assert_equal(_triton(ids, 8, 4), _brute(ids, 8, 4), "T=1")


@INTERPRETER
@pytest.mark.parametrize("elems", [16, 32, 64])
def test_triton_interpreter_scan_chunks(monkeypatch, elems):
    """The scan's prefix sum over the [blocks, E] counts, a few blocks a step: chunks of 1, 2 and
    4 blocks over 8 blocks and a partial one (1000 routes of 128 a block), with and without a map."""
    from fray_triton import moe as tmoe
    monkeypatch.setattr(tmoe, "SCAN_ELEMS", elems)
    for skew in (False, True):
        ids = _random_ids(500, 2, 16, elems, skew)
        _assert_equal(_triton(ids, 16, 16), ref.moe_dispatch(ids.numpy(), 16, 16), "chunk %d" % (elems // 16))
    emap = torch.tensor([(i // 2) if i % 2 else -1 for i in range(16)], dtype=torch.int32)
    _assert_equal(_triton(ids, 8, 32, emap), ref.moe_dispatch(ids.numpy(), 8, 32, emap.numpy()), "map")


@INTERPRETER
def test_triton_interpreter_expert_map():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 32, (90, 3), generator=g, dtype=torch.int32)
    # this rank: global experts 8..15 in reverse as local 0..7, one of them (12) absent from ids
    ids[ids == 12] = 13
    emap = torch.full((32,), -1, dtype=torch.int32)
    emap[8:16] = torch.arange(7, -1, -1, dtype=torch.int32)
    got = _triton(ids, 8, 4, emap)
    _assert_equal(got, _brute(ids, 8, 4, emap.numpy()), "expert_map")
    assert (got[4] == -1).sum() == ((ids < 8) | (ids >= 16)).sum() and got[5][3] == 0
    # nothing on this rank
    none = torch.full((32,), -1, dtype=torch.int32)
    got = _triton(ids, 8, 4, none)
    assert got[3].item() == 0 and (got[4] == -1).all() and (got[0] == 270).all() and (got[2] == -1).all()


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    ids = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(TypeError, match="topk_ids: expected dtype int32 or int64, got float32"):
        fray.moe_dispatch(ids.float(), 8, 16)
    with pytest.raises(TypeError, match="topk_ids: expected dtype int32 or int64, got int16"):
        fray.moe_dispatch(ids.short(), 8, 16)
    with pytest.raises(TypeError, match="topk_ids: expected an integer array"):
        fray.moe_dispatch(np.zeros((4, 2)), 8, 16)
    with pytest.raises(TypeError, match="topk_ids: expected a torch.Tensor"):
        fray.moe_dispatch([[0, 1]], 8, 16)
    with pytest.raises(ValueError, match="topk_ids: expected 2 dimensions"):
        fray.moe_dispatch(ids.view(-1), 8, 16)
    with pytest.raises(ValueError, match="topk_ids: expected a contiguous tensor"):
        fray.moe_dispatch(torch.zeros(2, 4, dtype=torch.int32).t(), 8, 16)
    with pytest.raises(ValueError, match=r"num_experts: expected a value in \[1, 4096\]"):
        fray.moe_dispatch(ids, 0, 16)
    with pytest.raises(TypeError, match="num_experts: expected an int"):
        fray.moe_dispatch(ids, 8.0, 16)
    for bad in (3, 48, 100):
        with pytest.raises(ValueError, match="block_m: expected a power of two, got %d" % bad):
            fray.moe_dispatch(ids, 8, bad)
    with pytest.raises(ValueError, match=r"block_m: expected a value in \[1, 1024\]"):
        fray.moe_dispatch(ids, 8, 2048)
    with pytest.raises(TypeError, match="block_m: expected an int"):
        fray.moe_dispatch(ids, 8, True)
    with pytest.raises(TypeError, match="expert_map: expected dtype int32, got int64"):
        fray.moe_dispatch(ids, 8, 16, expert_map=torch.zeros(16, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"expert_map: expected shape \(E_global,\)"):
        fray.moe_dispatch(ids, 8, 16, expert_map=torch.zeros(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"expert_map: expected shape \(E_global,\)"):
        fray.moe_dispatch(ids, 8, 16, expert_map=torch.zeros(0, dtype=torch.int32))
    with pytest.raises(TypeError, match="expert_map: expected a torch.Tensor like topk_ids, got list"):
        fray.moe_dispatch(ids, 8, 16, expert_map=[0, 1])
    with pytest.raises(TypeError, match="expert_map: expected a torch.Tensor like topk_ids, got ndarray"):
        fray.moe_dispatch(ids, 8, 16, expert_map=np.zeros(8, np.int32))
    with pytest.raises(TypeError, match="expert_map: expected a numpy.ndarray like topk_ids"):
        fray.moe_dispatch(ids.numpy(), 8, 16, expert_map=torch.zeros(8, dtype=torch.int32))
    with pytest.raises(TypeError, match="expert_map: expected a tensor on cpu"):
        fray.moe_dispatch(ids, 8, 16, expert_map=torch.zeros(8, dtype=torch.int32, device="meta"))
    # values (checked on the CPU; on the GPU with FRAY_CHECK_INDICES=1)
    with pytest.raises(ValueError, match=r"topk_ids: expected ids in \[0, 8\), got values in \[0, 8\]"):
        fray.moe_dispatch(torch.tensor([[0, 8]], dtype=torch.int32), 8, 16)
    with pytest.raises(ValueError, match=r"topk_ids: expected ids in \[0, 4\) \(the length of expert_map\)"):
        fray.moe_dispatch(torch.tensor([[0, 5]], dtype=torch.int32), 8, 16,
                          expert_map=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"expert_map: expected local ids in \[-1, 8\)"):
        fray.moe_dispatch(ids, 8, 16, expert_map=torch.full((4,), 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="backend: expected one of"):
        fray.moe_dispatch(ids, 8, 16, backend="cutlass")
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.moe_dispatch(ids, 8, 16, backend="triton")


def test_output_sizes_depend_on_shapes_only():
    a = fray.moe_dispatch(np.zeros((10, 2), np.int32), 4, 8)
    b = fray.moe_dispatch(np.arange(20, dtype=np.int32).reshape(10, 2) % 4, 4, 8)
    assert [v.shape for v in a] == [v.shape for v in b] == [(48,), (5,), (6,), (1,), (20,), (4,)]
    assert moe.dispatch_rows(10, 2, 4, 8) == 48


def test_custom_op_is_registered():
    assert hasattr(torch.ops.fray, "moe_dispatch")


# ---------------------------------------------------------------------------------------------
# GPU

GPU_CASES = [(1, 1, 8, 16), (1, 8, 256, 64), (7, 2, 8, 16), (128, 8, 128, 64), (333, 8, 256, 128),
             (4096, 8, 256, 64), (4096, 2, 8, 256), (8192, 8, 128, 16), (1000, 6, 64, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("skew", [False, True])
@pytest.mark.parametrize("t,k,e,bm", GPU_CASES)
def test_gpu_vs_reference(cuda, t, k, e, bm, skew):
    ids = _random_ids(t, k, e, t * 7 + e, skew)
    got = fray.moe_dispatch(ids.to(cuda), e, bm)
    expected = ref.moe_dispatch(ids.numpy(), e, bm)
    _assert_equal(got, expected, "T=%d k=%d E=%d m=%d" % (t, k, e, bm))
    pos = torch.full((t * k,), -99, dtype=torch.int64, device=cuda)
    _assert_equal(fray.moe_dispatch(ids.to(cuda), e, bm, route_positions=pos), expected, "with route_positions")
    assert pos.cpu().tolist() == expected[4].tolist()


@pytest.mark.gpu
def test_gpu_expert_map_and_route_then_dispatch(cuda):
    x, k, kw = moe._recipe_args("deepseek_v3", 2048, torch.bfloat16, cuda)
    _, ids = fray.moe_route(x, k, **kw)
    emap = torch.full((256,), -1, dtype=torch.int32)
    emap[64:96] = torch.arange(32, dtype=torch.int32)  # rank 2 of 8
    got = fray.moe_dispatch(ids, 32, 64, expert_map=emap.to(cuda))
    _assert_equal(got, _brute(ids.cpu(), 32, 64, emap.numpy()), "expert_map")


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph(cuda):
    def f(logits):
        _, ids = fray.moe_route(logits, 8)
        d = fray.moe_dispatch(ids, 128, 64)
        return d.sorted_route_ids, d.tile_expert, d.num_tiles, d.inverse

    x = moe._random_logits(300, 128, torch.bfloat16, cuda)
    got = torch.compile(f, fullgraph=True)(x)
    expected = f(x)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_follows_new_routing(cuda):
    t, k, e, bm = 256, 8, 64, 32
    static = _random_ids(t, k, e, 0).to(cuda)
    emap = torch.arange(e, dtype=torch.int32, device=cuda)
    fray.moe_dispatch(static, e, bm, expert_map=emap)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d = fray.moe_dispatch(static, e, bm, expert_map=emap)
    for seed in range(4):
        new = _random_ids(t, k, e, seed + 1, skew=seed % 2 == 1)
        static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        _assert_equal(d, ref.moe_dispatch(new.numpy(), e, bm), "replay %d" % seed)


@pytest.mark.gpu
def test_gpu_bitwise_deterministic(cuda):
    ids = _random_ids(8192, 8, 256, 5, skew=True).to(cuda)
    first = fray.moe_dispatch(ids, 256, 128)
    for _ in range(5):
        again = fray.moe_dispatch(ids, 256, 128)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.gpu
def test_gpu_check_indices(cuda, monkeypatch):
    monkeypatch.setattr(env, "check_indices", lambda: True)
    with pytest.raises(ValueError, match=r"topk_ids: expected ids in \[0, 8\)"):
        fray.moe_dispatch(torch.tensor([[0, 9]], dtype=torch.int32, device=cuda), 8, 16)
    with pytest.raises(RuntimeError, match="backend='cuda' cannot run moe_dispatch"):
        fray.moe_dispatch(torch.zeros(1, 1, dtype=torch.int32, device=cuda), 8, 16, backend="cuda")


# ---------------------------------------------------------------------------------------------
# CPU: the benchmark's torch composite computes the same metadata (bench/moe's peers)

@pytest.mark.parametrize("t,k,e,bm,skew", TRITON_CASES)
def test_bench_composite_matches_the_reference(t, k, e, bm, skew):
    from fray.bench import moe as bench
    ids = _random_ids(t, k, e, t + e, skew)
    _assert_equal(bench.eager_dispatch(ids, e, bm), ref.moe_dispatch(ids.numpy(), e, bm), "torch composite")


def test_cuda_backend_says_why_it_cannot_run():
    from fray import backend as B
    for op in ("moe_route", "moe_dispatch"):
        assert "no CUDA kernel for %s yet" % op in B.missing_reason(op, "cuda")
    for op in ("grouped_gemm", "routed_grouped_gemm", "fused_moe"):  # the CUTLASS kernel, and the layers on it
        assert B.missing_reason(op, "cuda") is None
    assert "tensors are on cpu" in B.cuda_unavailable_reason("moe", torch.device("cpu"))
    assert fray.CUDA_FAMILY["moe_route"] == fray.CUDA_FAMILY["moe_dispatch"] == "moe"


@INTERPRETER
def test_custom_op_and_plan_under_the_interpreter(monkeypatch):
    import contextlib

    from fray import _plan as P
    from fray import backend as B
    monkeypatch.setattr(B, "resolve", lambda *a: "triton")
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    P.PLANS.clear()
    try:
        ids = _random_ids(50, 4, 32, 9)
        emap = torch.arange(31, -1, -1, dtype=torch.int32)
        emap[::3] = -1
        for _ in range(2):  # the second call launches from the cached plan
            outs = moe._dispatch_outputs(ids, 32, 16)
            torch.ops.fray.moe_dispatch(ids, emap, *outs, None, 32, 16, "auto")
            _assert_equal(outs[:6], _brute(ids, 32, 16, emap.numpy()), "custom op")
        assert len(P.PLANS) == 1
        outs = moe._dispatch_outputs(ids, 32, 16)
        pos = torch.empty(200, dtype=torch.int64)
        torch.library.opcheck(torch.ops.fray.moe_dispatch.default, (ids, None, *outs, pos, 32, 16, "auto"),
                              test_utils=("test_schema", "test_faketensor"))
    finally:
        P.PLANS.clear()


def test_dispatch_kernels_compile_for_sm90a():
    """The dispatch kernels through Triton's compiled path for sm_90a."""
    from fray.testing import compile_triton_sm90, sm90_spec
    from fray_triton import moe as M
    ptrs = {n: "*i32" for n in ("IDS", "MAP", "COUNTS", "BLOCK_COUNTS", "OFFSETS", "TILE_EXPERT", "NUM_TILES",
                                "BLOCK_BASE", "SORTED", "INVERSE")}
    ptrs["POSITIONS"] = "*i64"
    # the scan at 64 experts (128 blocks a step of its prefix sum) and at 4096 (2 a step, 8 warps)
    specs = [sm90_spec("fray_triton.moe", "_scan_kernel", ptrs, dict(BLOCK_M=64, BLOCK_E=e, TILES=M.SCAN_TILES,
                                                                      CHUNK=max(1, min(128, M.SCAN_ELEMS // e))),
                       num_warps=4 if e <= 1024 else 8) for e in (64, 4096)]
    for has_map in (False, True):
        specs += [sm90_spec("fray_triton.moe", "_histogram_kernel", ptrs, dict(HAS_MAP=has_map, BLOCK=M.BLOCK_R)),
                  sm90_spec("fray_triton.moe", "_scatter_kernel", ptrs,
                            dict(HAS_MAP=has_map, HAS_POS=has_map, BLOCK=M.BLOCK_R))]
    # the one-program dispatch at its largest tiles: 128 routes x 128 experts, 16 x 1024
    for has_map in (False, True):
        for block_r, block_e in ((128, 128), (16, 1024), (16, 16)):
            specs.append(sm90_spec("fray_triton.moe", "_dispatch_small_kernel", ptrs,
                                   dict(HAS_MAP=has_map, HAS_POS=not has_map, BLOCK_M=16, BLOCK_R=block_r,
                                        BLOCK_E=block_e,
                                        TILES=M.SCAN_TILES, FILL=1024),
                                   num_warps=4 if block_r * block_e <= 8192 else 8))
    results = compile_triton_sm90(specs)
    assert len(results) == 12
    assert [r["spills"] for r in results[:2]] == [0, 0], "the scan spills registers: %s" % results[:2]
    assert [r["spills"] for r in results[6:]] == [0] * 6, "the one-program dispatch spills: %s" % results[6:]
