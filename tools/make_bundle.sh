#!/usr/bin/env bash
# Stage the GPU bundle: `bash tools/make_bundle.sh [DEST]` (default .bundle/, git-ignored).
#
# A thin wrapper over the wheel: builds //:wheel for the GPU machine's Python 3.12 (--config=py312)
# and //:gpu_bundle, whose runfiles give the tests and benchmarks (links resolved: they do not
# travel); the package itself travels only as the wheel, which run.sh pip-installs there. Plus the
# run script, the commit stamp and any peer wheels in .whl/ (e.g. Liger-Kernel, nvidia-cutlass).
# Carry DEST to the GPU machine and run
#   bash DEST/run.sh [FAMILY|all] [DEADLINE_SECONDS]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$REPO/.bundle}
cd "$REPO"
bazel build --config=py312 //:wheel //:gpu_bundle
BIN=$(bazel info --config=py312 bazel-bin 2>/dev/null)
RF=$BIN/gpu_bundle.runfiles/_main
[ -d "$RF" ] || { echo "make_bundle: no runfiles at $RF" >&2; exit 1; }
rm -rf "$DEST"
mkdir -p "$DEST"
for d in tests bench; do cp -rL "$RF/$d" "$DEST/$d"; done
# bench/micro's Python experiments (not Bazel targets) run from the bundle too
mkdir -p "$DEST/bench/micro" && cp bench/micro/*.py "$DEST/bench/micro/"
mkdir -p "$DEST/wheels"
cp "$BIN"/fray-*-cp312-cp312-linux_x86_64.whl "$DEST/wheels/"
find "$DEST" -name '__pycache__' -prune -exec rm -rf {} +
cp -L "$RF/tools/gpu_run.sh" "$DEST/run.sh"
chmod -R u+w "$DEST"
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || commit="$commit-dirty"
echo "$commit" > "$DEST/COMMIT"
if compgen -G ".whl/*.whl" >/dev/null; then cp .whl/*.whl "$DEST/wheels/"; fi
# The JIT kernels include CUTLASS/CuTe from the nvidia-cutlass package, which the GPU machine lacks.
compgen -G ".whl/nvidia_cutlass-*.whl" >/dev/null ||
  echo "make_bundle: warning: no .whl/nvidia_cutlass-*.whl (pip download --no-deps nvidia-cutlass -d .whl): JIT kernels that include CUTLASS will not compile there" >&2
# (no grep -q: it exits at the first match, unzip dies of SIGPIPE and pipefail fails the check)
unzip -l "$DEST"/wheels/fray-*.whl | grep 'fray/_C/_norm.so' >/dev/null || { echo "make_bundle: extensions missing from the wheel" >&2; exit 1; }
echo "bundle staged in $DEST ($(du -sh "$DEST" | cut -f1), commit $commit)"
