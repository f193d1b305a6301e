"""Fray's version: the one source. The wheel's metadata and fray.__version__ (a generated
fray/_version.py) read it; MODULE.bazel cannot load a .bzl file, so tests/packaging checks that
its module() version matches."""

FRAY_VERSION = "0.1.0"
