# Types of Fray's public API (the functions of python/fray/ops/* re-exported by fray/__init__.py).
# A stub rather than annotations in the ops modules, which change often; tests/packaging checks
# that every signature here matches the runtime one (names, kinds, defaults), so it cannot drift.
# Arrays: torch tensors run on their device; CPU tensors and numpy arrays run the reference and
# come back as what went in.
from types import ModuleType
from typing import Any, Callable, Literal, Optional, Sequence, Tuple, TypeVar, Union, overload

import numpy as np
import numpy.typing as npt
import torch

from fray import jit as jit
from fray import tune as tune
from fray.ops.moe import MoeDispatch as _MoeDispatch

__version__: str

OPS: dict[str, str]
FAMILIES: dict[str, ModuleType]
CUDA_FAMILY: dict[str, str]

_A = TypeVar("_A", torch.Tensor, npt.NDArray[Any])
Backend = Literal["auto", "cuda", "triton", "reference"]
KVLayout = Literal["HND", "NHD"]
_Scalar = Union[float, torch.Tensor]
_Seeds = Union[int, torch.Tensor]

# norm
def rmsnorm(x: _A, weight: _A, eps: float = 1e-06, *, out: Optional[_A] = None, backend: Backend = "auto",
            weight_offset: float = 0.0) -> _A: ...
def add_rmsnorm(x: _A, residual: _A, weight: _A, eps: float = 1e-06, *, inplace: bool = False,
                backend: Backend = "auto", weight_offset: float = 0.0) -> Tuple[_A, _A]: ...
def layernorm(x: _A, weight: _A, bias: Optional[_A] = None, eps: float = 1e-05, *, out: Optional[_A] = None,
              backend: Backend = "auto") -> _A: ...

# activation: x = [gate | up] when up is None
def silu_mul(x: _A, up: Optional[_A] = None, *, out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...
def gelu_mul(x: _A, up: Optional[_A] = None, *, approximate: Literal["none", "tanh"] = "none",
             out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...
# activation: unary (elementwise over dense tensors; out may be x)
def silu(x: _A, *, out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...
def gelu(x: _A, *, approximate: Literal["none", "tanh"] = "none", out: Optional[_A] = None,
         backend: Backend = "auto") -> _A: ...
def relu(x: _A, *, out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...
def tanh(x: _A, *, out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...
def sigmoid(x: _A, *, out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...

# softmax
def softmax(x: _A, *, temperature: float = 1.0, dim: int = -1, out_dtype: Optional[torch.dtype] = None,
            out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...
def online_softmax(x: _A, *, out: Optional[_A] = None, backend: Backend = "auto") -> Tuple[_A, _A, _A]: ...

# rope
def rope(q: _A, k: Optional[_A], positions: Union[int, _A], *, max_position: int,
         cos_sin_cache: Union[None, _A, Tuple[_A, _A]] = None, theta: float = 10000.0,
         rotary_dim: Optional[int] = None, style: Literal["neox", "gptj"] = "neox", inplace: bool = False,
         backend: Backend = "auto") -> Tuple[_A, Optional[_A]]: ...

# elementwise
def vector_add(a: _A, b: _A, *, out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...
def mul(a: _A, b: _A, *, out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...
def axpy(x: _A, a: float = 1.0, b: float = 0.0, *, out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...

# selection and sampling
TopkAlgorithm = Literal["auto", "reduce", "partial", "sort", "torch"]
def topk(x: _A, k: int, *, algorithm: TopkAlgorithm = "auto", largest: bool = True, sorted: bool = True,
         workspace: Optional[torch.Tensor] = None, backend: Backend = "auto") -> Tuple[_A, _A]: ...
def topk_workspace_size(x: Union[torch.Tensor, npt.NDArray[Any]], k: int, algorithm: TopkAlgorithm = "auto", *,
                        sorted: bool = True, backend: Backend = "auto") -> int: ...
def argmax(x: _A, *, backend: Backend = "auto") -> _A: ...
def apply_penalties(logits: _A, token_ids: _A, token_offsets: _A, *, repetition: _Scalar = 1.0,
                    presence: _Scalar = 0.0, frequency: _Scalar = 0.0, backend: Backend = "auto") -> _A: ...
@overload
def sample(logits: _A, *, temperature: _Scalar, top_k: Union[None, int, torch.Tensor] = None,
           top_p: Optional[_Scalar] = None, min_p: Optional[_Scalar] = None, seeds: _Seeds, offsets: _Seeds,
           return_logprobs: Literal[False] = False, backend: Backend = "auto") -> _A: ...
@overload
def sample(logits: _A, *, temperature: _Scalar, top_k: Union[None, int, torch.Tensor] = None,
           top_p: Optional[_Scalar] = None, min_p: Optional[_Scalar] = None, seeds: _Seeds, offsets: _Seeds,
           return_logprobs: Literal[True], backend: Backend = "auto") -> Tuple[_A, _A]: ...
@overload
def decode_step(logits: _A, token_ids: _A, token_offsets: _A, *, repetition: _Scalar = 1.0,
                presence: _Scalar = 0.0, frequency: _Scalar = 0.0, temperature: _Scalar,
                top_k: Union[None, int, torch.Tensor] = None, top_p: Optional[_Scalar] = None,
                min_p: Optional[_Scalar] = None, seeds: _Seeds, offsets: _Seeds,
                return_logprobs: Literal[False] = False, backend: Backend = "auto") -> _A: ...
@overload
def decode_step(logits: _A, token_ids: _A, token_offsets: _A, *, repetition: _Scalar = 1.0,
                presence: _Scalar = 0.0, frequency: _Scalar = 0.0, temperature: _Scalar,
                top_k: Union[None, int, torch.Tensor] = None, top_p: Optional[_Scalar] = None,
                min_p: Optional[_Scalar] = None, seeds: _Seeds, offsets: _Seeds,
                return_logprobs: Literal[True], backend: Backend = "auto") -> Tuple[_A, _A]: ...

# decode attention
@overload
def decode_attention(q: _A, k_cache: _A, v_cache: _A, lens: _A, *, kv_layout: KVLayout = "HND",
                     scale: Optional[float] = None, out: Optional[_A] = None, return_lse: Literal[False] = False,
                     num_splits: Optional[int] = None, backend: Backend = "auto", window_left: None = None,
                     logits_soft_cap: None = None, sinks: None = None) -> _A: ...
@overload
def decode_attention(q: _A, k_cache: _A, v_cache: _A, lens: _A, *, kv_layout: KVLayout = "HND",
                     scale: Optional[float] = None, out: Optional[_A] = None, return_lse: Literal[True],
                     num_splits: Optional[int] = None, backend: Backend = "auto", window_left: None = None,
                     logits_soft_cap: None = None, sinks: None = None) -> Tuple[_A, _A]: ...
@overload
def paged_decode_attention(q: _A, k_pages: _A, v_pages: _A, block_table: _A, lens: _A, *,
                           scale: Optional[float] = None, out: Optional[_A] = None,
                           return_lse: Literal[False] = False, num_splits: Optional[int] = None,
                           backend: Backend = "auto", window_left: None = None, logits_soft_cap: None = None,
                           sinks: None = None) -> _A: ...
@overload
def paged_decode_attention(q: _A, k_pages: _A, v_pages: _A, block_table: _A, lens: _A, *,
                           scale: Optional[float] = None, out: Optional[_A] = None, return_lse: Literal[True],
                           num_splits: Optional[int] = None, backend: Backend = "auto", window_left: None = None,
                           logits_soft_cap: None = None, sinks: None = None) -> Tuple[_A, _A]: ...
def kv_append(k_cache: _A, v_cache: _A, k_new: _A, v_new: _A, lens: _A, *, kv_layout: KVLayout = "HND",
              backend: Backend = "auto") -> Tuple[_A, _A]: ...
def kv_append_paged(k_pages: _A, v_pages: _A, block_table: _A, k_new: _A, v_new: _A, lens: _A, *,
                    backend: Backend = "auto") -> Tuple[_A, _A]: ...

# prefill attention: varlen q [total_q, Hq, D], k/v [total_k, Hkv, D] with cu_seqlens [B + 1] (lse
# [Hq, total_q]; with block_table [B, max_blocks], k/v are pages [num_blocks, block_size, Hkv, D]),
# or batched q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D] (lse [B, Hq, Sq])
@overload
def prefill_attention(q: _A, k: _A, v: _A, *, causal: bool = True, cu_seqlens_q: Optional[_A] = None,
                      cu_seqlens_k: Optional[_A] = None, max_seqlen_q: Optional[int] = None,
                      max_seqlen_k: Optional[int] = None, scale: Optional[float] = None,
                      return_lse: Literal[False] = False, out: Optional[_A] = None,
                      backend: Backend = "auto", block_table: Optional[_A] = None, window_left: None = None,
                      logits_soft_cap: None = None, sinks: None = None) -> _A: ...
@overload
def prefill_attention(q: _A, k: _A, v: _A, *, causal: bool = True, cu_seqlens_q: Optional[_A] = None,
                      cu_seqlens_k: Optional[_A] = None, max_seqlen_q: Optional[int] = None,
                      max_seqlen_k: Optional[int] = None, scale: Optional[float] = None,
                      return_lse: Literal[True], out: Optional[_A] = None,
                      backend: Backend = "auto", block_table: Optional[_A] = None, window_left: None = None,
                      logits_soft_cap: None = None, sinks: None = None) -> Tuple[_A, _A]: ...

# MLA decode (DeepSeek's latent attention): q [B, s_q, Hq, 576], kv_cache [num_blocks, block_size, 1, 576]
# paged through block_table [B, max_blocks]; out [B, s_q, Hq, 512], lse [B, s_q, Hq]
@overload
def mla_decode(q: _A, kv_cache: _A, block_table: _A, lens: _A, *, head_dim_v: int = 512,
               scale: Optional[float] = None, out: Optional[_A] = None, return_lse: Literal[False] = False,
               num_splits: Optional[int] = None, backend: Backend = "auto") -> _A: ...
@overload
def mla_decode(q: _A, kv_cache: _A, block_table: _A, lens: _A, *, head_dim_v: int = 512,
               scale: Optional[float] = None, out: Optional[_A] = None, return_lse: Literal[True],
               num_splits: Optional[int] = None, backend: Backend = "auto") -> Tuple[_A, _A]: ...

# gemm: C = a @ b.T (b_layout "nk": b is [N, K]) or a @ b ("kn": b is [K, N]), + bias[N]
def gemm(a: _A, b: _A, *, b_layout: Literal["nk", "kn"] = "nk", bias: Optional[_A] = None,
         out: Optional[_A] = None, out_dtype: Optional[torch.dtype] = None, backend: Backend = "auto") -> _A: ...

# moe: routing (weights fp32, ids int32 [T, k]; counts int32 [E]) and dispatch metadata (all int32)
MoeScoring = Literal["softmax", "sigmoid"]
@overload
def moe_route(router_logits: _A, top_k: int, *, scoring: MoeScoring = "softmax", renormalize: bool = True,
              num_expert_group: Optional[int] = None, topk_group: Optional[int] = None,
              correction_bias: Optional[_A] = None, routed_scaling_factor: float = 1.0,
              return_counts: Literal[False] = False, backend: Backend = "auto") -> Tuple[_A, _A]: ...
@overload
def moe_route(router_logits: _A, top_k: int, *, scoring: MoeScoring = "softmax", renormalize: bool = True,
              num_expert_group: Optional[int] = None, topk_group: Optional[int] = None,
              correction_bias: Optional[_A] = None, routed_scaling_factor: float = 1.0,
              return_counts: Literal[True], backend: Backend = "auto") -> Tuple[_A, _A, _A]: ...
def moe_dispatch(topk_ids: _A, num_experts: int, block_m: int, *, expert_map: Optional[_A] = None,
                 route_positions: Optional[_A] = None, backend: Backend = "auto") -> _MoeDispatch: ...
# grouped GEMM: rows of group g times b[g] (explicit offsets [G + 1]), or per route from a dispatch
# ([T * k, N] in route order); MoE layers on it: out [T, N] / [T, H]
MoeLayout = Literal["nk", "kn"]
MoeCombine = Literal["auto", "atomic", "staged", "scatter"]
def grouped_gemm(a: _A, b: _A, group_offsets: Optional[_A] = None, *, dispatch: Optional[_MoeDispatch] = None,
                 top_k: Optional[int] = None, b_layout: MoeLayout = "nk", out: Optional[_A] = None,
                 backend: Backend = "auto") -> _A: ...
def routed_grouped_gemm(x: _A, expert_weights: _A, logits: _A, top_k: int, *, combine: MoeCombine = "auto",
                        b_layout: MoeLayout = "nk", renormalize: bool = True, out: Optional[_A] = None,
                        backend: Backend = "auto") -> _A: ...
def fused_moe(x: _A, w13: _A, w2: _A, *, router_logits: Optional[_A] = None, topk_weights: Optional[_A] = None,
              topk_ids: Optional[_A] = None, top_k: Optional[int] = None,
              activation: Literal["silu", "gelu", "gelu_tanh"] = "silu", renormalize: bool = True,
              scoring: MoeScoring = "softmax", num_expert_group: Optional[int] = None,
              topk_group: Optional[int] = None, correction_bias: Optional[_A] = None,
              routed_scaling_factor: float = 1.0, expert_map: Optional[_A] = None,
              apply_router_weight_on_input: bool = False, w_layout: MoeLayout = "nk", combine: MoeCombine = "auto",
              out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...

# quant: (q [M, K] int8 / float8_e4m3fn, fp32 scale of the group shape) and back
QuantGranularity = Literal["tensor", "token", "channel", "block"]
def quantize(x: _A, dtype: torch.dtype = torch.int8, *, granularity: QuantGranularity = "tensor",
             block: Tuple[int, int] = (1, 128), scale: Optional[_A] = None, out: Optional[_A] = None,
             scale_layout: Literal["row", "mn_major"] = "row", backend: Backend = "auto") -> Tuple[_A, _A]: ...
def dequantize(q: _A, scale: _A, *, granularity: QuantGranularity, block: Optional[Tuple[int, int]] = None,
               dtype: torch.dtype = torch.bfloat16, out: Optional[_A] = None, backend: Backend = "auto") -> _A: ...
# (q, per-token scale): the norm / the gated activation rounded to x's dtype, quantized per row
def rmsnorm_quant(x: _A, weight: _A, eps: float = 1e-6, *, dtype: torch.dtype = torch.int8,
                  residual: Optional[_A] = None, scale: Optional[_A] = None, weight_offset: float = 0.0,
                  out: Optional[_A] = None, backend: Backend = "auto") -> Tuple[_A, _A]: ...
def silu_mul_quant(x: _A, up: Optional[_A] = None, *, dtype: torch.dtype = torch.int8, scale: Optional[_A] = None,
                   out: Optional[_A] = None, backend: Backend = "auto") -> Tuple[_A, _A]: ...
# out [M, N] = (a * a_scale) @ (b * b_scale)^T (+ bias): a [M, K], b [N, K] int8 / float8_e4m3fn
def scaled_gemm(a: _A, b: _A, a_scale: _A, b_scale: _A, *, out_dtype: torch.dtype = torch.bfloat16,
                bias: Optional[_A] = None, out: Optional[_A] = None, fast_accum: bool = False,
                backend: Backend = "auto") -> _A: ...
# out [M, N] = x @ (w * w_scale)^T (+ bias): x [M, K] bf16 / fp16, w [N, K] int8 / float8_e4m3fn (W8A16)
def w8a16_gemm(x: _A, w: _A, w_scale: _A, *, bias: Optional[_A] = None, out: Optional[_A] = None,
               backend: Backend = "auto") -> _A: ...

# the seed's kernel timer: seconds per call (one float, or one per name)
@overload
def bench_kineto(fn: Callable[[], Any], kernel_names: str, num_tests: int = 30, flush_l2: bool = True,
                 trace_path: Optional[str] = None) -> float: ...
@overload
def bench_kineto(fn: Callable[[], Any], kernel_names: Sequence[str], num_tests: int = 30, flush_l2: bool = True,
                 trace_path: Optional[str] = None) -> Tuple[float, ...]: ...

__all__: list[str]
