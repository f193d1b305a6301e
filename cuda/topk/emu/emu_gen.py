"""What the emulations' gen.py scripts share (cuda/topk/emu, cuda/sampling/emu): stage a copy of
cuda/common and of a family's kernel headers under OUT, each header with the cooperative_groups
include dropped, the script's own edits made, and no inline asm left for the host compiler."""
import os
import re
import shutil

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def stage(out, family):
    """OUT/cuda/<family>/ (empty) and a copy of cuda/common; returns OUT/cuda."""
    dst = os.path.join(out, "cuda")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(os.path.join(dst, family))
    shutil.copytree(os.path.join(ROOT, "cuda", "common"), os.path.join(dst, "common"))
    return dst


def replace_func(s, sig, body):
    """The function starting at `sig` (its body ending at the first column-0 brace) gets `body`."""
    i = s.index(sig)
    j = s.index("\n}\n", i)
    return s[:i] + sig + body + s[j + 3:]


def copy_header(out, family, name, edit=lambda s: s):
    s = open(os.path.join(ROOT, "cuda", family, name)).read()
    s = edit(s.replace("#include <cooperative_groups.h>\n", ""))
    assert "asm" not in re.sub(r"//.*", "", s), "%s: inline asm left for the emulator" % name
    open(os.path.join(out, "cuda", family, name), "w").write(s)
