"""Fray under torch.distributed: tensor-parallel all-reduce + add + RMSNorm, expert-parallel MoE.

One process per GPU, any torch.distributed backend (NCCL on GPUs; gloo runs the same code on CPU
tensors, which is how CI tests it). Nothing here keeps state across calls or keys anything to
device 0: every tensor is made on the device of the caller's inputs and every collective takes the
caller's `group` (None: the default group).

all_reduce_add_rmsnorm(x, residual, weight, eps, group)
    The all-reduce of a row-parallel layer's partial output x over the tensor-parallel group,
    then the fused residual add + RMSNorm (the fusion vLLM, TensorRT-LLM and FlashInfer make).
    Returns (rmsnorm(sum + residual), sum + residual) as fray.add_rmsnorm does. Only one path is
    built: "nccl" (the group's own all-reduce on a copy of x, then fray.add_rmsnorm); "auto" picks
    it. A one-shot all-reduce through symmetric memory (torch.distributed._symmetric_memory) fused
    with the norm would win at small token counts, but which sizes it wins at has to be measured
    on several GPUs, and none were available when this was written; `_choose_path` is where that
    measured choice goes and `_PATHS` where the path registers. No multicast (multimem) variant is
    ever to be added (see below). Under CUDA-graph capture after one warm-up call (the NCCL
    communicator and Fray's launch plan exist by then); no host synchronisation.

moe_dispatch(x, topk_ids, topk_weights, num_experts, group) / moe_combine(y, handle, group)
    Expert parallelism over all_to_all_single. Experts are split evenly and contiguously: group
    rank r holds global experts [r*E/W, (r+1)*E/W) (expert_map(E, r, W) is its global -> local
    map). dispatch sends every route (token t, rank j: route t*k + j) to the rank holding its
    expert, with its token row, global expert id and weight; the receiver runs its experts on the
    received rows (weighting each by its received weight, e.g. fray.fused_moe with
    topk_ids=recv_ids[:, None], topk_weights=recv_weights[:, None], expert_map=expert_map(...)),
    and combine sends the results back and sums each token's routes in fp32 in rank order
    0..k-1, so the result is the same bits run to run and equals the single-process staged
    combine. Neither is CUDA-graph capturable: see "the one host synchronisation".

The one host synchronisation. all_to_all_single with uneven splits takes its split sizes as
Python lists, so the per-rank counts, exchanged on the device, must reach the host once per
dispatch (combine reuses them). That is inherent to all_to_all_single with uneven splits; a
capturable dispatch needs fixed-capacity buffers or a device-initiated all-to-all, which this module
does not have. The same transfer carries every rank's smallest and largest expert id, so
out-of-range ids are refused on every rank alike (ValueError naming topk_ids, never a hang of
the ranks whose ids were fine) at no extra cost: unlike the single-GPU MoE ops, dispatch checks
its ids whether or not FRAY_CHECK_INDICES is set. Ids are otherwise trusted on the device (the
sort and the counts never index memory with them).

NVLink multicast stays off. Importing this module sets NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 in os.environ unless the caller
set them already: a program that uses NVLink multicast (NVLS) can put a host's GPUs, shared by
others, out of service for a long time, so Fray never does, and neither does the NCCL / PyTorch /
NVSHMEM stack underneath it. They are set in os.environ rather than passed along so that child
processes (torch.multiprocessing, subprocesses, torchrun's workers started from this process)
inherit them, and at import rather than per call because NCCL reads its variable when a
communicator is created: import fray.distributed before the first collective. fray/__init__.py
does not import this module, so `import fray` changes no environment.
"""
import os

# Before torch.distributed initialises anything (see the module docstring: why, and why here).
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

from typing import Any, List, NamedTuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from fray import _validate as V  # noqa: E402
from fray.ops import norm as _norm  # noqa: E402

__all__ = ["all_reduce_add_rmsnorm", "moe_dispatch", "moe_combine", "expert_map", "MoeEpHandle"]

BACKENDS = ("auto", "nccl")
_INTS = (int, np.integer)
_INT32_MAX = 2 ** 31 - 1


# ---------------------------------------------------------------------------------------------
# process groups

def _group_info(group):
    """(rank in group, world size, backend name) of `group` (None: the default group)."""
    if not dist.is_available():
        raise RuntimeError("group: this torch build has no torch.distributed")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError("group: expected a torch.distributed.ProcessGroup or None, got %s" % type(group).__name__)
    if not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialised (call torch.distributed."
                           "init_process_group first; one process per GPU)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the group it was given")
    return rank, dist.get_world_size(group), str(dist.get_backend(group))


def _require_group_device(name, t, backend):
    # NCCL takes CUDA tensors only; its own error names no argument and can come from inside a
    # collective the other ranks already entered.
    if t.device.type == "cpu" and "nccl" in backend and not any(b in backend for b in ("gloo", "mpi", "ucc")):
        raise TypeError("%s: expected a CUDA tensor for a %s process group, got one on the CPU" % (name, backend))


def _int(name, value, lo, hi=None):
    if isinstance(value, bool) or not isinstance(value, _INTS):
        raise TypeError("%s: expected an int, got %s" % (name, type(value).__name__))
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ValueError("%s: expected a value in %s, got %d" % (
            name, "[%d, %d]" % (lo, hi) if hi is not None else ">= %d" % lo, v))
    return v


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------------------------
# all-reduce + add + RMSNorm

def _all_reduce_nccl(x, residual, weight, eps, weight_offset, group):
    # A copy: x is the caller's (often a GEMM output it still reads); dense, as collectives need.
    total = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(total, group=group)
    return _norm.add_rmsnorm(total, residual, weight, eps, weight_offset=weight_offset)


# path name -> implementation; "auto" resolves through _choose_path. A symmetric-memory one-shot
# path would register here as "symm_mem" once it exists and has been measured.
_PATHS = {"nccl": _all_reduce_nccl}


def _choose_path(x, world_size, backend):
    """The path "auto" takes: where a measured size crossover (one-shot below it) would go."""
    return "nccl"


def all_reduce_add_rmsnorm(x, residual, weight, eps=1e-6, group=None, *, weight_offset=0.0, backend="auto"):
    """All-reduce x (sum) over `group`, then the fused add + RMSNorm: returns (rmsnorm(s), s)
    with s = all_reduce(x) + residual, exactly fray.add_rmsnorm(all_reduce(x), residual, weight)
    (s rounded to x's dtype, and that rounded s normalised; math in fp32).

    x: [..., hidden] fp32/fp16/bf16, this rank's partial sum (e.g. a row-parallel GEMM's output),
    not modified; residual: x's shape and dtype; weight: [hidden], x's dtype or fp32;
    weight_offset=1.0 gives Gemma's (1 + weight). group: a ProcessGroup, or None for the default
    group; every rank of it must call with the same shapes. backend: "auto" or "nccl" (the
    group's all-reduce, then fray.add_rmsnorm; on a gloo group the same code runs on CPU
    tensors, the norm then being the float64 reference). The all-reduce sums in x's dtype in the
    library's order (NCCL's ring or tree), as a plain dist.all_reduce would. At world size 1 the
    result is fray.add_rmsnorm(x, residual, weight)'s, bit for bit. CUDA tensors: no host
    synchronisation, CUDA-graph capturable after one warm-up call.
    """
    V.require_backend(backend, BACKENDS)
    eps, weight_offset = _norm._check_eps(eps), _norm._check_offset(weight_offset)
    if V.is_array(x):
        raise TypeError("x: expected a torch.Tensor (collectives take tensors), got numpy.ndarray")
    V.require_tensor("residual", residual)  # _check_tensors lets None through (add_rmsnorm's out=)
    _norm._check_tensors(x, weight, [("residual", residual, False)])
    _, world, pg_backend = _group_info(group)
    _require_group_device("x", x, pg_backend)
    path = _choose_path(x, world, pg_backend) if backend == "auto" else backend
    return _PATHS[path](x, residual, weight, eps, weight_offset, group)


# ---------------------------------------------------------------------------------------------
# expert parallelism

class MoeEpHandle(NamedTuple):
    """What moe_dispatch hands to moe_combine (route r = token * top_k + rank)."""
    inverse: Any            # int64 [T * k] on x's device: route -> its row in the sent order
    send_splits: List[int]  # routes this rank sent to each group rank
    recv_splits: List[int]  # rows this rank received from each group rank
    num_tokens: int         # T
    top_k: int              # k
    group: Any              # the group dispatch ran on (combine must use the same one)


def expert_map(num_experts, rank, world_size, device=None):
    """int32 [num_experts]: global expert id -> local id on `rank`, or -1 where another rank holds
    it. Rank r of world_size holds the contiguous block [r*E/W, (r+1)*E/W) (the split moe_dispatch
    assumes); num_experts must be a multiple of world_size. Pass it as fray.fused_moe's
    expert_map on each rank."""
    num_experts = _int("num_experts", num_experts, 1, _INT32_MAX)
    world_size = _int("world_size", world_size, 1)
    rank = _int("rank", rank, 0, world_size - 1)
    if num_experts % world_size:
        raise ValueError("num_experts: expected a multiple of world_size (%d), got %d" % (world_size, num_experts))
    local = num_experts // world_size
    m = torch.full((num_experts,), -1, dtype=torch.int32, device=device)
    m[rank * local:(rank + 1) * local] = torch.arange(local, dtype=torch.int32, device=device)
    return m


def _check_dispatch(x, topk_ids, topk_weights, num_experts, world):
    for name, t in (("x", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if V.is_array(t):
            raise TypeError("%s: expected a torch.Tensor (collectives take tensors), got numpy.ndarray" % name)
        V.require_tensor(name, t)
    V.require_device_family("x", x)
    V.require_float_dtype("x", x)
    V.require_same_device([("x", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights)])
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError("topk_ids: expected dtype int32 or int64, got %s" % _dtype_name(topk_ids.dtype))
    if topk_weights.dtype != torch.float32:
        raise TypeError("topk_weights: expected dtype float32, got %s" % _dtype_name(topk_weights.dtype))
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError("x: expected shape [tokens, hidden] with hidden >= 1, got %s" % (tuple(x.shape),))
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_ids.shape[1] == 0:
        raise ValueError("topk_ids: expected shape [%d, top_k] with top_k >= 1 (x has %d tokens), got %s"
                         % (x.shape[0], x.shape[0], tuple(topk_ids.shape)))
    V.require_shape("topk_weights", topk_weights, topk_ids.shape)
    num_experts = _int("num_experts", num_experts, 1, _INT32_MAX)
    if num_experts % world:
        raise ValueError("num_experts: expected a multiple of the group's world size (%d), got %d"
                         % (world, num_experts))
    return num_experts


def moe_dispatch(x, topk_ids, topk_weights, num_experts, group=None):
    """Send each route to the group rank that holds its expert.

    x: [T, H] fp32/fp16/bf16 (this rank's tokens); topk_ids: int32/int64 [T, k] global expert ids
    (e.g. from fray.moe_route); topk_weights: fp32 [T, k]; num_experts: E, a multiple of the
    group's world size W (rank r holds experts [r*E/W, (r+1)*E/W)). Every rank of `group` calls
    it (T may differ per rank, 0 included; k and H may not).

    Returns (recv_x [R, H] in x's dtype, recv_ids int32 [R] (global ids, all of this rank's
    experts), recv_weights fp32 [R], handle). The R received rows come grouped by source rank
    0..W-1, each source's routes in its route order (t*k + j), so they are the same run to run.
    One host synchronisation (the split sizes; see the module docstring), which also checks that
    every rank's ids lie in [0, E): otherwise every rank raises ValueError naming topk_ids.
    """
    rank, world, pg_backend = _group_info(group)
    num_experts = _check_dispatch(x, topk_ids, topk_weights, num_experts, world)
    _require_group_device("x", x, pg_backend)
    dev = x.device
    t, k = topk_ids.shape
    n = t * k
    ids = topk_ids.reshape(-1).to(torch.int64)
    dest = torch.div(ids, num_experts // world, rounding_mode="floor")
    # Stable: within one destination the routes keep route order, so what a rank receives (and
    # the combine's sums) does not depend on the sort's implementation.
    sorted_dest, order = torch.sort(dest, stable=True)
    # Counts by bisection rather than bincount (atomics): out-of-range ids fall outside every
    # bucket instead of indexing anything.
    bounds = torch.searchsorted(sorted_dest, torch.arange(world + 1, device=dev, dtype=torch.int64))
    counts = bounds[1:] - bounds[:-1]
    if n:
        lo, hi = ids.min().expand(world), ids.max().expand(world)
    else:
        lo = hi = torch.zeros(world, dtype=torch.int64, device=dev)
    # Row j goes to rank j: (routes for it, this rank's min id, max id). Every rank thus learns
    # every other's id range in the one exchange the counts need anyway.
    info = torch.stack([counts, lo, hi], dim=1).contiguous()
    recv_info = torch.empty_like(info)
    dist.all_to_all_single(recv_info, info, group=group)
    host = torch.cat([counts, recv_info.reshape(-1)]).tolist()  # the one host synchronisation
    send_splits = host[:world]
    recv_splits, lows, highs = host[world::3], host[world + 1::3], host[world + 2::3]
    bad = [r for r in range(world) if lows[r] < 0 or highs[r] >= num_experts]
    if bad:
        if rank in bad:
            raise ValueError("topk_ids: expected expert ids in [0, %d), got values in [%d, %d]"
                             % (num_experts, lows[rank], highs[rank]))
        raise ValueError("topk_ids: group rank(s) %s passed expert ids outside [0, %d); this rank's ids are valid, "
                         "but no rank can go on with the exchange" % (bad, num_experts))
    recv_total = sum(recv_splits)
    send_x = x.index_select(0, torch.div(order, k, rounding_mode="floor"))
    recv_x = x.new_empty((recv_total, x.shape[1]))
    dist.all_to_all_single(recv_x, send_x, recv_splits, send_splits, group=group)
    # Ids and weights travel together as int32 pairs (the weight's fp32 bits): one collective.
    meta = torch.stack([ids.to(torch.int32), topk_weights.reshape(-1).view(torch.int32)], dim=1)
    send_meta = meta.index_select(0, order)
    recv_meta = torch.empty((recv_total, 2), dtype=torch.int32, device=dev)
    dist.all_to_all_single(recv_meta, send_meta, recv_splits, send_splits, group=group)
    # clone, not contiguous(): a column of one row is already contiguous, and the two results
    # would then share one storage under two dtypes (torch.save refuses that).
    recv_ids = recv_meta[:, 0].clone(memory_format=torch.contiguous_format)
    recv_weights = recv_meta[:, 1].clone(memory_format=torch.contiguous_format).view(torch.float32)
    # order is a permutation: its argsort is its inverse (a sort, not a scatter, so the same on
    # every device and under torch.use_deterministic_algorithms).
    inverse = torch.argsort(order, stable=True)
    return recv_x, recv_ids, recv_weights, MoeEpHandle(inverse, send_splits, recv_splits, t, k, group)


def moe_combine(y, handle, group=None):
    """Send the experts' results back and sum each token's routes: out[t] = sum_j y(route t*k+j),
    in fp32 in rank order j = 0..k-1, cast to y's dtype (the same bits run to run).

    y: [R, N] fp32/fp16/bf16, row i the (already weighted) result of moe_dispatch's received row
    i; handle: that call's MoeEpHandle; group: the group dispatch used. Returns [T, N]. No host
    synchronisation (the splits are in the handle).
    """
    if not isinstance(handle, MoeEpHandle):
        raise TypeError("handle: expected the MoeEpHandle moe_dispatch returned, got %s" % type(handle).__name__)
    if group is not handle.group:
        raise ValueError("group: expected the group moe_dispatch ran on (%r), got %r" % (handle.group, group))
    _, world, pg_backend = _group_info(group)
    if world != len(handle.send_splits):
        raise ValueError("handle: made for a group of %d ranks, this one has %d" % (len(handle.send_splits), world))
    if V.is_array(y):
        raise TypeError("y: expected a torch.Tensor (collectives take tensors), got numpy.ndarray")
    V.require_tensor("y", y)
    V.require_device_family("y", y)
    V.require_float_dtype("y", y)
    V.require_same_device([("handle.inverse", handle.inverse), ("y", y)])  # names y when they differ
    recv_total = sum(handle.recv_splits)
    if y.dim() != 2 or y.shape[0] != recv_total or y.shape[1] == 0:
        raise ValueError("y: expected shape [%d, N] with N >= 1 (one row per received route), got %s"
                         % (recv_total, tuple(y.shape)))
    _require_group_device("y", y, pg_backend)
    t, k, cols = handle.num_tokens, handle.top_k, y.shape[1]
    back = y.new_empty((t * k, cols))
    dist.all_to_all_single(back, y.contiguous(), handle.send_splits, handle.recv_splits, group=group)
    routed = back.index_select(0, handle.inverse).view(t, k, cols)
    acc = torch.empty((t, cols), dtype=torch.float32, device=y.device)
    acc.copy_(routed[:, 0])
    for j in range(1, k):
        acc.add_(routed[:, j])
    return acc.to(y.dtype)
