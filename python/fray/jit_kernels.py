"""Seed-compatible names of the CUDA kernels (the seed compiled them at run time; Fray builds them
ahead of time with Bazel, and the GEMMs at run time through fray.jit). Same code as the public API."""
import torch

from fray.ops import attention as _attention
from fray.ops import gemm as _gemm
from fray.ops import norm as _norm
from fray.ops import rope as _rope
from fray.ops import softmax as _softmax


def fused_rmsnorm(input, residual, weight, epsilon=1e-5):
    """residual <- input + residual (in place); returns rmsnorm(residual) with eps=epsilon."""
    return _norm.add_rmsnorm_residual_inplace(input, residual, weight, epsilon, backend="auto")


def fused_rope(q, k, cos, sin, offsets):
    """In-place NeoX rope (the seed's contract): cos/sin fp32 [max_position, rotary_dim/2] used as
    given (no concatenation), offsets an int tensor [tokens] of positions. Returns (q, k)."""
    return _rope.rope(q, k, offsets, max_position=cos.shape[0], cos_sin_cache=(cos, sin), inplace=True)


def softmax(x):
    """Row softmax over the last dim (backend auto)."""
    return _softmax.softmax(x)


def online_softmax(x):
    """(softmax(x), row max, row log-sum-exp) over the last dim (backend auto)."""
    return _softmax.online_softmax(x)


def flash_decoding(Q, K, V, Output):
    """The seed's flash decoding: Q [B, H, 1, D], K/V [B, H, T, D] (HND, all T positions valid),
    Output [B, H, 1, D]."""
    lens = torch.full((K.shape[0],), K.shape[2], dtype=torch.int32, device=K.device)
    return _attention.decode_attention(Q, K, V, lens, out=Output)


def flash_attn_cute(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None,
                    softcap=0.0, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                    page_table=None):
    """FlashAttention's CuTe interface (flash_attn.cute's flash_attn_func, and flash_attn_varlen_func
    through cu_seqlens / page_table) on fray.prefill_attention: q [B, S_q, Hq, D], k, v [B, S_k,
    Hkv, D]; or varlen q [total_q, Hq, D], k, v [total_k, Hkv, D] with int32 cu_seqlens_q /
    cu_seqlens_k [B + 1] (max_seqlen_q / max_seqlen_k as Python ints on CUDA tensors, where Fray
    reads nothing on the host), k and v page pools [num_blocks, block_size, Hkv, D] with
    page_table int32 [B, max_blocks]. causal: bottom-right aligned, as FlashAttention's. Returns
    (out, lse): lse fp32 [B, Hq, S_q] or [Hq, total_q], FlashAttention's layouts. A sliding window
    (window_size other than (None, None) / (-1, -1)), learnable_sink and softcap != 0 are refused
    with ValueError, not approximated."""
    if not (isinstance(window_size, (tuple, list)) and tuple(window_size) in ((None, None), (-1, -1))):
        raise ValueError("window_size: sliding-window attention is not supported; got %r (expected (None, None) "
                         "or (-1, -1))" % (window_size,))
    if softcap:
        raise ValueError("softcap: logit soft-capping is not supported; got %r (expected 0.0)" % (softcap,))
    if learnable_sink is not None:
        raise ValueError("learnable_sink: attention sinks are not supported; expected None")
    return _attention.prefill_attention(q, k, v, causal=causal, cu_seqlens_q=cu_seqlens_q,
                                        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                        max_seqlen_k=max_seqlen_k, scale=softmax_scale, return_lse=True,
                                        block_table=page_table)


def flash_mla(q, k_cache, block_table, cache_seqlens, head_dim_v=512, tile_scheduler_metadata=None, num_splits=None,
              softmax_scale=None, causal=False):
    """FlashMLA's flash_mla_with_kvcache, argument for argument, on fray.mla_decode: q [B, s_q, Hq,
    576], k_cache [num_blocks, 64, 1, 576] paged, block_table int32 [B, max_blocks], cache_seqlens
    int32 [B], head_dim_v 512, softmax_scale (None: 1/sqrt(576)). Returns (out [B, s_q, Hq, 512],
    softmax_lse [B, Hq, s_q]): FlashMLA's lse layout, a transposed view of fray's [B, s_q, Hq].
    tile_scheduler_metadata and num_splits (get_mla_metadata's GPU-side schedule) are accepted in
    their positions for drop-in calls and not used: Fray plans its splits itself. causal: only
    the causal form is implemented; causal=False (FlashMLA's default) is the same for s_q = 1
    and refused for s_q > 1."""
    del tile_scheduler_metadata, num_splits
    if not isinstance(causal, bool):
        raise TypeError("causal: expected a bool, got %s" % type(causal).__name__)
    if not causal and len(q.shape) == 4 and q.shape[1] > 1:
        raise ValueError("causal: fray.mla_decode is causal among the s_q query tokens; causal=False with s_q = %d "
                         "is not implemented (pass causal=True)" % q.shape[1])
    out, lse = _attention.mla_decode(q, k_cache, block_table, cache_seqlens, head_dim_v=head_dim_v,
                                     scale=softmax_scale, return_lse=True)
    return out, lse.swapaxes(1, 2)


def _seed_gemm(a, b, c, dtype, name):
    for arg, t in (("a", a), ("b", b), ("c", c)):
        if isinstance(t, torch.Tensor) and t.dtype != dtype:
            raise TypeError("%s: %s expects %s tensors, got %s" % (arg, name, str(dtype).replace("torch.", ""),
                                                                 str(t.dtype).replace("torch.", "")))
    return _gemm.gemm(a, b, out=c)


def fp16_gemm(a, b, c):
    """c = a @ b.T for fp16 a [M, K], b [N, K] (nn.Linear's weight), c [M, N]; returns c."""
    return _seed_gemm(a, b, c, torch.float16, "fp16_gemm")


def bf16_gemm(a, b, c):
    """c = a @ b.T for bf16 a [M, K], b [N, K], c [M, N]; returns c."""
    return _seed_gemm(a, b, c, torch.bfloat16, "bf16_gemm")
