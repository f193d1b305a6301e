"""A soak: a toy decode loop under CUDA-graph replay for many steps, checked against eager runs.

The step (one decoder layer over a paged KV cache, for a batch; torch matmuls for the projections,
the embedding and the lm-head): embedding gather -> rmsnorm -> qkv matmul -> rope (positions = the
current lengths) -> kv_append_paged -> paged_decode_attention (lengths + 1) -> o matmul ->
add_rmsnorm (the residual) -> lm-head matmul -> fp32 logits -> apply_penalties (a token history) ->
sample (temperature, top-k, top-p) -> the sampled tokens are the next step's input. The state
update is part of the step: lengths += 1, the sampling offsets += 1, the tokens and the history
written in place. So the step is captured once and every replay is the next decode step: lengths
grow by one per replay, with nothing copied in from the host.

State on the device: the paged caches (pages for every sequence allocated up front in a block
table, capacity = the longest prompt + the steps), lengths (int32, random prompt lengths to start),
the input tokens, the sampling offsets, and the penalty history: the last `window` tokens of each
sequence in a ring (row b of [B, window] holds the token at position p in slot p % window; the CSR
offsets are fixed, b * window), so apply_penalties sees a constant-size history whose contents move.

Checks: every `check_every` steps the replayed step is also run eagerly on a snapshot of the state
taken just before it, and compared:
- the attention output within fray.testing's bf16 tolerance, elementwise;
- the logits (after the penalties) within 4 bf16 ulps of the largest logit (the bound of bench/e2e's
  lockstep, from the same table);
- the sampled tokens. fray.sample is a pure function of (logits, parameters, seeds[b], offsets[b])
  (Philox-4x32-10 keyed by the seed, counter from the offset; no generator state), so replay and
  eager draw the same token from bitwise-equal logits. Two comparisons follow: fray.sample run
  eagerly on the replay's own logits with the step's offsets must give the replay's tokens exactly,
  and the eager step's tokens must equal the replay's on every row whose logits are bitwise equal
  (the same kernels on the same inputs: every row is expected to be). A row whose logits differ
  within the tolerance is counted ("rows_logits_differ"), not token-compared (a draw near a CDF
  step may flip);
- the state after the step: lengths, offsets equal; tokens and history equal on those rows; the
  caches within the bf16 tolerance.
torch.cuda.memory_allocated() is read after the capture and at every check (the snapshot freed):
it must not grow.

Records: op "decode_soak", impl "fray.cuda", shape "B8Hq8Hkv2D128P16V32000T20528:graph" (T: the
capacity of each sequence; ":eager" without --graph): µs per replayed step over the whole run
(checked steps excluded), steps, checks, checks_passed, memory_start / memory_end / memory_max,
errors, passed; and one row per check (shape + ":check"): µs per step since the previous check and
that check's figures (max errors, bounds, bitwise flags, memory). A run that did not pass has a
"note" ("error: ..."), and run() raises SoakFailed after recording (the binary exits non-zero): a
check failed, memory grew, or the capture or a step raised.
"""
import time

import torch

import fray
from fray import testing
from fray.bench import capture
from fray.bench.e2e import EPS, attention_block

OPS = ("soak",)
BENCH_OPS = ("soak",)
OP = "decode_soak"
LOGIT_ULPS = 4     # bench/e2e's logit bound: 4 ulps (of the activations' dtype) at the largest logit
WARMUP_STEPS = 3   # fray.bench.capture runs the step three times before capturing (undone after)


class SoakFailed(AssertionError):
    """A check failed, memory grew, or a step raised; the records are written first."""


class Config:
    def __init__(self, batch=8, heads=8, kv_heads=2, head_dim=128, vocab=32000, page=16, prompt=(16, 512),
                 steps=20000, window=64, temperature=0.8, top_k=50, top_p=0.9, repetition=1.1, presence=0.2,
                 frequency=0.1):
        self.batch, self.heads, self.kv_heads, self.head_dim = batch, heads, kv_heads, head_dim
        self.hidden = heads * head_dim
        self.vocab, self.page, self.prompt, self.steps, self.window = vocab, page, tuple(prompt), steps, window
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.repetition, self.presence, self.frequency = repetition, presence, frequency
        # the longest prompt, every step's token, and the warm-up's steps (written, then undone)
        self.blocks = -(-(self.prompt[1] + steps + WARMUP_STEPS) // page)
        self.capacity = self.blocks * page
        self.max_position = self.capacity

    def name(self):
        return "B%dHq%dHkv%dD%dP%dV%dT%d" % (self.batch, self.heads, self.kv_heads, self.head_dim, self.page,
                                             self.vocab, self.capacity)


def build(cfg, device, dtype=torch.bfloat16, seed=0):
    """(weights, state): the weights, block table, history offsets and seeds, which no step changes;
    and the state every step advances in place (caches, lens, tokens, history, offsets)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=g, device=device) * std).to(dtype)

    b, h, d, hq, hkv, w = cfg.batch, cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.window
    pages = b * cfg.blocks
    perm = torch.randperm(pages, generator=torch.Generator().manual_seed(seed))
    weights = {
        "embed": randn(cfg.vocab, h), "w_in": 1.0 + randn(h, std=0.1), "w_out": 1.0 + randn(h, std=0.1),
        "wqkv": randn((hq + 2 * hkv) * d, h, std=h ** -0.5), "wo": randn(h, hq * d, std=(hq * d) ** -0.5),
        "lm_head": randn(cfg.vocab, h, std=h ** -0.5),
        "block_table": perm.view(b, cfg.blocks).to(torch.int32).to(device),
        "history_offsets": torch.arange(b + 1, dtype=torch.int64, device=device) * w,
        "seeds": torch.arange(b, dtype=torch.int64, device=device) + 1000 * seed,
    }
    lens = torch.randint(cfg.prompt[0], cfg.prompt[1] + 1, (b,), generator=g, device=device).to(torch.int32)
    tokens = torch.randint(0, cfg.vocab, (b,), generator=g, device=device)
    history = torch.randint(0, cfg.vocab, (b, w), generator=g, device=device)
    # the prompt's last `window` tokens, the input token (at position lens) among them
    history.scatter_(1, (lens.long() % w)[:, None], tokens[:, None])
    state = {
        "k_pages": randn(pages, cfg.page, hkv, d), "v_pages": randn(pages, cfg.page, hkv, d),
        "lens": lens, "tokens": tokens, "history": history.view(-1),
        "offsets": torch.zeros(b, dtype=torch.int64, device=device),
    }
    return weights, state


def step(cfg, w, s):
    """One decode step for the batch from state s, which it advances in place; returns the step's
    {"attn": [B, Hq, D], "logits": fp32 [B, V] after the penalties, "tokens": int64 [B]}."""
    b, win = cfg.batch, cfg.window
    lens, table = s["lens"], w["block_table"]
    h = w["embed"][s["tokens"]]
    x = fray.rmsnorm(h, w["w_in"], EPS)
    o, attn = attention_block(cfg, x, w["wqkv"], w["wo"], s["k_pages"], s["v_pages"], table, lens, lens + 1)
    x, _ = fray.add_rmsnorm(o, h, w["w_out"], EPS)
    logits = (x @ w["lm_head"].t()).float()
    fray.apply_penalties(logits, s["history"], w["history_offsets"], repetition=cfg.repetition,
                         presence=cfg.presence, frequency=cfg.frequency)
    tokens = _sample(cfg, w, logits, s["offsets"])
    # the sampled token sits at position lens + 1: its history slot, then the advance
    s["history"].view(b, win).scatter_(1, ((lens.long() + 1) % win)[:, None], tokens[:, None])
    s["tokens"].copy_(tokens)
    lens += 1
    s["offsets"] += 1
    return {"attn": attn, "logits": logits, "tokens": tokens}


def _sample(cfg, w, logits, offsets):
    return fray.sample(logits, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seeds=w["seeds"],
                       offsets=offsets)


def snapshot(s):
    """A copy of the state (same devices, new memory)."""
    return {k: t.clone() for k, t in s.items()}


def _within(got, want, tol):
    """(max |got - want|, max of that error over its elementwise bound atol + rtol |want|) in float64;
    (0, 0) when bitwise equal, inf when got has a non-finite value that want lacks."""
    if torch.equal(got, want):
        return 0.0, 0.0
    a, e = got.double(), want.double()
    err = (a - e).abs()
    if not torch.isfinite(err).all():
        return float("inf"), float("inf")
    return err.max().item(), (err / (tol["atol"] + tol["rtol"] * e.abs())).max().item()


def compare(cfg, w, got, want, live, ref, offsets):
    """One check: the replayed step's outputs `got` and the state `live` after it, against the eager
    step's `want` and `ref` from the same snapshot; offsets: the sampling offsets the step used.
    Returns the figures, with "failures" (a list of messages) and "passed"."""
    tol = testing.tolerance(live["k_pages"].dtype)
    failures = []
    attn_err, attn_ratio = _within(got["attn"], want["attn"], tol)
    if attn_ratio > 1.0:
        failures.append("attention output: max error %.4g is %.3gx its bound" % (attn_err, attn_ratio))
    scale = want["logits"].abs().max().item()
    logits_tol = LOGIT_ULPS * tol["rtol"] * scale
    logits_err, _ = _within(got["logits"], want["logits"], tol)
    if not logits_err <= logits_tol:
        failures.append("logits: max error %.4g, tolerance %.4g" % (logits_err, logits_tol))
    same = (got["logits"] == want["logits"]).all(dim=-1)
    if not torch.equal(got["tokens"][same], want["tokens"][same]):
        failures.append("tokens differ on rows with bitwise-equal logits: %s vs %s"
                        % (got["tokens"][same].tolist(), want["tokens"][same].tolist()))
    redrawn = _sample(cfg, w, got["logits"], offsets)
    if not torch.equal(redrawn, got["tokens"]):
        failures.append("sample on the replay's logits, eagerly, drew %s; the replay drew %s"
                        % (redrawn.tolist(), got["tokens"].tolist()))
    for name in ("lens", "offsets"):
        if not torch.equal(live[name], ref[name]):
            failures.append("state %s: %s after the replay, %s after the eager step"
                            % (name, live[name].tolist(), ref[name].tolist()))
    rows = same.nonzero().flatten()
    hist_live, hist_ref = (t["history"].view(cfg.batch, cfg.window)[rows] for t in (live, ref))
    if not (torch.equal(live["tokens"][rows], ref["tokens"][rows]) and torch.equal(hist_live, hist_ref)):
        failures.append("state tokens / history differ on rows with bitwise-equal logits")
    cache_ratio = max(_within(live[n], ref[n], tol)[1] for n in ("k_pages", "v_pages"))
    if cache_ratio > 1.0:
        failures.append("caches: max error %.3gx its bound" % cache_ratio)
    return {
        "attn_max_err": attn_err, "attn_err_over_bound": round(attn_ratio, 4), "logits_max_err": logits_err,
        "logits_tol": logits_tol, "bitwise": attn_err == 0.0 and logits_err == 0.0,
        "rows_logits_differ": int((~same).sum()), "tokens": got["tokens"].tolist(),
        "passed": not failures, "failures": failures,
    }


def interval_us(replay, n, device):
    """µs per step of n back-to-back replays (CUDA events on a GPU, the host clock elsewhere)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / n
    t0 = time.perf_counter()
    for _ in range(n):
        replay()
    return (time.perf_counter() - t0) * 1e6 / n


def loop(cfg, w, live, replay, check_every, memory, device):
    """cfg.steps steps of replay() (which advances `live` by one step and returns the step's outputs),
    every check_every-th (and the last) also run eagerly from a snapshot and compared. memory(): the
    figure that must not grow (torch.cuda.memory_allocated on a GPU). Returns (checks, summary):
    per check {"step", "us", "lens_max", "memory_allocated", compare()'s figures}, and the run's
    {"steps", "us", "checks", "checks_passed", "memory_*", "errors", "failures", "passed"}. A step
    that raises ends the run (its message in "errors")."""
    checks, errors = [], []
    memory_start = memory()
    done, timed, spent = 0, 0, 0.0
    try:
        while done < cfg.steps:
            n = min(check_every, cfg.steps - done) - 1
            us = interval_us(replay, n, device) if n else None
            if n:
                timed, spent, done = timed + n, spent + us * n, done + n
            ref = snapshot(live)
            offsets = ref["offsets"].clone()
            got = replay()
            done += 1
            want = step(cfg, w, ref)
            fig = compare(cfg, w, got, want, live, ref, offsets)
            del ref, want, got, offsets  # the memory figure counts live tensors only
            fig.update(step=done, us=us, lens_max=int(live["lens"].max()), memory_allocated=memory())
            if fig["memory_allocated"] > memory_start:
                fig["passed"] = False
                fig["failures"].append("memory_allocated %d > %d at the start" % (fig["memory_allocated"],
                                                                                    memory_start))
            checks.append(fig)
    except Exception as exc:  # a CUDA error, a refused call: the run ends, the records say why
        errors.append("after step %d: %s: %s" % (done, type(exc).__name__, str(exc)[:500]))
    try:
        memory_end = memory()
    except Exception as exc:
        memory_end = None
        errors.append("memory after the run: %s: %s" % (type(exc).__name__, str(exc)[:200]))
    failures = ["step %d: %s" % (c["step"], f) for c in checks for f in c["failures"]] + errors
    if memory_end is not None and memory_end > memory_start:
        failures.append("memory_allocated %d at the end > %d at the start" % (memory_end, memory_start))
    passed = not failures
    summary = {
        "steps": done, "us": spent / timed if timed else None, "checks": len(checks),
        "checks_passed": sum(c["passed"] for c in checks), "memory_start": memory_start, "memory_end": memory_end,
        "memory_max": max([memory_start] + [c["memory_allocated"] for c in checks]), "errors": errors,
        "failures": failures[:20], "passed": passed,
    }
    return checks, summary


def _flag(name):
    """A --flag's value (its default where flags are not parsed: tests, imports)."""
    from fray.bench.main import FLAGS
    return getattr(FLAGS, name) if FLAGS.is_parsed() else FLAGS[name].default


def run(op, recorder, shapes=None, graph=True, cfg=None, check_every=None, device="cuda", memory=None):
    """The soak (cfg default: Config(steps=--steps)), checked every --check_every steps, under CUDA-graph
    replay (graph=False, or a CPU device: the step run eagerly). Records as in the module docstring;
    raises SoakFailed when the run did not pass."""
    del op, shapes
    cfg = cfg or Config(steps=_flag("steps"))
    check_every = check_every or _flag("check_every")
    if cfg.steps < 1 or check_every < 1:
        raise ValueError("steps and check_every: expected >= 1, got %d and %d" % (cfg.steps, check_every))
    dev = torch.device(device)
    graph = graph and dev.type == "cuda"
    if memory is None:
        memory = torch.cuda.memory_allocated if dev.type == "cuda" else (lambda: 0)
    impl = "fray.cuda" if dev.type == "cuda" else "fray.reference"
    shape = cfg.name() + (":graph" if graph else ":eager")
    with torch.no_grad():
        w, live = build(cfg, dev)
        if graph:
            try:
                backup = snapshot(live)
                g, out = capture(lambda: step(cfg, w, live))
                for name, t in live.items():  # the warm-up steps undone: the soak starts from the prompts
                    t.copy_(backup[name])
                del backup
                torch.cuda.synchronize()
            except Exception as exc:
                error = "capture: %s: %s" % (type(exc).__name__, str(exc)[:500])
                recorder.add(OP, impl, shape, "bf16", None, note="error: " + error, steps=0, errors=[error],
                             passed=False)
                raise SoakFailed("soak %s: %s" % (shape, error)) from exc

            def replay():
                g.replay()
                return out
        else:
            def replay():
                return step(cfg, w, live)
        checks, summary = loop(cfg, w, live, replay, check_every, memory, dev)
    for c in checks:
        fig = {k: v for k, v in c.items() if k != "us"}
        recorder.add(OP, impl, shape + ":check", "bf16", c["us"], **fig)
    summary_us = summary.pop("us")
    note = {} if summary["passed"] else {"note": "error: " + "; ".join(summary["failures"])[:500]}
    recorder.add(OP, impl, shape, "bf16", summary_us, check_every=check_every, **note, **summary)
    if not summary["passed"]:
        raise SoakFailed("soak %s: %s" % (shape, "; ".join(summary["failures"])))
    return summary
