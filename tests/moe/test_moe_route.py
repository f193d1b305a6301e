"""fray.moe_route: reference (hand-computed, brute force), Triton (interpreter on CPU), error contract, GPU."""
import math
import os

import numpy as np
import pytest
import torch

import fray
from fray.ops import moe
from fray.reference import moe as ref
from fray.testing import assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (the Bazel CPU target sets it)")


def _brute(logits, top_k, scoring="softmax", renormalize=True, groups=None, topk_group=None, bias=None, scale=1.0):
    """An independent reference: Python sorting on (-score, id) and every combination of groups."""
    out_w, out_i = [], []
    for row in np.asarray(logits, np.float64):
        if scoring == "softmax":
            e = [math.exp(v - max(row)) for v in row]
            s = [v / sum(e) for v in e]
        else:
            s = [1.0 / (1.0 + math.exp(-v)) for v in row]
        sel = [v + (0.0 if bias is None else float(bias[i])) for i, v in enumerate(s)]
        allowed = list(range(len(row)))
        if groups:
            gs = len(row) // groups
            gscore = [sum(sorted(sel[g * gs:(g + 1) * gs], reverse=True)[:2]) for g in range(groups)]
            best = sorted(sorted(range(groups), key=lambda g: (-gscore[g], g))[:topk_group])
            allowed = [g * gs + j for g in best for j in range(gs)]
        chosen = sorted(allowed, key=lambda i: (-sel[i], i))[:top_k]
        w = [s[i] for i in chosen]
        if renormalize:
            w = [v / sum(w) for v in w]
        out_w.append([v * scale for v in w])
        out_i.append(chosen)
    return np.array(out_w), np.array(out_i)


def _grid_logits(t, e, seed=0):
    """Distinct logits on a grid of 1/8 per row (scores well apart: fp32 and float64 agree on ids)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([(torch.randperm(e, generator=g).double() - e / 2) / 8 for _ in range(t)])


def _triton_route(x, top_k, return_counts=True, **kw):
    """The Triton kernel on CPU tensors (the interpreter), arguments validated by the ops layer."""
    from fray_triton import moe as tmoe
    bias = kw.pop("correction_bias", None)
    scoring = kw.pop("scoring", "softmax")
    args = moe._check_route_args(x.shape[1], top_k, scoring, kw.pop("renormalize", True),
                                 kw.pop("num_expert_group", None), kw.pop("topk_group", None),
                                 kw.pop("routed_scaling_factor", 1.0), return_counts)
    assert not kw, kw
    k, renorm, groups, topk_group, scale, _ = args
    w = torch.full((x.shape[0], k), float("nan"))
    ids = torch.full((x.shape[0], k), -7, dtype=torch.int32)
    counts = torch.full((x.shape[1],), 0, dtype=torch.int32)
    tmoe.route(x, bias, w, ids, counts, k, scoring == "sigmoid", renorm, groups, topk_group, scale)
    return w, ids, counts


def _assert_route(x, top_k, w, ids, counts=None, what="", **kw):
    bias = kw.get("correction_bias")
    ew, ei, ec = ref.moe_route(x.double().numpy(), top_k, kw.get("scoring", "softmax"), kw.get("renormalize", True),
                               kw.get("num_expert_group"), kw.get("topk_group"),
                               None if bias is None else bias.double().numpy(), kw.get("routed_scaling_factor", 1.0))
    assert np.array_equal(ids.numpy(), ei), "%s: ids\n%s\n!= reference\n%s" % (what, ids.numpy(), ei)
    assert_close(w, ew, torch.float32, what + " weights")
    if counts is not None:
        assert np.array_equal(counts.numpy(), ec), "%s: counts %s != %s" % (what, counts.numpy(), ec)


# ---------------------------------------------------------------------------------------------
# CPU: reference against hand-computed values and brute force

def test_reference_hand_computed_softmax():
    # softmax of [0, ln 3, 0, ln 2] = [1, 3, 1, 2] / 7
    x = np.array([[0.0, math.log(3.0), 0.0, math.log(2.0)]])
    w, ids, counts = ref.moe_route(x, 2)
    assert ids.tolist() == [[1, 3]] and counts.tolist() == [0, 1, 0, 1]
    np.testing.assert_allclose(w, [[0.6, 0.4]], rtol=1e-15)
    w, ids, _ = ref.moe_route(x, 2, renormalize=False, routed_scaling_factor=2.0)
    np.testing.assert_allclose(w, [[6 / 7, 4 / 7]], rtol=1e-15)
    # top-1 without renormalisation is the max probability; renormalised it is 1
    np.testing.assert_allclose(ref.moe_route(x, 1, renormalize=False)[0], [[3 / 7]], rtol=1e-15)
    assert ref.moe_route(x, 1)[0].tolist() == [[1.0]]


def test_reference_bias_chooses_but_does_not_weigh():
    # sigmoid(0) = 0.5 for every expert; the bias picks 3 then 1; weights stay the unbiased 0.5
    x = np.zeros((1, 4))
    bias = np.array([0.0, 0.1, 0.0, 0.2])
    w, ids, _ = ref.moe_route(x, 2, "sigmoid", renormalize=False, correction_bias=bias)
    assert ids.tolist() == [[3, 1]] and w.tolist() == [[0.5, 0.5]]
    w, ids, _ = ref.moe_route(x, 2, "sigmoid", correction_bias=bias, routed_scaling_factor=2.5)
    assert w.tolist() == [[1.25, 1.25]]


def test_reference_grouped_hand_computed():
    # 4 groups of 2; selection scores 0.5 + bias: [0.9, 0.1 | 0.7, 0.7 | 0.6, 0.6 | 0.5, 0.5]
    # group scores 1.0, 1.4, 1.2, 1.0: groups 1 and 2 are kept, so expert 0 (the best single
    # score) is not eligible; top-2 among 2..5 = [2, 3]
    x = np.zeros((1, 8))
    bias = np.array([0.4, -0.4, 0.2, 0.2, 0.1, 0.1, 0.0, 0.0])
    kw = dict(num_expert_group=4, topk_group=2, correction_bias=bias, routed_scaling_factor=2.5)
    w, ids, _ = ref.moe_route(x, 2, "sigmoid", **kw)
    assert ids.tolist() == [[2, 3]] and w.tolist() == [[1.25, 1.25]]
    w, ids, _ = ref.moe_route(x, 3, "sigmoid", **kw)
    assert ids.tolist() == [[2, 3, 4]]
    # ungrouped, expert 0 wins
    assert ref.moe_route(x, 2, "sigmoid", correction_bias=bias)[1].tolist() == [[0, 2]]


def test_reference_ties_go_to_the_lower_id():
    assert ref.moe_route(np.zeros((2, 6)), 3)[1].tolist() == [[0, 1, 2]] * 2
    # equal groups: the lower groups are kept
    w, ids, _ = ref.moe_route(np.zeros((1, 8)), 4, "sigmoid", num_expert_group=4, topk_group=2)
    assert ids.tolist() == [[0, 1, 2, 3]] and w.tolist() == [[0.25] * 4]
    # a tie between experts 1 and 4 behind expert 2
    x = np.array([[0.0, 1.0, 2.0, 0.0, 1.0]])
    assert ref.moe_route(x, 3)[1].tolist() == [[2, 1, 4]]


def test_reference_nan_logits():
    x = np.array([[0.0, np.nan, 1.0, 2.0], [0.0, 3.0, 1.0, 2.0]])
    w, ids, _ = ref.moe_route(x, 2)
    # softmax: the NaN row is NaN throughout; its selection scores count as -inf: experts 0, 1
    assert ids.tolist() == [[0, 1], [1, 3]] and np.isnan(w[0]).all() and np.isfinite(w[1]).all()
    # sigmoid: only the NaN expert's score is NaN; it ranks last
    w, ids, _ = ref.moe_route(x, 3, "sigmoid")
    assert ids[0].tolist() == [3, 2, 0] and np.isfinite(w).all()


@pytest.mark.parametrize("seed", range(6))
def test_reference_vs_brute_force(seed):
    rng = np.random.default_rng(seed)
    e = [8, 12, 16, 24, 32, 64][seed]
    x = np.round(rng.normal(size=(7, e)) * 8) / 8  # a coarse grid: ties happen
    bias = np.round(rng.normal(size=e) * 4) / 64
    for kw in (dict(), dict(scoring="sigmoid", renormalize=False),
               dict(scoring="sigmoid", groups=4, topk_group=2, bias=bias, scale=2.5),
               dict(groups=2, topk_group=1, bias=bias)):
        k = 3
        ew, ei = _brute(x, k, **kw)
        w, ids, counts = ref.moe_route(x, k, kw.get("scoring", "softmax"), kw.get("renormalize", True),
                                       kw.get("groups"), kw.get("topk_group"), kw.get("bias"), kw.get("scale", 1.0))
        assert np.array_equal(ids, ei), (kw, ids, ei)
        np.testing.assert_allclose(w, ew, rtol=1e-12)
        assert counts.tolist() == np.bincount(ei.reshape(-1), minlength=e).tolist()


def test_numpy_in_numpy_out_and_cpu_tensors():
    x = np.array([[0.0, math.log(3.0), 0.0, math.log(2.0)]], np.float32)
    w, ids = fray.moe_route(x, 2)
    assert isinstance(w, np.ndarray) and w.dtype == np.float32 and ids.dtype == np.int32
    assert ids.tolist() == [[1, 3]]
    np.testing.assert_allclose(w, [[0.6, 0.4]], rtol=1e-6)
    w, ids, counts = fray.moe_route(torch.from_numpy(x).bfloat16(), 2, return_counts=True)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and counts.dtype == torch.int32
    assert counts.tolist() == [0, 1, 0, 1]
    w, ids = fray.moe_route(np.zeros((0, 8), np.float32), 2)
    assert w.shape == (0, 2) and ids.shape == (0, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("recipe", sorted(moe.RECIPES))
def test_cpu_tensor_recipes_run_the_reference(recipe, dtype):
    x, k, kw = moe._recipe_args(recipe, 6, dtype, "cpu")
    w, ids, counts = fray.moe_route(x, k, return_counts=True, **kw)
    assert w.shape == (6, k) and ids.shape == (6, k)
    _assert_route(x, k, w, ids, counts, recipe, **kw)
    assert counts.sum() == 6 * k
    assert_close(w.sum(-1), torch.full((6,), kw.get("routed_scaling_factor", 1.0)), torch.float32, "sum")


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernel under the interpreter

@INTERPRETER
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("recipe", sorted(moe.RECIPES))
def test_triton_interpreter_recipes(recipe, dtype):
    x, k, kw = moe._recipe_args(recipe, 5, dtype, "cpu")
    w, ids, counts = _triton_route(x, k, **dict(kw))
    _assert_route(x, k, w, ids, counts, "%s %s" % (recipe, dtype), **kw)


@INTERPRETER
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_triton_interpreter_4096_experts(scoring):
    x = _grid_logits(2, 4096, seed=3).float()
    if scoring == "sigmoid":  # logits in [-8, 8): beyond ~17 fp32 sigmoids round to 1 and tie
        x = x / 32
    w, ids, counts = _triton_route(x, 8, scoring=scoring)
    _assert_route(x, 8, w, ids, counts, "E=4096 " + scoring, scoring=scoring)
    bias = (torch.arange(4096) % 7).float() / 64
    kw = dict(scoring=scoring, num_expert_group=64, topk_group=5, correction_bias=bias, routed_scaling_factor=0.5)
    w, ids, counts = _triton_route(x, 6, **dict(kw))
    _assert_route(x, 6, w, ids, counts, "E=4096 grouped " + scoring, **kw)


@INTERPRETER
def test_triton_interpreter_odd_shapes_and_options():
    x = _grid_logits(3, 5, seed=1).float()
    for k in (1, 3, 5):  # top_k = E
        for renorm in (True, False):
            w, ids, c = _triton_route(x, k, renormalize=renorm, routed_scaling_factor=1.5)
            _assert_route(x, k, w, ids, c, "E=5 k=%d" % k, renormalize=renorm, routed_scaling_factor=1.5)
    # groups of 3 (a non-power-of-two group size), bias in bf16
    x = _grid_logits(4, 24, seed=2).bfloat16()
    bias = (torch.arange(24) % 5 - 2).bfloat16() / 16
    kw = dict(scoring="sigmoid", num_expert_group=8, topk_group=3, correction_bias=bias)
    w, ids, c = _triton_route(x, 4, **dict(kw))
    _assert_route(x, 4, w, ids, c, "groups of 3", **kw)
    # groups of 1: each expert its own group (its score alone)
    kw = dict(num_expert_group=8, topk_group=3)
    x = _grid_logits(2, 8, seed=5).float()
    w, ids, c = _triton_route(x, 2, **dict(kw))
    _assert_route(x, 2, w, ids, c, "groups of 1", **kw)
    # T = 1, rows strided inside a wider buffer
    big = _grid_logits(3, 40, seed=4).float()
    x = big[:, 4:36]
    w, ids, c = _triton_route(x, 4)
    _assert_route(x, 4, w, ids, c, "strided")
    w, ids, c = _triton_route(x[:1], 4)
    _assert_route(x[:1], 4, w, ids, c, "T=1")


@INTERPRETER
def test_triton_interpreter_ties_and_nan():
    x = torch.zeros(3, 16)
    w, ids, c = _triton_route(x, 4)
    assert ids.tolist() == [[0, 1, 2, 3]] * 3 and c.tolist() == [3] * 4 + [0] * 12
    assert_close(w, torch.full((3, 4), 0.25), torch.float32, "ties")
    w, ids, c = _triton_route(x, 4, scoring="sigmoid", num_expert_group=4, topk_group=2)
    assert ids.tolist() == [[0, 1, 2, 3]] * 3
    x = torch.tensor([[0.0, 1.0, 2.0, 0.0, 1.0]])
    assert _triton_route(x, 3)[1].tolist() == [[2, 1, 4]]
    # the same NaN behaviour as the reference
    x = torch.tensor([[0.0, float("nan"), 1.0, 2.0], [0.0, 3.0, 1.0, 2.0]])
    w, ids, _ = _triton_route(x, 2)
    assert ids.tolist() == [[0, 1], [1, 3]] and torch.isnan(w[0]).all() and torch.isfinite(w[1]).all()
    w, ids, _ = _triton_route(x, 3, scoring="sigmoid")
    assert ids[0].tolist() == [3, 2, 0] and torch.isfinite(w).all()
    # all -inf under softmax: NaN weights (0 / 0), experts 0..k-1; +inf: NaN (as fray.softmax)
    for x in (torch.full((1, 6), float("-inf")), torch.tensor([[0.0, 1.0, float("inf"), 2.0, 0.0, 0.0]])):
        w, ids, _ = _triton_route(x, 2)
        assert ids.tolist() == [[0, 1]] and torch.isnan(w).all()
        e_w, e_i, _ = ref.moe_route(x.double().numpy(), 2)
        assert e_i.tolist() == [[0, 1]] and np.isnan(e_w).all()
    # one expert
    w, ids, c = _triton_route(torch.tensor([[0.3], [-2.0]]), 1, scoring="sigmoid", renormalize=False)
    assert ids.tolist() == [[0], [0]] and c.tolist() == [2]
    assert_close(w, torch.sigmoid(torch.tensor([[0.3], [-2.0]]).double()), torch.float32, "E=1")


@INTERPRETER
def test_triton_interpreter_all_tokens_to_one_expert():
    x = torch.zeros(9, 32)
    x[:, 17] = 5.0
    w, ids, c = _triton_route(x, 1)
    assert ids.view(-1).tolist() == [17] * 9 and c[17] == 9 and c.sum() == 9
    assert_close(w, torch.ones(9, 1), torch.float32, "top-1 renormalised")


# ---------------------------------------------------------------------------------------------
# CPU: error contract

def test_errors_name_the_argument():
    x = torch.randn(4, 16)
    with pytest.raises(TypeError, match="router_logits: expected dtype"):
        fray.moe_route(x.to(torch.int32), 2)
    with pytest.raises(TypeError, match="router_logits: expected a float16/float32/float64 array"):
        fray.moe_route(np.zeros((2, 4), np.int64), 2)
    with pytest.raises(TypeError, match="router_logits: expected a torch.Tensor"):
        fray.moe_route([[1.0, 2.0]], 1)
    with pytest.raises(ValueError, match="router_logits: expected 2 dimensions"):
        fray.moe_route(torch.randn(2, 3, 4), 2)
    with pytest.raises(ValueError, match="router_logits: expected 1 to 4096 experts"):
        fray.moe_route(torch.randn(2, 4097), 2)
    with pytest.raises(ValueError, match="router_logits: the expert dimension must be contiguous"):
        fray.moe_route(torch.randn(16, 4).t(), 2)
    with pytest.raises(ValueError, match=r"top_k: expected a value in \[1, 16\]"):
        fray.moe_route(x, 17)
    with pytest.raises(ValueError, match="top_k: expected a value in"):
        fray.moe_route(x, 0)
    with pytest.raises(ValueError, match=r"top_k: expected a value in \[1, 64\]"):
        fray.moe_route(torch.randn(2, 128), 65)
    with pytest.raises(TypeError, match="top_k: expected an int"):
        fray.moe_route(x, 2.0)
    with pytest.raises(ValueError, match="scoring: expected 'softmax' or 'sigmoid'"):
        fray.moe_route(x, 2, scoring="relu")
    with pytest.raises(TypeError, match="renormalize: expected a bool"):
        fray.moe_route(x, 2, renormalize=1)
    with pytest.raises(TypeError, match="return_counts: expected a bool"):
        fray.moe_route(x, 2, return_counts="yes")
    with pytest.raises(ValueError, match="num_expert_group: the 16 experts do not split into 3 equal groups"):
        fray.moe_route(x, 2, num_expert_group=3, topk_group=1)
    with pytest.raises(ValueError, match=r"topk_group: expected a value in \[1, 4\]"):
        fray.moe_route(x, 2, num_expert_group=4, topk_group=5)
    with pytest.raises(ValueError, match="topk_group: required with num_expert_group"):
        fray.moe_route(x, 2, num_expert_group=4)
    with pytest.raises(ValueError, match="topk_group: given without num_expert_group"):
        fray.moe_route(x, 2, topk_group=2)
    with pytest.raises(ValueError, match="top_k: 9 experts cannot be chosen from 2 kept groups of 4"):
        fray.moe_route(x, 9, num_expert_group=4, topk_group=2)
    with pytest.raises(ValueError, match=r"correction_bias: expected shape \(16,\)"):
        fray.moe_route(x, 2, correction_bias=torch.zeros(8))
    with pytest.raises(ValueError, match=r"correction_bias: expected shape \(16,\)"):
        fray.moe_route(x, 2, correction_bias=torch.zeros(1, 16))
    with pytest.raises(TypeError, match="correction_bias: expected dtype"):
        fray.moe_route(x, 2, correction_bias=torch.zeros(16, dtype=torch.int32))
    with pytest.raises(TypeError, match="correction_bias: expected a tensor on cpu"):
        fray.moe_route(x, 2, correction_bias=torch.zeros(16, device="meta"))
    with pytest.raises(TypeError, match="correction_bias: expected a torch.Tensor like router_logits, got ndarray"):
        fray.moe_route(x, 2, correction_bias=np.zeros(16))
    with pytest.raises(TypeError, match="correction_bias: expected a numpy.ndarray"):
        fray.moe_route(x.numpy(), 2, correction_bias=torch.zeros(16))
    with pytest.raises(ValueError, match="routed_scaling_factor: expected a finite value"):
        fray.moe_route(x, 2, routed_scaling_factor=float("inf"))
    with pytest.raises(TypeError, match="routed_scaling_factor: expected a float"):
        fray.moe_route(x, 2, routed_scaling_factor="2.5")
    with pytest.raises(ValueError, match="backend: expected one of"):
        fray.moe_route(x, 2, backend="cutlass")
    with pytest.raises(ValueError, match="backend: 'triton' needs CUDA tensors"):
        fray.moe_route(x, 2, backend="triton")


def test_custom_op_is_registered():
    assert hasattr(torch.ops.fray, "moe_route")


def test_the_near_tie_comparison_can_fail():
    # experts 1 and 2 differ by 1e-8 in float64: either order passes; a real difference does not
    x = torch.tensor([[0.0, 2.0, 2.0 - 1e-8, -1.0], [0.0, 1.0, 3.0, 2.0]], dtype=torch.float64)
    w, ids = fray.moe_route(x.numpy(), 2)
    ids = torch.from_numpy(ids)
    moe._assert_route_matches(x, 2, torch.from_numpy(w), ids)
    swapped = ids.clone()
    swapped[0] = torch.tensor([2, 1])
    moe._assert_route_matches(x, 2, torch.from_numpy(w)[:, [1, 0]] * torch.tensor([[1.0], [0.0]]) +
                              torch.from_numpy(w) * torch.tensor([[0.0], [1.0]]), swapped)
    wrong = ids.clone()
    wrong[1] = torch.tensor([3, 2])
    with pytest.raises(AssertionError, match="row 1 ids"):
        moe._assert_route_matches(x, 2, torch.from_numpy(w), wrong)
    with pytest.raises(AssertionError, match="weights"):
        moe._assert_route_matches(x, 2, torch.from_numpy(w) * 1.01, ids)
    with pytest.raises(AssertionError, match="counts differ"):
        moe._assert_route_matches(x, 2, torch.from_numpy(w), ids, torch.zeros(4, dtype=torch.int32))


# ---------------------------------------------------------------------------------------------
# GPU

RECIPE_TOKENS = [1, 7, 128, 333, 4096]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", RECIPE_TOKENS)
@pytest.mark.parametrize("recipe", sorted(moe.RECIPES))
def test_gpu_recipes_vs_reference(cuda, recipe, t, dtype):
    x, k, kw = moe._recipe_args(recipe, t, dtype, cuda)
    w, ids, counts = fray.moe_route(x, k, return_counts=True, **kw)
    moe._assert_route_matches(x, k, w, ids, counts, "%s T=%d %s" % (recipe, t, dtype), **kw)
    # random normal logits (near-ties included)
    g = torch.Generator(device=cuda).manual_seed(t)
    xr = torch.randn(x.shape, device=cuda, generator=g).to(dtype)
    wr, idsr, countsr = fray.moe_route(xr, k, return_counts=True, **kw)
    moe._assert_route_matches(xr, k, wr, idsr, countsr, "%s T=%d %s randn" % (recipe, t, dtype), **kw)
    # counts are this call's alone: x again (from the cached plan, after the randn call) counts as
    # the first call did, not as the sum of the calls
    _, ids2, counts2 = fray.moe_route(x, k, return_counts=True, **kw)
    assert torch.equal(ids2, ids) and torch.equal(counts2, counts), "%s T=%d %s: second call" % (recipe, t, dtype)
    assert int(counts2.sum()) == t * k


@pytest.mark.gpu
@pytest.mark.parametrize("e", [3, 64, 160, 257, 1000, 4096])
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_gpu_expert_counts(cuda, e, scoring):
    x = moe._random_logits(65, e, torch.float32, cuda, seed=e, span=8.0 if scoring == "sigmoid" else None)
    k = min(8, e)
    w, ids = fray.moe_route(x, k, scoring=scoring)
    moe._assert_route_matches(x, k, w, ids, None, "E=%d" % e, scoring=scoring)
    if e % 8 == 0:
        kw = dict(scoring=scoring, num_expert_group=8, topk_group=3)
        w, ids = fray.moe_route(x, k, **kw)
        moe._assert_route_matches(x, k, w, ids, None, "E=%d grouped" % e, **kw)


@pytest.mark.gpu
def test_gpu_ties_and_nan_match_the_reference(cuda):
    x = torch.zeros(5, 256)
    x[1, 3] = float("nan")
    x[2] = float("-inf")
    x[3, ::2] = 1.0
    for kw in (dict(), dict(scoring="sigmoid", num_expert_group=8, topk_group=4, routed_scaling_factor=2.5)):
        w, ids = fray.moe_route(x.to(cuda), 8, **kw)
        e_w, e_i, _ = ref.moe_route(x.double().numpy(), 8, kw.get("scoring", "softmax"), True,
                                    kw.get("num_expert_group"), kw.get("topk_group"), None,
                                    kw.get("routed_scaling_factor", 1.0))
        assert np.array_equal(ids.cpu().numpy(), e_i)
        assert torch.equal(torch.isnan(w.cpu()), torch.from_numpy(np.isnan(e_w)))


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph(cuda):
    x, k, kw = moe._recipe_args("deepseek_v3", 64, torch.bfloat16, cuda)

    def f(logits, bias):
        w, ids, counts = fray.moe_route(logits, k, scoring="sigmoid", correction_bias=bias, num_expert_group=8,
                                        topk_group=4, routed_scaling_factor=2.5, return_counts=True)
        return w * 2, ids, counts

    compiled = torch.compile(f, fullgraph=True)
    w, ids, counts = compiled(x, kw["correction_bias"])
    ew, ei, ec = fray.moe_route(x, k, return_counts=True, **kw)
    assert torch.equal(ids, ei) and torch.equal(counts, ec) and torch.equal(w, ew * 2)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_follows_new_routing(cuda):
    x, k, kw = moe._recipe_args("qwen3", 96, torch.bfloat16, cuda)
    static = x.clone()
    fray.moe_route(static, k, return_counts=True)  # warm-up: plan and compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w, ids, counts = fray.moe_route(static, k, return_counts=True)
    for seed in range(3):
        new = moe._random_logits(96, 128, torch.bfloat16, cuda, seed=seed + 10)
        static.copy_(new)
        graph.replay()
        ew, ei, ec = fray.moe_route(new, k, return_counts=True)
        assert torch.equal(ids, ei) and torch.equal(w, ew) and torch.equal(counts, ec), seed


@pytest.mark.gpu
def test_gpu_bitwise_deterministic(cuda):
    g = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(4096, 256, device=cuda, generator=g).bfloat16()  # random: near-ties included
    bias = torch.randn(256, device=cuda, generator=g) * 0.01
    kw = dict(scoring="sigmoid", correction_bias=bias, num_expert_group=8, topk_group=4, routed_scaling_factor=2.5,
              return_counts=True)
    first = fray.moe_route(x, 8, **kw)
    for _ in range(3):
        again = fray.moe_route(x, 8, **kw)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.gpu
def test_gpu_errors(cuda):
    x = torch.randn(4, 16, device=cuda)
    with pytest.raises(RuntimeError, match="backend='cuda' cannot run moe_route"):
        fray.moe_route(x, 2, backend="cuda")
    with pytest.raises(ValueError, match="backend: 'reference' runs on CPU tensors"):
        fray.moe_route(x, 2, backend="reference")
    with pytest.raises(TypeError, match="correction_bias: expected a tensor on cuda"):
        fray.moe_route(x, 2, correction_bias=torch.zeros(16))


# ---------------------------------------------------------------------------------------------
# CPU: the benchmark's torch composite computes the same routing (bench/moe's peers)

@pytest.mark.parametrize("recipe", sorted(moe.RECIPES))
def test_bench_composite_matches_the_reference(recipe):
    from fray.bench import moe as bm
    x, k, kw = moe._recipe_args(recipe, 9, torch.float32, "cpu")
    w, ids = bm.eager_route(x, k, **kw)
    _assert_route(x, k, w, ids, None, "torch composite " + recipe, **kw)
    assert bm.parse_shapes("moe_route", "mixtral:T1,deepseek_v3:T4096") == [("mixtral", 1), ("deepseek_v3", 4096)]
    with pytest.raises(ValueError, match="shapes: expected"):
        bm.parse_shapes("moe_route", "128x8")


# ---------------------------------------------------------------------------------------------
# CPU: the custom op and its launch plan, run through the interpreter as if on a GPU

@INTERPRETER
def test_custom_op_and_plan_under_the_interpreter(monkeypatch):
    import contextlib

    from fray import _plan as P
    from fray import backend as B
    monkeypatch.setattr(B, "resolve", lambda *a: "triton")
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    P.PLANS.clear()
    try:
        x, k, kw = moe._recipe_args("deepseek_v3", 4, torch.bfloat16, "cpu")
        bias = kw["correction_bias"]
        for _ in range(2):  # the second call launches from the cached plan
            w, ids, counts = moe._route_outputs(x, k)
            torch.ops.fray.moe_route(x, bias, w, ids, counts, k, "sigmoid", True, 8, 4, 2.5, "auto")
            _assert_route(x, k, w, ids, counts, "custom op", **kw)
        assert len(P.PLANS) == 1
        w, ids, _ = moe._route_outputs(x, 2, False)
        torch.ops.fray.moe_route(x, None, w, ids, None, 2, "softmax", False, 0, 0, 1.0, "auto")
        _assert_route(x, 2, w, ids, None, "custom op, no counts", renormalize=False)
        w, ids, counts = moe._route_outputs(x, k)
        torch.library.opcheck(torch.ops.fray.moe_route.default,
                              (x, bias, w, ids, counts, k, "sigmoid", True, 8, 4, 2.5, "auto"),
                              test_utils=("test_schema", "test_faketensor"))
    finally:
        P.PLANS.clear()


def test_route_kernel_compiles_for_sm90a():
    """The routing kernel through Triton's compiled path for sm_90a (what the interpreter does not
    check), at each recipe's tile shape as fray_triton.moe.route picks it."""
    from fray.testing import compile_triton_sm90, sm90_spec
    from fray_triton._host import next_power_of_2
    specs = []
    for e, k, groups, topk_group, sigmoid in ((8, 2, 0, 0, False), (128, 8, 0, 0, False), (256, 8, 8, 4, True),
                                              (4096, 8, 0, 0, False)):
        n_groups = groups or 1
        size = e // n_groups
        bg, bs = next_power_of_2(n_groups), next_power_of_2(size)
        specs.append(sm90_spec(
            "fray_triton.moe", "_route_kernel",
            {"X": "*bf16", "BIAS": "*fp32", "W": "*fp32", "IDS": "*i32", "COUNTS": "*i32", "scale": "fp32"},
            dict(TOP_K=k, SIGMOID=sigmoid, HAS_BIAS=sigmoid, RENORM=True, N_GROUPS=n_groups,
                 TOPK_GROUP=topk_group or 1, GROUPED=groups > 0, TOP2=size > 1, COUNT=True,
                 BLOCK_G=bg, BLOCK_S=bs, BLOCK_K=next_power_of_2(k)),
            num_warps=1 if bg * bs <= 256 else (4 if bg * bs <= 2048 else 8)))
    assert len(compile_triton_sm90(specs)) == 4
