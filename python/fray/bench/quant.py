"""Quant-family benchmarks, in one process: fray.quantize's CUDA and Triton kernels against the
torch composite a model file writes, and fray.scaled_gemm against cuBLAS(Lt)'s 8-bit GEMMs.

rmsnorm_quant / silu_mul_quant bytes: read x (and the residual, and write the sum) + write q + the
  fp32 scales; shapes "<plain|residual>:<M>x<H>" and "fused:<M>x<D>" (x = [M, 2 D]), bf16 in, int8
  and e4m3 out. Peers: fray unfused (fray.rmsnorm / add_rmsnorm / silu_mul, then fray.quantize),
  torch.eager (the composite in fp32, rounded to bf16, then quantize's composite), torch.compile
  (that composite compiled, fullgraph=True: Inductor fuses it into one or two kernels).

quantize bytes: read x + write q + write the fp32 scales = M·K·s(x) + M·K·s(q) + 4·groups
  shapes "<granularity>:<M>x<K>" for granularity in token, block1x128 at 16384x8192, bf16 x to
  int8 and float8_e4m3fn (the dtype column says which), fixed-seed standard normal.
  Peers: torch.eager = amax per group in fp32 (finite values), divide, round (ties to even),
  clamp, cast; torch.compile = that composite compiled (fullgraph=True).

scaled_gemm flops = 2·M·N·K, bytes (M <= 64 only, where the weight stream bounds the time) = N·K;
  shapes "<recipe>:<M>x<N>x<K>", b [N, K], bf16 output, uniform int8 /
  e4m3 of randn·64 with fp32 scales:
    int8:   per-token x per-channel int8. Peers: torch._int_mm (cuBLASLt int8, int32 out, no
            scales), torch._int_mm+scale (the int32 result scaled and cast by torch: the composite
            an engine without a fused kernel runs), torch.mm bf16 (cuBLAS at the same shape).
    fp8:    row-wise e4m3 (per-token x per-channel). Peers: torch._scaled_mm row-wise (cuBLASLt,
            use_fast_accum=False as fray's default), torch.mm bf16.
    fp8fast: the same with fast_accum=True against torch._scaled_mm(use_fast_accum=True).
    block:  DeepSeek-V3 block scales (a 1x128, b 128x128). Peer: torch.mm bf16 (torch has no
            block-scaled GEMM of this layout). "fray.cuda ffma-interleave": the same call with
            its kernel built through fray.jit.sass's FFMA-interleave pass (its own launch plan,
            through out=, built under FRAY_DISABLE_FFMA_INTERLEAVE=0): the pass on / off.
  fray.cuda is the tuned JIT kernel (FRAY_PRINT_AUTOTUNE=1 prints the candidates), fray.triton the
  Triton kernel.

w8a16_gemm bytes = N·K (the 8-bit weights: the stream that bounds a decode GEMM), flops 2·M·N·K;
  shapes "<int8|fp8>-<channel|group>:<M>x<N>x<K>": bf16 x (randn), w [N, K] uniform int8 / e4m3 of
  randn·64, fp32 scales per output channel or per channel and 128 of K. Peers: torch.mm bf16 (the
  unquantized weight at the same shape: twice the bytes), torch dequant+mm (w.to(bf16) * scale,
  then torch.mm: what a model file without a W8A16 kernel runs).
"""
import re

import torch

import fray
from fray import env

SG = [("int8", 4096, 11008, 4096), ("int8", 8192, 8192, 8192), ("int8", 4096, 14336, 4096),
      ("fp8", 4096, 11008, 4096), ("fp8", 8192, 8192, 8192), ("fp8fast", 8192, 8192, 8192),
      ("block", 4096, 7168, 16384), ("block", 128, 7168, 16384), ("block", 64, 7168, 16384),
      ("block", 4096, 2112, 7168), ("block", 4096, 24576, 1536),
      ("int8", 1, 8192, 8192), ("int8", 16, 8192, 8192), ("fp8", 1, 4096, 4096), ("fp8", 16, 8192, 8192)]
W8 = [("int8-channel", 1, 8192, 8192), ("int8-group", 1, 8192, 8192), ("fp8-channel", 1, 8192, 8192),
      ("fp8-group", 1, 8192, 8192), ("int8-channel", 16, 8192, 8192), ("fp8-group", 16, 8192, 8192),
      ("int8-channel", 1, 4096, 4096), ("fp8-channel", 4, 14336, 4096), ("int8-group", 8, 4096, 14336)]
# The fused producers: (variant, rows, hidden) for rmsnorm_quant ("plain", or "residual": the sum
# written back in place), (variant, rows, d) for silu_mul_quant ("fused": x = [rows, 2 d]).
RQ = [("plain", 16384, 8192), ("residual", 16384, 8192), ("plain", 4096, 4096), ("plain", 64, 8192)]
SQ = [("fused", 16384, 14336), ("fused", 4096, 11008), ("fused", 64, 14336)]
SHAPES = {"quantize": [("token", 16384, 8192), ("block1x128", 16384, 8192)], "rmsnorm_quant": RQ,
          "silu_mul_quant": SQ, "scaled_gemm": SG, "w8a16_gemm": W8}
OPS = tuple(SHAPES)
QDTYPES = (torch.int8, torch.float8_e4m3fn)
# --shapes spellings per op: (pattern, what the error message says is expected)
_SHAPE_FORMS = {
    "quantize": (re.compile(r"^(token|block1x128):(\d+)x(\d+)$"), "<token|block1x128>:<M>x<K>"),
    "scaled_gemm": (re.compile(r"^(int8|fp8|fp8fast|block):(\d+)x(\d+)x(\d+)$"),
                    "<int8|fp8|fp8fast|block>:<M>x<N>x<K>"),
    "w8a16_gemm": (re.compile(r"^((?:int8|fp8)-(?:channel|group)):(\d+)x(\d+)x(\d+)$"),
                   "<int8|fp8>-<channel|group>:<M>x<N>x<K>"),
    "rmsnorm_quant": (re.compile(r"^(plain|residual):(\d+)x(\d+)$"), "<plain|residual>:<M>x<H>"),
    "silu_mul_quant": (re.compile(r"^(fused):(\d+)x(\d+)$"), "fused:<M>x<D>"),
}


def parse_shapes(op, text):
    """--shapes for this family: a comma list of "<token|block1x128>:<M>x<K>" (quantize),
    "<plain|residual>:<M>x<H>" (rmsnorm_quant), "fused:<M>x<D>" (silu_mul_quant),
    "<int8|fp8|fp8fast|block>:<M>x<N>x<K>" (scaled_gemm) or "<int8|fp8>-<channel|group>:<M>x<N>x<K>"
    (w8a16_gemm)."""
    pattern, spelling = _SHAPE_FORMS[op]
    out = []
    for item in text.split(","):
        m = pattern.match(item.strip())
        if not m:
            raise ValueError("shapes: expected %s, got %r" % (spelling, item))
        out.append((m.group(1),) + tuple(int(v) for v in m.groups()[1:]))
    return out


def eager_quantize(x, dtype, granularity):
    """The torch composite of quantize (token, or block (1, 128) with K a multiple of 128)."""
    qmax = 127.0 if dtype == torch.int8 else 448.0
    m, k = x.shape
    xf = x.float() if granularity == "token" else x.float().view(m, k // 128, 128)
    a = torch.where(xf.abs() < float("inf"), xf.abs(), 0.0).amax(dim=-1, keepdim=True)
    s = a / qmax
    s = torch.where(s == 0, 1.0, s)
    y = (xf / s).clamp(-qmax, qmax)
    q = (torch.round(y).to(dtype) if dtype == torch.int8 else y.to(dtype)).view(m, k)
    return q, s.view(m, -1)


def eager_rmsnorm_quant(x, w, dtype, residual=None, eps=1e-6):
    """The torch composite: (x + residual), RMSNorm in fp32 rounded to x's dtype, per-token quantize."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
    q, s = eager_quantize(y, dtype, "token")
    return (q, s, x) if residual is not None else (q, s)


def eager_silu_mul_quant(x, dtype):
    """The torch composite: silu(gate) * up in fp32 rounded to x's dtype, per-token quantize."""
    d = x.shape[-1] // 2
    xf = x.float()
    y = (torch.nn.functional.silu(xf[:, :d]) * xf[:, d:]).to(x.dtype)
    return eager_quantize(y, dtype, "token")


def fused_inputs(op, variant, m, h, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(0)
    if op == "silu_mul_quant":
        return dict(x=torch.randn(m, 2 * h, device=device, generator=gen).to(torch.bfloat16), variant=variant)
    x = torch.randn(m, h, device=device, generator=gen).to(torch.bfloat16)
    w = (torch.rand(h, device=device, generator=gen) + 0.5).to(torch.bfloat16)
    r = torch.randn(m, h, device=device, generator=gen).to(torch.bfloat16) if variant == "residual" else None
    return dict(x=x, w=w, r=r, variant=variant)


def fused_impls(op, inp, dtype, compile_fn=torch.compile):
    """fray.triton (the fused kernel), fray unfused (the norm / activation kernel, then quantize), and
    the torch composite eager and compiled."""
    x = inp["x"]
    if op == "silu_mul_quant":
        compiled = compile_fn(eager_silu_mul_quant, fullgraph=True)
        return {"fray.triton": lambda: fray.silu_mul_quant(x, dtype=dtype, backend="triton"),
                "fray unfused": lambda: fray.quantize(fray.silu_mul(x), dtype, granularity="token"),
                "torch.eager": lambda: eager_silu_mul_quant(x, dtype),
                "torch.compile": lambda: compiled(x, dtype)}
    w, r = inp["w"], inp["r"]
    compiled = compile_fn(eager_rmsnorm_quant, fullgraph=True)
    if r is None:
        return {"fray.triton": lambda: fray.rmsnorm_quant(x, w, dtype=dtype, backend="triton"),
                "fray unfused": lambda: fray.quantize(fray.rmsnorm(x, w), dtype, granularity="token"),
                "torch.eager": lambda: eager_rmsnorm_quant(x, w, dtype),
                "torch.compile": lambda: compiled(x, w, dtype)}
    # residual: every implementation reads x and r and writes the sum once (in place for fray; the
    # composites return a new one); the in-place sum changes r between runs, which no result depends on
    return {"fray.triton": lambda: fray.rmsnorm_quant(x, w, dtype=dtype, residual=r, backend="triton"),
            "fray unfused": lambda: (lambda y_s: fray.quantize(y_s[0], dtype, granularity="token"))(
                fray.add_rmsnorm(x, r, w, inplace=False)),
            "torch.eager": lambda: eager_rmsnorm_quant(x, w, dtype, r),
            "torch.compile": lambda: compiled(x, w, dtype, r)}


def fused_bytes(op, inp):
    """Read the inputs, write q and the fp32 scales (and, with a residual, the sum)."""
    x = inp["x"]
    m = x.shape[0]
    if op == "silu_mul_quant":
        return m * x.shape[1] * 2 + m * (x.shape[1] // 2) + 4 * m
    h = x.shape[1]
    return m * h * 2 * (3 if inp["r"] is not None else 1) + m * h + 4 * m


def _args(granularity):
    return ("token", (1, 128)) if granularity == "token" else ("block", (1, 128))


def impls(op, inp, compile_fn=torch.compile):
    x, dtype, g = inp["x"], inp["dtype"], inp["granularity"]
    gran, block = _args(g)
    out = {"fray.cuda": lambda: fray.quantize(x, dtype, granularity=gran, block=block, backend="cuda"),
           "fray.triton": lambda: fray.quantize(x, dtype, granularity=gran, block=block, backend="triton"),
           "torch.eager": lambda: eager_quantize(x, dtype, gran)}
    compiled = compile_fn(eager_quantize, fullgraph=True)
    out["torch.compile"] = lambda: compiled(x, dtype, gran)
    return out


def nbytes(op, inp):
    x, dtype, g = inp["x"], inp["dtype"], inp["granularity"]
    m, k = x.shape
    groups = m if g == "token" else m * -(-k // 128)
    return m * k * x.element_size() + m * k * torch.empty(0, dtype=dtype).element_size() + 4 * groups


def sg_inputs(recipe, m, n, k, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(0)
    dtype = torch.int8 if recipe == "int8" else torch.float8_e4m3fn
    if dtype == torch.int8:
        a = torch.randint(-127, 128, (m, k), device=device, generator=gen, dtype=dtype)
        b = torch.randint(-127, 128, (n, k), device=device, generator=gen, dtype=dtype)
    else:
        a = (torch.randn(m, k, device=device, generator=gen) * 64).to(dtype)
        b = (torch.randn(n, k, device=device, generator=gen) * 64).to(dtype)
    if recipe == "block":
        sa = torch.rand(m, -(-k // 128), device=device, generator=gen) / 64 + 1e-3
        sb = torch.rand(-(-n // 128), -(-k // 128), device=device, generator=gen) / 64 + 1e-3
    else:
        sa = torch.rand(m, 1, device=device, generator=gen) / 64 + 1e-3
        sb = torch.rand(n, 1, device=device, generator=gen) / 64 + 1e-3
    return dict(a=a, b=b, sa=sa, sb=sb, recipe=recipe,
                a16=torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16),
                b16=torch.randn(n, k, device=device, generator=gen).to(torch.bfloat16))


def sg_impls(inp):
    a, b, sa, sb, recipe = inp["a"], inp["b"], inp["sa"], inp["sb"], inp["recipe"]
    fast = recipe == "fp8fast"
    out = {"fray.cuda": lambda: fray.scaled_gemm(a, b, sa, sb, fast_accum=fast, backend="cuda")}
    if not fast:
        out["fray.triton"] = lambda: fray.scaled_gemm(a, b, sa, sb, backend="triton")
    if recipe == "block":
        out["fray.cuda ffma-interleave"] = _interleaved(a, b, sa, sb)
    a16, b16 = inp["a16"], inp["b16"]
    out["torch.mm bf16"] = lambda: torch.mm(a16, b16.t())
    if recipe == "int8":
        sbt = sb.t().contiguous()
        out["torch._int_mm"] = lambda: torch._int_mm(a, b.t())
        out["torch._int_mm+scale"] = lambda: (torch._int_mm(a, b.t()).float() * sbt * sa).to(torch.bfloat16)
    elif recipe in ("fp8", "fp8fast"):
        sbt = sb.t().contiguous()
        out["torch._scaled_mm rowwise"] = lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sbt,
                                                                   out_dtype=torch.bfloat16, use_fast_accum=fast)
    return out


def _interleaved(a, b, sa, sb):
    """The block-scaled call with the FFMA-interleave pass: out= gives it a launch plan of its own
    (the plain call's has none), and the switch is set while that plan builds its kernel."""
    buf = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16, device=a.device)

    def call():
        with env.scoped("FRAY_DISABLE_FFMA_INTERLEAVE", "0"):
            return fray.scaled_gemm(a, b, sa, sb, out=buf, backend="cuda")
    return call


def w8_inputs(recipe, m, n, k, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(0)
    wdt, kind = recipe.split("-")
    x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
    if wdt == "int8":
        w = torch.randint(-127, 128, (n, k), device=device, generator=gen, dtype=torch.int8)
    else:
        w = (torch.randn(n, k, device=device, generator=gen) * 64).to(torch.float8_e4m3fn)
    shape = (n, 1) if kind == "channel" else (n, -(-k // 128))
    s = torch.rand(shape, device=device, generator=gen) / 64 + 1e-3
    return dict(x=x, w=w, s=s, kind=kind, w16=torch.randn(n, k, device=device, generator=gen).to(torch.bfloat16))


def w8_impls(inp):
    x, w, s, kind, w16 = inp["x"], inp["w"], inp["s"], inp["kind"], inp["w16"]
    k = x.shape[1]

    def dequant_mm():
        sf = s if kind == "channel" else s.repeat_interleave(128, 1)[:, :k]
        return torch.mm(x, (w.to(torch.bfloat16) * sf).to(torch.bfloat16).t())

    return {"fray.cuda": lambda: fray.w8a16_gemm(x, w, s, backend="cuda"),
            "fray.triton": lambda: fray.w8a16_gemm(x, w, s, backend="triton"),
            "torch.mm bf16": lambda: torch.mm(x, w16.t()),
            "torch dequant+mm": dequant_mm}


def run(op, recorder, shapes=None, graph=True, device="cuda", compile_fn=torch.compile):
    if op not in SHAPES:
        raise ValueError("op: expected one of %s, got %r" % (", ".join(SHAPES), op))
    from fray.bench import bench_impls
    if op in ("rmsnorm_quant", "silu_mul_quant"):
        for variant, m, h in shapes or SHAPES[op]:
            inp = fused_inputs(op, variant, m, h, device)
            for dtype in QDTYPES:
                bench_impls(recorder, op, "%s:%dx%d" % (variant, m, h), "bf16->%s" % str(dtype).replace("torch.", ""),
                            fused_impls(op, inp, dtype, compile_fn), fused_bytes(op, inp), graph=graph)
            del inp
            if device == "cuda":
                torch.cuda.empty_cache()
        return
    if op == "w8a16_gemm":
        for recipe, m, n, k in shapes or SHAPES[op]:
            inp = w8_inputs(recipe, m, n, k, device)
            fray.w8a16_gemm(inp["x"], inp["w"], inp["s"], backend="cuda")  # tunes before the timing
            bench_impls(recorder, op, "%s:%dx%dx%d" % (recipe, m, n, k),
                        "bf16x%s->bf16" % ("int8" if recipe.startswith("int8") else "e4m3"), w8_impls(inp),
                        nbytes=float(n * k), flops=2.0 * m * n * k, graph=graph)
            del inp
            torch.cuda.empty_cache()
        return
    if op == "scaled_gemm":
        for recipe, m, n, k in shapes or SHAPES[op]:
            inp = sg_inputs(recipe, m, n, k, device)
            fray.scaled_gemm(inp["a"], inp["b"], inp["sa"], inp["sb"], fast_accum=recipe == "fp8fast", backend="cuda")
            bench_impls(recorder, op, "%s:%dx%dx%d" % (recipe, m, n, k),
                        "int8->bf16" if recipe == "int8" else "e4m3->bf16", sg_impls(inp),
                        nbytes=float(n * k) if m <= 64 else None, flops=2.0 * m * n * k, graph=graph)
            del inp
            torch.cuda.empty_cache()
        return
    for g, m, k in shapes or SHAPES[op]:
        gen = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
        for dtype in QDTYPES:
            inp = dict(x=x, dtype=dtype, granularity=g)
            bench_impls(recorder, op, "%s:%dx%d" % (g, m, k), "bf16->%s" % str(dtype).replace("torch.", ""),
                        impls(op, inp, compile_fn), nbytes(op, inp), graph=graph)
        if device == "cuda":
            torch.cuda.empty_cache()
