"""`bazel run //bench/e2e -- --out=e2e.jsonl`: a Llama-shaped decoder step from Fray ops against the
same model in torch, checked in lockstep, timed eager, graph-replayed and torch.compile'd."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("e2e", "e2e")
