"""Rope-family benchmarks: Fray's backends and the peers a user would pick, in one process.

bytes: read + write of q and k = 2 · T · (Hq + Hkv) · D · s(dtype)
       (8192 tokens, 32 q + 8 k heads of 128, bf16: 167.8 MB). The cos/sin rows (T · rotary_dim
       · 4 bytes at most, shared by all heads) and the positions are not counted.
Shapes: "8192x32x128" (tokens x q_heads x head_dim; k heads 8, in the notes), q and k separate
contiguous tensors; "8192x32x128:fused_qkv", q and k views into one [8192, (32 + 2·8)·128] buffer
(token stride 6144), as engines pass them. NeoX, rotary_dim = head_dim, positions = arange(T)
int64 on the device, max_position 32768.
Impls: fray.cuda / fray.triton in place (what engines call), fray.cuda:out of place (must match
in place); peers: torch.eager (the rotate_half composite a model file writes, indexing the
cos/sin cache by positions, out of place), torch.compile (that composite compiled), liger
(LigerRopeFunction, in place on contiguous q/k; it copies strided views; its cos/sin are
gathered per token outside the timing, as HF computes them once per forward), flashinfer
(apply_rope_with_cos_sin_cache_inplace, when importable).
"""
import torch

import fray
from fray.ops import rope as ops

TOKENS, Q_HEADS, K_HEADS, HEAD_DIM = 8192, 32, 8, 128
SHAPES = [("8192x32x128", False), ("8192x32x128:fused_qkv", True)]
MAX_POSITION = 32768


def _eager_rope(q, k, cache, positions):
    cos, sin = cache[positions].chunk(2, dim=-1)  # [T, R/2] each
    cos = torch.cat((cos, cos), dim=-1).unsqueeze(1)  # [T, 1, R]
    sin = torch.cat((sin, sin), dim=-1).unsqueeze(1)

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    qf, kf = q.float(), k.float()
    return (qf * cos + rotate_half(qf) * sin).to(q.dtype), (kf * cos + rotate_half(kf) * sin).to(k.dtype)


def _liger():
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except Exception:  # not installed: the row is simply absent (the bundle carries the wheel)
        return None
    return LigerRopeFunction


def _flashinfer():
    try:
        from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace
    except Exception:
        return None
    return apply_rope_with_cos_sin_cache_inplace


def _impls(q, k, positions, cache):
    kw = dict(max_position=MAX_POSITION, cos_sin_cache=cache)
    impls = {
        "fray.cuda": lambda: fray.rope(q, k, positions, inplace=True, backend="cuda", **kw),
        "fray.triton": lambda: fray.rope(q, k, positions, inplace=True, backend="triton", **kw),
        "fray.cuda:out": lambda: fray.rope(q, k, positions, backend="cuda", **kw),
        "torch.eager": lambda: _eager_rope(q, k, cache, positions),
    }
    compiled = torch.compile(_eager_rope)
    impls["torch.compile"] = lambda: compiled(q, k, cache, positions)
    liger = _liger()
    if liger is not None:
        # Liger takes [batch, heads, seq, dim] and transposes to [batch, seq, heads, dim]: our
        # [T, H, D] seen as [1, H, T, D]. cos/sin [T, R] (duplicated halves), one row per token.
        half = HEAD_DIM // 2
        rows = cache[positions]
        cos = torch.cat((rows[:, :half], rows[:, :half]), dim=-1)
        sin = torch.cat((rows[:, half:], rows[:, half:]), dim=-1)
        q4, k4 = q.unsqueeze(0).transpose(1, 2), k.unsqueeze(0).transpose(1, 2)
        impls["liger"] = lambda: liger.apply(q4, k4, cos, sin, None, 1)
    flashinfer = _flashinfer()
    if flashinfer is not None:
        qf, kf = q.view(q.shape[0], -1), k.view(k.shape[0], -1)
        impls["flashinfer"] = lambda: flashinfer(positions, qf, kf, HEAD_DIM, cache, True)
    return impls


def _inputs(fused, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    if fused:
        qkv = torch.randn(TOKENS, (Q_HEADS + 2 * K_HEADS) * HEAD_DIM, device="cuda", generator=g).to(dtype)
        q = qkv[:, :Q_HEADS * HEAD_DIM].view(TOKENS, Q_HEADS, HEAD_DIM)
        k = qkv[:, Q_HEADS * HEAD_DIM:(Q_HEADS + K_HEADS) * HEAD_DIM].view(TOKENS, K_HEADS, HEAD_DIM)
    else:
        q = torch.randn(TOKENS, Q_HEADS, HEAD_DIM, device="cuda", generator=g).to(dtype)
        k = torch.randn(TOKENS, K_HEADS, HEAD_DIM, device="cuda", generator=g).to(dtype)
    return q, k


def run(op, recorder, shapes=None, graph=True):
    if op != "rope":
        raise ValueError("op: expected rope, got %r" % op)
    if shapes is not None:
        raise ValueError("shapes: the rope benchmark times fixed shapes (%s); --shapes is not supported"
                         % ", ".join(s for s, _ in SHAPES))
    from fray.bench import bench_impls
    dtype = torch.bfloat16
    cache = ops.cos_sin_cache(MAX_POSITION, HEAD_DIM, 10000.0, "cuda")
    positions = torch.arange(TOKENS, device="cuda", dtype=torch.int64)
    nbytes = 2 * TOKENS * (Q_HEADS + K_HEADS) * HEAD_DIM * torch.tensor([], dtype=dtype).element_size()
    notes = "k heads %d; neox; rotary_dim %d; positions arange int64; fray in place" % (K_HEADS, HEAD_DIM)
    for shape, fused in SHAPES:
        q, k = _inputs(fused, dtype)
        impls = _impls(q, k, positions, cache)
        bench_impls(recorder, op, shape, dtype, impls, nbytes, graph=graph, notes=notes)
