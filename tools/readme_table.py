"""Print (or write into README.md) the operator tables from bench/results/h200/*.jsonl (and the
tables of TABLE_CARD from that card's results):
    python3 tools/readme_table.py [--write]

Tables are data first: every cell comes from a committed result row. "best peer" is the fastest
non-Fray impl of the row measured in the same process (error rows skipped); ratios use the
faster of fray.cuda and fray.triton; the host table (bench/host) compares fray.cuda's eager
per-call cost with torch's counterpart. --write replaces the text between the README's
<!-- table:NAME --> and <!-- /table:NAME --> markers.
"""
import argparse
import glob
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results", "h200")
# tables measured on another card than the H200 (the device tool lent an H100 when no H200 could be
# started): their rows come from that card's results, and the README says which card it was
TABLE_CARD = {"tensor_h100": "h100"}

# (table, op, shape, dtype, label shown in the shape column)
ROWS = [
    ("memory", "rmsnorm", "16384x8192", "bf16", None),
    ("memory", "rmsnorm", "16384x8192", "fp16", None),
    ("memory", "rmsnorm", "4096x8192", "bf16", None),
    ("memory", "rmsnorm", "1x8192:graph", "bf16", None),
    ("memory", "rmsnorm", "128x4096:graph", "bf16", None),
    ("memory", "add_rmsnorm", "16384x8192", "bf16", None),
    ("memory", "add_rmsnorm", "4096x8192", "bf16", None),
    ("memory", "add_rmsnorm", "1x8192:graph", "bf16", None),
    ("memory", "add_rmsnorm", "128x4096:graph", "bf16", None),
    ("memory", "layernorm", "16384x8192", "bf16", None),
    ("memory", "layernorm", "4096x8192", "bf16", None),
    ("memory", "silu_mul", "16384x8192", "bf16", None),
    ("memory", "silu_mul", "128x8192:graph", "bf16", None),
    ("memory", "gelu_mul", "16384x8192", "bf16", "16384x8192 (tanh)"),
    ("memory", "gelu_mul", "16384x8192:erf", "bf16", None),
    ("memory", "softmax", "16384x8192", "bf16", None),
    ("memory", "softmax", "524288x256", "bf16", None),
    ("memory", "softmax", "131072x1024", "bf16", None),
    ("memory", "softmax", "32768x4096", "bf16", None),
    ("memory", "softmax", "4096x32768", "bf16", None),
    ("memory", "softmax", "1024x131072", "bf16", None),
    ("memory", "softmax", "512x262144", "bf16", None),
    ("memory", "online_softmax", "16384x8192", "bf16", None),
    ("memory", "rope", "8192x32x128", "bf16", "8192x32x128 in place (k: 8 heads)"),
    ("memory", "rope", "8192x32x128:graph", "bf16", None),
    ("memory", "rope", "8192x32x128:fused_qkv", "bf16", None),
    ("memory", "vector_add", "268435456", "bf16", "2^28 elements"),
    ("memory", "vector_add", "1048576:graph", "bf16", "2^20 elements:graph"),
    ("sampling", "topk", "64x131072k50", "fp32", None),
    ("sampling", "topk", "64x131072k50", "bf16", None),
    ("sampling", "topk", "64x131072k50:unsorted", "fp32", None),
    ("sampling", "topk", "1x131072k50", "fp32", None),
    ("sampling", "topk", "64x131072k1024", "fp32", None),
    ("sampling", "topk", "64x131072k4096", "fp32", None),
    ("sampling", "topk", "4096x256k8", "fp32", None),
    ("sampling", "topk", "64x262144k50", "fp32", None),
    ("sampling", "argmax", "256x152064", "fp32", None),
    ("sampling", "argmax", "1x131072", "fp32", None),
    ("sampling", "argmax", "1x131072:graph", "fp32", None),
    ("sampling", "sample_topp", "64x131072", "fp32", None),
    ("sampling", "sample_topp", "64x131072:peaked", "fp32", None),
    ("sampling", "sample_topp", "64x131072:flat", "fp32", None),
    ("sampling", "sample_topp", "256x152064", "fp32", None),
    ("sampling", "sample_topp", "256x152064:peaked", "fp32", None),
    ("sampling", "sample_topp", "256x152064:flat", "fp32", None),
    ("sampling", "sample_topk", "64x131072", "fp32", None),
    ("sampling", "sample_topk", "256x152064", "fp32", None),
    ("sampling", "decode_step", "64x152064", "fp32", None),
    ("attention", "decode_attention", "B32Hq32Hkv8T4096D128", "bf16", None),
    ("attention", "decode_attention", "B64Hq64Hkv8T8192D128", "bf16", None),
    ("attention", "decode_attention", "B1Hq32Hkv8T4096D128", "bf16", None),
    ("attention", "decode_attention", "B1Hq32Hkv8T4096D128:graph", "bf16", None),
    ("attention", "decode_attention", "B64Hq32Hkv8Tvar8192D128", "bf16", None),
    ("attention", "paged_decode_attention", "B32Hq32Hkv8T4096D128P16", "bf16", None),
    ("attention", "paged_decode_attention", "B32Hq32Hkv8T4096D128P64", "bf16", None),
    ("attention", "paged_decode_attention", "B64Hq64Hkv8T8192D128P16", "bf16", None),
    ("attention", "paged_decode_attention", "B64Hq32Hkv8Tvar8192D128P16", "bf16", None),
    ("attention", "paged_decode_attention", "B1Hq32Hkv8T4096D128P16:graph", "bf16", None),
    ("attention", "kv_append", "B64Hkv8D128", "bf16", None),
    ("attention", "kv_append", "B64Hkv8D128:graph", "bf16", None),
    ("attention", "kv_append_paged", "B64Hkv8D128P16", "bf16", None),
    ("gemm", "gemm", "4096x4096x4096", "bf16", None),
    ("gemm", "gemm", "8192x8192x8192", "bf16", None),
    ("gemm", "gemm", "4096x14336x4096", "bf16", None),
    ("gemm", "gemm", "4096x4096x14336", "bf16", None),
    ("gemm", "gemm", "128x4096x4096", "bf16", None),
    ("gemm", "gemm", "64x4096x4096", "bf16", None),
    ("gemm", "gemm", "16x14336x4096", "bf16", None),
    ("gemm", "gemm", "1x4096x4096", "bf16", None),
    ("gemm", "gemm", "1x4096x4096:graph", "bf16", None),
    ("gemm", "gemm", "4096x4096x4096", "fp16", None),
    ("gemm", "scaled_gemm", "int8:4096x11008x4096", "int8->bf16", "int8 4096x11008x4096 (token x channel)"),
    ("gemm", "scaled_gemm", "int8:8192x8192x8192", "int8->bf16", "int8 8192^3"),
    ("gemm", "scaled_gemm", "int8:16x8192x8192:graph", "int8->bf16", "int8 16x8192x8192:graph"),
    ("gemm", "scaled_gemm", "fp8:4096x11008x4096", "e4m3->bf16", "e4m3 row-wise 4096x11008x4096"),
    ("gemm", "scaled_gemm", "fp8:8192x8192x8192", "e4m3->bf16", "e4m3 row-wise 8192^3"),
    ("gemm", "scaled_gemm", "fp8fast:8192x8192x8192", "e4m3->bf16", "e4m3 row-wise 8192^3, fast_accum"),
    ("gemm", "scaled_gemm", "fp8:16x8192x8192:graph", "e4m3->bf16", "e4m3 row-wise 16x8192x8192:graph"),
    ("gemm", "scaled_gemm", "block:4096x7168x16384", "e4m3->bf16", "e4m3 block 4096x7168x16384"),
    ("gemm", "scaled_gemm", "block:128x7168x16384", "e4m3->bf16", "e4m3 block 128x7168x16384"),
    ("gemm", "w8a16_gemm", "int8-channel:1x8192x8192:graph", "bf16xint8->bf16", "W8A16 int8 per channel 1x8192x8192:graph"),
    ("gemm", "w8a16_gemm", "fp8-group:1x8192x8192:graph", "bf16xe4m3->bf16", "W8A16 e4m3 group-128 1x8192x8192:graph"),
    ("gemm", "w8a16_gemm", "int8-channel:16x8192x8192:graph", "bf16xint8->bf16", "W8A16 int8 per channel 16x8192x8192:graph"),
    ("gemm", "w8a16_gemm", "int8-channel:1x8192x8192", "bf16xint8->bf16", "W8A16 int8 per channel 1x8192x8192"),
    ("tensor_h100", "fused_moe", "e64h4096i1408k6:T4096:prepared", "bf16", "T4096 E64 H4096 I1408 k6, prepared"),
    ("tensor_h100", "fused_moe", "e64h4096i1408k6:T4096", "bf16", "T4096 E64 H4096 I1408 k6"),
    ("tensor_h100", "fused_moe", "mixtral:T4096", "bf16", "Mixtral-8x7B T4096"),
    ("tensor_h100", "fused_moe", "qwen3:T4096", "bf16", "Qwen3-30B-A3B T4096"),
    ("tensor_h100", "fused_moe", "dsv2lite:T4096", "bf16", "DeepSeek-V2-Lite T4096"),
    ("tensor_h100", "fused_moe", "mixtral:T1", "bf16", "Mixtral-8x7B T1 (eager)"),
    ("tensor_h100", "fused_moe", "qwen3:T16", "bf16", "Qwen3-30B-A3B T16 (eager)"),
    ("tensor_h100", "fused_moe", "dsv3ep8:T1", "bf16", "DeepSeek-V3 rank of 8 T1 (eager)"),
    ("tensor_h100", "grouped_gemm", "G64x384N2816K4096", "bf16", "64 x 384 rows N2816 K4096"),
    ("tensor_h100", "grouped_gemm", "G64x384N2816K4096:uneven", "bf16", "uneven, 24576 rows N2816 K4096"),
    ("tensor_h100", "grouped_gemm", "G8x1024N28672K4096", "bf16", "8 x 1024 rows N28672 K4096"),
    ("tensor_h100", "prefill_attention", "B2Hq32Hkv8S8192D128:causal", "bf16", "B2 Hq32 Hkv8 S8192 D128 causal"),
    ("tensor_h100", "prefill_attention", "B2Hq32Hkv8S8192D128", "bf16", "B2 Hq32 Hkv8 S8192 D128"),
    ("tensor_h100", "prefill_attention", "B2Hq32Hkv8S16384D128:causal", "bf16", "B2 Hq32 Hkv8 S16384 D128 causal"),
    ("tensor_h100", "prefill_attention", "B2Hq32Hkv8S8192D64", "bf16", "B2 Hq32 Hkv8 S8192 D64"),
    ("tensor_h100", "prefill_attention", "B2Hq32Hkv8S8192D256", "bf16", "B2 Hq32 Hkv8 S8192 D256"),
    ("tensor_h100", "prefill_attention", "B2Hq32Hkv8S1024D128:causal", "bf16", "B2 Hq32 Hkv8 S1024 D128 causal"),
    ("tensor_h100", "prefill_attention", "B16Hq32Hkv8Svar8192D128:causal", "bf16",
     "varlen: 16 sequences of 128-8192, D128 causal"),
    ("tensor_h100", "prefill_attention", "B1Hq32Hkv8S2048K16384D128:causal", "bf16",
     "chunked: 2048 queries over 16384 keys, D128"),
    ("tensor_h100", "prefill_attention", "B1Hq32Hkv8S2048K16384D128P64:causal", "bf16",
     "chunked over a paged prefix (64-key pages), D128"),
    ("tensor_h100", "mla_decode", "B128Hq16Sq1T16384", "bf16", None),
    ("tensor_h100", "mla_decode", "B128Hq128Sq2T4096", "bf16", None),
    ("tensor_h100", "mla_decode", "B32Hq16Sq1T4096", "bf16", None),
    ("tensor_h100", "mla_decode", "B128Hq16Sq2T4096", "bf16", None),
    ("tensor_h100", "mla_decode", "B1Hq128Sq1T4096:graph", "bf16", None),
    ("tensor_h100", "rmsnorm_quant", "plain:16384x8192", "bf16->int8", None),
    ("tensor_h100", "rmsnorm_quant", "residual:16384x8192", "bf16->int8", None),
]
PEER_NAMES = {"torch.builtin": None, "torch.eager": "torch eager", "torch.compile": "torch.compile"}
BUILTIN = {"gemm": "torch.mm", "rmsnorm": "F.rms_norm", "softmax": "torch.softmax", "online_softmax": "torch.softmax+amax+logsumexp", "layernorm": "F.layer_norm",
           "vector_add": "torch.add", "topk": "torch.topk", "argmax": "torch.argmax",
           "decode_attention": "SDPA", "paged_decode_attention": "SDPA (contiguous)", "prefill_attention": "SDPA"}


def load(results=RESULTS):
    rows = {}
    for path in glob.glob(os.path.join(results, "*.jsonl")):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    if "impl" in r:  # config sweeps (moe_gemm_sweep.jsonl) are not benchmark rows
                        rows.setdefault((r["op"], r["shape"], r["dtype"]), {})[r["impl"]] = r
    return rows


def cell(r):
    if r is None or r.get("us") is None:
        return "-"
    s = "%.1f µs" % r["us"] if r["us"] >= 10 else "%.2f µs" % r["us"]
    if r.get("gbps") and not r["shape"].endswith(":graph"):
        s += " (%.2f TB/s)" % (r["gbps"] / 1000)
    elif r.get("tflops") and not r["shape"].endswith(":graph"):
        s += " (%.0f TFLOP/s)" % r["tflops"]
    return s


def peer_name(op, impl):
    base, _, variant = impl.partition(":")
    if base == "torch.builtin":
        name = BUILTIN.get(op, "torch built-in")
        return name + (" (%s)" % variant if variant else "")
    return PEER_NAMES.get(impl, impl)


def table(name, data):
    out = ["| op | shape dtype | fray.cuda | fray.triton | best peer | Fray vs best peer |", "|---|---|---|---|---|---|"]
    for t, op, shape, dtype, label in ROWS:
        if t != name:
            continue
        impls = data.get((op, shape, dtype))
        if not impls:
            continue
        fr = [r for k, r in impls.items() if k in ("fray.cuda", "fray.triton") and r.get("us")]
        peers = [r for k, r in impls.items() if not k.startswith("fray.") and r.get("us")]
        best = min(peers, key=lambda r: r["us"]) if peers else None
        mine = min(fr, key=lambda r: r["us"]) if fr else None
        ratio = "%.2fx" % (best["us"] / mine["us"]) if best and mine else "-"
        shown = (label or shape).replace(":graph", ", graph replay")
        out.append("| %s | %s %s | %s | %s | %s | %s |" % (
            op, shown, dtype, cell(impls.get("fray.cuda")), cell(impls.get("fray.triton")),
            "%s: %s" % (peer_name(op, best["impl"]), cell(best)) if best else "-", ratio))
    return "\n".join(out)


HOST_PEERS = {"torch.builtin": None, "torch.eager": "torch composite", "flashinfer": "FlashInfer"}
# bench/host's built-in peer where it is not the kernel benchmarks' (online_softmax's is torch.softmax
# alone, without the statistics)
HOST_BUILTIN = {"online_softmax": "torch.softmax", "prefill_attention": "SDPA (causal)", "scaled_gemm": "torch._scaled_mm",
                "w8a16_gemm": "torch.mm bf16"}


def host_table(data):
    """bench/host rows (shape suffixed ":host"): eager per-call host cost, fray.cuda against the
    fastest torch counterpart (built-in, else composite), FlashInfer where measured, and the
    torch.add floor (the vector_add row's built-in peer)."""
    out = ["| op | shape dtype | fray.cuda | fray.triton | torch | fray.cuda vs torch | FlashInfer |",
           "|---|---|---|---|---|---|---|"]
    keys = sorted((k for k in data if k[1].endswith(":host")), key=lambda k: k[0])
    for op, shape, dtype in keys:
        impls = data[(op, shape, dtype)]
        torch_rows = [r for k, r in impls.items() if k.startswith("torch.") and r.get("us")]
        peer = min(torch_rows, key=lambda r: r["us"]) if torch_rows else None
        mine = impls.get("fray.cuda")
        ratio = "%.2fx" % (mine["us"] / peer["us"]) if peer and mine and mine.get("us") else "-"
        label = (HOST_PEERS.get(peer["impl"]) or HOST_BUILTIN.get(op) or BUILTIN.get(op, "torch built-in")) if peer else None
        out.append("| %s | %s %s | %s | %s | %s | %s | %s |" % (
            op, shape[:-len(":host")], dtype, cell(mine), cell(impls.get("fray.triton")),
            "%s: %s" % (label, cell(peer)) if peer else "-", ratio, cell(impls.get("flashinfer"))))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    data = load()
    cards = {c: load(os.path.join(ROOT, "bench", "results", c)) for c in set(TABLE_CARD.values())}
    names = sorted({r[0] for r in ROWS})
    tables = {n: table(n, cards[TABLE_CARD[n]] if n in TABLE_CARD else data) for n in names}
    tables["host"] = host_table(data)
    if not a.write:
        for n, t in tables.items():
            print("## %s\n\n%s\n" % (n, t))
        return
    path = os.path.join(ROOT, "README.md")
    text = open(path).read()
    for n in tables:
        pat = re.compile(r"(<!-- table:%s -->\n).*?(<!-- /table:%s -->)" % (n, n), re.S)
        if not pat.search(text):
            raise SystemExit("README.md has no <!-- table:%s --> markers" % n)
        text = pat.sub(lambda m: m.group(1) + tables[n] + "\n" + m.group(2), text)
    open(path, "w").write(text)


if __name__ == "__main__":
    main()
