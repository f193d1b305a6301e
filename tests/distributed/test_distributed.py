"""fray.distributed: all_reduce_add_rmsnorm and the expert-parallel moe_dispatch / moe_combine.

CPU (CI): gloo process groups of 1, 2 and 4 processes (torch.multiprocessing, spawn, a FileStore
in the test's temporary directory) against the single-process result: the all-reduce + norm
against fray.add_rmsnorm of the ranks' summed x (the float64 reference on the CPU), dispatch's
received rows against the routes computed by hand, and the combine against the per-token sum in
rank order. Data that the all-reduce must sum exactly is made of small dyadic numbers, so the
comparison is bitwise whatever order the library sums in; the experts are elementwise (or exact
integer GEMMs), so a route's result has the same bits whichever rank computes it and the combine
is compared bit for bit. Plus the error contract, in this process on a one-rank group.
GPU (`-m gpu`): the same jobs with NCCL, one process on one GPU (bitwise against fray.add_rmsnorm,
CUDA-graph capture and replay), and with 2 and 4 processes where that many GPUs are visible.
"""
import datetime
import os
import subprocess
import sys
import zlib

import pytest
import torch
import torch.distributed as dist

import fray
import fray.distributed as fd
from fray.testing import spawn_ranks

MULTICAST_VARS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SPAWN_DEADLINE_S = 240  # a hung collective fails the test instead of the whole target's timeout

# ---------------------------------------------------------------------------------------------
# cases (every rank builds every rank's inputs from the same seeds, so each can compute the
# single-process reference itself)

# name: (shape, dtype, weight dtype, weight_offset, exact, strided)
AR_CASES = {
    "bf16": ((5, 64), torch.bfloat16, torch.bfloat16, 0.0, True, False),
    "fp16_3d_gemma": ((2, 3, 40), torch.float16, torch.float32, 1.0, True, False),
    "fp32_one_row": ((1, 8192), torch.float32, torch.float32, 0.0, True, False),
    "bf16_strided": ((6, 48), torch.bfloat16, torch.float32, 0.0, True, True),
    "fp32_random": ((7, 33), torch.float32, torch.float32, 0.0, False, False),
}
AR_CASES_GPU = dict(AR_CASES, **{
    "bf16_128x8192": ((128, 8192), torch.bfloat16, torch.bfloat16, 0.0, True, False),
    "fp16_7x4097": ((7, 4097), torch.float16, torch.float16, 0.0, True, False),
})
EPS = 1e-6


def _seed(name):
    # not hash(): string hashes differ from process to process, and every rank must build the same data
    return zlib.crc32(name.encode()) % 1000


def _ar_inputs(name, world, device, seed_offset=0):
    shape, dtype, wdtype, offset, exact, strided = AR_CASES_GPU[name]
    g = torch.Generator().manual_seed(_seed(name) + seed_offset)
    xs = []
    for _ in range(world):
        if exact:  # multiples of 1/8 in [-1/2, 1/2]: any sum of 4 is exact in bf16
            v = torch.randint(-4, 5, shape, generator=g).to(torch.float32) / 8
        else:
            v = torch.randn(shape, generator=g)
        if strided:
            wide = torch.zeros(shape[:-1] + (shape[-1] + 16,), dtype=dtype, device=device)
            wide[..., :shape[-1]] = v.to(dtype)
            xs.append(wide[..., :shape[-1]])
        else:
            xs.append(v.to(dtype).to(device))
    residual = torch.randn(shape, generator=g).to(dtype).to(device)
    weight = torch.randn(shape[-1:], generator=g).to(wdtype).to(device)
    return xs, residual, weight, offset, exact


def _ranks_sum(xs):
    total = xs[0].float()
    for x in xs[1:]:
        total = total + x.float()
    return total.to(xs[0].dtype)


def _job_all_reduce(rank, world, device, cases):
    out = {}
    for name in cases:
        xs, residual, weight, offset, exact = _ar_inputs(name, world, device)
        x = xs[rank]
        before = x.clone()
        y, s = fd.all_reduce_add_rmsnorm(x, residual, weight, EPS, weight_offset=offset)
        want_y, want_s = fray.add_rmsnorm(_ranks_sum(xs), residual, weight, EPS, weight_offset=offset)
        out[name] = dict(y=y, s=s, want_y=want_y, want_s=want_s, exact=exact, dtype=x.dtype,
                         x_unchanged=torch.equal(x, before), sum_f64=sum(v.double() for v in xs) + residual.double())
    return out


def _job_graph(rank, world, device):
    """all_reduce_add_rmsnorm captured in a CUDA graph, replayed on new data."""
    xs, residual, weight, _, _ = _ar_inputs("bf16_128x8192", world, device)
    x, r = xs[rank].clone(), residual.clone()
    fd.all_reduce_add_rmsnorm(x, r, weight, EPS)  # warm-up: NCCL communicator and launch plan
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fd.all_reduce_add_rmsnorm(x, r, weight, EPS)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, s = fd.all_reduce_add_rmsnorm(x, r, weight, EPS)
    new_xs, new_r, _, _, _ = _ar_inputs("bf16_128x8192", world, device, seed_offset=1)
    results = []
    for data, res in ((xs, residual), (new_xs, new_r)):
        x.copy_(data[rank])
        r.copy_(res)
        graph.replay()
        torch.cuda.synchronize()
        want_y, want_s = fray.add_rmsnorm(_ranks_sum(data), res, weight, EPS)
        results.append(dict(y=y.clone(), s=s.clone(), want_y=want_y, want_s=want_s))
    return results


# name: (num_experts, top_k, tokens per rank (indexed by rank % 4), dtype, id dtype, expert, allowed experts)
# allowed: "all", "no3_6" (experts 3 and 6 get nothing), "rank0" / "last" (only the first / last
# rank's experts: the other ranks receive nothing)
MOE_CASES = {
    "mixed": (8, 2, (5, 3, 1, 4), torch.bfloat16, torch.int32, "diag", "no3_6"),
    "k4_dense_int64": (8, 4, (6, 1, 2, 3), torch.float32, torch.int64, "dense", "all"),
    # fp32 sums of 3+ random terms: any order but rank order 0..k-1 changes the bits
    "k4_diag_fp32": (8, 4, (6, 5, 7, 4), torch.float32, torch.int32, "diag", "all"),
    "skewed_rank0": (8, 2, (4, 2, 3, 1), torch.float16, torch.int32, "identity", "rank0"),
    "skewed_last": (8, 2, (2, 5, 1, 3), torch.bfloat16, torch.int64, "diag", "last"),
    "k1_empty_rank": (4, 1, (1, 0, 3, 2), torch.bfloat16, torch.int32, "identity", "all"),
}
HIDDEN = 32


def _moe_inputs(name, world, device):
    e, k, tokens, dtype, id_dtype, kind, allowed = MOE_CASES[name]
    g = torch.Generator().manual_seed(1000 + _seed(name))
    local = e // world
    pool = {"all": list(range(e)), "no3_6": [i for i in range(e) if i not in (3, 6)],
            "rank0": list(range(local)), "last": list(range(e - local, e))}[allowed]
    hidden = 16 if kind == "dense" else HIDDEN
    ranks = []
    for r in range(world):
        t = tokens[r % 4]
        if kind == "dense":  # small integers: every product and sum exact in fp32
            x = torch.randint(-3, 4, (t, hidden), generator=g).to(dtype)
            w = torch.randint(1, 5, (t, k), generator=g).to(torch.float32) / 4
        else:
            x = torch.randn(t, hidden, generator=g).to(dtype)
            w = torch.rand(t, k, generator=g)
        ids = torch.stack([torch.tensor(pool)[torch.randperm(len(pool), generator=g)[:k]] for _ in range(t)]) \
            if t else torch.empty(0, k, dtype=torch.int64)
        ranks.append((x.to(device), ids.to(id_dtype).to(device), w.to(device)))
    params = dict(a=torch.randn(e, hidden, generator=g).to(device), b=torch.randn(e, hidden, generator=g).to(device),
                  m=torch.randint(-2, 3, (e, hidden, hidden), generator=g).to(torch.float32).to(device))
    return ranks, params, kind, e, k


def _expert(kind, params, x, expert, w):
    """Each row's expert applied, then its weight (one rounding to x's dtype after each, as
    fray.fused_moe rounds): elementwise or exact, so the bits do not depend on the batch."""
    if kind == "identity":
        h = x
    elif kind == "diag":
        h = (x.float() * params["a"][expert] + params["b"][expert]).to(x.dtype)
    else:
        h = torch.bmm(x.double()[:, None, :], params["m"][expert].double())[:, 0].to(x.dtype)
    return (h.float() * w[:, None]).to(x.dtype)


def _local_params(params, rank, local):
    return {key: v[rank * local:(rank + 1) * local] for key, v in params.items()}


def _route_reference(kind, params, x, ids, w):
    """[T, H]: every route's expert result summed per token in rank order, in fp32."""
    t, k = ids.shape
    y = _expert(kind, params, x.repeat_interleave(k, 0), ids.reshape(-1).long(), w.reshape(-1))
    acc = torch.zeros(t, x.shape[1], dtype=torch.float32, device=x.device)
    for j in range(k):
        acc += y.view(t, k, x.shape[1])[:, j].float()
    return acc.to(x.dtype)


def _job_moe(rank, world, device):
    out = {}
    for name in MOE_CASES:
        ranks, params, kind, e, k = _moe_inputs(name, world, device)
        x, ids, w = ranks[rank]
        local = e // world
        recv_x, recv_ids, recv_w, handle = fd.moe_dispatch(x, ids, w, e)
        # The user's part: this rank's experts, addressed by local id through expert_map.
        emap = fd.expert_map(e, rank, world, device=device)
        local_ids = emap[recv_ids.long()]
        y = _expert(kind, _local_params(params, rank, local), recv_x, local_ids.long(), recv_w)
        combined = fd.moe_combine(y, handle)
        # What this rank must have received: each source's routes to it, source by source, in
        # route order.
        want_x, want_ids, want_w = [], [], []
        for sx, sids, sw in ranks:
            flat = sids.reshape(-1).long()
            sel = torch.nonzero(flat // local == rank).reshape(-1)
            want_x.append(sx[sel // k])
            want_ids.append(flat[sel].to(torch.int32))
            want_w.append(sw.reshape(-1)[sel])
        out[name] = dict(
            recv_x=recv_x, recv_ids=recv_ids, recv_w=recv_w, local_ids=local_ids,
            want_x=torch.cat(want_x), want_ids=torch.cat(want_ids), want_w=torch.cat(want_w),
            out=combined, want=_route_reference(kind, params, x, ids, w), kind=kind,
            want_f64=(x.double()[:, None, :] * w.double()[:, :, None]).sum(1), dtype=x.dtype)
    return out


def _job_errors(rank, world, device):
    """Needs world >= 2: one rank's bad ids make every rank raise, and the group stays in step."""
    out = {}
    x = torch.randn(3, HIDDEN, device=device).to(torch.bfloat16)
    w = torch.rand(3, 2, device=device)
    ids = torch.tensor([[0, 1], [2, 3], [1, 0]], dtype=torch.int32, device=device)
    bad = ids.clone()
    if rank == 1:
        bad[2, 1] = 8
    try:
        fd.moe_dispatch(x, bad, w, 8)
        out["bad_ids"] = None
    except Exception as exc:  # the test asserts on type and message
        out["bad_ids"] = (type(exc).__name__, str(exc))
    try:
        fd.moe_dispatch(x, ids, w, 3)
        out["indivisible"] = None
    except Exception as exc:  # the test asserts on type and message
        out["indivisible"] = (type(exc).__name__, str(exc))
    # A valid round trip after the refusals: no rank is a collective behind.
    recv_x, recv_ids, recv_w, handle = fd.moe_dispatch(x, ids, w, 8)
    out["after"] = torch.equal(fd.moe_combine((recv_x.float() * recv_w[:, None]).to(recv_x.dtype), handle),
                               _route_reference("identity", None, x, ids, w))
    return out


def _worker(rank, world, store_path, out_dir, backend, jobs):
    # Spawned children start with the parent's os.environ: the multicast variables fray.distributed
    # set in the parent must be there before this child imports anything distributed.
    inherited = {name: os.environ.get(name) for name in MULTICAST_VARS}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        results = {"env": inherited, "rank": rank}
        for job in jobs:
            if job == "all_reduce":
                results[job] = _job_all_reduce(rank, world, device, AR_CASES_GPU if backend == "nccl" else AR_CASES)
            else:
                results[job] = {"moe": _job_moe, "errors": _job_errors, "graph": _job_graph}[job](rank, world, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        torch.save(_to_cpu(results), os.path.join(out_dir, "rank%d.pt" % rank))
    finally:
        dist.destroy_process_group()


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


_RESULTS = {}


def _run(world, backend, jobs):
    """Every rank's results of `jobs` in a fresh group of `world` processes (cached per call)."""
    key = (world, backend, tuple(jobs))
    if key in _RESULTS:
        return _RESULTS[key]
    _RESULTS[key] = spawn_ranks(_worker, world, (backend, list(jobs)), SPAWN_DEADLINE_S,
                                "%s group running %s" % (backend, jobs))
    return _RESULTS[key]


def _exact(got, want, what):
    assert got.dtype == want.dtype, "%s: dtype %s, expected %s" % (what, got.dtype, want.dtype)
    assert got.shape == want.shape, "%s: shape %s, expected %s" % (what, tuple(got.shape), tuple(want.shape))
    diff = (got.double() - want.double()).abs()
    assert torch.equal(got.view(-1).view(torch.uint8) if got.numel() else got,
                       want.view(-1).view(torch.uint8) if want.numel() else want), \
        "%s: not bit-identical (%d of %d differ, worst by %g)" % (what, int((diff != 0).sum()), got.numel(),
                                                                float(diff.max()) if diff.numel() else 0.0)


# ---------------------------------------------------------------------------------------------
# checks shared by the CPU and GPU tests

def _check_all_reduce(results, cases):
    for name in cases:
        rank0 = results[0]["all_reduce"][name]
        for rank, res in enumerate(results):
            r = res["all_reduce"][name]
            what = "%s rank %d/%d" % (name, rank, len(results))
            assert r["x_unchanged"], "%s: x was modified" % what
            if r["exact"]:
                _exact(r["s"], r["want_s"], what + " (sum)")
                _exact(r["y"], r["want_y"], what + " (normed)")
            else:  # the library's summation order is its own: within fp32 rounding of the sum
                torch.testing.assert_close(r["s"].double(), r["sum_f64"], rtol=1e-6, atol=1e-6)
                torch.testing.assert_close(r["y"], r["want_y"], rtol=1e-5, atol=1e-5)
            # every rank ends with the same bits (a TP layer's replicas must not drift)
            _exact(r["y"], rank0["y"], what + " vs rank 0 (normed)")
            _exact(r["s"], rank0["s"], what + " vs rank 0 (sum)")


def _check_moe(results):
    world = len(results)
    for name in MOE_CASES:
        e = MOE_CASES[name][0]
        received = 0
        for rank, res in enumerate(results):
            r = res["moe"][name]
            what = "%s rank %d/%d" % (name, rank, world)
            _exact(r["recv_x"], r["want_x"], what + " (received rows)")
            _exact(r["recv_ids"], r["want_ids"], what + " (received ids)")
            _exact(r["recv_w"], r["want_w"], what + " (received weights)")
            local = r["local_ids"]
            assert ((local >= 0) & (local < e // world)).all(), "%s: a received id is not this rank's" % what
            _exact(r["out"], r["want"], what + " (combined)")
            if r["kind"] == "identity":  # not circular: sum_j w_tj * x_t in float64
                tol = {torch.bfloat16: 2 ** -6, torch.float16: 2 ** -9}[r["dtype"]]
                torch.testing.assert_close(r["out"].double(), r["want_f64"], rtol=tol, atol=tol)
            received += r["recv_x"].shape[0]
        e, k, tokens = MOE_CASES[name][:3]
        assert received == k * sum(tokens[r % 4] for r in range(world)), "%s: routes lost or duplicated" % name
        if name.startswith("skewed") and world > 1:
            idle = range(1, world) if name == "skewed_rank0" else range(world - 1)
            assert all(results[r]["moe"][name]["recv_x"].shape[0] == 0 for r in idle), \
                "%s: ranks holding none of the chosen experts received rows" % name


def _check_errors(results):
    for rank, res in enumerate(results):
        kind, msg = res["errors"]["bad_ids"]
        assert kind == "ValueError" and msg.startswith("topk_ids:"), (rank, kind, msg)
        assert ("[0, 8]" in msg) if rank == 1 else ("rank(s) [1]" in msg), (rank, msg)
        kind, msg = res["errors"]["indivisible"]
        assert kind == "ValueError" and msg.startswith("num_experts:"), (rank, kind, msg)
        assert res["errors"]["after"], "rank %d: the round trip after the refusals went wrong" % rank


# ---------------------------------------------------------------------------------------------
# CPU: gloo

@pytest.mark.parametrize("world", [1, 2, 4])
def test_all_reduce_add_rmsnorm_gloo(world):
    results = _run(world, "gloo", ["all_reduce", "moe"] + (["errors"] if world == 2 else []))
    _check_all_reduce(results, AR_CASES)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_moe_dispatch_combine_gloo(world):
    results = _run(world, "gloo", ["all_reduce", "moe"] + (["errors"] if world == 2 else []))
    _check_moe(results)


def test_bad_ids_refused_on_every_rank_gloo():
    _check_errors(_run(2, "gloo", ["all_reduce", "moe", "errors"]))


def test_children_inherit_the_multicast_switches():
    for name, value in MULTICAST_VARS.items():
        assert os.environ.get(name) == value, "%s=%r after import fray.distributed" % (name, os.environ.get(name))
    for res in _run(2, "gloo", ["all_reduce", "moe", "errors"]):
        assert res["env"] == MULTICAST_VARS, res["env"]


def test_import_fray_sets_nothing():
    # fray.distributed sets environment variables at import; `import fray` must not import it.
    env = {k: v for k, v in os.environ.items() if k not in MULTICAST_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    code = ("import os, sys, fray; print('fray.distributed' in sys.modules, "
            "[n for n in %r if n in os.environ])" % (sorted(MULTICAST_VARS),))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False []", out.stdout


@pytest.fixture
def group1(tmp_path):
    """A one-process gloo group in this process (torn down after the test)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_expert_map():
    assert fd.expert_map(8, 2, 4).tolist() == [-1, -1, -1, -1, 0, 1, -1, -1]
    assert fd.expert_map(3, 0, 1).tolist() == [0, 1, 2]
    assert fd.expert_map(8, 1, 2).dtype == torch.int32
    with pytest.raises(ValueError, match="^num_experts: .*multiple of world_size"):
        fd.expert_map(6, 0, 4)
    with pytest.raises(ValueError, match="^rank: "):
        fd.expert_map(8, 4, 4)
    with pytest.raises(ValueError, match="^world_size: "):
        fd.expert_map(8, 0, 0)
    with pytest.raises(TypeError, match="^num_experts: "):
        fd.expert_map(True, 0, 1)


def test_not_initialised():
    assert not dist.is_initialized()
    x = torch.ones(2, 8)
    with pytest.raises(RuntimeError, match="^group: .*not initialised"):
        fd.all_reduce_add_rmsnorm(x, x, torch.ones(8))
    with pytest.raises(RuntimeError, match="^group: "):
        fd.moe_dispatch(x, torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, 1), 4)


def test_world_size_one_in_process(group1):
    x = torch.randn(3, 40).to(torch.bfloat16)
    r = torch.randn(3, 40).to(torch.bfloat16)
    w = torch.randn(40)
    y, s = fd.all_reduce_add_rmsnorm(x, r, w, 1e-5, backend="nccl")
    want_y, want_s = fray.add_rmsnorm(x, r, w, 1e-5)
    _exact(y, want_y, "normed")
    _exact(s, want_s, "sum")
    ids = torch.tensor([[3, 0], [1, 3], [2, 2]])
    wts = torch.rand(3, 2)
    recv_x, recv_ids, recv_w, handle = fd.moe_dispatch(x, ids, wts, 4)
    assert recv_ids.tolist() == [3, 0, 1, 3, 2, 2] and recv_ids.dtype == torch.int32
    _exact(recv_w, wts.reshape(-1), "weights")
    out = fd.moe_combine((recv_x.float() * recv_w[:, None]).to(x.dtype), handle)
    _exact(out, _route_reference("identity", None, x, ids, wts), "combined")


def test_all_reduce_add_rmsnorm_errors(group1):
    x = torch.randn(4, 16).to(torch.bfloat16)
    r, w = x.clone(), torch.ones(16, dtype=torch.bfloat16)
    cases = [
        (TypeError, "x", dict(x=x.to(torch.int32))),
        (TypeError, "x", dict(x=x.float().numpy())),
        (TypeError, "x", dict(x=[[1.0] * 16])),
        (ValueError, "residual", dict(residual=r[:3])),
        (TypeError, "residual", dict(residual=r.half())),
        (TypeError, "residual", dict(residual=None)),
        (ValueError, "weight", dict(weight=w[:8])),
        (TypeError, "weight", dict(weight=w.half())),
        (ValueError, "eps", dict(eps=-1.0)),
        (TypeError, "eps", dict(eps="1e-6")),
        (ValueError, "weight_offset", dict(weight_offset=float("nan"))),
        (ValueError, "backend", dict(backend="symm_mem")),
        (ValueError, "backend", dict(backend="cuda")),
        (TypeError, "group", dict(group="world")),
    ]
    for exc, name, change in cases:
        kw = dict(x=x, residual=r, weight=w)
        kw.update(change)
        with pytest.raises(exc, match="^%s: " % name):
            fd.all_reduce_add_rmsnorm(**kw)


def test_moe_dispatch_combine_errors(group1):
    x = torch.randn(3, 16).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 3], [1, 0]], dtype=torch.int32)
    w = torch.rand(3, 2)
    cases = [
        (TypeError, "x", dict(x=x.to(torch.int32))),
        (TypeError, "x", dict(x=x.float().numpy())),
        (ValueError, "x", dict(x=x[0])),
        (TypeError, "topk_ids", dict(topk_ids=ids.float())),
        (ValueError, "topk_ids", dict(topk_ids=torch.cat([ids, ids]))),
        (ValueError, "topk_ids", dict(topk_ids=ids[:, :0], topk_weights=w[:, :0])),
        (ValueError, "topk_ids", dict(topk_ids=ids.reshape(-1))),
        (ValueError, "topk_ids", dict(topk_ids=ids + 4)),          # ids past E, caught at the exchange
        (ValueError, "topk_ids", dict(topk_ids=ids - 1)),
        (TypeError, "topk_weights", dict(topk_weights=w.to(torch.bfloat16))),
        (ValueError, "topk_weights", dict(topk_weights=w[:, :1])),
        (ValueError, "num_experts", dict(num_experts=0)),
        (TypeError, "num_experts", dict(num_experts=4.0)),
        (TypeError, "group", dict(group=0)),
    ]
    for exc, name, change in cases:
        kw = dict(x=x, topk_ids=ids, topk_weights=w, num_experts=4)
        kw.update(change)
        with pytest.raises(exc, match="^%s: " % name):
            fd.moe_dispatch(**kw)
    recv_x, _, recv_w, handle = fd.moe_dispatch(x, ids, w, 4)
    y = recv_x
    with pytest.raises(TypeError, match="^handle: "):
        fd.moe_combine(y, tuple(handle))
    with pytest.raises(ValueError, match="^y: "):
        fd.moe_combine(y[1:], handle)
    with pytest.raises(TypeError, match="^y: "):
        fd.moe_combine(y.to(torch.int32), handle)
    with pytest.raises(ValueError, match="^group: "):
        fd.moe_combine(y, handle, group=dist.group.WORLD)


def test_strided_x_is_the_dense_result(group1):
    wide = torch.randn(5, 64).to(torch.float16)
    x, r, w = wide[:, :40], torch.randn(5, 40).to(torch.float16), torch.randn(40).to(torch.float16)
    y, s = fd.all_reduce_add_rmsnorm(x, r, w)
    want_y, want_s = fd.all_reduce_add_rmsnorm(x.contiguous(), r, w)
    _exact(y, want_y, "normed")
    _exact(s, want_s, "sum")
    recv_x, _, _, _ = fd.moe_dispatch(x, torch.tensor([[1], [0], [1], [1], [0]]), torch.ones(5, 1), 2)
    _exact(recv_x, x.contiguous(), "received rows")


def _load_bench():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_all_reduce_add_rmsnorm",
                                                  "bench/distributed/all_reduce_add_rmsnorm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_rows_compute_the_same_thing(group1):
    """The benchmark's rows on a one-rank gloo group: every peer returns what fray does, and run()
    records the documented shapes, rows and bytes (fake timers; the GPU gives the real ones)."""
    from fray.bench import Recorder
    bench = _load_bench()
    assert [s[0] for s in bench.SHAPES] == [1, 16, 128, 1024, 8192] and {s[1] for s in bench.SHAPES} == {8192}
    x, r = torch.randn(3, 64).to(torch.bfloat16), torch.randn(3, 64).to(torch.bfloat16)
    w = torch.randn(64).to(torch.bfloat16)
    want_y, want_s = fray.add_rmsnorm(x, r, w, bench.EPS)
    rows = bench.impls(x, r, w)
    for (op, impl), fn in rows.items():
        if op == "all_reduce":
            _exact(fn(), x, impl)
            continue
        y, s = fn()
        _exact(s, want_s, impl + " (sum)")
        torch.testing.assert_close(y, want_y, rtol=2 ** -7, atol=1e-5)
    for us, graph_rows in ((100.0, False), (10.0, True)):
        rec = Recorder(None)
        bench.run(rec, shapes=[(3, 64, torch.bfloat16)], graph=True, timer=lambda fn: us,
                  graph_timer=lambda fn: us / 2, device=torch.device("cpu"))
        got = {(d["op"], d["impl"], d["shape"]) for d in rec.records}
        plain = {(op, impl, "3x64:w1") for op, impl in rows}
        assert got == (plain | {(o, i, s + ":graph") for o, i, s in plain} if graph_rows else plain), got
        assert all(d["world_size"] == 1 and d["gbps"] == round(3 * 64 * 2 / d["us"] / 1e3, 1) for d in rec.records)


# ---------------------------------------------------------------------------------------------
# GPU: NCCL, one process per GPU

def _need_gpus(n):
    assert torch.cuda.is_available(), "GPU test selected (-m gpu) but torch sees no CUDA device"
    if torch.cuda.device_count() < n:
        pytest.skip("needs %d GPUs, %d visible" % (n, torch.cuda.device_count()))


@pytest.mark.gpu
def test_gpu_world_one_nccl():
    _need_gpus(1)
    results = _run(1, "nccl", ["all_reduce", "moe", "graph"])
    _check_all_reduce(results, AR_CASES_GPU)
    _check_moe(results)
    for i, replay in enumerate(results[0]["graph"]):
        _exact(replay["s"], replay["want_s"], "graph replay %d (sum)" % i)
        _exact(replay["y"], replay["want_y"], "graph replay %d (normed)" % i)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_gpu_multi_process_nccl(world):
    _need_gpus(world)
    jobs = ["all_reduce", "moe", "graph"] + (["errors"] if world == 2 else [])
    results = _run(world, "nccl", jobs)
    _check_all_reduce(results, AR_CASES_GPU)
    _check_moe(results)
    for res in results:
        for i, replay in enumerate(res["graph"]):
            _exact(replay["s"], replay["want_s"], "rank %d graph replay %d (sum)" % (res["rank"], i))
            _exact(replay["y"], replay["want_y"], "rank %d graph replay %d (normed)" % (res["rank"], i))
    if world == 2:
        _check_errors(results)
