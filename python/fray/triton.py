"""Seed-compatible names for the Triton kernels: fray.triton.<op> is fray.<op>(backend="triton").

(Inside this module `import triton` would still mean the real Triton package: imports are
absolute. Fray's kernels live in the separate top-level package fray_triton.)
"""
import functools

from fray.ops import norm as _norm


def _forced(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        kwargs["backend"] = "triton"
        return fn(*args, **kwargs)
    return call


rmsnorm = _forced(_norm.rmsnorm)
add_rmsnorm = _forced(_norm.add_rmsnorm)
