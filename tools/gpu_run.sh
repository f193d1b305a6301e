#!/usr/bin/env bash
# Run Fray's GPU tests and benchmarks from a staged bundle, without Bazel:
#   bash run.sh [FAMILY|all] [DEADLINE_SECONDS]
# Results go to $OUT (or ./gpu_results): logs, junit XML and benchmark JSON lines in results/,
# re-packed into $OUT/results.tgz after every step, so a run cut short still returns what it did.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FAMILY=${1:-all}
DEADLINE=${2:-540}
OUTDIR=${OUT:-$PWD/gpu_results}
RES=$OUTDIR/results
mkdir -p "$RES"
START=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
pack() { tar czf "$OUTDIR/results.tgz" -C "$RES" . ; }

export PYTHONPATH=$HERE/python:$HERE/triton${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export FRAY_COMMIT=$(cat "$HERE/COMMIT" 2>/dev/null || echo unknown)
if compgen -G "$HERE/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/fray-site "$HERE"/wheels/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/fray-site
fi
{ nvidia-smi; python3 -c 'import sys, torch, triton; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'; echo "commit $FRAY_COMMIT"; } > "$RES/env.txt" 2>&1
pack

if [ "$FAMILY" = all ]; then
  FAMILIES=$(cd "$HERE/tests" && ls -d */ | tr -d /)
else
  FAMILIES=$FAMILY
fi
status=0
cd "$HERE"
for f in $FAMILIES; do
  [ "$(left)" -gt 20 ] || { echo "deadline reached before tests of $f" | tee -a "$RES/summary.txt"; break; }
  timeout "$(left)" python3 -m pytest -p no:cacheprovider -q -rs --rootdir=. -m gpu "tests/$f" \
    --junitxml "$RES/pytest_$f.xml" > "$RES/pytest_$f.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "tests/$f: rc=$rc $(tail -n 1 "$RES/pytest_$f.log")" | tee -a "$RES/summary.txt"
  pack
done
[ "$(left)" -gt 20 ] && timeout "$(left)" python3 -m fray.cli check > "$RES/check.log" 2>&1
echo "fray check: rc=$? $(tail -n 1 "$RES/check.log" 2>/dev/null)" | tee -a "$RES/summary.txt"
pack
for f in $FAMILIES; do
  for b in "bench/$f"/*.py; do
    [ "$(left)" -gt 30 ] || { echo "deadline reached before $b" | tee -a "$RES/summary.txt"; break 2; }
    timeout "$(left)" python3 "$b" --out "$RES/bench_$f.jsonl" > "$RES/$(basename "$b" .py).log" 2>&1
    echo "$b: rc=$?" | tee -a "$RES/summary.txt"
    pack
  done
done
cat "$RES/summary.txt"
exit $status
