"""Softmax references in float64.

online_softmax: per row (last axis) m = max(x), s = sum(exp(x - m)), y = exp(x - m) / s and
                lse = m + log(s) (natural log). An all -inf row gives y = NaN (as torch.softmax)
                and m = lse = -inf (as torch.logsumexp): the shift is taken as 0 when m = -inf,
                so that s = 0 instead of NaN. Rows holding NaN or +inf give NaN.
softmax:        y = online_softmax(x / temperature)[0] along `axis`.
Inputs are float64 numpy arrays, or float64 torch tensors on any device (the GPU tests compute the
reference next to the data).
"""
import numpy as np


def _is_numpy(x):
    return isinstance(x, np.ndarray)


def online_softmax(x):
    """(y, row_max, row_lse) over the last axis; the statistics drop that axis."""
    if _is_numpy(x):
        m = x.max(axis=-1, keepdims=True)
        shift = np.where(m == -np.inf, 0.0, m)
        with np.errstate(invalid="ignore", divide="ignore"):
            e = np.exp(x - shift)
            s = e.sum(axis=-1, keepdims=True)
            y = e / s
            lse = shift + np.log(s)
        return y, m[..., 0], lse[..., 0]
    import torch
    m = x.amax(dim=-1, keepdim=True)
    shift = torch.where(m == float("-inf"), 0.0, m)
    e = torch.exp(x - shift)
    s = e.sum(dim=-1, keepdim=True)
    return e / s, m[..., 0], (shift + torch.log(s))[..., 0]


def softmax(x, temperature=1.0, axis=-1):
    z = x / temperature
    if _is_numpy(x):
        return np.moveaxis(online_softmax(np.moveaxis(z, axis, -1))[0], -1, axis)
    return online_softmax(z.movedim(axis, -1))[0].movedim(-1, axis)
