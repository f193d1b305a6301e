"""SASS post-passes over a JIT kernel's shared object: fray.jit applies one when a build names it
(`sass_pass=`), to the freshly built .so, before the cache entry's manifest records its digest.

ffma_interleave (FRAY_DISABLE_FFMA_INTERLEAVE): the pass DeepGEMM describes for its block-scaled
FP8 GEMMs. Their mainloop promotes each 128-deep slice of the tensor cores' accumulator into fp32
registers with one FFMA per accumulator register (acc += partial * scale): long runs of
back-to-back FFMAs that ptxas marks with operand-reuse flags and with the "no yield" hint, so the
warp keeps the issue slot through the whole run while the other warpgroup's wgmma waits behind it.
DeepGEMM found that clearing both hints on part of the run lets the scheduler interleave the
promotion with the other warpgroup's MMA issue (the reuse flags must go too: a warp switched out
loses its operand reuse cache). This pass is our own implementation of that rewrite:

  * runs: at least MIN_RUN consecutive FFMA instructions of one function (cuobjdump -sass);
  * edited: in the first LEAD_NUM / LEAD_DEN of a run, each FFMA that carries a reuse flag and
    writes a register no earlier FFMA of the run wrote (the promotion writes each accumulator
    once): its reuse flags (bits 58-61 of the instruction's upper 64-bit word, one per source
    operand) and its no-yield bit (bit 45) are cleared;
  * patched in place: the .so's embedded sm_90a cubins (nvcc --no-compress: a compressed fatbin
    has none in the clear, and the pass refuses it) are parsed as ELF, each edited instruction
    found at its function's .text section offset plus its listed offset, and its 16 bytes checked
    against the listing before anything is written; any mismatch leaves the file untouched.

Both hints only steer scheduling and the operand cache: no edit changes what an instruction
computes. Whether the rewrite gains anything with nvcc 13 is a measurement (bench/quant, on / off).
Measured on an H100 at 9c88994 (2026-12-07, bench/results/h100/quant.jsonl), at five block-scaled
shapes: on equals off within the rounds' spread at four (M 64 and 128 at N 7168 K 16384, 4096 x
2112 x 7168, 4096 x 7168 x 16384: -2..+0.3 %) and gains 3 % at 4096 x 24576 x 1536. That is too
little to build every promoting kernel through a binary rewrite by default, and its bit-equality
GPU test has not finished yet, so the pass stays off (FFMA_INTERLEAVE_DEFAULT);
FRAY_DISABLE_FFMA_INTERLEAVE=0 turns it on (=1 keeps it off).
"""
import os
import pathlib
import re
import shutil
import struct
import subprocess

from fray import env

MIN_RUN = 16
LEAD_NUM, LEAD_DEN = 9, 16
REUSE_BITS = 0xF << 58  # upper word: the operand-reuse flags
NO_YIELD_BIT = 1 << 45  # upper word
VERSION = 1
FFMA_INTERLEAVE_DEFAULT = False  # measured: within noise but for +3 % at one shape (the module docstring)

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);?\s*/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")
_UPPER = re.compile(r"^\s*/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
EM_CUDA = 190


def ffma_interleave_enabled():
    """The pass's switch: FRAY_DISABLE_FFMA_INTERLEAVE=1 off, =0 on, unset the default."""
    disabled = env.disable_ffma_interleave()
    return FFMA_INTERLEAVE_DEFAULT if disabled is None else not disabled


def cuobjdump(nvcc=None):
    """The cuobjdump the pass lists SASS with: FRAY_CUOBJDUMP, the one beside nvcc, Triton's copy,
    PATH, /usr/local/cuda/bin; RuntimeError naming where it looked when none is there."""
    seen = []
    for c in (env.cuobjdump_override(),
              os.path.join(os.path.dirname(os.path.realpath(nvcc)), "cuobjdump") if nvcc else None,
              _triton_cuobjdump(), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if c:
            seen.append(c)
            if os.path.isfile(c) and os.access(c, os.X_OK):
                return c
    raise RuntimeError("fray.jit: the SASS pass needs cuobjdump (looked at %s): set FRAY_CUOBJDUMP, or "
                       "FRAY_DISABLE_FFMA_INTERLEAVE=1" % ", ".join(seen))


def _triton_cuobjdump():
    try:
        import triton
    except ImportError:
        return None
    return str(pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def listing(path, tool):
    out = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("fray.jit: %s -sass %s failed (rc %d): %s" % (tool, path, out.returncode,
                                                                           out.stderr.strip()[-2000:]))
    return out.stdout


def parse(text):
    """{function: [(offset, instruction text, lower word, upper word), ...]} from cuobjdump -sass
    (every sm_90 instruction is listed as its text with the lower 64-bit word, then a line with the
    upper word). A function listed by several embedded cubins keeps its first listing."""
    functions, current, pending, seen = {}, None, None, set()
    for line in text.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = None if m.group(1) in seen else []
            if current is not None:
                functions[m.group(1)] = current
                seen.add(m.group(1))
            pending = None
            continue
        if current is None:
            continue
        m = _INSTR.match(line)
        if m:
            pending = (int(m.group(1), 16), m.group(2).strip(), int(m.group(3), 16))
            continue
        m = _UPPER.match(line)
        if m and pending is not None:
            current.append(pending + (int(m.group(1), 16),))
            pending = None
    return functions


def _operands(text):
    """An instruction's words without its predicate: [opcode, destination, sources...]."""
    words = text.split()
    return words[1:] if words and words[0].startswith("@") else words


def _opcode(text):
    words = _operands(text)
    return words[0] if words else ""


def _dest(text):
    words = _operands(text)
    return words[1].rstrip(",").split(".")[0] if len(words) > 1 else ""


def ffma_runs(instrs):
    """[(first index, end index)] of the runs of at least MIN_RUN consecutive FFMAs."""
    runs, start = [], None
    for i, ins in enumerate(instrs + [(0, "", 0, 0)]):
        if _opcode(ins[1]).startswith("FFMA"):
            if start is None:
                start = i
        else:
            if start is not None and i - start >= MIN_RUN:
                runs.append((start, i))
            start = None
    return runs


def interleave_edits(instrs):
    """[(index, new upper word)] of the ffma_interleave rewrite over one function's listing."""
    edits = []
    for start, end in ffma_runs(instrs):
        lead = start + (end - start) * LEAD_NUM // LEAD_DEN
        written = set()
        for i in range(start, lead):
            _, text, _, upper = instrs[i]
            dest = _dest(text)
            if upper & REUSE_BITS and dest not in written:
                edits.append((i, upper & ~REUSE_BITS & ~NO_YIELD_BIT))
            written.add(dest)
    return edits


def _elf_sections(data, base):
    """{section name: (file offset, size)} of the ELF64 image at data[base:]."""
    (shoff,) = struct.unpack_from("<Q", data, base + 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, base + 0x3A)
    headers = []
    for i in range(shnum):
        name_off, _, _, _, off, size = struct.unpack_from("<IIQQQQ", data, base + shoff + i * shentsize)
        headers.append((name_off, off, size))
    str_off = headers[shstrndx][1]
    out = {}
    for name_off, off, size in headers:
        start = base + str_off + name_off
        name = data[start:data.index(b"\0", start)].decode(errors="replace")
        out[name] = (base + off, size)
    return out


def embedded_cubins(data):
    """File offsets of the CUDA ELF images (e_machine EM_CUDA) embedded in a host shared object."""
    found, at = [], data.find(b"\x7fELF\x02\x01\x01", 1)
    while at != -1:
        if len(data) >= at + 0x40 and struct.unpack_from("<H", data, at + 0x12)[0] == EM_CUDA:
            found.append(at)
        at = data.find(b"\x7fELF\x02\x01\x01", at + 1)
    return found


def apply_ffma_interleave(path, tool):
    """Rewrites `path` (a JIT .so) in place; returns {"runs", "edits", "functions"} (zeros when the
    kernels hold no FFMA run). RuntimeError, the file untouched, when a listed instruction is not
    where the cubin's ELF puts it or the device code is compressed."""
    functions = parse(listing(path, tool))
    plan = {name: (instrs, interleave_edits(instrs)) for name, instrs in functions.items()}
    plan = {name: p for name, p in plan.items() if p[1]}
    runs = sum(len(ffma_runs(instrs)) for instrs, _ in plan.values())
    if not plan:
        return {"runs": runs, "edits": 0, "functions": 0}
    data = bytearray(pathlib.Path(path).read_bytes())
    cubins = embedded_cubins(data)
    if not cubins:
        raise RuntimeError("fray.jit: %s holds no uncompressed cubin (build it with --no-compress)" % path)
    writes = []
    for name, (instrs, edits) in plan.items():
        places = [s[".text." + name] for s in (_elf_sections(data, c) for c in cubins) if ".text." + name in s]
        if not places:
            raise RuntimeError("fray.jit: no .text.%s in the cubins of %s" % (name, path))
        for text_off, size in places:
            for i, upper in edits:
                off, text, lower, old_upper = instrs[i]
                at = text_off + off
                if off + 16 > size or bytes(data[at:at + 16]) != struct.pack("<QQ", lower, old_upper):
                    raise RuntimeError("fray.jit: %s+0x%x (%s) in %s is not what cuobjdump listed: not patched"
                                       % (name, off, text, path))
                writes.append((at + 8, upper))
    for at, upper in writes:
        struct.pack_into("<Q", data, at, upper)
    tmp = pathlib.Path(str(path) + ".sass")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, path)
    return {"runs": runs, "edits": len(writes), "functions": len(plan)}


PASSES = {"ffma_interleave": apply_ffma_interleave}
