"""compute-sanitizer sweep over Fray's CUDA kernel paths.

CASES lists, per family, small calls that reach each kernel instantiation path (dtype, launch
variant). A new family joins the sweep by adding its list to CASES; nothing else names cases.

  python3 -m fray.sanitize --list [FAMILIES]          # case names
  python3 -m fray.sanitize --case NAME[,NAME...]      # cases in this process (exit 0: ran clean)
  python3 -m fray.sanitize --sweep FAMILIES --out DIR # every case x tool, each in its own process

The sweep runs `compute-sanitizer --tool T --kernel-name kns=fray ... python3 -m fray.sanitize
--case NAMES` per chunk of cases and tool, and re-runs a chunk that is not clean one case per
process (so one fault cannot hide the next case), restricted to kernels
whose names hold "fray" (every Fray CUDA kernel lives in namespace fray; torch's fills, copies
and randn are not checked), a few processes at a time with a per-case timeout, and writes
DIR/<tool>/<case>.log, DIR/sanitize.jsonl and DIR/SANITIZE.md (command, commit, one table per
tool). The first case, smoke/vector_add, is trivial: if it is not clean under a tool, the tool
itself failed (its log says why).
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import time

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")


def _torch():
    import torch
    return torch


def _dev():
    return _torch().device("cuda")


def _randn(*shape, dtype=None, seed=0):
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(dtype or torch.float32)


_DTYPES = ("fp32", "fp16", "bf16")


def _dt(name):
    torch = _torch()
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


# ---------------------------------------------------------------------------------------------
# Cases: family -> {name: thunk}. Each thunk launches Fray CUDA kernels on small inputs.

def _smoke_cases():
    import fray

    def run():
        a = _randn(1000)
        fray.vector_add(a, a, backend="cuda")
    return {"vector_add": run}


def _elementwise_cases():
    import fray
    out = {}
    for d in _DTYPES:
        for n in (1, 1000, 65537):
            out["vector_add_%s_n%d" % (d, n)] = lambda d=d, n=n: fray.vector_add(
                _randn(n, dtype=_dt(d)), _randn(n, dtype=_dt(d), seed=1), backend="cuda")
    return out


def _norm_cases():
    import fray
    out = {}
    for d in _DTYPES:
        for rows, h in ((1, 8192), (7, 1000), (33, 4096)):
            dt = _dt(d)
            out["rmsnorm_%s_%dx%d" % (d, rows, h)] = lambda dt=dt, rows=rows, h=h: fray.rmsnorm(
                _randn(rows, h, dtype=dt), _randn(h, dtype=dt, seed=1), backend="cuda")
            out["add_rmsnorm_%s_%dx%d" % (d, rows, h)] = lambda dt=dt, rows=rows, h=h: fray.add_rmsnorm(
                _randn(rows, h, dtype=dt), _randn(rows, h, dtype=dt, seed=2), _randn(h, dtype=dt, seed=1),
                backend="cuda")
            out["layernorm_%s_%dx%d" % (d, rows, h)] = lambda dt=dt, rows=rows, h=h: fray.layernorm(
                _randn(rows, h, dtype=dt), _randn(h, dtype=dt, seed=1), _randn(h, dtype=dt, seed=3),
                backend="cuda")
        dt = _dt(d)
        out["add_rmsnorm_inplace_%s_4x4096" % d] = lambda dt=dt: fray.add_rmsnorm(
            _randn(4, 4096, dtype=dt), _randn(4, 4096, dtype=dt, seed=2), _randn(4096, dtype=dt, seed=1),
            inplace=True, backend="cuda")
    return out


def _activation_cases():
    import fray
    out = {}
    for d in _DTYPES:
        dt = _dt(d)
        for rows, h in ((1, 8192), (5, 1000)):
            out["silu_mul_%s_%dx%d" % (d, rows, h)] = lambda dt=dt, rows=rows, h=h: fray.silu_mul(
                _randn(rows, 2 * h, dtype=dt), backend="cuda")
            for approx in ("none", "tanh"):
                out["gelu_mul_%s_%s_%dx%d" % (approx, d, rows, h)] = (
                    lambda dt=dt, rows=rows, h=h, a=approx: fray.gelu_mul(
                        _randn(rows, 2 * h, dtype=dt), approximate=a, backend="cuda"))
        out["silu_mul_split_%s_3x512" % d] = lambda dt=dt: fray.silu_mul(
            _randn(3, 512, dtype=dt), _randn(3, 512, dtype=dt, seed=1), backend="cuda")
    return out


def _softmax_cases():
    import fray
    out = {}
    # Widths across the launcher's variants: warp per row, block per row, a row in one block's
    # shared memory, a row across a thread-block cluster.
    for d in _DTYPES:
        dt = _dt(d)
        for rows, w in ((9, 7), (9, 256), (5, 1024), (3, 8192), (2, 32768), (2, 131072), (1, 262144)):
            out["softmax_%s_%dx%d" % (d, rows, w)] = lambda dt=dt, rows=rows, w=w: fray.softmax(
                _randn(rows, w, dtype=dt), temperature=0.8, backend="cuda")
        out["online_softmax_%s_3x8192" % d] = lambda dt=dt: fray.online_softmax(
            _randn(3, 8192, dtype=dt), backend="cuda")
    return out


def _rope_cases():
    import fray
    torch = _torch()
    out = {}
    for d in _DTYPES:
        dt = _dt(d)
        for style in ("neox", "gptj"):
            def run(dt=dt, style=style, inplace=False, rot=None):
                q = _randn(17, 4, 128, dtype=dt)
                k = _randn(17, 2, 128, dtype=dt, seed=1)
                pos = torch.randint(0, 64, (17,), device="cuda")
                fray.rope(q, k, pos, max_position=64, style=style, inplace=inplace, rotary_dim=rot, backend="cuda")
            out["rope_%s_%s" % (style, d)] = run
            out["rope_%s_%s_inplace_rot64" % (style, d)] = lambda run=run: run(inplace=True, rot=64)
        def fused(dt=dt):
            qkv = _randn(9, 8 * 64, dtype=dt)
            q = qkv[:, : 4 * 64].view(9, 4, 64)
            k = qkv[:, 4 * 64: 6 * 64].view(9, 2, 64)
            fray.rope(q, k, torch.arange(9, device="cuda"), max_position=16, inplace=True, backend="cuda")
        out["rope_fused_qkv_%s" % d] = fused
    return out


def _sampling_cases():
    import fray
    torch = _torch()
    out = {}

    def sample(rows, cols, dt, top_k=None, top_p=None, min_p=None, temperature=0.8):
        x = _randn(rows, cols, dtype=dt) * 4
        seeds = torch.arange(rows, device="cuda")
        offs = torch.zeros(rows, dtype=torch.int64, device="cuda")
        fray.sample(x, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seeds=seeds, offsets=offs,
                    return_logprobs=True, backend="cuda")

    # Widths and row counts chosen so the plan (sample_plan in sample.cuh, 132 SMs) takes clusters
    # of 1 (up to 2047), 2 (64 x 30000), 4 (4 x 32000; bf16 also 70 x 131072), 8 (fp32 70 x 131072,
    # bf16 40 x 262144) and 16 blocks (4 x 65536, 2 x 131072, 1 x 262144; fp32 40 x 262144).
    shapes = ((3, 1), (3, 7), (3, 1000), (3, 2047), (64, 30000), (4, 32000), (4, 65536), (70, 131072),
              (2, 131072), (1, 262144), (40, 262144))
    for d in ("fp32", "bf16"):
        dt = _dt(d)
        for rows, cols in shapes:
            tag = "%s_%dx%d" % (d, rows, cols)
            out["sample_topp_" + tag] = lambda r=rows, c=cols, dt=dt: sample(r, c, dt, top_p=0.9)
            out["sample_topk50_" + tag] = lambda r=rows, c=cols, dt=dt: sample(r, c, dt, top_k=50)
            if cols >= 4096:  # top-k past the survivors' limit: the cluster refinement
                out["sample_topk2000_topp_minp_" + tag] = lambda r=rows, c=cols, dt=dt: sample(
                    r, c, dt, top_k=2000, top_p=0.95, min_p=0.01)
        out["sample_greedy_%s_3x1000" % d] = lambda dt=dt: sample(3, 1000, dt, temperature=0.0)
    for d in _DTYPES:
        dt = _dt(d)

        def pen(dt=dt, d=d):
            x = _randn(4, 5000, dtype=dt)
            ids = torch.randint(0, 5000, (40,), device="cuda")
            offs = torch.tensor([0, 10, 10, 25, 40], device="cuda")
            fray.apply_penalties(x, ids, offs, repetition=1.2, presence=0.5, frequency=0.1, backend="cuda")
        out["apply_penalties_%s_4x5000" % d] = pen
    for d in ("fp32", "bf16"):
        dt = _dt(d)

        def step(dt=dt):
            x = _randn(4, 32000, dtype=dt)
            ids = torch.randint(0, 32000, (40,), device="cuda")
            offs = torch.tensor([0, 10, 10, 25, 40], device="cuda")
            fray.decode_step(x, ids, offs, repetition=1.1, temperature=0.7, top_k=40, top_p=0.9,
                             seeds=torch.arange(4, device="cuda"), offsets=torch.zeros(4, dtype=torch.int64,
                                                                                      device="cuda"),
                             backend="cuda")
        out["decode_step_%s_4x32000" % d] = step
    # top-k / argmax: on-chip (one block, clusters) and streaming (rows that do not fit the SMs'
    # shared memory at once), sorted and unsorted, k up to 4096 (in-kernel ranking) and above.
    for d in _DTYPES:
        dt = _dt(d)
        for rows, w, k in ((5, 256, 8), (3, 1000, 1), (4, 32000, 50), (2, 131072, 50), (1, 262144, 1024),
                           (70, 131072, 50), (2, 131072, 5000)):
            tag = "%s_%dx%dk%d" % (d, rows, w, k)
            out["topk_" + tag] = lambda r=rows, w=w, k=k, dt=dt: fray.topk(_randn(r, w, dtype=dt), k,
                                                                        backend="cuda")
            if k == 50:
                out["topk_unsorted_" + tag] = lambda r=rows, w=w, k=k, dt=dt: fray.topk(
                    _randn(r, w, dtype=dt), k, sorted=False, backend="cuda")
        for rows, w in ((3, 1000), (1, 131072), (9, 152064)):
            out["argmax_%s_%dx%d" % (d, rows, w)] = lambda r=rows, w=w, dt=dt: fray.argmax(
                _randn(r, w, dtype=dt), backend="cuda")
    return out


def _attention_cases():
    import fray
    from fray.ops.attention import _random_case
    torch = _torch()
    out = {}
    for d in _DTYPES:
        dt = _dt(d)
        # (batch, hq, hkv, capacity, head_dim, lens): B = 1 latency variants, GQA groups, splits.
        for tag, kw in (("b2_t37_d64", dict(batch=2, hq=4, hkv=2, capacity=37, d=64, lens=(37, 16))),
                        ("b1_t4096_d128", dict(batch=1, hq=8, hkv=2, capacity=4096, d=128, lens=(4000,))),
                        ("b3_t600_d128", dict(batch=3, hq=8, hkv=8, capacity=600, d=128, lens=(600, 1, 0)))):
            def case(kw=kw, dt=dt, splits=None, layout="HND", paged=False, page=16):
                q, k, v, kp, vp, bt, lens = _random_case(dt, torch.device("cuda"), page=page, **kw)
                if paged:
                    fray.paged_decode_attention(q, kp, vp, bt, lens, return_lse=True, num_splits=splits,
                                                backend="cuda")
                elif layout == "NHD":
                    fray.decode_attention(q, k.transpose(1, 2), v.transpose(1, 2), lens, kv_layout="NHD",
                                          num_splits=splits, backend="cuda")
                else:
                    fray.decode_attention(q, k, v, lens, return_lse=True, num_splits=splits, backend="cuda")
            out["decode_hnd_%s_%s" % (d, tag)] = case
            out["decode_nhd_%s_%s" % (d, tag)] = lambda case=case: case(layout="NHD")
            out["decode_hnd_split1_%s_%s" % (d, tag)] = lambda case=case: case(splits=1)
            out["decode_hnd_split3_%s_%s" % (d, tag)] = lambda case=case: case(splits=3)
            out["paged_decode_p16_%s_%s" % (d, tag)] = lambda case=case: case(paged=True)
            out["paged_decode_p64_%s_%s" % (d, tag)] = lambda case=case: case(paged=True, page=64)
            out["paged_decode_p16_split1_%s_%s" % (d, tag)] = lambda case=case: case(paged=True, splits=1)

        def append(dt=dt, paged=False, layout="HND"):
            _, k, v, kp, vp, bt, _ = _random_case(dt, torch.device("cuda"))
            kn = _randn(2, 2, 64, dtype=dt)
            vn = _randn(2, 2, 64, dtype=dt, seed=1)
            lens = torch.tensor([0, 36], dtype=torch.int32, device="cuda")
            if paged:
                fray.kv_append_paged(kp, vp, bt, kn, vn, lens, backend="cuda")
            elif layout == "NHD":
                fray.kv_append(k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), kn, vn, lens,
                               kv_layout="NHD", backend="cuda")
            else:
                fray.kv_append(k, v, kn, vn, lens, backend="cuda")
        out["kv_append_hnd_%s" % d] = append
        out["kv_append_nhd_%s" % d] = lambda append=append: append(layout="NHD")
        out["kv_append_paged_%s" % d] = lambda append=append: append(paged=True)
    return out


# The one place a family joins the sweep (its directory name under tests/).
CASES = {
    "smoke": _smoke_cases,
    "elementwise": _elementwise_cases,
    "norm": _norm_cases,
    "activation": _activation_cases,
    "softmax": _softmax_cases,
    "rope": _rope_cases,
    "sampling": _sampling_cases,
    "attention": _attention_cases,
}


def case_names(families):
    names = []
    for fam in families:
        if fam not in CASES:
            raise ValueError("families: expected some of %s, got %r" % (", ".join(CASES), fam))
        names += ["%s/%s" % (fam, n) for n in CASES[fam]()]
    return names


def run_case(names):
    """Runs the cases (a comma list) in order, checking the CUDA context after each (a sticky
    error raises, naming the case)."""
    torch = _torch()
    built = {}
    for name in names.split(","):
        fam, _, case = name.partition("/")
        if fam not in built:
            built[fam] = CASES.get(fam, lambda: {})()
        if case not in built[fam]:
            raise ValueError("case: expected one of --list's names, got %r" % name)
        try:
            built[fam][case]()
            torch.cuda.synchronize()
        except Exception as e:
            raise RuntimeError("case %s: %s" % (name, e)) from e


# ---------------------------------------------------------------------------------------------
# The sweep.

_ERR = re.compile(r"ERROR SUMMARY: (\d+) error")
_RACE = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")


def _sanitizer():
    for p in (shutil.which("compute-sanitizer"),
              os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer")):
        if p and os.path.exists(p):
            return p
    raise RuntimeError("compute-sanitizer: expected on PATH or under $CUDA_HOME/bin, got none")


def _one(tool, name, out_dir, timeout, san):
    """One process under `tool` running the cases of `name` (a comma list)."""
    first = name.split(",")[0]
    log = os.path.join(out_dir, tool, first.replace("/", "__") + ("+%d" % (name.count(",")) if "," in name else "")
                       + ".log")
    cmd = [san, "--tool", tool, "--kernel-name", "kns=fray", "--error-exitcode", "99", "--print-limit", "200",
           sys.executable, "-m", "fray.sanitize", "--case", name]
    if tool == "racecheck":
        cmd[3:3] = ["--racecheck-report", "all"]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        text, rc = p.stdout.decode(errors="replace"), p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode(errors="replace") + "\n[timeout after %ds]\n" % timeout, "timeout"
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + text)
    row = {"tool": tool, "case": name, "rc": rc, "seconds": round(time.time() - t0, 1)}
    m = _ERR.search(text)
    row["errors"] = int(m.group(1)) if m else None
    r = _RACE.search(text)
    if r:
        row["hazards"], row["race_errors"], row["race_warnings"] = (int(g) for g in r.groups())
    clean = rc == 0 and row["errors"] == 0 and (tool != "racecheck" or row.get("hazards") == 0)
    row["status"] = "clean" if clean else ("timeout" if rc == "timeout" else "FINDINGS" if rc in (0, 99)
                                           else "FAILED")
    kernels = sorted(set(re.findall(r"(?:at|in) (?:0x[0-9a-f]+ in )?(fray::[A-Za-z0-9_:<>, ]+?)\(", text)))
    row["kernels"] = kernels[:8]
    return row


def _cell(row):
    if row["tool"] == "racecheck":
        v = row.get("hazards")
        body = "%s hazards" % ("?" if v is None else v)
    else:
        v = row["errors"]
        body = "%s errors" % ("?" if v is None else v)
    if row["status"] == "clean":
        return body
    where = ", ".join(row.get("kernels") or [])
    return "**%s** (%s, rc %s)%s" % (body, row["status"], row["rc"], ": " + where if where else "")


def write_report(rows, path, command, commit):
    lines = ["# compute-sanitizer sweep", "", "Command: `%s`" % command, "", "Commit: %s" % commit, "",
             "Cases run a few to a process under each tool, the CUDA context checked after each; a process",
             "that is not clean is re-run one case per process. Only kernels whose names hold `fray` are",
             "checked (`--kernel-name kns=fray`). Logs: the results archive, `sanitize/<tool>/*.log`.", ""]
    for tool in TOOLS:
        rs = [r for r in rows if r["tool"] == tool]
        if not rs:
            continue
        bad = [r for r in rs if r["status"] != "clean"]
        lines += ["## %s: %d cases, %d clean, %d not" % (tool, len(rs), len(rs) - len(bad), len(bad)), "",
                  "| kernel path (case) | %s | s |" % ("hazards" if tool == "racecheck" else "errors"),
                  "|---|---|---|"]
        for r in sorted(rs, key=lambda r: r["case"]):
            lines.append("| %s | %s | %s |" % (r["case"], _cell(r), r["seconds"]))
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def sweep(families, out_dir, tools, jobs, timeout, deadline, chunk):
    """Cases run `chunk` to a process (one family per process; the context is checked after
    each); a chunk that is not clean under a tool is re-run one case per process, so every
    finding is attributed to its case and one fault cannot hide the rest."""
    san = _sanitizer()
    names = case_names(["smoke"] + [f for f in families if f != "smoke"])
    for tool in tools:
        os.makedirs(os.path.join(out_dir, tool), exist_ok=True)
    start = time.time()
    rows = []

    def record(r):
        rows.append(r)
        print("%-10s %-70s %s" % (r["tool"], r["case"][:70], _cell(r)), flush=True)
        with open(os.path.join(out_dir, "sanitize.jsonl"), "a") as fh:
            fh.write(json.dumps(r) + "\n")

    # The smoke case first under every tool: a tool that cannot run torch + Fray shows here.
    for tool in tools:
        record(_one(tool, names[0], out_dir, timeout, san))
    groups = []
    for fam in [f for f in families if f != "smoke"]:
        fn = [n for n in names[1:] if n.split("/")[0] == fam]
        groups += [fn[i:i + chunk] for i in range(0, len(fn), chunk)]

    def run(t, g):
        if time.time() - start >= deadline:
            return [{"tool": t, "case": n, "rc": "skipped", "errors": None, "seconds": 0,
                     "status": "not run (deadline)"} for n in g]
        r = _one(t, ",".join(g), out_dir, timeout, san)
        if r["status"] == "clean" or len(g) == 1:
            return [dict(r, case=n, seconds=round(r["seconds"] / len(g), 1), chunk=len(g)) for n in g]
        return None  # re-run one case per process

    with cf.ThreadPoolExecutor(jobs) as ex:
        futs = {ex.submit(run, t, g): (t, g) for g in groups for t in tools}
        redo = []
        for f in cf.as_completed(futs):
            out = f.result()
            if out is None:
                t, g = futs[f]
                redo += [ex.submit(run, t, [n]) for n in g]
                continue
            for r in out:
                record(r)
        for f in cf.as_completed(redo):
            for r in f.result():
                record(r)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m fray.sanitize", description=__doc__.split("\n")[0])
    ap.add_argument("--list", nargs="?", const="all", metavar="FAMILIES")
    ap.add_argument("--case")
    ap.add_argument("--sweep", metavar="FAMILIES")
    ap.add_argument("--out", default="sanitize")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--chunk", type=int, default=8, help="cases per process (a chunk not clean is re-run one by one)")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per case and tool")
    ap.add_argument("--deadline", type=int, default=480, help="no case starts after this many seconds")
    a = ap.parse_args(argv)

    def fams(s):
        return [f for f in CASES if f != "smoke"] if s == "all" else s.split(",")
    if a.case:
        run_case(a.case)
        return 0
    if a.list:
        print("\n".join(case_names(fams(a.list))))
        return 0
    if a.sweep:
        tools = a.tools.split(",")
        for t in tools:
            if t not in TOOLS:
                raise ValueError("tools: expected some of %s, got %r" % (", ".join(TOOLS), t))
        os.makedirs(a.out, exist_ok=True)
        rows = sweep(fams(a.sweep), a.out, tools, a.jobs, a.timeout, a.deadline, a.chunk)
        from fray import env
        cmd = "bash .bundle/run.sh sanitize %s" % a.sweep
        write_report(rows, os.path.join(a.out, "SANITIZE.md"), cmd, env.commit() or "unknown")
        bad = [r for r in rows if r["status"] != "clean"]
        print("sanitize: %d runs, %d not clean" % (len(rows), len(bad)))
        return 1 if bad else 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
