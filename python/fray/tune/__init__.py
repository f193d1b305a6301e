"""fray.tune: the one autotuner, for JIT and Triton kernels alike.

choose() returns a kernel's configuration for one shape bucket. In order it takes:
  1. the choice already made in this process;
  2. the choice persisted on disk (FRAY_CACHE_DIR/tune/<device>.json), keyed by kernel, bucket,
     dtype, arch, device name, CUDA runtime and driver versions and Fray's version;
  3. the shipped default for this device (python/fray/tune/defaults/<device>.json, data measured
     on that device and committed, keyed by kernel|bucket|dtype);
  4. when tuning is not allowed (CUDA-graph capture, torch.compile tracing, FRAY_AUTOTUNE=0) the
     caller's heuristic `default`, not remembered, so the next eager call still tunes;
  5. otherwise it tunes: every candidate is built (in parallel: build() typically calls
     fray.jit.build_many), checked against the reference on the tuning input (a candidate whose
     check fails never wins), timed with the L2 flushed before each call, and the fastest
     persisted.
FRAY_PRINT_AUTOTUNE=1 prints the table (config, us, TFLOP/s, GB/s, chosen) or where the choice
came from.
"""
import datetime
import functools
import json
import os
import pathlib
import re
import sys
import tempfile
import threading
import time

from fray import env

__all__ = ["choose", "config_label", "device_identity", "record_key", "export_defaults", "stats"]

# Per-process counters (tests): tuning runs, candidate builds requested, timings taken.
stats = {"tunings": 0, "builds": 0, "timings": 0}

_memo = {}
_lock = threading.RLock()
_DEFAULTS_DIR = pathlib.Path(os.path.dirname(os.path.abspath(__file__))) / "defaults"


def config_label(config):
    """'BLOCK_M=128,BLOCK_N=256,stages=4': one stable spelling of a config (sorted keys)."""
    return ",".join("%s=%s" % (k, config[k]) for k in sorted(config))


def _canonical(config):
    return json.dumps(config, sort_keys=True)


def _slug(text):
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unknown"


@functools.lru_cache(maxsize=None)
def _identity_of(index):
    import torch
    import fray
    cap = torch.cuda.get_device_capability(index)
    driver = "unknown"
    try:
        from fray._C import _jit
        v = _jit.cuda_driver_version()
        driver = "%d.%d" % (v // 1000, (v % 1000) // 10) if v else "unknown"
    except ImportError:
        pass
    return {
        "arch": "sm_%d%d" % cap,
        "device": torch.cuda.get_device_name(index),
        "cuda": str(torch.version.cuda),
        "driver": driver,
        "fray": fray.__version__,
    }


def device_identity(index=None):
    """The device half of a record's key: arch, device name, CUDA runtime, driver, Fray version."""
    import torch
    if index is None:
        index = torch.cuda.current_device()
    return dict(_identity_of(index))


def record_key(kernel, bucket, dtype, ident):
    return "|".join([kernel, bucket, dtype, ident["arch"], ident["device"], "cuda" + ident["cuda"],
                     "driver" + ident["driver"], "fray" + ident["fray"]])


def _store_path(ident):
    return pathlib.Path(env.cache_dir()) / "tune" / (_slug(ident["device"]) + ".json")


def _read_json(path):
    try:
        with open(path) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}  # a damaged record file is re-tuned and rewritten, not fatal


def _persist(path, key, record):
    import fcntl
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        data = _read_json(path)
        data[key] = record
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


@functools.lru_cache(maxsize=None)
def _shipped(device_name):
    return _read_json(_DEFAULTS_DIR / (_slug(device_name) + ".json"))


def _tuning_blocked():
    """Why tuning may not run now (None: it may)."""
    import torch
    try:
        if torch.compiler.is_compiling():
            return "torch.compile tracing"
    except AttributeError:
        pass
    try:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return "capturing"
    except RuntimeError:
        pass
    if not env.autotune_enabled():
        return "FRAY_AUTOTUNE=0"
    return None


def _say(kernel, bucket, dtype, config, source):
    if env.print_autotune():
        print("fray.tune: %s %s %s -> %s (%s)" % (kernel, bucket, dtype, config_label(config), source),
              file=sys.stderr, flush=True)


def _default_timer(fn):
    """µs per call: the median with the L2 flushed before each call (do_bench's cache clearing),
    shorter than a benchmark's run since every candidate is timed."""
    from triton.testing import do_bench
    return 1000.0 * do_bench(fn, warmup=10, rep=40, return_mode="median")


def _find(candidates, config):
    want = _canonical(config)
    for c in candidates:
        if _canonical(c) == want:
            return dict(c)
    return None


def choose(kernel, bucket, dtype, candidates, *, build, run, check, default, flops=0.0, bytes=0.0,
           timer=None, device=None):
    """The config of `kernel` for `bucket` and `dtype` (a dict among `candidates`).

    build(configs) -> [runner or Exception] compiles candidates (in parallel); run(config, runner)
    makes one call on the tuning input; check(config, runner) raises AssertionError when the
    result is wrong; default is the heuristic used when tuning is not allowed. flops / bytes of
    one call fill the TFLOP/s and GB/s columns. timer(fn) -> µs replaces the L2-flushed median
    (tests pass a fake one). A persisted or shipped choice that is no longer among the candidates
    is ignored. The choice is remembered per process by (kernel, bucket, dtype, device): later
    calls cost one dictionary lookup and do not look at `candidates` again.
    """
    ident = device_identity(device)
    key = record_key(kernel, bucket, dtype, ident)
    hit = _memo.get(key)  # the per-call path: one key, one dict lookup
    if hit is not None:
        return dict(hit)
    candidates = [dict(c) for c in candidates]
    if not candidates:
        raise ValueError("fray.tune.choose(%s): candidates must not be empty" % kernel)
    if _find(candidates, default) is None:
        raise ValueError("fray.tune.choose(%s): default %s is not among the candidates" % (kernel, config_label(default)))

    persisted = _read_json(_store_path(ident)).get(key)
    if isinstance(persisted, dict) and _find(candidates, persisted.get("config", {})) is not None:
        config = _find(candidates, persisted["config"])
        _say(kernel, bucket, dtype, config, "persisted")
        with _lock:
            _memo[key] = config
        return dict(config)

    shipped = _shipped(ident["device"]).get("|".join([kernel, bucket, dtype]))
    if isinstance(shipped, dict) and _find(candidates, shipped) is not None:
        config = _find(candidates, shipped)
        _say(kernel, bucket, dtype, config, "shipped default")
        with _lock:
            _memo[key] = config
        return dict(config)

    blocked = _tuning_blocked()
    if blocked is not None:
        config = _find(candidates, default)
        _say(kernel, bucket, dtype, config, "heuristic (%s)" % blocked)
        return dict(config)

    with _lock:  # one tuning per process at a time: candidates would disturb each other's timings
        hit = _memo.get(key)
        if hit is not None:
            return dict(hit)
        start = time.monotonic()
        config, rows, build_s = _tune(kernel, bucket, dtype, candidates, build, run, check, flops, bytes,
                                      timer or _default_timer)
        tune_s = time.monotonic() - start
        _memo[key] = config
    winner = next(r for r in rows if r["config"] == config)
    _persist(_store_path(ident), key, {
        "config": config, "us": winner["us"], "kernel": kernel, "bucket": bucket, "dtype": dtype,
        "identity": ident, "candidates": len(candidates), "build_s": round(build_s, 3), "tune_s": round(tune_s, 3),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    })
    if env.print_autotune():
        _print_table(kernel, bucket, dtype, rows, config, flops, bytes)
    return dict(config)


def _tune(kernel, bucket, dtype, candidates, build, run, check, flops, bytes_, timer):
    print("fray.tune: tuning %s %s %s over %d configs" % (kernel, bucket, dtype, len(candidates)),
          file=sys.stderr, flush=True)
    stats["tunings"] += 1
    stats["builds"] += len(candidates)
    start = time.monotonic()
    runners = list(build(candidates))
    build_s = time.monotonic() - start
    if len(runners) != len(candidates):
        raise RuntimeError("fray.tune: build() returned %d runners for %d candidates" % (len(runners), len(candidates)))
    rows = []
    for config, runner in zip(candidates, runners):
        row = {"config": config, "us": None, "note": ""}
        rows.append(row)
        if isinstance(runner, Exception):
            row["note"] = "build failed: %s" % str(runner).strip().splitlines()[0][:100] if str(runner).strip() else "build failed"
            continue
        try:
            check(config, runner)
        except Exception as exc:  # AssertionError (wrong result) or a launch failure: never a winner
            row["note"] = "check failed: %s" % (str(exc).strip().splitlines() or [type(exc).__name__])[0][:100]
            continue
        stats["timings"] += 1
        row["us"] = float(timer(lambda config=config, runner=runner: run(config, runner)))
    timed = [r for r in rows if r["us"] is not None]
    if not timed:
        raise RuntimeError("fray.tune: no candidate of %s passed its check at %s %s:\n%s"
                           % (kernel, bucket, dtype,
                              "\n".join("  %s: %s" % (config_label(r["config"]), r["note"]) for r in rows)))
    best = min(timed, key=lambda r: r["us"])
    return best["config"], rows, build_s


def _print_table(kernel, bucket, dtype, rows, chosen, flops, bytes_):
    out = sys.stderr
    print("fray.tune: %s %s %s" % (kernel, bucket, dtype), file=out)
    width = max(len(config_label(r["config"])) for r in rows)
    print("  %-*s %10s %9s %8s  %s" % (width, "config", "us", "TFLOP/s", "GB/s", "chosen"), file=out)
    for r in sorted(rows, key=lambda r: (r["us"] is None, r["us"] or 0.0)):
        us = r["us"]
        print("  %-*s %10s %9s %8s  %s" % (
            width, config_label(r["config"]),
            "%.2f" % us if us is not None else "-",
            "%.1f" % (flops / us / 1e6) if (us and flops) else "-",
            "%.0f" % (bytes_ / us / 1e3) if (us and bytes_) else "-",
            "*" if r["config"] == chosen else r["note"]), file=out)
    out.flush()


def export_defaults(device_name=None, path=None):
    """Writes this machine's persisted choices for `device_name` (default: the current device) as
    shipped defaults (kernel|bucket|dtype -> config) to `path` (default
    python/fray/tune/defaults/<device>.json), merging with what is there; returns the path."""
    if device_name is None:
        device_name = device_identity()["device"]
    store = pathlib.Path(env.cache_dir()) / "tune" / (_slug(device_name) + ".json")
    path = pathlib.Path(path) if path else _DEFAULTS_DIR / (_slug(device_name) + ".json")
    out = _read_json(path)
    for record in _read_json(store).values():
        if isinstance(record, dict) and record.get("identity", {}).get("device") == device_name:
            out["|".join([record["kernel"], record["bucket"], record["dtype"]])] = record["config"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
        fh.write("\n")
    return path
