"""Elementwise ops in Triton over flat, dense arrays: vector_add (out = a + b), mul (out = a * b) and
axpy (out = a * x + b for scalars a, b).

Semantics match cuda/elementwise and fray.reference.elementwise: fp32 math, one rounding to the
output dtype (bitwise what torch.add gives).

The streaming shape (block, warps, int32 / int64 offsets) is fray_triton._flat's.
"""
import triton
import triton.language as tl

from fray_triton import _flat
from fray_triton._flat import flat_range
from fray_triton.norm import _round

_ADD, _MUL = 0, 1  # _binary_kernel's OP (literals inside the kernel: jit code reads no globals)


@triton.jit
def _binary_kernel(A, B, OUT, n, OP: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    offs, mask = flat_range(n, BLOCK, WIDE)
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    if OP == 0:  # _ADD
        y = a + b
    else:
        y = a * b
    tl.store(OUT + offs, _round(y, OUT.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["alpha", "beta"])
def _axpy_kernel(X, OUT, n, alpha, beta, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    offs, mask = flat_range(n, BLOCK, WIDE)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * alpha + beta  # fp32; the compiler contracts it to one fma, as the CUDA kernel's fmaf
    tl.store(OUT + offs, _round(y, OUT.dtype.element_ty), mask=mask)


def vector_add(a, b, out, n):
    """Launch on the current stream. a, b, out: dense tensors of one layout and dtype holding n
    elements (their flat storage is what is added); out may be a or b."""
    _flat.launch(_binary_kernel, n, a, b, out, n, OP=_ADD)


def mul(a, b, out, n):
    """out = a * b; the same contract as vector_add."""
    _flat.launch(_binary_kernel, n, a, b, out, n, OP=_MUL)


def axpy(x, out, n, a, b):
    """out = a * x + b in fp32 for Python floats a, b (passed as fp32 scalars); out may be x."""
    _flat.launch(_axpy_kernel, n, x, out, n, float(a), float(b))
