"""A/B variants of the CUDA sampling kernel in one GPU process (standalone; not a Bazel target).

Each variant is the shipped cuda/ tree with a few exact text edits (VARIANTS below), compiled into its
own shared library exposing `sv_sample`; the GPU run checks that every variant draws the shipped
kernel's tokens (and logprobs) on the benchmark inputs, then times them all in interleaved rounds
with the L2 flushed (fray.bench.time_us, as bench/sampling). One device call then answers several
kernel questions at once, where a rebuilt bundle answers one.

    python3 bench/micro/sample_variants.py build OUTDIR [NAME ...]   # here (nvcc, sm_90a)
    python3 bench/micro/sample_variants.py run OUTDIR                # on the GPU machine

Add a variant: a name and a list of (file under cuda/, old text, new text); each old text must occur
exactly once in that file.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

VARIANTS = {
    "shipped": [],
    # The row load in 8 KB bulk copies instead of 16 KB: the argmax pass starts on an earlier chunk.
    "load_chunk_8k": [("sampling/sample.cuh", "constexpr int kLoadChunkVecs = 1024;",
                       "constexpr int kLoadChunkVecs = 512;"),
                      ("sampling/sample.cuh", "constexpr int kLoadChunks = 12;", "constexpr int kLoadChunks = 24;")],
    # The final pass's kept mass branch-free, so the elements of a vector overlap (session 7 tried
    # this only together with branch-free first-level passes, which slowed peaked rows).
    "final_branchfree": [("sampling/sample.cuh", """    if (x < thr_v) return 0u;  // key(x) < thr
    const float w = weight_f(x, r);
    return w >= r.min_p ? to_fixed(w) : 0u;""", """    const float w = weight_f(x, r);
    const uint32_t fixed = to_fixed(w);
    return x < thr_v || !(w >= r.min_p) ? 0u : fixed;""")],
}

WRAPPER = r'''
#include "cuda/sampling/sample.cuh"

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
                   "-Xptxas", "-v", "-I", work, "-o", out, src]
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
        cells = ["%16s" % "error" if isinstance(t[n], Exception) else "%13.1f us" % median(t[n]) for n in names]
        print("%-34s" % shape + "".join(cells), flush=True)
    if failed:
        raise SystemExit("some variants drew other tokens than %s" % names[0])


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("build", "run"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3:])
    else:
        run(sys.argv[2])
