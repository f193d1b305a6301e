"""The GEMM reference: float64 math, C = A @ B (+ bias), B given as [N, K] ("nk") or [K, N] ("kn")."""
import numpy as np


def gemm(a, b, b_layout="nk", bias=None):
    """a [M, K], b [N, K] ("nk") or [K, N] ("kn"), bias [N] or None; float64 arrays in and out."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    c = a @ (b.T if b_layout == "nk" else b)
    if bias is not None:
        c = c + np.asarray(bias, np.float64)[None, :]
    return c


def term_scale(a, b, b_layout="nk", bias=None):
    """|a| @ |b| (+ |bias|): per output element the sum of the magnitudes of the terms it adds up,
    the scale the fp32 accumulation error grows with (fray.testing.assert_gemm_close)."""
    return gemm(np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64)), b_layout,
                None if bias is None else np.abs(np.asarray(bias, np.float64)))
