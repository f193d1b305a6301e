"""Standalone check and timing of the GEMM kernels (cuda/gemm) on the GPU machine, next to torch.mm.

Writes one tiny translation unit per configuration (the JIT contract's form: includes, a Config,
FRAY_*_ENTRY), compiles them all with nvcc in parallel (the contract's flags, sm_90a) into
/tmp/fray_gemm_sm90, loads each shared object with ctypes (FrayArgs built here, no fray.jit), checks
every configuration against a float64 reference on poisoned outputs at awkward shapes, then times
the correct ones at the issue's benchmark shapes against torch.mm (cuBLAS), same process, L2
flushed (triton.testing.do_bench, median). Prints a table; JSON lines go to $OUT/gemm_sm90.jsonl.

    CUTLASS_INCLUDE=<.../cutlass_library/source/include> python3 bench/micro/gemm_sm90.py [--only SUBSTR] [--no-bench]
    (or PYTHONPATH with the nvidia-cutlass package: the include dir is cutlass_library/source/include)
    python3 bench/micro/gemm_sm90.py --compile-only --only smallm      # here: build, registers, spills
    python3 bench/micro/gemm_sm90.py --only smallm        # GPU: the small-M rows only (46 configs, ~2 min)
    python3 bench/micro/gemm_sm90.py --only sm90_bf16_nk_bf16_ --budget-s 480   # GPU: the large-tile
        candidates in bf16 [N, K] (27 configs, bench/NOTES.md's hypotheses; ~5-7 min)

Shapes whose K or N is not a multiple of 8 (TMA's 16-byte rows) are zero-padded here the way the op
layer will pad them: K with zeros in a and b (exact), N by a wider output whose extra columns are
dropped. One unaligned call per kernel checks that the entry point refuses it with a message.
"""
import argparse
import ctypes
import datetime
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = "/tmp/fray_gemm_sm90"


def cutlass_include():
    inc = os.environ.get("CUTLASS_INCLUDE")
    if not inc:
        import importlib.util
        # Located, not imported: importing runs the package's kernel-generator modules, unneeded here.
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None or not spec.submodule_search_locations:
            sys.exit("CUTLASS headers not found: set CUTLASS_INCLUDE or put the nvidia-cutlass package on PYTHONPATH")
        inc = os.path.join(list(spec.submodule_search_locations)[0], "source", "include")
    if not os.path.isdir(os.path.join(inc, "cute")):
        sys.exit(f"CUTLASS headers not found under {inc} (expected cute/ and cutlass/ there)")
    return inc


def nvcc_flags(inc):
    return ["-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
            "--expt-relaxed-constexpr", "--expt-extended-lambda", "-lineinfo",
            "-gencode=arch=compute_90a,code=sm_90a", "-DNDEBUG", f"-I{ROOT}", f"-I{inc}", "-Xptxas", "-v"]


CT = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t", "fp32": "float"}
NT = {"bf16": "__nv_bfloat16", "fp16": "__half", "fp32": "float"}


def sm90(dtype="bf16", layout="nk", out=None, bias=False, tile=(128, 256, 64), cluster=(2, 1), sched="coop",
         stages=0, raster="auto", swizzle=1, epi=0, streamk=False, swap=False, splits=1):
    out = out or dtype
    name = (f"sm90_{dtype}_{layout}_{out}{'_bias' if bias else ''}{'_swap' if swap else ''}_{tile[0]}x{tile[1]}x{tile[2]}"
            f"_c{cluster[0]}x{cluster[1]}_{sched}_s{stages}_r{raster}_w{swizzle}{f'_e{epi}' if epi else ''}"
            f"{'_sk' if streamk else ''}{f'_z{splits}' if splits > 1 else ''}")
    src = (f'#include "cuda/gemm/gemm_sm90.cuh"\n'
           f"using Config = fray::gemm::Sm90GemmConfig<{CT[dtype]}, fray::gemm::kLayout{layout.upper()}, {CT[out]}, "
           f"{'true' if bias else 'false'}, {tile[0]}, {tile[1]}, {tile[2]}, {cluster[0]}, {cluster[1]}, "
           f"fray::gemm::{'kCooperative' if sched == 'coop' else 'kPingpong'}, {stages}, "
           f"fray::gemm::{ {'auto': 'kRasterHeuristic', 'm': 'kRasterAlongM', 'n': 'kRasterAlongN'}[raster]}, {swizzle}, "
           f"{epi}, fray::gemm::{'kStreamK' if streamk else 'kPersistent'}, {'true' if swap else 'false'}, {splits}>;\n"
           f"FRAY_GEMM_ENTRY(Config)\n")
    # Swap-AB tiles run over b's rows: correct at any M, timed only at M <= 128 (their purpose).
    return dict(kind="sm90", name=name, src=src, dtype=dtype, layout=layout, out=out, bias=bias, max_m=None,
                swap=swap, bench_max_m=128 if swap else None)


def small_m(dtype="bf16", out=None, bias=False, mtiles=1, warps=8, unroll=4, stages=0):
    out = out or dtype
    name = f"smallm_{dtype}_nk_{out}{'_bias' if bias else ''}_m{mtiles * 8}_w{warps}_u{unroll}_s{stages}"
    src = (f'#include "cuda/gemm/gemm_small_m.cuh"\n'
           f"using Config = fray::gemm::small_m::SmallMConfig<{NT[dtype]}, {NT[out]}, {'true' if bias else 'false'}, "
           f"{mtiles}, {warps}, {unroll}, {stages}>;\n"
           f"FRAY_GEMM_SMALL_M_ENTRY(Config)\n")
    return dict(kind="small_m", name=name, src=src, dtype=dtype, layout="nk", out=out, bias=bias, max_m=mtiles * 8)


def small_m_bulk(dtype="bf16", out=None, bias=False, mtiles=1, rowtiles=1, warps=4, tile_k=512, stages=4, split_k=1,
                 xs=False):
    out = out or dtype
    name = (f"smallm_bulk_{dtype}_nk_{out}{'_bias' if bias else ''}_m{mtiles * 8}_r{rowtiles * 16}_w{warps}_k{tile_k}"
            f"_s{stages}_z{split_k}{'_xs' if xs else ''}")
    src = (f'#include "cuda/gemm/gemm_small_m.cuh"\n'
           f"using Config = fray::gemm::small_m::SmallMBulkConfig<{NT[dtype]}, {NT[out]}, {'true' if bias else 'false'}, "
           f"{mtiles}, {rowtiles}, {warps}, {tile_k}, {stages}, {split_k}, {'true' if xs else 'false'}>;\n"
           f"FRAY_GEMM_SMALL_M_ENTRY(Config)\n")
    return dict(kind="small_m", name=name, src=src, dtype=dtype, layout="nk", out=out, bias=bias, max_m=mtiles * 8)


def configs():
    cs = []
    # Speed candidates (bf16, nn.Linear's layout): the tile shapes and clusters a cuBLAS-class Hopper
    # GEMM picks among at 4096-8192 (128x256 and 256x128 cooperative, multicast along the longer
    # cluster side; 128x128 ping-pong, whose epilogue hides under the other warpgroup's mainloop).
    cs.append(sm90(tile=(128, 256, 64), cluster=(2, 1)))
    cs.append(sm90(tile=(128, 256, 64), cluster=(1, 2)))
    cs.append(sm90(tile=(128, 256, 64), cluster=(2, 1), swizzle=4))
    cs.append(sm90(tile=(128, 256, 64), cluster=(2, 1), raster="m"))
    cs.append(sm90(tile=(256, 128, 64), cluster=(1, 2)))
    cs.append(sm90(tile=(256, 128, 64), cluster=(2, 1)))
    cs.append(sm90(tile=(128, 128, 64), cluster=(1, 1), sched="pingpong"))
    cs.append(sm90(tile=(128, 128, 64), cluster=(2, 1), sched="pingpong"))
    cs.append(sm90(tile=(128, 128, 64), cluster=(1, 2), sched="pingpong"))
    cs.append(sm90(tile=(128, 256, 64), cluster=(1, 1), stages=3))
    # The 4096^3 / 8192^3 gap to cuBLAS (0.92x / 0.90x at 8580a3e): one hypothesis per group,
    # written down with its prediction in bench/NOTES.md (GEMM, large-shape candidates).
    best = dict(tile=(256, 128, 64), cluster=(1, 2))
    for w in (2, 4, 8):                                   # H1 L2 reuse at 8192^3: swizzle
        cs.append(sm90(swizzle=w, **best))
    cs.append(sm90(raster="m", **best))                   # H2 raster order, forced either way
    cs.append(sm90(raster="n", **best))
    cs.append(sm90(raster="n", swizzle=4, **best))
    cs.append(sm90(tile=(256, 128, 64), cluster=(2, 2)))  # H3 wider multicast: A and B both shared
    cs.append(sm90(streamk=True, **best))                 # H4 the 3.88-wave tail at 4096^3: stream-K
    cs.append(sm90(tile=(128, 256, 64), cluster=(2, 1), streamk=True))
    cs.append(sm90(epi=64, **best))                       # H5 epilogue subtile: fewer, larger TMA stores
    cs.append(sm90(epi=16, **best))                       #    or a smaller smem footprint
    cs.append(sm90(stages=3, epi=128, **best))            #    whole-row stores at one stage less
    cs.append(sm90(tile=(256, 128, 32), cluster=(1, 2)))  # H6 K-tile 32: 8 stages, more barriers
    cs.append(sm90(tile=(128, 128, 128), cluster=(1, 2), sched="pingpong"))  # H7 K-tile 128, 3 stages
    cs.append(sm90(tile=(64, 256, 64), cluster=(1, 2), sched="pingpong"))    # H8 ping-pong, N-wide tile
    cs.append(sm90(tile=(128, 256, 64), cluster=(2, 1), sched="coop", swizzle=8))  # H1 on the other tile
    # Correctness across the template's other axes, on the first tile shape.
    for dtype in ("bf16", "fp16"):
        for layout in ("nk", "kn"):
            for bias in (False, True):
                if (dtype, layout, bias) != ("bf16", "nk", False):
                    cs.append(sm90(dtype=dtype, layout=layout, bias=bias))
    cs.append(sm90(out="fp32", bias=True))
    cs.append(sm90(dtype="fp16", layout="kn", out="fp32", tile=(128, 128, 64), cluster=(1, 2), sched="pingpong"))
    # Small M, per-thread loads: the best of the 8580a3e run at each M bucket, kept as baselines
    # (1x4096x4096: m8 w16 u4 s0 18.40 us; 16x14336x4096: m16 w8 u2 s4), and the template's other
    # axes for correctness.
    cs.append(small_m(mtiles=1, warps=16, unroll=4, stages=0))
    cs.append(small_m(mtiles=2, warps=8, unroll=2, stages=4))
    cs.append(small_m(mtiles=8, warps=8, unroll=2, stages=4))
    cs.append(small_m(dtype="fp16", out="fp32", mtiles=1))
    # Small M, bulk copies: rows of x per CTA (8 * mtiles), 16-row tiles of w per CTA, consumer
    # warps, K per stage, stages, split-K cluster size. Grids at 1x4096x4096: 256 row tiles x
    # split_k CTAs; the 4096x4096 weights are 32 MiB, ~250 KB per SM.
    for mtiles in (1, 2, 8):
        for rowtiles, warps, tile_k, stages, split_k in ((1, 4, 512, 4, 1), (1, 4, 512, 4, 2), (1, 4, 256, 4, 4),
                                                         (1, 4, 512, 6, 1), (2, 4, 256, 4, 2), (2, 8, 512, 4, 1),
                                                         (1, 8, 1024, 3, 1), (1, 4, 256, 8, 2)):
            cs.append(small_m_bulk(mtiles=mtiles, rowtiles=rowtiles, warps=warps, tile_k=tile_k, stages=stages,
                                   split_k=split_k))
    # M = 64: 64 rows of x per chunk (8 16-byte loads per thread) would be re-read from L2 by every
    # 16-row CTA (4x the weight bytes); 64-row CTAs share each x chunk through L1 across row tiles.
    for rowtiles, warps, tile_k, stages, split_k in ((4, 8, 128, 4, 1), (4, 8, 256, 3, 1), (2, 8, 256, 4, 1),
                                                     (4, 4, 128, 6, 2)):
        cs.append(small_m_bulk(mtiles=8, rowtiles=rowtiles, warps=warps, tile_k=tile_k, stages=stages,
                               split_k=split_k))
    # x copied with each stage (one copy per row of x beside the weight rows).
    for mtiles, rowtiles, warps, tile_k, stages, split_k in ((2, 1, 4, 512, 4, 1), (2, 1, 4, 512, 4, 2),
                                                             (2, 2, 4, 256, 4, 1), (2, 1, 4, 256, 6, 2),
                                                             (8, 1, 4, 256, 4, 2), (8, 2, 8, 256, 3, 1),
                                                             (8, 1, 4, 128, 6, 1), (1, 1, 4, 512, 4, 2)):
        cs.append(small_m_bulk(mtiles=mtiles, rowtiles=rowtiles, warps=warps, tile_k=tile_k, stages=stages,
                               split_k=split_k, xs=True))
    cs.append(small_m_bulk(dtype="fp16", out="fp32", bias=True, mtiles=8, tile_k=256, split_k=2, xs=True))
    cs.append(small_m_bulk(dtype="fp16", mtiles=2, split_k=2))
    cs.append(small_m_bulk(bias=True, mtiles=2, rowtiles=2, tile_k=256, split_k=2))
    cs.append(small_m_bulk(bias=True, mtiles=1))
    cs.append(small_m_bulk(out="fp32", bias=True, mtiles=8, split_k=4, tile_k=256))
    cs.append(small_m_bulk(dtype="fp16", out="fp32", mtiles=1, rowtiles=2, warps=8))
    # Swap-AB (D^T = B^T A^T): b's rows fill the wgmma's 64-row side, M (1..64) its n8-n64 side;
    # too few 128-row tiles for 132 SMs at N = 4096 (32), so K is split: stream-K's heuristic, or
    # split-K into a fixed count.
    for tile, sched, streamk, splits in (((128, 16, 64), "coop", True, 1), ((128, 16, 128), "coop", True, 1),
                                         ((128, 16, 64), "coop", False, 1), ((128, 16, 64), "coop", True, 4),
                                         ((128, 16, 128), "coop", True, 4), ((64, 16, 128), "pingpong", False, 1),
                                         ((128, 8, 128), "coop", True, 1), ((128, 32, 64), "coop", True, 1),
                                         ((128, 64, 64), "coop", True, 1), ((128, 64, 64), "coop", False, 1),
                                         ((256, 16, 64), "coop", True, 1)):
        cs.append(sm90(tile=tile, cluster=(1, 1), sched=sched, streamk=streamk, swap=True, splits=splits))
    for dtype, layout, out, bias in (("fp16", "nk", None, False), ("bf16", "kn", None, False), ("bf16", "nk", None, True),
                                     ("fp16", "kn", "fp32", True)):
        cs.append(sm90(dtype=dtype, layout=layout, out=out, bias=bias, tile=(128, 16, 64), cluster=(1, 1), streamk=True,
                       swap=True))
    return cs


def compile_one(c, flags):
    os.makedirs(BUILD, exist_ok=True)
    cu = os.path.join(BUILD, c["name"] + ".cu")
    so = os.path.join(BUILD, c["name"] + ".so")
    with open(cu, "w") as f:
        f.write(c["src"])
    nvcc = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
    cmd = [nvcc] + flags + ["-o", so, cu]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    c["compile_s"] = time.time() - t0
    log = p.stdout + p.stderr
    if p.returncode != 0:
        c["error"] = f"nvcc failed ({p.returncode}): {' '.join(cmd)}\n" + "\n".join(log.splitlines()[-40:])
        return c
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", log)]
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", log)]
    c["regs"] = max(regs) if regs else None
    c["spills"] = max(spills) if spills else None
    c["so"] = so
    return c


class FrayArgs(ctypes.Structure):
    _fields_ = [("ptrs", ctypes.POINTER(ctypes.c_uint64)), ("num_ptrs", ctypes.c_int32),
                ("ints", ctypes.POINTER(ctypes.c_int64)), ("num_ints", ctypes.c_int32),
                ("floats", ctypes.POINTER(ctypes.c_double)), ("num_floats", ctypes.c_int32),
                ("device", ctypes.c_int32), ("stream", ctypes.c_uint64)]


class Kernel:
    def __init__(self, so):
        self.lib = ctypes.CDLL(so)
        self.lib.fray_jit_launch.argtypes = [ctypes.POINTER(FrayArgs), ctypes.c_char_p, ctypes.c_int32]
        self.lib.fray_jit_launch.restype = ctypes.c_int
        self.lib.fray_jit_workspace_bytes.argtypes = [ctypes.POINTER(FrayArgs)]
        self.lib.fray_jit_workspace_bytes.restype = ctypes.c_int64
        self.lib.fray_jit_describe.restype = ctypes.c_char_p
        self.err = ctypes.create_string_buffer(512)

    def describe(self):
        return self.lib.fray_jit_describe().decode()

    def prepare(self, ptrs, ints, device, stream):
        """A callable that launches with a prebuilt FrayArgs (keeps ctypes packing out of the timing)."""
        import torch
        keep = []

        def pack(ptrs):
            p = (ctypes.c_uint64 * len(ptrs))(*ptrs)
            i = (ctypes.c_int64 * len(ints))(*ints)
            a = FrayArgs(p, len(ptrs), i, len(ints), None, 0, device, stream)
            keep.append((p, i, a))
            return a

        args = pack(ptrs)
        ws = self.lib.fray_jit_workspace_bytes(ctypes.byref(args))
        if ws < 0:
            raise RuntimeError("fray_jit_workspace_bytes failed")
        if ws > 0:
            buf = torch.empty(ws, dtype=torch.uint8, device="cuda")
            keep.append(buf)
            args = pack(list(ptrs) + [buf.data_ptr()])
        ref = ctypes.byref(args)
        launch, err = self.lib.fray_jit_launch, self.err

        def run():
            if launch(ref, err, len(err)) != 0:
                raise RuntimeError(err.value.decode())

        run.keep = keep
        return run


def tdt(name):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def make_inputs(c, m, n, k, gen):
    """a [M, Kp], b [N, Kp] or [Kp, Np], bias [Np], out [M, Np] poisoned; K and N padded to 8."""
    import torch
    dt = tdt(c["dtype"])
    kp, np_ = -(-k // 8) * 8, -(-n // 8) * 8
    a = torch.zeros(m, kp, dtype=dt, device="cuda")
    a[:, :k] = torch.randn(m, k, generator=gen, device="cuda").to(dt)
    w = torch.randn(n, k, generator=gen, device="cuda").to(dt)
    if c["layout"] == "nk":
        b = torch.zeros(np_, kp, dtype=dt, device="cuda")
        b[:n, :k] = w
    else:
        b = torch.zeros(kp, np_, dtype=dt, device="cuda")
        b[:k, :n] = w.t()
    bias = None
    if c["bias"]:
        bias = torch.zeros(np_, dtype=dt, device="cuda")
        bias[:n] = torch.randn(n, generator=gen, device="cuda").to(dt)
    out = torch.full((m, np_), float("nan"), dtype=tdt(c["out"]), device="cuda")
    ref = a[:, :k].double() @ w.double().t()
    if bias is not None:
        ref += bias[:n].double()
    return a, b, bias, out, ref, kp, np_


def launcher(kern, c, a, b, bias, out, m, np_, kp):
    import torch
    ldb = b.stride(0)
    ptrs = [a.data_ptr(), b.data_ptr(), bias.data_ptr() if bias is not None else 0, out.data_ptr()]
    ints = [m, np_, kp, a.stride(0), ldb, out.stride(0)]
    return kern.prepare(ptrs, ints, torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)


def check(kern, c, m, n, k, gen):
    import torch
    a, b, bias, out, ref, kp, np_ = make_inputs(c, m, n, k, gen)
    launcher(kern, c, a, b, bias, out, m, np_, kp)()
    torch.cuda.synchronize()
    got = out[:, :n].double()
    eps_out = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -20}[c["out"]]
    # Inputs are exact in the reference, so the error is the output's rounding (relative) plus the
    # fp32 accumulation's, which grows with K (absolute, against |a| |b| ~ 1 per product).
    tol = eps_out * ref.abs() + 16 * 2.0 ** -24 * k
    bad = ~((got - ref).abs() <= tol)  # NaN (poison left in place) counts as bad
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        r, col = divmod(i, n)
        return (f"{int(bad.sum())}/{bad.numel()} wrong, first at [{r}, {col}]: got {float(got[r, col])} "
                f"want {float(ref[r, col])}")
    return None


def check_refusal(kern, c):
    """An unaligned row stride must come back as an error message, not a launch."""
    import torch
    dt = tdt(c["dtype"])
    a = torch.zeros(8, 24, dtype=dt, device="cuda")
    b = torch.zeros(16, 24, dtype=dt, device="cuda")
    out = torch.zeros(8, 16, dtype=tdt(c["out"]), device="cuda")
    bias = torch.zeros(16, dtype=dt, device="cuda") if c["bias"] else None
    ptrs = [a.data_ptr(), b.data_ptr(), bias.data_ptr() if bias is not None else 0, out.data_ptr()]
    ints = [8, 16, 20, 20, 24, 16]  # lda = 20 elements: 40 bytes, not a multiple of 16
    args = FrayArgs((ctypes.c_uint64 * 4)(*ptrs), 4, (ctypes.c_int64 * 6)(*ints), 6, None, 0,
                    torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)
    rc = kern.lib.fray_jit_launch(ctypes.byref(args), kern.err, len(kern.err))
    return None if rc != 0 and kern.err.value else "an unaligned lda was accepted"


CHECK_SHAPES = [(1, 4096, 4096), (7, 127, 1000), (127, 1000, 4097), (1000, 4097, 127), (4097, 1000, 7),
                (1000, 1000, 4097), (127, 4097, 1000), (4096, 4097, 4096), (1, 7, 127), (64, 14336, 4096)]
SMALL_CHECK = [(1, 4096, 4096), (1, 7, 127), (7, 127, 1000), (1, 4097, 4097), (16, 14336, 4096), (13, 1000, 4097),
               (64, 4096, 14336), (64, 127, 7), (7, 4096, 4096), (16, 4097, 1000)]
BENCH_LARGE = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096), (4096, 4096, 14336)]
BENCH_NK = [(4096, 4096), (14336, 4096), (4096, 14336)]
BENCH_M = [1, 16, 64, 128]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="substring of the configuration names to keep")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop benchmarking new shapes after this many seconds")
    ap.add_argument("--compile-only", action="store_true", help="build and report registers / spills, no GPU")
    opts = ap.parse_args()
    t_start = time.time()
    flags = nvcc_flags(cutlass_include())
    cs = [c for c in configs() if opts.only in c["name"]]
    workers = min(len(cs), os.cpu_count() or 4)
    print(f"compiling {len(cs)} configurations with {workers} workers into {BUILD}", flush=True)
    with ThreadPoolExecutor(workers) as ex:
        cs = list(ex.map(lambda c: compile_one(c, flags), cs))
    for c in cs:
        if "error" in c:
            print(f"COMPILE ERROR {c['name']}:\n{c['error']}\n", flush=True)
        else:
            print(f"built {c['name']:60s} {c['compile_s']:6.1f} s  regs {c['regs']}  spills {c['spills']}", flush=True)
    print(f"compiled in {time.time() - t_start:.0f} s", flush=True)
    if opts.compile_only:
        sys.exit(1 if any("error" in c for c in cs) else 0)

    import torch
    import triton
    import triton.testing

    gen = torch.Generator(device="cuda").manual_seed(0)
    good = []
    for c in cs:
        if "error" in c:
            continue
        kern = Kernel(c["so"])
        c["describe"] = kern.describe()
        shapes = SMALL_CHECK if c["kind"] == "small_m" else CHECK_SHAPES
        fails = []
        for m, n, k in shapes:
            if c["max_m"] and m > c["max_m"]:
                continue
            try:
                e = check(kern, c, m, n, k, gen)
            except RuntimeError as ex:
                e = f"launch error: {ex}"
            if e:
                fails.append(f"{m}x{n}x{k}: {e}")
        e = check_refusal(kern, c)
        if e:
            fails.append(e)
        c["check"] = "ok" if not fails else "; ".join(fails)
        print(f"check {c['name']:60s} {'ok' if not fails else 'FAILED'}  [{c['describe']}]", flush=True)
        for f in fails:
            print(f"    {f}", flush=True)
        if not fails:
            c["kern"] = kern
            good.append(c)
    print(f"{len(good)}/{len(cs)} configurations correct ({time.time() - t_start:.0f} s)", flush=True)
    if opts.no_bench:
        return

    out_dir = os.environ.get("OUT", ".")
    jsonl = open(os.path.join(out_dir, "gemm_sm90.jsonl"), "w")
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or None
    except OSError:
        commit = None
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, commit=commit, date=datetime.date.today().isoformat())

    def emit(impl, shape, dtype, us, m, n, k, extra=None):
        tflops = 2.0 * m * n * k / us / 1e6
        gbps = (n * k * 2) / us / 1e3 if m <= 64 else None
        rec = dict(op="gemm", impl=impl, shape=shape, dtype=dtype, us=round(us, 3), gbps=gbps and round(gbps, 1),
                   tflops=round(tflops, 2), **meta)
        if extra:
            rec.update(extra)
        jsonl.write(json.dumps(rec) + "\n")
        jsonl.flush()
        return tflops, gbps

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3

    shapes = list(BENCH_LARGE) + [(m, n, k) for m in BENCH_M for n, k in BENCH_NK]
    print(f"\n{'shape':>18s} {'impl':60s} {'us':>9s} {'TFLOP/s':>8s} {'TB/s(w)':>8s} {'x cuBLAS':>8s}", flush=True)
    for m, n, k in shapes:
        for dtype in ("bf16", "fp16"):
            cands = [c for c in good if c["dtype"] == dtype and c["layout"] == "nk" and not c["bias"]
                     and c["out"] == dtype and (c["max_m"] is None or m <= c["max_m"])
                     and (c.get("bench_max_m") is None or m <= c["bench_max_m"])]
            if dtype == "fp16" and (m, n, k) not in ((4096, 4096, 4096), (1, 4096, 4096), (16, 14336, 4096)):
                continue
            if not cands:
                continue
            shape = f"{m}x{n}x{k}"
            a = torch.randn(m, k, device="cuda").to(tdt(dtype))
            b = torch.randn(n, k, device="cuda").to(tdt(dtype))
            o = torch.empty(m, n, device="cuda", dtype=tdt(dtype))
            bt = b.t()
            ref_us = bench(lambda: torch.mm(a, bt, out=o))
            emit("torch.mm", shape, dtype, ref_us, m, n, k)
            tf, gb = 2.0 * m * n * k / ref_us / 1e6, n * k * 2 / ref_us / 1e3
            print(f"{shape:>18s} {'torch.mm (cuBLAS) ' + dtype:60s} {ref_us:9.2f} {tf:8.1f} {gb / 1e3:8.2f} {1.0:8.3f}",
                  flush=True)
            rows = []
            for c in cands:
                if c["kind"] == "sm90" and m < 64 and not c.get("swap"):
                    continue  # a 128-row tile at M = 1..16 is the small-M kernel's job
                run = launcher(c["kern"], c, a, b, None, o, m, n, k)
                try:
                    us = bench(run)
                except RuntimeError as ex:
                    print(f"{shape:>18s} {c['name']:60s} launch error: {ex}", flush=True)
                    continue
                emit("fray.cuda", shape, dtype, us, m, n, k, dict(config=c["name"]))
                rows.append((us, c["name"]))
            for us, name in sorted(rows):
                tf, gb = 2.0 * m * n * k / us / 1e6, n * k * 2 / us / 1e3
                print(f"{shape:>18s} {name:60s} {us:9.2f} {tf:8.1f} {gb / 1e3:8.2f} {ref_us / us:8.3f}", flush=True)
            if time.time() - t_start > opts.budget_s:
                print(f"stopping early: the run's time budget ({opts.budget_s:.0f} s) is spent", flush=True)
                return
    print(f"done in {time.time() - t_start:.0f} s; JSON lines in {os.path.join(out_dir, 'gemm_sm90.jsonl')}")


if __name__ == "__main__":
    main()
