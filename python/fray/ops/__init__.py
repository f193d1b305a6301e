"""Per-family operator modules: validation, backend dispatch, torch custom-op registration."""
