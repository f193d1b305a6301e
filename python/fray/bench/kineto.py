"""fray.bench_kineto: the seed's kernel timer. Device time of the named kernels, read from a
torch.profiler (Kineto) trace, so launch gaps and host work are not counted, averaged over
num_tests calls with the L2 flushed before each call."""
import torch

# Twice the H200's 50 MB L2 would do; 256 MB also covers the next parts and is what the seed used.
FLUSH_BYTES = 256 << 20


def _device_kernels(prof):
    """[(name, µs)] of the device-side events (kernels, memcpys, memsets) of a finished profile."""
    from torch.autograd import DeviceType
    out = []
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            out.append((e.trace_name or e.name, e.time_range.elapsed_us()))
    return out


def bench_kineto(fn, kernel_names, num_tests=30, flush_l2=True, trace_path=None):
    """Average device time per call of fn, in SECONDS (as the seed returned it), of every kernel
    whose name contains one of `kernel_names` (a str gives a float, a tuple/list one float per
    name). fn is called once to warm up, then num_tests times under the profiler, each call after a
    256 MB buffer is zeroed (flush_l2) to evict the L2; the flush kernel is not counted, and a name
    that also matches it is refused. trace_path: also write the Chrome trace there."""
    single = isinstance(kernel_names, str)
    names = (kernel_names,) if single else tuple(kernel_names)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError("bench_kineto: kernel_names must be a non-empty str or a sequence of them, got %r"
                         % (kernel_names,))
    if not isinstance(num_tests, int) or num_tests < 1:
        raise ValueError("bench_kineto: num_tests must be a positive int, got %r" % (num_tests,))
    if not torch.cuda.is_available():
        raise RuntimeError("bench_kineto: needs a CUDA device (torch.cuda.is_available() is False)")
    from torch.profiler import ProfilerActivity, profile
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if flush_l2 else None
    flush_names = set()
    if flush is not None:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            flush.zero_()
            torch.cuda.synchronize()
        flush_names = {n for n, _ in _device_kernels(prof)}
        for name in names:
            clash = [f for f in flush_names if name in f]
            if clash:
                raise ValueError("bench_kineto: kernel name %r also matches the L2 flush kernel %r: name the "
                                 "kernel more precisely or pass flush_l2=False" % (name, clash[0]))
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(num_tests):
            if flush is not None:
                flush.zero_()
            fn()
        torch.cuda.synchronize()
    if trace_path:
        prof.export_chrome_trace(trace_path)
    kernels = [(n, us) for n, us in _device_kernels(prof) if n not in flush_names]
    seconds = []
    for name in names:
        matched = [us for n, us in kernels if name in n]
        if not matched:
            seen = sorted({n for n, _ in kernels})
            raise RuntimeError("bench_kineto: no kernel matching %r in the trace; kernels seen: %s"
                               % (name, "; ".join(s[:120] for s in seen[:10]) or "none"))
        seconds.append(sum(matched) / num_tests / 1e6)
    return seconds[0] if single else tuple(seconds)
