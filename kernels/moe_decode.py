"""Low-latency decode MoE for a few tokens: routing in the prologue, only the chosen experts read.

Two launches per MoE layer, no sorting pass:
  gate_up  program (token t, slot j, tile of I): picks expert j of token t by recomputing the
           sigmoid + biased top-k of the router logits (E values, cheap), streams that expert's
           gate and up rows of the tile (slot K = the shared expert), writes silu(gate) * up.
           Program (t, 0, 0) also stores the token's expert ids and normalised weights.
  down     program (token t, tile of H): for each of the K routed experts and the shared one,
           streams its down rows of the tile over the whole I, rounds that expert's output like
           the reference does, and sums them with the routing weights in fp32.

Semantics = `moe_decode_torch`: router top-k (kernels/router.py) then fused_moe (kernels/moe.py).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .moe import fused_moe_torch

DOT_FP32 = os.environ.get("TRITON_INTERPRET") == "1"
MAX_TOKENS = 16


@triton.jit
def _route(logits_ptr, bias_ptr, t, E, top_k, scaling, slot,
           RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_KS: tl.constexpr):
    """Top-k of sigmoid(logits[t]) + bias -> (expert at `slot`, its weight, all ids, all weights)."""
    offs = tl.arange(0, BLOCK_E)
    emask = offs < E
    scores = tl.sigmoid(tl.load(logits_ptr + t * E + offs, mask=emask, other=0.0))
    biased = tl.where(emask, scores + tl.load(bias_ptr + offs, mask=emask, other=0.0), float("-inf"))
    ks = tl.arange(0, BLOCK_KS)
    ids = tl.zeros([BLOCK_KS], dtype=tl.int32)
    ws = tl.zeros([BLOCK_KS], dtype=tl.float32)
    for j in range(top_k):
        best = tl.argmax(biased, axis=0)
        ids = tl.where(ks == j, best, ids)
        ws = tl.where(ks == j, tl.sum(tl.where(offs == best, scores, 0.0), axis=0), ws)
        biased = tl.where(offs == best, float("-inf"), biased)
    if RENORM:
        ws = ws / tl.sum(ws, axis=0)
    ws = ws * scaling
    expert = tl.sum(tl.where(ks == slot, ids, 0), axis=0)
    return expert, ids, ws


@triton.jit
def _gate_up_kernel(
    h_ptr,         # [T, H] normalised activations
    logits_ptr,    # [T, E] fp32 router logits
    bias_ptr,      # [E] fp32 correction bias
    w13_ptr,       # [E, 2I, H] gate rows then up rows
    shared_ptr,    # [2Is, H] shared expert gate rows then up rows (Is == I)
    act_ptr,       # [T, K + 1, I] silu(gate) * up
    ids_ptr,       # [T, K] int32 out
    weights_ptr,   # [T, K] fp32 out
    T, H, E, I, top_k, scaling,
    RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_KS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.program_id(1)
    n0 = tl.program_id(2) * BLOCK_N
    dtype = h_ptr.dtype.element_ty
    expert, ids, ws = _route(logits_ptr, bias_ptr, t, E, top_k, scaling, slot,
                             RENORM=RENORM, BLOCK_E=BLOCK_E, BLOCK_KS=BLOCK_KS)
    if (slot == 0) & (n0 == 0):
        ks = tl.arange(0, BLOCK_KS)
        tl.store(ids_ptr + t * top_k + ks, ids, mask=ks < top_k)
        tl.store(weights_ptr + t * top_k + ks, ws, mask=ks < top_k)
    if slot == top_k:
        base = shared_ptr
    else:
        base = w13_ptr + expert.to(tl.int64) * (2 * I * H)
    rows = n0 + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    # the token row sits in row 0 of a BLOCK_T-row tile (tl.dot needs 16 rows)
    trow = tl.arange(0, BLOCK_T)
    acc_g = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        kmask = (k0 + cols) < H
        x = tl.load(h_ptr + t * H + k0 + cols[None, :] + trow[:, None] * 0,
                    mask=(trow[:, None] == 0) & kmask[None, :], other=0.0)
        wg = tl.load(base + rows[:, None] * H + k0 + cols[None, :], mask=kmask[None, :], other=0.0)
        wu = tl.load(base + (rows + I)[:, None] * H + k0 + cols[None, :], mask=kmask[None, :], other=0.0)
        if DOT_FP32:
            acc_g += tl.dot(x.to(tl.float32), tl.trans(wg.to(tl.float32)))
            acc_u += tl.dot(x.to(tl.float32), tl.trans(wu.to(tl.float32)))
        else:
            acc_g += tl.dot(x, tl.trans(wg))
            acc_u += tl.dot(x, tl.trans(wu))
    g = tl.sum(acc_g, axis=0).to(dtype).to(tl.float32)  # row 0 holds the token; the linear's rounding
    u = tl.sum(acc_u, axis=0).to(dtype).to(tl.float32)
    act = (g * tl.sigmoid(g)).to(dtype).to(tl.float32) * u  # F.silu rounds, then the product rounds
    tl.store(act_ptr + (t * (top_k + 1) + slot) * I + rows, act.to(dtype))


@triton.jit
def _down_kernel(
    act_ptr,       # [T, K + 1, I]
    ids_ptr,       # [T, K] int32
    weights_ptr,   # [T, K] fp32
    w2_ptr,        # [E, H, I]
    shared_ptr,    # [H, Is]
    out_ptr,       # [T, H]
    H, I, top_k,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
):
    t = tl.program_id(0)
    n0 = tl.program_id(1) * BLOCK_N
    dtype = act_ptr.dtype.element_ty
    rows = n0 + tl.arange(0, BLOCK_N)
    rmask = rows < H
    cols = tl.arange(0, BLOCK_K)
    trow = tl.arange(0, BLOCK_T)
    routed = tl.zeros([BLOCK_N], dtype=tl.float32)
    shared = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in range(top_k + 1):  # slot top_k is the shared expert
        routed_slot = j < top_k
        expert = tl.load(ids_ptr + t * top_k + j, mask=routed_slot, other=0).to(tl.int64)
        weight = tl.load(weights_ptr + t * top_k + j, mask=routed_slot, other=0.0)
        if routed_slot:
            base = w2_ptr + expert * (H * I)
        else:
            base = shared_ptr
        acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            kmask = (k0 + cols) < I
            a = tl.load(act_ptr + (t * (top_k + 1) + j) * I + k0 + cols[None, :] + trow[:, None] * 0,
                        mask=(trow[:, None] == 0) & kmask[None, :], other=0.0)
            w = tl.load(base + rows[:, None] * I + k0 + cols[None, :], mask=rmask[:, None] & kmask[None, :],
                        other=0.0)
            if DOT_FP32:
                acc += tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)))
            else:
                acc += tl.dot(a, tl.trans(w))
        y = tl.sum(acc, axis=0).to(dtype).to(tl.float32)  # each expert's output rounds (reference)
        routed += weight * y
        shared = tl.where(routed_slot, shared, y)
    out = (routed.to(dtype).to(tl.float32) + shared).to(dtype)
    tl.store(out_ptr + t * H + rows, out, mask=rmask)


def moe_decode(h: torch.Tensor, logits: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float,
               renormalize: bool, w13: torch.Tensor, w2: torch.Tensor, shared_w13: torch.Tensor,
               shared_w2: torch.Tensor) -> torch.Tensor:
    """h [T, H], logits [T, E] fp32 -> [T, H]: routed experts (top-k of the logits) + shared expert."""
    t, hidden, e, inter = _check_inputs(h, logits, bias, top_k, w13, w2, shared_w13, shared_w2)
    act = torch.empty((t, top_k + 1, inter), dtype=h.dtype, device=h.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=h.device)
    weights = torch.empty((t, top_k), dtype=torch.float32, device=h.device)
    out = torch.empty_like(h)
    block_n = 32
    _gate_up_kernel[(t, top_k + 1, triton.cdiv(inter, block_n))](
        h_ptr=h, logits_ptr=logits, bias_ptr=bias, w13_ptr=w13, shared_ptr=shared_w13, act_ptr=act,
        ids_ptr=ids, weights_ptr=weights, T=t, H=hidden, E=e, I=inter, top_k=top_k, scaling=scaling,
        RENORM=renormalize, BLOCK_E=triton.next_power_of_2(e), BLOCK_KS=triton.next_power_of_2(top_k),
        BLOCK_T=16, BLOCK_N=block_n, BLOCK_K=min(256, triton.next_power_of_2(hidden)),
        DOT_FP32=DOT_FP32, num_warps=4, num_stages=3,
    )
    _down_kernel[(t, triton.cdiv(hidden, 16))](
        act_ptr=act, ids_ptr=ids, weights_ptr=weights, w2_ptr=w2, shared_ptr=shared_w2, out_ptr=out,
        H=hidden, I=inter, top_k=top_k,
        BLOCK_T=16, BLOCK_N=16, BLOCK_K=min(256, triton.next_power_of_2(inter)),
        DOT_FP32=DOT_FP32, num_warps=4, num_stages=3,
    )
    return out


def moe_decode_torch(h, logits, bias, top_k, scaling, renormalize, w13, w2, shared_w13, shared_w2):
    """Same signature and semantics as `moe_decode`."""
    scores = torch.sigmoid(logits)
    ids = torch.topk(scores + bias.float(), top_k, dim=-1).indices
    weights = scores.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return fused_moe_torch(h, ids.to(torch.int32), weights * scaling, w13, w2, shared_w13, shared_w2)


def _check_inputs(h, logits, bias, top_k, w13, w2, shared_w13, shared_w2):
    if h.dim() != 2 or not h.is_contiguous() or h.shape[0] > MAX_TOKENS:
        raise ValueError(f"moe_decode: h has shape {tuple(h.shape)}, expected contiguous [T <= {MAX_TOKENS}, H]")
    t, hidden = h.shape
    e, two_i, _ = w13.shape
    inter = two_i // 2
    if logits.shape != (t, e) or logits.dtype != torch.float32 or bias.shape != (e,):
        raise ValueError(f"moe_decode: logits {logits.dtype} {tuple(logits.shape)}, bias {tuple(bias.shape)}; "
                         f"expected float32 ({t}, {e}) and ({e},)")
    if w13.shape != (e, 2 * inter, hidden) or w2.shape != (e, hidden, inter):
        raise ValueError(f"moe_decode: w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}; expected "
                         f"[E, 2I, {hidden}] and [E, {hidden}, I]")
    if shared_w13.shape != (2 * inter, hidden) or shared_w2.shape != (hidden, inter):
        raise ValueError(f"moe_decode: the shared expert {tuple(shared_w13.shape)} / {tuple(shared_w2.shape)} must "
                         f"have the routed experts' intermediate size {inter}")
    if not 0 < top_k <= e:
        raise ValueError(f"moe_decode: top_k {top_k}, expected 1..{e}")
    if inter % 32:
        raise ValueError(f"moe_decode: intermediate size {inter}, expected a multiple of 32")
    return t, hidden, e, inter
