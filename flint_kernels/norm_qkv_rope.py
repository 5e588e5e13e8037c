"""Low-latency decode: residual add + RMSNorm + QKV projection + per-head Q/K RMSNorm + RoPE +
KV-cache write, one launch per layer, for a few tokens (T <= 16).

Programs (head, K split) of the fused qkv weight ([q heads | k heads | v heads], D rows each,
dense or NVFP4). Every program recomputes the token rows' RMS over the hidden size (a few KB from
L2) and streams its share of its head's D x H weight rows; the head's last program to arrive
(split_k.py) sums the partials and, owning the whole head, finishes it: Q/K heads are normalised
and rotated (rope on sliding layers only) exactly as `qk_norm_rope` does, K/V heads are written
to the cache. The head-0 programs also write the updated residual. The K split gives batch 1
~2 programs per SM instead of one per head (40 at full size).

Semantics = `norm_qkv_rope_torch`: rms_norm(x, norm_w, eps, residual) -> linear -> qk_norm_rope,
with the same roundings to the activation dtype between steps.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .nvfp4 import check_nvfp4, is_nvfp4, weight_args, weight_tile
from .nvfp4_linear import nvfp4_linear_torch
from .pdl import launch_args, pdl_prologue
from .qk_norm_rope import qk_norm_rope_torch
from .rms_norm import residual_norm_tile, residual_rstd, rms_norm_torch
from .split_k import arrival_counters, last_to_arrive, pick_splits

DOT_FP32 = os.environ.get("TRITON_INTERPRET") == "1"  # the interpreter's bf16 tl.dot is wrong
MAX_TOKENS = 16
BLOCK_K = 128


@triton.jit
def _norm_qkv_rope_kernel(
    x_ptr,          # [T, H] the previous sublayer's output
    res_in_ptr,     # [T, H] residual stream before this layer (read when HAS_RESIDUAL)
    res_out_ptr,    # [T, H] residual + x, written by the head-0 programs (when HAS_RESIDUAL)
    norm_w_ptr,     # [H] input RMSNorm weight
    w_ptr,          # [(HQ + 2 HK) * D, H] qkv weight: dense values, or NVFP4 packed bytes [.., H/2]
    w_scales_ptr,   # NVFP4 block scales [(HQ + 2 HK) * D, H/16] (when FP4)
    w_scale_ptr,    # NVFP4 global scale, per row (stride_gn 1) or per tensor (0) (when FP4)
    q_norm_ptr,     # [D]
    k_norm_ptr,     # [D]
    positions_ptr,  # [T] int
    cos_sin_ptr,    # [max_pos, D] fp32 (read when USE_ROPE)
    slots_ptr,      # [T] int64, -1 = no write (read when WRITE_CACHE)
    q_ptr,          # [T, HQ, D]
    k_ptr,          # [T, HK, D]
    v_ptr,          # [T, HK, D]
    k_cache_ptr,    # [num_slots, HK, D]
    v_cache_ptr,    # [num_slots, HK, D]
    part_ptr,       # [SPLIT, HQ + 2 HK, BLOCK_T, D] fp32 partial sums (when SPLIT > 1)
    counter_ptr,    # [HQ + 2 HK] int32, zero between launches
    T, H, eps, k_per_split, stride_wn, stride_sn, stride_gn,
    HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, MASK_K: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, USE_ROPE: tl.constexpr, WRITE_CACHE: tl.constexpr, FP4: tl.constexpr,
    DOT_FP32: tl.constexpr, NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    head = tl.program_id(0)
    s = tl.program_id(1)
    HALF: tl.constexpr = D // 2
    dtype = x_ptr.dtype.element_ty
    toks = tl.arange(0, BLOCK_T)
    tmask = toks < T

    # prologue: every program needs the RMS of the whole residual-added rows (a few KB, from L2)
    rstd = residual_rstd(x_ptr, res_in_ptr, norm_w_ptr, toks, tmask, H, eps, HAS_RESIDUAL, BLOCK_K)

    # this head's D rows over this split's k range, as two halves (rotate-half RoPE pairs them)
    rows1 = head * D + tl.arange(0, HALF)
    rows2 = rows1 + HALF
    all_rows = rows1 >= 0
    acc1 = tl.zeros([BLOCK_T, HALF], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_T, HALF], dtype=tl.float32)
    k_lo = s * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, H)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
        n, a, off, m = residual_norm_tile(x_ptr, res_in_ptr, norm_w_ptr, toks, tmask, k0, H, rstd, HAS_RESIDUAL,
                                    BLOCK_K)
        if HAS_RESIDUAL:
            if head == 0:
                tl.store(res_out_ptr + off, a, mask=m)
        w1 = weight_tile(w_ptr, w_scales_ptr, rows1, all_rows, k0, H, stride_wn, stride_sn, BLOCK_K, MASK_K, FP4)
        w2 = weight_tile(w_ptr, w_scales_ptr, rows2, all_rows, k0, H, stride_wn, stride_sn, BLOCK_K, MASK_K, FP4)
        if DOT_FP32:
            acc1 += tl.dot(n.to(tl.float32), tl.trans(w1.to(tl.float32)))
            acc2 += tl.dot(n.to(tl.float32), tl.trans(w2.to(tl.float32)))
        else:  # an NVFP4 tile (E2M1 x block scale) is exact in bf16
            acc1 += tl.dot(n, tl.trans(w1.to(dtype)))
            acc2 += tl.dot(n, tl.trans(w2.to(dtype)))
    if FP4:  # the global scale, once per output row
        acc1 *= tl.load(w_scale_ptr + rows1 * stride_gn)[None, :]
        acc2 *= tl.load(w_scale_ptr + rows2 * stride_gn)[None, :]

    half = tl.arange(0, HALF)[None, :]
    if SPLIT > 1:  # the last of the head's programs to arrive sums the partials (split order) and finishes
        base = part_ptr + head * (BLOCK_T * D) + toks[:, None] * D + half
        tl.store(base + s * ((HQ + 2 * HK) * BLOCK_T * D), acc1)
        tl.store(base + s * ((HQ + 2 * HK) * BLOCK_T * D) + HALF, acc2)
        if not last_to_arrive(counter_ptr + head, SPLIT):
            return
        acc1 = tl.zeros([BLOCK_T, HALF], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_T, HALF], dtype=tl.float32)
        for i in tl.static_range(SPLIT):
            acc1 += tl.load(base + i * ((HQ + 2 * HK) * BLOCK_T * D), cache_modifier=".cg")
            acc2 += tl.load(base + i * ((HQ + 2 * HK) * BLOCK_T * D) + HALF, cache_modifier=".cg")
    y1 = acc1.to(dtype)  # the linear's output rounding
    y2 = acc2.to(dtype)

    out_mask = tmask[:, None]
    if head < HQ + HK:  # a Q or K head: per-head RMSNorm, then RoPE
        y1f, y2f = y1.to(tl.float32), y2.to(tl.float32)
        hr = tl.rsqrt((tl.sum(y1f * y1f, axis=1) + tl.sum(y2f * y2f, axis=1)) / D + eps)[:, None]
        if head < HQ:
            wp = q_norm_ptr
        else:
            wp = k_norm_ptr
        g1 = tl.load(wp + half).to(dtype).to(tl.float32)
        g2 = tl.load(wp + HALF + half).to(dtype).to(tl.float32)
        y1 = ((y1f * hr).to(dtype).to(tl.float32) * g1).to(dtype)
        y2 = ((y2f * hr).to(dtype).to(tl.float32) * g2).to(dtype)
        if USE_ROPE:
            pos = tl.load(positions_ptr + toks, mask=tmask, other=0).to(tl.int64)
            cs = cos_sin_ptr + pos[:, None] * D + half
            cos = tl.load(cs, mask=out_mask, other=1.0)
            sin = tl.load(cs + HALF, mask=out_mask, other=0.0)
            y1f, y2f = y1.to(tl.float32), y2.to(tl.float32)
            y1 = (y1f * cos - y2f * sin).to(dtype)
            y2 = (y2f * cos + y1f * sin).to(dtype)
        if head < HQ:
            dst = q_ptr + toks[:, None] * (HQ * D) + head * D + half
            tl.store(dst, y1, mask=out_mask)
            tl.store(dst + HALF, y2, mask=out_mask)
        else:
            dst = k_ptr + toks[:, None] * (HK * D) + (head - HQ) * D + half
            tl.store(dst, y1, mask=out_mask)
            tl.store(dst + HALF, y2, mask=out_mask)
            if WRITE_CACHE:
                slot = tl.load(slots_ptr + toks, mask=tmask, other=-1)
                cdst = k_cache_ptr + tl.maximum(slot, 0)[:, None] * (HK * D) + (head - HQ) * D + half
                wmask = out_mask & (slot >= 0)[:, None]
                tl.store(cdst, y1.to(k_cache_ptr.dtype.element_ty), mask=wmask)
                tl.store(cdst + HALF, y2.to(k_cache_ptr.dtype.element_ty), mask=wmask)
    else:  # a V head
        vh = head - HQ - HK
        dst = v_ptr + toks[:, None] * (HK * D) + vh * D + half
        tl.store(dst, y1, mask=out_mask)
        tl.store(dst + HALF, y2, mask=out_mask)
        if WRITE_CACHE:
            slot = tl.load(slots_ptr + toks, mask=tmask, other=-1)
            cdst = v_cache_ptr + tl.maximum(slot, 0)[:, None] * (HK * D) + vh * D + half
            wmask = out_mask & (slot >= 0)[:, None]
            tl.store(cdst, y1.to(v_cache_ptr.dtype.element_ty), mask=wmask)
            tl.store(cdst + HALF, y2.to(v_cache_ptr.dtype.element_ty), mask=wmask)


def norm_qkv_rope(x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor, eps: float,
                  qkv_w, q_norm_w: torch.Tensor, k_norm_w: torch.Tensor,
                  positions: torch.Tensor, cos_sin: torch.Tensor | None, num_q_heads: int, num_kv_heads: int,
                  k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                  slot_mapping: torch.Tensor | None = None):
    """-> (q [T, Hq, D], k [T, Hk, D], v [T, Hk, D], new residual [T, H]: residual + x, or x when
    residual is None). T <= MAX_TOKENS; qkv_w dense [(Hq + 2 Hk) D, H] or NVFP4 (nvfp4.py)."""
    t, h, d, write = _check_inputs(x, residual, norm_w, qkv_w, q_norm_w, num_q_heads, num_kv_heads,
                                   k_cache, v_cache, slot_mapping)
    hq, hk = num_q_heads, num_kv_heads
    heads = hq + 2 * hk
    q = torch.empty((t, hq, d), dtype=x.dtype, device=x.device)
    k = torch.empty((t, hk, d), dtype=x.dtype, device=x.device)
    v = torch.empty((t, hk, d), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else x
    block_k = min(BLOCK_K, triton.next_power_of_2(h))
    k_blocks = triton.cdiv(h, block_k)
    split = pick_splits(heads, k_blocks, x.device)  # a head alone is too little work for batch 1
    k_per_split = triton.cdiv(k_blocks, split) * block_k
    split = triton.cdiv(h, k_per_split)
    part = torch.empty((split, heads, 16, d), dtype=torch.float32, device=x.device) if split > 1 else q
    fp4 = is_nvfp4(qkv_w)
    w = weight_args("w", qkv_w)
    _norm_qkv_rope_kernel[(heads, split)](
        x_ptr=x, res_in_ptr=residual if residual is not None else x, res_out_ptr=res_out,
        norm_w_ptr=norm_w, w_ptr=w["w_ptr"], w_scales_ptr=w["w_scales_ptr"], w_scale_ptr=w["w_scale_ptr"],
        q_norm_ptr=q_norm_w, k_norm_ptr=k_norm_w,
        positions_ptr=positions, cos_sin_ptr=cos_sin if cos_sin is not None else norm_w,
        slots_ptr=slot_mapping if write else positions,
        q_ptr=q, k_ptr=k, v_ptr=v,
        k_cache_ptr=k_cache if write else q, v_cache_ptr=v_cache if write else q,
        part_ptr=part, counter_ptr=arrival_counters(heads, x.device),
        T=t, H=h, eps=eps, k_per_split=k_per_split,
        stride_wn=w["w_sn"], stride_sn=w["w_ssn"], stride_gn=w["w_sgn"],
        HQ=hq, HK=hk, D=d, BLOCK_T=16, BLOCK_K=block_k, SPLIT=split, MASK_K=h % block_k != 0,
        HAS_RESIDUAL=residual is not None, USE_ROPE=cos_sin is not None, WRITE_CACHE=write, FP4=fp4,
        DOT_FP32=DOT_FP32, NUM_STAGES=3, **launch_args(x.device), num_warps=4,
    )
    return q, k, v, res_out


def norm_qkv_rope_torch(x, residual, norm_w, eps, qkv_w, q_norm_w, k_norm_w, positions, cos_sin,
                        num_q_heads, num_kv_heads, k_cache=None, v_cache=None, slot_mapping=None):
    """Same signature and semantics as `norm_qkv_rope`: the unfused ops in sequence."""
    res_out = None if residual is None else residual.clone()
    h = rms_norm_torch(x, norm_w, eps, residual=res_out)
    qkv = nvfp4_linear_torch(h, qkv_w) if is_nvfp4(qkv_w) else F.linear(h, qkv_w)
    q, k, v = qk_norm_rope_torch(qkv, q_norm_w, k_norm_w, positions, cos_sin, eps,
                                 num_q_heads, num_kv_heads, k_cache, v_cache, slot_mapping)
    return q, k, v.contiguous(), x if res_out is None else res_out


def _check_inputs(x, residual, norm_w, qkv_w, q_norm_w, hq, hk, k_cache, v_cache, slot_mapping):
    if x.dim() != 2 or not x.is_contiguous() or x.shape[0] > MAX_TOKENS:
        raise ValueError(f"norm_qkv_rope: x has shape {tuple(x.shape)}, expected contiguous [T <= {MAX_TOKENS}, H]")
    t, h = x.shape
    d = q_norm_w.shape[0]
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(f"norm_qkv_rope: residual has shape {tuple(residual.shape)}, expected {tuple(x.shape)}")
    shape = check_nvfp4("norm_qkv_rope", qkv_w) if is_nvfp4(qkv_w) else tuple(qkv_w.shape)
    if norm_w.shape != (h,) or tuple(shape) != ((hq + 2 * hk) * d, h) or (
            not is_nvfp4(qkv_w) and not qkv_w.is_contiguous()):
        raise ValueError(f"norm_qkv_rope: norm_w {tuple(norm_w.shape)} and qkv_w {tuple(shape)}, expected "
                         f"({h},) and contiguous ({(hq + 2 * hk) * d}, {h})")
    if d % 32:
        raise ValueError(f"norm_qkv_rope: head_dim {d}, expected a multiple of 32")
    write = k_cache is not None and slot_mapping is not None
    if write and (slot_mapping.shape != (t,) or slot_mapping.dtype != torch.int64
                  or k_cache.shape[-2:] != (hk, d) or v_cache.shape != k_cache.shape):
        raise ValueError(f"norm_qkv_rope: slot_mapping {slot_mapping.dtype} {tuple(slot_mapping.shape)}, caches "
                         f"{tuple(k_cache.shape)}: expected int64 ({t},) and [..., {hk}, {d}]")
    return t, h, d, write
