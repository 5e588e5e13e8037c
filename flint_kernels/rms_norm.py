"""RMSNorm over rows, optionally fused with the residual add that precedes it; and the pieces
every launch with the norm folded in (the decode GEMVs, the router) uses, so all round alike.

Numerics are transformers' FlintRMSNorm: `out = (float(w) * (xf * rsqrt(mean(xf^2) + eps)))
.to(x.dtype)` with xf = float(x): statistics, normalisation and the weight product in fp32, one
rounding at the end. With `residual`, the residual stream is updated first (`residual + x` in
fp32, rounded once to residual's dtype, as transformers' `residual + hidden_states`) and the norm
is taken of the rounded sum. Differences from transformers in bf16: the sum of squares is reduced
in another order (fp32), and rsqrt is the hardware's approximation on a GPU. (vLLM's reference
runtime normalises the unrounded fp32 sum; transformers, our oracle, the rounded one.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_args, pdl_prologue

MAX_HIDDEN = 16384  # one program holds a whole row in registers


@triton.jit
def _rms_norm_kernel(
    x_ptr,         # [T, H]
    weight_ptr,    # [H]
    residual_ptr,  # [T, H], updated in place (only read when HAS_RESIDUAL)
    out_ptr,       # [T, H], contiguous
    stride_x, stride_res,
    H, eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        res = tl.load(residual_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (res.to(tl.float32) + x.to(tl.float32)).to(res.dtype)
        tl.store(residual_ptr + row * stride_res + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * H + cols, normed_by(x, w, rstd), mask=mask)


@triton.jit
def residual_add(x_ptr, res_ptr, offs, mask, HAS_RESIDUAL: tl.constexpr):
    """x at offs, plus the residual stream when HAS_RESIDUAL, rounded to x's dtype like the
    reference's residual add."""
    a = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        a = (a.to(tl.float32) + tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)).to(a.dtype)
    return a


@triton.jit
def scale_normed(a, norm_w_ptr, cols, mask, rstd):
    """rms_norm of a (residual + x) given its rows' rstd, as `_rms_norm_kernel` computes it:
    fp32 throughout, rounded once to a's dtype."""
    return normed_by(a, tl.load(norm_w_ptr + cols, mask=mask, other=0.0), rstd)


@triton.jit
def normed_by(a, nw, rstd):
    """scale_normed with the norm weight nw already loaded (shaped like a, or broadcast to it): a
    kernel loads it before its PDL wait, as a weight (pdl.py)."""
    return (nw.to(tl.float32) * (a.to(tl.float32) * rstd)).to(a.dtype)


@triton.jit
def folded_rstd(x_row, res_row, res_out_row, H, eps, write_res, HAS_RESIDUAL: tl.constexpr,
                BLOCK_H: tl.constexpr):
    """Prologue of a kernel with the residual add + RMSNorm folded in (one token row): -> its fp32
    reciprocal RMS over H columns of residual + x (x alone without HAS_RESIDUAL); stores the
    updated residual row to res_out_row when write_res (one program of the launch does)."""
    _, rstd = folded_row(x_row, res_row, res_out_row, H, eps, write_res, HAS_RESIDUAL, BLOCK_H)
    return rstd


@triton.jit
def folded_row(x_row, res_row, res_out_row, H, eps, write_res, HAS_RESIDUAL: tl.constexpr,
               BLOCK_H: tl.constexpr):
    """folded_rstd, also returning the row it summed: -> (residual + x [BLOCK_H] in x's dtype,
    rstd), for a kernel that normalises the whole row (normed_by) without loading it again."""
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    a = residual_add(x_row, res_row, cols, mask, HAS_RESIDUAL)
    if HAS_RESIDUAL:
        tl.store(res_out_row + cols, a, mask=mask & write_res)
    af = a.to(tl.float32)
    return a, tl.rsqrt(tl.sum(af * af, axis=0) / H + eps)


@triton.jit
def steps_rstd(res_out_row, offs, step, K, eps, write_res, STEPS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
               xa0, xa1, xa2, xa3):
    """folded_rstd from the STEPS (1-4) steps of residual + x a one-split GEMV program loaded,
    which hold all K columns of its row (xa_i at columns offs + i * step, any shape): their
    squares added in-thread across the steps, then one reduction, with no second load of the row
    (nor its registers). Stores the steps to res_out_row when write_res."""
    sq = _squares(xa0)
    if HAS_RESIDUAL:
        tl.store(res_out_row + offs, xa0, mask=write_res)
    if STEPS > 1:
        sq += _squares(xa1)
        if HAS_RESIDUAL:
            tl.store(res_out_row + step + offs, xa1, mask=write_res)
    if STEPS > 2:
        sq += _squares(xa2)
        if HAS_RESIDUAL:
            tl.store(res_out_row + 2 * step + offs, xa2, mask=write_res)
    if STEPS > 3:
        sq += _squares(xa3)
        if HAS_RESIDUAL:
            tl.store(res_out_row + 3 * step + offs, xa3, mask=write_res)
    return tl.rsqrt(tl.sum(tl.reshape(sq, [sq.numel], can_reorder=True), axis=0) / K + eps)


@triton.jit
def _squares(a):
    af = a.to(tl.float32)
    return af * af


@triton.jit
def maybe_folded_rstd(x_row, res_row, res_out_row, K, eps, write_res, NORM: tl.constexpr,
                      HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr):
    """folded_rstd when NORM (a kernel with the RMSNorm folded in optionally), else 1."""
    if NORM:
        return folded_rstd(x_row, res_row, res_out_row, K, eps, write_res, HAS_RESIDUAL, BLOCK_H)
    return 1.0


@triton.jit
def folded_norm(x_row, res_row, norm_w_ptr, offs, mask, rstd, HAS_RESIDUAL: tl.constexpr):
    """Columns `offs` of rms_norm(residual + x) given folded_rstd's rstd, in x's dtype, rounded
    as `_rms_norm_kernel` rounds (its output bits)."""
    return scale_normed(residual_add(x_row, res_row, offs, mask, HAS_RESIDUAL), norm_w_ptr, offs, mask, rstd)


@triton.jit
def step_activations(a, nw, rstd, NORM: tl.constexpr):
    """fp32 activations of a GEMV step from its loaded a (residual_add's x, or residual + x): a,
    or with NORM rms_norm(residual + x) as folded_norm computes it (nw: the loaded norm weight of
    those columns, rstd: the row's)."""
    if NORM:
        a = normed_by(a, nw, rstd)
    return a.to(tl.float32)


@triton.jit
def norm_weight(norm_w_ptr, offs, mask, NORM: tl.constexpr):
    """The norm weight at offs (a kernel's prefetch before its PDL wait) when NORM, else 0."""
    nw = 0.0
    if NORM:
        nw = tl.load(norm_w_ptr + offs, mask=mask, other=0.0)
    return nw


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H], weight [H] -> [T, H] in x's dtype (residual's dtype when given; residual += x)."""
    _check_inputs(x, weight, residual)
    t, h = x.shape
    out_dtype = x.dtype if residual is None else residual.dtype
    out = torch.empty((t, h), dtype=out_dtype, device=x.device)
    if t == 0:
        return out
    block_h = triton.next_power_of_2(h)
    _rms_norm_kernel[(t,)](
        x_ptr=x, weight_ptr=weight, residual_ptr=x if residual is None else residual, out_ptr=out,
        stride_x=x.stride(0), stride_res=0 if residual is None else residual.stride(0),
        H=h, eps=eps,
        HAS_RESIDUAL=residual is not None, BLOCK_H=block_h, **launch_args(x.device),
        num_warps=min(16, max(1, block_h // 256)),
    )
    return out


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """Same signature and semantics as `rms_norm`, in plain torch."""
    _check_inputs(x, weight, residual)
    if residual is not None:
        residual.add_(x)  # computed in fp32, rounded once to residual's dtype
        x = residual
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.to(xf.dtype) * normed).to(x.dtype)


def _check_inputs(x, weight, residual):
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"rms_norm: x has shape {tuple(x.shape)} strides {x.stride()}, "
                         "expected [T, H] with unit stride in H")
    h = x.shape[1]
    if h > MAX_HIDDEN:
        raise ValueError(f"rms_norm: hidden size {h}, expected at most {MAX_HIDDEN}")
    if weight.shape != (h,) or not weight.is_contiguous():
        raise ValueError(f"rms_norm: weight has shape {tuple(weight.shape)}, expected contiguous ({h},)")
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1):
        raise ValueError(f"rms_norm: residual has shape {tuple(residual.shape)} strides "
                         f"{residual.stride()}, expected {tuple(x.shape)} with unit stride in H")


def check_norm_inputs(where: str, x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor,
                      max_tokens: int) -> None:
    """Inputs of a launch with the residual add + RMSNorm folded in: contiguous x [T <= max_tokens, H]
    (H <= MAX_HIDDEN: a program holds a row), residual None or like x, norm_w [H]."""
    if x.dim() != 2 or not x.is_contiguous() or x.shape[0] > max_tokens or x.shape[1] > MAX_HIDDEN:
        raise ValueError(f"{where}: x has shape {tuple(x.shape)} strides {x.stride()}, expected contiguous "
                         f"[T <= {max_tokens}, H <= {MAX_HIDDEN}]")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype
                                 or not residual.is_contiguous()):
        raise ValueError(f"{where}: residual is {residual.dtype} {tuple(residual.shape)}, expected contiguous "
                         f"{x.dtype} {tuple(x.shape)}")
    if norm_w.shape != (x.shape[1],) or not norm_w.is_contiguous():
        raise ValueError(f"{where}: norm_w has shape {tuple(norm_w.shape)}, expected contiguous ({x.shape[1]},)")
