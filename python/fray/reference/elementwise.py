"""Elementwise references in float64.

vector_add: a + b (same shapes; the float64 sum of two fp32/fp16/bf16 values is exact, so the
            only rounding is the final one to the storage dtype).
mul:        a * b (exact in float64 for fp32/fp16/bf16 inputs: 24 + 24 bits of significand).
axpy:       a * x + b for scalars a, b rounded to fp32 first (the kernels' fp32 scalars); the
            float64 result is within half an fp32 ulp of the kernels' one fma.
Inputs are float64 numpy arrays, or float64 torch tensors on any device.
"""


def vector_add(a, b):
    return a + b


def mul(a, b):
    return a * b


def axpy(x, a, b):
    import numpy as np
    return float(np.float32(a)) * x + float(np.float32(b))
