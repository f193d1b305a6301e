"""`bazel run //bench/gemm:gemm -- --out=results.jsonl`: fray.cuda, fray.triton, torch.mm and
torch.compile max-autotune, with set-up costs (cold compile, tuning, warm first call)."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("gemm", "gemm")
