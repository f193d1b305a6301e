"""Seed-compatible names for the Triton kernels: fray.triton.<op> is fray.<op>(backend="triton").

(Inside this module `import triton` would still mean the real Triton package: imports are
absolute. Fray's kernels live in the separate top-level package fray_triton.)
"""
import functools

from fray.ops import activation as _activation
from fray.ops import attention as _attention
from fray.ops import elementwise as _elementwise
from fray.ops import gemm as _gemm
from fray.ops import moe_gemm as _moe_gemm
from fray.ops import norm as _norm
from fray.ops import rope as _rope
from fray.ops import sampling as _sampling
from fray.ops import softmax as _softmax


def _forced(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        kwargs["backend"] = "triton"
        return fn(*args, **kwargs)
    return call


rmsnorm = _forced(_norm.rmsnorm)
add_rmsnorm = _forced(_norm.add_rmsnorm)
silu_mul = _forced(_activation.silu_mul)
gelu_mul = _forced(_activation.gelu_mul)
rope = _forced(_rope.rope)
softmax = _forced(_softmax.softmax)
online_softmax = _forced(_softmax.online_softmax)
layernorm = _forced(_norm.layernorm)
vector_add = _forced(_elementwise.vector_add)
decode_attention = _forced(_attention.decode_attention)
paged_decode_attention = _forced(_attention.paged_decode_attention)
prefill_attention = _forced(_attention.prefill_attention)
mla_decode = _forced(_attention.mla_decode)
topk = _forced(_sampling.topk)


def attention_prefill(q_all, k_all, v_all, causal=True):
    """The seed's prefill attention: batched q_all [B, S, Hq, D], k_all / v_all [B, S, Hkv, D]
    (fray.prefill_attention's batched form, causal aligned bottom-right) on the Triton backend."""
    return _attention.prefill_attention(q_all, k_all, v_all, causal=causal, backend="triton")


def matmul(a, b):
    """a [M, K] @ b [K, N] (the seed's layout) on the Triton backend."""
    return _gemm.gemm(a, b, b_layout="kn", backend="triton")


def fused_moe(x, router_logits, w13, w2, top_k=2, **kwargs):
    """The seed's fused MoE: x [T, H], router_logits [T, E], the seed's layouts w13 [E, H, 2I] and
    w2 [E, I, H] (fray.fused_moe with w_layout="kn"; pass w_layout="nk" for vLLM's), softmax top-k
    routing renormalised, SiLU, on the Triton backend."""
    kwargs.setdefault("w_layout", "kn")
    return _moe_gemm.fused_moe(x, w13, w2, router_logits=router_logits, top_k=top_k, backend="triton", **kwargs)


def grouped_gemm(a, b, group_offsets=None, **kwargs):
    """The seed's explicit-metadata grouped GEMM (b as [G, K, N] by default, the seed's layout)."""
    kwargs.setdefault("b_layout", "kn")
    return _moe_gemm.grouped_gemm(a, b, group_offsets, backend="triton", **kwargs)


def routed_grouped_gemm(x, expert_weights, logits, top_k, **kwargs):
    """The seed's routed grouped GEMM (expert_weights as [E, K, N] by default, the seed's layout)."""
    kwargs.setdefault("b_layout", "kn")
    return _moe_gemm.routed_grouped_gemm(x, expert_weights, logits, top_k, backend="triton", **kwargs)
