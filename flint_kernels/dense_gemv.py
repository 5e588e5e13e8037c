"""Dense (BF16/FP16/FP32) linear for decode batches: y = x @ W.T for T <= MAX_TOKENS tokens.

cuBLAS runs these shapes as well on its own (a batch-1 5120 x 2048 bf16 GEMV in ~7.8 us on an
H200), but it cannot take part in programmatic dependent launch (pdl.py): each cuBLAS call
waits for the kernel before it to complete and lets the next one start only at its own end.
This GEMV keeps a decode step's chain of kernels inside PDL, and loads its weights before
waiting for the previous kernel, as nvfp4_linear's GEMV does.

Program (token, BLOCK_N rows, K split): a split is one or two steps of BLOCK_K columns, all
loaded up front (PREFETCH), or a pipelined loop when K is longer; each step is reduced at once
(acc [BLOCK_N] fp32), and splits are summed by the last to arrive (split_k.py). The token axis
varies fastest, so programs sharing a weight tile run together and all but the first read it
from L2.

Numerics: exact products of the operands in fp32, summed in fp32 (split partials fp32, summed in
split order), one rounding to x's dtype, as a bf16 linear with fp32 accumulation (transformers'
on a GPU; up to summation order). With the RMSNorm folded in, its numerics are rms_norm.py's.
An LM head's fp32 output holds the values rounded to x's dtype (transformers' bf16 head returns
bf16 logits); its greedy slot is the argmax of those stored values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import tuning
from .greedy import best_packed, pack_argmax
from .pdl import launch_args, pdl_prologue
from .rms_norm import (check_norm_inputs, folded_norm, maybe_folded_rstd, norm_weight, residual_add, rms_norm_torch,
                       step_activations, steps_rstd)
from .split_k import arrival_counters, finish_split, gemv_program, pick_splits
from .tuning import INTERPRET

MAX_TOKENS = 4
# Up to this many rows, LM heads included: a 151552 x 2048 head (flint-40b's is 150144; cuBLAS
# reaches ~4.2 TB/s on it) took 141.7 us of the replayed step's critical path here, 151.5 with
# cuBLAS (H200 2026-12-03: 100K replay 2.564 vs 2.570 ms; BF16 3.027 vs 3.034): its weight loads
# start under the final RMSNorm's launch.
MAX_ROWS = 1 << 20
# a step: BLOCK_N rows x 1024 columns (16 KB of bf16 at 8 rows: 32 registers a thread at 4 warps;
# with two prefetched steps a program takes 127 registers (sm_90), so four share an SM and ~80% of
# a 5120 x 2048 weight's 640 programs read at once). 16 rows / 8 warps measured slower (H200
# 2026-12-03: BF16 3.299 against 3.282 ms; H100 2026-12-05, 16 rows: +0.027 ms over 28 layers).
# (the interpreter pays per program: few, large ones there)
BLOCK_N = 128 if INTERPRET else 8
WARPS = 4
BLOCK_K = 128 if INTERPRET else 1024
STAGES = 3
# A split of whole steps (up to tuning.GEMV_PREFETCH_STEPS) loads them before the PDL wait; where
# all of K fits one such split, the launch is one split (no split-K arrival and reload), then
# loads every step's x (and residual) right after the wait: one round trip to L2 instead of one
# a step. With the RMSNorm folded, the row's rstd and updated residual come from those steps
# (squares added in-thread across them, one reduction) instead of a second load of the row.


@triton.jit
def _dense_gemv_kernel(
    x_ptr,         # [T, K]
    w_ptr,         # [N, K]
    out_ptr,       # [T, N], contiguous
    part_ptr,      # [SPLIT, T, N] fp32 (used when SPLIT > 1)
    counter_ptr,   # [T, cdiv(N, BLOCK_N)] int32, zero between launches
    res_ptr,       # [T, K] residual stream before the add (NORM and HAS_RESIDUAL), strided like x
    res_out_ptr,   # [T, K] residual + x, contiguous (written by the programs (t, 0, 0))
    norm_w_ptr,    # [K] RMSNorm weight (NORM)
    greedy_ptr,    # [T] int64 argmax slots, EMPTY before the launch (GREEDY; greedy.py)
    T, N, K, stride_xt, stride_wn, k_per_split, eps,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, MASK_K: tl.constexpr,
    PREFETCH: tl.constexpr, STAGES: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr, ROUND_TO_X: tl.constexpr, GREEDY: tl.constexpr,
    ROW_IN_STEPS: tl.constexpr, PDL: tl.constexpr,
):
    """y = x @ W.T, or with NORM y = rms_norm(residual + x) @ W.T (as nvfp4_linear's GEMV folds it);
    stored in out's dtype, rounded to x's first with ROUND_TO_X (fp32 logits of a bf16 linear).
    GREEDY (one split): each program also packs its best stored value into the token's argmax slot."""
    t, nb, s, rows, row_mask, k_lo, k_hi = gemv_program(N, K, k_per_split, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_wn
    x_row = x_ptr + t * stride_xt
    res_row = res_ptr + t * stride_xt
    if PREFETCH > 0:
        # every split is PREFETCH whole steps (the launcher checks): weights first, then the wait
        # for the previous kernel, whose output x is read after it (pdl.py)
        # (and the norm weight of their columns: a weight too, else an HBM round trip after the wait)
        w0 = tl.load(w_rows + (k_lo + cols)[None, :], mask=row_mask[:, None], other=0.0)
        nw0 = norm_weight(norm_w_ptr, k_lo + cols, cols >= 0, NORM)
        if PREFETCH > 1:
            w1 = tl.load(w_rows + (k_lo + BLOCK_K + cols)[None, :], mask=row_mask[:, None], other=0.0)
            nw1 = norm_weight(norm_w_ptr, k_lo + BLOCK_K + cols, cols >= 0, NORM)
        if PREFETCH > 2:
            w2 = tl.load(w_rows + (k_lo + 2 * BLOCK_K + cols)[None, :], mask=row_mask[:, None], other=0.0)
            nw2 = norm_weight(norm_w_ptr, k_lo + 2 * BLOCK_K + cols, cols >= 0, NORM)
        if PREFETCH > 3:
            w3 = tl.load(w_rows + (k_lo + 3 * BLOCK_K + cols)[None, :], mask=row_mask[:, None], other=0.0)
            nw3 = norm_weight(norm_w_ptr, k_lo + 3 * BLOCK_K + cols, cols >= 0, NORM)
        pdl_prologue(PDL)
        # every step's activations, then the rstd's row: one round trip
        xa0 = residual_add(x_row, res_row, k_lo + cols, cols >= 0, HAS_RESIDUAL)
        xa1 = None
        xa2 = None
        xa3 = None
        if PREFETCH > 1:
            xa1 = residual_add(x_row, res_row, k_lo + BLOCK_K + cols, cols >= 0, HAS_RESIDUAL)
        if PREFETCH > 2:
            xa2 = residual_add(x_row, res_row, k_lo + 2 * BLOCK_K + cols, cols >= 0, HAS_RESIDUAL)
        if PREFETCH > 3:
            xa3 = residual_add(x_row, res_row, k_lo + 3 * BLOCK_K + cols, cols >= 0, HAS_RESIDUAL)
        if ROW_IN_STEPS:  # the steps hold the whole row: its rstd and residual from them
            rstd = steps_rstd(res_out_ptr + t * K, cols, BLOCK_K, K, eps, (nb == 0) & (s == 0), PREFETCH,
                              HAS_RESIDUAL, xa0, xa1, xa2, xa3)
        else:
            rstd = maybe_folded_rstd(x_row, res_row, res_out_ptr + t * K, K, eps, (nb == 0) & (s == 0), NORM,
                                     HAS_RESIDUAL, BLOCK_H)
        acc = _dot_step(w0, x_row, res_row, nw0, k_lo + cols, rstd, NORM, HAS_RESIDUAL, xa0)
        if PREFETCH > 1:
            acc += _dot_step(w1, x_row, res_row, nw1, k_lo + BLOCK_K + cols, rstd, NORM, HAS_RESIDUAL, xa1)
        if PREFETCH > 2:
            acc += _dot_step(w2, x_row, res_row, nw2, k_lo + 2 * BLOCK_K + cols, rstd, NORM, HAS_RESIDUAL, xa2)
        if PREFETCH > 3:
            acc += _dot_step(w3, x_row, res_row, nw3, k_lo + 3 * BLOCK_K + cols, rstd, NORM, HAS_RESIDUAL, xa3)
    else:
        pdl_prologue(PDL)
        rstd = maybe_folded_rstd(x_row, res_row, res_out_ptr + t * K, K, eps, (nb == 0) & (s == 0), NORM,
                                 HAS_RESIDUAL, BLOCK_H)
        acc = tl.zeros([BLOCK_N], tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
            k = k0 + cols
            if NORM:
                w = tl.load(w_rows + k[None, :], mask=row_mask[:, None] & (k[None, :] < k_hi), other=0.0)
                x = folded_norm(x_row, res_row, norm_w_ptr, k, k < k_hi, rstd, HAS_RESIDUAL).to(tl.float32)
            elif MASK_K:
                w = tl.load(w_rows + k[None, :], mask=row_mask[:, None] & (k[None, :] < k_hi), other=0.0)
                x = tl.load(x_row + k, mask=k < k_hi, other=0.0).to(tl.float32)
            else:
                w = tl.load(w_rows + k[None, :], mask=row_mask[:, None], other=0.0)
                x = tl.load(x_row + k).to(tl.float32)
            acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    finish_split(acc, 1.0, out_ptr + t * N + rows, part_ptr, t * N + rows, row_mask, s, T * N,
                 counter_ptr + t * tl.num_programs(1) + nb, SPLIT, x_ptr.dtype.element_ty if ROUND_TO_X else None)
    if GREEDY:  # the values as stored: fp32 of the rounded ones
        logits = acc
        if ROUND_TO_X:
            logits = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.atomic_max(greedy_ptr + t, best_packed(logits, rows, row_mask), sem="relaxed")


@triton.jit
def _dot_step(w, x_row, res_row, nw, k, rstd, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, xa):
    """[BLOCK_N] fp32 sums of a loaded weight step w [BLOCK_N, BLOCK_K] times the activations at
    columns k (all inside the row): x, or rms_norm(residual + x) with NORM (nw: the loaded norm
    weight at k). xa: x (residual + x with NORM and HAS_RESIDUAL) at k, already loaded."""
    x = step_activations(xa, nw, rstd, NORM)
    return tl.sum(w.to(tl.float32) * x[None, :], axis=1)


def dense_gemv(x: torch.Tensor, w: torch.Tensor, num_splits: int | None = None,
               out_dtype: torch.dtype | None = None, greedy: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] (T <= MAX_TOKENS), w [N, K] of x's dtype -> [T, N] in x.dtype (fp32 accumulation).
    num_splits: K splits (default: about two programs per SM, and at most two steps a split;
    one split where K is at most tuning.GEMV_PREFETCH_STEPS steps).
    out_dtype torch.float32: the same values (rounded to x.dtype) stored as fp32, i.e.
    dense_gemv(x, w).float() in one launch (the LM head's logits).
    greedy: [T] int64 slots holding greedy.EMPTY (an LM head's): each gets the packed argmax of
    its row of the output as stored (greedy.pack_argmax(out)); the launch is one split."""
    n, k = _check_inputs(x, w)
    out = torch.empty((x.shape[0], n), dtype=_out_dtype(x, out_dtype), device=x.device)
    _launch(x, w, out, num_splits, None, _checked_greedy(x, greedy))
    return out


def rms_norm_dense_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor, eps: float,
                        w: torch.Tensor, num_splits: int | None = None, out_dtype: torch.dtype | None = None,
                        greedy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add + RMSNorm before a linear, folded into the GEMV (one launch instead of
    two): -> (rms_norm(residual + x, norm_w) @ W.T [T, N], residual + x [T, K] in a new tensor;
    x itself when residual is None). Computes rms_norm(x, norm_w, eps, residual) then dense_gemv
    with their roundings (the sum of squares may be reduced in another order). x, residual:
    contiguous [T, K] of one dtype. out_dtype and greedy as in dense_gemv (the final norm and
    LM head of a decode step in one launch)."""
    n, k = _check_inputs(x, w)
    check_norm_inputs("rms_norm_dense_gemv", x, residual, norm_w, MAX_TOKENS)
    out = torch.empty((x.shape[0], n), dtype=_out_dtype(x, out_dtype), device=x.device)
    res_out = x if residual is None else torch.empty_like(x)
    _launch(x, w, out, num_splits, (residual, res_out, norm_w, eps), _checked_greedy(x, greedy))
    return out, res_out


def _out_dtype(x: torch.Tensor, out_dtype: torch.dtype | None) -> torch.dtype:
    if out_dtype not in (None, x.dtype, torch.float32):
        raise ValueError(f"dense_gemv: out_dtype {out_dtype}, expected None, {x.dtype} or torch.float32")
    return out_dtype or x.dtype


def _checked_greedy(x: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor | None:
    if greedy is not None and (greedy.shape != (x.shape[0],) or greedy.dtype != torch.int64
                               or greedy.device != x.device):
        raise ValueError(f"dense_gemv: greedy is {greedy.dtype} {tuple(greedy.shape)} on {greedy.device}, "
                         f"expected int64 [{x.shape[0]}] on {x.device}")
    return greedy


def _launch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, num_splits: int | None, norm: tuple | None,
            greedy: torch.Tensor | None = None):
    """norm: (residual or None, res_out, norm_w, eps) to fold the RMSNorm in; greedy: argmax slots
    (one split: every program holds whole sums of its rows)."""
    (t, k), n = x.shape, w.shape[0]
    if t == 0 or n == 0:
        return
    if greedy is not None:
        num_splits = 1
    block_k = min(BLOCK_K, triton.next_power_of_2(k))
    k_blocks = triton.cdiv(k, block_k)
    wide_rows = tuning.DENSE_GEMV_WIDE_ROWS
    block_n = wide_rows if wide_rows and n >= tuning.DENSE_GEMV_WIDE_N else BLOCK_N
    tiles = t * triton.cdiv(n, block_n)
    splits = num_splits or max(pick_splits(tiles, k_blocks, x.device), _pow2_at_least(triton.cdiv(k_blocks, 2)))
    prefetch_steps = tuning.GEMV_PREFETCH_STEPS
    if num_splits is None and tuning.DENSE_GEMV_LONG_K_SPLITS and k_blocks > prefetch_steps:
        splits = min(tuning.DENSE_GEMV_LONG_K_SPLITS, k_blocks)
    elif num_splits is None and k_blocks <= prefetch_steps:
        splits = 1  # all of K in one prefetching split
    if not 1 <= splits <= k_blocks:
        raise ValueError(f"dense_gemv: num_splits {splits}, expected 1..{k_blocks} for K={k}")
    if num_splits is None and tuning.DENSE_GEMV_UNSPLIT_ROWS and splits == 1 and 2 < k_blocks <= prefetch_steps \
            and k % block_k == 0:
        block_n = tuning.DENSE_GEMV_UNSPLIT_ROWS  # one prefetching split of fewer rows
    k_per_split = triton.cdiv(k_blocks, splits) * block_k
    splits = triton.cdiv(k, k_per_split)  # no empty split
    steps = k_per_split // block_k
    prefetch = steps if k % k_per_split == 0 and steps <= prefetch_steps else 0
    part = torch.empty((splits, t, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    counters = arrival_counters(tiles, x.device) if splits > 1 else out
    residual, res_out, norm_w, eps = norm or (None, x, x, 0.0)
    _dense_gemv_kernel[(t, triton.cdiv(n, block_n), splits)](
        x_ptr=x, w_ptr=w, out_ptr=out, part_ptr=part, counter_ptr=counters,
        res_ptr=x if residual is None else residual, res_out_ptr=res_out, norm_w_ptr=norm_w,
        greedy_ptr=out if greedy is None else greedy,
        T=t, N=n, K=k, stride_xt=x.stride(0), stride_wn=w.stride(0), k_per_split=k_per_split, eps=eps,
        BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=splits, MASK_K=k % block_k != 0, PREFETCH=prefetch,
        STAGES=STAGES, NORM=norm is not None, HAS_RESIDUAL=residual is not None,
        BLOCK_H=triton.next_power_of_2(k), ROUND_TO_X=out.dtype != x.dtype, GREEDY=greedy is not None,
        # one split whose prefetched steps hold the whole row (prefetch 0: 0 != k)
        ROW_IN_STEPS=norm is not None and prefetch * block_k == k,
        **launch_args(x.device), num_warps=WARPS)


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def uses_dense_gemv(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ops.linear runs this dense linear here: decode batches, up to MAX_ROWS outputs (LM
    heads included), operands of one dtype with unit stride in K."""
    return (x.dim() == 2 and x.shape[0] <= MAX_TOKENS and w.dim() == 2 and w.shape[0] <= MAX_ROWS
            and x.dtype == w.dtype and x.stride(-1) == 1 and w.stride(-1) == 1)


def rms_norm_dense_gemv_torch(x, residual, norm_w, eps, w, num_splits=None, out_dtype=None, greedy=None):
    """Same signature and semantics as `rms_norm_dense_gemv` (residual itself is not modified)."""
    check_norm_inputs("rms_norm_dense_gemv", x, residual, norm_w, MAX_TOKENS)
    res_out = x if residual is None else residual.clone()
    h = rms_norm_torch(x, norm_w, eps, residual=None if residual is None else res_out)
    return dense_gemv_torch(h, w, num_splits, out_dtype, greedy), res_out


def dense_gemv_torch(x: torch.Tensor, w: torch.Tensor, num_splits: int | None = None,
                     out_dtype: torch.dtype | None = None, greedy: torch.Tensor | None = None) -> torch.Tensor:
    """Same signature and semantics as `dense_gemv`."""
    _check_inputs(x, w)
    out = F.linear(x, w).to(_out_dtype(x, out_dtype))
    if _checked_greedy(x, greedy) is not None:
        greedy.copy_(pack_argmax(out.float()))
    return out


def _check_inputs(x, w) -> tuple[int, int]:
    if w.dim() != 2 or w.stride(-1) != 1:
        raise ValueError(f"dense_gemv: w has shape {tuple(w.shape)} strides {w.stride()}, expected a matrix "
                         "[N, K] with unit stride in K")
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k or x.stride(-1) != 1:
        raise ValueError(f"dense_gemv: x has shape {tuple(x.shape)} strides {x.stride()}, expected [T, {k}] "
                         "with unit stride in K")
    if x.shape[0] > MAX_TOKENS:
        raise ValueError(f"dense_gemv: {x.shape[0]} tokens, expected at most {MAX_TOKENS} (a decode batch)")
    if x.dtype != w.dtype or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"dense_gemv: x is {x.dtype} and w {w.dtype}, expected one of bfloat16, float16, "
                         "float32 for both")
    return n, k
