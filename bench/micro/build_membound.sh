#!/usr/bin/env bash
# Builds bench/micro/membound_variants.cu into a shared library for membound_variants.py.
#   bash bench/micro/build_membound.sh [OUT.so]      (run from the repo root; default /tmp/membound_variants.so)
# Prints ptxas register / spill / stack usage per kernel (-Xptxas -v) into OUT.so.ptxas.log and a
# one-line-per-kernel summary on stdout. The .so is a build output: never commit it (*.so is
# git-ignored; carry it to the GPU machine, e.g. under .bundle/).
set -euo pipefail
OUT=${1:-/tmp/membound_variants.so}
NVCC=${NVCC:-nvcc}
mkdir -p "$(dirname "$OUT")"
"$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
  -Xcompiler -fPIC -shared -cudart static -Xptxas -v -I. \
  -o "$OUT" bench/micro/membound_variants.cu 2> "$OUT.ptxas.log" || { cat "$OUT.ptxas.log"; exit 1; }
# Summary: demangled kernel name, registers, spills, stack.
python3 - "$OUT.ptxas.log" <<'PY'
import re, subprocess, sys
lines = open(sys.argv[1]).read().splitlines()
name = None
rows = []
for ln in lines:
    m = re.search(r"Compiling entry function '([^']+)'", ln)
    if m:
        name = m.group(1)
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", ln)
    if m and name:
        stack, ss, sl = m.groups()
        continue
    m = re.search(r"Used (\d+) registers", ln)
    if m and name:
        rows.append((name, int(m.group(1)), stack, ss, sl))
        name = None
try:
    dem = subprocess.run(["c++filt"], input="\n".join(r[0] for r in rows), capture_output=True, text=True).stdout.split("\n")
except Exception:
    dem = [r[0] for r in rows]
bad = 0
for r, d in zip(rows, dem):
    flag = "" if r[2] == r[3] == r[4] == "0" else "   <-- SPILL/STACK"
    bad += bool(flag)
    d = re.sub(r"\(.*\)$", "", d).replace("__nv_bfloat16", "bf16")
    print("%4d regs  stack %s  spill st/ld %s/%s  %s%s" % (r[1], r[2], r[3], r[4], d, flag))
print("%d kernels, %d with spills or stack" % (len(rows), bad))
PY
echo "built $OUT"
