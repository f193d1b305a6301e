"""//:wheel installed with pip into a fresh virtual environment and used from a directory outside
the checkout, as a user of the wheel would: import, the `fray` console script (ops, check on the
CPU), the error contract and the packaged JIT headers.

The venv has no --system-site-packages: pip resolves the wheel's own requirements (torch, triton,
numpy, absl-py, nvidia-cutlass and theirs) through the machine's pip configuration, so a missing
or wrong Requires-Dist fails here. On the build machine that is ~65 s (torch's CPU wheel lies on
local disk; measured 2026-12-01), most of it unpacking torch and triton.
"""
import os
import subprocess
import sys
import venv

import pytest


def _wheel_path():
    for root, _, files in os.walk("."):
        for f in files:
            if f.endswith(".whl") and f.startswith("fray-"):
                return os.path.abspath(os.path.join(root, f))
    raise AssertionError("no fray-*.whl in the test's runfiles")


def _clean_env(home, bindir):
    """The environment of a shell outside Bazel: no runfiles on sys.path, no interpreter flags."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "RUNFILES", "TEST_", "TRITON_", "FRAY_", "BUILD_"))}
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["HOME"] = home
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    prefix = str(root / "venv")
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(prefix)
    bindir = os.path.join(prefix, "bin")
    env = _clean_env(str(root), bindir)
    out = subprocess.run([os.path.join(bindir, "python"), "-m", "pip", "install", "-q", "--no-cache-dir", "--no-compile",
                          _wheel_path()], env=env, capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, "pip install of the wheel failed:\n" + out.stdout + out.stderr
    work = root / "elsewhere"
    work.mkdir()
    return dict(prefix=prefix, bindir=bindir, env=env, cwd=str(work))


def _py(installed, code):
    out = subprocess.run([os.path.join(installed["bindir"], "python"), "-c", code], env=installed["env"],
                         capture_output=True, text=True, cwd=installed["cwd"])
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _fray(installed, *args):
    return subprocess.run([os.path.join(installed["bindir"], "fray")] + list(args), env=installed["env"],
                          capture_output=True, text=True, cwd=installed["cwd"])


def test_imports_from_the_venv_not_the_checkout(installed):
    out = _py(installed, "import fray, fray_triton, fray._C._norm as e, importlib.metadata as m; "
                         "print(fray.__file__); print(fray_triton.__file__); print(e.__file__); "
                         "print(fray.__version__, m.version('fray')); print(e.archs())")
    lines = out.split("\n")
    for path in lines[:3]:
        assert path.startswith(installed["prefix"]), "imported from %s, not the venv %s" % (path, installed["prefix"])
    version, dist_version = lines[3].split()
    assert version == dist_version, "fray.__version__ %s != the wheel's Version %s" % (version, dist_version)
    assert "90a" in lines[4]


def test_reference_numpy_in_numpy_out(installed):
    _py(installed, "import numpy as np, fray; x = np.array([[3.0, 4.0]], np.float32); "
                   "y = fray.rmsnorm(x, np.ones(2, np.float32), eps=0.0); "
                   "assert isinstance(y, np.ndarray), type(y); "
                   "assert np.allclose(y, x / np.sqrt(12.5)), y")


def test_error_contract(installed):
    _py(installed, """
import numpy as np, torch, fray
def raises(exc, fn, word):
    try:
        fn()
    except exc as e:
        assert word in str(e), (word, str(e))
    else:
        raise AssertionError("expected %s" % exc.__name__)
x = np.ones((2, 4), np.float32)
raises(ValueError, lambda: fray.rmsnorm(x, np.ones(3, np.float32)), "weight")
raises(TypeError, lambda: fray.rmsnorm(torch.ones(2, 4, dtype=torch.int32), torch.ones(4, dtype=torch.int32)), "dtype")
raises(ValueError, lambda: fray.rmsnorm(x, np.ones(4, np.float32), backend="nope"), "backend")
""")


def test_jit_finds_packaged_headers_and_cutlass(installed):
    out = _py(installed, "import os, fray; s = fray.jit.status(); print(s['include_root']); print(s['cutlass'])")
    include_root, cutlass = out.split("\n")[:2]
    assert include_root.startswith(installed["prefix"]), include_root
    assert cutlass.startswith(installed["prefix"]), "nvidia-cutlass (a requirement of the wheel) not in the venv: %s" % cutlass


def test_console_script_ops(installed):
    out = _fray(installed, "ops")
    assert out.returncode == 0, out.stdout + out.stderr
    for op in ("rmsnorm", "decode_attention", "sample"):
        assert op in out.stdout, out.stdout


def test_console_script_check_on_cpu(installed):
    out = _fray(installed, "check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS" in out.stdout and " 0 failed" in out.stdout, out.stdout


def test_console_script_rejects_unknown_command(installed):
    out = _fray(installed, "frobnicate")
    assert out.returncode != 0, out.stdout + out.stderr


def test_types_of_the_installed_package(installed, tmp_path):
    """mypy (tools/requirements.txt) over examples/typed against the venv: the wheel's py.typed and
    fray/__init__.pyi type a correct program cleanly and reject every line of misuse.py marked
    `# error`."""
    import re
    import shutil
    for name in ("use_fray.py", "misuse.py"):
        shutil.copy(os.path.join("examples", "typed", name), tmp_path / name)
    out = subprocess.run([sys.executable, "-m", "mypy", "--python-executable",
                          os.path.join(installed["bindir"], "python"), "--cache-dir", str(tmp_path / "cache"),
                          "--no-error-summary", "use_fray.py", "misuse.py"],
                         capture_output=True, text=True, cwd=tmp_path, env=installed["env"])
    errors = re.findall(r"^(\w+\.py):(\d+): error:", out.stdout, re.M)
    assert out.returncode in (0, 1) and (out.returncode == 1) == bool(errors), out.stdout + out.stderr
    assert not [e for e in errors if e[0] == "use_fray.py"], out.stdout
    marked = {i + 1 for i, line in enumerate(open(tmp_path / "misuse.py")) if "  # error" in line}
    assert marked and {int(n) for f, n in errors if f == "misuse.py"} == marked, out.stdout
