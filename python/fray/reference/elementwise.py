"""Elementwise references in float64.

vector_add: a + b (same shapes; the float64 sum of two fp32/fp16/bf16 values is exact, so the
            only rounding is the final one to the storage dtype).
Inputs are float64 numpy arrays, or float64 torch tensors on any device.
"""


def vector_add(a, b):
    return a + b
