"""What the property-based tests (tests/core/test_properties*.py) share: the hypothesis profiles
("ci": derandomised, the CPU tests; "gpu": the GPU tests), the GPU tests' decorators, the autouse
fixture's body that puts Triton under its interpreter or compiles it, `on` (a call's tensors
moved to a device and back) and what a kernel sees of its inputs there."""
import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

settings.register_profile("ci", derandomize=True, max_examples=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
# The GPU profile: 200 examples where an example costs little; tests whose Triton kernels specialise
# on many shapes take fewer (max_examples=). Triton compiles a kernel per specialisation (constexprs,
# dtypes, 16-byte alignment of pointers, integers == 1 or multiples of 16), 1-3 s each: the counts
# hold a GPU test to about 5-70 of them, about 850 over the three property files (counted at
# 2026-12-07 by running the GPU tests' bodies under the interpreter, not yet timed on a GPU), so
# that the three files, with their JIT builds, fit about 4 minutes on 16 pytest-xdist workers.
settings.register_profile("gpu", derandomize=True, max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


def gpu(backends=("cuda", "triton"), max_examples=None):
    """The decorators of a GPU property test: marked gpu (run with -m gpu; they fail where torch sees
    no CUDA device, as every GPU test does), one test per backend (pytest parameter `backend`), the "gpu" profile
    (max_examples: fewer examples where each costs more)."""
    profile = settings.get_profile("gpu")
    chosen = profile if max_examples is None else settings(profile, max_examples=max_examples)

    def wrap(test):
        test = settings(chosen)(given(data=st.data())(test))
        test = pytest.mark.parametrize("backend", backends)(test)
        return pytest.mark.gpu(test)
    return wrap


def triton_mode(request, monkeypatch, require_interpreter=False):
    """The body of each property file's autouse fixture. CPU tests: Triton under its interpreter
    (require_interpreter: skipped without TRITON_INTERPRET=1, which the Bazel CPU target sets,
    rather than setting it). GPU tests: Triton compiled (the interpreter unset; Triton decides when
    a module's kernels are defined, so no fray_triton module may have been imported under the
    interpreter in this process) and fray.tune's heuristic configurations."""
    if request.node.get_closest_marker("gpu") is None:
        if not require_interpreter:
            monkeypatch.setenv("TRITON_INTERPRET", "1")
        elif os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
        return
    assert torch.cuda.is_available(), "GPU test selected (-m gpu) but torch sees no CUDA device"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("FRAY_AUTOTUNE", "0")
    from triton.runtime.interpreter import InterpretedFunction
    interpreted = sorted(name for name, mod in list(sys.modules.items()) if name.startswith("fray_triton")
                         and any(isinstance(v, InterpretedFunction) for v in vars(mod).values()))
    if interpreted:
        pytest.fail("%s imported under TRITON_INTERPRET=1 in this process: run the GPU tests apart (-m gpu)"
                    % ", ".join(interpreted))


def on(device, fn, *args, **kwargs):
    """fn(*args, **kwargs) with its tensor arguments (also inside lists and tuples) on `device`; on
    the CPU the call itself. Each tensor travels with the whole storage it views, so strides,
    offsets, the buffer around a view and the aliasing among the arguments stay as they are, and
    after fn every storage is copied back over its CPU original: the checks read what fn wrote,
    wherever it wrote, in the CPU tensors. Tensors fn returns come back as CPU copies."""
    if device == "cpu":
        return fn(*args, **kwargs)
    copies = {}

    def there(t):
        if isinstance(t, (list, tuple)):
            return type(t)(there(u) for u in t)
        if not isinstance(t, torch.Tensor):
            return t
        s = t.untyped_storage()
        key = (s.data_ptr(), s.nbytes())
        if key not in copies:
            host = torch.empty(0, dtype=torch.uint8).set_(s)
            copies[key] = (host, host.to(device))
        return torch.empty(0, dtype=t.dtype, device=device).set_(copies[key][1].untyped_storage(),
                                                                 t.storage_offset(), t.shape, t.stride())

    def back(r):
        if isinstance(r, (list, tuple)):
            return type(r)(back(u) for u in r)
        return r.cpu() if isinstance(r, torch.Tensor) else r

    result = fn(*there(args), **{k: there(v) for k, v in kwargs.items()})
    torch.cuda.synchronize()
    for host, dev in copies.values():
        host.copy_(dev)
    return back(result)


def sees(device):
    """What a kernel sees of its inputs on `device`: interpreter_load under the interpreter (the
    CPU), the inputs themselves on the GPU."""
    return interpreter_load if device == "cpu" else (lambda x: x)


def interpreter_load(x):
    """What a kernel sees of x under Triton's CPU interpreter: its bf16 -> fp32 conversion flushes
    bf16 subnormals to a zero of their sign (tests/core/test_properties.py: test_interpreter_flushes_bf16_subnormals
    holds it; on the GPU the conversion is a bit shift, exact), so the oracle takes the inputs the same way."""
    if x.dtype != torch.bfloat16:
        return x
    sub = (x != 0) & (x.abs() < torch.finfo(x.dtype).tiny)
    return torch.where(sub, x * 0, x)
