"""Shared machinery of the flat elementwise ops (the unary activations; mul and axpy): each reads
one or two dense tensors of one shape, dtype and layout and writes one of the same, element i of
the flat storage being the same logical element in all of them. Validation, the float64 reference
path (numpy arrays and CPU tensors), the launch plans and the torch.compile path are written once
here; a family module gives its op's name, inputs, scalars and kernels (FlatOp).

Layout: contiguous, or any dense permutation of a contiguous layout shared by every tensor (what
x.t() of a contiguous x gives). Anything else is refused (ValueError naming the argument) rather
than silently copied. out may be one of the inputs exactly (in place); a partial overlap is refused.
"""
import numpy as np
import torch

from fray import _plan as P
from fray import _validate as V
from fray import backend as B
from fray.reference import convert as C

_compiling = P.compiling


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def dense_layout(name, t, shared_with="a, b and out"):
    """The strides of t's non-trivial (size > 1) dims, after checking that t is dense: its elements
    fill numel consecutive slots of memory (a permutation of a contiguous layout). That holds iff
    every such stride is the product of the sizes of the dims with smaller strides and no two are
    equal. (Pairwise comparisons rather than a sort: torch.compile traces comparisons of symbolic
    sizes, not sorts of them.)"""
    dims = [(size, st) for size, st in zip(t.shape, t.stride()) if size > 1]
    for i, (_, st) in enumerate(dims):
        expected = 1
        for j, (size2, st2) in enumerate(dims):
            if j != i and st2 == st:
                expected = -1  # two dims on one stride: overlapping
                break
            if st2 < st:
                expected *= size2
        if st != expected:
            raise ValueError(
                "%s: expected a contiguous tensor (or a dense permutation of one, shared by %s); got "
                "shape %s with strides %s" % (name, shared_with, tuple(t.shape), t.stride()))
    return tuple(st for _, st in dims)


def overlaps_partially(x, y):
    """True when x and y share memory but are not the same elements. Both are dense (checked) and
    of one shape, dtype and layout, so each fills exactly [data_ptr, data_ptr + nbytes): comparing
    the two ranges decides it (two storages aliasing one allocation included), with no storage
    object built per call."""
    px, py = x.data_ptr(), y.data_ptr()
    if px == py:
        return False  # same start, and the layouts were checked equal: the same elements
    size = x.nbytes
    return px < py + size and py < px + size


class FlatOp:
    """One flat op. name: its plan keys; op: the public op whose backend preference applies (name
    by default); names: its inputs' argument names; reference(*f64 inputs, *scalars) -> f64 result;
    cuda(ext) -> the extension's launcher (slots: the inputs, out; ints n, *ints, dtype; floats:
    the scalars); triton(*tensors, n, *scalars) launches the Triton kernel; custom_op(*inputs, out,
    *scalars, backend) is the torch custom op that torch.compile'd graphs call (out never one of
    the inputs there)."""

    def __init__(self, name, family, names, reference, cuda, triton, custom_op=None, ints=(), op=None):
        self.name, self.family, self.names = name, family, tuple(names)
        self.op, self.ints = op or name, tuple(ints)
        self.reference, self.cuda, self.triton, self.custom_op = reference, cuda, triton, custom_op
        self.shared = ", ".join(self.names) + " and out"

    # -- validation ----------------------------------------------------------------------------

    def check_tensors(self, inputs, out):
        names = self.names
        for name, t in zip(names, inputs):
            V.require_tensor(name, t)
        V.require_tensor("out", out, allow_none=True)
        x = inputs[0]
        V.require_device_family(names[0], x)
        V.require_same_device(list(zip(names, inputs)) + [("out", out)])
        V.require_float_dtype(names[0], x)
        rest = list(zip(names[1:], inputs[1:])) + [("out", out)]
        for name, t in rest:
            if t is not None and t.dtype != x.dtype:
                raise TypeError("%s: expected dtype %s (that of %s), got %s" % (
                    name, _dtype_name(x.dtype), names[0], _dtype_name(t.dtype)))
        for name, t in rest:
            if t is not None and t.shape != x.shape:
                raise ValueError("%s: expected shape %s (that of %s; no broadcasting), got %s" % (
                    name, tuple(x.shape), names[0], tuple(t.shape)))
        if x.numel() == 0:
            return
        layout = dense_layout(names[0], x, self.shared)
        for name, t in rest:
            if t is not None and dense_layout(name, t, self.shared) != layout:
                raise ValueError("%s: expected the strides of %s %s (one shared layout), got %s" % (
                    name, names[0], x.stride(), t.stride()))
        if out is not None and not _compiling():
            self.check_out_overlap(inputs, out)

    def check_out_overlap(self, inputs, out):
        """What a plan cannot hold: whether out partially overlaps an input (their addresses)."""
        for name, t in zip(self.names, inputs):
            if overlaps_partially(out, t):
                raise ValueError("out: overlaps %s without being %s itself (in place needs out to be "
                                 "exactly %s)" % (name, name, " or ".join(self.names)))

    def check_arrays(self, inputs, out):
        names = self.names
        x = inputs[0]
        for name, a in list(zip(names, inputs)) + [("out", out)]:
            if a is None:
                continue
            if not isinstance(a, np.ndarray):
                raise TypeError("%s: expected a numpy.ndarray like %s, got %s" % (name, names[0], type(a).__name__))
            if a.dtype not in (np.float16, np.float32, np.float64):
                raise TypeError("%s: expected a float16/float32/float64 array, got %s" % (name, a.dtype))
        for name, a in list(zip(names[1:], inputs[1:])) + [("out", out)]:
            if a is not None and a.dtype != x.dtype:
                raise TypeError("%s: expected dtype %s (that of %s), got %s" % (name, x.dtype, names[0], a.dtype))
            if a is not None and a.shape != x.shape:
                raise ValueError("%s: expected shape %s (that of %s; no broadcasting), got %s" % (
                    name, x.shape, names[0], a.shape))

    # -- plans ---------------------------------------------------------------------------------

    def plan(self, x, scalars, backend):
        """The launch plan of one call, taking (*inputs, out)."""
        n = x.numel()
        if n == 0:
            return P.NOOP
        be = B.resolve(self.op, self.family, backend, x.device)
        if be == "cuda":
            return P.CudaPlan(self.cuda(B.load_extension(self.family)), (n,) + self.ints + (V.DTYPE_CODES[x.dtype],),
                              scalars, x.device)
        triton, extra = self.triton, (n,) + tuple(scalars)
        return P.TritonPlan(lambda *tensors: triton(*tensors, *extra), x.device)

    def launch(self, inputs, out, scalars, backend):
        """Used by the custom op (out is never an input there)."""
        tensors = tuple(inputs) + (out,)
        key = P.signature(self.name + ":op", backend, tensors, tuple(scalars))
        plan = P.PLANS.get(key) or P.PLANS.put(key, self.plan(inputs[0], scalars, backend))
        plan(tensors)

    # -- the call ------------------------------------------------------------------------------

    def _reference(self, inputs, scalars):
        x = inputs[0]
        return C.like(self.reference(*[C.to_f64(a) for a in inputs], *scalars), x).reshape(x.shape)

    def __call__(self, inputs, out, scalars, backend):
        """inputs: the tensors (or arrays) in self.names order; scalars: floats of the op (part of
        the plan key and the CUDA float slots)."""
        scalars = tuple(scalars)
        if not _compiling():
            key = P.signature(self.name, backend, tuple(inputs) + (out,), scalars)
            plan = P.PLANS.get(key)
            if plan is not None:
                x = inputs[0]
                if out is None:
                    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                elif not any(out is t for t in inputs):
                    self.check_out_overlap(inputs, out)
                plan(tuple(inputs) + (out,))
                return out
        V.require_backend(backend, B.BACKENDS)
        x = inputs[0]
        if V.is_array(x):
            self.check_arrays(inputs, out)
            y = self._reference(inputs, scalars)
            if out is not None:
                out[...] = y
                return out
            return y
        self.check_tensors(inputs, out)
        if x.device.type == "cpu":
            V.require_cpu_backend(backend, self.names[0])
            y = self._reference(inputs, scalars)
            if out is None:
                return y
            out.copy_(y)
            return out
        if out is None:
            out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        if _compiling():
            if any(out is t for t in inputs):
                # A custom op may not mutate one of its inputs through another argument.
                tmp = torch.empty_like(out)
                self.custom_op(*inputs, tmp, *scalars, backend)
                out.copy_(tmp)
            else:
                self.custom_op(*inputs, out, *scalars, backend)
        else:
            P.PLANS.put(key, self.plan(x, scalars, backend))(tuple(inputs) + (out,))
        return out
