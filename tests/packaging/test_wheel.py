"""The wheel (//:wheel) holds the package, its compiled extension and the Triton kernels, and the
CLI's `check` passes on this machine (reference + Triton interpreter without a GPU)."""
import os
import subprocess
import sys
import zipfile

import pytest


def _wheel_path():
    for root, _, files in os.walk("."):
        for f in files:
            if f.endswith(".whl") and f.startswith("fray-"):
                return os.path.join(root, f)
    raise AssertionError("no fray-*.whl in the test's runfiles")


def test_wheel_contents():
    names = set(zipfile.ZipFile(_wheel_path()).namelist())
    for required in ("fray/__init__.py", "fray/ops/norm.py", "fray/reference/norm.py", "fray/_C/_norm.so",
                     "fray_triton/__init__.py", "fray_triton/norm.py", "fray/cli.py",
                     "fray/_C/_jit.so", "fray/jit/__init__.py", "fray/tune/__init__.py",
                     "fray/tune/defaults/nvidia_h200.json", "fray/include/cuda/common/launch_abi.h",
                     "fray/include/cuda/common/binder.h"):
        assert required in names, "%s missing from the wheel: %s" % (required, sorted(names)[:20])
    assert not any(n.startswith(("python/", "triton/")) for n in names), "source prefixes not stripped"
    meta = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert len(meta) == 1
    wheel_info = zipfile.ZipFile(_wheel_path()).read(meta[0].replace("METADATA", "WHEEL")).decode()
    assert "Tag: cp%d%d-cp%d%d-linux_x86_64" % (sys.version_info[:2] * 2) in wheel_info
    metadata = zipfile.ZipFile(_wheel_path()).read(meta[0]).decode()
    assert "Requires-Dist: nvidia-cutlass" in metadata  # the JIT's CUTLASS/CuTe headers at run time


def test_wheel_installs_and_imports(tmp_path):
    zipfile.ZipFile(_wheel_path()).extractall(tmp_path)
    code = ("import fray, fray._C._norm as e, fray_triton.norm, fray.jit, os; "
            "assert fray.jit.include_root() == os.path.join(os.path.dirname(fray.__file__), 'include'); "
            "import numpy as np; y = fray.rmsnorm(np.ones((2, 4), np.float32), np.ones(4, np.float32)); "
            "assert abs(float(y[0, 0]) - 1.0) < 1e-5; print(e.archs())")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "90a" in out.stdout


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU check runs Triton's interpreter")
def test_cli_check_and_ops_on_cpu():
    from absl import flags

    from fray import cli
    flags.FLAGS(["fray"])  # parse defaults, as absl.app.run would
    assert cli.main(["fray", "ops"]) == 0
    assert cli.main(["fray", "check"]) == 0
