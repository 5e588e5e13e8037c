"""MoE routing: fp32 router logits, sigmoid scores, top-k on scores + correction bias,
weights = chosen scores (no bias), optionally renormalised to sum 1, times the scaling factor.

One launch. Program (token tile, expert block, H split) computes a [BLOCK_T, BLOCK_E] tile of
fp32 logits with tl.dot (bf16 x bf16 products are exact in fp32; fp32 inputs use IEEE fp32)
and stores it; the last program of a token tile to arrive (split_k.py) sums the partial
logits in a fixed order and does sigmoid, biased top-k and the weights for its tokens. At
decode the router weight (E x H = 1 MB in bf16) is spread over ~2 programs per SM instead of
being streamed by one program per token, and no second launch is needed for the top-k.
Ties in the biased scores go to the lower expert id.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .rms_norm import residual_norm_tile, residual_rstd, rms_norm_torch
from .split_k import arrival_counters, last_to_arrive, pick_splits

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DOT_FP32 = INTERPRET  # Triton's interpreter computes bf16 tl.dot wrongly
BLOCK_T = 16           # tokens per tile (tl.dot's smallest M); the top-k stage holds [BLOCK_T, E]
BLOCK_H = 32 if INTERPRET else 128


@triton.jit
def _router_kernel(
    x_ptr,        # [T, H] router input (NORM: the attention output, normalised here with the residual)
    res_in_ptr,   # [T, H] residual before the add (when NORM)
    res_out_ptr,  # [T, H] residual + x, written by the expert-block-0 programs (when NORM)
    norm_w_ptr,   # [H] post-attention RMSNorm weight (when NORM)
    h_ptr,        # [T, H] rms_norm(residual + x), the MoE input, written like res_out (when NORM)
    w_ptr,        # [E, H]
    bias_ptr,     # [E] fp32
    ids_ptr,      # [T, TOP_K] int32
    weights_ptr,  # [T, TOP_K] fp32
    part_ptr,     # [SPLIT, T, E] fp32 partial logits
    counter_ptr,  # [cdiv(T, BLOCK_T)] int32, zero between launches
    T, E, H, stride_xt, stride_we, h_per_split, scaling, eps,
    NORM: tl.constexpr, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, E_POW2: tl.constexpr,
    K_POW2: tl.constexpr, SPLIT: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    tt = tl.program_id(0)
    eb = tl.program_id(1)
    s = tl.program_id(2)
    tokens = tt * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    t_mask = tokens < T
    e_mask = experts < E
    acc = tl.zeros([BLOCK_T, BLOCK_E], tl.float32)
    h_lo = s * h_per_split
    h_hi = tl.minimum(h_lo + h_per_split, H)
    if NORM:  # every program needs the RMS of the whole residual-added rows (a few KB, from L2)
        rstd = residual_rstd(x_ptr, res_in_ptr, norm_w_ptr, tokens, t_mask, H, eps, True, BLOCK_H)
    for h0 in range(h_lo, h_hi, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        if NORM:  # (stride_xt == H)
            a, summed, off, m = residual_norm_tile(x_ptr, res_in_ptr, norm_w_ptr, tokens, t_mask, h0, H, rstd,
                                                   True, BLOCK_H)
            if eb == 0:
                tl.store(res_out_ptr + off, summed, mask=m)
                tl.store(h_ptr + off, a, mask=m)
        else:
            a = tl.load(x_ptr + tokens[:, None] * stride_xt + cols[None, :],
                        mask=t_mask[:, None] & (cols[None, :] < h_hi), other=0.0)  # [BLOCK_T, BLOCK_H]
        w = tl.load(w_ptr + experts[:, None] * stride_we + cols[None, :],
                    mask=e_mask[:, None] & (cols[None, :] < h_hi), other=0.0)  # [BLOCK_E, BLOCK_H]
        if DOT_FP32 or a.dtype != w.dtype:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
    offs = tokens[:, None] * E + experts[None, :]
    tl.store(part_ptr + s * T * E + offs, acc, mask=t_mask[:, None] & e_mask[None, :])
    if last_to_arrive(counter_ptr + tt, tl.num_programs(1) * SPLIT):
        _top_k(part_ptr, bias_ptr, ids_ptr, weights_ptr, tokens, t_mask, T, E, scaling,
               TOP_K, RENORMALIZE, E_POW2, K_POW2, SPLIT)


@triton.jit
def _top_k(part_ptr, bias_ptr, ids_ptr, weights_ptr, tokens, t_mask, T, E, scaling,
           TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, E_POW2: tl.constexpr, K_POW2: tl.constexpr,
           SPLIT: tl.constexpr):
    """Sums the SPLIT partial logits of `tokens` (in split order) and writes their top-k."""
    experts = tl.arange(0, E_POW2)
    e_mask = experts < E
    mask = t_mask[:, None] & e_mask[None, :]
    offs = tokens[:, None] * E + experts[None, :]
    logits = tl.zeros([tokens.shape[0], E_POW2], tl.float32)
    for i in range(SPLIT):
        logits += tl.load(part_ptr + i * T * E + offs, mask=mask, other=0.0, cache_modifier=".cg")
    scores = tl.sigmoid(logits)
    bias = tl.load(bias_ptr + experts, mask=e_mask, other=0.0)
    biased = tl.where(e_mask[None, :], scores + bias[None, :], float("-inf"))  # [BLOCK_T, E_POW2]
    slots = tl.arange(0, K_POW2)
    ids = tl.zeros([tokens.shape[0], K_POW2], tl.int32)
    chosen = tl.zeros([tokens.shape[0], K_POW2], tl.float32)
    for k in tl.static_range(TOP_K):
        best = tl.max(biased, axis=1)
        pick = tl.min(tl.where(biased == best[:, None], experts[None, :], E_POW2), axis=1)  # lowest id on ties
        hit = experts[None, :] == pick[:, None]
        score = tl.sum(tl.where(hit, scores, 0.0), axis=1)
        biased = tl.where(hit, float("-inf"), biased)
        ids = tl.where(slots[None, :] == k, pick[:, None], ids)
        chosen = tl.where(slots[None, :] == k, score[:, None], chosen)
    if RENORMALIZE:
        chosen = chosen / tl.sum(chosen, axis=1)[:, None]
    out = tokens[:, None] * TOP_K + slots[None, :]
    out_mask = t_mask[:, None] & (slots[None, :] < TOP_K)
    tl.store(ids_ptr + out, ids, mask=out_mask)
    tl.store(weights_ptr + out, chosen * scaling, mask=out_mask)


def router_topk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int,
                scaling: float, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H] (bf16/fp16/fp32), bias [E] fp32 -> ids [T, K] int32, weights [T, K] fp32."""
    _check_inputs(x, weight, bias, top_k)
    return _launch(x, None, None, 0.0, weight, bias, top_k, scaling, renormalize)[2:]


def norm_router_topk(x: torch.Tensor, residual: torch.Tensor, norm_w: torch.Tensor, eps: float,
                     weight: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float, renormalize: bool):
    """The low-latency decode path's router: residual add + RMSNorm in the prologue, one launch.
    x (attention output), residual [T, H] -> (h = rms_norm(residual + x) [T, H], residual + x [T, H],
    ids [T, K] int32, weights [T, K] fp32)."""
    _check_inputs(x, weight, bias, top_k)
    if residual.shape != x.shape or not x.is_contiguous() or not residual.is_contiguous() or norm_w.shape != x.shape[1:]:
        raise ValueError(f"norm_router_topk: x {tuple(x.shape)}, residual {tuple(residual.shape)}, norm_w "
                         f"{tuple(norm_w.shape)}; expected contiguous [T, H], [T, H] and [H]")
    return _launch(x, residual, norm_w, eps, weight, bias, top_k, scaling, renormalize)


def norm_router_topk_torch(x, residual, norm_w, eps, weight, bias, top_k, scaling, renormalize):
    """Same signature and semantics as `norm_router_topk`."""
    res_out = residual.clone()
    h = rms_norm_torch(x, norm_w, eps, residual=res_out)
    return (h, res_out, *router_topk_torch(h, weight, bias, top_k, scaling, renormalize))


def _launch(x, residual, norm_w, eps, weight, bias, top_k, scaling, renormalize, block_e=None, splits=None):
    """block_e / splits override the tile choice (benchmarks compare them)."""
    norm = residual is not None
    t, h = x.shape
    e = weight.shape[0]
    ids = torch.empty((t, top_k), dtype=torch.int32, device=x.device)
    weights = torch.empty((t, top_k), dtype=torch.float32, device=x.device)
    h_out = torch.empty_like(x) if norm else x
    res_out = torch.empty_like(x) if norm else x
    if t == 0:
        return h_out, res_out, ids, weights
    block_e = block_e or min(32 if t <= BLOCK_T else 64, max(16, triton.next_power_of_2(e)))
    tiles = (triton.cdiv(t, BLOCK_T), triton.cdiv(e, block_e))
    h_blocks = triton.cdiv(h, BLOCK_H)
    splits = splits or pick_splits(tiles[0] * tiles[1], h_blocks, x.device)
    h_per_split = triton.cdiv(h_blocks, splits) * BLOCK_H
    splits = triton.cdiv(h, h_per_split)
    part = torch.empty((splits, t, e), dtype=torch.float32, device=x.device)
    fp32 = torch.float32 in (x.dtype, weight.dtype)
    _router_kernel[(tiles[0], tiles[1], splits)](
        x_ptr=x, res_in_ptr=residual if norm else x, res_out_ptr=res_out, norm_w_ptr=norm_w if norm else bias,
        h_ptr=h_out, w_ptr=weight, bias_ptr=bias, ids_ptr=ids, weights_ptr=weights, part_ptr=part,
        counter_ptr=arrival_counters(tiles[0], x.device),
        T=t, E=e, H=h, stride_xt=x.stride(0), stride_we=weight.stride(0), h_per_split=h_per_split,
        scaling=float(scaling), eps=float(eps), NORM=norm,
        TOP_K=top_k, RENORMALIZE=bool(renormalize), BLOCK_T=BLOCK_T, BLOCK_E=block_e, BLOCK_H=BLOCK_H,
        E_POW2=max(16, triton.next_power_of_2(e)), K_POW2=triton.next_power_of_2(top_k), SPLIT=splits,
        DOT_FP32=DOT_FP32, DOT_PRECISION="ieee" if fp32 else "tf32",
        num_warps=4,
    )
    return h_out, res_out, ids, weights


def router_topk_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int,
                      scaling: float, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H], bias [E] fp32 -> ids [T, K] int32, weights [T, K] fp32."""
    scores = torch.sigmoid(x.float() @ weight.float().T)  # [T, E]
    ids = torch.topk(scores + bias.float(), top_k, dim=-1).indices
    weights = scores.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids.to(torch.int32), weights * scaling


def _check_inputs(x, weight, bias, top_k):
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"router_topk: x has shape {tuple(x.shape)} strides {x.stride()}, "
                         "expected [T, H] with unit stride in H")
    e, h = weight.shape if weight.dim() == 2 else (None, None)
    if h != x.shape[1] or weight.stride(-1) != 1:
        raise ValueError(f"router_topk: weight has shape {tuple(weight.shape)}, expected [E, {x.shape[1]}] "
                         "with unit stride in H")
    if bias.shape != (e,) or bias.dtype != torch.float32 or not bias.is_contiguous():
        raise ValueError(f"router_topk: bias is {bias.dtype} {tuple(bias.shape)}, expected contiguous float32 ({e},)")
    if not 1 <= top_k <= e:
        raise ValueError(f"router_topk: top_k {top_k}, expected 1..{e}")
