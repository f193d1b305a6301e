"""`bazel run //bench/moe:fused_moe -- --out=results.jsonl`:
fray.triton, the _grouped_mm composite (eager, compiled), the per-expert loop."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("moe", "fused_moe")
