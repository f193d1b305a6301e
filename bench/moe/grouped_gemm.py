"""`bazel run //bench/moe:grouped_gemm -- --out=results.jsonl`:
fray.triton, torch._grouped_mm, per-group torch.mm."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("moe", "grouped_gemm")
