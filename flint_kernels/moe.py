"""Mixture of experts: the routed SwiGLU experts chosen per token, weighted and summed, plus the
shared expert (weight 1, no gate; its intermediate Is any multiple of the routed I). Expert
weights are stacked: w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I]; the shared expert
shared_w13 [2Is, H], shared_w2 [H, Is]; each weight dense (bf16/fp16/fp32) or NVFP4 (any object
with `.packed`, `.scales`, `.scale`: layout in nvfp4.py), independently.

`fused_moe` picks the kernels by the token count T:
  T <= SMALL_BATCH_TOKENS  moe_gemv.py: per-(token, choice) GEMVs, no sorting pass; T * K
                           choices over 256 experts rarely repeat an expert here.
  T >  SMALL_BATCH_TOKENS  moe_grouped.py: tokens sorted by expert, tl.dot tiles over each
                           expert's token block, every expert's weights read once per tile column.

Numerics (every path and the torch twin): gate(x), up(x), silu and their product each rounded
to x.dtype (swiglu.silu_mul_rounded: transformers' bf16 SwiGLU), each expert's down output
rounded to x.dtype, the routed outputs weighted in fp32 and summed in fp32, rounded once; the
shared expert's output rounded, added, rounded. Differences from transformers' FlintSparseMoeBlock
in bf16: it rounds each weighted expert output to bf16 and accumulates them in bf16 (index_add_
in expert-id order); we sum in fp32 and round once (vLLM's reference-runtime rule; vLLM also
keeps gate/up in fp32 and rounds silu(g) * u once, which transformers does not: we follow
transformers there). NVFP4 weights: exact E2M1 x E4M3 values, fp32 accumulation, the global
scale on the fp32 sum (nvfp4.py) where the twin dequantises then multiplies in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .moe_gemv import moe_gemv, moe_gemv_routed, routes_in_experts
from .moe_grouped import moe_grouped
from .nvfp4 import is_nvfp4, weight_shape
from .router import ROUTING_WORDS, route_from_logits_torch

SMALL_BATCH_TOKENS = 16  # decode batches up to here take the GEMV path (tune on the GPU: bench_kernels.py)
PATHS = ("small", "grouped")


def fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13, w2,
              shared_w13=None, shared_w2=None, path: str | None = None) -> torch.Tensor:
    """x [T, H], topk_ids [T, K] int32, topk_weights [T, K] fp32 -> [T, H] in x.dtype.
    path: "small" or "grouped" forces a kernel path (default: by T, see SMALL_BATCH_TOKENS)."""
    _check_inputs(x, topk_ids, topk_weights, w13, w2, shared_w13, shared_w2)
    path = path or ("small" if x.shape[0] <= SMALL_BATCH_TOKENS else "grouped")
    if path not in PATHS:
        raise ValueError(f"fused_moe: path {path!r}, expected one of {PATHS}")
    run = moe_gemv if path == "small" else moe_grouped
    return run(x, topk_ids, topk_weights, w13, w2, shared_w13, shared_w2)


def fused_moe_routed(x: torch.Tensor, logits: torch.Tensor, routing: torch.Tensor, top_k: int, renormalize: bool,
                     w13, w2, shared_w13=None, shared_w2=None) -> torch.Tensor:
    """fused_moe routed from the router's fp32 logits [T, E] (router.rms_norm_router_logits):
    the small-batch launches pick each token's top-k themselves (moe_gemv.moe_gemv_routed), so
    no routing launch or tail sits between the router's GEMV and the experts. routing: [T, 16]
    int32 zeros (the router launch's handoff buffer). Same function as
    router.route_from_logits_torch then fused_moe. Decode batches (T <= SMALL_BATCH_TOKENS)
    whose down launch is a one-load kernel (moe_gemv.routes_in_experts)."""
    t = x.shape[0]
    if routing.shape != (t, ROUTING_WORDS) or routing.dtype != torch.int32 or not routing.is_contiguous():
        raise ValueError(f"fused_moe_routed: routing is {routing.dtype} {tuple(routing.shape)}, expected contiguous "
                         f"int32 zeros [{t}, {ROUTING_WORDS}]")
    if logits.dim() != 2 or logits.shape[0] != t or logits.dtype != torch.float32 or not logits.is_contiguous():
        raise ValueError(f"fused_moe_routed: logits is {logits.dtype} {tuple(logits.shape)}, expected contiguous "
                         f"float32 [{t}, E]")
    e = logits.shape[1]
    _check_experts(x, w13, w2, shared_w13, shared_w2)
    experts = weight_shape("fused_moe_routed: w13", w13, 3)[0]
    if experts != e:
        raise ValueError(f"fused_moe_routed: logits for {e} experts, expected {experts} (w13's)")
    if not 1 <= top_k <= e:
        raise ValueError(f"fused_moe_routed: top_k {top_k}, expected 1..{e}")
    if t > SMALL_BATCH_TOKENS or not routes_in_experts(w2, shared_w2, top_k):
        raise ValueError(f"fused_moe_routed: {t} tokens, top_k {top_k}: expected at most {SMALL_BATCH_TOKENS} "
                         "tokens and experts whose down launch loads all slots at once (moe_gemv.routes_in_experts)")
    return moe_gemv_routed(x, logits, routing, top_k, renormalize, w13, w2, shared_w13, shared_w2)


def fused_moe_routed_torch(x, logits, routing, top_k, renormalize, w13, w2, shared_w13=None, shared_w2=None):
    """Same signature and semantics as `fused_moe_routed` (routing: unused)."""
    ids, weights = route_from_logits_torch(logits, top_k, renormalize)
    return fused_moe_torch(x, ids, weights, w13, w2, shared_w13, shared_w2)


def fused_moe_torch(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13, w2,
                    shared_w13=None, shared_w2=None, path: str | None = None) -> torch.Tensor:
    """Same signature and semantics as `fused_moe` (path is ignored). Each expert's output is
    rounded to x.dtype, weighted and summed in fp32, rounded; plus the shared expert's output."""
    routed = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, H]
    ids = topk_ids.long()
    for e in torch.unique(ids).tolist():
        tokens, slot = torch.nonzero(ids == e, as_tuple=True)
        y = _swiglu(x[tokens], w13[e], w2[e]).float() * topk_weights[tokens, slot, None]
        routed.index_add_(0, tokens, y)
    out = routed.to(x.dtype)
    if shared_w13 is not None:
        out = out + _swiglu(x, shared_w13, shared_w2)
    return out


def _swiglu(x: torch.Tensor, w13, w2) -> torch.Tensor:
    gate, up = _linear(x, w13).chunk(2, dim=-1)
    return _linear(F.silu(gate) * up, w2)


def _linear(x: torch.Tensor, w) -> torch.Tensor:
    """x @ W.T in x.dtype; an NVFP4 W is dequantised exactly and applied in fp32 (W4A16)."""
    if is_nvfp4(w):
        return F.linear(x.float(), w.dequantize(torch.float32)).to(x.dtype)
    return x @ w.T


def _check_inputs(x, topk_ids, topk_weights, w13, w2, shared_w13, shared_w2):
    _check_experts(x, w13, w2, shared_w13, shared_w2)
    t = x.shape[0]
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t or topk_ids.dtype != torch.int32 or not topk_ids.is_contiguous():
        raise ValueError(f"fused_moe: topk_ids is {topk_ids.dtype} {tuple(topk_ids.shape)}, expected contiguous "
                         f"int32 [{t}, K]")
    if topk_weights.shape != topk_ids.shape or topk_weights.dtype != torch.float32 or not topk_weights.is_contiguous():
        raise ValueError(f"fused_moe: topk_weights is {topk_weights.dtype} {tuple(topk_weights.shape)}, expected "
                         f"contiguous float32 {tuple(topk_ids.shape)}")


def _check_experts(x, w13, w2, shared_w13, shared_w2):
    """x [T, H] and the expert weights' shapes (no device reads)."""
    if x.dim() != 2 or x.stride(-1) != 1 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"fused_moe: x is {x.dtype} {tuple(x.shape)} strides {x.stride()}, expected "
                         "bf16/fp16/fp32 [T, H] with unit stride in H")
    h = x.shape[1]
    e, two_i, h13 = weight_shape("fused_moe: w13", w13, 3)
    e2, h2, i = weight_shape("fused_moe: w2", w2, 3)
    if h13 != h or two_i % 2 or (e2, h2, i) != (e, h, two_i // 2):
        raise ValueError(f"fused_moe: w13 {(e, two_i, h13)} and w2 {(e2, h2, i)} do not fit x [T, {h}]: expected "
                         f"w13 [E, 2I, {h}] and w2 [E, {h}, I]")
    if (shared_w13 is None) != (shared_w2 is None):
        raise ValueError("fused_moe: give both shared_w13 and shared_w2, or neither")
    if shared_w13 is not None:
        two_is, hs = weight_shape("fused_moe: shared_w13", shared_w13, 2)
        hs2, i_s = weight_shape("fused_moe: shared_w2", shared_w2, 2)
        if hs != h or two_is % 2 or (hs2, i_s) != (h, two_is // 2):
            raise ValueError(f"fused_moe: shared_w13 {(two_is, hs)} and shared_w2 {(hs2, i_s)}, expected "
                             f"[2Is, {h}] and [{h}, Is]")
