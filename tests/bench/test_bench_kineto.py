"""fray.bench_kineto: argument errors anywhere; on the GPU, a kernel of known work timed from
the profiler trace against do_bench of the same call."""
import pytest
import torch

import fray


def test_bad_arguments():
    with pytest.raises(ValueError, match="kernel_names"):
        fray.bench_kineto(lambda: None, ())
    with pytest.raises(ValueError, match="kernel_names"):
        fray.bench_kineto(lambda: None, "")
    with pytest.raises(ValueError, match="num_tests"):
        fray.bench_kineto(lambda: None, "gemm", num_tests=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-device error")
def test_needs_a_device():
    with pytest.raises(RuntimeError, match="CUDA device"):
        fray.bench_kineto(lambda: None, "gemm")


@pytest.mark.gpu
def test_gpu_add_against_do_bench(cuda):
    """torch.add of 2 x 256 MB into a third buffer (768 MB moved, ~190 µs on an H200): the trace's
    kernel time must be close to do_bench's wall time per call (which adds only launch gaps)."""
    from triton.testing import do_bench
    n = 64 << 20
    a = torch.randn(n, device=cuda)
    b = torch.randn(n, device=cuda)
    c = torch.empty_like(a)

    def fn():
        torch.add(a, b, out=c)

    seconds = fray.bench_kineto(fn, "CUDAFunctor_add", num_tests=20)
    wall_us = 1000.0 * do_bench(fn, warmup=25, rep=100, return_mode="median")
    kineto_us = seconds * 1e6
    print("add 3 x 256 MB: kineto %.1f us, do_bench %.1f us" % (kineto_us, wall_us))
    assert 0.8 * wall_us <= kineto_us <= 1.1 * wall_us, (kineto_us, wall_us)
    assert 3 * 4 * n / seconds < 5.0e12  # under the H200's 4.8 TB/s: the L2 did not serve it
    pair = fray.bench_kineto(fn, ("CUDAFunctor_add", "CUDAFunctor_add"), num_tests=5)
    assert isinstance(pair, tuple) and len(pair) == 2
    with pytest.raises(ValueError, match="L2 flush kernel"):
        fray.bench_kineto(fn, "elementwise_kernel")
    with pytest.raises(RuntimeError, match="no kernel matching"):
        fray.bench_kineto(fn, "no_such_kernel_name", num_tests=2)
