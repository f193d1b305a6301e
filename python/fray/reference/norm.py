"""RMSNorm and LayerNorm references in float64.

rmsnorm:     y = x / sqrt(mean(x^2, last axis) + eps) * (w + weight_offset)
add_rmsnorm: s = x + r rounded to the storage dtype (that rounded sum is what gets stored and
             normalised), y = rmsnorm(s). `round_sum` performs that rounding.
layernorm:   y = (x - mean) / sqrt(mean((x - mean)^2) + eps) * w + b (two-step variance).
Inputs are float64 numpy arrays, or float64 torch tensors on any device (the GPU tests compute the
reference next to the data); only array methods both libraries share are used.
"""


def rmsnorm(x, weight, eps, weight_offset=0.0):
    ms = (x * x).mean(axis=-1, keepdims=True)
    return x / (ms + eps) ** 0.5 * (weight + weight_offset)


def add_rmsnorm(x, residual, weight, eps, weight_offset=0.0, round_sum=None):
    s = x + residual
    if round_sum is not None:
        s = round_sum(s)
    return rmsnorm(s, weight, eps, weight_offset), s


def layernorm(x, weight, bias, eps):
    """y = (x - mean) / sqrt(var + eps) * weight (+ bias), biased variance (as torch), last axis.
    bias may be None."""
    mean = x.mean(axis=-1, keepdims=True)
    c = x - mean
    var = (c * c).mean(axis=-1, keepdims=True)
    y = c / (var + eps) ** 0.5 * weight
    if bias is not None:
        y = y + bias
    return y
