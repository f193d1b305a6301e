"""Shared pytest configuration: the `gpu` marker (GPU tests run only with `-m gpu`, in the
`<name>_gpu` Bazel targets or the GPU bundle), fixtures, and FRAY_TEST_FAILURES."""
import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; selected with -m gpu")


@pytest.fixture
def cuda():
    import torch
    assert torch.cuda.is_available(), "GPU test selected (-m gpu) but torch sees no CUDA device"
    return torch.device("cuda")


def pytest_runtest_logreport(report):
    """FRAY_TEST_FAILURES=<file>: each failure's report (hypothesis's falsifying example included)
    appended to the file as the test ends, not at the session's end: a GPU run killed at its
    deadline keeps them (one that was lost a property test's traceback, 2026-12-07). With
    pytest-xdist this runs in the controller, as each worker's report arrives."""
    path = os.environ.get("FRAY_TEST_FAILURES")
    if path and report.failed:
        with open(path, "a") as f:
            f.write("=== %s (%s)\n%s\n" % (report.nodeid, report.when, report.longreprtext))
