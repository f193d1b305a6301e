"""`bazel run //bench/attention:mla_decode -- --out=results.jsonl`: fray.triton and the absorbed-MLA torch composite."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("attention", "mla_decode")
