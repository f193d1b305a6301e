"""examples/consumer, a monorepo of its own that bazel_deps on @fray (local_path_override to this
checkout), builds and passes its tests: a cc_binary linking @fray//cuda/elementwise's kernels and
a py_test running an operator from @fray//python/fray through the reference.

Bazel runs nested, in the consumer's workspace inside this checkout, with an output root of its
own under the test's temporary directory (--batch: no server outlives the test) and no
convenience symlinks in the source tree. The consumer's .bazelrc imports this checkout's
.bazelrc.offline, disk cache included, so Fray's CUDA objects are a cache hit after the first run.
The consumer's files are not labels here (examples/consumer is in .bazelignore: it is another
repository), so the target is tagged external and always runs.
"""
import os
import shutil
import subprocess
import sys


def _checkout():
    """The source tree: runfiles link to it (the test runs unsandboxed, tag local)."""
    return os.path.dirname(os.path.realpath("MODULE.bazel"))


def _bazel():
    for candidate in (shutil.which("bazel"), "/usr/local/bin/bazel"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise AssertionError("bazel not found on PATH (%s) or in /usr/local/bin" % os.environ.get("PATH"))


def test_consumer_builds_and_passes():
    consumer = os.path.join(_checkout(), "examples", "consumer")
    assert os.path.isfile(os.path.join(consumer, "MODULE.bazel")), consumer
    offline = os.path.join(_checkout(), ".bazelrc.offline")
    if os.path.exists(offline):
        assert "%workspace%" not in open(offline).read(), (
            "%s names %%workspace%% paths, which the consumer's workspace cannot resolve: it predates "
            "tools/write_offline_bazelrc.py's absolute paths; re-run bash tools/setup.sh" % offline)
    tmp = os.environ["TEST_TMPDIR"]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TEST_", "BAZEL", "RUNFILES", "PYTHON", "BUILD_", "XML_OUTPUT", "JAVA_RUNFILES"))}
    env["HOME"] = tmp
    # The interpreter this test runs on is the one the consumer's @local_python must find (with
    # torch and numpy), whatever the test's PATH says.
    env["PYTHON_BIN_PATH"] = sys.executable
    cmd = [_bazel(), "--batch", "--output_user_root=" + os.path.join(tmp, "root"),
           "test", "//...", "--symlink_prefix=/", "--test_output=errors"]
    out = subprocess.run(cmd, cwd=consumer, env=env, capture_output=True, text=True)
    log = out.stdout + out.stderr
    assert out.returncode == 0, "bazel test //... in examples/consumer failed:\n" + log[-6000:]
    assert "//:reference_test" in log and "PASSED" in log, log[-3000:]
    # //... built the cc_binary too: the launcher compiled and linked from outside the repository.
    bin_dir = subprocess.run([_bazel(), "--batch", "--output_user_root=" + os.path.join(tmp, "root"),
                              "info", "bazel-bin"], cwd=consumer, env=env, capture_output=True, text=True)
    assert bin_dir.returncode == 0, bin_dir.stderr
    demo = os.path.join(bin_dir.stdout.strip(), "vector_add_demo")
    assert os.access(demo, os.X_OK), "%s not built" % demo
    nm = subprocess.run(["nm", "-C", demo], capture_output=True, text=True)
    if nm.returncode == 0:
        assert "fray::vector_add" in nm.stdout, "the demo does not link Fray's launcher"
