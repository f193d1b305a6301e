"""Gated-activation references in float64.

silu_mul(g, u)                      = g / (1 + exp(-g)) * u
gelu_mul(g, u, approximate="none")  = 0.5 g (1 + erf(g / sqrt(2))) * u
gelu_mul(g, u, approximate="tanh")  = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u
split(x) gives (gate, up), the two halves of x's last dimension (the engines' fused layout).

Inputs are float64 numpy arrays, or float64 torch tensors on any device (the GPU tests compute the
reference next to the data). exp / erf / tanh go through torch (numpy has no erf), on a zero-copy
view of numpy inputs, and come back as the input's kind.
"""
import math

import numpy as np
import torch

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715


def _fn(name, a):
    if isinstance(a, torch.Tensor):
        return getattr(torch, name)(a)
    return getattr(torch, name)(torch.from_numpy(np.asarray(a, dtype=np.float64))).numpy()


def silu(g):
    return g / (1.0 + _fn("exp", -g))


def gelu(g, approximate="none"):
    if approximate == "tanh":
        return 0.5 * g * (1.0 + _fn("tanh", SQRT_2_OVER_PI * (g + GELU_TANH_CUBIC * g * g * g)))
    return 0.5 * g * (1.0 + _fn("erf", g / math.sqrt(2.0)))


def silu_mul(gate, up):
    return silu(gate) * up


def gelu_mul(gate, up, approximate="none"):
    return gelu(gate, approximate) * up


def split(x):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]
