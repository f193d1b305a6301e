"""A/B variants of the CUDA sampling kernel in one GPU process (standalone; not a Bazel target).

Each variant is the shipped cuda/ tree with a few exact text edits (VARIANTS below), compiled into its
own shared library exposing `sv_sample`; the GPU run checks that every variant draws the shipped
kernel's tokens (and logprobs) on the benchmark inputs, then times them all in interleaved rounds
with the L2 flushed (fray.bench.time_us, as bench/sampling). One device call then answers several
kernel questions at once, where a rebuilt bundle answers one.

    python3 bench/micro/sample_variants.py build OUTDIR [NAME ...]   # here (nvcc, sm_90a)
    python3 bench/micro/sample_variants.py run OUTDIR                # on the GPU machine
    ncu ... python3 bench/micro/sample_variants.py ncu OUTDIR NAME    # three launches to profile

Add a variant: a name and a list of (file under cuda/, old text, new text); each old text must occur
exactly once in that file.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Phase stamps (%globaltimer, thread 0 of each block, plus its SM id): where a wave's time goes and
# which blocks share an SM. Anchors common to the committed kernel and the working tree.
_STAMPS = [
    ("  const int nv = (n + N - 1) / N;\n", "A", 0),
    ("  best = warp_max_u64(best);\n  vmin = warp_min_f(vmin);\n", "B", 1),
    ("  xchg_wait(&m->xbar[kXMax]);\n", "A", 2),
    ("    m_first = warp_sum_u64(m_first);\n", "B", 3),
    ("  __syncthreads();  // this block's histogram is complete\n", "B", 4),
    ("  xchg_wait(bar_sum);\n", "A", 5),
    ("                              : select_bin(hist, part, 0, top_p, m, C, rank);\n", "A", 6),
    ("  block_minmax(lo, hi, m);  // its barriers also complete cand / ncand\n", "B", 7),
    ("  compact_candidates(data, nv, pred, cand, m, lo, hi);\n", "A", 8),
    ("    for (int i = tid; i < (C - 1) * words; i += kThreads) {\n", "B", 9),
    ("    xchg_wait(bar_msg);\n", "B", 9),
    ("  const uint32_t thr = max(thr_k, thr_p);\n", "A", 10),
    ("    if (tid == 0) m->total_slot = block_total;\n", "B", 11),
    ("  cluster_arrive_relaxed();\n", "A", 12),
    ("  cluster.barrier_wait();\n}\n", "B", 13),
]
# Inside block 0's refinement (16..20): counts read, candidates gathered, value level selected, value
# level done, digit levels done.
_REFINE_STAMPS = [
    ("    const ListCounts kc = list_counts_of(cnt, static_cast<uint32_t>(kCandCap) + 1u, static_cast<uint32_t>(kCandCap));\n",
     "A", 16),
    ("        gather_lists(cand, cand, kc.cnt, kc.incl, 1, C);  // its own list already leads\n        __syncthreads();\n",
     "A", 17),
    ("    const Selection s = select_bin(hist, part, tgt, -1.0f, m, C, rank);\n    uint32_t lo2", "B", 18),
    ("  while (lo < hi) {\n    const int bits", "B", 19),
    ("    lo = hi - lo > span ? hi - span : lo;\n  }\n", "A", 20),
]
STAMP_NAMES = ["start", "loaded", "max merged", "mass pass", "A (hist done)", "B (sums in)", "selected", "range vote", "range merged",
               "refined", "thr", "kept mass", "totals", "found", "exit"]


def _stamped():
    edits = []
    for anchor, where, k in _STAMPS + _REFINE_STAMPS:
        stamp = "  SV_STAMP(%d);\n" % k
        edits.append(("sampling/sample.cuh", anchor, anchor + stamp if where == "A" else stamp + anchor))
    last = "  cluster.barrier_wait();\n}\n"
    edits[len(_STAMPS) - 1] = ("sampling/sample.cuh", last, "  SV_STAMP(13);\n  cluster.barrier_wait();\n  SV_STAMP(14);\n}\n")
    return edits


_RED16 = [
    ("sampling/sample.cuh",
     """      uint32_t old[N];
#pragma unroll
      for (int e = 0; e < N; ++e) old[e] = w[e] ? atomicAdd(h32 + 2 * b[e], w[e]) : 0u;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        if (old[e] + w[e] < old[e]) atomicAdd(h32 + 2 * b[e] + 1, 1u);  // carry into the high word
      }
""",
     """#pragma unroll
      for (int e = 0; e < N; ++e) {
        if (w[e]) {
          atomicAdd(h32 + 2 * b[e], w[e] & 0xffffu);
          atomicAdd(h32 + 2 * b[e] + 1, w[e] >> 16);
        }
      }
"""),
    ("sampling/sample.cuh",
     """    m_first = warp_sum_u64(m_first);
    m_last = warp_sum_u64(m_last);
""",
     """    m_first = warp_sum_u64(m_first);
    m_last = warp_sum_u64(m_last);
    __syncthreads();
    for (int i = tid; i < kBins; i += kThreads) {
      const uint32_t lo16 = h32[2 * i];
      const uint32_t hi16 = h32[2 * i + 1];
      hist[i] = static_cast<uint64_t>(lo16) + (static_cast<uint64_t>(hi16) << 16);
    }
    __syncthreads();
"""),
]

# A name starting with "head" starts from the committed tree (git HEAD) instead of the working tree.
VARIANTS = {
    "shipped": [],
    "head": [],
    "timeline": _stamped(),
    "head_timeline": _stamped(),
    # The row load in 8 KB bulk copies instead of 16 KB: the argmax pass starts on an earlier chunk.
    "load_chunk_8k": [("sampling/sample.cuh", "constexpr int kLoadChunkVecs = 1024;",
                       "constexpr int kLoadChunkVecs = 512;"),
                      ("sampling/sample.cuh", "constexpr int kLoadChunks = 12;", "constexpr int kLoadChunks = 24;")],
    # The working tree with every block scanning its slice for its kept mass (no shortcut).
    "no_shortcut": [("sampling/sample.cuh", "  const bool shortcut = thr_p != 0u",
                     "  const bool shortcut = false && thr_p != 0u")],
    # The working tree without the value-linear refinement level (key digits only).
    "no_vlevel": [("sampling/sample.cuh", "constexpr bool kValueLevel = true;", "constexpr bool kValueLevel = false;")],
    "no_vlevel_timeline": [("sampling/sample.cuh", "constexpr bool kValueLevel = true;",
                            "constexpr bool kValueLevel = false;")] + _stamped(),
    # The top-p mass pass without carries: each element's fixed-point mass added as two 32-bit
    # reductions whose results are unused (low 16 bits and the rest into the bin's two words), then
    # the block's bins converted to 64-bit sums (fp32 slices: <= 49152 elements x 65535 fits).
    "red16": _RED16,
    # The top-p first level through select_bin (cluster barriers, remote loads) instead of
    # select_bin_push (the top-k first level keeps the pushes).
    "topp_select_barriers": [("sampling/sample.cuh",
                              """    const Selection s = C > 1 ? select_bin_push(hist, part, 0, top_p, m, C, rank, 1)
                              : select_bin(hist, part, 0, top_p, m, C, rank);""",
                              """    const Selection s = select_bin(hist, part, 0, top_p, m, C, rank);""")],
    "red16_timeline": _RED16 + _stamped(),
}
# Variants measured at 18ad591..b455360 (2026-11-30) and since merged into the kernel or dropped (bench/NOTES.md has
# the figures): the shortcut alone, mass bins by rounding, branch-free range test and final pass,
# a bitonic-sort refinement, the mass pass per vector, a relaxed exit arrive.

WRAPPER = r'''
#include <cstdint>
__device__ unsigned long long sv_tl[8192 * 32];
#define SV_STAMP(k)                                                                  \
  do {                                                                               \
    if (threadIdx.x == 0) {                                                          \
      unsigned long long t_;                                                         \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                         \
      if (blockIdx.x < 8192) sv_tl[blockIdx.x * 32 + (k)] = t_;                      \
      if ((k) == 0 && blockIdx.x < 8192) {                                           \
        unsigned s_;                                                                 \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s_));                              \
        sv_tl[blockIdx.x * 32 + 31] = s_;                                            \
      }                                                                              \
    }                                                                                \
  } while (0)
#include "cuda/sampling/sample.cuh"

extern "C" int sv_timeline_clear() {
  void* p = nullptr;
  cudaError_t e = cudaGetSymbolAddress(&p, sv_tl);
  if (e == cudaSuccess) e = cudaMemset(p, 0, sizeof(sv_tl));
  return static_cast<int>(e);
}

extern "C" int sv_timeline(void* dst) {
  return static_cast<int>(cudaMemcpyFromSymbol(dst, sv_tl, sizeof(sv_tl)));
}

// Top-p / top-k sampling of fp32 (dtype 0) or bf16 (dtype 2) rows with scalar parameters and
// per-row int64 seeds / offsets on the device; returns the cudaError_t of the launch.
extern "C" int sv_sample(const void* logits, long long rows, long long cols, long long stride, int dtype,
                         float temperature, float top_p, long long top_k, const long long* seeds,
                         const long long* offsets, long long* tokens, float* logprobs, void* stream) {
  fray::SampleParams p;
  p.logits = logits;
  p.row_stride = stride;
  p.rows = rows;
  p.cols = cols;
  p.temperature_value = temperature;
  p.top_p_value = top_p;
  p.top_k_value = top_k;
  p.seeds = reinterpret_cast<const int64_t*>(seeds);
  p.offsets = reinterpret_cast<const int64_t*>(offsets);
  p.tokens = reinterpret_cast<int64_t*>(tokens);
  p.logprobs = logprobs;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == 0) {
    p.dtype = fray::DType::kFloat32;
    return static_cast<int>(fray::launch_sample<float>(p, s));
  }
  p.dtype = fray::DType::kBFloat16;
  return static_cast<int>(fray::launch_sample<__nv_bfloat16>(p, s));
}
'''


def build(outdir, names):
    os.makedirs(outdir, exist_ok=True)
    for name in names or list(VARIANTS):
        work = tempfile.mkdtemp(prefix="sv-%s-" % name)
        try:
            if name.startswith("head"):
                subprocess.run("git -C %s archive HEAD cuda | tar -x -C %s" % (ROOT, work), shell=True, check=True)
            else:
                shutil.copytree(os.path.join(ROOT, "cuda"), os.path.join(work, "cuda"))
            for rel, old, new in VARIANTS[name]:
                path = os.path.join(work, "cuda", rel)
                text = open(path).read()
                if text.count(old) != 1:
                    raise SystemExit("%s: %r occurs %d times in %s" % (name, old, text.count(old), rel))
                open(path, "w").write(text.replace(old, new))
            src = os.path.join(work, "sv.cu")
            open(src, "w").write(WRAPPER)
            out = os.path.join(outdir, name + ".so")
            cmd = [os.environ.get("NVCC", "nvcc"), "-std=c++17", "-O3", "--expt-relaxed-constexpr",
                   "-gencode=arch=compute_90a,code=sm_90a", "-Xcompiler", "-fPIC", "-shared", "-cudart", "static",
                   "-lineinfo", "-Xptxas", "-v", "-I", work, "-o", out, src]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit("%s: nvcc failed\n%s" % (name, r.stderr))
            spills = [ln.strip() for ln in r.stderr.splitlines() if "spill" in ln]
            print("built %s (%s)" % (out, "; ".join(sorted(set(spills)))))
        finally:
            shutil.rmtree(work, ignore_errors=True)


def run(outdir):
    import ctypes

    import torch

    from fray.bench import median, time_rounds, time_us

    libs = {}
    for f in sorted(os.listdir(outdir)):
        if f.endswith(".so"):
            lib = ctypes.CDLL(os.path.join(outdir, f))
            lib.sv_sample.restype = ctypes.c_int
            lib.sv_sample.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_longlong,
                                      ctypes.c_int, ctypes.c_float, ctypes.c_float, ctypes.c_longlong,
                                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_void_p]
            libs[f[:-3]] = lib
    names = sorted(libs, key=lambda n: (n != "shipped", n))
    cases = []  # (shape name, logits, top_p, top_k)
    g = torch.Generator(device="cuda").manual_seed(0)
    for rows, cols in ((64, 131072), (256, 152064)):
        base = torch.randn(rows, cols, device="cuda", generator=g)
        for dist, scale in (("", 1.0), (":peaked", 8.0), (":flat", 0.1)):
            cases.append(("%dx%d%s top-p" % (rows, cols, dist), base * scale, 0.9, 0))
        cases.append(("%dx%d top-k 50 + top-p" % (rows, cols), base, 0.9, 50))
    failed = False
    print("%-34s" % "case" + "".join("%16s" % n for n in names))
    for shape, x, top_p, top_k in cases:
        rows, cols = x.shape
        seeds = torch.arange(rows, device="cuda", dtype=torch.int64) + 1234
        offsets = torch.zeros(rows, device="cuda", dtype=torch.int64)
        outs = {}
        fns = {}
        for n in names:
            tok = torch.full((rows,), -1, device="cuda", dtype=torch.int64)
            lp = torch.full((rows,), float("nan"), device="cuda")

            def fn(lib=libs[n], tok=tok, lp=lp):
                rc = lib.sv_sample(x.data_ptr(), rows, cols, cols, 0, 0.8, top_p, top_k, seeds.data_ptr(),
                                   offsets.data_ptr(), tok.data_ptr(), lp.data_ptr(),
                                   torch.cuda.current_stream().cuda_stream)
                if rc != 0:
                    raise RuntimeError("sv_sample: cudaError %d" % rc)
            fn()
            torch.cuda.synchronize()
            outs[n] = (tok.clone(), lp.clone())
            fns[n] = fn
        ref_tok, ref_lp = outs[names[0]]
        for n in names[1:]:
            tok, lp = outs[n]
            if not torch.equal(tok, ref_tok) or not torch.allclose(lp, ref_lp, rtol=1e-5, atol=1e-6):
                print("MISMATCH: %s on %s: %d of %d tokens differ" % (n, shape, int((tok != ref_tok).sum()), rows))
                failed = True
        t = time_rounds(fns, time_us)
        for n in names:
            if "timeline" in n and top_k == 0:
                try:
                    timeline(libs[n], fns[n], "%s %s" % (n, shape), rows)
                except Exception as exc:  # a broken analysis must not cost the timings
                    print("timeline %s %s failed: %r" % (n, shape, exc))
        cells = ["%16s" % "error" if isinstance(t[n], Exception) else "%13.1f us" % median(t[n]) for n in names]
        print("%-34s" % shape + "".join(cells), flush=True)
    if failed:
        raise SystemExit("some variants drew other tokens than %s" % names[0])


def timeline(lib, fn, title, rows):
    """One call of a stamped variant (after an L2 flush): phase durations per block and the waves."""
    import ctypes

    import numpy as np
    import torch

    scratch = torch.empty(64 * 2**20, dtype=torch.int32, device="cuda")
    if lib.sv_timeline_clear() != 0:
        raise RuntimeError("sv_timeline_clear failed")
    scratch.zero_()  # the L2 flush of do_bench
    fn()
    torch.cuda.synchronize()
    buf = (ctypes.c_ulonglong * (8192 * 32))()
    if lib.sv_timeline(ctypes.byref(buf)) != 0:
        raise RuntimeError("sv_timeline failed")
    a = np.frombuffer(buf, dtype=np.uint64).reshape(8192, 32).astype(np.int64)
    nblk = int((a[:, 0] > 0).sum())
    a = a[:nblk]
    sm = a[:, 31]
    t = a[:, :21].astype(np.float64)
    t0 = t[:, 0].min()
    t = np.where(t > 0, (t - t0) / 1000.0, np.nan)  # us since the first block started
    C = nblk // rows
    print("\n== %s: %d blocks (C %d), span %.1f us (first start -> last exit)" % (title, nblk, C,
                                                                            np.nanmax(t[:, 14])))
    rank = np.arange(nblk) % C
    print("  phase (median / p90 over blocks, us): " + ", ".join(
        "%s->%s %.2f/%.2f" % (STAMP_NAMES[k - 1], STAMP_NAMES[k], np.nanmedian(t[:, k] - t[:, k - 1]),
                               np.nanpercentile(t[:, k] - t[:, k - 1], 90))
        for k in range(1, 15) if np.isfinite(t[:, k] - t[:, k - 1]).any()))
    r0 = rank == 0
    d = t[:, 9] - t[:, 8]
    if np.isfinite(d).any():
        print("  range merged -> refined: rank 0 %.2f us, others %.2f us (median)" % (np.nanmedian(d[r0]),
                                                                                  np.nanmedian(d[~r0])))
    chain = [8, 16, 17, 18, 19, 20, 9]
    print("  block 0's refinement (median us): " + ", ".join(
        "%d->%d %.2f" % (p, q, np.nanmedian(t[r0, q] - t[r0, p])) for p, q in zip(chain, chain[1:])))
    d = t[:, 13] - t[:, 12]
    print("  totals -> found: median %.2f us, max per cluster median %.2f" % (
        np.nanmedian(d), np.nanmedian(np.nanmax(d.reshape(rows, C), axis=1))))
    row_start = t[:, 0].reshape(rows, C).min(axis=1)
    row_end = t[:, 14].reshape(rows, C).max(axis=1)
    print("  per row: start -> last exit median %.1f us; blocks' exits spread (max - min) median %.1f us" % (
        np.nanmedian(row_end - row_start),
        np.nanmedian(np.nanmax(t[:, 14].reshape(rows, C), axis=1) - np.nanmin(t[:, 14].reshape(rows, C), axis=1))))
    starts = np.sort(row_start)
    print("  row starts (us): " + " ".join("%.0f" % x for x in starts[:: max(1, rows // 32)]))
    # Co-residence: blocks on one SM whose [start, exit] overlap; same cluster or not, and the lag
    same = other = 0
    lags = []
    for s_ in np.unique(sm):
        idx = np.where(sm == s_)[0]
        for i in range(len(idx)):
            for j in range(i + 1, len(idx)):
                p, q = idx[i], idx[j]
                if t[p, 0] < t[q, 14] and t[q, 0] < t[p, 14]:
                    if p // C == q // C:
                        same += 1
                    else:
                        other += 1
                        lags.append(abs(t[p, 0] - t[q, 0]))
    print("  co-resident pairs: same cluster %d, different clusters %d (start lag median %.1f us, p90 %.1f)" % (
        same, other, np.median(lags) if lags else float("nan"), np.percentile(lags, 90) if lags else float("nan")))
    print("  distinct SMs %d; clusters' SM sets: %s" % (len(np.unique(sm)), " | ".join(
        ",".join(str(int(x)) for x in sm[c * C:(c + 1) * C]) for c in range(min(4, rows)))))


def ncu_target(outdir, name):
    """Three launches of one variant on 256x152064 top-p (for ncu --launch-skip 2 --launch-count 1)."""
    import ctypes

    import torch

    lib = ctypes.CDLL(os.path.join(outdir, name + ".so"))
    x = torch.randn(256, 152064, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    seeds = torch.arange(256, device="cuda", dtype=torch.int64) + 1234
    offsets = torch.zeros(256, device="cuda", dtype=torch.int64)
    tok = torch.empty(256, device="cuda", dtype=torch.int64)
    lp = torch.empty(256, device="cuda")
    for _ in range(3):
        rc = lib.sv_sample(ctypes.c_void_p(x.data_ptr()), ctypes.c_longlong(256), ctypes.c_longlong(152064),
                           ctypes.c_longlong(152064), 0, ctypes.c_float(0.8), ctypes.c_float(0.9), ctypes.c_longlong(0),
                           ctypes.c_void_p(seeds.data_ptr()), ctypes.c_void_p(offsets.data_ptr()),
                           ctypes.c_void_p(tok.data_ptr()), ctypes.c_void_p(lp.data_ptr()), ctypes.c_void_p(0))
        if rc != 0:
            raise SystemExit("sv_sample: cudaError %d" % rc)
    torch.cuda.synchronize()
    print("ran", name)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("build", "run", "ncu"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "ncu":
        ncu_target(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[2])
