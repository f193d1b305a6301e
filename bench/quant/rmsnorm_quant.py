"""`bazel run //bench/quant:rmsnorm_quant -- --out=results.jsonl`: fray.triton, fray unfused, torch eager / compile."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("quant", "rmsnorm_quant")
