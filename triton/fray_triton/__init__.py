"""Fray's Triton kernels, one module per family (fray_triton.norm, ...).

The import root is triton/ in the source tree and the wheel's top level, so this package can
never shadow the real `triton` package it imports.
"""
