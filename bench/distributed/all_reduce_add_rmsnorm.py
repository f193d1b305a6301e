"""all_reduce_add_rmsnorm under torch.distributed: fray.distributed against the unfused peers.

A plain script, not the family protocol (fray.bench.main's main_for): that protocol times with
triton's do_bench, whose repetition count adapts to each process's own measurement, so ranks
would enter different numbers of collectives and hang; here every rank runs the same fixed count
(warm-up, then REPS calls each timed with CUDA events after an L2 flush; CUDA-graph replay as
fray.bench.graph_us, fixed counts too), and a rank's figure is the slowest rank's median. It reuses
fray.bench's flags (--out, --graph, --shapes ROWSxCOLS[:dtype]) and Recorder (the JSON-lines keys).

    python3 bench/distributed/all_reduce_add_rmsnorm.py --out results.jsonl      # world size 1
    torchrun --nproc-per-node=2 bench/distributed/all_reduce_add_rmsnorm.py --out results.jsonl
    bazel run //bench/distributed:all_reduce_add_rmsnorm -- --out=$PWD/results.jsonl

Without torchrun's variables (RANK, WORLD_SIZE) it makes a one-process NCCL group of its own.
Only rank 0 writes records and prints the table.

Shapes: hidden 8192, tokens 1, 16, 128, 1024, 8192, bf16; the shape names carry the world size
("128x8192:w2"), CUDA-graph rows add ":graph". Records carry world_size.
bytes (gbps) = T·H·s(x), the all-reduced message (nccl-tests' algorithm bandwidth), for every
row, so rows of one shape compare directly.
Rows: op all_reduce_add_rmsnorm
  fray.nccl      fray.distributed.all_reduce_add_rmsnorm (NCCL all-reduce of a copy of x, then
                 fray.add_rmsnorm); the only path built so far
  torch.eager    x.clone(), dist.all_reduce, then the add + RMSNorm composite a model file writes
  torch.builtin  x.clone(), dist.all_reduce, then x + r and F.rms_norm
and op all_reduce, impl nccl: x.clone() + dist.all_reduce alone (the floor any fused path is
measured against; its own op so that the table does not count it as a peer).
NVLink multicast stays off: importing fray.distributed (first, below) sets NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 before NCCL starts; export them
before torchrun as well.
"""
import fray.distributed as fd  # noqa: I001  (first: the multicast switches before NCCL starts)

import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from absl import app

from fray.bench import Recorder, graph_us, median
from fray.bench.main import FLAGS

TOKENS = (1, 16, 128, 1024, 8192)
HIDDEN = 8192
SHAPES = [(t, HIDDEN, torch.bfloat16) for t in TOKENS]
EPS = 1e-6
WARMUP, REPS = 10, 50
GRAPH_BELOW_US = 50.0


def _eager_add_rmsnorm(x, r, w):
    s = x + r
    sf = s.float()
    return (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype), s


def _reduced(x, group):
    t = x.clone()
    dist.all_reduce(t, group=group)
    return t


def impls(x, r, w, group=None):
    """{(op, impl): callable}: every row timed at one shape."""
    return {
        ("all_reduce_add_rmsnorm", "fray.nccl"): lambda: fd.all_reduce_add_rmsnorm(x, r, w, EPS, group),
        ("all_reduce_add_rmsnorm", "torch.eager"): lambda: _eager_add_rmsnorm(_reduced(x, group), r, w),
        ("all_reduce_add_rmsnorm", "torch.builtin"):
            lambda: (lambda s: (F.rms_norm(s, (s.shape[-1],), w, EPS), s))(_reduced(x, group) + r),
        ("all_reduce", "nccl"): lambda: _reduced(x, group),
    }


def time_lockstep(fn, flush=None, warmup=WARMUP, reps=REPS):
    """Median µs per call on this rank, the same number of calls on every rank."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return median([start.elapsed_time(end) * 1000.0 for start, end in events])


def slowest(us, device):
    """The largest of the ranks' figures (a collective is as fast as its slowest rank)."""
    t = torch.tensor([us], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def run(recorder, shapes=None, graph=True, timer=None, graph_timer=None, device=None):
    """Time every row at every shape; records go to `recorder` (None on ranks other than 0).
    timer / graph_timer: fn -> µs (defaults: time_lockstep with an L2 flush, fray.bench.graph_us)."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    if timer is None:
        flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=device)
        timer = lambda fn: time_lockstep(fn, flush)  # noqa: E731
    graph_timer = graph_timer or graph_us
    world = dist.get_world_size()
    for tokens, hidden, dtype in shapes or SHAPES:
        g = torch.Generator(device=device).manual_seed(dist.get_rank())
        x = torch.randn(tokens, hidden, device=device, generator=g).to(dtype)
        r = torch.randn(tokens, hidden, device=device, generator=torch.Generator(device=device).manual_seed(7)).to(dtype)
        w = torch.randn(hidden, device=device, generator=torch.Generator(device=device).manual_seed(8)).to(dtype)
        shape = "%dx%d:w%d" % (tokens, hidden, world)
        nbytes = tokens * hidden * x.element_size()
        rows = impls(x, r, w)
        timed = {key: slowest(timer(fn), device) for key, fn in rows.items()}
        variants = [("", timed)]
        if graph and min(timed.values()) < GRAPH_BELOW_US:
            variants.append((":graph", {key: slowest(graph_timer(fn), device) for key, fn in rows.items()}))
        if recorder is None:
            continue
        for suffix, results in variants:
            for (op, impl), us in results.items():
                recorder.add(op, impl, shape + suffix, dtype, us, nbytes, world_size=world)


def init_group():
    """(rank, world size): torchrun's group (env://), else a one-process group of this process's own."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        torch.cuda.set_device(0)
        store = os.path.join(tempfile.mkdtemp(prefix="fray_bench_"), "store")
        dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size()


def parse_shapes(text):
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    shapes = []
    for item in text.split(","):
        dims, _, dt = item.partition(":")
        rows, cols = (int(v) for v in dims.split("x"))
        shapes.append((rows, cols, dtypes[dt or "bf16"]))
    return shapes


def _main(argv):
    del argv
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks need a CUDA GPU; none is visible")
    rank, _ = init_group()
    try:
        rec = Recorder(FLAGS.out) if rank == 0 else None
        with torch.no_grad():
            run(rec, parse_shapes(FLAGS.shapes) if FLAGS.shapes else None, FLAGS.graph)
        if rec is not None:
            rec.table()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    app.run(_main)
