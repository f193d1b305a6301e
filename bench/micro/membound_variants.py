"""Memory-bound bf16 variants side by side with the peers, in one process (bench/NOTES.md,
"Memory-bound families (issue 3)").

  python3 bench/micro/membound_variants.py [LIB.so] [--ops softmax,silu] [--rounds 3]
                                           [--persist-k 1,2] [--json PATH] [--no-compile]
                                           [--no-placement]

LIB.so: built by bench/micro/build_membound.sh (default /tmp/membound_variants.so).

Ops (bf16 in, bf16 out):
  softmax  x [16384, 8192] (randn * 3, seed 0, as bench/softmax) -> y;   bytes = 2 * R * W * 2
  silu_mul x [16384, 16384] (randn, seed 0; gate = x[:, :8192], up = x[:, 8192:]) -> out
           [16384, 8192];                                              bytes = 3 * R * d * 2
Every variant of the library is checked first (output poisoned with NaN, compared element-wise
with the fp32 torch reference: |y - ref| <= |ref| * (2^-8 + 1e-5) + 1e-12, i.e. one bf16
rounding), on the big shape and on small shapes with padded row strides and row counts that do not
divide the grids (the padding must stay NaN). Then every variant and the peers are timed in
interleaved rounds (each round: every impl once, in a rotated order) with
triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") (256 MB L2 flush before
each call), as fray.bench does. Last, a placement check (--no-placement skips it): a few variants
timed with their output in the default buffer (allocated right after x) and in a separately
allocated pool at several offsets, with the peers in the same rounds: the output's placement alone
moved the shipped softmax kernel by ~2% (134.0 vs 131.5-132.4 us), as much as the gap to Liger.

Peers: fray (backend="cuda", out= preallocated as in bench/softmax and bench/activation; skipped
when fray does not import), Liger-Kernel (LigerSoftmaxFunction; LigerSiLUMulFunction on
contiguous gate / up halves prepared outside the timing, and LigerFusedGateUpSiLUMulFunction on
x when the installed version has it), torch.compile of the composite, torch eager built-in.
"ratio vs best peer" = best non-Fray peer time / impl time (> 1: the impl is faster).
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SOFTMAX_SHAPE = (16384, 8192)
SILU_SHAPE = (16384, 8192)  # rows, d (output columns); x is [rows, 2 d]
BF16_TOL = 2.0 ** -8 + 1e-5  # one RNE rounding to bf16 (half an ulp <= 2^-8 relative) + approx slop
ATOL = 1e-12

FAILS = []


# ---------------------------------------------------------------------------------------------
# library
# ---------------------------------------------------------------------------------------------
class Lib:
    def __init__(self, path):
        self.lib = ctypes.CDLL(os.path.abspath(path))
        L = self.lib
        i64, vp, ci = ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int
        for op in ("softmax", "silu"):
            getattr(L, "mb_%s_count" % op).restype = ci
            getattr(L, "mb_%s_count" % op).argtypes = []
            getattr(L, "mb_%s_name" % op).restype = ctypes.c_char_p
            getattr(L, "mb_%s_name" % op).argtypes = [ci]
            getattr(L, "mb_%s_persistent" % op).restype = ci
            getattr(L, "mb_%s_persistent" % op).argtypes = [ci]
            f = getattr(L, "mb_%s" % op)
            f.restype = ci
            f.argtypes = [ci, vp, vp, i64, i64, i64, i64, ci, vp]
            a = getattr(L, "mb_%s_attr" % op)
            a.restype = ci
            a.argtypes = [ci] + [ctypes.POINTER(ci)] * 4

    def variants(self, op):
        L = self.lib
        out = []
        for v in range(getattr(L, "mb_%s_count" % op)()):
            name = getattr(L, "mb_%s_name" % op)(v).decode()
            regs, local, thr, bps = (ctypes.c_int() for _ in range(4))
            rc = getattr(L, "mb_%s_attr" % op)(v, ctypes.byref(regs), ctypes.byref(local), ctypes.byref(thr),
                                               ctypes.byref(bps))
            attr = dict(regs=regs.value, local=local.value, threads=thr.value, blocks_per_sm=bps.value) if rc == 0 \
                else dict(regs=-1, local=-1, threads=-1, blocks_per_sm=-1)
            out.append(dict(index=v, name=name, persistent=bool(getattr(L, "mb_%s_persistent" % op)(v)), **attr))
        return out

    def call(self, op, v, x, y, rows, cols, xs, ys, k=0):
        stream = torch.cuda.current_stream().cuda_stream
        return getattr(self.lib, "mb_%s" % op)(v, x.data_ptr(), y.data_ptr(), rows, cols, xs, ys, k, stream)


# ---------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------
def compare(got, ref):
    """(ok, max abs err, max err / tolerance, bad count); NaN / inf in got counts as bad."""
    g = got.float()
    err = (g - ref).abs()
    tol = ref.abs() * BF16_TOL + ATOL
    finite = torch.isfinite(g)
    bad_mask = ~finite | (err > tol)
    bad = int(bad_mask.sum().item())
    err = torch.where(finite, err, torch.full_like(err, float("inf")))
    return bad == 0, float(err.max().item()), float((err / tol).max().item()), bad


def report(tag, ok, maxerr, ratio, bad, total, loud=True):
    if ok:
        print("  ok    %-40s max|err| %.3g  err/tol %.3f" % (tag, maxerr, ratio))
    elif loud:
        msg = "FAIL  %-40s max|err| %.3g  err/tol %.3g  bad %d / %d" % (tag, maxerr, ratio, bad, total)
        print("  !!!!!!!!!! " + msg + " !!!!!!!!!!")
        FAILS.append(msg)
    else:
        print("  WARN  %-40s max|err| %.3g  err/tol %.3g  bad %d / %d (peer; not a Fray failure)" %
              (tag, maxerr, ratio, bad, total))


def rc_text(rc):
    return {0: "ok", 1: "unsupported shape", 2: "misaligned", 3: "unknown variant"}.get(
        rc, "CUDA error %d" % (rc - 100) if rc >= 100 else "rc %d" % rc)


def padded(rows, cols, stride, dtype, fill=None, gen=None, scale=1.0):
    """A [rows, cols] view with row stride `stride` into a buffer with one extra row of slack."""
    buf_n = (rows + 1) * stride
    if fill is None:
        buf = (torch.randn(buf_n, device="cuda", generator=gen) * scale).to(dtype)
    else:
        buf = torch.full((buf_n,), fill, device="cuda", dtype=dtype)
    return buf, buf.as_strided((rows, cols), (stride, 1))


def outside_untouched(buf, view_rows, cols, stride):
    """True when every element of buf outside the [rows, cols] view is still NaN."""
    m = torch.ones(buf.numel(), dtype=torch.bool, device=buf.device)
    idx = (torch.arange(view_rows, device=buf.device)[:, None] * stride +
           torch.arange(cols, device=buf.device)[None, :]).reshape(-1)
    m[idx] = False
    return bool(torch.isnan(buf[m].float()).all().item())


def check_variants(lib, op, variants, x, y, ref, small):
    """Every variant of op on the big shape (y = op(x) against ref) and on the small padded cases
    (r, n, xs, ys, xv, sref): n output columns, row strides xs / ys, the output's padding must stay
    NaN. Returns {variant name: all checks passed}."""
    rows, n = y.shape
    ok_by = {}
    for v in variants:
        ok_all = True
        y.fill_(float("nan"))
        rc = lib.call(op, v["index"], x, y, rows, n, x.stride(0), y.stride(0))
        torch.cuda.synchronize()
        if rc != 0:
            report("%s: rc %d (%s)" % (v["name"], rc, rc_text(rc)), False, float("nan"), float("nan"), -1, 0)
            ok_by[v["name"]] = False
            continue
        ok, e, q, bad = compare(y, ref)
        report(v["name"] + " %dx%d" % (rows, n), ok, e, q, bad, y.numel())
        ok_all &= ok
        for (r, c, xs, ys, xv, sref) in small:
            yb, yv = padded(r, c, ys, torch.bfloat16, fill=float("nan"))
            rc = lib.call(op, v["index"], xv, yv, r, c, xs, ys)
            torch.cuda.synchronize()
            if rc != 0:
                report("%s %dx%d: rc %d (%s)" % (v["name"], r, c, rc, rc_text(rc)), False, float("nan"), float("nan"),
                       -1, 0)
                ok_all = False
                continue
            ok, e, q, bad = compare(yv, sref)
            untouched = outside_untouched(yb, r, c, ys)
            if not untouched:
                report("%s %dx%d: WROTE OUTSIDE ITS ROWS" % (v["name"], r, c), False, e, q, bad, yv.numel())
            else:
                report("%s %dx%d" % (v["name"], r, c), ok, e, q, bad, yv.numel())
            ok_all &= ok and untouched
        ok_by[v["name"]] = ok_all
    return ok_by


def check_softmax(lib, variants, x, y, ref):
    rows, cols = x.shape
    print("softmax correctness (big shape %dx%d, then 1001x8000 / 1001x8192 with padded strides):" % (rows, cols))
    g = torch.Generator(device="cuda").manual_seed(1)
    small = []
    for (r, c, xs, ys) in ((1001, 8000, 8064, 8072), (1001, 8192, 8200, 8256)):
        xb, xv = padded(r, c, xs, torch.bfloat16, gen=g, scale=3.0)
        small.append((r, c, xs, ys, xv, torch.softmax(xv.float(), -1)))
    return check_variants(lib, "softmax", variants, x, y, ref, small)


def check_silu(lib, variants, x, out, ref):
    rows, d = out.shape
    print("silu_mul correctness (big shape %dx%d out, then 1001x8000 and 70001x64 (grid.y loop), padded strides):"
          % (rows, d))
    g = torch.Generator(device="cuda").manual_seed(2)
    small = []
    for (r, dd, xs, os_) in ((1001, 8000, 16064, 8072), (70001, 64, 136, 72)):
        xb, xv = padded(r, 2 * dd, xs, torch.bfloat16, gen=g)
        small.append((r, dd, xs, os_, xv, F.silu(xv[:, :dd].float()) * xv[:, dd:].float()))
    return check_variants(lib, "silu", variants, x, out, ref, small)


def add_peer(impls, peers, name, fn, ref, peer=True):
    """fn joins the timed impls if its output matches ref (check_peer); a peer (not Fray) also
    joins the best-peer comparison."""
    if check_peer(name, fn, ref):
        impls[name] = fn
        if peer:
            peers.append(name)


def add_compiled_peer(impls, peers, args, composite, x, ref):
    """torch.compile of composite(x), unless --no-compile."""
    if args.no_compile:
        return
    t0 = time.time()
    compiled = torch.compile(composite)
    add_peer(impls, peers, "torch.compile", lambda: compiled(x), ref)
    print("  (torch.compile warm-up %.1f s)" % (time.time() - t0))


def check_peer(tag, fn, ref):
    try:
        got = fn()
        torch.cuda.synchronize()
    except Exception as e:  # a peer that cannot run is reported and left out
        print("  peer %s failed: %s: %s" % (tag, type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
        return False
    ok, e, q, bad = compare(got, ref)
    report("peer " + tag, ok, e, q, bad, got.numel(), loud=False)
    return True


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def make_timer():
    try:
        from triton.testing import do_bench

        def t(fn):
            return 1000.0 * do_bench(fn, warmup=25, rep=100, return_mode="median")
        return t, "triton.testing.do_bench(warmup=25, rep=100, median), L2 flushed"
    except Exception:  # no triton: the same method by hand
        flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")

        def t(fn):
            fn()
            torch.cuda.synchronize()
            ts = []
            for _ in range(200):
                flush.zero_()
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1000.0)
            return statistics.median(ts)
        return t, "cuda events, 200 calls, 256 MB flush before each, median (triton not importable)"


def time_rounds(impls, timer, rounds):
    names = list(impls)
    res = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # rotated, so no impl always runs first
        t0 = time.time()
        for n in order:
            try:
                res[n].append(timer(impls[n]))
            except Exception as e:
                print("  timing %s failed: %s: %s" % (n, type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
                res[n].append(float("nan"))
        print("  round %d: %d impls in %.1f s" % (r + 1, len(names), time.time() - t0))
    return res


def table(title, res, nbytes, peers, attrs, ok_by, fray_name):
    print()
    print("=" * 118)
    print(title)
    med = {n: statistics.median([t for t in ts if not math.isnan(t)]) if any(not math.isnan(t) for t in ts)
           else float("nan") for n, ts in res.items()}
    peer_times = [med[p] for p in peers if p in med and not math.isnan(med[p])]
    best_peer = min(peer_times) if peer_times else float("nan")
    best_peer_name = min((p for p in peers if p in med and not math.isnan(med[p])), key=lambda p: med[p],
                         default="-")
    fray_t = med.get(fray_name, float("nan"))
    rounds = max(len(ts) for ts in res.values())
    hdr = "%-30s " % "impl" + " ".join("%8s" % ("r%d us" % (i + 1)) for i in range(rounds)) + \
        " %8s %7s %8s %8s %5s %6s %s" % ("med us", "TB/s", "vs peer", "vs fray", "regs", "blk/SM", "")
    print(hdr)
    print("-" * len(hdr))
    for n in sorted(res, key=lambda n: (math.isnan(med[n]), med[n])):
        ts = res[n]
        a = attrs.get(n)
        tbs = nbytes / (med[n] * 1e-6) / 1e12 if med[n] == med[n] else float("nan")
        flag = "" if ok_by.get(n, True) else "FAIL"
        if n in peers:
            flag = (flag + " peer").strip()
        if n == fray_name:
            flag = (flag + " fray").strip()
        print("%-30s " % n[:30] + " ".join("%8.1f" % t for t in ts) +
              " %8.1f %7.3f %8.3f %8.3f %5s %6s %s" % (med[n], tbs, best_peer / med[n], fray_t / med[n],
                                                      a["regs"] if a else "", a["blocks_per_sm"] if a else "", flag))
    print("best peer: %s %.1f us; ratios > 1 mean faster than it" % (best_peer_name, best_peer))
    return med


PLACEMENT_OFFSETS = (0, 4096, 65536, 512 << 10, 1 << 20, 3 << 20)  # bytes into a fresh pool


def placement(title, timer, rounds, names, make_fn, out_like, nbytes, peer_impls):
    """Times the library variants `names` writing their output to different buffers: the default
    output (allocated right after the input), and a separately allocated pool at several byte
    offsets; the peers in `peer_impls` run in the same rounds for reference. Shows how much of a
    1-2% gap is output placement rather than the kernel."""
    slack = max(PLACEMENT_OFFSETS) // out_like.element_size()
    pool = torch.empty(out_like.numel() + slack, dtype=out_like.dtype, device=out_like.device)
    impls = {}
    for n in names:
        impls["%s @default-out" % n] = make_fn(n, out_like)
        for off in PLACEMENT_OFFSETS:
            e = off // out_like.element_size()
            view = pool[e:e + out_like.numel()].view(out_like.shape)
            impls["%s @pool+%dK" % (n, off >> 10)] = make_fn(n, view)
    impls.update(peer_impls)
    print("placement %s (%d impls x %d rounds):" % (title, len(impls), rounds))
    res = time_rounds(impls, timer, rounds)
    print("-" * 80)
    for n, ts in res.items():
        m = statistics.median(ts)
        print("  %-52s %8.1f us %7.3f TB/s   (%s)" % (n, m, nbytes / (m * 1e-6) / 1e12, " ".join("%.1f" % t for t in ts)))
    del pool
    return res


# ---------------------------------------------------------------------------------------------
# ops
# ---------------------------------------------------------------------------------------------
def import_fray():
    try:
        import fray
        return fray
    except Exception as e:
        print("fray not importable (%s: %s): no fray rows" % (type(e).__name__, e))
        return None


def print_variants(lib, op):
    """The library's variants of op (softmax / silu), listed with their resources."""
    variants = lib.variants(op)
    print("\n%s variants (ptxas regs / local bytes / threads / resident blocks per SM):" % op)
    for v in variants:
        print("  %2d %-28s regs %3d local %d threads %d blocks/SM %d%s" % (
            v["index"], v["name"], v["regs"], v["local"], v["threads"], v["blocks_per_sm"],
            " persistent" if v["persistent"] else ""))
    return variants


def variant_impls(lib, op, variants, args, ok_by, call_args):
    """Timed callables per variant (persistent ones once per --persist-k); ok_by gains their names."""
    impls, attrs = {}, {}
    for v in variants:
        ks = [0] + (args.persist_k if v["persistent"] else [])
        for k in ks:
            name = "cu." + v["name"] + ("" if k == 0 else ".k%d" % k)

            def fn(i=v["index"], k=k):
                rc = lib.call(op, i, *call_args, k)
                if rc:
                    raise RuntimeError("rc %d (%s)" % (rc, rc_text(rc)))
            impls[name] = fn
            attrs[name] = v
            ok_by[name] = ok_by[v["name"]]
    return impls, attrs


def time_and_record(lib, op, name, title, timer, args, record, impls, attrs, ok_by, peers, variants, y, nbytes,
                    call_args, keep_names):
    """Times the impls of one op (library op `op`, reported as `name`), prints the table, records
    it in record[name], and with --placement times the picked variants writing into other buffers
    than y (call_args: the library call's arguments around the output, (x, rows, n, xs, ys))."""
    x, rows, n, xs, ys = call_args
    print("timing %s %dx%d bf16 (%d impls x %d rounds):" % (name, rows, n, len(impls), args.rounds))
    res = time_rounds(impls, timer, args.rounds)
    med = table(title, res, nbytes, peers, attrs, ok_by, "fray.cuda")
    record[name] = dict(shape=[rows, n], bytes=nbytes, rounds_us=res, median_us=med, peers=peers,
                        ok={k: ok_by.get(k, True) for k in res}, attrs={k: attrs[k] for k in attrs})
    if args.placement:
        idx = {v["name"]: v["index"] for v in variants}
        pick = [k for k in args.placement_variants[op] if k in idx]

        def make(k, out):
            return lambda: lib.call(op, idx[k], x, out, rows, n, xs, ys)
        keep = {k: impls[k] for k in keep_names if k in impls}
        record[op + "_placement"] = placement(name, timer, args.rounds, pick, make, y, nbytes, keep)


def run_softmax(lib, timer, args, fray, record):
    rows, cols = SOFTMAX_SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(rows, cols, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    y = torch.empty_like(x)
    ref = torch.softmax(x.float(), -1)
    variants = print_variants(lib, "softmax")
    ok_by = check_softmax(lib, variants, x, y, ref)
    impls, attrs = variant_impls(lib, "softmax", variants, args, ok_by, (x, y, rows, cols, cols, cols))
    peers = []
    print("softmax peers (output checked against the same reference, informational):")
    if fray is not None:
        out_f = torch.empty_like(x)
        add_peer(impls, peers, "fray.cuda", lambda: fray.softmax(x, out=out_f, backend="cuda"), ref, peer=False)
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        add_peer(impls, peers, "liger", lambda: LigerSoftmaxFunction.apply(x), ref)
    except Exception as e:
        print("  liger not importable: %s: %s" % (type(e).__name__, e))
    add_compiled_peer(impls, peers, args, lambda t: torch.softmax(t, -1), x, ref)
    add_peer(impls, peers, "torch.softmax", lambda: torch.softmax(x, -1), ref)
    del ref
    torch.cuda.empty_cache()

    nbytes = 2 * rows * cols * 2
    time_and_record(lib, "softmax", "softmax", "softmax %dx%d bf16 -> bf16, bytes %d (read + write)" % (
        rows, cols, nbytes), timer, args, record, impls, attrs, ok_by, peers, variants, y, nbytes,
        (x, rows, cols, cols, cols), ("fray.cuda", "liger"))
    del x, y, impls
    torch.cuda.empty_cache()


def run_silu(lib, timer, args, fray, record):
    rows, d = SILU_SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, 2 * d, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.empty(rows, d, device="cuda", dtype=torch.bfloat16)
    ref = F.silu(x[:, :d].float()) * x[:, d:].float()
    variants = print_variants(lib, "silu")
    ok_by = check_silu(lib, variants, x, out, ref)
    impls, attrs = variant_impls(lib, "silu", variants, args, ok_by, (x, out, rows, d, 2 * d, d))
    peers = []
    print("silu_mul peers (output checked against the same reference, informational):")
    if fray is not None:
        out_f = torch.empty_like(out)
        add_peer(impls, peers, "fray.cuda", lambda: fray.silu_mul(x, out=out_f, backend="cuda"), ref, peer=False)
    try:
        from liger_kernel.ops import swiglu as _lsw
        a, b = x[:, :d].contiguous(), x[:, d:].contiguous()  # Liger wants contiguous halves (not timed)
        add_peer(impls, peers, "liger", lambda: _lsw.LigerSiLUMulFunction.apply(a, b), ref)
        if hasattr(_lsw, "LigerFusedGateUpSiLUMulFunction"):
            add_peer(impls, peers, "liger.gate_up", lambda: _lsw.LigerFusedGateUpSiLUMulFunction.apply(x), ref)
    except Exception as e:
        print("  liger not importable: %s: %s" % (type(e).__name__, e))
    add_compiled_peer(impls, peers, args, lambda t: F.silu(t[:, :d]) * t[:, d:], x, ref)
    del ref
    torch.cuda.empty_cache()

    nbytes = 3 * rows * d * 2
    time_and_record(lib, "silu", "silu_mul", "silu_mul %dx%d out (x %dx%d) bf16, bytes %d (read gate + up, write out)"
                    % (rows, d, rows, 2 * d, nbytes), timer, args, record, impls, attrs, ok_by, peers, variants, out,
                    nbytes, (x, rows, d, 2 * d, d), ("fray.cuda", "torch.compile", "liger"))
    del x, out, impls
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lib", nargs="?", default="/tmp/membound_variants.so")
    p.add_argument("--ops", default="softmax,silu", help="comma list of softmax, silu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--persist-k", default="", help="extra blocks-per-SM values to time the persistent variants at "
                                                   "(comma list; they always run at the occupancy maximum too)")
    p.add_argument("--json", default=None, help="write all timings here (default: $OUT/membound_variants.json "
                                                "when $OUT is set)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    p.add_argument("--no-placement", dest="placement", action="store_false",
                   help="skip timing a few variants with the output in other buffers / at other offsets "
                        "(on by default: on the H200 the shipped softmax kernel ran 134.0 us into the output "
                        "allocated right after x and 131.5-132.4 us into a separately allocated one)")
    p.add_argument("--placement-softmax", default="shipped(softmax.cuh),a.512x2.ld.st.2red",
                   help="library variants for --placement (softmax)")
    p.add_argument("--placement-silu", default="shipped(act_mul.cuh),c.256x1.ld.cs",
                   help="library variants for --placement (silu)")
    args = p.parse_args()
    args.placement_variants = {"softmax": args.placement_softmax.split(","), "silu": args.placement_silu.split(",")}
    args.persist_k = [int(k) for k in args.persist_k.split(",") if k.strip()]
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]

    t_start = time.time()
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    lib = Lib(args.lib)
    timer, how = make_timer()
    props = torch.cuda.get_device_properties(0)
    try:
        import triton
        tv = triton.__version__
    except Exception:
        tv = "-"
    print("device %s (%d SMs), torch %s (CUDA %s), triton %s; lib %s" % (
        props.name, props.multi_processor_count, torch.__version__, torch.version.cuda, tv, os.path.abspath(args.lib)))
    print("timing: %s; %d interleaved rounds" % (how, args.rounds))
    fray = import_fray()
    record = dict(device=props.name, torch=torch.__version__, triton=tv, timing=how)
    if "softmax" in ops:
        run_softmax(lib, timer, args, fray, record)
    if "silu" in ops:
        run_silu(lib, timer, args, fray, record)

    path = args.json or (os.path.join(os.environ["OUT"], "membound_variants.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(record, f, indent=1, default=str)
        print("wrote", path)
    print("\ntotal %.1f s" % (time.time() - t_start))
    if FAILS:
        print("\n" + "!" * 100)
        print("%d CORRECTNESS FAILURES:" % len(FAILS))
        for m in FAILS:
            print("  " + m)
        print("!" * 100)
        return 1
    print("all variants passed the correctness checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
