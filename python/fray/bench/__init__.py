"""Benchmark utilities shared by every family: timing, result records, the printed table.

Timing follows the peers' measurement: warm-up, then the median per-call time with the L2 cache
flushed before each call (triton.testing.do_bench), plus a CUDA-graph replay figure for small
shapes (launch overhead removed: several calls captured in one graph, replay time / calls).
Results are JSON lines with the keys op, impl, shape, dtype, us, gbps, tflops, device, torch,
triton, cuda, commit, date (+ extras); the table is printed from those records.
"""
import datetime
import json
import os
import subprocess
import sys

import torch

from fray import env

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def commit():
    stamped = env.commit()
    if stamped:
        return stamped
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment():
    import triton
    return {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def time_us(fn, warmup_ms=25, rep_ms=100):
    """Median µs per call, L2 flushed before each call (do_bench's cache clearing)."""
    from triton.testing import do_bench
    return 1000.0 * do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def time_rounds(impls, timer, rounds=3):
    """{impl: [µs per round]}: every impl timed once per round, impls interleaved, so a slow
    moment of the machine (clock ramp, a neighbour) lands on all of them alike."""
    out = {name: [] for name in impls}
    for _ in range(rounds):
        for name, fn in impls.items():
            try:
                out[name].append(timer(fn))
            except Exception as exc:  # a peer that fails still leaves a row saying so
                out[name] = exc
        impls = {k: v for k, v in impls.items() if not isinstance(out[k], Exception)}
    return out


def median(values):
    v = sorted(values)
    return v[len(v) // 2]


# Shapes whose fastest impl takes less than this also get a CUDA-graph-replay row (":graph").
GRAPH_BELOW_US = 50.0


# --impls: a compiled regex; only the impls whose names it finds are timed (None: all). A lease of
# minutes cannot always afford every peer (torch.compile of a composite costs tens of seconds per
# shape); the rows that are left out are simply absent, never faked.
IMPLS = None


def bench_impls(recorder, op, shape, dtype, impls, nbytes=None, flops=None, graph=True, **extra):
    """Time every impl of one (op, shape, dtype): 3 interleaved rounds with the L2 flushed, then
    CUDA-graph replay too when the fastest is under GRAPH_BELOW_US (graph="always": whatever it
    took). One record per impl and variant, holding the median and the per-round numbers; a
    failing impl leaves an error row."""
    if IMPLS is not None:
        impls = {name: fn for name, fn in impls.items() if IMPLS.search(name)}
    timed = time_rounds(impls, time_us)
    variants = [("", timed)]
    ok = [median(v) for v in timed.values() if not isinstance(v, Exception)]
    if graph == "always" or (graph and ok and min(ok) < GRAPH_BELOW_US):
        variants.append((":graph", time_rounds(impls, graph_us)))
    for suffix, results in variants:
        for impl, rounds in results.items():
            if isinstance(rounds, Exception):
                recorder.add(op, impl, shape + suffix, dtype, None, note="error: %s" % str(rounds)[:200], **extra)
            else:
                recorder.add(op, impl, shape + suffix, dtype, median(rounds), nbytes, flops,
                             rounds=[round(u, 3) for u in rounds], **extra)


def capture(fn, calls=1):
    """`calls` calls of fn captured in one CUDA graph, after the warm-up capture needs (one call,
    then two on a side stream); returns (graph, what the last captured call returned: the graph's
    static outputs). The three warm-up calls run for real: fn's side effects happen three times."""
    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    out = None
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = fn()
    return graph, out


def graph_us(fn, calls=20, replays=50):
    """µs per call under CUDA-graph replay: `calls` calls captured once, median over replays."""
    graph, _ = capture(fn, calls)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    times.sort()
    return times[len(times) // 2]


class Recorder:
    """Collects records, appends each to a JSON-lines file as it comes, prints the table."""

    def __init__(self, out_path=None):
        self.env = environment()
        self.records = []
        self.out_path = out_path

    def add(self, op, impl, shape, dtype, us, nbytes=None, flops=None, **extra):
        rec = {
            "op": op, "impl": impl, "shape": shape, "dtype": DTYPE_NAMES.get(dtype, dtype),
            "us": round(us, 3) if us is not None else None,
            "gbps": round(nbytes / us / 1e3, 1) if (us and nbytes) else None,
            "tflops": round(flops / us / 1e6, 2) if (us and flops) else None,
        }
        rec.update(self.env)
        rec.update(extra)
        self.records.append(rec)
        if self.out_path:
            with open(self.out_path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
        return rec

    def table(self, file=sys.stdout):
        """Per (op, shape, dtype): each impl's µs, GB/s, and speed relative to the best peer."""
        groups = {}
        for r in self.records:
            groups.setdefault((r["op"], r["shape"], r["dtype"]), []).append(r)
        header = "%-12s %-22s %-5s %-14s %10s %9s %8s" % ("op", "shape", "dtype", "impl", "us", "GB/s", "vs peer")
        print(header, file=file)
        print("-" * len(header), file=file)
        for (op, shape, dtype), rows in groups.items():
            peers = [r["us"] for r in rows if not r["impl"].startswith("fray.") and r["us"]]
            best_peer = min(peers) if peers else None
            for r in rows:
                ratio = "%.2fx" % (best_peer / r["us"]) if (best_peer and r["us"]) else "-"
                us = "%.2f" % r["us"] if r["us"] is not None else "error"
                gbps = "%.0f" % r["gbps"] if r["gbps"] else "-"
                print("%-12s %-22s %-5s %-14s %10s %9s %8s" % (op, shape, dtype, r["impl"], us, gbps, ratio), file=file)
