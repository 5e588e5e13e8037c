"""Low-latency decode: residual add + post-attention RMSNorm + router logits, one launch.

Programs split the E router rows; each recomputes the token rows' RMS (a few KB from L2) and
program 0 writes the normalised activations and the updated residual. The logits stay fp32;
top-k selection happens in the MoE kernel's prologue (`moe_decode`), which needs no extra launch.

Semantics = `norm_router_torch`: rms_norm(x, norm_w, eps, residual) then fp32 logits h @ W.T.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rms_norm import rms_norm_torch

MAX_TOKENS = 16


@triton.jit
def _norm_router_kernel(
    x_ptr,         # [T, H] attention output
    res_in_ptr,    # [T, H]
    res_out_ptr,   # [T, H] residual + x (program 0)
    norm_w_ptr,    # [H]
    router_ptr,    # [E, H]
    h_ptr,         # [T, H] normalised activations (program 0)
    logits_ptr,    # [T, E] fp32
    T, H, E, eps,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    dtype = x_ptr.dtype.element_ty
    toks = tl.arange(0, BLOCK_T)
    tmask = toks < T
    cols = tl.arange(0, BLOCK_K)
    sumsq = tl.zeros([BLOCK_T], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        m = tmask[:, None] & (k0 + cols < H)[None, :]
        off = toks[:, None] * H + k0 + cols[None, :]
        a = (tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
             + tl.load(res_in_ptr + off, mask=m, other=0.0).to(tl.float32)).to(dtype)
        if pid == 0:
            tl.store(res_out_ptr + off, a, mask=m)
        af = a.to(tl.float32)
        sumsq += tl.sum(af * af, axis=1)
    rstd = tl.rsqrt(sumsq / H + eps)[:, None]

    experts = pid * BLOCK_E + tl.arange(0, BLOCK_E)
    emask = experts < E
    acc = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        kmask = (k0 + cols) < H
        m = tmask[:, None] & kmask[None, :]
        off = toks[:, None] * H + k0 + cols[None, :]
        a = (tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
             + tl.load(res_in_ptr + off, mask=m, other=0.0).to(tl.float32)).to(dtype)
        nw = tl.load(norm_w_ptr + k0 + cols, mask=kmask, other=0.0).to(dtype)
        n = ((a.to(tl.float32) * rstd).to(dtype).to(tl.float32) * nw.to(tl.float32)[None, :]).to(dtype)
        if pid == 0:
            tl.store(h_ptr + off, n, mask=m)
        w = tl.load(router_ptr + experts[:, None] * H + k0 + cols[None, :],
                    mask=emask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        # fp32 logits: [T, 1, K] x [1, E, K] summed over K (tiny tiles; exact fp32 products)
        acc += tl.sum(n.to(tl.float32)[:, None, :] * w[None, :, :], axis=2)
    tl.store(logits_ptr + toks[:, None] * E + experts[None, :], acc, mask=tmask[:, None] & emask[None, :])


def norm_router(x: torch.Tensor, residual: torch.Tensor, norm_w: torch.Tensor, eps: float,
                router_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, residual [T, H] -> (h = rms_norm(residual + x) [T, H], residual + x [T, H], logits [T, E] fp32)."""
    t, h, e = _check_inputs(x, residual, norm_w, router_w)
    normed, res_out = torch.empty_like(x), torch.empty_like(x)
    logits = torch.empty((t, e), dtype=torch.float32, device=x.device)
    block_e = 8
    _norm_router_kernel[(triton.cdiv(e, block_e),)](
        x_ptr=x, res_in_ptr=residual, res_out_ptr=res_out, norm_w_ptr=norm_w, router_ptr=router_w,
        h_ptr=normed, logits_ptr=logits, T=t, H=h, E=e, eps=eps,
        BLOCK_T=triton.next_power_of_2(max(t, 2)), BLOCK_E=block_e, BLOCK_K=min(128, triton.next_power_of_2(h)),
        num_warps=4,
    )
    return normed, res_out, logits


def norm_router_torch(x, residual, norm_w, eps, router_w):
    """Same signature and semantics as `norm_router`."""
    res_out = residual.clone()
    normed = rms_norm_torch(x, norm_w, eps, residual=res_out)
    return normed, res_out, normed.float() @ router_w.float().T


def _check_inputs(x, residual, norm_w, router_w):
    if x.dim() != 2 or not x.is_contiguous() or x.shape[0] > MAX_TOKENS:
        raise ValueError(f"norm_router: x has shape {tuple(x.shape)}, expected contiguous [T <= {MAX_TOKENS}, H]")
    t, h = x.shape
    if residual.shape != x.shape or not residual.is_contiguous() or norm_w.shape != (h,):
        raise ValueError(f"norm_router: residual {tuple(residual.shape)} / norm_w {tuple(norm_w.shape)}, "
                         f"expected {tuple(x.shape)} / ({h},)")
    if router_w.dim() != 2 or router_w.shape[1] != h or not router_w.is_contiguous():
        raise ValueError(f"norm_router: router_w has shape {tuple(router_w.shape)}, expected contiguous [E, {h}]")
    return t, h, router_w.shape[0]
