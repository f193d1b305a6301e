"""cuda_library: nvcc-compiled .cu files exposed as CcInfo, a small stand-in for rules_cuda.

Attribute names follow rules_cuda (srcs, hdrs, deps, copts, defines) so that switching to it later
is a small change. Each .cu compiles in its own action (parallel), for the architectures of the
//tools:cuda_archs flag; objects are linked through cc_common with the static CUDA runtime.
Dependents see FRAY_CUDA_ARCHS="<archs>" so a binding can report what the kernels were built for.
"""

load("@bazel_skylib//rules:common_settings.bzl", "BuildSettingInfo")
load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain", "use_cpp_toolchain")

def _gencode(arch):
    # "90a" -> sm_90a SASS; the PTX of the last arch is embedded too (see below).
    return "-gencode=arch=compute_%s,code=sm_%s" % (arch, arch)

def _cuda_library_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    features = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    archs = ctx.attr._archs[BuildSettingInfo].value
    if not archs:
        fail("--//tools:cuda_archs is empty")
    dep_info = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps + [ctx.attr._cudart]])
    dcc = dep_info.compilation_context
    headers = depset(
        ctx.files.hdrs + [f for f in ctx.files.srcs if f.extension != "cu"],
        transitive = [dcc.headers],
    )
    objects = []
    for src in [f for f in ctx.files.srcs if f.extension == "cu"]:
        obj = ctx.actions.declare_file("_objs/%s/%s.pic.o" % (ctx.label.name, src.basename[:-3]))
        args = ctx.actions.args()
        args.add("-ccbin", cc_toolchain.compiler_executable)
        args.add_all(["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden"])
        args.add_all(["--expt-relaxed-constexpr", "-lineinfo"])
        args.add_all([_gencode(a) for a in archs])
        args.add("-gencode=arch=compute_%s,code=compute_%s" % (archs[-1], archs[-1]))
        args.add_all(["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path])
        args.add_all(dcc.includes, before_each = "-I")
        args.add_all(dcc.quote_includes, before_each = "-I")
        args.add_all(dcc.system_includes, before_each = "-isystem")
        args.add_all(dcc.defines, format_each = "-D%s")
        args.add_all(ctx.attr.defines, format_each = "-D%s")
        args.add_all(ctx.attr.copts)
        args.add_all(["-c", src, "-o", obj])
        ctx.actions.run(
            executable = ctx.executable._nvcc,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc " + src.short_path,
            use_default_shell_env = True,  # PATH: the host compiler needs `as`
        )
        objects.append(obj)
    linking_context, _ = cc_common.create_linking_context_from_compilation_outputs(
        actions = ctx.actions,
        name = ctx.label.name,
        feature_configuration = features,
        cc_toolchain = cc_toolchain,
        compilation_outputs = cc_common.create_compilation_outputs(
            objects = depset(objects),
            pic_objects = depset(objects),
        ),
        linking_contexts = [dep_info.linking_context],
        alwayslink = ctx.attr.alwayslink,
        disallow_dynamic_library = True,
    )
    own = CcInfo(
        compilation_context = cc_common.create_compilation_context(
            headers = depset(ctx.files.hdrs),
            defines = depset(ctx.attr.defines + ['FRAY_CUDA_ARCHS="%s"' % ",".join(archs)]),
        ),
        linking_context = linking_context,
    )
    return [
        DefaultInfo(files = depset(objects)),
        cc_common.merge_cc_infos(direct_cc_infos = [own], cc_infos = [dep_info]),
    ]

cuda_library = rule(
    implementation = _cuda_library_impl,
    doc = "Compiles .cu sources with nvcc for --//tools:cuda_archs and links them as a C++ library.",
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu", ".cuh", ".h", ".hpp"]),
        "hdrs": attr.label_list(allow_files = [".h", ".hpp", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "defines": attr.string_list(),
        "alwayslink": attr.bool(default = True),
        "_archs": attr.label(default = "//tools:cuda_archs"),
        "_nvcc": attr.label(default = "@local_cuda//:nvcc", executable = True, cfg = "exec", allow_single_file = True),
        "_cudart": attr.label(default = "@local_cuda//:cudart_static"),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    toolchains = use_cpp_toolchain(),
    fragments = ["cpp"],
)

def cuda_family(family, jit_headers = []):
    """The two targets of cuda/<family>, which //python/fray/_C links into fray._C._<family>:

    <family>_kernels  every .cu of the folder (one per dtype, so nvcc compiles them in parallel)
                      with its .cuh/.h headers (less jit_headers: JIT kernel templates, which
                      build at run time against CUTLASS and go into the :headers filegroup);
    <family>_binding  the torch-free adapter <family>_api.cc (integers in, cudaError_t ->
                      exception) and the pybind11 list <family>_binding.cc.
    """
    cuda_library(
        name = family + "_kernels",
        srcs = native.glob(["*.cu"]),
        hdrs = native.glob(["*.cuh", "*.h"], exclude = jit_headers),
        deps = ["//cuda/common"],
    )
    if jit_headers:
        native.filegroup(name = "headers", srcs = jit_headers)
    native.cc_library(
        name = family + "_binding",
        srcs = [family + "_api.cc", family + "_binding.cc"],
        copts = ["-fvisibility=hidden"],
        deps = [
            ":%s_kernels" % family,
            "//cuda/common",
            "@local_python//:pybind11",
        ],
        alwayslink = True,
    )
