"""Launch plans: validate a call signature once, then launch from a cached plan.

An eager call of a small op used to spend far longer in Python than its kernel runs on the GPU
(validation helpers, backend resolution, stride arithmetic, per-argument binding casts). Every op
now works in two steps:

  key = signature(op, backend, tensors, scalars)   # shapes, strides, dtypes, devices, scalars
  plan = PLANS.get(key)                             # None: validate fully, build, PLANS.put(key, plan)
  plan(tensors)                                     # data pointers and the stream are read per call

The key holds everything validation reads and everything the plan depends on: each tensor's
shape, strides, dtype and device (or None), the scalars that change validation or the plan (with
their types, so that True and 1 or 1 and 1.0 never share a plan), the requested backend and
FRAY_BACKEND. A call whose arguments cannot form a key (numpy arrays, unhashable values) misses
and takes the full path. Bad input never gets a plan: it raises
during validation, before anything is cached, so every bad call raises exactly as before.

Plans are per process and bounded (the oldest evicted beyond MAX_PLANS), so a workload
whose shapes keep changing (prefill over varying token counts) does not grow memory without
limit; a miss costs the full validation it always cost plus one dict insertion.
"""
import collections

import torch

from fray import backend as B
from fray import env

MAX_PLANS = 1024

try:
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # CPU-only torch builds
    _raw_stream = None


class PlanCache:
    """A size-capped map signature -> plan. Beyond maxsize the oldest plan goes (insertion order):
    an exact LRU's reordering on every hit cost more than the lookup itself, and a workload that
    cycles through more signatures than the cap pays only the validation it always paid."""

    def __init__(self, maxsize=MAX_PLANS):
        self.maxsize = maxsize
        self._plans = {}

    def get(self, key):
        try:
            return self._plans.get(key)
        except TypeError:  # an unhashable argument: no plan, the full path decides
            return None

    def put(self, key, plan):
        if key is None:
            return plan
        try:
            self._plans[key] = plan
        except TypeError:
            return plan
        if len(self._plans) > self.maxsize:
            del self._plans[next(iter(self._plans))]
        return plan

    def clear(self):
        self._plans.clear()

    def __len__(self):
        return len(self._plans)


PLANS = PlanCache()


_Tensor = torch.Tensor
_NO_KEY = []  # stands for an argument no key can hold: unhashable, so the lookup misses


def signature(op, backend, tensors, scalars=()):
    """The plan key of one call (unhashable when an argument cannot be part of one: numpy arrays,
    lists; PLANS then misses and the full path decides).

    tensors: the call's tensor arguments in a fixed order (None for an absent optional one).
    scalars: every non-tensor argument that validation reads or the plan depends on; their types
    are part of the key. (One loop, no per-tensor function call: this runs on every eager call;
    a map over a key function cost ~20% more on the CPU, 2026-12-08.)"""
    keys = []
    for t in tensors:
        if t is None:
            keys.append(None)
        elif isinstance(t, _Tensor):
            # get_device(): the CUDA index, -1 for every other device (plans exist for CUDA tensors only)
            keys.append((t.shape, t.stride(), t.dtype, t.get_device()))
        else:
            keys.append(_NO_KEY)
    return (op, backend, env.backend_override(), tuple(keys), scalars, tuple(map(type, scalars)) if scalars else ())


def misaligned(*tensors):
    """Whether any of the tensors' (None: skipped) base addresses is off a 16-byte boundary: what
    decides whether TMA kernels take a call's operands and no key holds, so the GEMM families' keys
    add it. None where an argument is not a tensor with storage (such a call gets no plan)."""
    bits = 0
    try:
        for t in tensors:
            if t is not None:
                bits |= t.data_ptr()
    except (AttributeError, TypeError, RuntimeError):
        return None
    return bool(bits & 15)


def current_stream(index):
    """The raw cudaStream_t of device `index`'s current stream."""
    return _raw_stream(index) if _raw_stream is not None else B.current_stream(torch.device("cuda", index))


class CudaPlan:
    """One ahead-of-time (or JIT) launcher with its integer and float slots fixed. Calling it with
    the tensors of the launcher's pointer slots (None: an absent one) reads their addresses and the
    current stream of the plan's device and calls launcher(ptrs, ints, floats, device, stream), the
    one binder entry (cuda/common/binder.h); a JIT kernel's Kernel.launch takes the same five."""

    __slots__ = ("launcher", "ints", "floats", "device")

    def __init__(self, launcher, ints, floats, device):
        self.launcher = launcher
        self.ints = tuple(int(v) for v in ints)
        self.floats = tuple(float(v) for v in floats)
        self.device = device.index if device.index is not None else torch.cuda.current_device()

    def __call__(self, tensors):
        dev = self.device
        self.launcher(tensors, self.ints, self.floats, dev, current_stream(dev))


class TritonPlan:
    """A Triton launch with its host-side arguments fixed: plan(tensors) calls fn(*tensors, *args)
    under the device guard Triton needs (it launches on the current device's stream)."""

    __slots__ = ("fn", "args", "device")

    def __init__(self, fn, device, args=()):
        self.fn, self.args, self.device = fn, tuple(args), device

    def __call__(self, tensors):
        with torch.cuda.device(self.device):
            self.fn(*tensors, *self.args)


def NOOP(tensors):
    """The plan of a call with nothing to do (zero rows)."""


def compiling():
    return torch.compiler.is_compiling()


def capturing():
    """Whether the current CUDA stream is capturing a graph (False where CUDA is unavailable)."""
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:
        return False


# ---------------------------------------------------------------------------------------------
# Custom ops: what a torch.compile'd graph calls.

_LIBRARY = torch.library.Library("fray", "FRAGMENT")  # kept alive for the process: it owns the registrations


class CustomOp:
    """A registered fray:: op: calling it calls torch.ops.fray.<name>.default; register_fake(fn)
    gives its fake (meta) implementation for tracing."""

    __slots__ = ("qualname", "_overload")

    def __init__(self, qualname, overload):
        self.qualname, self._overload = qualname, overload

    def __call__(self, *args):
        return self._overload(*args)

    def register_fake(self, fake):
        torch.library.register_fake(self.qualname, fake, lib=_LIBRARY)
        return fake


def custom_op(qualname, mutates_args):
    """Registers fn as the op `qualname` ("fray::name"), its schema inferred from fn's type hints
    as torch.library.custom_op does, with one kernel for every device (CompositeExplicitAutograd).

    Not torch.library.custom_op itself: its dispatch runs Python kernels for the Autograd and
    ADInplaceOrView keys before the op's own (13.1 µs per call against 1.7 µs for a kernel
    registered this way, measured on a CPU no-op with torch 2.13), and a compiled graph calls
    the op on every step: at ~40 µs per call on the H200 machine's host, that alone made the
    torch.compile'd decoder step of bench/e2e slower than the eager one. Fray's ops return
    nothing (they write preallocated outputs) and define no gradient."""
    def register(fn):
        ns, name = qualname.split("::")
        _LIBRARY.define(name + torch.library.infer_schema(fn, mutates_args=mutates_args))
        _LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
        return CustomOp(qualname, getattr(getattr(torch.ops, ns), name).default)
    return register
