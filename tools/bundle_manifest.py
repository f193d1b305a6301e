"""Entry point of //:gpu_bundle: lists what the bundle holds (tools/make_bundle.sh stages it)."""
import os

if __name__ == "__main__":
    for top in ("python", "triton", "tests", "bench"):
        for root, _, files in os.walk(top):
            for f in sorted(files):
                print(os.path.join(root, f))
