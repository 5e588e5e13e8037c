"""Fused per-head Q/K RMSNorm + NeoX RoPE + KV-cache write, one launch per layer.

qkv rows are [q heads | k heads | v heads], each head D wide. `cos_sin [max_pos, D]` fp32 holds
cos in its first D/2 columns and sin in the last D/2; None means no RoPE (the NoPE
full-attention layers). V passes through. With caches, k (normed, roped) and v are also written
to `cache.view(-1, Hk, D)[slot]` for every token whose slot is not -1.
With FP8 KV (`kv_scales` (k_scale, v_scale), fp8_kv.py) k and v are quantised: the cache gets
their E4M3 codes, and the k and v handed out (v then a new tensor) are the codes times the
scales, the values every later reader of the cache sees.

Numerics: each Q and K head is normalised as transformers' FlintRMSNorm (rms_norm.py: fp32
statistics, the weight applied in fp32, one rounding to the input dtype), then rotated in fp32
from the fp32 table, `x1 * cos - x2 * sin | x2 * cos + x1 * sin`, rounded once (vLLM's reference
runtime). Differences from transformers in bf16: transformers rounds the same fp32 cos/sin to
bf16 and rounds each product and the sum of the rotation to bf16; the sum of squares is reduced
in another order. In fp32 the two agree up to that order.

Grid (token, head block): the blocks of a token are ceil(Hq / BLOCK_Q) Q blocks, then
ceil(Hk / BLOCK_K) K blocks, then (with caches) as many V-copy blocks. At decode a block is
one head (40 programs for 32 + 4 + 4 heads at batch 1, each a few hundred bytes: the kernel
costs its launch and two dependent loads, position then cos/sin row); at prefill a block
holds all of a token's Q heads, as one program per token did before. The grid depends only
on N and the head counts, so a captured CUDA graph replays it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_args, pdl_prologue
from .fp8_kv import FP8_DTYPE, check_scale, dequantize_torch, e4m3_round, quantize_torch
from .kv_write import kv_write_torch
from .rms_norm import normed_by
from .tuning import INTERPRET

# programs a launch aims for (decode: one head each); prefill widens blocks to whole tokens. The
# interpreter pays per program, not per head: there one program takes a token's heads (the head
# blocks themselves are tested at every width: test_qk_norm_rope.py)
TARGET_PROGRAMS = 1 if INTERPRET else 1024
ELEMS_PER_WARP = 512  # [heads, D] elements per warp (16 a thread): one warp per 4 heads of D=128


@triton.jit
def _norm_rope_heads(
    src_ptr,      # [heads, D] from this block's first head (row of qkv)
    dst_ptr,      # [heads, D] from this block's first head (row of q or k), contiguous
    w1, w2,       # [1, D/2] each: the norm weight's halves (loaded)
    cos, sin,     # [1, D/2] fp32 each at this token's position (loaded when USE_ROPE)
    cache_ptr,    # [heads, D] this block's cache rows (written when WRITE_CACHE and write)
    n_heads, write, eps, scale, inv_scale,  # scales: FP8 KV (KV_FP8) only
    D: tl.constexpr, BLOCK_HEADS: tl.constexpr,
    USE_ROPE: tl.constexpr, WRITE_CACHE: tl.constexpr, KV_FP8: tl.constexpr,
):
    HALF: tl.constexpr = D // 2
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    cols = tl.arange(0, HALF)[None, :]
    mask = heads < n_heads
    off = heads * D + cols  # first half of each head; + HALF for the second
    x1 = tl.load(src_ptr + off, mask=mask, other=0.0)
    x2 = tl.load(src_ptr + off + HALF, mask=mask, other=0.0)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1f * x1f, axis=1) + tl.sum(x2f * x2f, axis=1)) / D + eps)[:, None]
    # FlintRMSNorm: the weight applied in fp32, one rounding (rms_norm.normed_by)
    y1 = normed_by(x1, w1, rstd)
    y2 = normed_by(x2, w2, rstd)
    if USE_ROPE:
        y1f, y2f = y1.to(tl.float32), y2.to(tl.float32)
        y1 = (y1f * cos - y2f * sin).to(x1.dtype)
        y2 = (y2f * cos + y1f * sin).to(x1.dtype)
    c1 = y1
    c2 = y2
    if KV_FP8:  # E4M3 codes; the values handed out are code * scale (exact: a power of two)
        c1 = e4m3_round(y1.to(tl.float32) * inv_scale)
        c2 = e4m3_round(y2.to(tl.float32) * inv_scale)
        y1 = (c1 * scale).to(x1.dtype)
        y2 = (c2 * scale).to(x1.dtype)
    tl.store(dst_ptr + off, y1, mask=mask)
    tl.store(dst_ptr + off + HALF, y2, mask=mask)
    if WRITE_CACHE:
        cache_ty = cache_ptr.dtype.element_ty
        tl.store(cache_ptr + off, c1.to(cache_ty), mask=mask & write)
        tl.store(cache_ptr + off + HALF, c2.to(cache_ty), mask=mask & write)


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr,        # [N, (Hq + 2 Hk) * D], unit stride in the last dim
    q_weight_ptr,   # [D]
    k_weight_ptr,   # [D]
    positions_ptr,  # [N] int
    cos_sin_ptr,    # [max_pos, D] fp32 (read when USE_ROPE)
    slots_ptr,      # [N] int64, -1 = no write (read when WRITE_CACHE)
    q_ptr,          # [N, Hq, D] contiguous
    k_ptr,          # [N, Hk, D] contiguous
    v_ptr,          # [N, Hk, D] contiguous (written when KV_FP8: the quantised v)
    k_cache_ptr,    # [num_slots, Hk, D] contiguous (written when WRITE_CACHE)
    v_cache_ptr,    # [num_slots, Hk, D] contiguous
    stride_qkv, eps, k_scale, k_inv, v_scale, v_inv,
    HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_ROPE: tl.constexpr, WRITE_CACHE: tl.constexpr, KV_FP8: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (token, block of heads: Q blocks, then K blocks, then V blocks when WRITE_CACHE
    or KV_FP8).
    The norm weight, the token's cos | sin row and cache slot (weights, and metadata the host
    writes before the step) are loaded before the PDL prologue (pdl.py), the heads after it."""
    Q_BLOCKS: tl.constexpr = (HQ + BLOCK_Q - 1) // BLOCK_Q
    K_BLOCKS: tl.constexpr = (HK + BLOCK_K - 1) // BLOCK_K
    HALF: tl.constexpr = D // 2
    tok = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    row = qkv_ptr + tok * stride_qkv
    half = tl.arange(0, HALF)[None, :]
    weight_ptr = tl.where(blk < Q_BLOCKS, q_weight_ptr, k_weight_ptr)
    w1 = tl.load(weight_ptr + half)
    w2 = tl.load(weight_ptr + half + HALF)
    cos = 1.0
    sin = 0.0
    if USE_ROPE:
        cos_row = cos_sin_ptr + tl.load(positions_ptr + tok).to(tl.int64) * D
        cos = tl.load(cos_row + half)
        sin = tl.load(cos_row + half + HALF)
    slot = tl.load(slots_ptr + tok).to(tl.int64) if WRITE_CACHE else tok
    pdl_prologue(PDL)
    if blk < Q_BLOCKS:
        h0 = blk * BLOCK_Q
        _norm_rope_heads(row + h0 * D, q_ptr + (tok * HQ + h0) * D, w1, w2, cos, sin, q_ptr,
                         HQ - h0, False, eps, 1.0, 1.0,
                         D=D, BLOCK_HEADS=BLOCK_Q, USE_ROPE=USE_ROPE, WRITE_CACHE=False, KV_FP8=False)
    elif blk < Q_BLOCKS + K_BLOCKS:
        h0 = (blk - Q_BLOCKS) * BLOCK_K
        _norm_rope_heads(row + (HQ + h0) * D, k_ptr + (tok * HK + h0) * D, w1, w2, cos, sin,
                         k_cache_ptr + (tl.maximum(slot, 0) * HK + h0) * D, HK - h0, slot >= 0, eps,
                         k_scale, k_inv,
                         D=D, BLOCK_HEADS=BLOCK_K, USE_ROPE=USE_ROPE, WRITE_CACHE=WRITE_CACHE, KV_FP8=KV_FP8)
    elif WRITE_CACHE or KV_FP8:  # V block: a copy into the cache (FP8: quantised, and handed out)
        h0 = (blk - Q_BLOCKS - K_BLOCKS) * BLOCK_K
        heads = tl.arange(0, BLOCK_K)[:, None]
        off = heads * D + tl.arange(0, D)[None, :]
        in_heads = heads < HK - h0
        v = tl.load(row + (HQ + HK + h0) * D + off, mask=in_heads)
        code = v
        if KV_FP8:
            code = e4m3_round(v.to(tl.float32) * v_inv)
            tl.store(v_ptr + (tok * HK + h0) * D + off, (code * v_scale).to(v.dtype), mask=in_heads)
        if WRITE_CACHE:
            tl.store(v_cache_ptr + (tl.maximum(slot, 0) * HK + h0) * D + off,
                     code.to(v_cache_ptr.dtype.element_ty), mask=in_heads & (slot >= 0))


def qk_norm_rope(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 positions: torch.Tensor, cos_sin: torch.Tensor | None, eps: float,
                 num_q_heads: int, num_kv_heads: int,
                 k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                 slot_mapping: torch.Tensor | None = None, *, heads_per_program: int | None = None,
                 kv_scales: tuple[float, float] | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [N, (Hq+2Hk)*D] -> q [N, Hq, D], k [N, Hk, D] (new tensors), v [N, Hk, D] (a view of qkv;
    with kv_scales a new tensor of the quantised v).

    heads_per_program: Q heads per program, a power of two (K/V blocks take as many, at most Hk);
    None: one at decode, wider as N grows (about TARGET_PROGRAMS programs).
    kv_scales: (k_scale, v_scale), powers of two: FP8 KV (caches, if given, float8_e4m3fn)."""
    n, d, write = check_inputs(qkv, q_weight, k_weight, positions, cos_sin, num_q_heads,
                               num_kv_heads, k_cache, v_cache, slot_mapping, kv_scales=kv_scales)
    q = torch.empty((n, num_q_heads, d), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((n, num_kv_heads, d), dtype=qkv.dtype, device=qkv.device)
    fp8 = kv_scales is not None
    if fp8:
        v = torch.empty((n, num_kv_heads, d), dtype=qkv.dtype, device=qkv.device)
    else:
        v = qkv[:, (num_q_heads + num_kv_heads) * d:].view(n, num_kv_heads, d)
    if n == 0:
        return q, k, v
    block_q = _heads_per_program(n, num_q_heads, heads_per_program)
    block_k = min(block_q, triton.next_power_of_2(num_kv_heads))
    blocks = triton.cdiv(num_q_heads, block_q) + triton.cdiv(num_kv_heads, block_k) * (2 if write or fp8 else 1)
    k_scale, v_scale = kv_scales or (1.0, 1.0)
    _qk_norm_rope_kernel[(n, blocks)](
        qkv_ptr=qkv, q_weight_ptr=q_weight, k_weight_ptr=k_weight, positions_ptr=positions,
        cos_sin_ptr=cos_sin if cos_sin is not None else qkv,
        slots_ptr=slot_mapping if write else positions,
        q_ptr=q, k_ptr=k, v_ptr=v,
        k_cache_ptr=k_cache if write else k, v_cache_ptr=v_cache if write else k,
        stride_qkv=qkv.stride(0), eps=eps, k_scale=k_scale, k_inv=1.0 / k_scale, v_scale=v_scale,
        v_inv=1.0 / v_scale,
        HQ=num_q_heads, HK=num_kv_heads, D=d, BLOCK_Q=block_q, BLOCK_K=block_k,
        USE_ROPE=cos_sin is not None, WRITE_CACHE=write, KV_FP8=fp8, **launch_args(qkv.device),
        num_warps=min(4, triton.next_power_of_2(triton.cdiv(block_q * d, ELEMS_PER_WARP))),
    )
    return q, k, v


def _heads_per_program(n: int, hq: int, asked: int | None) -> int:
    if asked is None:
        return min(triton.next_power_of_2(triton.cdiv(n * hq, TARGET_PROGRAMS)), triton.next_power_of_2(hq))
    if asked < 1 or asked & (asked - 1):
        raise ValueError(f"qk_norm_rope: heads_per_program {asked}, expected a power of two >= 1")
    return min(asked, triton.next_power_of_2(hq))


def qk_norm_rope_torch(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                       positions: torch.Tensor, cos_sin: torch.Tensor | None, eps: float,
                       num_q_heads: int, num_kv_heads: int,
                       k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                       slot_mapping: torch.Tensor | None = None, *,
                       kv_scales: tuple[float, float] | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same signature and semantics as `qk_norm_rope`, in plain torch."""
    n, d, write = check_inputs(qkv, q_weight, k_weight, positions, cos_sin, num_q_heads,
                               num_kv_heads, k_cache, v_cache, slot_mapping, kv_scales=kv_scales)
    hq, hk = num_q_heads, num_kv_heads
    q = _norm(qkv[:, :hq * d].reshape(n, hq, d), q_weight, eps)  # [N, Hq, D]
    k = _norm(qkv[:, hq * d:(hq + hk) * d].reshape(n, hk, d), k_weight, eps)  # [N, Hk, D]
    v = qkv[:, (hq + hk) * d:].view(n, hk, d)
    if cos_sin is not None:
        cs = cos_sin[positions.long()][:, None, :]  # [N, 1, D]
        q, k = _rope(q, cs), _rope(k, cs)
    else:
        q, k = q.contiguous(), k.contiguous()
    if kv_scales is not None:  # the values on the E4M3 grid: the cache gets their codes exactly
        k = dequantize_torch(quantize_torch(k, kv_scales[0]), kv_scales[0], k.dtype)
        v = dequantize_torch(quantize_torch(v, kv_scales[1]), kv_scales[1], v.dtype)
    if write:
        kv_write_torch(k, v, k_cache, v_cache, slot_mapping, kv_scales)
    return q, k, v


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [N, heads, D] -> FlintRMSNorm over D (fp32, one rounding to x's dtype)."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    return (weight.to(xf.dtype) * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def _rope(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, D], cos_sin [N, 1, D] fp32 -> rotated x in x's dtype."""
    half = x.shape[-1] // 2
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    cos, sin = cos_sin[..., :half].to(xf.dtype), cos_sin[..., half:].to(xf.dtype)
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def check_inputs(qkv, q_weight, k_weight, positions, cos_sin, hq, hk, k_cache, v_cache, slot_mapping,
                 name: str = "qk_norm_rope", kv_scales: tuple[float, float] | None = None):
    """-> (N, head_dim, whether the cache is written); ValueError naming `name` and the field."""
    if qkv.dim() != 2 or qkv.stride(-1) != 1:
        raise ValueError(f"{name}: qkv has shape {tuple(qkv.shape)} strides {qkv.stride()}, "
                         "expected [N, (Hq + 2*Hk) * D] with unit stride in the last dim")
    n, width = qkv.shape
    if hq <= 0 or hk <= 0 or width % (hq + 2 * hk):
        raise ValueError(f"{name}: qkv width {width} with num_q_heads={hq}, num_kv_heads={hk}, "
                         "expected a multiple of Hq + 2*Hk")
    d = width // (hq + 2 * hk)
    if d % 2 or d & (d - 1):
        raise ValueError(f"{name}: head_dim {d}, expected a power of two (RoPE rotates halves)")
    for field, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if w.shape != (d,) or not w.is_contiguous():
            raise ValueError(f"{name}: {field} has shape {tuple(w.shape)}, expected contiguous ({d},)")
    if positions.shape != (n,):
        raise ValueError(f"{name}: positions has shape {tuple(positions.shape)}, expected ({n},)")
    if cos_sin is not None and (cos_sin.dim() != 2 or cos_sin.shape[1] != d
                                or cos_sin.dtype != torch.float32 or not cos_sin.is_contiguous()):
        raise ValueError(f"{name}: cos_sin is {cos_sin.dtype} {tuple(cos_sin.shape)}, "
                         f"expected contiguous float32 [max_pos, {d}]")
    given = [x is not None for x in (k_cache, v_cache, slot_mapping)]
    if any(given) and not all(given):
        raise ValueError(f"{name}: k_cache, v_cache and slot_mapping go together; "
                         f"got k_cache={given[0]}, v_cache={given[1]}, slot_mapping={given[2]}")
    if all(given):
        for field, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if cache.shape[-2:] != (hk, d) or not cache.is_contiguous():
                raise ValueError(f"{name}: {field} has shape {tuple(cache.shape)}, "
                                 f"expected contiguous [..., {hk}, {d}]")
        fp8 = kv_scales is not None
        for field, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if (cache.dtype == FP8_DTYPE) != fp8:
                raise ValueError(f"{name}: {field} is {cache.dtype}, expected "
                                 + ("float8_e4m3fn with kv_scales" if fp8 else "no float8 cache without kv_scales"))
        if slot_mapping.shape != (n,) or slot_mapping.dtype != torch.int64:
            raise ValueError(f"{name}: slot_mapping is {slot_mapping.dtype} "
                             f"{tuple(slot_mapping.shape)}, expected int64 ({n},)")
    if kv_scales is not None:
        check_scale(f"{name}: kv_scales[0] (k_scale)", kv_scales[0])
        check_scale(f"{name}: kv_scales[1] (v_scale)", kv_scales[1])
    return n, d, all(given)
