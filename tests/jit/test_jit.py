"""fray.jit: real nvcc compiles of a tiny kernel for sm_90a into a private cache.

CPU (CI): the cubin inside the .so, the cache key's inputs (source, header bytes, flags, nvcc),
eight racing processes, corrupted entries, FRAY_CACHE_DIR, the error contract; nothing is loaded.
GPU: load and launch (pattern check), a warm second process, racing processes that launch, a
side stream, CUDA-graph capture.
"""
import json
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import time

import pytest

import fray.jit as jit
import tiny_kernel

REAL_NVCC = jit.nvcc_path()


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A private FRAY_CACHE_DIR; the per-process counters start at zero and the per-process memo of
    loaded kernels starts empty (else jit.build returns the kernel an earlier test of this process
    loaded from its own cache, and this cache stays empty: a second process then compiles)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("FRAY_CACHE_DIR", str(d))
    monkeypatch.setattr(jit, "_loaded", {})
    for k in jit.stats:
        monkeypatch.setitem(jit.stats, k, 0)
    return d


def _wrapper(path, log, version_suffix=""):
    """An nvcc that logs each compile (not --version) to `log`, and can claim another version."""
    path.write_text(textwrap.dedent("""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then
          %(real)s --version
          %(extra)s
          exit 0
        fi
        echo compile >> %(log)s
        exec %(real)s "$@"
        """) % {"real": REAL_NVCC, "log": log,
                "extra": ("echo %s" % version_suffix) if version_suffix else ""})
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _compiles(log):
    return len(log.read_text().splitlines()) if log.exists() else 0


def _entries(cache):
    root = cache / "jit"
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name not in ("tmp", "locks")) if root.exists() else []


def _cuobjdump():
    import triton
    tool = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.is_file():
        tool = shutil.which("cuobjdump")
    assert tool, "cuobjdump not found (Triton's package carries one under backends/nvidia/bin)"
    return str(tool)


# --- CPU ------------------------------------------------------------------------------------------

def test_compiles_sm90a_shared_object_with_the_entry_points(cache):
    so = jit.compile_only("tiny", tiny_kernel.source())
    assert so.is_file() and so.parent.parent == cache / "jit"
    listed = subprocess.run([_cuobjdump(), "--list-elf", str(so)], capture_output=True, text=True)
    assert listed.returncode == 0 and ".cubin" in listed.stdout, listed.stdout + listed.stderr
    dumped = subprocess.run([_cuobjdump(), "--dump-elf", str(so)], capture_output=True, text=True).stdout
    archs = set(re.findall(r"arch = (sm_\w+)", dumped))
    assert archs == {"sm_90a"}, archs  # SASS for sm_90a (wgmma, setmaxnreg) and nothing else
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    assert {"fray_jit_launch", "fray_jit_workspace_bytes", "fray_jit_describe"} <= exported
    assert not any("fill" in s for s in exported), "device code / helpers must stay hidden: %s" % sorted(exported)
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
    assert "libcudart.so" not in needed and "torch" not in needed, needed  # static cudart, no torch
    manifest = json.loads((so.parent / "manifest.json").read_text())
    assert manifest["so_bytes"] == so.stat().st_size
    abi = os.path.realpath(os.path.join(jit.include_root(), "cuda", "common", "launch_abi.h"))
    assert abi in {os.path.realpath(h) for h in manifest["headers"]}, sorted(manifest["headers"])
    assert not any("cuda_runtime.h" in h for h in manifest["headers"])  # the toolkit's: nvcc --version
    assert jit.stats["compiles"] == 1


def test_warm_cache_compiles_nothing(cache, tmp_path, monkeypatch):
    log = tmp_path / "nvcc.log"
    monkeypatch.setenv("FRAY_NVCC_COMPILER", str(_wrapper(tmp_path / "nvcc", log)))
    first = jit.compile_only("tiny", tiny_kernel.source())
    again = jit.compile_only("tiny", tiny_kernel.source())
    assert first == again and _compiles(log) == 1
    assert jit.stats == {"compiles": 1, "hits": 1, "rebuilds": 0}
    other = jit.compile_only("tiny", tiny_kernel.source(tag="v2"))  # other source text, other key
    assert other != first and _compiles(log) == 2 and len(_entries(cache)) == 2


def test_header_byte_change_rebuilds(cache, tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    header = inc / "tiny_extra.h"
    header.write_text("#pragma once\nconstexpr int kTinyExtra = 1;\n")
    src = tiny_kernel.source(include='#include "tiny_extra.h"')
    flags = ["-I" + str(inc)]
    so = jit.compile_only("tiny", src, flags=flags)
    manifest = json.loads((so.parent / "manifest.json").read_text())
    recorded = next(h for h in manifest["headers"] if os.path.realpath(h) == str(header.resolve()))

    os.utime(header)  # touched, same bytes: re-hashed, still valid
    assert jit.compile_only("tiny", src, flags=flags) == so and jit.stats["compiles"] == 1

    header.write_text("#pragma once\nconstexpr int kTinyExtra = 2;\n")  # one byte changed
    assert jit.compile_only("tiny", src, flags=flags) == so
    assert jit.stats["compiles"] == 2 and jit.stats["rebuilds"] == 1
    rebuilt = json.loads((so.parent / "manifest.json").read_text())
    assert rebuilt["headers"][recorded][0] != manifest["headers"][recorded][0]
    assert rebuilt["so_sha256"] == jit._sha256_file(so)


def test_header_link_pointing_elsewhere_rebuilds(cache, tmp_path):
    """Runfiles and the bundle reach headers through links: a link retargeted to other bytes is a
    changed header even though no file was written."""
    inc = tmp_path / "inc"
    inc.mkdir()
    (tmp_path / "one.h").write_text("#pragma once\nconstexpr int kTinyExtra = 1;\n")
    (tmp_path / "two.h").write_text("#pragma once\nconstexpr int kTinyExtra = 2;\n")
    link = inc / "tiny_extra.h"
    link.symlink_to(tmp_path / "one.h")
    src = tiny_kernel.source(include='#include "tiny_extra.h"')
    so = jit.compile_only("tiny", src, flags=["-I" + str(inc)])
    link.unlink()
    link.symlink_to(tmp_path / "two.h")
    assert jit.compile_only("tiny", src, flags=["-I" + str(inc)]) == so
    assert jit.stats["compiles"] == 2 and jit.stats["rebuilds"] == 1


def test_flag_change_is_another_entry(cache):
    a = jit.compile_only("tiny", tiny_kernel.source())
    b = jit.compile_only("tiny", tiny_kernel.source(), flags=["-DFRAY_TINY_FLAG=1"])
    assert a != b and jit.stats["compiles"] == 2
    assert "-DFRAY_TINY_FLAG=1" in json.loads((b.parent / "manifest.json").read_text())["command"]
    assert a.is_file() and b.is_file()


def test_ptxas_verbose_is_a_flag_of_the_key(cache, monkeypatch, capfd):
    a = jit.compile_only("tiny", tiny_kernel.source())
    monkeypatch.setenv("FRAY_PTXAS_VERBOSE", "1")
    b = jit.compile_only("tiny", tiny_kernel.source())
    assert a != b and jit.stats["compiles"] == 2
    assert "registers" in capfd.readouterr().err  # ptxas's report, printed


# A promotion as the block-scaled FP8 GEMMs do it: one FFMA per accumulator register, all sharing
# the scale (ptxas marks its operand for reuse), 64 in a row.
PROMOTE = r"""
extern "C" __global__ void promote(float* out, const float* part, const float* scales, int n) {
  float acc[64], p[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) { acc[i] = out[threadIdx.x + i * 128]; p[i] = part[threadIdx.x + i * 128]; }
  for (int it = 0; it < n; ++it) {
    const float s = scales[it];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = fmaf(p[i], s, acc[i]);
#pragma unroll
    for (int i = 0; i < 64; ++i) p[i] = p[i] * 1.0001f + s;
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) out[threadIdx.x + i * 128] = acc[i];
}
"""


def test_ffma_interleave_pass_patches_only_the_ffma_hints(cache):
    """sass_pass="ffma_interleave": another cache entry (uncompressed device code); in the leading
    9/16 of the FFMA run, every FFMA with a reuse flag that starts its destination register loses
    its reuse flags and its no-yield bit; every other byte of the .so is nvcc's."""
    from fray.jit import sass
    plain = jit.compile_only("promote", PROMOTE, flags=["--no-compress"])
    passed = jit.compile_only("promote", PROMOTE, sass_pass="ffma_interleave")
    assert plain != passed and jit.stats["compiles"] == 2
    manifest = json.loads((passed.parent / "manifest.json").read_text())
    assert "--no-compress" in manifest["command"]
    report = manifest["sass_pass"]
    assert report["name"] == "ffma_interleave" and report["version"] == sass.VERSION
    assert report["runs"] >= 1 and report["functions"] == 1 and report["edits"] > 16
    tool = _cuobjdump()
    before = sass.parse(sass.listing(plain, tool))["promote"]
    after = sass.parse(sass.listing(passed, tool))["promote"]
    assert len(before) == len(after) > 64
    edits = dict(sass.interleave_edits(before))
    assert len(edits) == report["edits"]
    for i, (b, a) in enumerate(zip(before, after)):
        assert (b[0], b[2]) == (a[0], a[2]), i                 # offsets and lower words unchanged
        if i in edits:
            assert a[3] == edits[i] == b[3] & ~sass.REUSE_BITS & ~sass.NO_YIELD_BIT
            assert ".reuse" in b[1] and ".reuse" not in a[1] and b[1].startswith("FFMA")
        else:
            assert a[3] == b[3], (i, b[1])
    (start, end), = sass.ffma_runs(before)
    assert end - start >= 64 and max(edits) < start + (end - start) * 9 // 16
    # the device code differs from the plain build's only in the edited upper words
    data_b, data_a = plain.read_bytes(), passed.read_bytes()
    texts = []
    for data in (data_b, data_a):
        found = [sec[".text.promote"] for sec in (sass._elf_sections(data, c) for c in sass.embedded_cubins(data))
                 if ".text.promote" in sec]
        assert len(found) == 1
        texts.append(found[0])
    text_b, text_a = texts
    code_b = data_b[text_b[0]:text_b[0] + text_b[1]]
    code_a = data_a[text_a[0]:text_a[0] + text_a[1]]
    changed = {j // 16 for j in range(len(code_b)) if code_b[j] != code_a[j]}
    assert changed == {before[i][0] // 16 for i in edits}


def test_ffma_interleave_switch_and_refusals(cache, monkeypatch, tmp_path):
    from fray.jit import sass
    monkeypatch.delenv("FRAY_DISABLE_FFMA_INTERLEAVE", raising=False)
    assert sass.ffma_interleave_enabled() is sass.FFMA_INTERLEAVE_DEFAULT
    monkeypatch.setenv("FRAY_DISABLE_FFMA_INTERLEAVE", "0")
    assert sass.ffma_interleave_enabled()
    monkeypatch.setenv("FRAY_DISABLE_FFMA_INTERLEAVE", "1")
    assert not sass.ffma_interleave_enabled()
    monkeypatch.setenv("FRAY_DISABLE_FFMA_INTERLEAVE", "yes")
    with pytest.raises(ValueError, match="FRAY_DISABLE_FFMA_INTERLEAVE: expected 0 or 1"):
        sass.ffma_interleave_enabled()
    with pytest.raises(ValueError, match="sass_pass must be one of"):
        jit.compile_only("promote", PROMOTE, sass_pass="interleave")
    # a compressed fatbin holds no cubin in the clear: refused, the file untouched
    so = jit.compile_only("promote", PROMOTE, flags=["--compress-mode=size"])
    copy = tmp_path / "c.so"
    shutil.copy(so, copy)
    if not sass.embedded_cubins(copy.read_bytes()):
        with pytest.raises(RuntimeError, match="no uncompressed cubin"):
            sass.apply_ffma_interleave(copy, _cuobjdump())
        assert copy.read_bytes() == so.read_bytes()
    # a listing that does not match the bytes: refused, the file untouched
    plain = jit.compile_only("promote", PROMOTE, flags=["--no-compress"])
    shutil.copy(plain, copy)
    listed = sass.listing(copy, _cuobjdump())
    forged = re.sub(r"(FFMA R\d+, R\d+\.reuse.*?/\* )0x([0-9a-f]{16})", lambda m: m.group(1) + "0x" + "f" * 16, listed,
                    count=1)
    monkeypatch.setattr(sass, "listing", lambda path, tool: forged)
    with pytest.raises(RuntimeError, match="is not what cuobjdump listed"):
        sass.apply_ffma_interleave(copy, _cuobjdump())
    assert copy.read_bytes() == plain.read_bytes()
    monkeypatch.setenv("FRAY_CUOBJDUMP", str(tmp_path / "none"))
    monkeypatch.setenv("FRAY_NVCC_COMPILER", REAL_NVCC)
    assert sass.cuobjdump() != str(tmp_path / "none")          # a missing override falls through


def test_nvcc_change_is_another_entry(cache, tmp_path, monkeypatch):
    log = tmp_path / "nvcc.log"
    same = _wrapper(tmp_path / "nvcc_a", log)
    newer = _wrapper(tmp_path / "nvcc_b", log, version_suffix="Cuda compilation tools, release 13.9, V13.9.1")
    monkeypatch.setenv("FRAY_NVCC_COMPILER", str(same))
    a = jit.compile_only("tiny", tiny_kernel.source())
    monkeypatch.setenv("FRAY_NVCC_COMPILER", str(newer))
    b = jit.compile_only("tiny", tiny_kernel.source())
    assert a != b and _compiles(log) == 2
    assert json.loads((b.parent / "manifest.json").read_text())["nvcc_version"].endswith("V13.9.1")
    monkeypatch.setenv("FRAY_NVCC_COMPILER", str(same))
    assert jit.compile_only("tiny", tiny_kernel.source()) == a and _compiles(log) == 2


_RACER = """
import json, os, sys, time
sys.path[:0] = %(path)r
import fray.jit as jit
import tiny_kernel
ready, go = sys.argv[1], sys.argv[2]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
if sys.argv[3] == "launch":
    kernel = jit.build("tiny_race", tiny_kernel.source(tag="race"))
    import torch
    out = torch.empty(2000, dtype=torch.int32, device="cuda")
    kernel.launch((out.data_ptr(),), (2000, 5), (), 0, torch.cuda.current_stream().cuda_stream)
    got = out.cpu().tolist()
    assert [g & 0xFFFFFFFF for g in got] == tiny_kernel.expected(2000, 5), "wrong pattern"
    path = str(kernel.path)
else:
    path = str(jit.compile_only("tiny_race", tiny_kernel.source(tag="race")))
print(json.dumps({"path": path, "compiles": jit.stats["compiles"]}))
"""


def _race(cache, tmp_path, mode, n=8):
    log = tmp_path / "nvcc.log"
    env = dict(os.environ, FRAY_CACHE_DIR=str(cache), FRAY_NVCC_COMPILER=str(_wrapper(tmp_path / "nvcc", log)))
    script = tmp_path / "racer.py"
    script.write_text(_RACER % {"path": [p for p in sys.path if p]})
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / ("ready%d" % i)), str(go), mode],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
             for i in range(n)]
    deadline = time.monotonic() + 240
    while not all((tmp_path / ("ready%d" % i)).exists() for i in range(n)):
        assert time.monotonic() < deadline, "racers did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
        time.sleep(0.05)
    go.touch()  # all of them ask for the kernel at once
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r["path"] for r in results}) == 1
    assert sum(r["compiles"] for r in results) == 1 and _compiles(log) == 1, (results, _compiles(log))
    entries = _entries(cache)
    assert len(entries) == 1
    assert jit._entry_problem(entries[0], json.loads((entries[0] / "manifest.json").read_text())["key"]) is None
    assert list((cache / "jit" / "tmp").iterdir()) == []  # no build directory left behind


def test_sixteen_processes_race_for_one_kernel(cache, tmp_path):
    _race(cache, tmp_path, "compile", n=16)


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "no_so"])
def test_corrupted_entry_is_rebuilt(cache, damage):
    so = jit.compile_only("tiny", tiny_kernel.source())
    good = so.read_bytes()
    if damage == "truncate":
        so.write_bytes(good[: len(good) // 2])
    elif damage == "flip":
        data = bytearray(good)
        data[len(data) // 3] ^= 0x5A
        so.write_bytes(bytes(data))
    elif damage == "manifest":
        (so.parent / "manifest.json").write_text('{"key": "x", ')
    else:
        so.unlink()
    again = jit.compile_only("tiny", tiny_kernel.source())
    assert again == so and jit.stats["compiles"] == 2 and jit.stats["rebuilds"] == 1
    assert jit._sha256_file(so) == json.loads((so.parent / "manifest.json").read_text())["so_sha256"]
    assert so.stat().st_size == len(good)


def test_cache_dir_default_and_override(monkeypatch, tmp_path):
    from fray import env
    monkeypatch.delenv("FRAY_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert env.cache_dir() == str(tmp_path / "xdg" / "fray")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert env.cache_dir() == str(tmp_path / "home" / ".cache" / "fray")
    monkeypatch.setenv("FRAY_CACHE_DIR", str(tmp_path / "mine"))
    so = jit.compile_only("tiny", tiny_kernel.source())
    assert str(so).startswith(str(tmp_path / "mine" / "jit") + os.sep)


def test_missing_nvcc_is_a_runtime_error(cache, monkeypatch):
    monkeypatch.setenv("FRAY_NVCC_COMPILER", "/nonexistent/bin/nvcc")
    with pytest.raises(RuntimeError, match=r"nvcc not found.*FRAY_NVCC_COMPILER"):
        jit.compile_only("tiny", tiny_kernel.source())


def test_failing_compile_shows_nvcc_message_and_command(cache):
    bad = tiny_kernel.source().replace("return 0;\n}\n\nFRAY_EXPORT int64_t", "return undeclared_thing;\n}\n\nFRAY_EXPORT int64_t")
    with pytest.raises(RuntimeError) as info:
        jit.compile_only("tiny_bad", bad)
    msg = str(info.value)
    assert "undeclared_thing" in msg and "is undefined" in msg  # nvcc's own diagnostic
    assert "command:" in msg and "-gencode=arch=compute_90a,code=sm_90a" in msg
    assert _entries(cache) == [] and list((cache / "jit" / "tmp").iterdir()) == []


def test_missing_cutlass_is_a_runtime_error(cache, monkeypatch):
    monkeypatch.setattr(jit, "cutlass_include", lambda: None)
    src = tiny_kernel.source(include="#include <cute/tensor.hpp>")
    with pytest.raises(RuntimeError, match="pip install nvidia-cutlass"):
        jit.compile_only("tiny_cute", src)
    assert jit.stats["compiles"] == 0


def test_cute_kernel_compiles_against_the_cutlass_package(cache):
    """One CuTe TU (a layout computed on the device), so the CUTLASS include path and its header
    tracking are exercised; small enough to compile in well under a minute."""
    assert jit.cutlass_include() is not None, "nvidia-cutlass missing on this machine"
    src = tiny_kernel.source(tag="cute", include=(
        "#include <cute/tensor.hpp>\n"
        "static_assert(decltype(cute::size(cute::make_layout(cute::make_shape(cute::Int<4>{}, cute::Int<8>{}))))::value"
        " == 32, \"CuTe layout algebra\");"))
    so = jit.compile_only("tiny_cute", src)
    headers = json.loads((so.parent / "manifest.json").read_text())["headers"]
    assert any(h.endswith(os.path.join("cute", "tensor.hpp")) for h in headers)
    assert any(os.path.realpath(h).startswith(os.path.realpath(jit.cutlass_include())) for h in headers)


def test_bad_arguments(cache):
    with pytest.raises(ValueError, match="name"):
        jit.compile_only("has space", tiny_kernel.source())
    with pytest.raises(ValueError, match="source"):
        jit.compile_only("tiny", "")
    with pytest.raises(TypeError, match="flags"):
        jit.compile_only("tiny", tiny_kernel.source(), flags=[3])


def test_build_refuses_without_a_device_and_on_older_archs(cache, monkeypatch):
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="compile_only"):
            jit.build("tiny", tiny_kernel.source())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(RuntimeError, match=r"sm_90a.*sm_80 \(NVIDIA A100"):
        jit.build("tiny", tiny_kernel.source())
    with pytest.raises(RuntimeError, match="sm_80"):
        jit.build_many([("tiny", tiny_kernel.source(), ())])
    assert jit.stats["compiles"] == 0


class _FakeLoader:
    """Stands in for fray._C._jit on a machine without a GPU: records what would be loaded."""

    class Module:
        loaded = []

        def __init__(self, path):
            self.path = path
            _FakeLoader.Module.loaded.append(path)

        def launch(self, *args):
            raise AssertionError("nothing is launched on the CPU")

        def workspace_bytes(self, *args):
            return 0

        def describe(self):
            return "fake"


def test_build_many_compiles_in_parallel_and_returns_failures(cache, monkeypatch, tmp_path):
    log = tmp_path / "nvcc.log"
    monkeypatch.setenv("FRAY_NVCC_COMPILER", str(_wrapper(tmp_path / "nvcc", log)))
    monkeypatch.setenv("FRAY_JIT_MAX_WORKERS", "2")
    monkeypatch.setattr(jit, "_device_arch", lambda device: "90a")
    monkeypatch.setattr(jit, "_loader", lambda: _FakeLoader)
    monkeypatch.setattr(jit, "_loaded", {})
    _FakeLoader.Module.loaded = []
    bad = tiny_kernel.source().replace("return 0;\n}\n\nFRAY_EXPORT int64_t", "return nope;\n}\n\nFRAY_EXPORT int64_t")
    good, broken = jit.build_many([("tiny", tiny_kernel.source(), ()), ("tiny_bad", bad, ())])
    assert isinstance(good, jit.Kernel) and good.describe() == "fake" and good.path.is_file()
    assert isinstance(broken, RuntimeError) and "nope" in str(broken)
    assert _compiles(log) == 2 and _FakeLoader.Module.loaded == [str(good.path)]
    assert jit.build("tiny", tiny_kernel.source()) is good and _compiles(log) == 2  # per-process memo


def test_max_workers_knob(monkeypatch):
    from fray import env
    monkeypatch.setenv("FRAY_JIT_MAX_WORKERS", "3")
    assert env.jit_max_workers() == 3
    monkeypatch.setenv("FRAY_JIT_MAX_WORKERS", "0")
    with pytest.raises(ValueError, match="FRAY_JIT_MAX_WORKERS"):
        env.jit_max_workers()
    monkeypatch.delenv("FRAY_JIT_MAX_WORKERS")
    assert 1 <= env.jit_max_workers() <= 8


def test_loader_reports_unloadable_objects(tmp_path):
    from fray._C import _jit
    with pytest.raises(RuntimeError, match="cannot load"):
        _jit.Module(str(tmp_path / "missing.so"))
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(RuntimeError, match="cannot load"):
        _jit.Module(str(junk))


def test_status_and_include_root():
    s = jit.status()
    assert s["nvcc"] and s["nvcc_release"] != "unknown"
    assert os.path.isfile(os.path.join(jit.include_root(), "cuda", "common", "launch_abi.h"))
    assert os.path.isfile(os.path.join(jit.include_root(), "cuda", "common", "binder.h"))


# --- GPU --------------------------------------------------------------------------------------

def _stream():
    import torch
    return torch.cuda.current_stream().cuda_stream


def _pattern(buf, n):
    """An int32 buffer's first n values as the kernel's uint32 words."""
    return [v & 0xFFFFFFFF for v in buf[:n].cpu().tolist()]


@pytest.mark.gpu
def test_gpu_build_launch_pattern(cache, cuda):
    import torch
    kernel = jit.build("tiny", tiny_kernel.source())
    assert kernel.describe() == "tiny fill v1"
    assert kernel.workspace_bytes((0,), (1000, 0), (), 0, _stream()) == 4000
    with pytest.raises(RuntimeError, match="fray_jit_workspace_bytes refused"):
        kernel.workspace_bytes((0,), (), (), 0, _stream())
    n = 4097
    out = torch.zeros(n, dtype=torch.int32, device=cuda)
    kernel.launch((out.data_ptr(),), (n, 0x1234), (), out.device.index, _stream())
    assert _pattern(out, n) == tiny_kernel.expected(n, 0x1234)
    assert jit.build("tiny", tiny_kernel.source()) is kernel  # per-process memo
    with pytest.raises(RuntimeError, match="tiny: n must be >= 0, got -5"):
        kernel.launch((out.data_ptr(),), (-5, 0), (), 0, _stream())
    with pytest.raises(RuntimeError, match="expected 1 ptr and 2 ints"):
        kernel.launch((out.data_ptr(),), (n,), (), 0, _stream())
    with pytest.raises(TypeError):
        kernel.launch([out.data_ptr()], (n, 0), (), 0, _stream())


@pytest.mark.gpu
def test_gpu_side_stream(cache, cuda):
    import torch
    kernel = jit.build("tiny", tiny_kernel.source())
    n = 1 << 20
    out = torch.zeros(n, dtype=torch.int32, device=cuda)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1 << 20)  # the launch must queue behind this, on the side stream
        kernel.launch((out.data_ptr(),), (n, 99), (), 0, side.cuda_stream)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    assert _pattern(out, n) == tiny_kernel.expected(n, 99)


@pytest.mark.gpu
def test_gpu_graph_capture(cache, cuda):
    import torch
    kernel = jit.build("tiny", tiny_kernel.source())
    n = 3000
    out = torch.zeros(n, dtype=torch.int32, device=cuda)
    kernel.launch((out.data_ptr(),), (n, 1), (), 0, _stream())  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.launch((out.data_ptr(),), (n, 77), (), 0, _stream())
    out.zero_()
    torch.cuda.synchronize()
    assert _pattern(out, n) == [0] * n  # captured, not run
    graph.replay()
    torch.cuda.synchronize()
    assert _pattern(out, n) == tiny_kernel.expected(n, 77)


_WARM = """
import json, sys, time
sys.path[:0] = %(path)r
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()  # CUDA context up before timing
import fray.jit as jit
import tiny_kernel
t0 = time.perf_counter()
kernel = jit.build("tiny", tiny_kernel.source())
load_s = time.perf_counter() - t0
out = torch.zeros(100, dtype=torch.int32, device="cuda")
kernel.launch((out.data_ptr(),), (100, 3), (), 0, torch.cuda.current_stream().cuda_stream)
ok = [v & 0xFFFFFFFF for v in out.cpu().tolist()] == tiny_kernel.expected(100, 3)
print(json.dumps({"load_s": load_s, "compiles": jit.stats["compiles"], "ok": ok}))
"""


@pytest.mark.gpu
def test_gpu_second_process_finds_the_cache_warm(cache, cuda, tmp_path):
    jit.build("tiny", tiny_kernel.source())
    script = tmp_path / "warm.py"
    script.write_text(_WARM % {"path": [p for p in sys.path if p]})
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, FRAY_CACHE_DIR=str(cache), FRAY_JIT_DEBUG="1"),
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 0, out.stderr
    # FRAY_JIT_DEBUG prints why an entry was not taken ("building <entry>: <problem>")
    why = [line for line in out.stderr.splitlines() if line.startswith("fray.jit: building")]
    assert "compiling" not in out.stderr, "\n".join(why)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print("warm-cache load of the tiny kernel: %.1f ms" % (1e3 * r["load_s"]))
    assert r["ok"] and r["compiles"] == 0
    assert r["load_s"] <= 0.050, "warm-cache build() took %.1f ms (budget 50 ms)" % (1e3 * r["load_s"])


@pytest.mark.gpu
def test_gpu_eight_processes_race_and_launch(cache, cuda, tmp_path):
    _race(cache, tmp_path, "launch")


@pytest.mark.gpu
def test_gpu_tune_jit_candidates_end_to_end(cache, cuda, monkeypatch, capfd):
    """fray.tune over real JIT candidates: parallel builds, a pattern check, L2-flushed timing, the
    record on disk; under graph capture an untuned bucket takes the heuristic and still captures."""
    import torch
    import fray.tune as tune
    monkeypatch.setattr(tune, "_memo", {})
    monkeypatch.setenv("FRAY_PRINT_AUTOTUNE", "1")
    n = 1 << 24
    out = torch.zeros(n, dtype=torch.int32, device=cuda)
    want = torch.tensor(tiny_kernel.expected(4096, 11), dtype=torch.int64)
    last = (11 ^ (((n - 1) * 2654435761) & 0xFFFFFFFF)) & 0xFFFFFFFF
    candidates = [{"blocks": b} for b in (1, 132, 1056)]

    def build(configs):
        return jit.build_many([("tiny_tune", tiny_kernel.source(tag="tune"), ("-DTINY_BLOCKS=%d" % c["blocks"],))
                               for c in configs])

    def run(config, kernel):
        kernel.launch((out.data_ptr(),), (n, 11), (), 0, _stream())

    def check(config, kernel):
        out.zero_()
        run(config, kernel)
        got = out[:4096].cpu().to(torch.int64) & 0xFFFFFFFF
        assert torch.equal(got, want) and int(out[-1]) & 0xFFFFFFFF == last, "wrong fill"

    chosen = tune.choose("tiny_fill", "n16M", "u32", candidates, build=build, run=run, check=check,
                         default=candidates[0], bytes=4.0 * n)
    err = capfd.readouterr().err
    assert chosen != {"blocks": 1}, err  # one CTA cannot be the fastest way to write 64 MB
    assert "tuning tiny_fill n16M u32 over 3 configs" in err and "GB/s" in err
    store = cache / "tune" / (tune._slug(torch.cuda.get_device_name()) + ".json")
    assert any(r["config"] == chosen for r in json.loads(store.read_text()).values())

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        config = tune.choose("tiny_fill", "n16M_other", "u32", candidates, build=build, run=run, check=check,
                             default=candidates[1], bytes=4.0 * n)
        kernel = build([config])[0]
        run(config, kernel)
    assert config == candidates[1]
    assert "heuristic (capturing)" in capfd.readouterr().err
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[:4096].cpu().to(torch.int64) & 0xFFFFFFFF, want)


def test_cutlass_found_through_frays_own_headers(cache, monkeypatch):
    """A GEMM unit includes only cuda/gemm/gemm_sm90.cuh, which includes cute/: the CUTLASS include
    path must follow Fray's headers (without it nvcc fails with 'cute/tensor.hpp: No such file')."""
    assert jit._uses_cutlass('#include "cuda/gemm/gemm_sm90.cuh"\n')
    assert not jit._uses_cutlass('#include "cuda/common/launch_abi.h"\n#include <cuda_runtime.h>\n')
    monkeypatch.setattr(jit, "cutlass_include", lambda: None)
    with pytest.raises(RuntimeError, match="pip install nvidia-cutlass"):
        jit.compile_only("tiny_gemm_include", tiny_kernel.source(include='#include "cuda/gemm/gemm_sm90.cuh"'))
    assert jit.stats["compiles"] == 0
