"""A real client: a Llama-shaped decoder step built from Fray ops, against the same model in torch.

One decode step for a batch over a paged KV cache: per layer rmsnorm -> qkv matmul -> rope ->
kv_append_paged -> paged_decode_attention -> o matmul -> add_rmsnorm -> gate_up matmul ->
silu_mul -> down matmul, then add_rmsnorm -> lm_head -> sample (greedy). The matmuls are torch's
(Fray has no GEMM yet). The torch model is the same step written with F.rms_norm, a rotate-half
rope, SDPA over the gathered pages, F.silu and argmax.

Lockstep: both models run the same steps from the same weights and caches; the logits must agree
within bf16 tolerance (a few roundings per layer differ in order) and the greedy tokens must be
equal wherever torch's top-2 logit margin exceeds that tolerance (a closer pair is a tie either
model may break its own way; those rows are counted, not compared).

Timed (µs per step, median of rounds; eager forms as bench/host times a call, 50 steps back to
back, the graph as the benchmarks' graph rows, by events around each replay): fray eager, fray
under CUDA-graph replay, fray under torch.compile(fullgraph=True), torch eager, and the matmuls
alone eager (what the step costs
without any Fray op: the eager step should be within 1.2x of graph replay + this).
Records: op "decoder_step", shape "L2H4096B8T1000P16" (+ ":graph", ":compile", ":matmuls"), and
":ops_host": the host time spent inside the Fray calls of an eager step (each public op timed
around its call; `per_op` holds µs per step by op), which bench/host's hot loop understates.
"""
import math
import time

import torch
import torch.nn.functional as F

import fray
from fray.bench import graph_us, median
from fray.bench.host import host_us

STEPS = 50  # back-to-back steps per timed round

OPS = ("e2e",)
BENCH_OPS = ("e2e",)
EPS = 1e-5


class Config:
    def __init__(self, layers=2, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=11008, vocab=32000,
                 batch=8, context=1000, page=16, max_position=4096):
        self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim = layers, hidden, heads, kv_heads, head_dim
        self.intermediate, self.vocab, self.batch, self.context, self.page = intermediate, vocab, batch, context, page
        self.max_position = max_position
        self.blocks = -(-(context + 1) // page)  # room for the step's new token

    def name(self):
        return "L%dH%dB%dT%dP%d" % (self.layers, self.hidden, self.batch, self.context, self.page)


def build(cfg, device, dtype=torch.bfloat16, seed=0):
    """Weights, the paged caches (context tokens already in them) and the step's inputs."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=g, device=device) * std).to(dtype)

    h, d, hq, hkv = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads
    std = 1.0 / math.sqrt(h)
    layers = []
    for _ in range(cfg.layers):
        layers.append({
            "w_in": 1.0 + randn(h, std=0.1), "w_post": 1.0 + randn(h, std=0.1),
            "wqkv": randn((hq + 2 * hkv) * d, h, std=std), "wo": randn(h, hq * d, std=1.0 / math.sqrt(hq * d)),
            "wgu": randn(2 * cfg.intermediate, h, std=std), "wd": randn(h, cfg.intermediate,
                                                                     std=1.0 / math.sqrt(cfg.intermediate)),
            "k_pages": randn(cfg.batch * cfg.blocks, cfg.page, hkv, d), "v_pages": randn(cfg.batch * cfg.blocks,
                                                                                         cfg.page, hkv, d),
        })
    perm = torch.randperm(cfg.batch * cfg.blocks, generator=torch.Generator().manual_seed(seed))
    return {
        "layers": layers, "w_final": 1.0 + randn(h, std=0.1), "embed": randn(cfg.vocab, h),
        "lm_head": randn(cfg.vocab, h, std=std),
        "block_table": perm.view(cfg.batch, cfg.blocks).to(torch.int32).to(device),
        "lens": torch.full((cfg.batch,), cfg.context, dtype=torch.int32, device=device),
        "tokens": torch.randint(0, cfg.vocab, (cfg.batch,), generator=g, device=device),
        "seeds": torch.arange(cfg.batch, device=device), "offsets": torch.zeros(cfg.batch, dtype=torch.int64,
                                                                                device=device),
    }


def attention_block(cfg, x, wqkv, wo, k_pages, v_pages, table, lens, lens_after):
    """The attention half of a layer from Fray ops: q, k, v = x @ wqkv^T; rope at lens; k, v
    appended to the paged cache at lens; paged decode over lens_after; the output projection.
    Returns (o [B, hidden], attn [B, Hq, D])."""
    b, hq, hkv, d = cfg.batch, cfg.heads, cfg.kv_heads, cfg.head_dim
    qkv = x @ wqkv.t()
    q = qkv[:, :hq * d].view(b, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].view(b, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(b, hkv, d)
    fray.rope(q, k, lens, max_position=cfg.max_position, inplace=True)
    fray.kv_append_paged(k_pages, v_pages, table, k, v, lens)
    attn = fray.paged_decode_attention(q, k_pages, v_pages, table, lens_after)
    return attn.view(b, hq * d) @ wo.t(), attn


def fray_step(cfg, m):
    """One decode step from Fray ops (+ torch matmuls); returns (tokens, logits)."""
    lens, table = m["lens"], m["block_table"]
    lens_after = lens + 1
    h = m["embed"][m["tokens"]]
    x = fray.rmsnorm(h, m["layers"][0]["w_in"], EPS)
    for i, lw in enumerate(m["layers"]):
        o, _ = attention_block(cfg, x, lw["wqkv"], lw["wo"], lw["k_pages"], lw["v_pages"], table, lens, lens_after)
        x, h = fray.add_rmsnorm(o, h, lw["w_post"], EPS)
        mlp = fray.silu_mul(x @ lw["wgu"].t()) @ lw["wd"].t()
        nxt = m["layers"][i + 1]["w_in"] if i + 1 < len(m["layers"]) else m["w_final"]
        x, h = fray.add_rmsnorm(mlp, h, nxt, EPS)
    logits = (x @ m["lm_head"].t()).float()
    tokens = fray.sample(logits, temperature=0.0, seeds=m["seeds"], offsets=m["offsets"])
    return tokens, logits


def _torch_rope(t, pos, max_position, theta=10000.0):
    """neox (rotate-half) rope of t [B, H, D] at positions pos [B], fp32 math."""
    d = t.shape[-1]
    inv = theta ** (-torch.arange(0, d // 2, device=t.device, dtype=torch.float64) * 2 / d)
    ang = (pos.to(torch.float64)[:, None] * inv[None, :]).float()
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    tf = t.float()
    a, b2 = tf[..., :d // 2], tf[..., d // 2:]
    return torch.cat([a * cos - b2 * sin, b2 * cos + a * sin], dim=-1).to(t.dtype)


def torch_step(cfg, m):
    """The same step in plain torch (paged cache written and gathered by indexing)."""
    b, hq, hkv, d, page = cfg.batch, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.page
    lens, table = m["lens"], m["block_table"]
    ar = torch.arange(b, device=lens.device)
    h = m["embed"][m["tokens"]]
    x = F.rms_norm(h, (cfg.hidden,), m["layers"][0]["w_in"], EPS)
    t = cfg.blocks * page
    keep = torch.arange(t, device=lens.device)[None, :] < (lens + 1)[:, None]
    for i, lw in enumerate(m["layers"]):
        qkv = x @ lw["wqkv"].t()
        q = _torch_rope(qkv[:, :hq * d].view(b, hq, d), lens, cfg.max_position)
        k = _torch_rope(qkv[:, hq * d:(hq + hkv) * d].view(b, hkv, d), lens, cfg.max_position)
        v = qkv[:, (hq + hkv) * d:].view(b, hkv, d)
        blocks = table[ar, (lens // page).long()].long()
        lw["k_pages"][blocks, (lens % page).long()] = k
        lw["v_pages"][blocks, (lens % page).long()] = v
        kc = lw["k_pages"][table.long()].view(b, t, hkv, d).transpose(1, 2)
        vc = lw["v_pages"][table.long()].view(b, t, hkv, d).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q[:, :, None], kc, vc, attn_mask=keep[:, None, None, :],
                                              enable_gqa=True)
        o = attn.reshape(b, hq * d) @ lw["wo"].t()
        h = o + h
        x = F.rms_norm(h, (cfg.hidden,), lw["w_post"], EPS)
        gu = x @ lw["wgu"].t()
        mlp = (F.silu(gu[:, :cfg.intermediate].float()) * gu[:, cfg.intermediate:].float()).to(h.dtype) @ lw["wd"].t()
        h = mlp + h
        nxt = m["layers"][i + 1]["w_in"] if i + 1 < len(m["layers"]) else m["w_final"]
        x = F.rms_norm(h, (cfg.hidden,), nxt, EPS)
    logits = (x @ m["lm_head"].t()).float()
    return logits.argmax(-1), logits


def matmul_step(cfg, m):
    """Only the step's torch matmuls (and the embedding gather), eager: the floor Fray adds to."""
    b, hq, d = cfg.batch, cfg.heads, cfg.head_dim
    h = m["embed"][m["tokens"]]
    x = h
    for lw in m["layers"]:
        x @ lw["wqkv"].t()
        o = x.new_empty(b, hq * d) @ lw["wo"].t()
        gu = o @ lw["wgu"].t()
        x = gu[:, :cfg.intermediate] @ lw["wd"].t()
    return (x @ m["lm_head"].t()).float()


STEP_OPS = ("rmsnorm", "rope", "kv_append_paged", "paged_decode_attention", "add_rmsnorm", "silu_mul", "sample")


def ops_host_us(step, steps=STEPS, ops=STEP_OPS):
    """{op: µs per step spent inside fray.<op> calls} over `steps` eager steps (each call timed on
    the host around it, no synchronisation; the step reaches the ops as attributes of fray)."""
    spent = dict.fromkeys(ops, 0.0)
    orig = {name: getattr(fray, name) for name in ops}

    def timed(name, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
        return call
    try:
        for name in ops:
            setattr(fray, name, timed(name, orig[name]))
        step()  # warm (plans built)
        spent.update(dict.fromkeys(ops, 0.0))
        for _ in range(steps):
            step()
    finally:
        for name, fn in orig.items():
            setattr(fray, name, fn)
    return {name: v * 1e6 / steps for name, v in spent.items()}


def lockstep(cfg, fray_model, torch_model, steps=3, atol=None):
    """Run both models `steps` steps (caches and lens advance identically); returns the per-step
    (max |logit difference|, tolerance, compared rows, tie rows). Raises AssertionError on a
    mismatch beyond the tolerance or an unequal token outside a tie."""
    out = []
    for _ in range(steps):
        ft, fl = fray_step(cfg, fray_model)
        tt, tl = torch_step(cfg, torch_model)
        # 4 bf16 ulps at the largest logit: the models round the same values in a different order in
        # a few places per layer (rope, attention, the fused add), which moves a logit by an ulp or two
        scale = tl.abs().max().item()
        tol = atol if atol is not None else scale * 2.0 ** -5
        diff = (fl - tl).abs().max().item()
        assert diff <= tol, "logits differ by %.4g (tolerance %.4g)" % (diff, tol)
        top2 = tl.topk(2, dim=-1).values
        decided = (top2[:, 0] - top2[:, 1]) > 2 * tol
        assert torch.equal(ft[decided].cpu(), tt[decided].cpu()), "tokens differ outside ties"
        out.append((diff, tol, int(decided.sum()), int((~decided).sum())))
        for m, t in ((fray_model, ft), (torch_model, tt)):
            m["lens"] += 1
            m["tokens"] = t.to(m["tokens"].dtype)
    return out


def _clone(model):
    return {k: ([{n: t.clone() for n, t in lw.items()} for lw in v] if k == "layers" else v.clone())
            for k, v in model.items()}


def run(op, recorder, shapes=None, graph=True, cfg=None, rounds=3):
    del op, shapes
    cfg = cfg or Config()
    dev = torch.device("cuda")
    with torch.no_grad():
        base = build(cfg, dev)
        checks = lockstep(cfg, _clone(base), _clone(base))
        m = _clone(base)
        step = lambda: fray_step(cfg, m)  # noqa: E731  (lens stays put: every timed step writes one slot)
        compiled_fn = torch.compile(lambda: fray_step(cfg, m), fullgraph=True)
        ref = _clone(base)
        impls = {"fray.eager": step, "torch.eager": lambda: torch_step(cfg, ref),
                 "torch.matmuls": lambda: matmul_step(cfg, m), "fray.compile": compiled_fn}
        times = {name: [] for name in impls}
        graph_times = []
        for _ in range(rounds):
            for name, fn in impls.items():
                times[name].append(host_us(fn, calls=STEPS))
            if graph:
                graph_times.append(graph_us(step, calls=1, replays=STEPS))
    shape = cfg.name()
    extra = {"lockstep": [{"max_logit_diff": round(c[0], 5), "tol": round(c[1], 5), "compared": c[2], "ties": c[3]}
                          for c in checks]}
    names = {"fray.eager": ("fray.cuda", ""), "fray.compile": ("fray.cuda", ":compile"),
             "torch.eager": ("torch.eager", ""), "torch.matmuls": ("torch.eager", ":matmuls")}
    for name, rs in times.items():
        impl, suffix = names[name]
        recorder.add("decoder_step", impl, shape + suffix, "bf16", median(rs), rounds=[round(u, 1) for u in rs],
                     **extra)
    if graph_times:
        recorder.add("decoder_step", "fray.cuda", shape + ":graph", "bf16", median(graph_times),
                     rounds=[round(u, 1) for u in graph_times], **extra)
    with torch.no_grad():
        per_op = ops_host_us(step)
    recorder.add("decoder_step", "fray.cuda", shape + ":ops_host", "bf16", sum(per_op.values()),
                 per_op={k: round(v, 1) for k, v in per_op.items()})
