"""`bazel run //bench/quant:quantize -- --out=results.jsonl`: fray.triton and the peers (torch eager, torch.compile)."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("quant", "quantize")
