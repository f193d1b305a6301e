"""Error census over every public op (fray.OPS): one valid call per op on CPU tensors (the float64
reference path runs the same validation as the GPU path), then the same call with one argument
broken at a time. A broken call must either raise TypeError / ValueError whose message names the
broken argument, or (for layouts an op is free to accept: strided views, zero-size dimensions)
succeed with the result the dense call gives. Never another exception type, never silence.

A new op without a VALID entry fails test_every_op_has_a_census_entry.
"""
import inspect

import pytest
import torch

import fray

bf16, f32, i32, i64 = torch.bfloat16, torch.float32, torch.int32, torch.int64


def _r(*shape, dtype=f32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype)


def _lens(*v):
    return torch.tensor(v, dtype=i32)


# op -> () -> (args, kwargs): a small valid call on CPU tensors. "op:form" entries add a form of
# an op whose arguments differ (prefill_attention over paged K/V): its cases run as the op's.
VALID = {
    "add_rmsnorm": lambda: ((_r(4, 64), _r(4, 64, seed=1), _r(64, seed=2)), {}),
    "apply_penalties": lambda: ((_r(3, 50), torch.tensor([1, 2, 3, 4, 5, 6], dtype=i32),
                                 torch.tensor([0, 2, 4, 6], dtype=i32)),
                                dict(repetition=1.1, presence=0.1, frequency=0.1)),
    "argmax": lambda: ((_r(3, 50),), {}),
    "axpy": lambda: ((_r(64), 0.5, 1.0), {}),
    "decode_attention": lambda: ((_r(2, 4, 64), _r(2, 2, 16, 64, seed=1), _r(2, 2, 16, 64, seed=2), _lens(10, 16)),
                                 {}),
    "decode_step": lambda: ((_r(3, 50), torch.tensor([1, 2, 3, 4, 5, 6], dtype=i32),
                             torch.tensor([0, 2, 4, 6], dtype=i32)),
                            dict(repetition=1.1, temperature=0.8, top_k=5, top_p=0.9,
                                 seeds=torch.arange(3, dtype=i64), offsets=torch.zeros(3, dtype=i64))),
    "dequantize": lambda: ((torch.randint(-127, 128, (4, 64), dtype=torch.int8), _r(4, 1).abs() + 0.1),
                           dict(granularity="token")),
    "gelu": lambda: ((_r(64),), {}),
    "gelu_mul": lambda: ((_r(4, 128),), {}),
    "gemm": lambda: ((_r(4, 64, dtype=bf16), _r(32, 64, dtype=bf16, seed=1)), {}),
    "kv_append": lambda: ((_r(2, 2, 16, 64), _r(2, 2, 16, 64, seed=1), _r(2, 2, 64, seed=2), _r(2, 2, 64, seed=3),
                           _lens(3, 7)), {}),
    "kv_append_paged": lambda: ((_r(8, 16, 2, 64), _r(8, 16, 2, 64, seed=1),
                                 torch.arange(8, dtype=i32).view(2, 4), _r(2, 2, 64, seed=2), _r(2, 2, 64, seed=3),
                                 _lens(3, 40)), {}),
    "layernorm": lambda: ((_r(4, 64), _r(64, seed=1), _r(64, seed=2)), {}),
    "fused_moe": lambda: ((_r(4, 32, dtype=bf16), _r(4, 48, 32, dtype=bf16, seed=1), _r(4, 32, 24, dtype=bf16, seed=2)),
                          dict(router_logits=_r(4, 4, seed=3), top_k=2)),
    "grouped_gemm": lambda: ((_r(10, 32, dtype=bf16), _r(3, 16, 32, dtype=bf16, seed=1),
                              torch.tensor([0, 4, 4, 10], dtype=i32)), {}),
    "mla_decode": lambda: ((_r(2, 2, 16, 576), _r(5, 16, 1, 576, seed=1), torch.tensor([[3, 0], [4, 1]], dtype=i32),
                            _lens(17, 1)), dict(head_dim_v=512, scale=0.05)),
    "moe_dispatch": lambda: ((torch.tensor([[0, 1], [2, 3], [1, 7], [4, 0]], dtype=i32), 8, 16), {}),
    "moe_route": lambda: ((_r(4, 8), 2), {}),
    "mul": lambda: ((_r(64), _r(64, seed=1)), {}),
    "online_softmax": lambda: ((_r(3, 50),), {}),
    "paged_decode_attention": lambda: ((_r(2, 4, 64), _r(8, 16, 2, 64, seed=1), _r(8, 16, 2, 64, seed=2),
                                        torch.arange(8, dtype=i32).view(2, 4), _lens(10, 50)), {}),
    "prefill_attention": lambda: ((_r(16, 4, 64), _r(16, 2, 64, seed=1), _r(16, 2, 64, seed=2)),
                                  dict(cu_seqlens_q=torch.tensor([0, 8, 16], dtype=i32),
                                       cu_seqlens_k=torch.tensor([0, 8, 16], dtype=i32),
                                       max_seqlen_q=8, max_seqlen_k=8)),
    "prefill_attention:paged": lambda: ((_r(16, 4, 64), _r(4, 16, 2, 64, seed=1), _r(4, 16, 2, 64, seed=2)),
                                        dict(cu_seqlens_q=torch.tensor([0, 8, 16], dtype=i32),
                                             cu_seqlens_k=torch.tensor([0, 8, 16], dtype=i32),
                                             block_table=torch.tensor([[2, 0], [1, 3]], dtype=i32),
                                             max_seqlen_q=8, max_seqlen_k=8)),
    "quantize": lambda: ((_r(4, 64, dtype=bf16),), dict(granularity="token")),
    "relu": lambda: ((_r(64),), {}),
    "scaled_gemm": lambda: ((torch.randint(-127, 128, (4, 64), dtype=torch.int8),
                             torch.randint(-127, 128, (32, 64), dtype=torch.int8), _r(4, 1).abs() + 0.1,
                             _r(32, 1, seed=1).abs() + 0.1), {}),
    "routed_grouped_gemm": lambda: ((_r(4, 32, dtype=bf16), _r(4, 16, 32, dtype=bf16, seed=1), _r(4, 4, seed=2), 2),
                                    {}),
    "rmsnorm": lambda: ((_r(4, 64), _r(64, seed=1)), {}),
    "rmsnorm_quant": lambda: ((_r(4, 64, dtype=bf16), _r(64, dtype=bf16, seed=1)),
                              dict(residual=_r(4, 64, dtype=bf16, seed=2))),
    "rope": lambda: ((_r(4, 4, 64), _r(4, 2, 64, seed=1), torch.arange(4, dtype=i64)), dict(max_position=64)),
    "sample": lambda: ((_r(3, 50),), dict(temperature=0.8, top_p=0.9, seeds=torch.arange(3, dtype=i64),
                                          offsets=torch.zeros(3, dtype=i64))),
    "sigmoid": lambda: ((_r(64),), {}),
    "silu": lambda: ((_r(64),), {}),
    "silu_mul": lambda: ((_r(4, 128),), {}),
    "silu_mul_quant": lambda: ((_r(4, 128, dtype=bf16),), {}),
    "softmax": lambda: ((_r(3, 50),), {}),
    "tanh": lambda: ((_r(64),), {}),
    "topk": lambda: ((_r(3, 50), 5), {}),
    "vector_add": lambda: ((_r(64), _r(64, seed=1)), {}),
    "w8a16_gemm": lambda: ((_r(4, 64, dtype=bf16), torch.randint(-127, 128, (32, 64), dtype=torch.int8),
                            _r(32, seed=1).abs() + 0.1), {}),
}


def _fn(op):
    """The public function of a VALID key (an op, or "op:form")."""
    return getattr(fray, op.partition(":")[0])


def _bound(op):
    args, kwargs = VALID[op]()
    sig = inspect.signature(_fn(op))
    b = sig.bind(*args, **kwargs)
    return sig, dict(b.arguments)


def _call(op, sig, arguments):
    b = sig.bind_partial()
    b.arguments.update(arguments)
    return _fn(op)(*b.args, **b.kwargs)


def _tensor_params(op):
    _, arguments = _bound(op)
    return [(op, name) for name, v in arguments.items() if isinstance(v, torch.Tensor)]


def _scalar_params(op):
    _, arguments = _bound(op)
    return [(op, name) for name, v in arguments.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _outputs(result):
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _outputs(r)]
    if hasattr(result, "__dict__") or hasattr(result, "_fields"):  # named results (moe_dispatch)
        return [t for t in (getattr(result, f) for f in getattr(result, "_fields", vars(result)))
                if isinstance(t, torch.Tensor)]
    return []


def _refused(op, name, call):
    """The call raises TypeError / ValueError whose message names `name`."""
    with pytest.raises((TypeError, ValueError)) as e:
        call()
    assert name in str(e.value), "%s: the error for a broken %r does not name it: %s" % (op, name, e.value)


ALL_TENSORS = [p for op in sorted(VALID) for p in _tensor_params(op)]
ALL_SCALARS = [p for op in sorted(VALID) for p in _scalar_params(op)]


def test_every_op_has_a_census_entry():
    ops = {op.partition(":")[0] for op in VALID}
    assert ops == set(fray.OPS), "census entries missing for %s / stale for %s" % (
        sorted(set(fray.OPS) - ops), sorted(ops - set(fray.OPS)))


@pytest.mark.parametrize("op", sorted(VALID))
def test_valid_call_runs(op):
    sig, arguments = _bound(op)
    _call(op, sig, arguments)


@pytest.mark.parametrize("op,name", ALL_TENSORS)
def test_wrong_dtype_is_refused_naming_the_argument(op, name):
    sig, arguments = _bound(op)
    t = arguments[name]
    # a float tensor becomes int32, an integer one fp32: no op documents either as accepted
    arguments[name] = t.to(i32) if t.dtype.is_floating_point else t.to(f32)
    _refused(op, name, lambda: _call(op, sig, arguments))


@pytest.mark.parametrize("op,name", ALL_TENSORS)
def test_bool_tensor_is_refused_naming_the_argument(op, name):
    sig, arguments = _bound(op)
    arguments[name] = arguments[name] != 0
    _refused(op, name, lambda: _call(op, sig, arguments))


@pytest.mark.parametrize("op,name", ALL_TENSORS)
def test_a_list_where_a_tensor_goes_is_refused_naming_the_argument(op, name):
    sig, arguments = _bound(op)
    arguments[name] = arguments[name].tolist()
    _refused(op, name, lambda: _call(op, sig, arguments))


@pytest.mark.parametrize("op,name", ALL_TENSORS)
def test_mixed_devices_are_refused_naming_an_argument(op, name):
    # One argument on the meta device, the rest on CPU: refused, naming the argument; when the
    # first tensor moves, the others are the ones on the "wrong" device, so any tensor argument's
    # name will do there.
    sig, arguments = _bound(op)
    names = [n for n, v in arguments.items() if isinstance(v, torch.Tensor)]
    arguments[name] = arguments[name].to("meta")
    with pytest.raises((TypeError, ValueError)) as e:
        _call(op, sig, arguments)
    assert any(n in str(e.value) for n in names), "%s: %s" % (op, e.value)


@pytest.mark.parametrize("op,name", ALL_TENSORS)
def test_an_extra_leading_dim_is_refused_or_computed(op, name):
    """unsqueeze(0) of one argument: ops that take any leading dims may accept it (then the result
    is checked against the dense call by the strided test); otherwise a clear error."""
    sig, arguments = _bound(op)
    arguments[name] = arguments[name].unsqueeze(0)
    try:
        _call(op, sig, arguments)
    except (TypeError, ValueError) as e:
        names = [n for n, v in arguments.items() if isinstance(v, torch.Tensor)]
        assert any(n in str(e) for n in names), "%s: %s" % (op, e)


@pytest.mark.parametrize("op,name", ALL_TENSORS)
def test_a_strided_view_is_refused_or_gives_the_dense_result(op, name):
    sig, arguments = _bound(op)
    t = arguments[name]
    if t.dim() == 0 or t.shape[-1] < 2:
        pytest.skip("no last dim to stride")
    # the same values as a view with a doubled last-dim stride (the in-place ops write into it)
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    view = wide[..., ::2]
    dense_args = dict(arguments)
    dense_args[name] = t.clone()
    expected = _outputs(_call(op, sig, dense_args))
    arguments[name] = view
    try:
        got = _outputs(_call(op, sig, arguments))
    except (TypeError, ValueError) as e:
        assert name in str(e), "%s: the error for a strided %r does not name it: %s" % (op, name, e)
        return
    assert len(got) == len(expected)
    for g, x in zip(got, expected):
        assert g.shape == x.shape and g.dtype == x.dtype
        assert torch.equal(g.float().nan_to_num(), x.float().nan_to_num()), "%s: strided %r changed a result" % (
            op, name)


@pytest.mark.parametrize("op,name", ALL_SCALARS)
def test_a_string_where_a_number_goes_is_refused_naming_the_argument(op, name):
    sig, arguments = _bound(op)
    arguments[name] = "1"
    _refused(op, name, lambda: _call(op, sig, arguments))


@pytest.mark.parametrize("op,name", ALL_SCALARS)
def test_nan_where_a_number_goes_is_refused_or_documented(op, name):
    """NaN for a numeric argument: a clear error naming it, or accepted (then the result exists)."""
    sig, arguments = _bound(op)
    v = arguments[name]
    arguments[name] = float("nan") if isinstance(v, float) else 2 ** 70
    try:
        _call(op, sig, arguments)
    except (TypeError, ValueError, OverflowError) as e:
        assert name in str(e), "%s: the error for %s=%r does not name it: %s" % (op, name, arguments[name], e)


@pytest.mark.parametrize("op,name", ALL_TENSORS)
def test_a_zero_size_dim_is_refused_or_computed(op, name):
    """One argument with its leading dim emptied: a clear error naming an argument, or a result."""
    sig, arguments = _bound(op)
    t = arguments[name]
    if t.dim() == 0:
        pytest.skip("0-d")
    arguments[name] = t[:0]
    try:
        _call(op, sig, arguments)
    except (TypeError, ValueError) as e:
        names = [n for n, v in arguments.items() if isinstance(v, torch.Tensor)]
        assert any(n in str(e) for n in names), "%s: %s" % (op, e)


OUT_OPS = sorted(op for op in VALID if "out" in inspect.signature(_fn(op)).parameters)


@pytest.mark.parametrize("op", OUT_OPS)
def test_an_expanded_out_is_refused(op):
    """out= of the right shape and dtype whose rows all alias one row (expand()): every element
    would be written by several threads; refused, naming out."""
    sig, arguments = _bound(op)
    y = _outputs(_call(op, sig, dict(arguments)))[0]
    if y.dim() == 0 or y.shape[0] < 2:
        pytest.skip("no dim to alias")
    arguments["out"] = torch.empty(y.shape[1:], dtype=y.dtype).expand(y.shape)
    _refused(op, "out", lambda: _call(op, sig, arguments))


# ---------------------------------------------------------------------------------------------
# Determinism: every op's valid call, on the GPU, twice on the same inputs for every backend it
# has there: the same bits, outputs and in-place arguments alike. Ops that add floats in a free
# order by design are named here with the option that makes them deterministic (the README's
# determinism paragraph lists the same ones); a new op joins by its VALID entry alone.
DETERMINISTIC_OPTION = {
    "fused_moe": dict(combine="staged"),            # "atomic" (auto at top_k <= 4) and "scatter" are not
    "routed_grouped_gemm": dict(combine="staged"),
}


def test_the_ops_with_a_deterministic_option_take_it():
    for op, option in DETERMINISTIC_OPTION.items():
        assert op in VALID, "%s is not a public op" % op
        assert set(option) <= set(inspect.signature(getattr(fray, op)).parameters), (op, option)


def _on(v, device):
    return v.to(device) if isinstance(v, torch.Tensor) else v


def _bits(t):
    """A tensor's bytes (NaN payloads and signed zeros included), on the host."""
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).cpu() if t.numel() else t.cpu()


# Ops whose CUDA kernels take bf16 / fp16 only (fp32 runs on Triton, and backend="cuda" refuses it):
# the GPU passes give them their valid call's floating tensors in bf16.
CUDA_HALF_ONLY = ("prefill_attention", "mla_decode")


def _gpu_call(op, backend, device):
    """(sig, arguments) of op's valid call on `device` with `backend` (skipped where op has no such
    kernel there), its deterministic option taken."""
    from fray import backend as B
    reason = B.available(op, fray.CUDA_FAMILY[op.partition(":")[0]], device).get(backend)
    if reason is not None:
        pytest.skip("%s has no %s kernel here: %s" % (op, backend, reason))
    sig, arguments = _bound(op)
    arguments = {k: _on(v, device) for k, v in arguments.items()}
    if backend == "cuda" and op.partition(":")[0] in CUDA_HALF_ONLY:  # its fp32 inputs in bf16
        arguments = {k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.dtype == torch.float32 else v
                     for k, v in arguments.items()}
    arguments.update(DETERMINISTIC_OPTION.get(op.partition(":")[0], {}))
    if "backend" in sig.parameters:
        arguments["backend"] = backend
    return sig, arguments


def _fresh(arguments):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in arguments.items()}


def _state(result, arguments):
    """The bits of a call's outputs and of its tensor arguments after it (in-place ops)."""
    return ([_bits(t) for t in _outputs(result)]
            + [_bits(v) for v in arguments.values() if isinstance(v, torch.Tensor)])


def _same(op, backend, what, want, got):
    assert len(want) == len(got), "%s (%s, %s): %d tensors against %d" % (op, backend, what, len(want), len(got))
    for i, (a, b) in enumerate(zip(want, got)):
        assert torch.equal(a, b), "%s (%s): tensor %d differs %s" % (op, backend, i, what)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("op", sorted(VALID))
def test_gpu_every_op_is_bitwise_repeatable(cuda, op, backend):
    sig, arguments = _gpu_call(op, backend, cuda)
    runs = []
    for _ in range(2):
        fresh = _fresh(arguments)
        result = _call(op, sig, fresh)
        torch.cuda.synchronize(cuda)
        runs.append(_state(result, fresh))
    _same(op, backend, "between two calls on the same inputs", *runs)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("op", sorted(VALID))
def test_gpu_every_op_on_side_streams_and_in_a_graph(cuda, op, backend):
    """Each op's call on two side streams at once, and captured in a CUDA graph (on the side stream
    torch.cuda.graph captures on) then replayed over restored inputs: the bits of the call on the
    current stream."""
    sig, arguments = _gpu_call(op, backend, cuda)
    fresh = _fresh(arguments)
    want = _state(_call(op, sig, fresh), fresh)
    streams = [torch.cuda.Stream(cuda), torch.cuda.Stream(cuda)]
    inputs = [_fresh(arguments) for _ in streams]
    torch.cuda.synchronize(cuda)
    results = []
    for s, a in zip(streams, inputs):
        s.wait_stream(torch.cuda.current_stream(cuda))
        with torch.cuda.stream(s):
            results.append(_call(op, sig, a))
    torch.cuda.synchronize(cuda)
    for i, (r, a) in enumerate(zip(results, inputs)):
        _same(op, backend, "on side stream %d" % i, want, _state(r, a))
    static = _fresh(arguments)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _call(op, sig, static)
    for k, v in arguments.items():  # the capture ran nothing: restore anyway, as a caller would
        if isinstance(v, torch.Tensor):
            static[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize(cuda)
    _same(op, backend, "replayed from a CUDA graph", want, _state(captured, static))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("op", sorted(VALID))
def test_gpu_every_op_on_a_non_current_device(cuda, op, backend):
    """Each op's valid call with every tensor on the last GPU while another one is current: it
    runs there (its launches, allocations and workspaces on the tensors' device, whatever the
    current device) and gives the bits of the same call made with that device current. Needs two
    GPUs (skipped on one)."""
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("needs two GPUs (torch sees %d)" % n)
    dev = torch.device("cuda", n - 1)
    sig, arguments = _gpu_call(op, backend, dev)
    with torch.cuda.device(dev):
        fresh = _fresh(arguments)
        want = _state(_call(op, sig, fresh), fresh)
        torch.cuda.synchronize(dev)
    with torch.cuda.device(0):
        fresh = _fresh(arguments)
        result = _call(op, sig, fresh)
        assert torch.cuda.current_device() == 0, "%s (%s) changed the current device" % (op, backend)
        torch.cuda.synchronize(dev)
    got = _state(result, fresh)
    assert all(t.device == dev for t in _outputs(result)), "%s (%s): an output off %s" % (op, backend, dev)
    _same(op, backend, "on %s while cuda:0 is current" % dev, want, got)
