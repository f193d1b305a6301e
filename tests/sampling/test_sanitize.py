"""fray.sanitize, the compute-sanitizer sweep: on the CPU, the runner against a stand-in
compute-sanitizer (a chunk with a finding is re-run one case per process and the finding lands on
its case; clean chunks mark every case clean; the report has one table per tool); on the GPU,
memcheck over the sampling kernel at narrow widths, which run on a cluster of one block (its
pushed exchanges once wrote through st.async with no peer: an invalid __shared__ write that
aborted the kernel), and racecheck over its two-block clusters."""
import os
import subprocess
import sys
import time

import pytest

from fray import sanitize

# A stand-in for compute-sanitizer that prints what the real tools print (13.0, the sweep of the
# bundle at da8da65): racecheck only its RACECHECK SUMMARY, no ERROR SUMMARY; initcheck, which runs
# unfiltered, a report in one of torch's kernels for every process.
FAKE = r"""#!/bin/bash
tool=$2
bad=0
[[ "$*" == */rmsnorm_fp16_7x1000* ]] && bad=1
case $tool in
racecheck)
  if [ $bad = 1 ]; then
    echo "========= Error: Race reported between Read access at"\
" void fray::norm_detail::rmsnorm_kernel<half>(Args)+0x10 in rmsnorm.cuh:1"
    echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; exit 99
  fi
  echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)";;
initcheck)
  [[ "$*" == *kns=fray* ]] && { echo "initcheck filtered"; exit 3; }
  echo "========= Uninitialized __global__ memory read of size 4 bytes"
  echo "=========     at void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)+0x90"
  if [ $bad = 1 ]; then
    echo "========= Uninitialized __global__ memory read of size 16 bytes"
    echo "=========     at void fray::norm_detail::rmsnorm_kernel<half>(Args)+0x10 in rmsnorm.cuh:1"
    echo "========= ERROR SUMMARY: 2 errors"; exit 99
  fi
  echo "========= ERROR SUMMARY: 1 error"; exit 99;;
*)
  if [ $bad = 1 ]; then
    echo "========= Invalid __shared__ write of size 8 bytes"
    echo "=========     at void fray::norm_detail::rmsnorm_kernel<half>(Args)+0x10 in rmsnorm.cuh:1"
    echo "========= ERROR SUMMARY: 2 errors"; exit 99
  fi
  echo "========= ERROR SUMMARY: 0 errors";;
esac
"""


def test_case_lists_name_every_family_and_the_sampling_launch_paths():
    names = sanitize.case_names([f for f in sanitize.CASES if f != "smoke"])
    assert len(names) == len(set(names))
    assert {n.split("/")[0] for n in names} == set(sanitize.CASES) - {"smoke"}
    # the narrow one-block rows, then clusters of 2, 4, 8 and 16 blocks and the 192 KB slices
    for shape in ("3x1", "3x7", "3x1000", "3x2047", "3x8192", "3x16384", "3x32768", "1x65536", "1x393216"):
        assert "sampling/sample_topp_fp32_%s" % shape in names, shape
    # prefill_attention's JIT kernel: every shipped configuration, its paged path, Triton's paged path
    for d in ("bf16", "fp16"):
        for hd in (64, 128, 256):
            for mode in ("causal", "full"):
                assert "attention/prefill_%s_d%d_%s" % (d, hd, mode) in names
            assert "attention/prefill_paged_p16_%s_d%d_causal" % (d, hd) in names
        assert "attention/prefill_triton_paged_p16_%s_d128_causal" % d in names
        # mla_decode's JIT kernel: 64- and 16-token pages, one split and the merge
        for case in ("p64_hq16_split1", "p64_hq16_split3", "p16_hq128_split1", "p16_hq128_split3"):
            assert "attention/mla_cuda_%s_%s" % (d, case) in names
    assert "attention" in sanitize.JIT_FAMILIES  # its kernels are built before the tools run
    with pytest.raises(ValueError, match="families"):
        sanitize.case_names(["nope"])


def test_plan_racechecks_shared_memory_kernels_only_and_runs_the_costliest_first():
    _, work, est, counts = sanitize.plan(["elementwise", "sampling"], sanitize.TOOLS, 8)
    race = [n for t, g in work if t == "racecheck" for n in g]
    assert race and not any(n.startswith("elementwise/") for n in race)
    assert counts["memcheck"] == len(sanitize.case_names(["elementwise", "sampling"]))
    costs = [sanitize._START[t] + sum(sanitize._cost(t, sanitize._lookup(n)) for n in g) for t, g in work]
    assert costs == sorted(costs, reverse=True)
    assert est["racecheck"] > est["memcheck"] > 0
    # a sampling case costs racecheck per launch: each runs alone, at the floor or above
    sampling_race = [g for t, g in work if t == "racecheck" and g[0].startswith("sampling/")]
    assert sampling_race and all(len(g) == 1 for g in sampling_race)
    assert all(sanitize._cost("racecheck", sanitize._lookup(g[0])) >= sanitize._SAMPLING_RACE_S for g in sampling_race)
    assert any(len(g) > 1 for t, g in work if t == "memcheck" and g[0].startswith("sampling/"))


def test_only_narrows_the_cases_but_keeps_the_smoke_case(monkeypatch):
    names = sanitize.case_names(["sampling", "moe"], only=r"penalt|fused_moe_cuda")
    assert names and all(("penalt" in n) or ("fused_moe_cuda" in n) for n in names)
    assert any(n.startswith("sampling/") for n in names) and any(n.startswith("moe/") for n in names)
    smoke, work, _, counts = sanitize.plan(["sampling", "moe"], ["memcheck"], 8, only="penalt")
    planned = [n for _, g in work for n in g]
    assert smoke.startswith("smoke/") and sorted(planned) == sorted(
        sanitize.case_names(["sampling", "moe"], only="penalt"))
    assert counts["memcheck"] == len(planned) > 0
    # the warm-up builds only the selected JIT cases
    seen = []
    monkeypatch.setattr(sanitize, "warm_chunks", lambda names, jobs: seen.append(names) or [])
    sanitize.warm(["moe", "sampling"], 4, 100, only="grouped_gemm_explicit_cuda")
    assert seen and seen[0] and all("grouped_gemm_explicit_cuda" in n for n in seen[0])


def test_plan_closes_a_chunk_before_its_estimate_passes_the_cap():
    # A chunk of several cases never passes _CHUNK_SECONDS (8 racecheck cases of sampling in one
    # process ran into the per-process limit at 48fe6bd); one costlier case still runs alone.
    _, work, _, counts = sanitize.plan(["sampling", "softmax", "attention"], ["racecheck"], 8)
    costs = [(len(g), sum(sanitize._cost(t, sanitize._lookup(n)) for n in g)) for t, g in work]
    assert all(c <= sanitize._CHUNK_SECONDS for k, c in costs if k > 1)
    assert any(k > 1 for k, _ in costs) and max(k for k, _ in costs) <= 8
    assert sum(k for k, _ in costs) == counts["racecheck"]  # every case planned once


def test_classify_reads_the_real_summaries():
    # racecheck prints no ERROR SUMMARY: 0 hazards is clean (the sweep of da8da65 re-ran every
    # racecheck chunk one case per process for want of it)
    r = sanitize.classify("racecheck", "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n", 0)
    assert r["status"] == "clean" and r["errors"] == 0
    r = sanitize.classify("racecheck", "=========     Write Thread (32,0,0) at void fray::sampling_detail::"
                          "compact_candidates<float>(const T1 *)+0x10 in sample.cuh:601\n"
                          "========= RACECHECK SUMMARY: 200 hazards displayed (987 errors, 4 warnings)\n", 99)
    assert r["status"] == "FINDINGS" and r["errors"] == 991
    assert r["kernels"] == ["fray::sampling_detail::compact_candidates"]
    r = sanitize.classify("memcheck", "========= ERROR SUMMARY: 0 errors\n", 0)
    assert r["status"] == "clean"
    r = sanitize.classify("memcheck", "[timeout after 10s]\n", "timeout")
    assert r["status"] == "timeout"


def test_sweep_attributes_a_finding_to_its_case(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "compute-sanitizer"
    fake.parent.mkdir()
    fake.write_text(FAKE)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake.parent, os.environ.get("PATH", "")))
    out = tmp_path / "out"
    rows = sanitize.sweep(["norm"], str(out), sanitize.TOOLS, 4, 60, 600, 4, "cmd", "abc")
    names = sanitize.case_names(["smoke", "norm"])
    for tool in sanitize.TOOLS:
        got = {r["case"]: r for r in rows if r["tool"] == tool}
        assert sorted(got) == sorted(names), tool
        bad = sorted(n for n, r in got.items() if r["status"] != "clean")
        assert bad == ["norm/rmsnorm_fp16_7x1000"], (tool, bad)
        r = got[bad[0]]
        assert r["errors"] == (2 if tool in ("memcheck", "synccheck") else 1), (tool, r)
        assert r["rc"] == 99 and r["chunk"] == 1  # re-run in its own process
        assert r["kernels"] == ["fray::norm_detail::rmsnorm_kernel"]
        if tool == "initcheck":  # torch's fill is listed apart and does not count
            ok = got["norm/layernorm_fp32_7x1000"]
            assert ok["status"] == "clean" and ok["other_errors"] == 1
            fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
            assert ok["other_kernels"] == [fill]
    text = (out / "SANITIZE.md").read_text()  # written by the sweep itself
    assert "Commit: abc" in text and "pending" not in text
    for tool in sanitize.TOOLS:
        assert "## %s: %d cases, %d clean, 1 not" % (tool, len(names), len(names) - 1) in text
    assert "| norm/rmsnorm_fp16_7x1000 | **2 errors** (FINDINGS, rc 99)" in text


def test_a_timed_out_process_is_killed_with_its_children(tmp_path):
    # compute-sanitizer's python3 child once outlived the timeout that killed compute-sanitizer
    # alone, and slowed the benchmarks run after the sweep
    pid_file = tmp_path / "child.pid"
    fake = tmp_path / "compute-sanitizer"
    fake.write_text("#!/bin/bash\nsleep 300 &\necho $! > %s\necho started\nwait\n" % pid_file)
    fake.chmod(0o755)
    os.makedirs(tmp_path / "memcheck")
    row = sanitize._one("memcheck", "smoke/vector_add", str(tmp_path), 2, str(fake))
    assert row["rc"] == "timeout" and row["status"] == "timeout"
    child = int(pid_file.read_text())
    for _ in range(50):
        if not os.path.exists("/proc/%d" % child) or open("/proc/%d/stat" % child).read().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("the sanitizer's child %d outlived the timeout" % child)
    assert "started" in open(tmp_path / "memcheck" / "smoke__vector_add.log").read()


def test_a_process_limit_follows_its_estimate():
    # a hang costs a few times the process's estimate, not the whole --timeout: 22 hung racecheck
    # processes once held 16 jobs for 240 s each and left 882 of 927 runs not made
    one = sanitize._limit("racecheck", ["sampling/sample_topp_bf16_3x8192"])
    assert one == sanitize._LIMIT_FACTOR * (sanitize._START["racecheck"] + sanitize._SAMPLING_RACE_S)
    assert sanitize._limit("memcheck", ["norm/rmsnorm_fp16_7x1000"]) == sanitize._LIMIT_MIN
    two = sanitize._limit("racecheck", ["sampling/sample_topp_bf16_3x8192", "sampling/sample_topk50_bf16_3x8192"])
    assert two > one


def test_sweep_cuts_a_hung_process_at_its_limit(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "compute-sanitizer"
    fake.parent.mkdir()
    fake.write_text("#!/bin/bash\n[[ \"$*\" == */rmsnorm_fp16_7x1000* ]] && sleep 120\n"
                    "echo '========= ERROR SUMMARY: 0 errors'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake.parent, os.environ.get("PATH", "")))
    monkeypatch.setattr(sanitize, "_LIMIT_MIN", 2.0)
    monkeypatch.setattr(sanitize, "_LIMIT_FACTOR", 0.1)
    t0 = time.time()
    rows = sanitize.sweep(["norm"], str(tmp_path / "out"), ["memcheck"], 4, 240, 600, 4, "cmd", "abc")
    assert time.time() - t0 < 60  # --timeout alone would have let it run 120 s
    bad = {r["case"]: r["status"] for r in rows if r["status"] != "clean"}
    assert bad == {"norm/rmsnorm_fp16_7x1000": "timeout"}, bad


def test_warm_runs_chunks_and_finishes_a_failed_chunk_case_by_case(monkeypatch, capsys):
    # the JIT families' cases, about WARM_CHUNK to a process, dealt out round-robin so that
    # neighbours (one kernel family's costly compiles) run in different processes; a chunk that dies at a case
    # (the one that faulted: fused_moe_kn_fp16, 2026-12-07) is finished one case a process, so the
    # cases after it still warm and the fault is named
    calls = []
    names = sanitize.case_names(["moe", "quant"])
    bad = "moe/fused_moe_kn_fp16"

    class Done:
        def __init__(self, rc, out):
            self.returncode, self.stdout = rc, out.encode()

    def fake_run(cmd, **kw):
        group = cmd[cmd.index("--case") + 1].split(",")
        calls.append(group)
        out = ""
        for n in group:
            if n == bad:
                return Done(1, out + "RuntimeError: case %s: illegal instruction" % n)
            out += "[sanitize] case %s done in 0.1 s\n" % n
        return Done(0, out)
    monkeypatch.setattr(sanitize.subprocess, "run", fake_run)
    sanitize.warm(["moe", "quant", "norm"], 4, 600)
    chunks = [c for c in calls if len(c) > 1 or c[0] != bad]
    assert max(len(c) for c in calls) <= sanitize.WARM_CHUNK
    dealt = sanitize.warm_chunks(names, 4)
    assert all(c in calls for c in dealt) and len(dealt) >= 4
    home = {n: i for i, c in enumerate(dealt) for n in c}
    assert all(home[a] != home[b] for a, b in zip(names, names[1:]))         # neighbours apart
    warmed = [n for c in calls for n in c]
    assert set(warmed) == set(names)                                          # norm is not a JIT family
    first = next(c for c in calls if bad in c)
    after = first[first.index(bad) + 1:]
    assert after and all([n] in calls for n in after)                         # finished one a process
    assert [bad] in calls and not any([n] in calls for n in first[:first.index(bad)])
    assert len(chunks) < len(names) / 2
    out = capsys.readouterr().out
    assert "warm: %s failed (rc 1)" % bad in out and out.count("failed") == 1


def test_report_marks_an_unfinished_sweep():
    p = "/tmp/fray_sanitize_pending.md"
    sanitize.write_report([], p, "cmd", "abc", pending=[("racecheck", "sampling/x")])
    text = open(p).read()
    assert "Incomplete: 1 case x tool runs not finished" in text and "| sampling/x | pending | |" in text


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gpu_memcheck_clean_at_narrow_widths(cuda, dtype):
    san = sanitize._sanitizer()  # raises where compute-sanitizer is missing: this test needs it
    cases = ",".join("sampling/%s_%s_3x%d" % (op, dtype, w) for w in (1, 7, 1000, 2047)
                     for op in ("sample_topp", "sample_topk50"))
    p = subprocess.run([san, "--tool", "memcheck", "--kernel-name", "kns=fray", "--error-exitcode", "99",
                        sys.executable, "-m", "fray.sanitize", "--case", cases],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0 and "ERROR SUMMARY: 0 errors" in out, out[-4000:]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gpu_racecheck_clean_at_two_block_clusters(cuda, dtype):
    # 3 x 8192 runs on clusters of 2, where select_bin_push's staging is the next phase's candidate
    # list (a missing barrier: racecheck's WAR at 64 x 30000, bundle at da8da65); decode_step's
    # 4 x 32000 (clusters of 4) resets the candidate count after the exchanges. With the split
    # cluster barrier of 69f02e0 these never finished under racecheck (the timeout fails the test).
    san = sanitize._sanitizer()
    cases = ",".join(["sampling/sample_topp_%s_3x8192" % dtype, "sampling/sample_topk50_%s_3x8192" % dtype,
                      "sampling/decode_step_%s_4x32000" % dtype])
    known = set(sanitize.case_names(["sampling"]))
    assert all(c in known for c in cases.split(",")), cases
    p = subprocess.run([san, "--tool", "racecheck", "--racecheck-report", "all", "--kernel-name", "kns=fray",
                        "--error-exitcode", "99", sys.executable, "-m", "fray.sanitize", "--case", cases],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=400)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0 and "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" in out, out[-4000:]
