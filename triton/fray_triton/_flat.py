"""The streaming shape every flat elementwise kernel shares (vector_add, mul, axpy, the unary
activations): BLOCK = 4096 consecutive elements and 4 warps a program, i.e. 32 elements a thread:
four 16-byte loads per input for 16-bit types (eight for fp32) issued before the math, which is
what saturates HBM; a smaller block leaves too few loads in flight per thread, a larger one only
makes the tail program longer. Triton vectorises the loads because it specialises on the
pointers' 16-byte alignment and on n % 16 == 0; other n still work (masked), at some cost on the
last program only. Offsets are int32 unless the array is too long for that (WIDE).
"""
import triton
import triton.language as tl

from fray_triton._host import cdiv

BLOCK = 4096
NUM_WARPS = 4
_INT32_LIMIT = 2 ** 31 - 1


@triton.jit
def flat_range(n, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """This program's offsets and their in-bounds mask."""
    pid = tl.program_id(0)
    if WIDE:
        start = pid.to(tl.int64) * BLOCK
    else:
        start = pid * BLOCK
    offs = start + tl.arange(0, BLOCK)
    return offs, offs < n


def launch(kernel, n, *args, **constexprs):
    """kernel[grid](*args, BLOCK=, WIDE=, **constexprs) over n elements, on the current stream."""
    kernel[(cdiv(n, BLOCK),)](*args, BLOCK=BLOCK, WIDE=n + BLOCK > _INT32_LIMIT, num_warps=NUM_WARPS, **constexprs)
