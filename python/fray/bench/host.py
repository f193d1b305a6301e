"""Eager per-call host cost of every public op, beside the torch op a user would call instead.

Each impl is called CALLS times back to back with no synchronisation inside the loop, then the
device is synchronised once; the wall time divided by CALLS is the figure. The shapes are small
(kernels of ~2-10 µs), so the figure is what the host spends per call (Python, validation, the
binding, the launch), not the kernel. Three interleaved rounds, median, as the other benchmarks.
torch.add (the cheapest torch op: one dispatch, one launch) is measured as the floor.

Records: op, impl, shape suffixed ":host", us (per call); impls fray.cuda, fray.triton,
torch.builtin (F.rms_norm, torch.softmax, torch.topk, SDPA, ...), torch.eager (a composite of
several torch ops where torch has no single op) and flashinfer where it is importable.
"""
import time

import torch
import torch.nn.functional as F

import fray
from fray.bench import median, time_rounds

CALLS = 2000
WARMUP = 50
BATCH = 8
VOCAB = 32000
HIDDEN = 4096
OPS = ("host",)
BENCH_OPS = ("host",)


def host_us(fn, calls=CALLS):
    """µs per call of `calls` back-to-back calls, one synchronisation after the loop."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / calls


def _flashinfer():
    try:
        import flashinfer
    except Exception:  # not installed on the GPU machine today: its rows are simply absent
        return None
    return flashinfer


def _fray(impls, fn, op=None):
    """fray.cuda and fray.triton rows of fn(backend); op: skip a backend with no kernel for it yet
    (fray.backend.missing_reason), whose row would only record the refusal."""
    from fray import backend as B
    for backend in ("cuda", "triton"):
        if op is None or not B.missing_reason(op, backend):
            impls["fray." + backend] = lambda b=backend: fn(b)


def cases(device):
    """[(op, shape, dtype, {impl: zero-argument callable})] at the issue's shapes."""
    g = torch.Generator(device=device).manual_seed(0)
    bf16 = torch.bfloat16

    def randn(*shape, dtype=bf16):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    fi = _flashinfer()
    out = []

    x, r, w = randn(BATCH, HIDDEN), randn(BATCH, HIDDEN), randn(HIDDEN)
    y = torch.empty_like(x)
    impls = {}
    _fray(impls, lambda b: fray.rmsnorm(x, w, 1e-6, out=y, backend=b))
    impls["torch.builtin"] = lambda: F.rms_norm(x, (HIDDEN,), w, 1e-6)
    if fi is not None:
        impls["flashinfer"] = lambda: fi.norm.rmsnorm(x, w, 1e-6, out=y)
    out.append(("rmsnorm", "%dx%d" % (BATCH, HIDDEN), "bf16", impls))

    impls = {}
    _fray(impls, lambda b: fray.add_rmsnorm(x, r, w, 1e-6, inplace=True, backend=b))
    if fi is not None:
        impls["flashinfer"] = lambda: fi.norm.fused_add_rmsnorm(x, r, w, 1e-6)
    out.append(("add_rmsnorm", "%dx%d:inplace" % (BATCH, HIDDEN), "bf16", impls))

    b_ln = randn(HIDDEN)
    impls = {}
    _fray(impls, lambda b: fray.layernorm(x, w, b_ln, 1e-5, out=y, backend=b))
    impls["torch.builtin"] = lambda: F.layer_norm(x, (HIDDEN,), w, b_ln, 1e-5)
    out.append(("layernorm", "%dx%d" % (BATCH, HIDDEN), "bf16", impls))

    d = 2048
    gu = randn(BATCH, 2 * d)
    h = torch.empty(BATCH, d, device=device, dtype=bf16)
    impls = {}
    _fray(impls, lambda b: fray.silu_mul(gu, out=h, backend=b))
    impls["torch.eager"] = lambda: F.silu(gu[:, :d]) * gu[:, d:]
    if fi is not None:
        impls["flashinfer"] = lambda: fi.activation.silu_and_mul(gu, out=h)
    out.append(("silu_mul", "%dx%d" % (BATCH, 2 * d), "bf16", impls))

    impls = {}
    _fray(impls, lambda b: fray.gelu_mul(gu, approximate="tanh", out=h, backend=b))
    impls["torch.eager"] = lambda: F.gelu(gu[:, :d], approximate="tanh") * gu[:, d:]
    out.append(("gelu_mul", "%dx%d" % (BATCH, 2 * d), "bf16", impls))

    q, k = randn(BATCH, 32, 128), randn(BATCH, 8, 128)
    pos = torch.arange(BATCH, device=device, dtype=torch.int64) + 100
    impls = {}
    _fray(impls, lambda b: fray.rope(q, k, pos, max_position=8192, inplace=True, backend=b))
    out.append(("rope", "%dx32x128:inplace" % BATCH, "bf16", impls))

    logits = randn(BATCH, VOCAB, dtype=torch.float32)
    p = torch.empty_like(logits)
    impls = {}
    _fray(impls, lambda b: fray.softmax(logits, out=p, backend=b))
    impls["torch.builtin"] = lambda: torch.softmax(logits, -1)
    out.append(("softmax", "%dx%d" % (BATCH, VOCAB), "fp32", impls))

    impls = {}
    _fray(impls, lambda b: fray.online_softmax(logits, backend=b))
    impls["torch.builtin"] = lambda: torch.softmax(logits, -1)
    out.append(("online_softmax", "%dx%d" % (BATCH, VOCAB), "fp32", impls))

    impls = {}
    _fray(impls, lambda b: fray.topk(logits, 50, backend=b))
    impls["torch.builtin"] = lambda: torch.topk(logits, 50)
    if fi is not None and hasattr(fi, "top_k"):
        impls["flashinfer"] = lambda: fi.top_k(logits, 50)
    out.append(("topk", "%dx%dk50" % (BATCH, VOCAB), "fp32", impls))

    impls = {}
    _fray(impls, lambda b: fray.argmax(logits, backend=b))
    impls["torch.builtin"] = lambda: torch.argmax(logits, -1)
    out.append(("argmax", "%dx%d" % (BATCH, VOCAB), "fp32", impls))

    seeds = torch.arange(BATCH, device=device, dtype=torch.int64) + 1234
    offsets = torch.zeros(BATCH, device=device, dtype=torch.int64)
    impls = {}
    _fray(impls, lambda b: fray.sample(logits, temperature=0.8, top_p=0.9, seeds=seeds, offsets=offsets,
                                       backend=b))
    out.append(("sample", "%dx%d:topp" % (BATCH, VOCAB), "fp32", impls))

    hist = 64
    ids = torch.randint(0, VOCAB, (BATCH * hist,), generator=g, device=device, dtype=torch.int32)
    ids_off = torch.arange(0, BATCH * hist + 1, hist, device=device, dtype=torch.int32)
    pen = logits.clone()
    impls = {}
    _fray(impls, lambda b: fray.apply_penalties(pen, ids, ids_off, repetition=1.1, presence=0.1,
                                                frequency=0.1, backend=b))
    out.append(("apply_penalties", "%dx%d" % (BATCH, VOCAB), "fp32", impls))

    impls = {}
    _fray(impls, lambda b: fray.decode_step(pen, ids, ids_off, repetition=1.1, presence=0.1, frequency=0.1,
                                            temperature=0.8, top_k=50, top_p=0.9, seeds=seeds,
                                            offsets=offsets, backend=b))
    out.append(("decode_step", "%dx%d" % (BATCH, VOCAB), "fp32", impls))

    hq, hkv, t, dh, page = 32, 8, 1024, 128, 16
    qd = randn(BATCH, hq, dh)
    kc, vc = randn(BATCH, hkv, t, dh), randn(BATCH, hkv, t, dh)
    lens = torch.full((BATCH,), t - 1, device=device, dtype=torch.int32)
    od = torch.empty_like(qd)
    q4 = qd[:, :, None, :]
    spec = "B%dHq%dHkv%dT%dD%d" % (BATCH, hq, hkv, t, dh)
    impls = {}
    _fray(impls, lambda b: fray.decode_attention(qd, kc, vc, lens, kv_layout="HND", out=od, backend=b))
    impls["torch.builtin"] = lambda: F.scaled_dot_product_attention(q4, kc, vc, enable_gqa=True)
    out.append(("decode_attention", spec, "bf16", impls))

    nb = t // page
    kp = kc.transpose(1, 2).reshape(BATCH * nb, page, hkv, dh).contiguous()
    vp = vc.transpose(1, 2).reshape(BATCH * nb, page, hkv, dh).contiguous()
    table = torch.arange(BATCH * nb, device=device, dtype=torch.int32).view(BATCH, nb)
    impls = {}
    _fray(impls, lambda b: fray.paged_decode_attention(qd, kp, vp, table, lens, out=od, backend=b))
    impls["torch.builtin"] = lambda: F.scaled_dot_product_attention(q4, kc, vc, enable_gqa=True)
    out.append(("paged_decode_attention", spec + "P%d" % page, "bf16", impls))

    # prefill: BATCH sequences of 64 tokens packed varlen (what an engine passes), against SDPA on
    # the same tokens as [B, H, S, D] views
    sp = 64
    qp = randn(BATCH * sp, hq, dh)
    kpf, vpf = randn(BATCH * sp, hkv, dh), randn(BATCH * sp, hkv, dh)
    cu = torch.arange(0, BATCH * sp + 1, sp, device=device, dtype=torch.int32)
    op_ = torch.empty_like(qp)
    views = [t.view(BATCH, sp, -1, dh).transpose(1, 2) for t in (qp, kpf, vpf)]
    impls = {}
    _fray(impls, lambda b: fray.prefill_attention(qp, kpf, vpf, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=sp,
                                                  max_seqlen_k=sp, out=op_, backend=b), "prefill_attention")
    impls["torch.builtin"] = lambda: F.scaled_dot_product_attention(*views, is_causal=True, enable_gqa=True)
    out.append(("prefill_attention", "B%dHq%dHkv%dS%dD%d" % (BATCH, hq, hkv, sp, dh), "bf16", impls))

    # MLA decode at DeepSeek's latent width: BATCH sequences of t tokens in 64-token blocks, 16
    # heads (a tensor-parallel shard of 128), one query each; beside the absorbed torch composite
    from fray.bench import attention as ba
    mla = ba.Mla(BATCH, 16, 1, t)
    mi = ba.mla_inputs(mla, bf16, device)
    om = torch.empty(BATCH, 1, 16, ba.MLA_DIM_V, device=device, dtype=bf16)
    impls = {}
    _fray(impls, lambda b: fray.mla_decode(mi["q"], mi["kv_cache"], mi["block_table"], mi["lens"], out=om, backend=b),
          "mla_decode")
    impls["torch.eager"] = lambda: ba.eager_mla(mi["q"], mi["kv_cache"], mi["block_table"], mi["lens"],
                                                ba.MLA_DIM ** -0.5)
    out.append(("mla_decode", ba.shape_name(mla), "bf16", impls))

    kn, vn = randn(BATCH, hkv, dh), randn(BATCH, hkv, dh)
    impls = {}
    _fray(impls, lambda b: fray.kv_append(kc, vc, kn, vn, lens, kv_layout="HND", backend=b))
    out.append(("kv_append", "B%dHkv%dD%d" % (BATCH, hkv, dh), "bf16", impls))

    impls = {}
    _fray(impls, lambda b: fray.kv_append_paged(kp, vp, table, kn, vn, lens, backend=b))
    out.append(("kv_append_paged", "B%dHkv%dD%dP%d" % (BATCH, hkv, dh, page), "bf16", impls))

    a, c = randn(BATCH * HIDDEN), randn(BATCH * HIDDEN)
    s = torch.empty_like(a)
    impls = {}
    _fray(impls, lambda b: fray.vector_add(a, c, out=s, backend=b))
    impls["torch.builtin"] = lambda: torch.add(a, c)
    out.append(("vector_add", str(BATCH * HIDDEN), "bf16", impls))

    impls = {}
    _fray(impls, lambda b: fray.mul(a, c, out=s, backend=b))
    impls["torch.builtin"] = lambda: torch.mul(a, c)
    out.append(("mul", str(BATCH * HIDDEN), "bf16", impls))

    impls = {}
    _fray(impls, lambda b: fray.axpy(a, 0.5, 1.0, out=s, backend=b))
    impls["torch.eager"] = lambda: a * 0.5 + 1.0
    out.append(("axpy", str(BATCH * HIDDEN), "bf16", impls))

    # gemm at M = 1 (decode; issue 18's host bar: <= 1.1x torch.mm): the first Fray call compiles
    # the kernel into the JIT cache (or finds it there), before the timed calls.
    xg, wg = randn(1, HIDDEN), randn(HIDDEN, HIDDEN)
    og = torch.empty(1, HIDDEN, device=device, dtype=torch.bfloat16)
    impls = {}
    _fray(impls, lambda b: fray.gemm(xg, wg, out=og, backend=b))
    impls["torch.builtin"] = lambda: torch.mm(xg, wg.t())
    out.append(("gemm", "1x%dx%d" % (HIDDEN, HIDDEN), "bf16", impls))

    # moe at a decode batch: DeepSeek-V3 routing over 256 experts, then its dispatch metadata
    from fray.bench import moe as bm
    xr, kr, kwr = bm.M._recipe_args("deepseek_v3", BATCH, torch.bfloat16, device)
    impls = {}
    impls["fray.triton"] = lambda: fray.moe_route(xr, kr, backend="triton", **kwr)  # Triton only, no CUDA kernel
    impls["torch.eager"] = lambda: bm.eager_route(xr, kr, **kwr)
    out.append(("moe_route", "deepseek_v3:T%d" % BATCH, "bf16", impls))

    ids_r = bm.eager_route(xr, kr, **kwr)[1]
    impls = {}
    impls["fray.triton"] = lambda: fray.moe_dispatch(ids_r, 256, bm.BLOCK_M, backend="triton")
    impls["torch.eager"] = lambda: bm.eager_dispatch(ids_r, 256, bm.BLOCK_M)
    out.append(("moe_dispatch", "deepseek_v3:T%d" % BATCH, "int32", impls))

    # the MoE GEMMs at a decode batch: fused_moe prepared at Qwen3's
    # layer, grouped_gemm at 8 groups of 4 rows, routed_grouped_gemm over 8 experts top-2; beside
    # the torch._grouped_mm composites. Rows only for the ops this fray has (tests/bench checks
    # this file's ops against fray.OPS; the three arrive together, in fray.ops.moe_gemm).
    if "fused_moe" in fray.OPS:
        qwen = bm.MODELS["qwen3"]
        xf = randn(BATCH, qwen.hidden)
        w13f = bm.randn_experts(qwen.experts, 2 * qwen.inter, qwen.hidden, bf16, g, device)
        w2f = bm.randn_experts(qwen.experts, qwen.hidden, qwen.inter, bf16, g, device)
        twf, idf = bm.eager_route(randn(BATCH, qwen.experts), qwen.top_k)
        impls = {}
        _fray(impls, lambda b: fray.fused_moe(xf, w13f, w2f, topk_weights=twf, topk_ids=idf, backend=b), "fused_moe")
        impls["torch.eager"] = lambda: bm.eager_experts(xf, w13f, w2f, twf, idf)
        out.append(("fused_moe", "qwen3:T%d:prepared" % BATCH, "bf16", impls))
    if "grouped_gemm" in fray.OPS:
        ga, gb = randn(8 * 4, 1024), bm.randn_experts(8, 1024, 1024, bf16, g, device)
        goffs = torch.arange(0, 8 * 4 + 1, 4, device=device, dtype=torch.int32)
        gends, gbt = goffs[1:].contiguous(), gb.transpose(-2, -1)
        impls = {}
        _fray(impls, lambda b: fray.grouped_gemm(ga, gb, goffs, b_layout="nk", backend=b), "grouped_gemm")
        impls["torch.builtin"] = lambda: torch._grouped_mm(ga, gbt, offs=gends)
        out.append(("grouped_gemm", "G8x4N1024K1024", "bf16", impls))
    if "routed_grouped_gemm" in fray.OPS:
        xr2, wr2, lr2 = randn(BATCH, 1024), bm.randn_experts(8, 1024, 1024, bf16, g, device), randn(BATCH, 8)
        impls = {}
        _fray(impls, lambda b: fray.routed_grouped_gemm(xr2, wr2, lr2, 2, backend=b), "routed_grouped_gemm")
        impls["torch.eager"] = lambda: bm.eager_routed_grouped_gemm(xr2, wr2, lr2, 2)
        out.append(("routed_grouped_gemm", "e8h1024n1024k2:T%d" % BATCH, "bf16", impls))

    # quant at a decode batch: bf16 activations to int8 with per-token scales, and back
    from fray.bench import quant as bq
    xq = randn(BATCH, HIDDEN)
    impls = {}
    _fray(impls, lambda b: fray.quantize(xq, granularity="token", backend=b))
    impls["torch.eager"] = lambda: bq.eager_quantize(xq, torch.int8, "token")
    out.append(("quantize", "%dx%d" % (BATCH, HIDDEN), "bf16->int8", impls))

    wq_n = (torch.rand(HIDDEN, device=device) + 0.5).to(torch.bfloat16)
    impls = {}
    impls["fray.triton"] = lambda: fray.rmsnorm_quant(xq, wq_n, backend="triton")  # Triton only
    impls["torch.eager"] = lambda: bq.eager_rmsnorm_quant(xq, wq_n, torch.int8)
    out.append(("rmsnorm_quant", "%dx%d" % (BATCH, HIDDEN), "bf16->int8", impls))

    xg2 = randn(BATCH, 2 * HIDDEN)
    impls = {}
    impls["fray.triton"] = lambda: fray.silu_mul_quant(xg2, backend="triton")  # Triton only
    impls["torch.eager"] = lambda: bq.eager_silu_mul_quant(xg2, torch.int8)
    out.append(("silu_mul_quant", "%dx%d" % (BATCH, HIDDEN), "bf16->int8", impls))

    qq, sq = bq.eager_quantize(xq, torch.int8, "token")
    impls = {}
    impls["fray.triton"] = lambda: fray.dequantize(qq, sq, granularity="token", backend="triton")
    impls["torch.eager"] = lambda: (qq.float() * sq).to(torch.bfloat16)
    out.append(("dequantize", "%dx%d" % (BATCH, HIDDEN), "int8->bf16", impls))

    # scaled_gemm at a decode batch: e4m3 with per-tensor scales, beside cuBLASLt's torch._scaled_mm
    # (torch._int_mm refuses M <= 16, and _scaled_mm's row-wise scales need M a multiple of 16)
    a8 = randn(BATCH, HIDDEN).to(torch.float8_e4m3fn)
    w8 = randn(HIDDEN, HIDDEN).to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)
    o8 = torch.empty(BATCH, HIDDEN, device=device, dtype=torch.bfloat16)
    impls = {}
    _fray(impls, lambda b: fray.scaled_gemm(a8, w8, one, one, out=o8, backend=b))
    impls["torch.builtin"] = lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    out.append(("scaled_gemm", "%dx%dx%d" % (BATCH, HIDDEN, HIDDEN), "e4m3->bf16", impls))

    # w8a16_gemm at a decode batch: bf16 x int8 weights with per-channel scales, beside torch.mm on
    # the same weights in bf16
    xw = randn(BATCH, HIDDEN).to(torch.bfloat16)
    wq = torch.randint(-127, 128, (HIDDEN, HIDDEN), device=device, dtype=torch.int8)
    ws = torch.rand(HIDDEN, device=device) / 64 + 1e-3
    w16 = randn(HIDDEN, HIDDEN).to(torch.bfloat16)
    ow = torch.empty(BATCH, HIDDEN, device=device, dtype=torch.bfloat16)
    impls = {}
    _fray(impls, lambda b: fray.w8a16_gemm(xw, wq, ws, out=ow, backend=b))
    impls["torch.builtin"] = lambda: torch.mm(xw, w16.t())
    out.append(("w8a16_gemm", "%dx%dx%d" % (BATCH, HIDDEN, HIDDEN), "bf16xint8->bf16", impls))

    for name, peer in (("silu", F.silu), ("gelu", F.gelu), ("relu", torch.relu), ("tanh", torch.tanh),
                       ("sigmoid", torch.sigmoid)):
        impls = {}
        _fray(impls, lambda b, f=getattr(fray, name): f(a, out=s, backend=b))
        impls["torch.builtin"] = lambda f=peer: f(a)
        out.append((name, str(BATCH * HIDDEN), "bf16", impls))
    return out


def run(op, recorder, shapes=None, graph=True, device="cuda", timer=host_us):
    del op, shapes, graph  # one fixed set of shapes; nothing to graph-replay
    for name, shape, dtype, impls in cases(torch.device(device)):
        timed = time_rounds(impls, timer)
        for impl, rounds in timed.items():
            if isinstance(rounds, Exception):
                recorder.add(name, impl, shape + ":host", dtype, None, note="error: %s" % str(rounds)[:200])
            else:
                recorder.add(name, impl, shape + ":host", dtype, median(rounds), calls=CALLS,
                             rounds=[round(u, 3) for u in rounds])
