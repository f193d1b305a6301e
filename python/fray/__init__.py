"""Fray: verified LLM-inference operators for Hopper GPUs.

Every operator runs three ways behind one function: the CPU reference (float64), a Triton kernel
and a CUDA C++ kernel; backend="auto" picks the fastest one verified on the device.

Each family is one module fray.ops.<family> listing its public functions in __all__ and its
operators in OPS (and, when an op's CUDA kernels live in another extension than fray._C._<family>,
that extension in CUDA_FAMILIES); they are collected here, so adding a family edits no shared file.
"""
import importlib as _importlib
import pkgutil as _pkgutil

from fray import ops as _ops

__version__ = "0.1.0"

OPS = {}          # op name -> family
FAMILIES = {}     # family -> module
CUDA_FAMILY = {}  # op name -> the family of its CUDA extension (fray._C._<family>)
for _info in sorted(_pkgutil.iter_modules(_ops.__path__), key=lambda m: m.name):
    _module = _importlib.import_module("fray.ops." + _info.name)
    FAMILIES[_info.name] = _module
    for _name in _module.__all__:
        globals()[_name] = getattr(_module, _name)
    for _op in _module.OPS:
        OPS[_op] = _info.name
        CUDA_FAMILY[_op] = getattr(_module, "CUDA_FAMILIES", {}).get(_op, _info.name)

from fray import jit, jit_kernels, triton, tune  # noqa: E402  (jit, tune; seed-compatible alias modules)
from fray.bench.kineto import bench_kineto  # noqa: E402  (the seed's name for the kernel timer)

__all__ = sorted(OPS) + ["OPS", "FAMILIES", "CUDA_FAMILY", "__version__", "bench_kineto", "jit", "tune"]
