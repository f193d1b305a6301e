"""`bazel run //bench/moe:routed_grouped_gemm -- --out=results.jsonl`:
fray.triton per combine mode, the _grouped_mm composite."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("moe", "routed_grouped_gemm")
