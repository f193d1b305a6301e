"""fray.fused_moe (and fray.routed_grouped_gemm, its one-matrix form): reference (hand-computed and
exact on integer data, where every rounding position shows), Triton (interpreter on CPU), error
contract, GPU (recipes, layouts, activations, combine modes, expert_map, T = 1, every token to one
expert, CUDA-graph replay with the routing changing, torch.compile, determinism)."""
import math
import os

import numpy as np
import pytest
import torch

import fray
from fray.ops import moe as M
from fray.ops import moe_gemm as MG
from fray.reference import moe as ref

INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")
bf16, f16 = torch.bfloat16, torch.float16


def _layer(t, hdim, inter, e, dtype, device="cpu", seed=0, layout="nk"):
    x, w13, w2, logits = MG._case_inputs(t, hdim, inter, e, 1, dtype, "cpu", seed)
    if layout == "kn":
        w13, w2 = w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
    return x.to(device), w13.to(device), w2.to(device), logits.to(device)


def _distinct_ids(t, k, e, seed=0):
    g = torch.Generator().manual_seed(seed)
    if t == 0:
        return torch.zeros(0, k, dtype=torch.int32)
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()


def _weights(t, k, seed=0):
    w = torch.rand(t, k, generator=torch.Generator().manual_seed(seed)) + 0.1
    return (w / w.sum(-1, keepdim=True)).float()


# ---------------------------------------------------------------------------------------------
# CPU: reference

def test_reference_hand_computed():
    # one token, one expert, I = 1: g = [x.w_gate, x.w_up] = [0, 2]: silu(0) * 2 = 0 -> out 0;
    # then gate 2, up 3: silu(2) * 3 = 2 * 3 / (1 + e^-2), times w2 = [1, -1], times weight 0.5
    x = np.array([[1.0, 1.0]], np.float64)
    w13 = np.array([[[1.0, 1.0], [1.0, 2.0]]])     # nk: [E=1, 2I=2, H=2]
    w2 = np.array([[[1.0], [-1.0]]])               # nk: [E=1, H=2, I=1]
    out = fray.fused_moe(x, w13, w2, topk_weights=np.array([[0.5]]), topk_ids=np.array([[0]]))
    h = 2.0 * 3.0 / (1.0 + math.exp(-2.0))
    np.testing.assert_allclose(out, [[0.5 * h, -0.5 * h]], rtol=1e-15)
    # the seed's layout gives the same
    out_kn = fray.fused_moe(x, w13.transpose(0, 2, 1).copy(), w2.transpose(0, 2, 1).copy(), w_layout="kn",
                            topk_weights=np.array([[0.5]]), topk_ids=np.array([[0]]))
    np.testing.assert_array_equal(out, out_kn)
    # a dropped route (expert_map -1) contributes zero; the kept one its weighted value
    out = fray.fused_moe(x, np.concatenate([w13, 2 * w13]), np.concatenate([w2, w2]),
                         topk_weights=np.array([[0.5, 0.25]]), topk_ids=np.array([[0, 2]]),
                         expert_map=np.array([-1, 0, 1], np.int32))
    h2 = 4.0 * 6.0 / (1.0 + math.exp(-4.0))
    np.testing.assert_allclose(out, [[0.25 * h2, -0.25 * h2]], rtol=1e-15)


def test_reference_rounds_where_the_unfused_ops_round():
    """bf16 CPU tensors: fused_moe equals route -> the grouped GEMMs -> silu_mul -> weighting done
    with the library's own unfused references, rounding for rounding."""
    t, hdim, inter, e, k = 6, 32, 24, 4, 2
    x, w13, w2, logits = _layer(t, hdim, inter, e, bf16)
    w, ids = fray.moe_route(logits, k)
    got = fray.fused_moe(x, w13, w2, router_logits=logits, top_k=k)
    out = torch.zeros(t, hdim, dtype=torch.float64)
    for tok in range(t):
        for j in range(k):
            g = fray.gemm(x[tok:tok + 1], w13[ids[tok, j]])                # rounded to bf16
            h = fray.silu_mul(g)                                            # rounded to bf16
            y = fray.gemm(h, w2[ids[tok, j]])
            out[tok] += (y.double() * float(w[tok, j])).to(bf16).double()[0]
    assert torch.equal(got, out.to(bf16))


def test_reference_exact_on_integer_data():
    """Small-integer operands keep both GEMMs exact in fp32 and float64, so every rounding the op
    makes is visible: dropping the rounding of g, h, y or y * w changes the result."""
    t, hdim, inter, e, k = 5, 16, 8, 3, 2
    g = torch.Generator().manual_seed(4)
    x = torch.randint(-2, 3, (t, hdim), generator=g).to(bf16)
    w13 = torch.randint(-1, 2, (e, 2 * inter, hdim), generator=g).to(bf16)
    w2 = torch.randint(-1, 2, (e, hdim, inter), generator=g).to(bf16)
    w = torch.tensor([[0.75, 0.25], [0.625, 0.375], [0.5, 0.5], [0.875, 0.125], [0.6, 0.4]])
    ids = _distinct_ids(t, k, e, 1)
    got = fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids)
    exp, _, _ = ref.fused_moe(x.double().numpy(), w13.double().numpy(), w2.double().numpy(), w.double().numpy(),
                              ids.numpy(), bf16)
    assert torch.equal(got, torch.from_numpy(exp).to(bf16))
    # without the rounding of h the result differs (the test can fail)
    unrounded = np.zeros((t, hdim))
    for tok in range(t):
        for j in range(k):
            gg = ref.round_to(x[tok].double().numpy() @ w13[ids[tok, j]].double().numpy().T, bf16)
            h = gg[:inter] / (1 + np.exp(-gg[:inter])) * gg[inter:]
            y = ref.round_to(h @ w2[ids[tok, j]].double().numpy().T, bf16)
            unrounded[tok] += ref.round_to(y * float(w[tok, j]), bf16)
    assert not torch.equal(got, torch.from_numpy(unrounded).to(bf16))


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernels under the interpreter

INTERP_CASES = [  # (t, hdim, inter, e, k, combine, activation, layout, weight_on_input, dtype)
    (1, 32, 24, 4, 1, "atomic", "silu", "nk", False, bf16),
    (7, 48, 40, 4, 2, "staged", "gelu", "kn", False, f16),
    (19, 32, 16, 8, 4, "scatter", "gelu_tanh", "nk", False, bf16),
    (10, 32, 24, 4, 2, "staged", "silu", "nk", True, bf16),
    (17, 40, 20, 3, 3, "atomic", "silu", "kn", False, bf16),
]


def _fused_path(path, *args):
    """MG._fused, or ("cuda") the CUDA path with the Triton explicit grouped GEMM standing in for
    the CUDA one: the unpadded dispatch, the row gather, the gated rows and the weighing combine
    around it are what the interpreter checks there (the CUDA GEMM itself is checked on the GPU)."""
    if path == "triton":
        return MG._fused(*args)
    return MG._fused_cuda(*args, gemm=MG._explicit)


@INTERPRETER
@pytest.mark.parametrize("path", ["triton", "cuda"])
@pytest.mark.parametrize("t,hdim,inter,e,k,combine,activation,layout,won,dtype", INTERP_CASES)
def test_triton_interpreter_fused(path, t, hdim, inter, e, k, combine, activation, layout, won, dtype):
    x, w13, w2, _ = _layer(t, hdim, inter, e, dtype, seed=t, layout=layout)
    w, ids = _weights(t, k, t), _distinct_ids(t, k, e, t)
    out = torch.full((t, hdim), float("nan"), dtype=dtype)
    combine = combine if path == "triton" else "staged"  # the CUDA path combines staged only
    _fused_path(path, x, w13, w2, w, ids, None, out, activation, won, layout, combine)
    MG.check_fused(x, w13, w2, w, ids, out, "interpreter " + path, activation, None, won, layout)


@INTERPRETER
@pytest.mark.parametrize("path", ["triton", "cuda"])
def test_triton_interpreter_expert_map_and_every_token_to_one_expert(path):
    t, hdim, inter, e, k = 20, 32, 16, 4, 2
    x, w13, w2, _ = _layer(t, hdim, inter, e, bf16, seed=3)
    ids = torch.tensor([[5, 1]] * t, dtype=torch.int32)       # global ids; 1 is absent from this rank
    emap = torch.tensor([-1, -1, 0, 1, 2, 3], dtype=torch.int32)
    w = _weights(t, k)
    w[:, 1] = float("nan")  # the dropped route's weight must not reach the sum
    for activation, won in (("silu", False), ("gelu", True)):
        out = torch.full((t, hdim), float("nan"), dtype=bf16)
        _fused_path(path, x, w13, w2, w, ids, emap, out, activation, won, "nk", "staged")
        assert not torch.isnan(out).any()
        MG.check_fused(x, w13, w2, w, ids, out, "expert_map " + path, activation, emap, won)


@INTERPRETER
def test_unpadded_dispatch_sorts_by_expert_without_padding():
    ids = torch.tensor([[2, 0], [0, 3], [2, 1], [5, 0]], dtype=torch.int32)
    emap = torch.tensor([0, -1, 1, 2, -1, 3], dtype=torch.int32)   # experts 1 and 4 elsewhere
    sorted_ids, offsets, inverse = MG._sorted_dispatch(ids, emap, 4)
    assert offsets.tolist() == [0, 3, 5, 6, 7]
    assert sorted_ids.tolist() == [1, 2, 7, 0, 4, 3, 6, 8]  # routes by local expert, stable; 8 = sentinel
    for row, r in enumerate(sorted_ids.tolist()[:7]):
        assert inverse[r] == row
    assert inverse[5] == -1
    # past the one-program dispatch's 128 routes: the three-kernel path at block_m 1, no tile map
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 10, (70, 3), generator=g, dtype=torch.int32)
    emap = torch.tensor([3, -1, 0, 5, 1, -1, 2, 4, -1, 6], dtype=torch.int32)
    sorted_ids, offsets, inverse = MG._sorted_dispatch(ids, emap, 7)
    want = ref.moe_dispatch(ids.numpy(), 7, 1, emap.numpy())
    assert sorted_ids.tolist() == want[0].tolist() and offsets.tolist() == want[1].tolist()
    assert inverse.tolist() == want[4].tolist()


@INTERPRETER
@pytest.mark.parametrize("combine", ["atomic", "staged", "scatter"])
def test_triton_interpreter_routed(combine):
    t, hdim, n, e, k = 9, 32, 40, 4, 2
    x, b, _, _ = _layer(t, hdim, n // 2, e, f16, seed=5)
    w, ids = _weights(t, k, 2), _distinct_ids(t, k, e, 2)
    out = torch.full((t, n), float("nan"), dtype=f16)
    MG._routed(x, b, w, ids, out, "nk", combine)
    MG.check_routed(x, b, w, ids, out, "routed " + combine)


def test_kn_up_half_takes_tma_only_at_16_byte_columns(monkeypatch):
    """A gated kn stack [E, H, 2I] is read through TMA only where its up half's first column (I)
    is a 16-byte multiple; else through pointers (at I = 100 fp16 the TMA load faulted). nk stacks
    and ungated ones are unaffected. Decided on the host (the interpreter flag forced off)."""
    from fray_triton import moe_gemm as tg
    monkeypatch.setattr(tg, "_INTERPRET", False)
    for dtype, inter, ok in ((f16, 100, False), (bf16, 100, False), (f16, 104, True), (f16, 96, True),
                             (torch.float32, 98, False), (torch.float32, 100, True)):
        w13 = torch.zeros(2, 64, 2 * inter, dtype=dtype)        # kn: [E, H, 2I]
        assert w13.data_ptr() % 16 == 0
        assert tg.descriptor_ok(w13, b_nk=False, n_half=inter) is ok, (dtype, inter)
        assert tg.descriptor_ok(w13, b_nk=False, n_half=0)
        assert tg.descriptor_ok(w13.transpose(1, 2).contiguous(), b_nk=True, n_half=inter)


@INTERPRETER
@pytest.mark.parametrize("e,block_m", [(8, 16), (32, 16), (64, 128), (256, 64)])
def test_grid_tiles_bounds_every_dispatch(e, block_m):
    """The GEMM grids' row-tile bound holds for the tiles a dispatch fills: skewed, uniform and
    single-expert routings, with and without an expert map; and it is nearly reached."""
    rng = np.random.default_rng(e + block_m)
    for t, k in ((1, 1), (1, 8), (3, 2), (16, 8), (100, 6), (1000, 4)):
        k = min(k, e)
        for kind in ("uniform", "skewed", "one"):
            if kind == "one":
                ids = np.repeat(np.arange(k)[None, :], t, 0)
            else:
                p = rng.dirichlet(np.full(e, 0.1 if kind == "skewed" else 10.0))
                ids = np.stack([rng.choice(e, k, replace=False, p=p) for _ in range(t)])
            for emap in (None, np.where(np.arange(e) % 2 == 0, np.arange(e) // 2, -1)):
                local = e if emap is None else (e + 1) // 2
                num_tiles = int(ref.moe_dispatch(ids, local, block_m, emap)[3][0])
                bound = MG.grid_tiles(t * k, local, block_m, 1 << 30)
                assert num_tiles <= bound, (t, k, kind, num_tiles, bound)
    # every expert one route past a full tile fills 2E tiles, the bound's E + E + E // block_m
    r = e * (block_m + 1)
    ids = np.concatenate([np.full(block_m + 1, x) for x in range(e)])[:, None]
    assert int(ref.moe_dispatch(ids, e, block_m)[3][0]) == 2 * e
    assert MG.grid_tiles(r, e, block_m, 1 << 30) == 2 * e + e // block_m
    # and never more than the dispatch's buffers hold
    assert MG.grid_tiles(1000, 64, 16, 7) == 7


def test_the_check_can_fail():
    """check_fused's bound is tight enough to see a misplaced weight (5%) or a lost route."""
    t, hdim, inter, e, k = 8, 32, 24, 4, 2
    x, w13, w2, _ = _layer(t, hdim, inter, e, bf16, seed=6)
    w, ids = _weights(t, k, 6), _distinct_ids(t, k, e, 6)
    out = torch.empty(t, hdim, dtype=bf16)
    MG._fused(x, w13, w2, w * 1.05, ids, None, out, "silu", False, "nk", "staged")
    with pytest.raises(AssertionError, match="elements off"):
        MG.check_fused(x, w13, w2, w, ids, out, "scaled weights")
    w0 = w.clone()
    w0[:, 1] = 0
    MG._fused(x, w13, w2, w0, ids, None, out, "silu", False, "nk", "staged")
    with pytest.raises(AssertionError, match="elements off"):
        MG.check_fused(x, w13, w2, w, ids, out, "lost route")


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    x, w13, w2, logits = _layer(4, 32, 24, 4, bf16)
    w, ids = _weights(4, 2), _distinct_ids(4, 2, 4)
    with pytest.raises(ValueError, match="router_logits / topk_weights, topk_ids: pass"):
        fray.fused_moe(x, w13, w2)
    with pytest.raises(ValueError, match="router_logits / topk_weights, topk_ids: pass"):
        fray.fused_moe(x, w13, w2, router_logits=logits, topk_ids=ids, topk_weights=w, top_k=2)
    with pytest.raises(ValueError, match="top_k: required with router_logits"):
        fray.fused_moe(x, w13, w2, router_logits=logits)
    with pytest.raises(ValueError, match="w_layout: expected one of"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, w_layout="vllm")
    with pytest.raises(ValueError, match="activation: expected one of"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, activation="relu")
    with pytest.raises(ValueError, match="combine: expected one of"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, combine="sum")
    with pytest.raises(ValueError, match=r"w13: expected \[E, 2I, 32\]"):
        fray.fused_moe(x, w13[:, :, :16], w2, topk_weights=w, topk_ids=ids)
    with pytest.raises(ValueError, match=r"w13: expected \[E, 2I, 32\]"):
        fray.fused_moe(x, w13[:, :47], w2, topk_weights=w, topk_ids=ids)
    with pytest.raises(ValueError, match=r"w2: expected shape \(4, 32, 24\)"):
        fray.fused_moe(x, w13, w2[:, :, :12], topk_weights=w, topk_ids=ids)
    with pytest.raises(ValueError, match=r"w2: expected shape \(4, 24, 32\)"):
        fray.fused_moe(x, w13.transpose(1, 2), w2, w_layout="kn", topk_weights=w, topk_ids=ids)
    with pytest.raises(TypeError, match="w2: expected x's dtype"):
        fray.fused_moe(x, w13, w2.half(), topk_weights=w, topk_ids=ids)
    with pytest.raises(TypeError, match="x: expected dtype bfloat16 or float16, got float32"):
        fray.fused_moe(x.float(), w13, w2, topk_weights=w, topk_ids=ids)
    with pytest.raises(ValueError, match="x: the last dimension must be contiguous"):
        fray.fused_moe(x.t().contiguous().t(), w13, w2, topk_weights=w, topk_ids=ids)
    with pytest.raises(TypeError, match="topk_weights: expected dtype float32, got float64"):
        fray.fused_moe(x, w13, w2, topk_weights=w.double(), topk_ids=ids)
    with pytest.raises(TypeError, match="topk_ids: expected dtype int32 or int64, got float32"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids.float())
    with pytest.raises(ValueError, match=r"topk_weights: expected topk_ids' shape \(4, 2\)"):
        fray.fused_moe(x, w13, w2, topk_weights=w[:, :1].contiguous(), topk_ids=ids)
    with pytest.raises(ValueError, match=r"topk_ids: expected shape \(4, top_k\)"):
        fray.fused_moe(x, w13, w2, topk_weights=w[:3], topk_ids=ids[:3])
    with pytest.raises(ValueError, match="top_k: 3 does not match topk_ids' 2 columns"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, top_k=3)
    with pytest.raises(ValueError, match=r"topk_ids: expected ids in \[0, 4\)"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids + 3)
    with pytest.raises(ValueError, match=r"router_logits: expected shape \(4, 8\) \(tokens, experts of expert_map\)"):
        fray.fused_moe(x, w13, w2, router_logits=logits, top_k=2, expert_map=torch.arange(8, dtype=torch.int32) % 4)
    with pytest.raises(ValueError, match=r"expert_map: expected local ids in \[-1, 4\)"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, expert_map=torch.full((4,), 4, dtype=torch.int32))
    with pytest.raises(TypeError, match="apply_router_weight_on_input: expected a bool"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, apply_router_weight_on_input=1)
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 32\)"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, out=torch.empty(4, 24, dtype=bf16))
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, backend="triton")
    b = w13
    with pytest.raises(ValueError, match=r"logits: expected shape \(4, 4\)"):
        fray.routed_grouped_gemm(x, b, logits[:, :3], 2)
    with pytest.raises(ValueError, match="combine: expected one of"):
        fray.routed_grouped_gemm(x, b, logits, 2, combine="none")
    with pytest.raises(ValueError, match=r"expert_weights: expected K = 32"):
        fray.routed_grouped_gemm(x, b, logits, 2, b_layout="kn")
    with pytest.raises(ValueError, match=r"top_k: expected a value in \[1, 4\]"):
        fray.routed_grouped_gemm(x, b, logits, 5)


def test_seed_aliases_take_the_seed_layouts():
    x, w13, w2, logits = _layer(3, 32, 24, 4, bf16)
    import fray.triton as ft
    assert "w_layout" in ft.fused_moe.__doc__ or "seed" in ft.fused_moe.__doc__
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        ft.fused_moe(x, logits, w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous(), top_k=2)
    with pytest.raises(ValueError, match=r"w13: expected \[E, 2I, 32\] \(w_layout 'nk'\) or \[E, 32, 2I\]"):
        ft.fused_moe(x, logits, w13, w2, top_k=2)  # vLLM-layout weights given to the seed alias: refused


@INTERPRETER
@pytest.mark.parametrize("t,k,e,layout", [(1, 2, 4, "nk"), (13, 3, 5, "kn")])
def test_cuda_path_routed_composition_under_the_interpreter(t, k, e, layout):
    """routed_grouped_gemm's CUDA path, the Triton explicit GEMM in the CUDA one's place."""
    x, b, _, logits = _layer(t, 32, 20, e, bf16, seed=t, layout=layout)
    w, ids = fray.moe_route(logits, k)
    out = torch.full((t, 40), float("nan"), dtype=bf16)
    MG._routed_cuda(x, b, w, ids, out, layout, "auto", gemm=MG._explicit)
    MG.check_routed(x, b, w, ids, out, "routed cuda path (interpreter)", layout)


def test_cuda_path_kernels_compile_for_sm90a():
    """The CUDA paths' Triton pieces (the row gather, the gated rows, the weighing combine, the rows
    back into route order) through Triton's compiled path for sm_90a: type errors the interpreter
    never sees, and no spills."""
    from fray.testing import compile_triton_sm90, sm90_spec
    specs = []
    for dt in ("bf16", "fp16"):
        rows = {"ROUTES": "*i32", "LIMIT": "*i32"}
        for won in (False, True):
            specs.append(sm90_spec("fray_triton.moe_gemm", "_gather_rows_kernel",
                                   dict(rows, X="*" + dt, WEIGHTS="*fp32", OUT="*" + dt),
                                   dict(WEIGHT_INPUT=won, BLOCK_H=1024), divisible=("X", "OUT", "ldx", "ldo")))
        for act in (0, 1, 2):
            specs.append(sm90_spec("fray_triton.moe_gemm", "_gated_rows_kernel", dict(rows, G="*" + dt, OUT="*" + dt),
                                   dict(ACT=act, BLOCK_I=1024), divisible=("G", "OUT", "ldg", "ldo")))
        for weighted in (False, True):
            specs.append(sm90_spec("fray_triton.moe_gemm", "_combine_kernel",
                                   {"S": "*" + dt, "INVERSE": "*i32", "WEIGHTS": "*fp32", "OUT": "*" + dt},
                                   dict(TOP_K=6, WEIGHTED=weighted, BLOCK_N=1024), divisible=("S", "OUT", "lds", "ldo")))
        specs.append(sm90_spec("fray_triton.moe_gemm", "_scatter_rows_kernel",
                               {"Y": "*" + dt, "ROUTES": "*i32", "OUT": "*" + dt}, dict(BLOCK_N=1024),
                               divisible=("Y", "OUT", "ldy", "ldo")))
    for spec, r in zip(specs, compile_triton_sm90(specs)):
        assert r["spills"] == 0, (spec["kernel"], spec["constexprs"], r)


def test_a_layer_on_cuda_routes_on_triton(monkeypatch):
    """moe_route has a Triton kernel only: fused_moe / routed_grouped_gemm asked to run on "cuda"
    (backend= or FRAY_BACKEND) route on Triton; CPU inputs keep the backend they named."""
    from fray import env

    class OnGpu:
        device = torch.device("cuda")
    monkeypatch.setattr(env, "backend_override", lambda: None)
    assert MG._route_backend("cuda", OnGpu()) == "triton"
    assert MG._route_backend("auto", OnGpu()) == "auto"
    assert MG._route_backend("triton", OnGpu()) == "triton"
    assert MG._route_backend("cuda", torch.zeros(1)) == "cuda"
    monkeypatch.setattr(env, "backend_override", lambda: "cuda")
    assert MG._route_backend("auto", OnGpu()) == "triton"


def test_cuda_path_refuses_the_unstaged_combines():
    x, w13, w2, _ = _layer(4, 32, 16, 4, bf16)
    w, ids = _weights(4, 2), _distinct_ids(4, 2, 4)
    for combine in ("atomic", "scatter"):
        with pytest.raises(ValueError, match="combine: backend='cuda' combines staged"):
            MG._fused_cuda(x, w13, w2, w, ids, None, torch.empty_like(x), "silu", False, "nk", combine)
        with pytest.raises(ValueError, match="combine: backend='cuda' combines staged"):
            MG._routed_cuda(x, w13, w, ids, torch.empty(4, 32, dtype=bf16), "nk", combine)


def test_custom_op_is_registered():
    assert hasattr(torch.ops.fray, "fused_moe") and hasattr(torch.ops.fray, "routed_gemm")


# ---------------------------------------------------------------------------------------------
# GPU

GPU_SHAPES = [  # (t, hdim, inter, e, k): T = 1, T not a multiple of any block_m, top_k 1..8
    (1, 512, 384, 8, 2), (1, 1024, 256, 64, 8), (37, 512, 384, 8, 1), (333, 1024, 512, 16, 4),
    (2048, 512, 256, 64, 6), (4096, 256, 128, 128, 8), (129, 2048, 1408, 8, 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda"])
@pytest.mark.parametrize("dtype", [bf16, f16])
@pytest.mark.parametrize("t,hdim,inter,e,k", GPU_SHAPES)
def test_gpu_prepared(cuda, backend, dtype, t, hdim, inter, e, k):
    x, w13, w2, logits = _layer(t, hdim, inter, e, dtype, cuda, seed=t + e)
    w, ids = fray.moe_route(logits, k)
    out = torch.full((t, hdim), float("nan"), dtype=dtype, device=cuda)
    fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, out=out, backend=backend)
    MG.check_fused(x, w13, w2, w, ids, out, "%s T=%d E=%d k=%d" % (backend, t, e, k))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [f16, bf16])
@pytest.mark.parametrize("t,hdim,inter", [(40, 200, 100), (40, 256, 104), (40, 200, 128), (300, 200, 100),
                                          (3, 136, 72)])
def test_gpu_kn_odd_widths(cuda, dtype, t, hdim, inter):
    """kn stacks whose up half starts off a 16-byte column (I = 100) or whose K (I, for GEMM 2) is
    below the 128-deep K tile, at decode (16-row tiles) and prefill row tiles: the sanitizer case
    that faulted (T40 H200 I100 fp16, weight on input, gelu) among them."""
    x, w13, w2, logits = _layer(t, hdim, inter, 4, dtype, cuda, seed=inter, layout="kn")
    w, ids = fray.moe_route(logits, 2)
    for won, activation in ((True, "gelu"), (False, "silu")):
        out = fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, w_layout="kn", activation=activation,
                             apply_router_weight_on_input=won, backend="triton")
        torch.cuda.synchronize()
        MG.check_fused(x, w13, w2, w, ids, out, "kn T%d H%d I%d" % (t, hdim, inter), activation, None, won, "kn")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("combine", ["atomic", "staged", "scatter"])
@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
def test_gpu_layouts_combines_activations(cuda, layout, combine, activation):
    t, hdim, inter, e, k = 300, 512, 256, 16, 4
    x, w13, w2, logits = _layer(t, hdim, inter, e, bf16, cuda, seed=7, layout=layout)
    w, ids = fray.moe_route(logits, k)
    out = fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, w_layout=layout, combine=combine,
                         activation=activation)
    MG.check_fused(x, w13, w2, w, ids, out, "%s %s %s" % (layout, combine, activation), activation, layout=layout)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", list(M.RECIPES))
def test_gpu_routing_recipes_end_to_end(cuda, recipe):
    t = 200
    logits, k, kw = M._recipe_args(recipe, t, bf16, cuda)
    e = logits.shape[1]
    x, w13, w2, _ = _layer(t, 256, 128, e, bf16, cuda, seed=e)
    out = fray.fused_moe(x, w13, w2, router_logits=logits, top_k=k, **kw)
    w, ids = fray.moe_route(logits, k, **kw)
    MG.check_fused(x, w13, w2, w, ids, out, recipe)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda"])
def test_gpu_weight_on_input_expert_map_and_one_hot_expert(cuda, backend):
    t, hdim, inter, e_global, e = 256, 512, 256, 32, 8
    x, w13, w2, _ = _layer(t, hdim, inter, e, bf16, cuda, seed=11)
    emap = torch.full((e_global,), -1, dtype=torch.int32)
    emap[8:16] = torch.arange(8, dtype=torch.int32)
    emap = emap.to(cuda)
    ids = _distinct_ids(t, 4, e_global, 3).to(cuda)
    w = _weights(t, 4, 3).to(cuda)
    out = fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, expert_map=emap, backend=backend)
    MG.check_fused(x, w13, w2, w, ids, out, "expert_map", expert_map=emap)
    staged = fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, expert_map=emap, combine="staged",
                            backend=backend)
    assert torch.equal(staged, fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, expert_map=emap,
                                              combine="staged", backend=backend))
    one = torch.full((t, 1), 3, dtype=torch.int32, device=cuda)          # every token to expert 3
    w1 = torch.full((t, 1), 0.5, device=cuda)
    out = fray.fused_moe(x, w13, w2, topk_weights=w1, topk_ids=one, apply_router_weight_on_input=True,
                         backend=backend)
    MG.check_fused(x, w13, w2, w1, one, out, "one expert, weight on input", weight_on_input=True)
    nowhere = torch.full((e_global,), -1, dtype=torch.int32, device=cuda)  # no expert on this rank: zeros
    out = torch.full_like(x, float("nan"))
    fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, expert_map=nowhere, out=out, backend=backend)
    assert torch.equal(out, torch.zeros_like(x))


@pytest.mark.gpu
def test_gpu_staged_is_bitwise_repeatable_and_atomic_close(cuda):
    t, hdim, inter, e, k = 2048, 1024, 512, 64, 6
    x, w13, w2, logits = _layer(t, hdim, inter, e, bf16, cuda, seed=2)
    w, ids = fray.moe_route(logits, k)
    first = fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, combine="staged")
    for _ in range(3):
        assert torch.equal(first, fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, combine="staged"))
    atomic = fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, combine="atomic")
    MG.check_fused(x, w13, w2, w, ids, atomic, "atomic")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda"])
def test_gpu_graph_replay_follows_new_routing(cuda, backend):
    t, hdim, inter, e, k = 128, 512, 256, 16, 2
    x, w13, w2, logits = _layer(t, hdim, inter, e, bf16, cuda, seed=5)
    static = logits.clone()
    # warm-up outside the capture: Triton compiles, the CUDA GEMM builds and tunes
    fray.fused_moe(x, w13, w2, router_logits=static, top_k=k, backend=backend)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fray.fused_moe(x, w13, w2, router_logits=static, top_k=k, backend=backend)
    for seed in range(3):
        new = M._random_logits(t, e, torch.float32, cuda, seed=100 + seed)
        if seed == 2:
            new[:, 0] += 100.0  # every token's first choice is expert 0
        static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        w, ids = fray.moe_route(new, k)
        MG.check_fused(x, w13, w2, w, ids, out, "%s replay %d" % (backend, seed))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda"])
def test_gpu_torch_compile_fullgraph(cuda, backend):
    t, hdim, inter, e, k = 64, 256, 128, 8, 2
    x, w13, w2, logits = _layer(t, hdim, inter, e, f16, cuda, seed=9)

    def layer(x_, logits_):
        return fray.fused_moe(x_, w13, w2, router_logits=logits_, top_k=k, combine="staged", backend=backend) + x_

    got = torch.compile(layer, fullgraph=True)(x, logits)
    assert torch.equal(got, layer(x, logits))


@pytest.mark.gpu
@pytest.mark.parametrize("combine", ["auto", "atomic", "staged", "scatter"])
@pytest.mark.parametrize("t,e,k", [(1, 8, 2), (257, 64, 6)])
def test_gpu_routed_grouped_gemm(cuda, combine, t, e, k):
    x, b, _, logits = _layer(t, 512, 320, e, bf16, cuda, seed=t)
    out = fray.routed_grouped_gemm(x, b, logits, k, combine=combine)
    w, ids = fray.moe_route(logits, k)
    MG.check_routed(x, b, w, ids, out, "routed %s" % combine)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda"])
def test_gpu_strided_x_rows(cuda, backend):
    t, hdim, inter, e, k = 100, 256, 128, 8, 2
    x, w13, w2, logits = _layer(t, hdim, inter, e, bf16, cuda, seed=1)
    wide = torch.zeros(t, 2 * hdim, dtype=bf16, device=cuda)
    wide[:, hdim:] = x
    w, ids = fray.moe_route(logits, k)
    out = fray.fused_moe(wide[:, hdim:], w13, w2, topk_weights=w, topk_ids=ids, backend=backend)
    MG.check_fused(x, w13, w2, w, ids, out, "strided x")


# ---------------------------------------------------------------------------------------------
# GPU: the CUDA path (CUTLASS's grouped GEMM between the row gather, the gated rows and the
# weighing combine)

@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("activation,won", [("silu", False), ("gelu", True), ("gelu_tanh", False)])
def test_gpu_cuda_path_layouts_activations(cuda, layout, activation, won):
    t, hdim, inter, e, k = 300, 512, 256, 16, 4
    x, w13, w2, logits = _layer(t, hdim, inter, e, bf16, cuda, seed=7, layout=layout)
    w, ids = fray.moe_route(logits, k)
    out = fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, w_layout=layout, activation=activation,
                         apply_router_weight_on_input=won, backend="cuda")
    MG.check_fused(x, w13, w2, w, ids, out, "cuda %s %s" % (layout, activation), activation, None, won, layout)


@pytest.mark.gpu
def test_gpu_cuda_path_refusals(cuda):
    x, w13, w2, logits = _layer(8, 200, 100, 4, bf16, cuda)
    w, ids = fray.moe_route(logits, 2)
    with pytest.raises(ValueError, match="w13 / w2: backend='cuda' reads the weights by TMA"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, backend="cuda")
    x, w13, w2, logits = _layer(8, 256, 128, 4, bf16, cuda)
    with pytest.raises(ValueError, match="combine: backend='cuda' combines staged"):
        fray.fused_moe(x, w13, w2, topk_weights=w, topk_ids=ids, combine="atomic", backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("t,e,k,layout", [(1, 8, 2, "nk"), (257, 64, 6, "nk"), (100, 16, 4, "kn")])
def test_gpu_cuda_path_routed_grouped_gemm(cuda, t, e, k, layout):
    x, b, _, logits = _layer(t, 512, 320, e, bf16, cuda, seed=t, layout=layout)
    out = fray.routed_grouped_gemm(x, b, logits, k, b_layout=layout, backend="cuda")
    w, ids = fray.moe_route(logits, k)
    MG.check_routed(x, b, w, ids, out, "routed cuda", layout)
    assert torch.equal(out, fray.routed_grouped_gemm(x, b, logits, k, b_layout=layout, combine="staged",
                                                     backend="cuda"))
