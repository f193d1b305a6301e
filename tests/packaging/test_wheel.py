"""The wheel (//:wheel) holds the package, its compiled extensions, the Triton kernels and the JIT's
headers, with one version; test_installed_wheel.py installs it and uses it."""
import os
import sys
import zipfile


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


def test_one_version_source():
    """MODULE.bazel cannot load tools/version.bzl, so its module() version is checked against it."""
    import re
    version = re.search(r'FRAY_VERSION = "([^"]+)"', open("tools/version.bzl").read()).group(1)
    module = re.search(r'module\(\s*name = "fray",\s*version = "([^"]+)"', open("MODULE.bazel").read()).group(1)
    assert module == version, "MODULE.bazel version %s != tools/version.bzl %s" % (module, version)
    import fray
    assert fray.__version__ == version
    meta = [n for n in zipfile.ZipFile(_wheel_path()).namelist() if n.endswith(".dist-info/METADATA")][0]
    assert "\nVersion: %s\n" % version in zipfile.ZipFile(_wheel_path()).read(meta).decode()
    assert "fray/py.typed" in zipfile.ZipFile(_wheel_path()).namelist()
