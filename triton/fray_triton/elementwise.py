"""Elementwise ops in Triton over flat, dense arrays: vector_add (out = a + b), mul (out = a * b) and
axpy (out = a * x + b for scalars a, b).

Semantics match cuda/elementwise and fray.reference.elementwise: fp32 math, one rounding to the
output dtype (bitwise what torch.add gives).

A streaming op: every element is read once from a and b and written once, so the kernel only
has to keep enough bytes in flight. Each program takes BLOCK = 4096 consecutive elements with
4 warps, i.e. 32 elements a thread: four 16-byte loads per input for 16-bit types (eight for
fp32) issued before the add, which is what saturates HBM; a smaller block leaves too few loads
in flight per thread, a larger one only makes the tail program longer. Triton vectorises the
loads because it specialises on the pointers' 16-byte alignment and on n % 16 == 0; other n
still work (masked), at some cost on the last program only.
"""
import triton
import triton.language as tl

from fray_triton._host import cdiv

from fray_triton.norm import _round

BLOCK = 4096
NUM_WARPS = 4
# Offsets are computed in int32 unless the array is too long for that (WIDE).
_INT32_LIMIT = 2 ** 31 - 1


@triton.jit
def _vector_add_kernel(A, B, OUT, n, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    pid = tl.program_id(0)
    if WIDE:
        start = pid.to(tl.int64) * BLOCK
    else:
        start = pid * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0)
    b = tl.load(B + offs, mask=mask, other=0.0)
    y = a.to(tl.float32) + b.to(tl.float32)
    tl.store(OUT + offs, _round(y, OUT.dtype.element_ty), mask=mask)


def vector_add(a, b, out, n):
    """Launch on the current stream. a, b, out: dense tensors of one layout and dtype holding n
    elements (their flat storage is what is added); out may be a or b."""
    grid = (cdiv(n, BLOCK),)
    _vector_add_kernel[grid](a, b, out, n, BLOCK=BLOCK, WIDE=n + BLOCK > _INT32_LIMIT, num_warps=NUM_WARPS)


@triton.jit
def _mul_kernel(A, B, OUT, n, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    pid = tl.program_id(0)
    if WIDE:
        start = pid.to(tl.int64) * BLOCK
    else:
        start = pid * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0)
    b = tl.load(B + offs, mask=mask, other=0.0)
    y = a.to(tl.float32) * b.to(tl.float32)
    tl.store(OUT + offs, _round(y, OUT.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["alpha", "beta"])
def _axpy_kernel(X, OUT, n, alpha, beta, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    pid = tl.program_id(0)
    if WIDE:
        start = pid.to(tl.int64) * BLOCK
    else:
        start = pid * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * alpha + beta  # fp32; the compiler contracts it to one fma, as the CUDA kernel's fmaf
    tl.store(OUT + offs, _round(y, OUT.dtype.element_ty), mask=mask)


def mul(a, b, out, n):
    """out = a * b; the same contract as vector_add."""
    grid = (cdiv(n, BLOCK),)
    _mul_kernel[grid](a, b, out, n, BLOCK=BLOCK, WIDE=n + BLOCK > _INT32_LIMIT, num_warps=NUM_WARPS)


def axpy(x, out, n, a, b):
    """out = a * x + b in fp32 for Python floats a, b (passed as fp32 scalars); out may be x."""
    grid = (cdiv(n, BLOCK),)
    _axpy_kernel[grid](x, out, n, float(a), float(b), BLOCK=BLOCK, WIDE=n + BLOCK > _INT32_LIMIT,
                       num_warps=NUM_WARPS)
