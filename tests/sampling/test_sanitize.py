"""fray.sanitize, the compute-sanitizer sweep: on the CPU, the runner against a stand-in
compute-sanitizer (a chunk with a finding is re-run one case per process and the finding lands on
its case; clean chunks mark every case clean; the report has one table per tool); on the GPU,
memcheck over the sampling kernel at narrow widths, which run on a cluster of one block (its
pushed exchanges once wrote through st.async with no peer: an invalid __shared__ write that
aborted the kernel)."""
import os
import subprocess
import sys

import pytest

from fray import sanitize

FAKE = r"""#!/bin/bash
tool=$2
if [[ "$*" == *vector_add_fp16_n1000* ]]; then
  echo "========= Invalid __shared__ write of size 8 bytes"
  echo "=========     at fray::elementwise_detail::vector_add_kernel(const Args)+0x10 in vector_add.cuh:1"
  echo "========= ERROR SUMMARY: 2 errors"; exit 99
fi
[ "$tool" = racecheck ] && echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
echo "========= ERROR SUMMARY: 0 errors"
"""


def test_case_lists_name_every_family_and_the_narrow_sampling_widths():
    names = sanitize.case_names([f for f in sanitize.CASES if f != "smoke"])
    assert len(names) == len(set(names))
    assert {n.split("/")[0] for n in names} == set(sanitize.CASES) - {"smoke"}
    for w in (1, 7, 1000, 2047, 262144):
        assert "sampling/sample_topp_fp32_3x%d" % w in names or "sampling/sample_topp_fp32_1x%d" % w in names
    with pytest.raises(ValueError, match="families"):
        sanitize.case_names(["nope"])


def test_sweep_attributes_a_finding_to_its_case(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "compute-sanitizer"
    fake.parent.mkdir()
    fake.write_text(FAKE)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake.parent, os.environ.get("PATH", "")))
    rows = sanitize.sweep(["elementwise"], str(tmp_path / "out"), sanitize.TOOLS, 4, 60, 600, 4)
    names = sanitize.case_names(["smoke", "elementwise"])
    for tool in sanitize.TOOLS:
        got = {r["case"]: r for r in rows if r["tool"] == tool}
        assert sorted(got) == sorted(names), tool
        bad = sorted(n for n, r in got.items() if r["status"] != "clean")
        assert bad == ["elementwise/vector_add_fp16_n1000"], (tool, bad)
        r = got[bad[0]]
        assert r["errors"] == 2 and r["rc"] == 99 and r["chunk"] == 1  # re-run in its own process
        assert r["kernels"] == ["fray::elementwise_detail::vector_add_kernel"]
    sanitize.write_report(rows, str(tmp_path / "S.md"), "bash .bundle/run.sh sanitize elementwise", "abc")
    text = (tmp_path / "S.md").read_text()
    for tool in sanitize.TOOLS:
        assert "## %s: %d cases, %d clean, 1 not" % (tool, len(names), len(names) - 1) in text
    assert "| elementwise/vector_add_fp16_n1000 | **2 errors** (FINDINGS, rc 99)" in text


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
