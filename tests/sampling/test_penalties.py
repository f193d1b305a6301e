"""fray.apply_penalties and fray.decode_step: a 5-token hand example, Triton (interpreter) vs
reference with ragged histories, the composition, errors; GPU, for the cuda and triton backends:
agreement over dtypes, index dtypes and history lengths (both CUDA counting paths), strided rows,
decode_step vs the reference at the benchmark's shape, graph replay with bumped offsets,
torch.compile, and decode_step as exactly two kernel launches."""
import os

import numpy as np
import pytest
import torch

import fray
from fray.reference import sampling as ref
from fray.testing import assert_close

INTERP = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _hand():
    logits = torch.tensor([[2.0, -1.0, 0.5, -0.5, 3.0], [2.0, -1.0, 0.5, -0.5, 3.0]])
    ids = torch.tensor([0, 1, 1, 3, 0, 0])
    offs = torch.tensor([0, 6, 6])  # row 1 has an empty history
    return logits, ids, offs


def test_five_token_example_by_hand():
    # rep 2, presence 0.5, frequency 0.25; id 0 seen 3x, id 1 2x, id 3 once:
    # 0: 2 / 2 - 0.5 - 0.75 = -0.25;  1: -1 * 2 - 0.5 - 0.5 = -3;  3: -0.5 * 2 - 0.5 - 0.25 = -1.75
    logits, ids, offs = _hand()
    out = fray.apply_penalties(logits, ids, offs, repetition=2.0, presence=0.5, frequency=0.25)
    assert out is logits
    assert logits.tolist() == [[-0.25, -3.0, 0.5, -1.75, 3.0], [2.0, -1.0, 0.5, -0.5, 3.0]]


@INTERP
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_interpreter_hand_and_ragged(dtype):
    from fray_triton import sampling as ts
    logits, ids, offs = _hand()
    logits = logits.to(dtype)
    ones = torch.ones(2)
    ts.apply_penalties(logits, ids, offs, 2 * ones, 0.5 * ones, 0.25 * ones, 5, 2, 5)
    assert logits.float().tolist() == [[-0.25, -3.0, 0.5, -1.75, 3.0], [2.0, -1.0, 0.5, -0.5, 3.0]]
    # ragged histories longer than one 64-entry tile, int32 ids, per-row parameters
    g = torch.Generator().manual_seed(2)
    rows, vocab = 4, 90
    x = torch.randn(rows, vocab, generator=g).to(dtype)
    lens = torch.tensor([0, 150, 3, 70])
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    ids = torch.randint(0, vocab, (int(lens.sum()),), generator=g).to(torch.int32)
    rep, pres, freq = torch.tensor([1.0, 1.3, 0.7, 2.0]), torch.tensor([0.0, 0.5, -0.2, 1.0]), \
        torch.tensor([0.0, 0.1, 0.3, 0.0])
    expect = ref.apply_penalties(x.double().numpy(), ids.numpy(), offs.numpy(), rep.double().numpy(),
                                 pres.double().numpy(), freq.double().numpy())
    ts.apply_penalties(x, ids, offs, rep, pres, freq, vocab, rows, vocab)
    assert_close(x, expect, dtype, "penalties")


@INTERP
def test_triton_interpreter_decode_step_composition():
    from fray_triton import sampling as ts
    g = torch.Generator().manual_seed(4)
    rows, vocab = 3, 200
    x = torch.randn(rows, vocab, generator=g) * 2
    ids = torch.randint(0, vocab, (30,), generator=g)
    offs = torch.tensor([0, 10, 10, 30])
    kw = dict(repetition=1.2, presence=0.3, frequency=0.1, temperature=torch.tensor([0.0, 0.9, 1.1]),
              top_k=20, top_p=0.9, min_p=0.01, seeds=torch.tensor([5, 6, 7]), offsets=torch.tensor([1, 2, 3]))
    expect = fray.decode_step(x.clone(), ids, offs, **kw)  # CPU: the reference
    full = lambda v: torch.full((rows,), v)  # noqa: E731
    xt = x.clone()
    ts.apply_penalties(xt, ids, offs, full(1.2), full(0.3), full(0.1), vocab, rows, vocab)
    tok, lp = torch.empty(rows, dtype=torch.int64), torch.empty(rows)
    ts.sample(xt, tok, lp, kw["temperature"], full(20).long(), full(0.9), full(0.01), kw["seeds"], kw["offsets"],
              vocab, rows, vocab)
    assert torch.equal(tok, expect)


def test_decode_step_is_penalties_then_sample_on_cpu():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 64, generator=g)
    ids, offs = torch.tensor([3, 3, 10, 63]), torch.tensor([0, 3, 4])
    kw = dict(temperature=0.8, top_k=8, top_p=0.95, min_p=0.0, seeds=torch.tensor([1, 2]), offsets=5)
    a = x.clone()
    tok = fray.decode_step(a, ids, offs, repetition=1.5, presence=0.2, frequency=0.1, **kw)
    b = fray.apply_penalties(x.clone(), ids, offs, repetition=1.5, presence=0.2, frequency=0.1)
    assert torch.equal(a, b)
    assert torch.equal(tok, fray.sample(b, **kw))


def test_errors_name_the_argument():
    logits, ids, offs = _hand()
    with pytest.raises(ValueError, match="token_offsets:"):
        fray.apply_penalties(logits, ids, torch.tensor([0, 6]))
    with pytest.raises(ValueError, match="token_offsets:"):
        fray.apply_penalties(logits, ids, torch.tensor([0, 7, 6]))
    with pytest.raises(ValueError, match="token_ids:"):
        fray.apply_penalties(logits, torch.tensor([0, 5]), torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="token_ids:"):
        fray.apply_penalties(logits, ids.float(), offs)
    with pytest.raises(ValueError, match="repetition:"):
        fray.apply_penalties(logits, ids, offs, repetition=0.0)
    with pytest.raises(ValueError, match="logits:"):
        fray.apply_penalties(logits[0], ids, offs)
    before = logits.clone()
    with pytest.raises(ValueError, match="top_p:"):
        fray.decode_step(logits, ids, offs, repetition=2.0, temperature=1.0, top_p=2.0, seeds=0, offsets=0)
    assert torch.equal(logits, before)  # validated before anything is written


def test_in_place_logits_may_not_overlap():
    # Penalties write logits: expand()ed (stride-0) rows are refused before anything is written,
    # on every device; sample (read-only) takes them (test_sample.py).
    logits, ids, offs = _hand()
    row = logits[:1].clone()
    x = row.expand(logits.shape[0], logits.shape[1])
    with pytest.raises(ValueError, match="logits:.*overlap"):
        fray.apply_penalties(x, ids, offs, repetition=2.0)
    with pytest.raises(ValueError, match="logits:.*overlap"):
        fray.decode_step(x, ids, offs, repetition=2.0, temperature=1.0, seeds=0, offsets=0)
    assert torch.equal(row, logits[:1])
    # Strided but non-overlapping rows (a column slice; a transposed view) are fine.
    wide = torch.cat([logits, logits], dim=1)
    y = fray.apply_penalties(wide[:, 1:1 + logits.shape[1]], ids, offs, repetition=2.0)
    assert y.shape == logits.shape
    fray.apply_penalties(logits.t().contiguous().t(), ids, offs, repetition=2.0)



def test_penalty_kernel_rounds_each_step_on_sm90a():
    """The Triton penalty kernel compiled for sm_90a as it is launched: no product contracted into
    an FMA (the documented rule rounds l * rep, the presence and n * frequency steps apart; with
    Triton's default fusion the PTX held one fma.rn.f32 and the GPU results were an ulp off) and
    an IEEE division (div.rn, not div.full)."""
    from fray.testing import compile_triton_sm90, sm90_spec
    from fray_triton import sampling as ts
    opts = dict(ts.PENALTY_OPTIONS)
    warps = opts.pop("num_warps")
    specs = [sm90_spec("fray_triton.sampling", "_penalty_kernel",
                       {"X": x, "IDS": i, "OFFS": i, "REP": "*fp32", "PRES": "*fp32", "FREQ": "*fp32", "stride_x": "i64"},
                       dict(BLOCK_H=ts.PENALTY_BLOCK), num_warps=warps, options=opts,
                       count=("fma.rn.f32", "div.rn.f32", "div.full.f32"))
             for x in ("*fp32", "*bf16") for i in ("*i32", "*i64")]
    for spec, r in zip(specs, compile_triton_sm90(specs)):
        c = r["ptx_counts"]
        assert c["fma.rn.f32"] == 0 and c["div.full.f32"] == 0 and c["div.rn.f32"] >= 1, (spec["types"], c)

# ---------------------------------------------------------------------------------------------
# GPU (H200): every backend against the reference

BACKENDS = ["cuda", "triton"]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_gpu_penalties_vs_reference(cuda, backend, dtype, index_dtype):
    # Histories: empty, 1, hash-table sizes (500, 64, 65, 2000, 2048) and past it (2049, 6000: the
    # CUDA kernel's id-range passes), ids concentrated on 300 values (many repeats) or spread.
    g = torch.Generator().manual_seed(1)
    rows, vocab = 9, 32000
    x = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
    lens = torch.tensor([0, 1, 500, 64, 65, 2000, 2048, 2049, 6000])
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    ids = torch.randint(0, 300, (int(lens.sum()),), generator=g)
    ids[offs[8]:] = torch.randint(0, vocab, (6000,), generator=g)
    rep, pres, freq = np.linspace(0.8, 1.6, rows), np.linspace(-0.5, 0.5, rows), np.full(rows, 0.05)
    expect = ref.apply_penalties(x.double().numpy(), ids.numpy(), offs.numpy(), rep, pres, freq)
    xc = x.to(cuda)
    out = fray.apply_penalties(xc, ids.to(index_dtype).to(cuda), offs.to(index_dtype).to(cuda),
                               repetition=torch.tensor(rep, device=cuda), presence=torch.tensor(pres, device=cuda),
                               frequency=0.05, backend=backend)
    assert out is xc
    assert_close(xc, expect, dtype, "%s penalties" % backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_penalties_strided_rows_and_scalars(cuda, backend):
    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 5003, generator=g)
    ids = torch.randint(0, 5000, (40,), generator=g)
    offs = torch.tensor([0, 10, 10, 25, 40])
    expect = ref.apply_penalties(base[:, 1:5001].double().numpy(), ids.numpy(), offs.numpy(), np.full(4, 1.3),
                                 np.full(4, 0.4), np.full(4, 0.1))
    xc = base.to(cuda)
    fray.apply_penalties(xc[:, 1:5001], ids.to(cuda), offs.to(cuda), repetition=1.3, presence=0.4, frequency=0.1,
                         backend=backend)
    assert_close(xc[:, 1:5001], expect, torch.float32, "%s strided" % backend)
    assert torch.equal(xc[:, 0].cpu(), base[:, 0]) and torch.equal(xc[:, 5001:].cpu(), base[:, 5001:])



def _fp32_rule(l, rep, pres, count, freq):
    """The documented rule step by step in fp32 (numpy rounds every operation: no FMA)."""
    f = np.float32
    l = f(l) / f(rep) if l > 0 else f(l) * f(rep)
    return f(f(l) - f(pres)) - f(f(count) * f(freq))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_penalties_round_each_step_bit_for_bit(cuda, backend):
    # fp32 cases where a product contracted into an FMA (l * rep - presence, or (..) - n * frequency)
    # rounds differently from the rule's separate steps (found by the GPU property profile at
    # 9c88994: one ulp off in both backends); the kernels must give the rule's bits.
    rng = np.random.default_rng(7)
    f = np.float32
    rows = []
    while len(rows) < 64:
        l, rep, pres, freq = f(rng.normal() * 3), f(rng.uniform(0.5, 2)), f(rng.uniform(-1, 1)), f(rng.uniform(0, 1))
        count = int(rng.integers(1, 6))
        p = f(l) / rep if l > 0 else f(l) * rep
        fused = f(np.float64(f(p - pres)) - np.float64(count) * np.float64(freq))  # one rounding: an FMA
        if l < 0:
            fused_rep = f(np.float64(l) * np.float64(rep) - np.float64(pres))
            if fused_rep != f(f(l * rep) - pres):
                rows.append((l, rep, pres, count, freq))
                continue
        if fused != _fp32_rule(l, rep, pres, count, freq):
            rows.append((l, rep, pres, count, freq))
    n = len(rows)
    x = torch.tensor([[r[0], 0.5] for r in rows], dtype=torch.float32)
    ids = torch.tensor([i for r in rows for i in [0] * r[3]], dtype=torch.int32)
    offs = torch.tensor(np.concatenate([[0], np.cumsum([r[3] for r in rows])]), dtype=torch.int32)
    par = [torch.tensor([r[k] for r in rows], dtype=torch.float32, device=cuda) for k in (1, 2, 4)]
    xc = x.to(cuda)
    fray.apply_penalties(xc, ids.to(cuda), offs.to(cuda), repetition=par[0], presence=par[1], frequency=par[2],
                         backend=backend)
    want = torch.tensor([_fp32_rule(*r) for r in rows], dtype=torch.float32)
    got = xc[:, 0].cpu()
    bad = (got.view(torch.int32) != want.view(torch.int32)).nonzero().flatten().tolist()
    assert not bad, "%s: %d of %d rows differ from the fp32 rule, first %r: %r vs %r" % (
        backend, len(bad), n, rows[bad[0]], float(got[bad[0]]), float(want[bad[0]]))
    assert torch.equal(xc[:, 1].cpu(), x[:, 1])

def _decode_case(rows, vocab, hist, g, cuda):
    base = torch.randn(rows, vocab, generator=g).to(cuda)
    ids = torch.randint(0, vocab, (rows * hist,), generator=g).to(cuda)
    offs = (torch.arange(rows + 1) * hist).to(cuda)
    return base, ids, offs


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_decode_step_vs_reference(cuda, backend, dtype):
    # The benchmark's configuration: 256-token histories, top-k 50, top-p 0.9 (plus a greedy row).
    g = torch.Generator().manual_seed(7)
    rows, vocab = 8, 152064
    base, ids, offs = _decode_case(rows, vocab, 256, g, cuda)
    base = (base * 3).to(dtype)
    temp = torch.tensor([0.8] * (rows - 1) + [0.0], device=cuda)
    seeds = torch.arange(rows, device=cuda) * 101
    kw = dict(repetition=1.1, presence=0.5, frequency=0.3, temperature=temp, top_k=50, top_p=0.9, min_p=0.0,
              seeds=seeds, offsets=5)
    x = base.clone()
    tok, lp = fray.decode_step(x, ids, offs, return_logprobs=True, backend=backend, **kw)
    xr = base.cpu().clone()
    etok, elp = fray.decode_step(xr, ids.cpu(), offs.cpu(), return_logprobs=True,
                                 **dict(kw, temperature=temp.cpu(), seeds=seeds.cpu()))
    assert_close(x, xr.double(), dtype, "%s decode_step penalties" % backend)
    assert torch.equal(tok.cpu(), etok)
    np.testing.assert_allclose(lp.cpu().numpy(), elp.numpy(), rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_decode_step_graph_replay_and_compile(cuda, backend):
    g = torch.Generator().manual_seed(2)
    rows, vocab = 4, 32000
    base, ids, offs = _decode_case(rows, vocab, 10, g, cuda)
    x = base.clone()
    seeds = torch.arange(rows, device=cuda)
    counter = torch.zeros(rows, dtype=torch.int64, device=cuda)
    kw = dict(repetition=1.1, presence=0.2, frequency=0.1, temperature=0.9, top_k=40, top_p=0.9, min_p=0.0,
              seeds=seeds, offsets=counter, backend=backend)
    fray.decode_step(x, ids, offs, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tok = fray.decode_step(x, ids, offs, **kw)
    for step in range(3):
        x.copy_(base)
        counter += 1
        graph.replay()
        cpu_kw = dict(kw, seeds=seeds.cpu(), offsets=counter.cpu(), backend="auto")
        expect = fray.decode_step(base.cpu().clone(), ids.cpu(), offs.cpu(), **cpu_kw)
        assert torch.equal(tok.cpu(), expect), step
    f = torch.compile(lambda t: fray.decode_step(t, ids, offs, **kw), fullgraph=True)
    a, b = base.clone(), base.clone()
    assert torch.equal(f(a), fray.decode_step(b, ids, offs, **kw))
    assert torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_decode_step_is_two_kernel_launches(cuda):
    # Python-scalar parameters go to the CUDA kernels by value: penalties + sampling, nothing else.
    from torch.profiler import ProfilerActivity, profile
    g = torch.Generator().manual_seed(9)
    x, ids, offs = _decode_case(64, 152064, 256, g, cuda)
    kw = dict(repetition=1.1, presence=0.5, frequency=0.3, temperature=0.8, top_k=50, top_p=0.9,
              seeds=torch.arange(64, device=cuda), offsets=torch.zeros(64, dtype=torch.int64, device=cuda),
              backend="cuda")
    fray.decode_step(x, ids, offs, **kw)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fray.decode_step(x, ids, offs, **kw)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    if not kernels:
        pytest.skip("the profiler recorded no CUDA kernels (CUPTI unavailable)")
    assert len(kernels) == 2, kernels
    assert any("penalty" in k for k in kernels) and any("sample" in k for k in kernels), kernels


def test_numpy_in_numpy_out():
    """numpy arrays take the CPU path like every op: penalties in place on the array itself, the
    samplers' outputs as numpy arrays equal to the tensor path's; a read-only array is refused."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 50)).astype(np.float32)
    ids = np.array([1, 2, 2, 40, 7], dtype=np.int64)
    offs = np.array([0, 2, 4, 5], dtype=np.int64)
    t = torch.from_numpy(x.copy())
    fray.apply_penalties(t, torch.from_numpy(ids), torch.from_numpy(offs), repetition=1.3, presence=0.2)
    a = x.copy()
    assert fray.apply_penalties(a, ids, offs, repetition=1.3, presence=0.2) is a
    np.testing.assert_array_equal(a, t.numpy())
    tok, lp = fray.sample(a, temperature=0.7, top_p=0.9, seeds=np.array([1, 2, 3]), offsets=0, return_logprobs=True)
    etok, elp = fray.sample(t, temperature=0.7, top_p=0.9, seeds=torch.tensor([1, 2, 3]), offsets=0,
                            return_logprobs=True)
    assert isinstance(tok, np.ndarray) and tok.dtype == np.int64 and lp.dtype == np.float32
    np.testing.assert_array_equal(tok, etok.numpy())
    np.testing.assert_array_equal(lp, elp.numpy())
    b = x.copy()
    dtok = fray.decode_step(b, ids, offs, repetition=1.3, presence=0.2, temperature=0.7, top_p=0.9,
                            seeds=np.array([1, 2, 3]), offsets=0)
    np.testing.assert_array_equal(b, t.numpy())
    np.testing.assert_array_equal(dtok, etok.numpy())
    ro = x.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fray.apply_penalties(ro, ids, offs, repetition=1.3)
    fray.sample(ro, temperature=0.7, seeds=1, offsets=0)  # reading a read-only array is fine


def test_history_values_checked_and_refused_during_capture(monkeypatch):
    """The history check FRAY_CHECK_INDICES=1 runs on CUDA tensors (here on CPU tensors, which it
    reads the same way), its messages, and its refusal while a stream captures."""
    from fray.ops import sampling as S
    ids, offs = torch.tensor([1, 5, 9]), torch.tensor([0, 2, 3])
    S._history_values(10, ids, offs)
    with pytest.raises(ValueError, match=r"token_ids: expected ids in \[0, 9\), got values in \[1, 9\]"):
        S._history_values(9, ids, offs)
    with pytest.raises(ValueError, match=r"token_ids: expected ids in \[0, 10\), got values in \[-1, 9\]"):
        S._history_values(10, torch.tensor([-1, 5, 9]), offs)
    with pytest.raises(ValueError, match="token_offsets: expected non-decreasing offsets from 0 to at most 3"):
        S._history_values(10, ids, torch.tensor([0, 3, 2]))
    with pytest.raises(ValueError, match="token_offsets: expected non-decreasing offsets from 0 to at most 3"):
        S._history_values(10, ids, torch.tensor([0, 2, 4]))
    logits = torch.zeros(2, 10)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    S._device_history_check(logits, ids, offs)  # FRAY_CHECK_INDICES unset: nothing is read
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    with pytest.raises(RuntimeError, match="FRAY_CHECK_INDICES=1 checks token_ids / token_offsets .* CUDA-graph "
                                           "capture"):
        S._device_history_check(logits, ids, offs)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["apply_penalties", "decode_step"])
def test_gpu_check_indices(cuda, op, monkeypatch):
    logits = torch.randn(2, 100, device=cuda)
    zeros = torch.zeros(2, dtype=torch.int64, device=cuda)

    def call(ids, offs):
        if op == "apply_penalties":
            return fray.apply_penalties(logits.clone(), ids, offs, repetition=1.2)
        return fray.decode_step(logits.clone(), ids, offs, repetition=1.2, temperature=1.0, seeds=zeros, offsets=zeros)

    ids, offs = torch.tensor([1, 5, 100], device=cuda), torch.tensor([0, 2, 3], device=cuda)
    call(ids, offs)  # unchecked: the GPU ignores the id past the vocabulary
    monkeypatch.setenv("FRAY_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match=r"token_ids: expected ids in \[0, 100\), got values in \[1, 100\]"):
        call(ids, offs)
    with pytest.raises(ValueError, match="token_offsets: expected non-decreasing"):
        call(ids[:2], torch.tensor([0, 2, 1], device=cuda))
    call(ids[:2], torch.tensor([0, 1, 2], device=cuda))  # valid values pass, every call checked
