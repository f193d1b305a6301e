"""`bazel run //bench/soak -- --out=soak.jsonl [--steps=20000] [--check_every=1000]`: a toy decode loop
(rmsnorm -> rope -> kv_append_paged -> paged_decode_attention -> penalties -> sample) replayed as a
CUDA graph with lengths growing, checked against eager runs at intervals, memory held flat; exits
non-zero when a check fails, memory grows or a step raises."""
from fray.bench.main import main_for

if __name__ == "__main__":
    main_for("soak", "soak")
