"""`bazel run //bench/attention:kv_append_paged -- --out=results.jsonl`: fray.cuda, fray.triton and the peers."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("attention", "kv_append_paged")
