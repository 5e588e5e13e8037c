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

from .split_k import arrival_counters, last_to_arrive, pick_splits

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DOT_FP32 = INTERPRET  # Triton's interpreter computes bf16 tl.dot wrongly
BLOCK_T = 16           # tokens per tile (tl.dot's smallest M); the top-k stage holds [BLOCK_T, E]
BLOCK_H = 32 if INTERPRET else 128


@triton.jit
def _router_kernel(
    x_ptr,        # [T, H]
    w_ptr,        # [E, H]
    bias_ptr,     # [E] fp32
    ids_ptr,      # [T, TOP_K] int32
    weights_ptr,  # [T, TOP_K] fp32
    part_ptr,     # [SPLIT, T, E] fp32 partial logits
    counter_ptr,  # [cdiv(T, BLOCK_T)] int32, zero between launches
    T, E, H, stride_xt, stride_we, h_per_split, scaling,
    TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
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
    for h0 in range(h_lo, h_hi, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
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
    t, h = x.shape
    e = weight.shape[0]
    ids = torch.empty((t, top_k), dtype=torch.int32, device=x.device)
    weights = torch.empty((t, top_k), dtype=torch.float32, device=x.device)
    if t == 0:
        return ids, weights
    block_e = min(32 if t <= BLOCK_T else 64, max(16, triton.next_power_of_2(e)))
    tiles = (triton.cdiv(t, BLOCK_T), triton.cdiv(e, block_e))
    h_blocks = triton.cdiv(h, BLOCK_H)
    # decode: 4 splits measured fastest on an H200 (9.4 us vs 11.6 us for the ~2-waves choice of 16,
    # benchmarks/decode-ops-h200.json): fewer partials for the last program to sum
    splits = min(4, h_blocks) if t <= BLOCK_T else pick_splits(tiles[0] * tiles[1], h_blocks, x.device)
    h_per_split = triton.cdiv(h_blocks, splits) * BLOCK_H
    splits = triton.cdiv(h, h_per_split)
    part = torch.empty((splits, t, e), dtype=torch.float32, device=x.device)
    fp32 = torch.float32 in (x.dtype, weight.dtype)
    _router_kernel[(tiles[0], tiles[1], splits)](
        x_ptr=x, w_ptr=weight, bias_ptr=bias, ids_ptr=ids, weights_ptr=weights, part_ptr=part,
        counter_ptr=arrival_counters(tiles[0], x.device),
        T=t, E=e, H=h, stride_xt=x.stride(0), stride_we=weight.stride(0), h_per_split=h_per_split,
        scaling=float(scaling),
        TOP_K=top_k, RENORMALIZE=bool(renormalize), BLOCK_T=BLOCK_T, BLOCK_E=block_e, BLOCK_H=BLOCK_H,
        E_POW2=max(16, triton.next_power_of_2(e)), K_POW2=triton.next_power_of_2(top_k), SPLIT=splits,
        DOT_FP32=DOT_FP32, DOT_PRECISION="ieee" if fp32 else "tf32",
        num_warps=4,
    )
    return ids, weights


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
