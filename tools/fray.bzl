"""Macros every Fray family uses: the Python extension, the CPU+GPU test pair, the benchmark."""

load("@rules_python//python:defs.bzl", "py_binary", "py_library", "py_test")

def py_extension(name, deps, **kwargs):
    """A pybind11 extension `<name>.so`, importable as `<python package of this BUILD>.<name>`.

    deps: cc_library targets with alwayslink = True that hold the PYBIND11_MODULE(<name>, m)
    binding (kernels in cuda/<family>/). Only PyInit_<name> is exported: static archives (cudart
    included) are hidden so that several extensions can live in one process.
    """
    native.cc_binary(
        name = name + ".so",
        linkshared = True,
        linkstatic = True,
        linkopts = ["-Wl,--exclude-libs,ALL"],
        deps = deps + ["@local_python//:pybind11"],
        **kwargs
    )

def fray_family_extension(family):
    """In python/fray/_C: `_<family>.so` (fray._C._<family>) and the py_library `<family>`."""
    py_extension(
        name = "_" + family,
        deps = ["//cuda/%s:%s_binding" % (family, family)],
    )
    py_library(
        name = family,
        data = [":_%s.so" % family],
        deps = [":_C"],
    )

def _package_headers_impl(ctx):
    outs = []
    for f in ctx.files.srcs:
        out = ctx.actions.declare_file("include/" + f.short_path)
        ctx.actions.symlink(output = out, target_file = f)
        outs.append(out)
    return [DefaultInfo(files = depset(outs), runfiles = ctx.runfiles(files = outs))]

package_headers = rule(
    implementation = _package_headers_impl,
    doc = "Headers at include/<their repository path> beside this package (fray/include/cuda/...), " +
          "where fray.jit.include_root() finds them in runfiles, the GPU bundle and the wheel.",
    attrs = {"srcs": attr.label_list(allow_files = [".h", ".hpp", ".cuh"])},
)

def fray_py_test(name, srcs, family = None, deps = [], data = [], size = "medium", cpu = True, gpu = True, **kwargs):
    """One pytest file, two targets: `<name>` (CPU, CI) and `<name>_gpu` (tags = ["gpu"]).

    family: the kernel family under test; adds the fray package, that family's extension
    (//python/fray/_C:<family>) and the shared conftest to deps.
    Tests marked @pytest.mark.gpu run only in the GPU target; the others only in the CPU target,
    where Triton runs under its interpreter (TRITON_INTERPRET=1).
    """
    if family:
        deps = deps + ["//python/fray", "//python/fray/_C:" + family, "//tests:conftest"]
    common = dict(
        srcs = srcs + ["//tools:pytest_runner.py"],
        main = "//tools:pytest_runner.py",
        deps = deps,
        data = data,
        size = size,
        **kwargs
    )
    files = ["$(rootpath %s)" % s for s in srcs]
    if cpu:
        py_test(
            name = name,
            args = ["-m", "'not gpu'"] + files,  # args are shell-tokenized
            env = {"TRITON_INTERPRET": "1"},
            **common
        )
    if gpu:
        py_test(
            name = name + "_gpu",
            args = ["-m", "gpu"] + files,
            tags = ["gpu", "exclusive"],
            **common
        )

def fray_bench(name, src, deps = [], **kwargs):
    """A benchmark binary: `bazel run //bench/<family>:<name> -- --out=results.jsonl`."""
    py_binary(
        name = name,
        srcs = [src],
        main = src,
        deps = deps + ["//python/fray:all"],
        tags = ["gpu", "manual"],
        **kwargs
    )

def fray_bench_family(ops):
    """bench/<family>/BUILD.bazel in one call: a fray_bench per op (<op>.py) and the `all`
    filegroup the GPU bundle copies."""
    for op in ops:
        fray_bench(name = op, src = op + ".py")
    native.filegroup(
        name = "all",
        srcs = native.glob(["*.py"]),
    )

