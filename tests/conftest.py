"""Shared pytest configuration: the `gpu` marker (GPU tests run only with `-m gpu`, in the
`<name>_gpu` Bazel targets or the GPU bundle) and fixtures."""
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; selected with -m gpu")


@pytest.fixture
def cuda():
    import torch
    assert torch.cuda.is_available(), "GPU test selected (-m gpu) but torch sees no CUDA device"
    return torch.device("cuda")
