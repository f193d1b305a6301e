"""Seed-compatible names of the CUDA kernels (the seed compiled them at run time; Fray builds them
ahead of time with Bazel). Same code as the public API."""
import torch

from fray.ops import attention as _attention
from fray.ops import norm as _norm
from fray.ops import rope as _rope
from fray.ops import softmax as _softmax


def fused_rmsnorm(input, residual, weight, epsilon=1e-5):
    """residual <- input + residual (in place); returns rmsnorm(residual) with eps=epsilon."""
    return _norm.add_rmsnorm_residual_inplace(input, residual, weight, epsilon, backend="auto")


def fused_rope(q, k, cos, sin, offsets):
    """In-place NeoX rope (the seed's contract): cos/sin fp32 [max_position, rotary_dim/2] used as
    given (no concatenation), offsets an int tensor [tokens] of positions. Returns (q, k)."""
    return _rope.rope(q, k, offsets, max_position=cos.shape[0], cos_sin_cache=(cos, sin), inplace=True)


def softmax(x):
    """Row softmax over the last dim (backend auto)."""
    return _softmax.softmax(x)


def online_softmax(x):
    """(softmax(x), row max, row log-sum-exp) over the last dim (backend auto)."""
    return _softmax.online_softmax(x)


def flash_decoding(Q, K, V, Output):
    """The seed's flash decoding: Q [B, H, 1, D], K/V [B, H, T, D] (HND, all T positions valid),
    Output [B, H, 1, D]."""
    lens = torch.full((K.shape[0],), K.shape[2], dtype=torch.int32, device=K.device)
    return _attention.decode_attention(Q, K, V, lens, out=Output)
