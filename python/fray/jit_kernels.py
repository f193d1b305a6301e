"""Seed-compatible names of the CUDA kernels (the seed compiled them at run time; Fray builds them
ahead of time with Bazel). Same code as the public API."""
from fray.ops import norm as _norm


def fused_rmsnorm(input, residual, weight, epsilon=1e-5):
    """residual <- input + residual (in place); returns rmsnorm(residual) with eps=epsilon."""
    return _norm.add_rmsnorm_residual_inplace(input, residual, weight, epsilon, backend="auto")
