"""fray.jit: CUDA kernels compiled at run time into a content-hash cache, loaded without torch.

A JIT kernel is a shared object that nvcc builds from one generated translation unit holding host
launch code and device code (CUTLASS 3.x kernels build their parameters and TMA descriptors on the
host, so a bare cubin loaded with cuModuleLoadData would leave that work to Python). It exports,
with C linkage (cuda/common/launch_abi.h):

    int     fray_jit_launch(const FrayArgs* args, char* err, int32_t err_len);   // required
    int64_t fray_jit_workspace_bytes(const FrayArgs* args);                      // optional
    const char* fray_jit_describe(void);                                         // optional

fray._C._jit dlopens it and calls fray_jit_launch through cuda/common/binder.h, the binder the
ahead-of-time families use, so an eager launch costs one C++ call.

The cache (FRAY_CACHE_DIR/jit, see fray.env) holds one directory per kernel, named
<name>-<key>, where key is a sha256 over the source, the full nvcc command (flags, include roots,
arch), the nvcc path and `nvcc --version`, the host compiler's identity and Fray's version. Its
manifest records the sha256 of the .so and of every header nvcc read (its -MD dependency list,
less the toolkit's and the system's own headers, which the nvcc and host-compiler identities cover);
both are verified before an entry is used (a header whose size, mtime and inode are unchanged is not
re-hashed), so a changed header byte or a truncated .so rebuilds the entry. Builds happen in a temporary directory inside the cache, under a per-key file lock, and are
renamed into place: N processes that want one kernel compile it once.
"""
import concurrent.futures
import functools
import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from fray import env
from fray.jit import sass

__all__ = ["build", "build_many", "compile_only", "include_root", "cutlass_include", "nvcc_path",
           "Kernel", "stats", "status"]

# Bumped when the layout of an entry or of the key changes (old entries are then ignored).
_FORMAT = 1
_SO = "kernel.so"
_SRC = "kernel.cu"
_DEPS = "kernel.d"
_MANIFEST = "manifest.json"
SUPPORTED_CAPABILITIES = {(9, 0): "90a"}

# Per-process counters, for tests and FRAY_JIT_DEBUG: compiles run, entries found valid, entries
# found stale or corrupted (and rebuilt).
stats = {"compiles": 0, "hits": 0, "rebuilds": 0}
_stats_lock = threading.Lock()


def _count(what):
    with _stats_lock:
        stats[what] += 1


def _debug(msg):
    if env.jit_debug():
        print("fray.jit: " + msg, file=sys.stderr, flush=True)


# --- where things are ----------------------------------------------------------------------------

def include_root():
    """The directory holding Fray's cuda/ headers at run time: fray/include in a wheel, the Bazel
    runfiles and the GPU bundle (copied there by //python/fray:jit_headers), else the source
    tree's root (python/fray/../..)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for root in (os.path.join(package, "include"), os.path.dirname(os.path.dirname(package))):
        if os.path.isfile(os.path.join(root, "cuda", "common", "launch_abi.h")):
            return root
    raise RuntimeError("fray.jit: Fray's CUDA headers (cuda/common/launch_abi.h) are not under %s/include "
                       "nor the source tree %s: reinstall the fray wheel or run from a checkout"
                       % (package, os.path.dirname(os.path.dirname(package))))


@functools.lru_cache(maxsize=None)
def _cutlass_include_cached():
    import importlib.util
    # Located, not imported: importing cutlass_library runs its kernel generator modules (~23 ms),
    # a large part of a warm first call's budget.
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return None
    root = os.path.join(os.path.dirname(os.path.abspath(spec.origin)), "source")
    inc = os.path.join(root, "include")
    return inc if os.path.isfile(os.path.join(inc, "cute", "tensor.hpp")) else None


def cutlass_include():
    """CUTLASS/CuTe's include directory from the nvidia-cutlass package, or None when absent."""
    return _cutlass_include_cached()


def _require_cutlass():
    inc = cutlass_include()
    if inc is None:
        raise RuntimeError("fray.jit: the kernel includes CUTLASS/CuTe headers but the nvidia-cutlass package "
                           "is not installed (no cutlass_library package with source/include found): "
                           "pip install nvidia-cutlass")
    return inc


@functools.lru_cache(maxsize=None)
def _find_nvcc(candidates):
    for cand in candidates:
        path = cand if os.sep in cand else shutil.which(cand)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    return None


def nvcc_path():
    """The nvcc the JIT runs (FRAY_NVCC_COMPILER, $CUDA_HOME/bin/nvcc, PATH, /usr/local/cuda)."""
    candidates = tuple(env.nvcc_candidates())
    path = _find_nvcc(candidates)
    if path is None:
        raise RuntimeError("fray.jit: nvcc not found (looked for %s): install the CUDA toolkit (12.4 or newer, "
                           "for sm_90a) or point FRAY_NVCC_COMPILER at nvcc" % ", ".join(candidates))
    return path


def _run_versions(paths):
    """`<path> --version` of each path, run at once (each costs 5-10 ms of a warm first call)."""
    procs = []
    for path in paths:
        try:
            procs.append(subprocess.Popen([path, "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        except OSError as exc:
            procs.append(exc)
    out = []
    for path, proc in zip(paths, procs):
        if isinstance(proc, OSError):
            out.append((None, str(proc)))
            continue
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out.append((None, "timed out"))
            continue
        out.append((stdout.strip(), None) if proc.returncode == 0 else (None, "rc %d: %s" % (proc.returncode, stderr.strip())))
    return out


@functools.lru_cache(maxsize=None)
def _identities(nvcc):
    """(`nvcc --version`, the host compiler's path and version). nvcc runs the host compiler it
    finds on PATH (no -ccbin), which compiles the host half of every kernel, so both are part of
    the key."""
    host = shutil.which("g++") or shutil.which("c++")
    (nv, nv_err), *rest = _run_versions([nvcc] + ([host] if host else []))
    if nv is None:
        raise RuntimeError("fray.jit: %s --version failed (%s): point FRAY_NVCC_COMPILER at a working nvcc" % (nvcc, nv_err))
    if not host:
        return nv, "none"
    text = rest[0][0] or ""
    return nv, "%s %s" % (os.path.realpath(host), text.splitlines()[0] if text else "")


def _tool_version(nvcc):
    return _identities(nvcc)[0]


def _nvcc_release(version_text):
    m = re.search(r"release (\d+\.\d+)", version_text)
    return m.group(1) if m else "unknown"


def _cache_root():
    return pathlib.Path(env.cache_dir()) / "jit"


def _fray_version():
    import fray
    return fray.__version__


# --- the command and the key -----------------------------------------------------------------

_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def _uses_cutlass(source):
    """Whether the unit includes CUTLASS/CuTe, directly or through Fray's own headers (a GEMM unit
    includes only cuda/gemm/gemm_sm90.cuh, which includes cute/)."""
    return any(name.startswith(("cutlass/", "cute/")) or (name.startswith("cuda/") and _header_uses_cutlass(name))
               for name in _INCLUDE.findall(source))


@functools.lru_cache(maxsize=None)
def _header_uses_cutlass(name):
    """The same for Fray's header `name` under include_root(), its own cuda/ includes followed
    (each once); read once per process, so a build's cache lookup does not re-read headers."""
    pending, seen = [name], {name}
    while pending:
        try:
            with open(os.path.join(include_root(), pending.pop())) as f:
                text = f.read()
        except OSError:
            continue
        for inc in _INCLUDE.findall(text):
            if inc.startswith(("cutlass/", "cute/")):
                return True
            if inc.startswith("cuda/") and inc not in seen:
                seen.add(inc)
                pending.append(inc)
    return False


def _command(nvcc, arch, flags, source, sass_pass=None):
    """The nvcc command (output names relative to the build directory); a SASS pass needs the
    device code uncompressed in the .so (fray.jit.sass patches it in place)."""
    cmd = [nvcc, "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
           "--expt-relaxed-constexpr", "--expt-extended-lambda", "-lineinfo",
           "-gencode=arch=compute_%s,code=sm_%s" % (arch, arch), "-DNDEBUG", "-I" + include_root()]
    if _uses_cutlass(source):
        inc = _require_cutlass()
        cmd.append("-I" + inc)
        util = os.path.join(os.path.dirname(inc), "tools", "util", "include")
        if os.path.isdir(util):
            cmd.append("-I" + util)
    if env.ptxas_verbose():
        cmd += ["-Xptxas", "-v"]
    cmd += list(flags)
    if sass_pass:
        cmd.append("--no-compress")
    cmd += ["-MD", "-MF", _DEPS, "-o", _SO, _SRC]
    return cmd


def _key(name, source, cmd, nvcc, arch, sass_pass=None):
    ident = {
        "format": _FORMAT,
        "name": name,
        "source": source,
        "command": cmd[1:],
        "nvcc": os.path.realpath(nvcc),
        "nvcc_version": _tool_version(nvcc),
        "host_compiler": _identities(nvcc)[1],
        "arch": arch,
        "fray": _fray_version(),
    }
    if sass_pass:
        ident["sass_pass"] = [sass_pass, sass.VERSION]
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-")


def _check_name(name):
    if not isinstance(name, str) or not 0 < len(name) <= 96 or not _NAME_CHARS.issuperset(name):
        raise ValueError("fray.jit: name must be 1-96 characters of [A-Za-z0-9_.+-] (it names the cache entry), "
                         "got %r" % (name,))


# --- entries ---------------------------------------------------------------------------------

def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stat_sig(st):
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _header_record(path):
    """[sha256, size, mtime_ns, inode] of a header as the manifest keeps it."""
    return [_sha256_file(path)] + _stat_sig(os.stat(path))


def _header_unchanged(path, record):
    """A header whose size, mtime and inode are those recorded is taken as unchanged; any other
    is hashed. A GEMM kernel reads ~490 CUTLASS/CuTe/Fray headers: hashing them all costs 50-130 ms
    (H200 machine budget for a warm first call: 50 ms), a stat of each a few ms."""
    st = os.stat(path)
    if _stat_sig(st) == list(record[1:4]):
        return True
    return _sha256_file(path) == record[0]


def _parse_deps(text):
    """The prerequisites of a make rule as nvcc -MD writes it ("a.o: x.h y\\ z.h \\\\\\n ...")."""
    text = text.replace("\\\n", " ")
    _, _, prereqs = text.partition(": ")
    out, cur, i = [], [], 0
    while i < len(prereqs):
        c = prereqs[i]
        if c == "\\" and i + 1 < len(prereqs) and prereqs[i + 1] == " ":
            cur.append(" ")
            i += 2
            continue
        if c.isspace():
            if cur:
                out.append("".join(cur))
                cur = []
        else:
            cur.append(c)
        i += 1
    if cur:
        out.append("".join(cur))
    return out


def _tracked_headers(dep_paths, build_dir):
    """The headers whose bytes the entry depends on: every dependency but the source itself, the
    CUDA toolkit's own headers (the directory of cuda_runtime.h, which nvcc adds itself) and the
    system's, which `nvcc --version` and the host compiler's identity in the key already cover.
    Paths are kept as nvcc opened them (through the runfiles' or the bundle's links, not resolved)
    so that a link pointing elsewhere later is seen as a changed header."""
    full = [os.path.abspath(os.path.join(build_dir, p)) for p in dep_paths]
    skip = ["/usr/include/", "/usr/lib/gcc/"]
    for f in full:
        if os.path.basename(f) == "cuda_runtime.h":
            skip.append(os.path.dirname(f) + os.sep)
    source = os.path.abspath(os.path.join(build_dir, _SRC))
    return {f: _header_record(f) for f in full if f != source and not f.startswith(tuple(skip))}


def _entry_problem(entry, key):
    """None when `entry` is a complete build of `key` whose .so and headers are unchanged, else
    why not (for FRAY_JIT_DEBUG)."""
    try:
        with open(entry / _MANIFEST) as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        return "no entry"
    except (OSError, ValueError) as exc:
        return "unreadable manifest (%s)" % exc
    if manifest.get("key") != key or manifest.get("format") != _FORMAT:
        return "manifest of another key"
    so = entry / _SO
    try:
        if so.stat().st_size != manifest.get("so_bytes"):
            return "kernel.so truncated or replaced (size)"
        if _sha256_file(so) != manifest.get("so_sha256"):
            return "kernel.so corrupted (checksum)"
    except OSError as exc:
        return "kernel.so unreadable (%s)" % exc
    for path, record in manifest.get("headers", {}).items():
        try:
            if not _header_unchanged(path, record):
                return "header changed: %s" % path
        except OSError:
            return "header gone: %s" % path
    return None


class _FileLock:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        import fcntl
        self.fh = open(self.path, "a+")
        fcntl.flock(self.fh.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        import fcntl
        fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
        self.fh.close()


def _remove_entry(entry, root):
    """Moves a stale entry aside (one rename, so no reader sees half of it), then deletes it."""
    trash = pathlib.Path(tempfile.mkdtemp(prefix="stale-", dir=root / "tmp"))
    try:
        os.replace(entry, trash / "entry")
    except FileNotFoundError:
        pass
    shutil.rmtree(trash, ignore_errors=True)


def _compile(name, source, cmd, key, entry, root, nvcc, sass_pass=None):
    build_dir = pathlib.Path(tempfile.mkdtemp(prefix=name + "-", dir=root / "tmp"))
    try:
        (build_dir / _SRC).write_text(source)
        shown = shlex.join(cmd)
        print("fray.jit: compiling %s [%s] for sm_%s" % (name, key[:12], _arch_of(cmd)), file=sys.stderr, flush=True)
        if env.jit_debug():
            print("fray.jit: source of %s:\n%s" % (name, source), file=sys.stderr, flush=True)
        if env.print_nvcc_command():
            print("fray.jit: (cd %s && %s)" % (build_dir, shown), file=sys.stderr, flush=True)
        start = time.monotonic()
        try:
            out = subprocess.run(cmd, cwd=build_dir, capture_output=True, text=True)
        except OSError as exc:
            raise RuntimeError("fray.jit: cannot run nvcc (%s): %s\ncommand: %s" % (nvcc, exc, shown)) from None
        seconds = time.monotonic() - start
        _count("compiles")
        if out.returncode != 0:
            message = (out.stderr + out.stdout).strip()
            if len(message) > 12000:
                message = "...\n" + message[-12000:]
            raise RuntimeError("fray.jit: nvcc failed to compile %s (rc %d)\ncommand: (cd %s && %s)\n%s"
                               % (name, out.returncode, build_dir, shown, message))
        if env.ptxas_verbose() and out.stderr.strip():
            print(out.stderr.strip(), file=sys.stderr, flush=True)
        so = build_dir / _SO
        passed = None
        if sass_pass:
            passed = dict(sass.PASSES[sass_pass](so, sass.cuobjdump(nvcc)), name=sass_pass, version=sass.VERSION)
            print("fray.jit: %s on %s: %d instructions edited, FFMA runs: %d" % (sass_pass, name, passed["edits"],
                                                                                  passed["runs"]),
                  file=sys.stderr, flush=True)
        manifest = {
            "format": _FORMAT,
            "key": key,
            "name": name,
            "so_sha256": _sha256_file(so),
            "so_bytes": so.stat().st_size,
            "headers": _tracked_headers(_parse_deps((build_dir / _DEPS).read_text()), build_dir),
            "command": cmd,
            "nvcc_version": _tool_version(nvcc),
            "compile_s": round(seconds, 3),
            "sass_pass": passed,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with open(build_dir / _MANIFEST, "w") as fh:
            json.dump(manifest, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        if entry.exists():
            _remove_entry(entry, root)
        os.replace(build_dir, entry)
        _debug("built %s in %.1f s -> %s" % (name, seconds, entry))
    finally:
        if build_dir.exists():
            shutil.rmtree(build_dir, ignore_errors=True)


def _arch_of(cmd):
    for c in cmd:
        m = re.match(r"-gencode=arch=compute_(\w+),", c)
        if m:
            return m.group(1)
    return "?"


def _compile_cached(name, source, arch, flags, sass_pass=None):
    """(path of the cached .so, key): compiles under the entry's lock when no valid entry exists."""
    _check_name(name)
    if not isinstance(source, str) or not source:
        raise ValueError("fray.jit: source must be a non-empty str, got %r" % type(source).__name__)
    flags = tuple(flags)
    if not all(isinstance(f, str) for f in flags):
        raise TypeError("fray.jit: flags must be strings, got %r" % (flags,))
    if sass_pass is not None and sass_pass not in sass.PASSES:
        raise ValueError("fray.jit: sass_pass must be one of %s or None, got %r" % (sorted(sass.PASSES), sass_pass))
    nvcc = nvcc_path()
    cmd = _command(nvcc, arch, flags, source, sass_pass)
    key = _key(name, source, cmd, nvcc, arch, sass_pass)
    root = _cache_root()
    entry = root / ("%s-%s" % (name, key[:32]))
    problem = _entry_problem(entry, key)
    if problem is None:
        _count("hits")
        _debug("cache hit %s" % entry)
        return entry / _SO, key
    for sub in ("tmp", "locks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    with _FileLock(root / "locks" / (key[:32] + ".lock")):
        problem = _entry_problem(entry, key)  # another process may have built it meanwhile
        if problem is None:
            _count("hits")
            return entry / _SO, key
        if problem != "no entry":
            _count("rebuilds")
        _debug("building %s: %s" % (entry, problem))
        _compile(name, source, cmd, key, entry, root, nvcc, sass_pass)
    return entry / _SO, key


# --- public API --------------------------------------------------------------------------------

def compile_only(name, source, *, arch="90a", flags=(), sass_pass=None):
    """Compiles `source` for sm_<arch> into the cache (or finds it there) and returns the cached
    .so's path; nothing is loaded, so this needs no GPU (CI, cache warming). sass_pass: as build."""
    return _compile_cached(name, source, arch, flags, sass_pass)[0]


def _device_arch(device):
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("fray.jit.build: no CUDA device (torch.cuda.is_available() is False); "
                           "fray.jit.compile_only compiles without one")
    index = torch.cuda.current_device() if device is None else int(device)
    cap = torch.cuda.get_device_capability(index)
    arch = SUPPORTED_CAPABILITIES.get(tuple(cap))
    if arch is None:
        raise RuntimeError("fray.jit: JIT kernels target sm_90a (Hopper: H100/H200, wgmma and TMA); cuda:%d is "
                           "sm_%d%d (%s)" % (index, cap[0], cap[1], torch.cuda.get_device_name(index)))
    return arch


class Kernel:
    """A loaded JIT kernel. launch(ptrs, ints, floats, device, stream) is the loader's C++ method
    itself (no Python frame in between); RuntimeError carries the kernel's own message.
    workspace_bytes(ptrs, ints, floats, device, stream): the device workspace the launch needs
    (0 when the kernel does not export fray_jit_workspace_bytes; the caller passes the buffer as
    the last ptr); RuntimeError when the kernel refuses the arguments (a negative answer)."""

    __slots__ = ("name", "path", "key", "launch", "workspace_bytes", "_module")

    def __init__(self, name, path, key, module):
        self.name = name
        self.path = pathlib.Path(path)
        self.key = key
        self._module = module
        self.launch = module.launch
        self.workspace_bytes = module.workspace_bytes

    def describe(self):
        return self._module.describe()

    def __repr__(self):
        return "fray.jit.Kernel(%r, %s)" % (self.name, self.path)


def _loader():
    try:
        from fray._C import _jit
    except ImportError as exc:
        raise RuntimeError("fray.jit: the loader extension fray._C._jit is not built (%s): build //python/fray/_C:jit "
                           "or install the fray wheel" % exc) from None
    return _jit


_loaded = {}
_loaded_lock = threading.Lock()


def build(name, source, *, flags=(), device=None, sass_pass=None):
    """Compiles `source` for the current (or given) device, or finds it in the cache, loads it and
    returns a Kernel. Refuses devices other than sm_90 with a RuntimeError. Cached per process:
    a second call with the same arguments returns the same Kernel without touching the disk.
    sass_pass: None, or a pass of fray.jit.sass.PASSES run over the built .so (part of the key)."""
    arch = _device_arch(device)
    memo = (name, source, tuple(flags), arch, sass_pass)
    with _loaded_lock:
        kernel = _loaded.get(memo)
    if kernel is not None:
        return kernel
    path, key = _compile_cached(name, source, arch, flags, sass_pass)
    module = _loader().Module(str(path))
    kernel = Kernel(name, path, key, module)
    with _loaded_lock:
        return _loaded.setdefault(memo, kernel)


def build_many(items, *, device=None):
    """[(name, source, flags[, sass_pass]), ...] -> [Kernel or the Exception its build raised],
    compiled in parallel by FRAY_JIT_MAX_WORKERS nvcc processes (the tuner's candidates)."""
    items = [tuple(it) for it in items]
    if not items:
        return []
    _device_arch(device)  # refuse an unsupported device once, before any compile

    def one(item):
        name, source, flags = item[:3]
        try:
            return build(name, source, flags=flags, device=device, sass_pass=item[3] if len(item) > 3 else None)
        except Exception as exc:  # one failing candidate must not stop the others
            return exc

    workers = min(env.jit_max_workers(), len(items))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, items))


def status():
    """{"nvcc": path or why not, "nvcc_release", "cutlass": include dir or None, "cache": dir}
    for `fray ops`; never raises."""
    out = {"cache": str(_cache_root())}
    try:
        nvcc = nvcc_path()
        out["nvcc"] = nvcc
        out["nvcc_release"] = _nvcc_release(_tool_version(nvcc))
    except RuntimeError as exc:
        out["nvcc"] = None
        out["nvcc_error"] = str(exc)
    out["cutlass"] = cutlass_include()
    try:
        out["include_root"] = include_root()
    except RuntimeError as exc:
        out["include_root"] = None
        out["include_error"] = str(exc)
    return out
