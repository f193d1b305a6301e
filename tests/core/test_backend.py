"""fray.backend without a GPU: backend resolution rules and the `fray check` case matrix."""
import pytest
import torch

from fray import backend as B


def test_gpu_check_cases_matrix(monkeypatch):
    monkeypatch.setattr(B, "available", lambda op, family, device: {"cuda": None, "triton": "no Triton here"})
    calls = []

    def run(op, backend, dtype, rows, cols, dev):
        calls.append((op, backend, dtype, rows, cols, dev))

    device = torch.device("cuda", 0)  # only compared and passed through, never used
    cases = B.gpu_check_cases("fam", ("a", "b"), device, ((1, 2), (3, 4)), run, dtypes=(torch.float32, torch.bfloat16))
    # per op: 2 dtypes x 2 shapes for cuda + one "unavailable" row for triton
    assert len(cases) == 2 * (4 + 1)
    unavailable = [c for c in cases if isinstance(c[4], Exception)]
    assert [(c[0], c[1]) for c in unavailable] == [("a", "triton"), ("b", "triton")]
    assert "no Triton here" in str(unavailable[0][4])
    runnable = [c for c in cases if not isinstance(c[4], Exception)]
    assert [c[2:4] for c in runnable[:4]] == [("fp32", "1x2"), ("fp32", "3x4"), ("bf16", "1x2"), ("bf16", "3x4")]
    for c in runnable:
        c[4]()
    assert calls[0] == ("a", "cuda", torch.float32, 1, 2, device)
    assert calls[-1] == ("b", "cuda", torch.bfloat16, 3, 4, device)


@pytest.mark.parametrize("available", [True, False])
def test_every_family_builds_its_gpu_check_rows_here(monkeypatch, available):
    """Every family's GPU `fray check` list builds without a GPU (the thunks are not run): one
    unavailable row per op and backend when nothing is available, else runnable rows only, each
    (op, backend, dtype label, shape label, thunk) with no label repeated."""
    import fray
    reason = None if available else "not here"
    monkeypatch.setattr(B, "available", lambda op, family, device: {"cuda": reason, "triton": reason})
    for name, module in sorted(fray.FAMILIES.items()):
        cases = module.check_cases(torch.device("cuda", 0))
        ops = {c[0] for c in cases}
        # (quant checks dequantize inside quantize's round trip: it has rows only when unavailable)
        assert ops <= set(module.OPS) and len(ops) >= len(module.OPS) - (name == "quant"), name
        if available:
            assert all(callable(c[4]) for c in cases), name
            labels = [c[:4] for c in cases]
            assert len(labels) == len(set(labels)), name
        else:
            assert sorted((c[0], c[1]) for c in cases) == sorted((op, b) for op in module.OPS for b in ("cuda", "triton"))
            assert all(isinstance(c[4], RuntimeError) and "not here" in str(c[4]) for c in cases), name


def test_reference_backend_refused_for_gpu_tensors():
    with pytest.raises(ValueError, match="backend: 'reference' runs on CPU tensors"):
        B.resolve("rmsnorm", "norm", "reference", torch.device("cuda", 0))


def test_forced_backend_override(monkeypatch):
    monkeypatch.setenv("FRAY_BACKEND", "reference")
    B._RESOLVED.clear()
    with pytest.raises(ValueError, match="backend: 'reference'"):
        B.resolve("rmsnorm", "norm", "auto", torch.device("cuda", 0))
    B._RESOLVED.clear()


def test_every_op_names_its_cuda_extension():
    import fray
    assert set(fray.CUDA_FAMILY) == set(fray.OPS)
    assert fray.CUDA_FAMILY["topk"] == fray.CUDA_FAMILY["argmax"] == "topk"
    assert fray.CUDA_FAMILY["sample"] == fray.CUDA_FAMILY["decode_step"] == "sampling"
    assert fray.CUDA_FAMILY["rmsnorm"] == "norm"
    assert fray.CUDA_FAMILY["prefill_attention"] == fray.CUDA_FAMILY["scaled_gemm"] == "gemm"  # JIT kernels
    # every named extension is built: fray._C._<family> (this target depends on //python/fray/_C:all);
    # JIT-compiled families (a registered CUDA check, no extension of their own) need the loader
    from fray import backend as B
    for family in set(fray.CUDA_FAMILY.values()):
        if family in B._CUDA_CHECKS:
            assert not isinstance(B.load_extension("jit"), ImportError), family
            continue
        assert B.load_extension(family).archs(), family
