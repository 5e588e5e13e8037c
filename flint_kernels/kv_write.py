"""A step's K/V rows written into a cache at their slots: what a sliding-window layer does after its
prefill attention (its ring write waits until the chunk's own tokens have read the ring), and the
prefix cache's window pages. One program a token; slot -1 skips the token.

With an FP8 cache (kv_scales (k_scale, v_scale), fp8_kv.py) the rows are stored as the E4M3
codes of k / k_scale and v / v_scale: exact for qk_norm_rope's quantised k and v, which are on
that grid; other values round half to even and saturate (fp8_kv.e4m3_round).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8_kv import FP8_DTYPE, check_scale, e4m3_round, index_copy_rows, quantize_torch
from .pdl import launch_args, pdl_prologue


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr,              # [N, Hk, D], unit stride in D
    k_cache_ptr, v_cache_ptr,  # [num_slots, Hk, D] contiguous
    slots_ptr,                 # [N] int64, -1: not written
    stride_kt, stride_kh, stride_vt, stride_vh, k_scale, v_scale,
    HK: tl.constexpr, D: tl.constexpr, HK_PAD: tl.constexpr, KV_FP8: tl.constexpr, PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t)
    if slot < 0:
        return
    heads = tl.arange(0, HK_PAD)
    cols = tl.arange(0, D)
    mask = (heads < HK)[:, None]
    k = tl.load(k_ptr + t * stride_kt + heads[:, None] * stride_kh + cols[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + heads[:, None] * stride_vh + cols[None, :], mask=mask)
    if KV_FP8:
        k = e4m3_round(k.to(tl.float32) / k_scale)
        v = e4m3_round(v.to(tl.float32) / v_scale)
    row = slot * (HK * D) + heads[:, None] * D + cols[None, :]
    tl.store(k_cache_ptr + row, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + row, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kv_write(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor, kv_scales: tuple[float, float] | None = None) -> None:
    """k, v [N, Hk, D] -> k_cache, v_cache [..., Hk, D] (e.g. [rows, R, Hk, D]: slot = row * R +
    position) at slots [N] int64 (-1: skipped). kv_scales: FP8 caches."""
    check_kv_write_inputs(k, v, k_cache, v_cache, slots, kv_scales)
    n, hk, d = k.shape
    if n == 0:
        return
    _kv_write_kernel[(n,)](
        k_ptr=k, v_ptr=v, k_cache_ptr=k_cache, v_cache_ptr=v_cache, slots_ptr=slots,
        stride_kt=k.stride(0), stride_kh=k.stride(1), stride_vt=v.stride(0), stride_vh=v.stride(1),
        k_scale=kv_scales[0] if kv_scales else 1.0, v_scale=kv_scales[1] if kv_scales else 1.0,
        HK=hk, D=d, HK_PAD=triton.next_power_of_2(hk), KV_FP8=kv_scales is not None,
        **launch_args(k.device), num_warps=4)


def kv_write_torch(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slots: torch.Tensor, kv_scales: tuple[float, float] | None = None) -> None:
    """Same signature and semantics as `kv_write`."""
    check_kv_write_inputs(k, v, k_cache, v_cache, slots, kv_scales)
    keep = slots >= 0
    idx = slots[keep]
    k, v = k[keep], v[keep]
    if kv_scales is not None:
        k, v = quantize_torch(k, kv_scales[0]), quantize_torch(v, kv_scales[1])
    index_copy_rows(k_cache.view(-1, *k.shape[1:]), idx, k.to(k_cache.dtype))
    index_copy_rows(v_cache.view(-1, *v.shape[1:]), idx, v.to(v_cache.dtype))


def check_kv_write_inputs(k, v, k_cache, v_cache, slots, kv_scales) -> None:
    """Shapes, dtypes and layouts only (never reads device values)."""
    if k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"kv_write: k {tuple(k.shape)} and v {tuple(v.shape)}, expected one shape [N, Hk, D]")
    n, hk, d = k.shape
    for name, x in (("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"kv_write: {name} has strides {x.stride()}, expected unit stride in D")
    cache_dtype = FP8_DTYPE if kv_scales is not None else k.dtype
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.shape[-2:] != (hk, d) or not cache.is_contiguous():
            raise ValueError(f"kv_write: {name} is {tuple(cache.shape)}, expected contiguous [..., {hk}, {d}]")
        if cache.dtype != cache_dtype:
            raise ValueError(f"kv_write: {name} is {cache.dtype}, expected {cache_dtype}"
                             + (" (kv_scales given: FP8 KV)" if kv_scales is not None else " (k's dtype)"))
    if slots.shape != (n,) or slots.dtype != torch.int64:
        raise ValueError(f"kv_write: slots is {slots.dtype} {tuple(slots.shape)}, expected int64 ({n},)")
    if kv_scales is not None:
        check_scale("kv_write: kv_scales[0] (k_scale)", kv_scales[0])
        check_scale("kv_write: kv_scales[1] (v_scale)", kv_scales[1])
