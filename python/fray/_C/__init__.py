"""Compiled CUDA extensions, one per kernel family: fray._C._<family> (torch-free pybind11
modules taking device pointers, sizes and a stream handle). Built by Bazel (python/fray/_C/BUILD.bazel)."""
