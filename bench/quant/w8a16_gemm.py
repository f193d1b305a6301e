"""`bazel run //bench/quant:w8a16_gemm -- --out=results.jsonl`: fray.cuda, fray.triton and the peers (torch.mm bf16, torch dequant+mm)."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("quant", "w8a16_gemm")
