"""Host-side integer helpers for the launchers.

triton.cdiv and triton.next_power_of_2 are constexpr-function wrappers in Triton 3.6, ~3.5 µs
per call on the host (measured: seven of them were a third of the Triton rope launcher's host
time). Launch parameters are plain Python ints, so plain Python does the same arithmetic.
"""


def cdiv(a, b):
    return -(-a // b)


def next_power_of_2(n):
    """The smallest power of two >= n (0 for n <= 0, as triton.next_power_of_2(0))."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
