#!/usr/bin/env bash
# Builds and runs the CPU SIMT emulation of the sampling kernel (see README.md).
#   bash cuda/sampling/emu/run.sh          # every case (about four minutes)
#   bash cuda/sampling/emu/run.sh 7        # one case by index
#   EMU_CXXFLAGS=-DFRAY_SAMPLE_EXTRA_BARRIERS=0 bash cuda/sampling/emu/run.sh   # without the extra barrier (on by default)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
work=$(mktemp -d "${TMPDIR:-/tmp}/sample-emu.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 "$here/gen.py" "$work"
g++ -std=c++17 -O1 -g -w ${EMU_CXXFLAGS:-} -I"$cuda/include" -I"$work" -I"$here/../../topk/emu" "$here/emu_test.cc" -o "$work/emu_test"
"$work/emu_test" "$@"
