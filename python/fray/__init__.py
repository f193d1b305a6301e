"""Fray: verified LLM-inference operators for Hopper GPUs.

Every operator runs three ways behind one function: the CPU reference (float64), a Triton kernel
and a CUDA C++ kernel; backend="auto" picks the fastest one verified on the device.
"""
from fray.ops.norm import add_rmsnorm, rmsnorm

from fray import jit_kernels, triton  # noqa: E402  (seed-compatible alias modules)

__version__ = "0.1.0"

# Operators, their family and whether they are registered as torch custom ops (for the CLI).
OPS = {
    "rmsnorm": "norm",
    "add_rmsnorm": "norm",
}

__all__ = ["add_rmsnorm", "rmsnorm", "OPS", "__version__"]
