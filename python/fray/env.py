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


# os.environ.get encodes the key and decodes the value on every read (~1 µs). FRAY_BACKEND and
# FRAY_CHECK_INDICES are read on every eager call (FRAY_BACKEND is part of each launch plan's key),
# so they are read from the environ's raw mapping, which os.environ's setters (monkeypatch.setenv
# included) keep in step, and each raw value is decoded once.
_RAW_ENVIRON = getattr(os.environ, "_data", None)
_encoded_keys = {}
_decoded_values = {}


def _get(name):
    """os.environ.get(name), without the per-read encoding where the platform allows."""
    if _RAW_ENVIRON is None:
        return os.environ.get(name)
    key = _encoded_keys.get(name)
    if key is None:
        key = _encoded_keys[name] = os.environ.encodekey(name)
    raw = _RAW_ENVIRON.get(key)
    if raw is None:
        return None
    value = _decoded_values.get(raw)
    if value is None:
        value = _decoded_values[raw] = os.environ.decodevalue(raw)
    return value


_parsed = {}


def _parse(value, kind):
    """value stripped and lower-cased ("backend": or None when empty; "flag": true or false), once per value."""
    hit = _parsed.get((value, kind))
    if hit is None:
        v = value.strip().lower()
        hit = _parsed[(value, kind)] = ((v or None) if kind == "backend" else v in ("1", "true", "yes", "on"),)
    return hit[0]


def _flag(name):
    value = _get(name)
    return value is not None and _parse(value, "flag")


def backend_override():
    value = _get("FRAY_BACKEND")
    return None if value is None else _parse(value, "backend")


def cuda_disabled():
    return _flag("FRAY_DISABLE_CUDA")


def check_indices():
    return _flag("FRAY_CHECK_INDICES")


def commit():
    return os.environ.get("FRAY_COMMIT", "").strip() or None
