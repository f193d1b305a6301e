"""Conversions between what users pass (numpy arrays, CPU torch tensors of any float dtype) and the
float64 numpy arrays the references compute on."""
import numpy as np
import torch


def to_f64(a):
    if isinstance(a, torch.Tensor):
        return a.detach().to(device="cpu", dtype=torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)


def like(values, template):
    """float64 `values` rounded to `template`'s dtype, as the same kind of object (numpy/torch)."""
    if isinstance(template, torch.Tensor):
        return torch.from_numpy(np.ascontiguousarray(values)).to(template.dtype)
    return np.asarray(values).astype(template.dtype)


def round_to(values, template):
    """float64 `values` rounded to `template`'s dtype (bf16 included), returned as float64."""
    return to_f64(like(values, template))
