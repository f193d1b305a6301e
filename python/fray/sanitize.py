"""compute-sanitizer sweep over Fray's CUDA kernel paths.

CASES lists, per family, small calls that reach each kernel instantiation path (dtype, launch
variant). A new family joins the sweep by adding its list to CASES; nothing else names cases.

  python3 -m fray.sanitize --list [FAMILIES]          # case names
  python3 -m fray.sanitize --case NAME[,NAME...]      # cases in this process (exit 0: ran clean)
  python3 -m fray.sanitize --sweep FAMILIES --out DIR # every case x tool, a few cases per process
  python3 -m fray.sanitize --sweep FAMILIES --estimate # the expected time per tool
  ... --sweep FAMILIES --only REGEX                   # just the cases whose names it finds

The sweep runs `compute-sanitizer --tool T ... python3 -m fray.sanitize --case NAMES` per chunk of
cases and tool, the costliest processes first, and re-runs a chunk that is not clean one case per
process (so one fault cannot hide the next case). memcheck, racecheck and synccheck check only
kernels whose names hold "fray" (--kernel-name kns=fray: every Fray CUDA kernel lives in namespace
fray; torch's fills, copies and randn are not checked); initcheck checks every kernel and counts
the reports whose device frame is Fray's. racecheck skips the cases marked race=False. It writes
DIR/<tool>/<case>.log, DIR/sanitize.jsonl and DIR/SANITIZE.md (command, commit, one table per
tool, rewritten after every process). The first case, smoke/vector_add, is trivial: if it is not
clean under a tool, the tool itself failed (its log says why).
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")


def _torch():
    import torch
    return torch


def _dev():
    return _torch().device("cuda")


def _randn(*shape, dtype=None, seed=0):
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(dtype or torch.float32)


_DTYPES = ("fp32", "fp16", "bf16")


def _case(fn, size, race=True, race_s=0.0, unfiltered=False):
    """A case: fn launches Fray kernels; size is about how many elements its kernels touch (the
    sweep's time estimate and order); race=False leaves it out of racecheck (kernels without
    shared memory, or a path racecheck covers at a smaller shape of the same instantiation);
    race_s, the least racecheck takes over it whatever its size (kernels it costs per launch);
    unfiltered=True checks every kernel (no --kernel-name filter): CUTLASS's device_kernel<...>
    names need not hold "fray"."""
    fn.size = size
    fn.unfiltered = unfiltered
    fn.race = race
    fn.race_s = race_s
    return fn


def _dt(name):
    torch = _torch()
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


# ---------------------------------------------------------------------------------------------
# Cases: family -> {name: thunk}. Each thunk launches Fray CUDA kernels on small inputs.

def _smoke_cases():
    import fray

    def run():
        a = _randn(1000)
        fray.vector_add(a, a, backend="cuda")
    return {"vector_add": _case(run, 1000)}


# One case per kernel instantiation (dtype) and launch path, not per shape: a shape appears only
# where it selects a different path. Kernels without shared memory skip racecheck.

def _elementwise_cases():
    import fray
    out = {}
    for d in _DTYPES:
        # 65537: the vector body and the scalar tail in one launch
        out["vector_add_%s_n65537" % d] = _case(lambda d=d: fray.vector_add(
            _randn(65537, dtype=_dt(d)), _randn(65537, dtype=_dt(d), seed=1), backend="cuda"), 65537, race=False)
    return out


def _norm_cases():
    import fray
    out = {}
    for d in _DTYPES:
        dt = _dt(d)
        # 7 x 1000: a width that is not a multiple of the vector (the scalar path); 33 x 4096: vectors
        for rows, h in ((7, 1000), (33, 4096)):
            out["rmsnorm_%s_%dx%d" % (d, rows, h)] = _case(lambda dt=dt, rows=rows, h=h: fray.rmsnorm(
                _randn(rows, h, dtype=dt), _randn(h, dtype=dt, seed=1), backend="cuda"), rows * h)
            out["add_rmsnorm_%s_%dx%d" % (d, rows, h)] = _case(lambda dt=dt, rows=rows, h=h: fray.add_rmsnorm(
                _randn(rows, h, dtype=dt), _randn(rows, h, dtype=dt, seed=2), _randn(h, dtype=dt, seed=1),
                backend="cuda"), rows * h)
            out["layernorm_%s_%dx%d" % (d, rows, h)] = _case(lambda dt=dt, rows=rows, h=h: fray.layernorm(
                _randn(rows, h, dtype=dt), _randn(h, dtype=dt, seed=1), _randn(h, dtype=dt, seed=3),
                backend="cuda"), rows * h)
        out["add_rmsnorm_inplace_%s_4x4096" % d] = _case(lambda dt=dt: fray.add_rmsnorm(
            _randn(4, 4096, dtype=dt), _randn(4, 4096, dtype=dt, seed=2), _randn(4096, dtype=dt, seed=1),
            inplace=True, backend="cuda"), 4 * 4096)
    return out


def _activation_cases():
    import fray
    out = {}
    for d in _DTYPES:
        dt = _dt(d)
        rows, h = 5, 1000
        out["silu_mul_%s_%dx%d" % (d, rows, h)] = _case(lambda dt=dt: fray.silu_mul(
            _randn(rows, 2 * h, dtype=dt), backend="cuda"), rows * h)
        for approx in ("none", "tanh"):
            out["gelu_mul_%s_%s_%dx%d" % (approx, d, rows, h)] = _case(lambda dt=dt, a=approx: fray.gelu_mul(
                _randn(rows, 2 * h, dtype=dt), approximate=a, backend="cuda"), rows * h)
        out["silu_mul_split_%s_3x512" % d] = _case(lambda dt=dt: fray.silu_mul(
            _randn(3, 512, dtype=dt), _randn(3, 512, dtype=dt, seed=1), backend="cuda"), 3 * 512)
    return out


def _softmax_cases():
    import fray
    out = {}
    # Widths across the launcher's variants: warp per row, block per row, a row in one block's
    # shared memory, a row across a thread-block cluster.
    for d in _DTYPES:
        dt = _dt(d)
        for rows, w in ((9, 7), (9, 256), (5, 1024), (3, 8192), (2, 32768), (2, 131072), (1, 262144)):
            out["softmax_%s_%dx%d" % (d, rows, w)] = _case(lambda dt=dt, rows=rows, w=w: fray.softmax(
                _randn(rows, w, dtype=dt), temperature=0.8, backend="cuda"), rows * w)
        out["online_softmax_%s_3x8192" % d] = _case(lambda dt=dt: fray.online_softmax(
            _randn(3, 8192, dtype=dt), backend="cuda"), 3 * 8192)
    return out


def _rope_cases():
    import fray
    torch = _torch()
    out = {}
    for d in _DTYPES:
        dt = _dt(d)
        for style in ("neox", "gptj"):
            def run(dt=dt, style=style, inplace=False, rot=None):
                q = _randn(17, 4, 128, dtype=dt)
                k = _randn(17, 2, 128, dtype=dt, seed=1)
                pos = torch.randint(0, 64, (17,), device="cuda")
                fray.rope(q, k, pos, max_position=64, style=style, inplace=inplace, rotary_dim=rot, backend="cuda")
            out["rope_%s_%s" % (style, d)] = _case(run, 17 * 6 * 128, race=False)
            out["rope_%s_%s_inplace_rot64" % (style, d)] = _case(lambda run=run: run(inplace=True, rot=64),
                                                                 17 * 6 * 128, race=False)

        def fused(dt=dt):
            qkv = _randn(9, 8 * 64, dtype=dt)
            q = qkv[:, : 4 * 64].view(9, 4, 64)
            k = qkv[:, 4 * 64: 6 * 64].view(9, 2, 64)
            fray.rope(q, k, torch.arange(9, device="cuda"), max_position=16, inplace=True, backend="cuda")
        out["rope_fused_qkv_%s" % d] = _case(fused, 9 * 8 * 64, race=False)
    return out


def _sampling_cases():
    import fray
    torch = _torch()
    out = {}

    def sample(rows, cols, dt, top_k=None, top_p=None, min_p=None, temperature=0.8):
        x = _randn(rows, cols, dtype=dt) * 4
        seeds = torch.arange(rows, device="cuda")
        offs = torch.zeros(rows, dtype=torch.int64, device="cuda")
        fray.sample(x, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seeds=seeds, offsets=offs,
                    return_logprobs=True, backend="cuda")

    # The smallest shapes that give each cluster size of sample_plan (sample.cuh, 132 SMs: a
    # cluster doubles while rows x C <= 118 and the slice keeps >= 4096 elements, so at 3 rows the
    # width alone sets it): 1 block (3 x 1, 7, 1000, 2047: the narrow rows), 2 (3 x 8192), 4 (3 x
    # 16384), 8 (3 x 32768), 16 (1 x 65536); fp32 1 x 393216: 8 blocks of 192 KB slices (past the
    # 80 KB target, the widest row). The rows at the one-wave limit (60 x 8192, 30 x 16384, 15 x
    # 32768) take the same clusters at many times racecheck's time.
    shapes = ((3, 1), (3, 7), (3, 1000), (3, 2047), (3, 8192), (3, 16384), (3, 32768), (1, 65536), (1, 393216))
    for d in ("fp32", "bf16"):
        dt = _dt(d)
        for rows, cols in shapes:
            if cols == 393216 and d == "bf16":
                continue  # bf16 takes 16 blocks of 48 KB there: the 1 x 65536 path
            tag = "%s_%dx%d" % (d, rows, cols)
            out["sample_topp_" + tag] = _case(lambda r=rows, c=cols, dt=dt: sample(r, c, dt, top_p=0.9), rows * cols)
            out["sample_topk50_" + tag] = _case(lambda r=rows, c=cols, dt=dt: sample(r, c, dt, top_k=50), rows * cols)
            if cols >= 4096:  # top-k past the survivors' limit: the cluster refinement
                out["sample_topk2000_topp_minp_" + tag] = _case(lambda r=rows, c=cols, dt=dt: sample(
                    r, c, dt, top_k=2000, top_p=0.95, min_p=0.01), rows * cols)
        out["sample_greedy_%s_3x1000" % d] = _case(lambda dt=dt: sample(3, 1000, dt, temperature=0.0), 3000)
    for d in _DTYPES:
        dt = _dt(d)

        def pen(dt=dt, d=d):
            x = _randn(4, 5000, dtype=dt)
            ids = torch.randint(0, 5000, (40,), device="cuda")
            offs = torch.tensor([0, 10, 10, 25, 40], device="cuda")
            fray.apply_penalties(x, ids, offs, repetition=1.2, presence=0.5, frequency=0.1, backend="cuda")
        out["apply_penalties_%s_4x5000" % d] = _case(pen, 20000)
    for d in ("fp32", "bf16"):
        dt = _dt(d)

        def step(dt=dt):
            x = _randn(4, 32000, dtype=dt)
            ids = torch.randint(0, 32000, (40,), device="cuda")
            offs = torch.tensor([0, 10, 10, 25, 40], device="cuda")
            fray.decode_step(x, ids, offs, repetition=1.1, temperature=0.7, top_k=40, top_p=0.9,
                             seeds=torch.arange(4, device="cuda"), offsets=torch.zeros(4, dtype=torch.int64,
                                                                                      device="cuda"),
                             backend="cuda")
        out["decode_step_%s_4x32000" % d] = _case(step, 4 * 32000)
    # top-k / argmax: on-chip (one block, clusters) and streaming (rows that do not fit the SMs'
    # shared memory at once), sorted and unsorted, k up to 4096 (in-kernel ranking) and above. The
    # streaming shapes are the smallest that topk_config (topk_plan.h, 132 SMs, k 50) streams: in
    # clusters at 133 x 32768 fp32 and 17 x 65536 16-bit, one CTA per row at 331 rows (racecheck
    # leaves that one out: ~11-22 M elements, minutes under racecheck; its kernel is the
    # clustered one's code without the cluster exchange).
    for d in _DTYPES:
        dt = _dt(d)
        wide = 32768 if d == "fp32" else 65536
        srows = 133 if d == "fp32" else 17
        for rows, w, k in ((5, 256, 8), (3, 1000, 1), (4, 32000, 50), (2, 131072, 50), (1, 262144, 1024),
                           (2, 131072, 5000), (srows, wide, 50), (331, wide, 50)):
            tag = "%s_%dx%dk%d" % (d, rows, w, k)
            race = rows != 331
            # seconds under racecheck, measured (fp32, 87c273e): the few wide rows on clusters
            race_s = {(2, 131072, 50): 160.0, (1, 262144, 1024): 180.0, (2, 131072, 5000): 70.0}.get((rows, w, k), 0.0)
            out["topk_" + tag] = _case(lambda r=rows, w=w, k=k, dt=dt: fray.topk(_randn(r, w, dtype=dt), k,
                                                                               backend="cuda"), rows * w, race, race_s)
            if k == 50 and rows != 331:
                out["topk_unsorted_" + tag] = _case(lambda r=rows, w=w, k=k, dt=dt: fray.topk(
                    _randn(r, w, dtype=dt), k, sorted=False, backend="cuda"), rows * w, race and rows * w < 1000000,
                    race_s)
        for rows, w in ((3, 1000), (1, 131072), (9, 152064)):
            out["argmax_%s_%dx%d" % (d, rows, w)] = _case(lambda r=rows, w=w, dt=dt: fray.argmax(
                _randn(r, w, dtype=dt), backend="cuda"), rows * w)
    for fn in out.values():  # every sampling kernel: see _SAMPLING_RACE_S
        fn.race_s = max(fn.race_s, _SAMPLING_RACE_S)
    return out


def _attention_cases():
    import fray
    from fray.ops.attention import _random_case
    torch = _torch()
    out = {}
    for d in _DTYPES:
        dt = _dt(d)
        # (batch, hq, hkv, capacity, head_dim, lens): B = 1 latency variants, GQA groups, splits.
        for tag, kw in (("b2_t37_d64", dict(batch=2, hq=4, hkv=2, capacity=37, d=64, lens=(37, 16))),
                        ("b1_t4096_d128", dict(batch=1, hq=8, hkv=2, capacity=4096, d=128, lens=(4000,))),
                        ("b3_t600_d128", dict(batch=3, hq=8, hkv=8, capacity=600, d=128, lens=(600, 1, 0)))):
            def case(kw=kw, dt=dt, splits=None, layout="HND", paged=False, page=16):
                q, k, v, kp, vp, bt, lens = _random_case(dt, torch.device("cuda"), page=page, **kw)
                if paged:
                    fray.paged_decode_attention(q, kp, vp, bt, lens, return_lse=True, num_splits=splits,
                                                backend="cuda")
                elif layout == "NHD":
                    fray.decode_attention(q, k.transpose(1, 2), v.transpose(1, 2), lens, kv_layout="NHD",
                                          num_splits=splits, backend="cuda")
                else:
                    fray.decode_attention(q, k, v, lens, return_lse=True, num_splits=splits, backend="cuda")
            # (a fifth of the K / V elements: under racecheck a case of 8 x 2 M elements took under 150 s
            # in the sweep of da8da65, against ~40 s per million for sampling's logits)
            size = 2 * kw["batch"] * kw["hkv"] * kw["capacity"] * kw["d"] // 5
            out["decode_hnd_%s_%s" % (d, tag)] = _case(case, size)
            out["decode_nhd_%s_%s" % (d, tag)] = _case(lambda case=case: case(layout="NHD"), size)
            out["decode_hnd_split1_%s_%s" % (d, tag)] = _case(lambda case=case: case(splits=1), size)
            out["decode_hnd_split3_%s_%s" % (d, tag)] = _case(lambda case=case: case(splits=3), size)
            out["paged_decode_p16_%s_%s" % (d, tag)] = _case(lambda case=case: case(paged=True), size)
            out["paged_decode_p64_%s_%s" % (d, tag)] = _case(lambda case=case: case(paged=True, page=64), size)
            out["paged_decode_p16_split1_%s_%s" % (d, tag)] = _case(lambda case=case: case(paged=True, splits=1),
                                                                    size)

        def append(dt=dt, paged=False, layout="HND"):
            _, k, v, kp, vp, bt, _ = _random_case(dt, torch.device("cuda"))
            kn = _randn(2, 2, 64, dtype=dt)
            vn = _randn(2, 2, 64, dtype=dt, seed=1)
            lens = torch.tensor([0, 36], dtype=torch.int32, device="cuda")
            if paged:
                fray.kv_append_paged(kp, vp, bt, kn, vn, lens, backend="cuda")
            elif layout == "NHD":
                fray.kv_append(k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), kn, vn, lens,
                               kv_layout="NHD", backend="cuda")
            else:
                fray.kv_append(k, v, kn, vn, lens, backend="cuda")
        # (no shared memory in the append kernels)
        out["kv_append_hnd_%s" % d] = _case(append, 512, race=False)
        out["kv_append_nhd_%s" % d] = _case(lambda append=append: append(layout="NHD"), 512, race=False)
        out["kv_append_paged_%s" % d] = _case(lambda append=append: append(paged=True), 512, race=False)
    # prefill_attention: the CUDA kernel (JIT) at each shipped configuration (dtype x head dim x
    # causal) and its paged path (16- and 64-key pages), the Triton kernel's paged path
    # (unfiltered): query / key lengths ending inside tiles, an empty sequence, fewer queries than
    # keys (chunked), GQA 4; the pools' unused rows are NaN.
    from fray.ops.attention import _paged_kv
    lens_q, lens_k = (1, 130, 0, 70), (5, 200, 3, 70)
    for d in ("bf16", "fp16"):
        for hd in (64, 128, 256):
            for causal in (True, False):
                def prefill(dt=_dt(d), hd=hd, causal=causal, page=None, backend="cuda"):
                    q = _randn(sum(lens_q), 8, hd, dtype=dt)
                    k = _randn(sum(lens_k), 2, hd, dtype=dt, seed=1)
                    v = _randn(sum(lens_k), 2, hd, dtype=dt, seed=2)
                    cu_q, cu_k = (torch.tensor((0,) + lens, device="cuda").cumsum(0).to(torch.int32)
                                  for lens in (lens_q, lens_k))
                    kw = dict(causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                              max_seqlen_k=max(lens_k), return_lse=True, backend=backend)
                    if page:
                        k, v, kw["block_table"] = _paged_kv(k, v, lens_k, page,
                                                            torch.Generator(device="cuda").manual_seed(3))
                    fray.prefill_attention(q, k, v, **kw)
                tag = "%s_d%d_%s" % (d, hd, "causal" if causal else "full")
                size = 2 * sum(lens_k) * 2 * hd
                out["prefill_%s" % tag] = _case(prefill, size)
                if causal:
                    for page in (16, 64):
                        out["prefill_paged_p%d_%s" % (page, tag)] = _case(
                            lambda prefill=prefill, page=page: prefill(page=page), size)
        out["prefill_triton_paged_p16_%s_d128_causal" % d] = _case(
            lambda prefill=prefill, dt=_dt(d): prefill(dt=dt, hd=128, causal=True, page=16, backend="triton"),
            2 * sum(lens_k) * 2 * 128, unfiltered=True)
    # mla_decode, s_q 2 over lens 0 / 65 / 130, one split and three: the CUDA kernel (JIT) at Hq 16
    # (32 of 64 rows) and 128 (four head blocks) over 64- and 16-token pages; Triton (unfiltered)
    # in its transposed form at Hq 16 and the 64-row one at Hq 32
    from fray.ops.attention import _mla_case
    for d in ("bf16", "fp16"):
        for backend, hq, page in (("cuda", 16, 64), ("cuda", 128, 16), ("triton", 16, 64), ("triton", 32, 64)):
            for splits in (1, 3):
                def mla(dt=_dt(d), hq=hq, splits=splits, backend=backend, page=page):
                    q, kv, bt, lens = _mla_case(dt, torch.device("cuda"), hq=hq, page=page,
                                                max_blocks=3 * 64 // page)
                    fray.mla_decode(q, kv, bt, lens, return_lse=True, num_splits=splits, backend=backend)
                if backend == "cuda":
                    out["mla_cuda_%s_p%d_hq%d_split%d" % (d, page, hq, splits)] = _case(mla, 3 * 3 * 64 * 576)
                else:
                    out["mla_decode_%s_hq%d_split%d" % (d, hq, splits)] = _case(mla, 3 * 3 * 64 * 576,
                                                                               unfiltered=True)
    return out


def _jit_launch(kern, ptrs, ints):
    """One launch of a loaded JIT kernel on the current stream, with its workspace if it asks one."""
    torch = _torch()
    stream = torch.cuda.current_stream().cuda_stream
    ws = kern.workspace_bytes(ptrs, ints, (), 0, stream)
    buf = torch.empty(max(ws, 1), dtype=torch.uint8, device="cuda")
    kern.launch(ptrs + ((buf.data_ptr(),) if ws else ()), ints, (), 0, stream)
    torch.cuda.synchronize()


# The JIT families: one case per kernel template path (tuning candidate kinds, dtype, bias), each
# launched directly by its configuration, so the sweep covers what the tuner may pick and not just
# today's default. Shapes leave partial tiles in M, N and K. Pre-build the kernels (a run of the
# cases without a tool) so that nvcc does not run under the sanitizer.

def _gemm_cases():
    from fray import jit
    from fray.ops import gemm as G
    torch = _torch()
    out = {}

    def launch(config, dt, m, n, k, bias=False, layout="nk", unfiltered=False):
        def run():
            a = _randn(m, k, dtype=dt)
            b = _randn(*((n, k) if layout == "nk" else (k, n)), dtype=dt, seed=1)
            bb = _randn(n, dtype=dt, seed=2) if bias else None
            o = torch.empty(m, n, dtype=dt, device="cuda")
            name, src = G.kernel_source(config, dt, dt, layout, bias)
            kern = jit.build(name, src)
            _jit_launch(kern, (a.data_ptr(), b.data_ptr(), bb.data_ptr() if bias else 0, o.data_ptr()),
                        (m, n, k, a.stride(0), b.stride(0), o.stride(0)))
        return _case(run, n * k + m * n, unfiltered=unfiltered)

    for d in ("bf16", "fp16"):
        dt = _dt(d)
        for m in (1, 16):
            for i, c in enumerate(G.small_m_candidates(m)):
                # 200 x 1040: rows past the CTA's last full tile, K past the last full chunk
                out["gemm_%s_%s%d_m%d" % (d, c["kernel"], i, m)] = launch(c, dt, m if i else m - 1 or 1, 200, 1040,
                                                                          bias=i == 0)
    dt = _dt("bf16")
    # The CUTLASS kernels: a ping-pong and a cooperative tile, a swap-AB stream-K tile and a split
    # one, [K, N] weights (TMA wants 16-byte rows: N and K multiples of 8).
    for tag, c, m, layout in (("pp128", G.SM90_SMALL[0], 100, "nk"), ("coop", G.SM90_LARGE[0], 264, "nk"),
                              ("swap_sk", G.swap_candidates(16)[0], 13, "nk"),
                              ("swap_z4", G.swap_candidates(16)[2], 16, "nk"), ("kn", G.SM90_SMALL[0], 72, "kn")):
        out["gemm_bf16_sm90_%s" % tag] = launch(c, dt, m, 264, 520, bias=tag == "coop", layout=layout,
                                                unfiltered=True)
    return out


def _quant_cases():
    from fray import jit
    from fray.ops import quant as Q
    torch = _torch()
    out = {}
    bf16 = _dt("bf16")
    # W8A16: every tuning candidate at M = 16 and 9 (int8, group scales), and each weight type,
    # scale kind and activation dtype once with the first candidate.
    combos = [(torch.int8, "group", bf16, i, m) for i in range(len(Q.W8A16_CANDIDATES)) for m in (16, 9)]
    combos += [(w, kind, x, 0, 3) for w in Q._SG_IN for kind in ("tensor", "channel", "group")
               for x in (bf16, _dt("fp16"))]
    for wdt, kind, xdt, i, m in combos:
        def w8(wdt=wdt, kind=kind, xdt=xdt, i=i, m=m):
            n, k = 200, 1040
            x, w, s, b = Q.w8a16_operands(m, n, k, xdt, wdt, kind, "cuda", seed=i, bias=i == 0)
            o = torch.empty(m, n, dtype=xdt, device="cuda")
            name, src = Q.w8a16_kernel_source(Q.W8A16_CANDIDATES[i], xdt, wdt, kind, i == 0, m)
            _jit_launch(jit.build(name, src), (x.data_ptr(), w.data_ptr(), b.data_ptr() if i == 0 else 0,
                                               o.data_ptr(), s.data_ptr()), (m, n, k, k, k, n, Q._w8a16_lds(kind, s)))
        out["w8a16_%s_%s_%s_c%d_m%d" % (Q._SG_NAMES[wdt], kind, Q._SG_NAMES[xdt], i, m)] = _case(w8, 200 * 1040)
    # scaled_gemm (CUTLASS): int8 and e4m3 with each scale kind pair, through the op's default
    # configuration (FRAY_AUTOTUNE=0 in the sweep), at partial tiles.
    for dt in Q._SG_IN:
        for ka, kb in (("tensor", "tensor"), ("vector", "vector"), ("block", "block")):
            if dt == torch.int8 and ka == "block":
                continue
            for m in (40, 200):
                def sg(dt=dt, ka=ka, kb=kb, m=m):
                    a, b, sa, sb, bias = Q.scaled_gemm_operands(m, 272, 528, dt, ka, kb, "cuda", bias_dtype=bf16)
                    Q.scaled_gemm(a, b, sa, sb, bias=bias if ka == "vector" else None, backend="cuda")
                out["scaled_gemm_%s_%s_%s_m%d" % (Q._SG_NAMES[dt], ka, kb, m)] = _case(sg, 272 * 528, unfiltered=True)
    # the ahead-of-time quantizers (cuda/quant): per row (the register-held chunks and the re-read
    # tail at K 8200) and per (1, 128) block (a partial last group), dynamic and static, aligned
    # rows and rows one element off (the element path), each input dtype once
    import fray
    for xd, qd, k, off in (("bf16", torch.int8, 8200, 0), ("fp16", torch.float8_e4m3fn, 333, 1),
                           ("fp32", torch.int8, 200, 1)):
        for gran, blk in (("token", None), ("block", (1, 128))):
            def qz(xd=xd, qd=qd, k=k, off=off, gran=gran, blk=blk):
                x = _randn(5, k + off, dtype=_dt(xd))[:, off:]
                q, s = fray.quantize(x, qd, granularity=gran, block=blk or (1, 128), backend="cuda")
                fray.quantize(x, qd, granularity=gran, block=blk or (1, 128), scale=s, out=q, backend="cuda")
            out["quantize_cuda_%s_%s_%s_k%d%s" % (gran, xd, Q._SG_NAMES[qd], k, "_off" if off else "")] = _case(
                qz, 5 * k, race=gran == "token")
    return out


def _moe_cases():
    """The Triton grouped-GEMM kernels (unfiltered: Triton's kernel names do not hold "fray"), with
    rows that gather past partial tiles, experts without routes and every epilogue: fused_moe per
    combine mode and row tile, both weight layouts (the kn stack takes the pointer path when its
    rows are not 16-byte multiples), the explicit grouped GEMM with an empty group."""
    import fray
    from fray.ops import moe_gemm as MG
    torch = _torch()
    out = {}
    for combine in ("atomic", "staged", "scatter"):
        for t, e, k in ((3, 8, 2), (300, 8, 2)):  # row tiles of 16 and 128
            def fm(combine=combine, t=t, e=e, k=k):
                x, w13, w2, logits = MG._case_inputs(t, 256, 136, e, k, _dt("bf16"), "cuda")
                fray.fused_moe(x, w13, w2, router_logits=logits, top_k=k, combine=combine, backend="triton")
            # racecheck takes the 16-row tiles (T3); the 128-row tile's cases (T300) would take
            # ~28 min each under it (the sweep's estimate) and run under the other three tools
            out["fused_moe_%s_T%d" % (combine, t)] = _case(fm, t * k * 256 * 272, race=t < 100, unfiltered=True)

    def kn(inter):
        x, w13, w2, logits = MG._case_inputs(40, 200, inter, 4, 2, _dt("fp16"), "cuda")
        fray.fused_moe(x, w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous(), router_logits=logits,
                       top_k=2, w_layout="kn", apply_router_weight_on_input=True, activation="gelu", backend="triton")
    # I = 100: the up half's first column is no 16-byte multiple, so GEMM 1 reads the stack through
    # pointers (its TMA load faulted there, 2026-12-07); I = 104: through TMA
    out["fused_moe_kn_fp16"] = _case(lambda: kn(100), 40 * 2 * 200 * 200, unfiltered=True)
    out["fused_moe_kn_fp16_i104"] = _case(lambda: kn(104), 40 * 2 * 200 * 208, unfiltered=True)

    def explicit():
        a = _randn(100, 264, dtype=_dt("bf16"))
        b = _randn(3, 136, 264, dtype=_dt("bf16"), seed=1)
        offs = torch.tensor([3, 40, 40, 97], dtype=torch.int32, device="cuda")
        fray.grouped_gemm(a, b, offs, backend="triton")
    out["grouped_gemm_explicit"] = _case(explicit, 100 * 264 * 4, unfiltered=True)

    def explicit_cuda(dtype):  # the CUTLASS grouped GEMM (cuda/moe/grouped_gemm_sm90.cuh) on fray.jit
        a = _randn(100, 264, dtype=_dt(dtype))
        b = _randn(3, 136, 264, dtype=_dt(dtype), seed=1)
        offs = torch.tensor([3, 40, 40, 97], dtype=torch.int32, device="cuda")
        fray.grouped_gemm(a, b, offs, backend="cuda")
    for dtype in ("bf16", "fp16"):
        out["grouped_gemm_explicit_cuda_%s" % dtype] = _case(lambda d=dtype: explicit_cuda(d), 100 * 264 * 4,
                                                            unfiltered=True)

    def fused_cuda(t, emap):  # fused_moe's CUDA path: gather, the CUTLASS GEMMs, gated rows, combine
        x, w13, w2, logits = MG._case_inputs(t, 256, 136, 8, 2, _dt("bf16"), "cuda")
        kw = {}
        if emap:  # 12 global experts, 4 on no rank here: sentinel rows past the kept routes
            kw["expert_map"] = torch.tensor([0, -1, 1, 2, -1, 3, 4, -1, 5, 6, -1, 7], dtype=torch.int32, device="cuda")
            logits = _randn(t, 12)
        fray.fused_moe(x, w13, w2, router_logits=logits, top_k=2, apply_router_weight_on_input=emap,
                       backend="cuda", **kw)
    for t, emap in ((3, False), (300, True)):
        out["fused_moe_cuda_T%d%s" % (t, "_expert_map" if emap else "")] = _case(
            lambda t=t, emap=emap: fused_cuda(t, emap), t * 2 * 256 * 272, race=t < 100, unfiltered=True)

    def routed_cuda():
        x, b, _, logits = MG._case_inputs(37, 256, 68, 8, 3, _dt("fp16"), "cuda")
        fray.routed_grouped_gemm(x, b, logits, 3, backend="cuda")
    out["routed_grouped_gemm_cuda_T37"] = _case(routed_cuda, 37 * 3 * 256 * 136, unfiltered=True)

    def routes_cuda():  # the dispatch form on the CUDA kernel: padded rows in, route rows out
        x, b, _, logits = MG._case_inputs(37, 256, 68, 8, 3, _dt("bf16"), "cuda")
        _, ids = fray.moe_route(logits, 3)
        fray.grouped_gemm(x, b, dispatch=fray.moe_dispatch(ids, 8, 16), top_k=3, backend="cuda")
    out["grouped_gemm_routes_cuda_T37"] = _case(routes_cuda, 37 * 3 * 256 * 136, unfiltered=True)
    return out


# The one place a family joins the sweep (its directory name under tests/).
CASES = {
    "smoke": _smoke_cases,
    "elementwise": _elementwise_cases,
    "norm": _norm_cases,
    "activation": _activation_cases,
    "softmax": _softmax_cases,
    "rope": _rope_cases,
    "sampling": _sampling_cases,
    "attention": _attention_cases,
    "gemm": _gemm_cases,
    "quant": _quant_cases,
    "moe": _moe_cases,
}


def case_names(families, only=None):
    """The families' case names ("family/case"); only: a regular expression a name must contain."""
    names = []
    for fam in families:
        if fam not in CASES:
            raise ValueError("families: expected some of %s, got %r" % (", ".join(CASES), fam))
        names += ["%s/%s" % (fam, n) for n in CASES[fam]()]
    if only is not None:
        names = [n for n in names if re.search(only, n)]
    return names


def _lookup(name, _built={}):
    fam, _, case = name.partition("/")
    if fam not in _built:
        _built[fam] = CASES[fam]()
    return _built[fam][case]


def run_case(names):
    """Runs the cases (a comma list) in order, checking the CUDA context after each (a sticky
    error raises, naming the case)."""
    torch = _torch()
    built = {}
    for name in names.split(","):
        fam, _, case = name.partition("/")
        if fam not in built:
            built[fam] = CASES.get(fam, lambda: {})()
        if case not in built[fam]:
            raise ValueError("case: expected one of --list's names, got %r" % name)
        t0 = time.time()
        try:
            built[fam][case]()
            torch.cuda.synchronize()
        except Exception as e:
            raise RuntimeError("case %s: %s" % (name, e)) from e
        # progress in the log, so a process cut by its timeout shows how far it got
        print("[sanitize] case %s done in %.1f s" % (name, time.time() - t0), file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The sweep.

_ERR = re.compile(r"ERROR SUMMARY: (\d+) error")
_RACE = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
# An error record's first device frame: "=========     at <function>(...)+0x.. in file:line".
_FRAME = re.compile(r"^=========     at (?:0x[0-9a-f]+ in )?(.+?)(?:\+0x[0-9a-f]+)?(?: in \S+:\d+)?$", re.M)
_RECORD = re.compile(r"^========= (?:Uninitialized|Invalid|Program hit|Error|Potential|Barrier|Warning)", re.M)

# Seconds per million elements a case's kernels touch, by tool, and the start-up of one process
# under the tool (python3 + torch + the extensions), from the sweep of the bundle at da8da65 on the
# H200 (2026-12-01): memcheck and synccheck ~1.5 s per small case in chunks of 8, ~5 s per
# process; racecheck about 150 s for 2 x 1.9 M elements of sampling at clusters of 2 (the small
# racecheck cases run slower than this rate says: the sampling cases of the sweep at 8a2f6aa,
# 2026-12-02, took 1533 s of process time against 1032 estimated).
_RATE = {"memcheck": 1.0, "racecheck": 40.0, "initcheck": 2.0, "synccheck": 1.0}
_START = {"memcheck": 5.0, "racecheck": 5.0, "initcheck": 6.0, "synccheck": 5.0}
_HEAVY = 20.0  # seconds: a case estimated above this runs in its own process
# Estimated seconds per process: a chunk closes before it would pass this, however few cases it
# holds. Chunks of 8 racecheck cases of sampling ran 230-240 s at 48fe6bd (2026-12-02) and were
# cut by the per-process limit, which left 64 cases unchecked; shorter processes also spread
# better over the jobs.
_CHUNK_SECONDS = 30.0
# Seconds a sampling case takes under racecheck whatever its size (a case's race_s): those kernels
# (clusters, 512 threads, up to 192 KB of shared memory a block) cost racecheck per launch, not per
# element (7-16 s a case at 87c273e, 2026-12-03). Each runs in its own process (above _HEAVY).
_SAMPLING_RACE_S = 30.0
# A process's limit: _LIMIT_FACTOR times its estimate, at least _LIMIT_MIN s, at most --timeout. A
# case that hangs under a tool then costs the sweep minutes, not the deadline: at 87c273e
# (2026-12-03) 22 sampling cases hung under racecheck (a split cluster barrier, since reverted),
# held 16 jobs for 240 s each and left 882 of 927 runs not made.
_LIMIT_FACTOR = 4.0
_LIMIT_MIN = 60.0


def _sanitizer():
    for p in (shutil.which("compute-sanitizer"),
              os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer")):
        if p and os.path.exists(p):
            return p
    raise RuntimeError("compute-sanitizer: expected on PATH or under $CUDA_HOME/bin, got none")


def _command(san, tool, names):
    # initcheck runs unfiltered: a kernel left out by --kernel-name is not tracked either, so the
    # inputs torch's own kernels wrote (randn, fills, copies) read as uninitialised in Fray's
    # (the sweep of da8da65: thousands of such reports in vector_add alone). Its reports are
    # attributed by device frame instead; only Fray frames count.
    unfiltered = any(getattr(_lookup(n), "unfiltered", False) for n in names.split(","))
    filt = [] if tool == "initcheck" or unfiltered else ["--kernel-name", "kns=fray"]
    extra = {"racecheck": ["--racecheck-report", "all"],
             "initcheck": ["--show-backtrace", "device", "--print-limit", "2000"]}.get(tool, ["--print-limit", "200"])
    if tool == "racecheck":
        extra += ["--print-limit", "200"]
    return ([san, "--tool", tool] + filt + extra + ["--error-exitcode", "99", sys.executable, "-m", "fray.sanitize",
                                                     "--case", names])


def classify(tool, text, rc):
    """The row fields of one process's output: errors (or hazards), status, the Fray kernels
    named, and for initcheck the reports in other kernels (not Fray's, listed apart)."""
    row = {"rc": rc}
    m = _ERR.search(text)
    row["errors"] = int(m.group(1)) if m else None
    frames = [f.strip() for f in _FRAME.findall(text)]
    fray_frames = [f for f in frames if "fray" in f]
    row["kernels"] = sorted(set(re.findall(r"(?:at|in) (?:\[clone )?(?:void |unsigned int )?(?:0x[0-9a-f]+ in )?"
                                           r"(fray::[A-Za-z0-9_:]+)", text)))[:8]
    if tool == "racecheck":
        r = _RACE.search(text)
        if r:
            row["hazards"], row["race_errors"], row["race_warnings"] = (int(g) for g in r.groups())
        count = None if not r else row["race_errors"] + row["race_warnings"]
        row["errors"] = count
    elif tool == "initcheck" and row["errors"] is not None:
        printed = len(_RECORD.findall(text))
        other = sorted(set(re.sub(r"\(.*", "", f) for f in frames if "fray" not in f))
        row["other_kernels"] = other[:8]
        row["other_errors"] = len(frames) - len(fray_frames)
        # every report printed and none in a Fray frame: Fray's count is 0
        row["errors"] = len(fray_frames) if printed >= row["errors"] else row["errors"] - row["other_errors"]
    ok_rc = rc == 0 or (rc == 99 and tool == "initcheck")
    clean = ok_rc and row["errors"] == 0
    row["status"] = "clean" if clean else ("timeout" if rc == "timeout" else "FINDINGS" if rc in (0, 99)
                                           else "FAILED")
    return row


def _kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _one(tool, name, out_dir, timeout, san):
    """One process under `tool` running the cases of `name` (a comma list)."""
    first = name.split(",")[0]
    log = os.path.join(out_dir, tool, first.replace("/", "__") + ("+%d" % (name.count(",")) if "," in name else "")
                       + ".log")
    cmd = _command(san, tool, name)
    t0 = time.time()
    # Its own process group, killed whole at the timeout: killing compute-sanitizer alone left its
    # python3 child running on the GPU (at 7ebfe6d, 2026-12-03, benchmarks started after the sweep
    # ran 4-5x slow beside the orphans).
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        text, rc = out.decode(errors="replace"), p.returncode
    except subprocess.TimeoutExpired:
        _kill_group(p)
        out, _ = p.communicate()
        text, rc = (out or b"").decode(errors="replace") + "\n[timeout after %ds]\n" % timeout, "timeout"
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + text)
    row = {"tool": tool, "case": name, "seconds": round(time.time() - t0, 1)}
    row.update(classify(tool, text, rc))
    return row


def _cell(row):
    v = row.get("errors")
    body = "%s %s" % ("?" if v is None else v, "hazards" if row["tool"] == "racecheck" else "errors")
    if row["status"] == "clean":
        extra = ""
        if row.get("other_errors"):
            extra = " (%d in other kernels: %s)" % (row["other_errors"], ", ".join(row.get("other_kernels") or []))
        return body + extra
    where = ", ".join(row.get("kernels") or [])
    return "**%s** (%s, rc %s)%s" % (body, row["status"], row["rc"], ": " + where if where else "")


def write_report(rows, path, command, commit, pending=(), estimate=None):
    lines = ["# compute-sanitizer sweep", "", "Command: `%s`" % command, "", "Commit: %s" % commit, "",
             "Cases run a few to a process under each tool, the CUDA context checked after each; a process",
             "that is not clean is re-run one case per process. memcheck, racecheck and synccheck check only",
             "kernels whose names hold `fray` (`--kernel-name kns=fray`); initcheck checks every kernel (a",
             "filtered kernel's writes are not tracked) and counts the reports whose device frame is a Fray",
             "kernel, listing the others apart. racecheck runs the cases whose kernels use shared memory.",
             "Logs: the results archive, `sanitize/<tool>/*.log`.", ""]
    if estimate:
        lines += ["Estimated before the run: " + "; ".join(estimate), ""]
    if pending:
        lines += ["**Incomplete: %d case x tool runs not finished.**" % len(pending), ""]
    for tool in TOOLS:
        rs = [r for r in rows if r["tool"] == tool]
        ps = [p for p in pending if p[0] == tool]
        if not rs and not ps:
            continue
        bad = [r for r in rs if r["status"] != "clean"]
        lines += ["## %s: %d cases, %d clean, %d not%s" % (tool, len(rs), len(rs) - len(bad), len(bad),
                                                           ", %d pending" % len(ps) if ps else ""), "",
                  "| kernel path (case) | %s | s |" % ("hazards" if tool == "racecheck" else "errors"),
                  "|---|---|---|"]
        for r in sorted(rs, key=lambda r: r["case"]):
            lines.append("| %s | %s | %s |" % (r["case"], _cell(r), r["seconds"]))
        for _, n in sorted(ps):
            lines.append("| %s | pending | |" % n)
        lines.append("")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines))
    os.replace(tmp, path)


def _cost(tool, case):
    rate = _RATE[tool] * getattr(case, "size", 0) / 1e6
    return max(rate, case.race_s) if tool == "racecheck" else rate


def _process_cost(tool, names):
    """Estimated seconds of one process of `names` under `tool`."""
    return _START[tool] + sum(_cost(tool, _lookup(n)) for n in names)


def _limit(tool, names):
    """Seconds one process of `names` under `tool` may run (before --timeout and the deadline)."""
    return max(_LIMIT_MIN, _LIMIT_FACTOR * _process_cost(tool, names))


def plan(families, tools, chunk, only=None):
    """(tool, [case names]) per process, most expensive first, and the estimate per tool; only: a
    regular expression the cases' names must contain (the smoke case always runs)."""
    names = case_names(["smoke"]) + case_names([f for f in families if f != "smoke"], only)
    built = {fam: CASES[fam]() for fam in {n.split("/")[0] for n in names}}

    def case(n):
        fam, _, c = n.partition("/")
        return built[fam][c]
    work = []
    for tool in tools:
        sel = [n for n in names[1:] if tool != "racecheck" or getattr(case(n), "race", True)]
        light = []
        for n in sel:
            if _cost(tool, case(n)) > _HEAVY:
                work.append((tool, [n]))
            else:
                light.append(n)
        for fam in families:
            group, cost = [], 0.0
            for n in (n for n in light if n.split("/")[0] == fam):
                c = _cost(tool, case(n))
                if group and (len(group) == chunk or cost + c > _CHUNK_SECONDS):
                    work.append((tool, group))
                    group, cost = [], 0.0
                group.append(n)
                cost += c
            if group:
                work.append((tool, group))
    est = {t: sum(_process_cost(t, g) for tt, g in work if tt == t) for t in tools}
    work.sort(key=lambda w: -_process_cost(*w))
    return names[0], work, est, {t: sum(len(g) for tt, g in work if tt == t) for t in tools}


def _wall(work, est, jobs, tools):
    """The smoke case under every tool at once, then the costliest process or the work spread over
    the jobs, whichever is longer."""
    heavy = max((_process_cost(t, g) for t, g in work), default=0)
    return max(_START[t] for t in tools) + max(heavy, sum(est.values()) / jobs)


# Families whose cases build kernels through fray.jit: their cases run once without a tool before
# the sweep (nvcc and CUTLASS's templates take seconds to minutes a kernel, and under a tool that
# time would count against the process limit).
JIT_FAMILIES = ("attention", "gemm", "quant", "moe")  # attention: prefill and MLA; moe: the grouped GEMM


WARM_CHUNK = 6  # cases a warm-up process runs


def warm_chunks(names, jobs):
    """The warm-up's processes: at least `jobs` of them, about WARM_CHUNK cases each, the cases
    dealt out round-robin (process i takes names i, i + n, i + 2n, ...)."""
    n = min(len(names), max(jobs, -(-len(names) // WARM_CHUNK)))
    return [names[i::n] for i in range(n)]


def warm(families, jobs, deadline, only=None):
    """Runs every case of the JIT families once, about WARM_CHUNK cases to a process, `jobs`
    processes at a time: the kernels land in the JIT cache, which the sanitized processes then
    load. One case a process took 224 s for 199 cases with every kernel already cached (an H100,
    2026-12-07): each process's start (torch, CUDA, fray) was the cost. Six neighbouring cases of
    one family to a process took 379 s on a fresh machine (6a92556, an H100, 2026-12-07): a chunk
    of six prefill cases compiles six CUDA kernels one after another, the sweep's critical path.
    So the cases are dealt out round-robin: neighbours (one kernel family, the costly compiles)
    land in different processes. A chunk that fails is finished one case a process, so a faulting
    case neither hides nor leaves the others cold."""
    names = case_names([f for f in families if f in JIT_FAMILIES], only)
    if not names:
        return 0.0
    t0 = time.time()
    chunks = warm_chunks(names, jobs)
    print("warm: building the kernels of %d JIT cases in %d processes" % (len(names), len(chunks)), flush=True)

    def run(group, limit):
        try:
            p = subprocess.run([sys.executable, "-m", "fray.sanitize", "--case", ",".join(group)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=limit)
        except subprocess.TimeoutExpired as e:
            return "timeout", (e.stdout or b"").decode(errors="replace")
        return p.returncode, p.stdout.decode(errors="replace")

    def one(group):
        rc, log = run(group, max(60, deadline // 2))
        if not rc:
            return []
        if len(group) == 1:
            return [(group[0], rc, log[-400:])]
        done = set(re.findall(r"\[sanitize\] case (\S+) done", log))
        failed = []
        for n in group:
            if n not in done:
                failed += one([n])
        return failed
    with cf.ThreadPoolExecutor(jobs) as ex:
        for failed in ex.map(one, chunks):
            for n, rc, tail in failed:
                print("warm: %s failed (rc %s): %s" % (n, rc, tail), flush=True)
    print("warm: %.0f s" % (time.time() - t0), flush=True)
    return time.time() - t0


def sweep(families, out_dir, tools, jobs, timeout, deadline, chunk, command="", commit="unknown", only=None):
    """Cases run `chunk` to a process (one family per process; the context is checked after
    each), the costliest processes first; a chunk that is not clean under a tool is re-run one case
    per process, so every finding is attributed to its case and one fault cannot hide the rest.
    SANITIZE.md is rewritten after every process, so a sweep cut short still leaves its report."""
    san = _sanitizer()
    smoke, work, est, counts = plan(families, tools, chunk, only)
    deadline -= warm(families, jobs, deadline, only)  # the deadline counts from the sweep's start
    estimate = ["%s %d cases, %d processes, ~%.0f s of process time (~%.0f s on %d jobs)" % (
        t, counts[t], sum(1 for w in work if w[0] == t), est[t], est[t] / jobs, jobs) for t in tools]
    for e in estimate:
        print("estimate: " + e, flush=True)
    print("estimate: wall ~%.0f s" % _wall(work, est, jobs, tools), flush=True)
    for tool in tools:
        os.makedirs(os.path.join(out_dir, tool), exist_ok=True)
    start = time.time()
    rows = []
    pending = {(t, n) for t, g in work for n in g}
    report = os.path.join(out_dir, "SANITIZE.md")

    def record(r):
        rows.append(r)
        pending.discard((r["tool"], r["case"]))
        print("%-10s %-70s %s" % (r["tool"], r["case"][:70], _cell(r)), flush=True)
        with open(os.path.join(out_dir, "sanitize.jsonl"), "a") as fh:
            fh.write(json.dumps(r) + "\n")
        write_report(rows, report, command, commit, sorted(pending), estimate)

    # The smoke case first under every tool: a tool that cannot run torch + Fray shows here.
    with cf.ThreadPoolExecutor(len(tools)) as ex:
        for r in list(ex.map(lambda t: _one(t, smoke, out_dir, timeout, san), tools)):
            record(r)

    def run(t, g):
        if time.time() - start >= deadline:
            return [{"tool": t, "case": n, "rc": "skipped", "errors": None, "seconds": 0,
                     "status": "not run (deadline)"} for n in g]
        # (no process outlives the deadline by more than 30 s: the report is due then)
        left = deadline + 30 - (time.time() - start)
        r = _one(t, ",".join(g), out_dir, int(max(10, min(timeout, left, _limit(t, g)))), san)
        if r["status"] == "clean" or len(g) == 1:
            return [dict(r, case=n, seconds=round(r["seconds"] / len(g), 1), chunk=len(g)) for n in g]
        return None  # re-run one case per process

    with cf.ThreadPoolExecutor(jobs) as ex:
        futs = {ex.submit(run, t, g): (t, g) for t, g in work}
        redo = []
        for f in cf.as_completed(futs):
            out = f.result()
            if out is None:
                t, g = futs[f]
                redo += [ex.submit(run, t, [n]) for n in g]
                continue
            for r in out:
                record(r)
        for f in cf.as_completed(redo):
            for r in f.result():
                record(r)
    took = {t: round(sum(r["seconds"] for r in rows if r["tool"] == t), 1) for t in tools}
    print("sanitize: wall %.0f s; process seconds per tool %s" % (time.time() - start, json.dumps(took)), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m fray.sanitize", description=__doc__.split("\n")[0])
    ap.add_argument("--list", nargs="?", const="all", metavar="FAMILIES")
    ap.add_argument("--case")
    ap.add_argument("--sweep", metavar="FAMILIES")
    ap.add_argument("--out", default="sanitize")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=8, help="cases per process (a chunk not clean is re-run one by one)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per process")
    ap.add_argument("--deadline", type=int, default=270, help="no process starts after this many seconds")
    ap.add_argument("--command", help="the command line the report names (run.sh passes its own)")
    ap.add_argument("--estimate", action="store_true", help="print the plan's estimate per tool and exit")
    ap.add_argument("--only", metavar="REGEX", help="the cases whose family/case names this regular expression finds")
    a = ap.parse_args(argv)

    def fams(s):
        return [f for f in CASES if f != "smoke"] if s == "all" else s.split(",")
    # The JIT families' cases take the shipped or default configuration, never a tuning sweep (the
    # warm-up and the sanitized processes must load the same kernels).
    os.environ.setdefault("FRAY_AUTOTUNE", "0")
    if a.case:
        run_case(a.case)
        return 0
    if a.list:
        print("\n".join(case_names(fams(a.list), a.only)))
        return 0
    if a.sweep:
        tools = a.tools.split(",") if a.tools != "all" else list(TOOLS)
        for t in tools:
            if t not in TOOLS:
                raise ValueError("tools: expected some of %s, got %r" % (", ".join(TOOLS), t))
        if a.estimate:
            _, work, est, counts = plan(fams(a.sweep), tools, a.chunk, a.only)
            for t in tools:
                print("%-10s %4d cases %4d processes ~%5.0f s process time, ~%4.0f s on %d jobs" % (
                    t, counts[t], sum(1 for w in work if w[0] == t), est[t], est[t] / a.jobs, a.jobs))
            print("wall ~%.0f s" % _wall(work, est, a.jobs, tools))
            return 0
        os.makedirs(a.out, exist_ok=True)
        from fray import env
        cmd = a.command or "python3 -m fray.sanitize --sweep %s --tools %s" % (a.sweep, a.tools)
        rows = sweep(fams(a.sweep), a.out, tools, a.jobs, a.timeout, a.deadline, a.chunk, cmd,
                     env.commit() or "unknown", a.only)
        bad = [r for r in rows if r["status"] != "clean"]
        print("sanitize: %d runs, %d not clean" % (len(rows), len(bad)))
        return 1 if bad else 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
