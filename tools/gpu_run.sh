#!/usr/bin/env bash
# Run Fray's GPU tests and benchmarks from a staged bundle, without Bazel:
#   bash run.sh [FAMILIES|all] [DEADLINE_SECONDS] [BENCH_REGEX]
#   bash run.sh sanitize [FAMILIES|all] [DEADLINE_SECONDS] [TOOLS]
#   bash run.sh bench [FAMILIES|all] [DEADLINE_SECONDS] [BENCH_REGEX]
#   bash run.sh pytest [FAMILIES|all] [DEADLINE_SECONDS]
# FAMILIES: comma list (norm,softmax) or all; BENCH_REGEX selects benchmark files by name (default
# all of the families'). Logs, junit XML and benchmark JSON lines are re-packed into
# $OUT/results.tgz (or ./gpu_results/) after every step, so a run cut short still returns what it
# did; the GPU machine returns only a few files, so that archive and summary.txt are all of $OUT.
# sanitize: memcheck, racecheck, initcheck and synccheck (TOOLS: a comma list, default all four)
# over the cases of python/fray/sanitize.py (a few cases per process, the costliest first, 16
# processes at a time; the estimate per tool is printed first); per-case logs, sanitize.jsonl and
# SANITIZE.md (the tables, ready for bench/results/h200/, rewritten after every process) go into
# the archive under sanitize/ and SANITIZE.md next to it.
# bench: the selected families' benchmarks alone, in the order named (no tests, no fray check).
# pytest: the selected families' GPU tests alone (no fray check, no benchmarks).
# Narrower runs (checking a few changes in one call): FRAY_PYTEST_K="expr" passes -k expr to
# pytest; FRAY_SANITIZE_ONLY=REGEX sanitizes only the cases whose family/case names it finds.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MODE=tests
case "${1:-}" in sanitize | bench | pytest) MODE=$1; shift ;; esac
FAMILY=${1:-all}
DEADLINE=${2:-$([ "$MODE" = sanitize ] && echo 560 || echo 540)}
TOOLS=${3:-memcheck,racecheck,initcheck,synccheck}
BENCH_RE=${3:-.}
OUTDIR=${OUT:-$PWD/gpu_results}
RES=$(mktemp -d)/results
mkdir -p "$RES" "$OUTDIR"
START=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
pack() { tar czf "$OUTDIR/results.tgz" -C "$RES" . ; cp "$RES/summary.txt" "$OUTDIR/" 2>/dev/null || true; }

export PYTHONUNBUFFERED=1
export FRAY_COMMIT=$(cat "$HERE/COMMIT" 2>/dev/null || echo unknown)
# Fray is used as installed from its wheel, never from sources: pip puts the wheel (and the peer
# wheels) into one target directory. --no-deps: the GPU machine has no package registry; its own
# torch (CUDA build), triton, numpy and absl-py are what the wheel's requirements name.
SITE=$(mktemp -d)/site
rm -rf "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$HERE"/wheels/*.whl \
  || { echo "pip install of the wheels failed" | tee -a "$RES/summary.txt"; pack; exit 1; }
export PYTHONPATH=$SITE
export PATH=$SITE/bin:$PATH
{ nvidia-smi; python3 -c 'import sys, torch, triton; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'; echo "commit $FRAY_COMMIT"; python3 -c 'import fray, importlib.metadata as m; print("fray", m.version("fray"), "from", fray.__file__)'; } > "$RES/env.txt" 2>&1
grep "^fray .* from $SITE/" "$RES/env.txt" | tee -a "$RES/summary.txt" || { echo "fray does not import from the installed wheel" | tee -a "$RES/summary.txt"; pack; exit 1; }
pack

if [ "$MODE" = sanitize ]; then
  cd "$HERE"
  # No process starts in the last 60 s and none outlives the deadline by more than 30 s (the
  # sweep's own limits; this timeout only backs them up). SANITIZE.md is current after every
  # process, so a sweep cut short still returns its tables.
  timeout "$(left)" python3 -m fray.sanitize --sweep "$FAMILY" --tools "$TOOLS" --out "$RES/sanitize" --jobs 16 \
    ${FRAY_SANITIZE_ONLY:+--only "$FRAY_SANITIZE_ONLY"} \
    --deadline $(( $(left) - 60 )) --command "${FRAY_SANITIZE_ONLY:+FRAY_SANITIZE_ONLY='$FRAY_SANITIZE_ONLY' }bash .bundle/run.sh sanitize $FAMILY $DEADLINE $TOOLS" \
    > "$RES/sanitize.log" 2>&1 &
  pid=$!
  while kill -0 $pid 2>/dev/null; do
    sleep 15; cp "$RES/sanitize/SANITIZE.md" "$OUTDIR/" 2>/dev/null; pack
  done
  wait $pid; rc=$?
  # Each case process runs in its own session (killed whole at its timeout); any left behind by a
  # sweep cut off here would slow whatever runs next on the GPU.
  pkill -9 -f 'fray.sanitize --case' 2>/dev/null || true
  pkill -9 -x compute-sanitizer 2>/dev/null || true
  echo "sanitize ($FAMILY): rc=$rc $(tail -n 1 "$RES/sanitize.log")" | tee -a "$RES/summary.txt"
  cp "$RES/sanitize/SANITIZE.md" "$OUTDIR/" 2>/dev/null || true
  pack
  cat "$RES/summary.txt"
  exit $rc
fi
if [ "$FAMILY" = all ]; then
  FAMILIES=$(cd "$HERE/tests" && ls -d */ | tr -d / | tr '\n' ' ')
else
  FAMILIES=$(echo "$FAMILY" | tr , ' ')
fi
status=0
cd "$HERE"
# Tests of all selected families in one pytest run; pytest-xdist (if present: carry its wheel and
# execnet's in .whl/) spreads them over processes, which mostly parallelises Triton's compilation
# (serially every family's GPU tests took over 13 minutes on the H200 machine, 2026-12-02).
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n ${FRAY_TEST_PROCS:-8}"
TESTS=$(for f in $FAMILIES; do [ -d "tests/$f" ] && printf 'tests/%s ' "$f"; done)
if [ "$MODE" = bench ]; then
  echo "tests: skipped (bench mode)" | tee -a "$RES/summary.txt"
  # Timings beside other GPU work are worthless (sanitizer orphans made bench/host 4-5x slow at
  # 7ebfe6d, 2026-12-03): name any other compute process in the summary.
  others=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>/dev/null | tr '\n' ';')
  [ -z "$others" ] || echo "warning: other GPU processes while benchmarking: $others" | tee -a "$RES/summary.txt"
elif [ -z "$TESTS" ]; then
  echo "tests: none selected ($FAMILIES)" | tee -a "$RES/summary.txt"
elif [ "$(left)" -gt 60 ]; then
  # -v: one line per test as it ends (with xdist, in the order they end), so a run cut off by the
  # deadline still names its failures; SIGINT at the deadline lets pytest print the failures'
  # tracebacks, the slowest tests and the junit XML before it exits (SIGKILL 30 s later).
  # shellcheck disable=SC2086
  # FRAY_TEST_FAILURES: each failure's report written as the test ends (tests/conftest.py), so a
  # run the timeout kills before pytest's summary still names its failures with their tracebacks.
  FRAY_TEST_FAILURES="$RES/failures.txt" timeout -s INT -k 30 "$(( $(left) - 30 ))" python3 -m pytest -p no:cacheprovider -v --tb=short -rfEs \
    --durations=25 --rootdir=. -m gpu ${FRAY_PYTEST_K:+-k "$FRAY_PYTEST_K"} $XDIST $TESTS --junitxml "$RES/pytest.xml" \
    > "$RES/pytest.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "tests ($FAMILIES): rc=$rc $(tail -n 1 "$RES/pytest.log")" | tee -a "$RES/summary.txt"
  grep -E '^(FAILED|ERROR) |\] (FAILED|ERROR) ' "$RES/pytest.log" | head -n 60 | tee -a "$RES/summary.txt"
else
  echo "deadline reached before the tests" | tee -a "$RES/summary.txt"
fi
pack
if [ "$MODE" = tests ]; then
  [ "$(left)" -gt 20 ] && timeout "$(left)" fray check > "$RES/check.log" 2>&1
  echo "fray check: rc=$? $(tail -n 1 "$RES/check.log" 2>/dev/null)" | tee -a "$RES/summary.txt"
  pack
fi
[ "$MODE" = pytest ] && { cat "$RES/summary.txt"; exit $status; }
# bench/host (every op's eager host cost), bench/e2e (a decoder step) and bench/soak (a long decode
# loop under graph replay) belong to no family: they run with `all`, or when named in FAMILIES
# (host,e2e runs just them).
BENCH_DIRS=$FAMILIES
[ "$FAMILY" = all ] && BENCH_DIRS="$BENCH_DIRS host e2e soak"
for f in $BENCH_DIRS; do
  for b in "bench/$f"/*.py; do
    [ -f "$b" ] || continue
    basename "$b" .py | grep -Eq "$BENCH_RE" || continue
    [ "$(left)" -gt 30 ] || { echo "deadline reached before $b" | tee -a "$RES/summary.txt"; break 2; }
    timeout "$(left)" python3 "$b" --out "$RES/bench_$f.jsonl" > "$RES/$(basename "$b" .py).log" 2>&1
    echo "$b: rc=$?" | tee -a "$RES/summary.txt"
    pack
  done
done
cat "$RES/summary.txt"
exit $status
