"""Rotary position embedding (RoPE) references in float64.

cos_sin_cache: the table [max_position, rotary_dim], first half cos, second half sin:
               cos[p, i] = cos(p * theta^(-2i / rotary_dim)), i < rotary_dim / 2 (same for sin).
rope:          for a head x and the token's position p, each pair (a, b) is rotated by the
               angle of its index i:  a' = a*cos[p, i] - b*sin[p, i],  b' = b*cos[p, i] + a*sin[p, i]
               neox: a = x[i], b = x[i + rotary_dim/2]; gptj: a = x[2i], b = x[2i + 1].
               x[rotary_dim:] passes through.
rope takes float64 numpy arrays, or float64 torch tensors on any device (the GPU tests compute the
reference next to the data), with integer positions of the same library; only operations both
libraries share are used (indexing, slicing, arithmetic).
"""
import numpy as np


def cos_sin_cache(max_position, rotary_dim, theta=10000.0):
    """float64 numpy [max_position, rotary_dim]: cos | sin of p * theta^(-2i / rotary_dim)."""
    i = np.arange(rotary_dim // 2, dtype=np.float64)
    inv_freq = float(theta) ** (-2.0 * i / rotary_dim)
    angles = np.outer(np.arange(max_position, dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=-1)


def rope(x, positions, cos, sin, style="neox"):
    """x [tokens, heads, head_dim]; positions [tokens] integers; cos, sin [max_position, r/2]
    (r = rotary_dim). Returns a new array/tensor; the caller's x is not modified."""
    half = cos.shape[-1]
    rotary_dim = 2 * half
    c = cos[positions][:, None, :]  # [tokens, 1, half]: one row per token, shared by its heads
    s = sin[positions][:, None, :]
    out = x * 1.0  # a copy in both numpy and torch
    if style == "neox":
        a, b = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = a * c - b * s
        out[..., half:rotary_dim] = b * c + a * s
    elif style == "gptj":
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = a * c - b * s
        out[..., 1:rotary_dim:2] = b * c + a * s
    else:
        raise ValueError("style: expected 'neox' or 'gptj', got %r" % (style,))
    return out
