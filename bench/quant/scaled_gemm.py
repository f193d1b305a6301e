"""`bazel run //bench/quant:scaled_gemm -- --out=results.jsonl`: fray.cuda, fray.triton and the peers (torch._int_mm, torch._scaled_mm, torch.mm bf16)."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("quant", "scaled_gemm")
