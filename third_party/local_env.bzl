"""Repository rules for what is installed on the machine; nothing is downloaded.

@local_python   the interpreter Fray builds and tests with: a py_runtime toolchain, its headers,
                pybind11's headers, and VERSIONS (python, torch, triton, numpy, pybind11).
@local_cuda     nvcc (a wrapper usable as a File), the CUDA headers, static cudart, NVCC_VERSION.
@local_cutlass  CUTLASS/CuTe headers from the nvidia-cutlass wheel (cutlass_library/source/include).

Each rule watches the files that carry the versions it records (torch/version.py, triton's
__init__.py, CUDA's version.json, ...), so upgrading any of them re-runs the rule and rebuilds
what depends on it.
"""

_PY_PROBE = """
import json, os, sys, sysconfig
def mod(name):
    try:
        m = __import__(name)
    except Exception:
        return None, None
    return getattr(m, "__version__", "unknown"), getattr(m, "__file__", None)
info = {
    "exe": os.path.realpath(sys.executable),
    "include": sysconfig.get_paths()["include"],
    "version": "%d.%d.%d" % sys.version_info[:3],
    "tag": "cp%d%d" % sys.version_info[:2],
    "versions": {},
    "watch": [os.path.realpath(sys.executable)],
}
for name in ("torch", "triton", "numpy", "pybind11"):
    v, f = mod(name)
    info["versions"][name] = v
    if f:
        info["watch"].append(f)
        vf = os.path.join(os.path.dirname(f), "version.py")
        if os.path.exists(vf):
            info["watch"].append(vf)
try:
    import pybind11
    info["pybind11_include"] = pybind11.get_include()
except Exception:
    info["pybind11_include"] = ""
try:
    import cutlass_library
    root = os.path.dirname(cutlass_library.__file__)
    info["cutlass_include"] = os.path.join(root, "source", "include")
    import importlib.metadata as md
    info["versions"]["nvidia-cutlass"] = md.version("nvidia-cutlass")
except Exception:
    info["cutlass_include"] = ""
print(json.dumps(info))
"""

def _find_python(rctx):
    explicit = rctx.os.environ.get("PYTHON_BIN_PATH")
    if explicit:
        return explicit
    want = rctx.os.environ.get("FRAY_PYTHON_VERSION")
    if want:
        candidates = []
        found = rctx.which("python" + want)
        if found:
            candidates.append(str(found))
        home = rctx.os.environ.get("PYENV_ROOT") or (rctx.os.environ.get("HOME", "/root") + "/.pyenv")
        versions = rctx.path(home + "/versions")
        if versions.exists:
            for d in sorted(versions.readdir(), key = lambda p: p.basename, reverse = True):
                if d.basename.startswith(want + "."):
                    candidates.append(str(d.get_child("bin").get_child("python3")))

        # A pyenv shim exists for every installed version but fails unless that version is
        # selected: take the first candidate that runs and is the version asked for.
        check = "import sys; assert '%d.%d' % sys.version_info[:2] == '" + want + "'"
        for c in candidates:
            if rctx.execute([c, "-c", check]).return_code == 0:
                return c
        fail("FRAY_PYTHON_VERSION=%s: no working python%s on PATH or under %s; set PYTHON_BIN_PATH" % (want, want, versions))
    found = rctx.which("python3")
    if not found:
        fail("python3 not found on PATH; set PYTHON_BIN_PATH")
    return str(found)

def _probe_python(rctx):
    py = _find_python(rctx)
    res = rctx.execute([py, "-c", _PY_PROBE])
    if res.return_code != 0:
        fail("probing %s failed:\n%s" % (py, res.stderr))
    info = json.decode(res.stdout.strip().splitlines()[-1])
    for f in info["watch"]:
        rctx.watch(f)
    return info

_PY_BUILD = """
load("@rules_python//python:defs.bzl", "py_runtime", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

cc_library(
    name = "pybind11",
    hdrs = glob(["pybind11_include/**/*.h"]),
    includes = ["pybind11_include"],
    deps = [":python_headers"],
)

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{exe}",
    python_version = "PY3",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "py_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)

exports_files(["versions.json"])
"""

def _local_python_impl(rctx):
    info = _probe_python(rctx)
    if not info["pybind11_include"]:
        fail("pybind11 is not installed for %s: run tools/setup.sh" % info["exe"])
    rctx.symlink(info["include"], "python_include")
    rctx.symlink(info["pybind11_include"], "pybind11_include")
    versions = dict(info["versions"])
    versions["python"] = info["version"]
    rctx.file("versions.json", json.encode_indent(versions) + "\n")
    rctx.file("defs.bzl", "\n".join([
        "PY_EXE = %r" % info["exe"],
        "PY_VERSION = %r" % info["version"],
        "PY_TAG = %r" % info["tag"],
        "VERSIONS = %r" % versions,
        "",
    ]))
    rctx.file("BUILD.bazel", _PY_BUILD.format(exe = info["exe"]))

local_python = repository_rule(
    implementation = _local_python_impl,
    environ = ["PYTHON_BIN_PATH", "FRAY_PYTHON_VERSION", "PATH", "PYENV_ROOT"],
    local = True,
)

def _local_cutlass_impl(rctx):
    info = _probe_python(rctx)
    inc = info["cutlass_include"]
    if not inc or not rctx.path(inc + "/cute").exists:
        fail("CUTLASS/CuTe headers not found (pip install --no-deps nvidia-cutlass for %s): run tools/setup.sh" % info["exe"])
    rctx.symlink(inc, "include")
    rctx.file("defs.bzl", "CUTLASS_VERSION = %r\n" % info["versions"].get("nvidia-cutlass", "unknown"))
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cutlass",
    hdrs = glob(["include/cute/**", "include/cutlass/**"]),
    includes = ["include"],
)
""")

local_cutlass = repository_rule(
    implementation = _local_cutlass_impl,
    environ = ["PYTHON_BIN_PATH", "FRAY_PYTHON_VERSION", "PATH", "PYENV_ROOT"],
    local = True,
)

def _local_cuda_impl(rctx):
    cuda = rctx.os.environ.get("CUDA_HOME") or rctx.os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    nvcc = rctx.path(cuda + "/bin/nvcc")
    if not nvcc.exists:
        fail("nvcc not found at %s (set CUDA_HOME)" % nvcc)
    real = str(nvcc.realpath)
    rctx.watch(real)
    if rctx.path(cuda + "/version.json").exists:
        rctx.watch(cuda + "/version.json")
    rctx.symlink(cuda + "/include", "include")
    rctx.symlink(cuda + "/lib64", "lib64")

    # A wrapper so that rules can run nvcc as a File; nvcc finds cicc, ptxas and fatbinary
    # relative to its own real location.
    rctx.file("nvcc", "#!/bin/sh\nexec %s \"$@\"\n" % real, executable = True)
    res = rctx.execute([real, "--version"])
    if res.return_code != 0:
        fail("%s --version failed: %s" % (real, res.stderr))
    version = res.stdout.strip().splitlines()[-1]
    rctx.file("defs.bzl", "CUDA_PATH = %r\nNVCC_VERSION = %r\n" % (cuda, version))
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

exports_files(["nvcc"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**"]),  # CCCL headers such as nv/target have no extension
    includes = ["include"],
)

cc_library(
    name = "cudart_static",
    srcs = ["lib64/libcudart_static.a"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
    deps = [":cuda_headers"],
)
""")

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_HOME", "CUDA_PATH"],
    local = True,
)

def _local_env_impl(mctx):
    local_python(name = "local_python")
    local_cuda(name = "local_cuda")
    local_cutlass(name = "local_cutlass")

local_env = module_extension(implementation = _local_env_impl)
