"""`bazel run //bench/host -- --out=host.jsonl`: every op's eager per-call host cost beside torch's."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("host", "host")
