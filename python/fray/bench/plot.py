"""Charts from benchmark JSON lines (`fray plot`; bench/results/h200/*.jsonl -> docs/charts/).

<family>.png  every (op, shape, dtype) measured, one row each: each implementation's speed as the
              best peer's time over its time (log scale; right of 1 beats the best peer). Fray's
              backends are coloured by win (green) or loss (red), peers are grey.
roofline.png  Fray's achieved TB/s against bytes moved, under the H200's measured copy ceiling,
              and TFLOP/s against the dense bf16 ceiling where a result counts FLOPs.
"""
import glob
import json
import os

# Measured on the H200 (DESIGN.md, 2026-11-30): device-to-device copy, read + write counted;
# cuBLAS bf16 GEMM at 4096^3 reached 764 TFLOP/s of the ~790 the part is specified for.
COPY_TBPS = 4.2
BF16_TFLOPS = 790.0

BACKEND_STYLE = {"fray.cuda": ("o", "cuda"), "fray.triton": ("^", "triton")}
# Peers by the part of their impl name before any ":variant"; anything else is drawn as "|".
PEER_MARKERS = {"torch.eager": "x", "torch.compile": "+", "torch.builtin": "|", "liger": "d"}


def _peer_marker(impl):
    return PEER_MARKERS.get(impl.split(":")[0], "|")


def load(path):
    """The latest record per (op, impl, shape, dtype) of one JSON-lines file."""
    latest = {}
    for line in open(path):
        if not line.strip():
            continue
        r = json.loads(line)
        key = (r["op"], r["impl"], r["shape"], r["dtype"])
        if key not in latest or r.get("date", "") >= latest[key].get("date", ""):
            latest[key] = r
    return list(latest.values())


def groups(records):
    """[(label, {impl: us}, best peer us or None)] in file order of first appearance."""
    out = {}
    for r in records:
        if r["us"] is None:
            continue
        out.setdefault((r["op"], r["shape"], r["dtype"]), {})[r["impl"]] = r["us"]
    rows = []
    for (op, shape, dtype), impls in out.items():
        peers = [us for impl, us in impls.items() if not impl.startswith("fray.")]
        rows.append(("%s %s %s" % (op, shape, dtype), impls, min(peers) if peers else None))
    return rows


def family_chart(plt, name, records, path):
    rows = [g for g in groups(records) if g[2] is not None]
    fig, ax = plt.subplots(figsize=(12.5, 1.6 + 0.28 * len(rows)))
    for y, (label, impls, best) in enumerate(rows):
        for impl, us in sorted(impls.items()):
            ratio = best / us
            if impl.startswith("fray."):
                marker, _ = BACKEND_STYLE.get(impl, ("s", impl))
                ax.scatter(ratio, y, marker=marker, s=46, zorder=3, edgecolors="black", linewidths=0.4,
                           color="#2a9d4b" if ratio >= 1.0 else "#d1342f")
            else:
                marker = _peer_marker(impl)
                ax.scatter(ratio, y, marker=marker, s=60 if marker in "x+|" else 30, zorder=2,
                           color="#777777" if marker in "x+|" else "none", edgecolors="#777777")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.set_xlabel("best peer's time / implementation's time  (log; > 1: faster than every peer)")
    ax.set_title("%s on one H200: Fray against torch eager, torch.compile, torch built-ins, Liger" % name, fontsize=10)
    handles = [ax.scatter([], [], marker=m, color="#2a9d4b", edgecolors="black", linewidths=0.4, label="fray." + lbl)
               for m, lbl in BACKEND_STYLE.values()]
    handles.append(ax.scatter([], [], marker="s", color="#2a9d4b", edgecolors="black", linewidths=0.4,
                              label="fray variant (e.g. :NHD)"))
    handles.append(ax.scatter([], [], marker="s", color="#d1342f", label="fray, slower than the best peer"))
    for impl, marker in PEER_MARKERS.items():
        if any(i.split(":")[0] == impl for _, impls, _ in rows for i in impls):
            handles.append(ax.scatter([], [], marker=marker, s=60 if marker in "x+|" else 30,
                                      color="#777777" if marker in "x+|" else "none", edgecolors="#777777",
                                      label=impl + (" (SDPA, topk, ...)" if impl == "torch.builtin" else "")))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def roofline_chart(plt, by_family, path):
    fig, (bw, fl) = plt.subplots(1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [3, 1]})
    colors = plt.get_cmap("tab10")
    flop_points = []
    for i, (family, records) in enumerate(sorted(by_family.items())):
        for r in records:
            if not r["impl"] in BACKEND_STYLE or r["us"] is None:
                continue
            if r.get("tflops"):
                flop_points.append((family, r))
            if not r.get("gbps"):
                continue
            nbytes = r["gbps"] * 1e9 * r["us"] * 1e-6
            bw.scatter(nbytes, r["gbps"] / 1000.0, marker=BACKEND_STYLE[r["impl"]][0], s=22, color=colors(i % 10),
                       label=family if r["impl"] == "fray.cuda" else None, alpha=0.85)
    bw.axhline(COPY_TBPS, color="black", linestyle="--", linewidth=1)
    bw.text(0.01, COPY_TBPS * 1.01, "device copy %.1f TB/s (read + write); read-mostly streams such as the KV "
            "cache can pass it" % COPY_TBPS, fontsize=8, transform=bw.get_yaxis_transform(), va="bottom")
    bw.set_xscale("log")
    bw.set_xlabel("bytes each call must move (log)")
    bw.set_ylabel("achieved TB/s")
    bw.set_ylim(0, COPY_TBPS * 1.2)
    bw.grid(alpha=0.3)
    handles, labels = bw.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    bw.legend(uniq.values(), uniq.keys(), fontsize=8, loc="lower right", title="fray.cuda (o) / fray.triton (^)",
              title_fontsize=8)
    bw.set_title("Memory-bound operators against the H200's copy ceiling", fontsize=10)
    if flop_points:
        for j, (family, r) in enumerate(flop_points):
            fl.scatter(j, r["tflops"], marker=BACKEND_STYLE[r["impl"]][0], color="#1f77b4")
        fl.set_ylim(0, BF16_TFLOPS * 1.1)
    else:
        fl.text(0.5, 0.5, "no TFLOP/s results yet\n(tensor-core families pending)", ha="center", va="center",
                transform=fl.transAxes, fontsize=9)
        fl.set_ylim(0, BF16_TFLOPS * 1.1)
        fl.set_xticks([])
    fl.axhline(BF16_TFLOPS, color="black", linestyle="--", linewidth=1)
    fl.text(0.02, BF16_TFLOPS * 1.02, "bf16 dense %.0f TFLOP/s" % BF16_TFLOPS, fontsize=8, transform=fl.get_yaxis_transform())
    fl.set_ylabel("achieved TFLOP/s")
    fl.set_title("Compute-bound", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(results_dir, out_dir):
    """Writes one PNG per results file and roofline.png into out_dir; returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = sorted(glob.glob(os.path.join(results_dir, "*.jsonl")))
    if not files:
        raise ValueError("results_dir: expected *.jsonl files in %s, found none" % results_dir)
    os.makedirs(out_dir, exist_ok=True)
    written, by_family = [], {}
    for f in files:
        name = os.path.splitext(os.path.basename(f))[0]
        records = load(f)
        by_family[name] = records
        path = os.path.join(out_dir, name + ".png")
        family_chart(plt, name, records, path)
        written.append(path)
    path = os.path.join(out_dir, "roofline.png")
    roofline_chart(plt, by_family, path)
    written.append(path)
    return written


def losses(results_dir):
    """[(family, op shape dtype, impl, ratio)] for Fray implementations slower than the best peer."""
    out = []
    for f in sorted(glob.glob(os.path.join(results_dir, "*.jsonl"))):
        for label, impls, best in groups(load(f)):
            for impl, us in impls.items():
                if impl.startswith("fray.") and best is not None and best / us < 1.0:
                    out.append((os.path.splitext(os.path.basename(f))[0], label, impl, best / us))
    return out


__all__ = ["render", "losses", "load", "groups", "COPY_TBPS", "BF16_TFLOPS"]
