"""Sampling-family benchmarks: Fray's backends and the peers a user would pick, in one process.

Ops (bench/sampling/<op>.py): topk, argmax, sample_topp and sample_topk (both fray.sample),
decode_step, apply_penalties. Every row is distinguishable by its op; topk rows are op "topk".
Logits are fixed-seed standard normal fp32 unless the shape says otherwise.

topk bytes:    read x = R·W·s(x) (values and int64 indices written, R·k·(s + 8), not counted)
  shapes "RxWkK": 64x131072k50, 1x131072k50, 64x131072k1024, 64x131072k4096, 4096x256k8,
  64x262144k50 (fp32), 64x131072k50 (bf16), and 64x131072k50:unsorted (sorted=False).
  Peers: torch.builtin = torch.topk(x, k, sorted=True); the unsorted shape adds
  torch.builtin:unsorted = torch.topk(x, k, sorted=False).
argmax bytes:  read x = R·W·s(x). Shapes 256x152064, 1x131072 (fp32). Peer: torch.builtin =
  torch.argmax(x, dim=-1).
sample_topp bytes: read logits = R·V·4. fray.sample(logits, temperature=0.8, top_p=0.9,
  seeds=..., offsets=...) with int64 [B] seeds / offsets on the device, Python-scalar
  parameters (fray builds the [B] parameter tensors in each call, as a user's call would).
  Shapes 64x131072, 256x152064 (standard normal: top-p keeps ~51% of the vocab); ":peaked" =
  randn·8 (a confident model: top-p keeps 1-17 tokens per row of 64x131072, median 3);
  ":flat" = randn·0.1 (nearly uniform: top-p keeps ~88% of the vocab, the worst case for a
  threshold search).
  Peers: torch.eager = the composite logits / T -> softmax -> sort descending -> cumsum -> drop
  tokens whose preceding mass exceeds p (the first always stays) -> renormalise ->
  torch.multinomial -> gather the index; torch.compile = that composite under
  torch.compile(fullgraph=True) (it compiles without graph breaks on torch 2.13: multinomial
  falls back to ATen inside the graph; a failure to compile leaves an error row).
sample_topk bytes: read logits = R·V·4. top_k=50, top_p=0.9, temperature 0.8 on 64x131072 and
  256x152064 (standard normal). Peers: torch.eager = topk(50) first, then temperature, softmax,
  top-p and multinomial over the 50 survivors (the cheap order; same result as filtering the full
  vocabulary); torch.eager:hf = the Hugging Face warper chain (temperature, top-k by masking the
  full vocabulary to -inf, top-p by sorting the full vocabulary, softmax, multinomial);
  torch.compile = the first composite compiled (fullgraph=True).
decode_step bytes: read logits = R·V·4 (the history ids, R·256·8, and the penalty writes to at
  most 256 entries per row are not counted). 64x152064, histories of 256 random ids per row (CSR
  token_offsets = 256·b, int64), repetition 1.1, presence 0.5, frequency 0.3, temperature 0.8,
  top_k 50, top_p 0.9. fray.decode_step penalises logits in place, as engines call it: over the
  repeated timed calls the history entries drift towards -inf, which changes no memory traffic.
  Peer: torch.eager = bin counts by scatter_add over the [B, 256] histories, repetition /
  presence / frequency by torch.where (out of place), then the sample_topk composite.
apply_penalties bytes: read logits = R·V·4 (as decode_step; in place). 64x152064, the same
  histories and penalties; peer torch.eager = the penalty half of decode_step's composite.
"""
import collections
import re

import torch

import fray

SEED = 0
TEMPERATURE, TOP_P, TOP_K = 0.8, 0.9, 50
REPETITION, PRESENCE, FREQUENCY = 1.1, 0.5, 0.3
HISTORY = 256

TopK = collections.namedtuple("TopK", "rows width k sorted")
Rows = collections.namedtuple("Rows", "rows width dist")  # dist: "normal", "peaked" or "flat"

_F32, _BF16 = torch.float32, torch.bfloat16
_SAMPLE = [(Rows(r, w, d), _F32) for r, w in ((64, 131072), (256, 152064)) for d in ("normal", "peaked", "flat")]
SHAPES = {
    "topk": [(TopK(r, w, k, True), _F32) for r, w, k in (
        (64, 131072, 50), (1, 131072, 50), (64, 131072, 1024), (64, 131072, 4096), (4096, 256, 8),
        (64, 262144, 50))] + [(TopK(64, 131072, 50, True), _BF16), (TopK(64, 131072, 50, False), _F32)],
    "argmax": [(Rows(256, 152064, "normal"), _F32), (Rows(1, 131072, "normal"), _F32)],
    "sample_topp": _SAMPLE,
    "sample_topk": [s for s in _SAMPLE if s[0].dist == "normal"],
    "decode_step": [(Rows(64, 152064, "normal"), _F32)],
    "apply_penalties": [(Rows(64, 152064, "normal"), _F32)],
}
OPS = tuple(SHAPES)
# `fray bench <op>` takes the family's public op names; "sample" runs both sample benchmarks.
BENCH_OPS = {op: (op,) for op in OPS}
BENCH_OPS["sample"] = ("sample_topp", "sample_topk")


def shape_name(spec):
    if isinstance(spec, TopK):
        return "%dx%dk%d%s" % (spec.rows, spec.width, spec.k, "" if spec.sorted else ":unsorted")
    return "%dx%d%s" % (spec.rows, spec.width, "" if spec.dist == "normal" else ":" + spec.dist)


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_SHAPE_RE = re.compile(r"(\d+)x(\d+)(?:k(\d+))?$")


def parse_shapes(op, text):
    """--shapes for this family: a comma list of shape names as recorded ("64x131072k50",
    "64x131072k50:unsorted", "64x131072:flat"), each optionally ending in ":fp32" / ":bf16"."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        dtype = _DTYPES[parts.pop()] if len(parts) > 1 and parts[-1] in _DTYPES else _F32
        m = _SHAPE_RE.match(parts[0])
        variant = parts[1] if len(parts) > 1 else None
        if not m or len(parts) > 2:
            raise ValueError("shapes: expected ROWSxWIDTH[kK][:variant][:dtype], got %r" % item)
        rows, width, k = int(m.group(1)), int(m.group(2)), m.group(3)
        if op == "topk":
            if k is None or variant not in (None, "unsorted"):
                raise ValueError("shapes: topk takes ROWSxWIDTHkK[:unsorted][:dtype], got %r" % item)
            out.append((TopK(rows, width, int(k), variant is None), dtype))
        else:
            if k is not None or variant not in (None, "peaked", "flat"):
                raise ValueError("shapes: %s takes ROWSxWIDTH[:peaked|:flat][:dtype], got %r" % (op, item))
            out.append((Rows(rows, width, variant or "normal"), dtype))
    return out


# ---------------------------------------------------------------------------------------------
# peers

def _top_p_sorted(probs, top_p):
    """probs sorted descending -> renormalised, keeping tokens whose preceding mass is <= top_p."""
    drop = (torch.cumsum(probs, dim=-1) - probs) > top_p
    probs = probs.masked_fill(drop, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def _eager_sample_topp(logits, temperature, top_p):
    probs = torch.softmax(logits / temperature, dim=-1)
    probs, idx = torch.sort(probs, dim=-1, descending=True)
    choice = torch.multinomial(_top_p_sorted(probs, top_p), 1)
    return torch.gather(idx, -1, choice).squeeze(-1)


def _eager_sample_topk(logits, temperature, top_k, top_p):
    vals, idx = torch.topk(logits, top_k, dim=-1)
    probs = torch.softmax(vals / temperature, dim=-1)
    choice = torch.multinomial(_top_p_sorted(probs, top_p), 1)
    return torch.gather(idx, -1, choice).squeeze(-1)


def _hf_sample_topk(logits, temperature, top_k, top_p):
    scores = logits / temperature
    kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
    scores = scores.masked_fill(scores < kth, float("-inf"))
    sorted_scores, idx = torch.sort(scores, dim=-1, descending=False)
    cum = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
    drop = cum <= 1 - top_p
    drop[..., -1:] = False
    scores = scores.masked_fill(drop.scatter(1, idx, drop), float("-inf"))
    return torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(-1)


def _eager_penalties(logits, history, repetition, presence, frequency):
    """history: int64 [B, L] (the CSR rows of equal length, as a padded tensor)."""
    counts = torch.zeros_like(logits).scatter_add_(1, history, torch.ones(history.shape, dtype=logits.dtype,
                                                                          device=logits.device))
    seen = counts > 0
    scaled = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, scaled, logits)
    return logits - presence * seen.to(logits.dtype) - frequency * counts


def _eager_decode_step(logits, history, repetition, presence, frequency, temperature, top_k, top_p):
    logits = _eager_penalties(logits, history, repetition, presence, frequency)
    return _eager_sample_topk(logits, temperature, top_k, top_p)


# ---------------------------------------------------------------------------------------------
# inputs and impls

def inputs(op, spec, dtype, device):
    g = torch.Generator(device=device).manual_seed(SEED)
    x = torch.randn(spec.rows, spec.width, device=device, generator=g)
    dist = getattr(spec, "dist", "normal")
    if dist == "peaked":
        x *= 8.0
    elif dist == "flat":
        x *= 0.1
    inp = {"x": x.to(dtype)}
    if op in ("sample_topp", "sample_topk", "decode_step"):
        inp["seeds"] = torch.arange(spec.rows, device=device, dtype=torch.int64) + 1234
        inp["offsets"] = torch.zeros(spec.rows, device=device, dtype=torch.int64)
    if op in ("decode_step", "apply_penalties"):
        hist = torch.randint(0, spec.width, (spec.rows, HISTORY), device=device, generator=g)
        inp["history"] = hist
        inp["token_ids"] = hist.reshape(-1)
        inp["token_offsets"] = torch.arange(spec.rows + 1, device=device, dtype=torch.int64) * HISTORY
    return inp


def impls(op, spec, inp, compile_fn=torch.compile):
    """{impl name: zero-argument callable} for one shape; compile_fn is torch.compile (tests
    pass a stand-in)."""
    x = inp["x"]
    out = {}
    if op == "topk":
        for backend in ("cuda", "triton"):
            out["fray." + backend] = lambda b=backend: fray.topk(x, spec.k, sorted=spec.sorted, backend=b)
        out["torch.builtin"] = lambda: torch.topk(x, spec.k, dim=-1, sorted=True)
        if not spec.sorted:
            out["torch.builtin:unsorted"] = lambda: torch.topk(x, spec.k, dim=-1, sorted=False)
    elif op == "argmax":
        for backend in ("cuda", "triton"):
            out["fray." + backend] = lambda b=backend: fray.argmax(x, backend=b)
        out["torch.builtin"] = lambda: torch.argmax(x, dim=-1)
    elif op == "sample_topp":
        seeds, offsets = inp["seeds"], inp["offsets"]
        for backend in ("cuda", "triton"):
            out["fray." + backend] = lambda b=backend: fray.sample(
                x, temperature=TEMPERATURE, top_p=TOP_P, seeds=seeds, offsets=offsets, backend=b)
        out["torch.eager"] = lambda: _eager_sample_topp(x, TEMPERATURE, TOP_P)
        compiled = compile_fn(_eager_sample_topp, fullgraph=True)
        out["torch.compile"] = lambda: compiled(x, TEMPERATURE, TOP_P)
    elif op == "sample_topk":
        seeds, offsets = inp["seeds"], inp["offsets"]
        for backend in ("cuda", "triton"):
            out["fray." + backend] = lambda b=backend: fray.sample(
                x, temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P, seeds=seeds, offsets=offsets, backend=b)
        out["torch.eager"] = lambda: _eager_sample_topk(x, TEMPERATURE, TOP_K, TOP_P)
        out["torch.eager:hf"] = lambda: _hf_sample_topk(x, TEMPERATURE, TOP_K, TOP_P)
        compiled = compile_fn(_eager_sample_topk, fullgraph=True)
        out["torch.compile"] = lambda: compiled(x, TEMPERATURE, TOP_K, TOP_P)
    elif op == "decode_step":
        ids, offs, seeds, offsets = inp["token_ids"], inp["token_offsets"], inp["seeds"], inp["offsets"]
        for backend in ("cuda", "triton"):
            out["fray." + backend] = lambda b=backend: fray.decode_step(
                x, ids, offs, repetition=REPETITION, presence=PRESENCE, frequency=FREQUENCY,
                temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P, seeds=seeds, offsets=offsets, backend=b)
        out["torch.eager"] = lambda: _eager_decode_step(x, inp["history"], REPETITION, PRESENCE, FREQUENCY,
                                                        TEMPERATURE, TOP_K, TOP_P)
    elif op == "apply_penalties":
        ids, offs = inp["token_ids"], inp["token_offsets"]
        for backend in ("cuda", "triton"):
            out["fray." + backend] = lambda b=backend: fray.apply_penalties(
                x, ids, offs, repetition=REPETITION, presence=PRESENCE, frequency=FREQUENCY, backend=b)
        out["torch.eager"] = lambda: _eager_penalties(x, inp["history"], REPETITION, PRESENCE, FREQUENCY)
    else:
        raise ValueError("op: expected one of %s, got %r" % (", ".join(OPS), op))
    return out


def nbytes(spec, dtype):
    return spec.rows * spec.width * torch.tensor([], dtype=dtype).element_size()


def _notes(op):
    if op in ("sample_topp", "sample_topk"):
        return "temperature %g, top_p %g%s; scalar params; seeds/offsets int64 [B]" % (
            TEMPERATURE, TOP_P, ", top_k %d" % TOP_K if op == "sample_topk" else "")
    if op in ("decode_step", "apply_penalties"):
        return "history %d ids/row; repetition %g, presence %g, frequency %g%s; fray in place" % (
            HISTORY, REPETITION, PRESENCE, FREQUENCY,
            "; temperature %g, top_k %d, top_p %g" % (TEMPERATURE, TOP_K, TOP_P) if op == "decode_step" else "")
    return None


def run(op, recorder, shapes=None, graph=True, device="cuda", compile_fn=torch.compile):
    if op not in BENCH_OPS:
        raise ValueError("op: expected one of %s, got %r" % (", ".join(BENCH_OPS), op))
    if len(BENCH_OPS[op]) > 1:
        for one in BENCH_OPS[op]:
            run(one, recorder, shapes, graph, device, compile_fn)
        return
    from fray import bench
    notes = _notes(op)
    extra = {"notes": notes} if notes else {}
    for spec, dtype in shapes or SHAPES[op]:
        inp = inputs(op, spec, dtype, device)
        fns = impls(op, spec, inp, compile_fn)
        bench.bench_impls(recorder, op, shape_name(spec), dtype, fns, nbytes(spec, dtype), graph=graph, **extra)
        del fns, inp
        if device == "cuda":
            torch.cuda.empty_cache()
