"""Gated-activation references in float64.

silu_mul(g, u)                      = g / (1 + exp(-g)) * u
gelu_mul(g, u, approximate="none")  = 0.5 g (1 + erf(g / sqrt(2))) * u
gelu_mul(g, u, approximate="tanh")  = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u
relu(g)                             = max(g, 0) (NaN kept)
tanh(g), sigmoid(g)                 = tanh(g), 1 / (1 + exp(-g))
silu / gelu / relu / tanh / sigmoid are also the unary ops of the same names.
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


def relu(g):
    # where(g < 0, 0, g), not maximum: NaN stays NaN, as in the kernels and torch.relu
    if isinstance(g, torch.Tensor):
        return torch.where(g < 0, torch.zeros_like(g), g)
    return np.where(g < 0, 0.0, g)


def tanh(g):
    return _fn("tanh", g)


def sigmoid(g):
    return 1.0 / (1.0 + _fn("exp", -g))


def silu_mul(gate, up):
    return silu(gate) * up


def gelu_mul(gate, up, approximate="none"):
    return gelu(gate, approximate) * up


def split(x):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]
