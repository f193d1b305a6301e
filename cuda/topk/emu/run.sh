#!/usr/bin/env bash
# Builds and runs the CPU SIMT emulation of the streaming topk kernel (see README.md).
#   bash cuda/topk/emu/run.sh            # every light case (about a minute)
#   bash cuda/topk/emu/run.sh 36         # one case by index (the heavy ones run only this way)
#   bash cuda/topk/emu/run.sh file ROWS.bin f32 ROWS WIDTH C K...   # rows of raw bits from a file
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
work=$(mktemp -d "${TMPDIR:-/tmp}/topk-emu.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 "$here/gen.py" "$work"
g++ -std=c++17 -O1 -g -w -I"$cuda/include" -I"$work" -I"$here" "$here/emu_test.cc" -o "$work/emu_test"
"$work/emu_test" "$@"
