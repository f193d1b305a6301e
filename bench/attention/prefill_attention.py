"""`bazel run //bench/attention:prefill_attention -- --out=results.jsonl`: fray.triton and SDPA's backends."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("attention", "prefill_attention")
