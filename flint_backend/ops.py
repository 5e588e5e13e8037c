"""The op table the fast model calls through: "torch" (plain PyTorch, any device) or "triton"
(our kernels; on the CPU they run in Triton's interpreter). Choosing one is a config value.

Each kernel file in `flint_kernels/` holds the Triton launcher and a `*_torch` twin with the same
signature; the torch table is made of those twins, so both tables compute the same function.
Weights of linears, experts and the LM head are dense tensors or NVFP4Weight (W4A16,
weights/nvfp4.py): `linear`, `moe`, `logits` and `norm_logits` take either. The router weight is
bf16 or fp32 (its logits are fp32 either way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from flint_backend.weights.nvfp4 import NVFP4Weight
from flint_backend.weights.nvfp4 import concat_rows as nvfp4_concat_rows
from flint_kernels import attention as attention_k
from flint_kernels import dense_gemv as dense_gemv_k
from flint_kernels import embedding as embedding_k
from flint_kernels import greedy as greedy_k
from flint_kernels import kv_write as kv_write_k
from flint_kernels import moe as moe_k
from flint_kernels import moe_gemv as moe_gemv_k
from flint_kernels import nvfp4_linear as nvfp4_k
from flint_kernels import qk_norm_rope as qk_k
from flint_kernels import rms_norm as rms_k
from flint_kernels import router as router_k
from flint_kernels import sampling as sampling_k
from flint_kernels import swiglu as swiglu_k
from flint_kernels import tuning

BACKENDS = ("torch", "triton")
# At decode sizes the triton table folds neighbouring launches (each measured faster on the H200,
# batch-1 decode at 100K; docs/performance.md): the residual add + RMSNorm into the GEMV or router
# after it (2026-12-03: NVFP4 2.642 -> 2.549 ms a token, BF16 3.085 -> 2.974); the MoE top-k into
# the expert launches (router.rms_norm_router_logits, moe.fused_moe_routed: 2026-12-03, NVFP4 2.563
# -> 2.473, BF16 3.005 -> 2.922); the NVFP4 dense MLP's SwiGLU into its down GEMV
# (swiglu.silu_mul_at: 2026-12-05, 10.56 -> 9.73 us a layer of the critical path; the BF16 down
# folded the same way was slower, 17.3 -> 23.2 us: each of its programs took the SwiGLU of all
# 10240 columns); the final RMSNorm into the LM head (tuning.HEAD_FOLD_NORM). This fused regular
# path is the low-latency path.


@dataclass(frozen=True)
class Ops:
    name: str
    embedding: Callable       # (weight [V, H], ids [N]) -> [N, H]
    # a decode step's: an id where prev_rows >= 0 is the previous step's token in its argmax slot
    decode_embedding: Callable  # (weight, ids [N], prev_rows [N], prev_slots [M], clear_slots [N]) -> [N, H]
    linear: Callable          # (x [T, K], w [N, K] dense or NVFP4) -> [T, N]
    # dense head: linear(h, lm_head) (rounded to h's dtype) as fp32; NVFP4 head: fp32 sums, unrounded
    logits: Callable          # (h [S, H], lm_head [V, H] dense or NVFP4) -> fp32 [S, V]
    # the final RMSNorm + LM head; greedy [S] int64 slots (EMPTY) get the packed argmax (greedy.py)
    norm_logits: Callable     # (x, residual, norm_w, eps, lm_head, greedy | None) -> fp32 [S, V]
    concat_rows: Callable     # ([w_a, w_b, ...], dim=0) -> one weight, rows stacked (done at load)
    rms_norm: Callable        # (x, w, eps, residual=None) -> y; residual += x first when given
    # the residual add + RMSNorm + the op after it; residual is consumed (use the one returned)
    norm_linear: Callable     # (x, residual | None, norm_w, eps, w) -> (linear(rms_norm(..)), residual + x)
    norm_router: Callable     # (x, residual | None, norm_w, eps, w, top_k, renorm)
    #                              -> (h = rms_norm(..), ids, weights, residual + x)
    qk_norm_rope: Callable    # (qkv, q_w, k_w, positions, cos_sin, eps, Hq, Hk, k_cache, v_cache, slot_mapping)
    attention: Callable       # (q, k, v, qsl, context_lens, k_cache, v_cache, sinks, scale, window, ...)
    # decode steps (one token a sequence): qk_norm_rope (writing the cache) + attention + o_proj in one op
    decode_attention_o: Callable  # (qkv, q_w, k_w, positions, cos_sin, eps, Hq, Hk, k_cache, v_cache,
    #                                slot_mapping, context_lens, sinks, scale, window, o_w, block_tables,
    #                                ring_rows) -> linear(attention [N, Hq * D], o_w) [N, H]
    cache_write: Callable     # (k, v, k_cache, v_cache, slots [N], -1 = skip, kv_scales=None)
    # FP8 KV (flint_kernels/fp8_kv.py): qk_norm_rope, attention, decode_attention_o and cache_write
    # take kv_scales=(k_scale, v_scale) with float8_e4m3fn caches
    silu_mul: Callable        # (gate_up [T, 2I]) -> [T, I]
    silu_linear: Callable     # (gate_up [T, 2I], w [N, I]) -> linear(silu_mul(gate_up), w) [T, N]
    router: Callable          # (x, w [E, H] bf16/fp32, top_k, renormalize) -> ids [T, K] int32, weights fp32
    moe: Callable             # (x, ids, weights, w13, w2, shared_w13, shared_w2) -> [T, H]; dense or NVFP4 experts
    # the MoE block: residual add + RMSNorm, router, top-k, experts
    norm_moe: Callable        # (x, residual | None, norm_w, eps, router_w, top_k, renorm,
    #                              w13, w2, shared_w13, shared_w2) -> (MoE(rms_norm(..)), residual + x)
    sample: Callable          # (logits [S, V], temperature, top_k, top_p, min_p, seeds, offsets) -> tokens [S]
    # a decode step's greedy tokens in packed int64 argmax slots (greedy.py), as norm_logits leaves them
    greedy_slots: Callable    # (n, device) -> [n] int64 slots, empty (before a head's argmax)
    pack_tokens: Callable     # (tokens [S] int64) -> [S] slots holding those tokens (sampled rows)
    slot_tokens: Callable     # (slots [S] int64) -> token ids [S] int64


def greedy_slots(n: int, device: torch.device) -> torch.Tensor:
    return torch.full((n,), greedy_k.EMPTY, dtype=torch.int64, device=device)


def concat_rows(weights: list, dim: int = 0):
    """Stack weights along their output rows (dim -2: 0 for matrices, 1 for stacked experts).
    All NVFP4 -> one NVFP4Weight with a per-row global scale; all dense -> torch.cat. A mix
    (a checkpoint stores a tensor densely when its K is not a multiple of 64, e.g. a tiny
    model's q/k/v) -> dense: the NVFP4 parts are dequantised here, at load, to the dense dtype."""
    nvfp4 = [isinstance(w, NVFP4Weight) for w in weights]
    ndim = len(weights[0].shape)
    if dim % ndim != ndim - 2:
        raise ValueError(f"concat_rows: dim {dim} of {ndim}-dim weights, expected the row dim {ndim - 2}")
    if all(nvfp4):
        return nvfp4_concat_rows(weights)
    dtype = next(w.dtype for w, q in zip(weights, nvfp4) if not q)
    dense = [w.dequantize(dtype) if q else w for w, q in zip(weights, nvfp4)]
    return torch.cat(dense, dim=dim).contiguous()


def linear_torch(x: torch.Tensor, w) -> torch.Tensor:
    if isinstance(w, NVFP4Weight):
        return nvfp4_k.nvfp4_linear_torch(x, w)
    return F.linear(x, w)


def linear_triton(x: torch.Tensor, w) -> torch.Tensor:
    if isinstance(w, NVFP4Weight):
        return nvfp4_k.nvfp4_linear(x, w)
    if dense_gemv_k.uses_dense_gemv(x, w):  # decode batches: a GEMV that takes part in PDL
        return dense_gemv_k.dense_gemv(x, w)
    return F.linear(x, w)  # prefill with cuBLAS


def silu_linear_torch(gate_up: torch.Tensor, w) -> torch.Tensor:
    return linear_torch(swiglu_k.silu_mul_torch(gate_up), w)


def silu_linear_triton(gate_up: torch.Tensor, w) -> torch.Tensor:
    """NVFP4 decode batches: the SwiGLU folded into the linear's GEMV (one launch); else
    silu_mul, then linear."""
    if (isinstance(w, NVFP4Weight) and gate_up.dim() == 2 and gate_up.stride(-1) == 1
            and gate_up.shape[0] <= nvfp4_k.GEMV_MAX_TOKENS):
        return nvfp4_k.silu_nvfp4_linear(gate_up, w)
    return linear_triton(swiglu_k.silu_mul(gate_up), w)


def logits_torch(h: torch.Tensor, w) -> torch.Tensor:
    if isinstance(w, NVFP4Weight):
        return nvfp4_k.nvfp4_logits_torch(h, w)
    return linear_torch(h, w).float()


def logits_triton(h: torch.Tensor, w) -> torch.Tensor:
    """Decode batches: the LM head's GEMV stores the fp32 logits itself (a dense head: its bf16
    outputs' values), no conversion launch after it."""
    if isinstance(w, NVFP4Weight):
        return nvfp4_k.nvfp4_logits(h, w)
    if dense_gemv_k.uses_dense_gemv(h, w):
        return dense_gemv_k.dense_gemv(h, w, out_dtype=torch.float32)
    return linear_triton(h, w).float()


def norm_logits_torch(x, residual, norm_w, eps, w, greedy=None):
    logits = logits_torch(rms_k.rms_norm_torch(x, norm_w, eps, residual=residual), w)
    if greedy is not None:
        greedy.copy_(greedy_k.pack_argmax(logits))
    return logits


def norm_logits_triton(x, residual, norm_w, eps, w, greedy=None):
    """Decode batches: the LM head's GEMV (dense, or NVFP4 W4A16) picks the greedy tokens, and
    with HEAD_FOLD_NORM folds the final RMSNorm too (one launch); else rms_norm, then the head
    (an NVFP4 one through its GEMM with fp32 output) and torch's argmax."""
    fold = tuning.HEAD_FOLD_NORM and _foldable(x, residual) and x.shape[1] <= rms_k.MAX_HIDDEN
    if isinstance(w, NVFP4Weight):
        if fold and x.shape[0] <= nvfp4_k.GEMV_MAX_TOKENS:
            return nvfp4_k.rms_norm_nvfp4_logits(x, residual, norm_w, eps, w, greedy=greedy)[0]
        return nvfp4_k.nvfp4_logits(rms_k.rms_norm(x, norm_w, eps, residual=residual), w, greedy=greedy)
    if fold and dense_gemv_k.uses_dense_gemv(x, w):
        return dense_gemv_k.rms_norm_dense_gemv(x, residual, norm_w, eps, w, out_dtype=torch.float32,
                                                greedy=greedy)[0]
    h = rms_k.rms_norm(x, norm_w, eps, residual=residual)
    if dense_gemv_k.uses_dense_gemv(h, w):
        return dense_gemv_k.dense_gemv(h, w, out_dtype=torch.float32, greedy=greedy)
    logits = logits_triton(h, w)
    if greedy is not None:
        greedy.copy_(greedy_k.pack_argmax(logits))
    return logits


def norm_linear_torch(x, residual, norm_w, eps, w):
    h = rms_k.rms_norm_torch(x, norm_w, eps, residual=residual)
    return linear_torch(h, w), x if residual is None else residual


def _foldable(x, residual) -> bool:
    return x.is_contiguous() and (
        residual is None or (residual.dtype == x.dtype and residual.is_contiguous()))


def norm_linear_triton(x, residual, norm_w, eps, w):
    """Decode batches: the RMSNorm folded into the GEMV (one launch); else rms_norm, then linear."""
    if _foldable(x, residual) and x.shape[1] <= rms_k.MAX_HIDDEN:
        if isinstance(w, NVFP4Weight) and x.shape[0] <= nvfp4_k.GEMV_MAX_TOKENS:
            return nvfp4_k.rms_norm_nvfp4_linear(x, residual, norm_w, eps, w)
        if not isinstance(w, NVFP4Weight) and dense_gemv_k.uses_dense_gemv(x, w):
            return dense_gemv_k.rms_norm_dense_gemv(x, residual, norm_w, eps, w)
    h = rms_k.rms_norm(x, norm_w, eps, residual=residual)
    return linear_triton(h, w), x if residual is None else residual


def norm_router_torch(x, residual, norm_w, eps, w, top_k, renormalize):
    h = rms_k.rms_norm_torch(x, norm_w, eps, residual=residual)
    return (h, *router_k.router_topk_torch(h, w, top_k, renormalize), x if residual is None else residual)


def norm_router_triton(x, residual, norm_w, eps, w, top_k, renormalize):
    """Decode batches: the RMSNorm folded into the router (one launch); else rms_norm, then router."""
    if _foldable(x, residual) and router_k.folds_norm(x, w):
        return router_k.rms_norm_router_topk(x, residual, norm_w, eps, w, top_k, renormalize)
    h = rms_k.rms_norm(x, norm_w, eps, residual=residual)
    return (h, *router_k.router_topk(h, w, top_k, renormalize), x if residual is None else residual)


def norm_moe_torch(x, residual, norm_w, eps, router_w, top_k, renormalize, w13, w2, shared_w13, shared_w2):
    h, ids, weights, residual = norm_router_torch(x, residual, norm_w, eps, router_w, top_k, renormalize)
    return moe_k.fused_moe_torch(h, ids, weights, w13, w2, shared_w13, shared_w2), residual


def norm_moe_triton(x, residual, norm_w, eps, router_w, top_k, renormalize, w13, w2, shared_w13, shared_w2):
    """Decode batches: the router launch stores logits and the expert launches pick the top-k;
    else norm_router (its top-k in the router launch), then moe."""
    if (_foldable(x, residual) and router_k.folds_norm(x, router_w)
            and x.shape[0] <= moe_k.SMALL_BATCH_TOKENS and moe_gemv_k.routes_in_experts(w2, shared_w2, top_k)):
        h, logits, residual, routing = router_k.rms_norm_router_logits(x, residual, norm_w, eps, router_w)
        return moe_k.fused_moe_routed(h, logits, routing, top_k, renormalize, w13, w2, shared_w13,
                                      shared_w2), residual
    h, ids, weights, residual = norm_router_triton(x, residual, norm_w, eps, router_w, top_k, renormalize)
    return moe_k.fused_moe(h, ids, weights, w13, w2, shared_w13, shared_w2), residual


def _attention_torch(*args, decode_only: bool, max_query_len: int, kv_in_cache: bool = False, **kwargs):
    return attention_k.attention_torch(*args, **kwargs)


def _attention_triton(q, k, v, query_start_loc, context_lens, k_cache, v_cache, sinks, sm_scale, window,
                      block_tables=None, ring_rows=None, *, decode_only: bool, max_query_len: int, kv_scales=None,
                      kv_in_cache: bool = False):
    from flint_kernels.decode_attention import decode_attention
    from flint_kernels.prefill_attention import prefill_attention

    if decode_only:
        return decode_attention(q, k, v, k_cache, v_cache, context_lens, sinks, sm_scale, window,
                                block_tables=block_tables, ring_rows=ring_rows, kv_scales=kv_scales)
    return prefill_attention(q, k, v, query_start_loc, context_lens, k_cache, v_cache, sinks, sm_scale, window,
                             max_query_len, block_tables=block_tables, ring_rows=ring_rows, kv_scales=kv_scales,
                             kv_in_cache=kv_in_cache)


def _decode_attention_o_torch(qkv, q_w, k_w, positions, cos_sin, eps, hq, hk, k_cache, v_cache, slots,
                              context_lens, sinks, sm_scale, window, o_w, block_tables=None, ring_rows=None,
                              kv_scales=None):
    from flint_kernels.decode_attention import decode_attention_torch
    q, k, v = qk_k.qk_norm_rope_torch(qkv, q_w, k_w, positions, cos_sin, eps, hq, hk, k_cache, v_cache, slots,
                                      kv_scales=kv_scales)
    out = decode_attention_torch(q, k, v, k_cache, v_cache, context_lens, sinks, sm_scale, window,
                                 block_tables=block_tables, ring_rows=ring_rows, kv_scales=kv_scales)
    return linear_torch(out.reshape(out.shape[0], -1), o_w)


def _decode_attention_o_triton(qkv, q_w, k_w, positions, cos_sin, eps, hq, hk, k_cache, v_cache, slots,
                               context_lens, sinks, sm_scale, window, o_w, block_tables=None, ring_rows=None,
                               kv_scales=None):
    """qk_norm_rope (writing the cache), decode_attention, o_proj; the reduce in
    tuning.NVFP4_REDUCE_WARPS warps before an NVFP4 o_proj, and its output in fp16 where
    o_proj's tiles take fp16 (nvfp4_linear.wants_f16_activations)."""
    from flint_kernels.decode_attention import decode_attention

    reduce_warps = tuning.NVFP4_REDUCE_WARPS if isinstance(o_w, NVFP4Weight) else None
    q, k, v = qk_k.qk_norm_rope(qkv, q_w, k_w, positions, cos_sin, eps, hq, hk, k_cache, v_cache, slots,
                                kv_scales=kv_scales)
    f16 = isinstance(o_w, NVFP4Weight) and nvfp4_k.wants_f16_activations(q.shape[0])
    out = torch.empty(q.shape, dtype=torch.float16, device=q.device) if f16 else None
    out = decode_attention(q, k, v, k_cache, v_cache, context_lens, sinks, sm_scale, window,
                           block_tables=block_tables, ring_rows=ring_rows, reduce_warps=reduce_warps,
                           kv_scales=kv_scales, out=out)
    if f16:
        return nvfp4_k.nvfp4_linear(out.reshape(out.shape[0], -1), o_w, out_dtype=q.dtype)  # [N, H]
    return linear_triton(out.reshape(out.shape[0], -1), o_w)  # [N, H]


TORCH_OPS = Ops(
    name="torch",
    embedding=embedding_k.embedding_torch,
    decode_embedding=embedding_k.decode_embedding_torch,
    linear=linear_torch,
    logits=logits_torch,
    norm_logits=norm_logits_torch,
    concat_rows=concat_rows,
    rms_norm=rms_k.rms_norm_torch,
    norm_linear=norm_linear_torch,
    norm_router=norm_router_torch,
    qk_norm_rope=qk_k.qk_norm_rope_torch,
    attention=_attention_torch,
    decode_attention_o=_decode_attention_o_torch,
    cache_write=kv_write_k.kv_write_torch,
    silu_mul=swiglu_k.silu_mul_torch,
    silu_linear=silu_linear_torch,
    router=router_k.router_topk_torch,
    moe=moe_k.fused_moe_torch,
    norm_moe=norm_moe_torch,
    sample=sampling_k.sample_torch,
    greedy_slots=greedy_slots,
    pack_tokens=greedy_k.pack_token,
    slot_tokens=greedy_k.token,
)


def triton_ops() -> Ops:
    return Ops(
        name="triton",
        embedding=embedding_k.embedding,
        decode_embedding=embedding_k.decode_embedding,
        linear=linear_triton,
        logits=logits_triton,
        norm_logits=norm_logits_triton,
        concat_rows=concat_rows,
        rms_norm=rms_k.rms_norm,
        norm_linear=norm_linear_triton,
        norm_router=norm_router_triton,
        qk_norm_rope=qk_k.qk_norm_rope,
        attention=_attention_triton,
        decode_attention_o=_decode_attention_o_triton,
        cache_write=kv_write_k.kv_write,
        silu_mul=swiglu_k.silu_mul,
        silu_linear=silu_linear_triton,
        router=router_k.router_topk,
        moe=moe_k.fused_moe,
        norm_moe=norm_moe_triton,
        sample=sampling_k.sample,
        greedy_slots=greedy_slots,  # the slot format is the LM head's, the same in both tables
        pack_tokens=greedy_k.pack_token,
        slot_tokens=greedy_k.token,
    )


def get_ops(backend: str) -> Ops:
    if backend == "torch":
        return TORCH_OPS
    if backend == "triton":
        return triton_ops()
    raise ValueError(f"kernel_backend: got {backend!r}, expected one of {BACKENDS}")
