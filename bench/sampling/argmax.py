"""`bazel run //bench/sampling:argmax -- --out=results.jsonl`: fray.cuda, fray.triton and the peers."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("sampling", "argmax")
