"""Every FRAY_* environment variable, read here and nowhere else.

FRAY_BACKEND          default for backend="auto": "cuda", "triton" or "reference" forces one
                      backend for every call that does not name one (unset: fastest verified).
FRAY_DISABLE_CUDA     "1": never load the compiled CUDA extensions (auto falls back to Triton).
FRAY_CHECK_INDICES    "1": validate device-side index tensors (lengths, block tables) at the cost
                      of a host synchronisation; refused during CUDA-graph capture.
FRAY_COMMIT           commit hash stamped into benchmark results (the GPU bundle sets it, since
                      the GPU machine has no .git).
"""
import os


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def backend_override():
    value = os.environ.get("FRAY_BACKEND", "").strip().lower()
    return value or None


def cuda_disabled():
    return _flag("FRAY_DISABLE_CUDA")


def check_indices():
    return _flag("FRAY_CHECK_INDICES")


def commit():
    return os.environ.get("FRAY_COMMIT", "").strip() or None
