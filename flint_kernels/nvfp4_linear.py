"""W4A16 linear: y = x @ W.T with W in NVFP4 (layout in nvfp4.py), x bf16 (or fp16/fp32).

Two kernels behind one launcher, picked by the token count T:
  T <= GEMV_MAX_TOKENS  GEMV: program (token, BLOCK_N rows, K split) streams its rows once with
                        FMA (bytes, or 32-bit words: tuning.FP4_GEMV_WORDS; no tensor cores: a decode
                        token would fill 1 of 16 MMA rows); the
                        token axis varies fastest, so programs sharing a weight tile run together
                        and all but the first read it from L2.
  T >  GEMV_MAX_TOKENS  GEMM: tl.dot tiles (weights dequantised to x's dtype, exactly), grouped
                        tile order for L2 reuse; from FP4_DEQUANT_MIN_TOKENS (prefill chunks) the
                        weight is decoded once by a launch of its own and the tiles load it
                        dense.
Both split K when the output tiles alone would leave SMs idle (batch-1 projections are
latency-bound: 2048x4096 in NVFP4 is 4.7 MB, ~1 us of HBM), finishing the reduction in the
same launch (split_k.py).

Numerics: each weight is E2M1 x E4M3 exactly (fp32, or bf16 in the tensor-core tiles), products
and sums in fp32 (except the GEMVs' prefetching splits with tuning.FP4_GEMV_F16: a word's 8
products summed in fp16 pairs), the global scale applied to the fp32 sum (nvfp4.py), one
rounding to x's dtype. The torch twin dequantises to fp32 and multiplies in fp32: the same up
to fp32 summation order (and the global scale's place). An NVFP4 LM head (nvfp4_logits) keeps
the fp32 sums: fp32 products, fp32 logits out, no rounding to x's dtype; at decode sizes the
final RMSNorm and the greedy argmax ride in its GEMV. transformers has no NVFP4: its oracle is
the dequantised weight in a bf16 linear (bf16 logits); ours are the fp32 logits of those weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import nvfp4, tuning
from .nvfp4 import (F16_BLOCK_K, F16_TILE_UNIT, check_nvfp4, fp4_dot_loaded, fp4_dot_words, fp4_load_words,
                    fp4_norm_weight, fp4_x_block, packed_words, scale_strides, weight_tile, weight_tile_f16)
from .greedy import best_packed, pack_argmax
from .pdl import launch_args, pdl_prologue
from .rms_norm import check_norm_inputs, folded_norm, maybe_folded_rstd, rms_norm_torch, steps_rstd
from .split_k import arrival_counters, finish_split, gemv_program, pick_splits
from .swiglu import gate_half, silu_mul_at, silu_mul_torch
from .tuning import INTERPRET

DOT_FP32 = INTERPRET  # Triton's interpreter computes bf16 tl.dot wrongly
GEMV_MAX_TOKENS = 4
# GEMV step: BLOCK_N rows x BLOCK_K k (8 x 256 NVFP4 = 1 KB packed + 128 B of scales); the
# interpreter's cost is per op: few, large programs there. 8 rows (qkv: 640 programs) since a
# word's products are summed without a conversion a nibble (nvfp4.py): H200 2026-12-04, NVFP4
# 100K replay 2.112 -> 2.103 ms (16 rows were the better before)
GEMV_BLOCK_N, GEMV_BLOCK_K = (128, 256) if INTERPRET else (8, 256)
GEMV_STAGES = 4  # tiles in flight per program (cp.async): a GEMV step is only ~2.3 KB
GEMV_WARPS = 4
# NVFP4 as 32-bit words: a step spans up to 1024 weights, so a thread holds several of the 16 rows
# and each x value it loads (and converts) serves several weights (2048: one step for K = 2048,
# measured 1.6-1.8 us slower for qkv on the H200)
GEMV_WORDS_BLOCK_K = 256 if INTERPRET else 1024
# Splits of whole word steps (up to tuning.GEMV_PREFETCH_STEPS) load all their weights before
# waiting for the previous kernel, so with PDL the read overlaps that kernel (pdl.py), then every
# step's x block right after the wait (one round trip to L2, not one a step); a one-split launch
# with the RMSNorm folded takes its row's rstd and updated residual from those blocks (no second
# load of the row). Longer splits run the pipelined loop.
GEMM_BLOCK_K = 32 if INTERPRET else 64
GROUP_M = 8
# From this many rows (an LM head) the decoding tiles of a decode batch are 128 rows wide: each
# tile reads all of x, 256 KB at 64 tokens, for its rows
GEMM_WIDE_N = 16384
# From this many tokens the GEMM over the decoded weight runs 256 x 128 tiles in 8 warps, 3 stages
# (half the x and weight tile reloads a FLOP of 128 x 128). H100 2026-12-07 (41a0aec, sweep_tiles.py
# --only w4a16 --tokens 8192, through descriptors): qkv 294 -> 267 us, o_proj 224 -> 204.
DEQUANT_WIDE_M_TOKENS = 4096
# From tuning.FP4_DEQUANT_MIN_TOKENS tokens (a prefill chunk) the GEMM decodes each weight once: a
# first launch writes the weight's E2M1 x E4M3 values (exact) to an [N, K] scratch in x's dtype,
# and the tl.dot tiles then load it as a dense matrix, so the decode no longer runs in every one
# of the T / BLOCK_M row tiles' K loops (64 times at 8192 tokens), and the tiles reach the tensor
# cores without a register-to-shared conversion of decoded weights. The global scale is still
# applied to each output once, after the reduction: the same values as the decoding tiles, up to
# the order of the fp32 accumulation. The scratch costs 2 bytes a weight written and read once
# (qkv: 12.6 MB, ~6 us at the H200's bandwidth).
DEQUANT_BLOCK_N, DEQUANT_BLOCK_K = (32, 64) if INTERPRET else (32, 256)
# the torch twin of an NVFP4 LM head decodes this many rows of it at a time (128 MB of fp32 at K = 2048)
HEAD_TORCH_ROWS = 16384


@triton.jit
def _nvfp4_gemv_kernel(
    x_ptr,         # [T, K], or [T, 2K] gate | up (SILU)
    w_ptr,         # the packed bytes: uint8 [N, K/2], or int32 [N, K/8] (8 weights a word) with WORDS
    scales_ptr,    # float8_e4m3fn [N, K/16]
    scale_ptr,     # fp32 [] or [N]
    out_ptr,       # [T, N], contiguous
    part_ptr,      # [SPLIT, T, N] fp32 (used when SPLIT > 1)
    counter_ptr,   # [T, cdiv(N, BLOCK_N)] int32, zero between launches
    res_ptr,       # [T, K] residual stream before the add (NORM and HAS_RESIDUAL), strided like x
    res_out_ptr,   # [T, K] residual + x, contiguous (written by the programs (t, 0, 0))
    norm_w_ptr,    # [K] RMSNorm weight (NORM)
    greedy_ptr,    # [T] int64 argmax slots, EMPTY before the launch (GREEDY; greedy.py)
    T, N, K, stride_xt, stride_wn, stride_sn, stride_gn, k_per_split, eps,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, MASK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, WORDS: tl.constexpr, PTX: tl.constexpr, PREFETCH: tl.constexpr,
    NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr,
    SILU: tl.constexpr, F16: tl.constexpr, ROW_IN_STEPS: tl.constexpr, GREEDY: tl.constexpr,
    PDL: tl.constexpr,
):
    """y = x @ W.T, or with NORM y = rms_norm(residual + x) @ W.T: the residual add and RMSNorm
    of the previous launch folded in (every program takes the row's rstd from all K columns, a
    few KB from L2, and normalises the columns it reads); or with SILU y = silu_mul(x) @ W.T,
    the SwiGLU of a fused gate_up row applied to the columns a program loads. Stored in out's
    dtype (fp32 logits of an LM head: unrounded). GREEDY (one split): each program also packs
    the best of its stored values into the token's argmax slot."""
    t, nb, s, rows, row_mask, k_lo, k_hi = gemv_program(N, K, k_per_split, BLOCK_N)
    x_row = x_ptr + t * stride_xt
    res_row = res_ptr + t * stride_xt
    if PREFETCH > 0:
        # every split is PREFETCH whole steps (the launcher checks): their weights are loaded
        # before the wait for the previous kernel, whose output x is read after it (pdl.py)
        # (with the norm weight of their columns and the rows' global scale: weights too, else HBM
        # round trips after the wait)
        KW: tl.constexpr = BLOCK_K // 8
        kw0 = k_lo // 8
        w0, s0 = fp4_load_words(w_ptr, scales_ptr, rows, row_mask, kw0, K // 8, stride_wn, stride_sn, KW, False)
        nw0 = fp4_norm_weight(norm_w_ptr, kw0, K // 8, KW, NORM)
        if PREFETCH > 1:
            w1, s1 = fp4_load_words(w_ptr, scales_ptr, rows, row_mask, kw0 + KW, K // 8, stride_wn, stride_sn,
                                    KW, False)
            nw1 = fp4_norm_weight(norm_w_ptr, kw0 + KW, K // 8, KW, NORM)
        if PREFETCH > 2:
            w2, s2 = fp4_load_words(w_ptr, scales_ptr, rows, row_mask, kw0 + 2 * KW, K // 8, stride_wn, stride_sn,
                                    KW, False)
            nw2 = fp4_norm_weight(norm_w_ptr, kw0 + 2 * KW, K // 8, KW, NORM)
        if PREFETCH > 3:
            w3, s3 = fp4_load_words(w_ptr, scales_ptr, rows, row_mask, kw0 + 3 * KW, K // 8, stride_wn, stride_sn,
                                    KW, False)
            nw3 = fp4_norm_weight(norm_w_ptr, kw0 + 3 * KW, K // 8, KW, NORM)
        scale = tl.load(scale_ptr + rows * stride_gn, mask=row_mask, other=0.0)
        pdl_prologue(PDL)
        # every step's x block, then the rstd's row: one round trip
        xa0 = fp4_x_block(x_row, res_row, kw0, K // 8, KW, HAS_RESIDUAL, SILU)
        xa1 = None
        xa2 = None
        xa3 = None
        if PREFETCH > 1:
            xa1 = fp4_x_block(x_row, res_row, kw0 + KW, K // 8, KW, HAS_RESIDUAL, SILU)
        if PREFETCH > 2:
            xa2 = fp4_x_block(x_row, res_row, kw0 + 2 * KW, K // 8, KW, HAS_RESIDUAL, SILU)
        if PREFETCH > 3:
            xa3 = fp4_x_block(x_row, res_row, kw0 + 3 * KW, K // 8, KW, HAS_RESIDUAL, SILU)
        if ROW_IN_STEPS:  # the steps' blocks hold the whole row: its rstd and residual from them
            offs = (kw0 + tl.arange(0, KW))[:, None] * 8 + tl.arange(0, 8)[None, :]
            rstd = steps_rstd(res_out_ptr + t * K, offs, BLOCK_K, K, eps, (nb == 0) & (s == 0), PREFETCH,
                              HAS_RESIDUAL, xa0, xa1, xa2, xa3)
        else:
            rstd = maybe_folded_rstd(x_row, res_row, res_out_ptr + t * K, K, eps, (nb == 0) & (s == 0), NORM,
                                     HAS_RESIDUAL, BLOCK_H)
        acc = fp4_dot_loaded(x_row, w0, s0, kw0, K // 8, KW, False, PTX, res_row, nw0, rstd,
                             NORM, HAS_RESIDUAL, True, xa0, SILU, F16)
        if PREFETCH > 1:
            acc += fp4_dot_loaded(x_row, w1, s1, kw0 + KW, K // 8, KW, False, PTX, res_row, nw1, rstd,
                                  NORM, HAS_RESIDUAL, True, xa1, SILU, F16)
        if PREFETCH > 2:
            acc += fp4_dot_loaded(x_row, w2, s2, kw0 + 2 * KW, K // 8, KW, False, PTX, res_row, nw2, rstd,
                                  NORM, HAS_RESIDUAL, True, xa2, SILU, F16)
        if PREFETCH > 3:
            acc += fp4_dot_loaded(x_row, w3, s3, kw0 + 3 * KW, K // 8, KW, False, PTX, res_row, nw3, rstd,
                                  NORM, HAS_RESIDUAL, True, xa3, SILU, F16)
    elif WORDS:
        pdl_prologue(PDL)
        rstd = maybe_folded_rstd(x_row, res_row, res_out_ptr + t * K, K, eps, (nb == 0) & (s == 0), NORM,
                                 HAS_RESIDUAL, BLOCK_H)
        acc = tl.zeros([BLOCK_N, BLOCK_K // 16], tl.float32)  # one sum per block of 16 weights
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            acc += fp4_dot_words(x_row, w_ptr, scales_ptr, rows, row_mask, k0 // 8, K // 8,
                                 stride_wn, stride_sn, BLOCK_K // 8, MASK_K, PTX, res_row, norm_w_ptr, rstd,
                                 NORM, HAS_RESIDUAL, SILU=SILU)
    else:
        pdl_prologue(PDL)
        rstd = maybe_folded_rstd(x_row, res_row, res_out_ptr + t * K, K, eps, (nb == 0) & (s == 0), NORM,
                                 HAS_RESIDUAL, BLOCK_H)
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            cols = k0 + tl.arange(0, BLOCK_K)
            if NORM:
                x = folded_norm(x_row, res_row, norm_w_ptr, cols, cols < K, rstd, HAS_RESIDUAL).to(tl.float32)
            elif SILU:
                x = silu_mul_at(x_row, cols, cols < K, K).to(tl.float32)
            elif MASK_K:
                x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)
            else:
                x = tl.load(x_row + cols).to(tl.float32)
            w = weight_tile(w_ptr, scales_ptr, rows, row_mask, k0, K, stride_wn, stride_sn, BLOCK_K, MASK_K, True)
            acc += w * x[None, :]
    y = tl.sum(acc, axis=1)  # [BLOCK_N]
    if PREFETCH == 0:
        scale = tl.load(scale_ptr + rows * stride_gn, mask=row_mask, other=0.0)
    finish_split(y, scale, out_ptr + t * N + rows, part_ptr, t * N + rows, row_mask, s, T * N,
                 counter_ptr + t * tl.num_programs(1) + nb, SPLIT)
    if GREEDY:  # the values as stored (one split; fp32 out: y * scale itself)
        stored = (y * scale).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.atomic_max(greedy_ptr + t, best_packed(stored, rows, row_mask), sem="relaxed")


@triton.jit
def _dequantize_kernel(
    packed_ptr,    # uint8 [N, K/2]
    scales_ptr,    # float8_e4m3fn [N, K/16]
    out_ptr,       # [N, K] contiguous, x's dtype: E2M1 x E4M3, global scale not applied
    N, K, stride_pn, stride_sn,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MASK_K: tl.constexpr, PDL: tl.constexpr,
):
    """Program (BLOCK_N rows, BLOCK_K columns): the weight tile decoded (nvfp4.weight_tile),
    exact in bf16 / fp16 / fp32, stored for the dense GEMM after it."""
    pdl_prologue(PDL)  # the scratch may still be read by an earlier GEMM (the allocator reuses it)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    k0 = tl.program_id(1) * BLOCK_K
    w = weight_tile(packed_ptr, scales_ptr, rows, row_mask, k0, K, stride_pn, stride_sn, BLOCK_K, MASK_K, True)
    cols = k0 + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], w.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & (cols[None, :] < K))


@triton.jit(do_not_specialize=["T"])  # a count of tokens (moe_grouped.py: first-use compiles)
def _nvfp4_matmul_kernel(
    x_ptr,         # [T, K]
    packed_ptr,    # FP4: uint8 [N, K/2]; else the decoded weight [N, K] in x's dtype (_dequantize_kernel)
    scales_ptr,    # float8_e4m3fn [N, K/16] (FP4)
    scale_ptr,     # fp32 [] or [N]
    out_ptr,       # [T, N], contiguous
    part_ptr,      # [SPLIT, T, N] fp32 (used when SPLIT > 1)
    counter_ptr,   # [cdiv(T, BLOCK_M) * cdiv(N, BLOCK_N)] int32, zero between launches
    greedy_ptr,    # [T] int64 argmax slots, EMPTY before the launch (GREEDY; greedy.py)
    x_desc, w_desc,  # DESC: descriptors of x and the decoded weight, blocks [BLOCK_M | BLOCK_N, BLOCK_K]
    T, N, K, stride_xt, stride_pn, stride_sn, stride_gn, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT: tl.constexpr, MASK_K: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FP4: tl.constexpr, F16: tl.constexpr, PTX: tl.constexpr, GREEDY: tl.constexpr, DESC: tl.constexpr,
    PDL: tl.constexpr,
):
    """F16 (FP4): tiles decoded to fp16 (nvfp4.weight_tile_f16) and x taken as fp16 (tuning.FP4_MMA_F16).
    GREEDY (one split, fp32 out): each program also packs each token's best of its rows into the
    token's slot, as the GEMV does. DESC (a decoded weight): x and weight tiles through tensor
    descriptors (TMA on Hopper; rows and columns past the ends read as zeros)."""
    pdl_prologue(PDL)
    tile = tl.program_id(0)
    s = tl.program_id(1)
    num_m = tl.cdiv(T, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = tile // (GROUP_M * num_n)  # GROUP_M row tiles sweep the columns together (L2 reuse)
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pm = first_m + (tile % (GROUP_M * num_n)) % size_m
    pn = (tile % (GROUP_M * num_n)) // size_m
    tokens = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    # k_per_split is whole BLOCK_K steps: said, so the block scales' loads are known aligned,
    # vectorised and pipelined (unaligned single bytes were loaded in the K loop, synchronously)
    k_lo = tl.multiple_of(s * k_per_split, BLOCK_K)
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if DESC:
            a = x_desc.load([pm * BLOCK_M, k0])
            w = w_desc.load([pn * BLOCK_N, k0])
        else:
            cols = k0 + tl.arange(0, BLOCK_K)
            a_mask = tokens[:, None] < T
            if MASK_K:
                a_mask = a_mask & (cols[None, :] < K)
            a = tl.load(x_ptr + tokens[:, None].to(tl.int64) * stride_xt + cols[None, :], mask=a_mask, other=0.0)
            if F16:
                w = weight_tile_f16(packed_ptr, scales_ptr, rows, row_mask, k0, K, stride_pn, stride_sn, BLOCK_K,
                                    MASK_K, PTX)
            else:
                w = weight_tile(packed_ptr, scales_ptr, rows, row_mask, k0, K, stride_pn, stride_sn, BLOCK_K,
                                MASK_K, FP4)
        if DOT_FP32:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        elif F16:
            a = a.to(tl.float16)
        else:
            w = w.to(a.dtype)  # E2M1 * E4M3 is exact in bf16 / fp16
        acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
    scale = tl.load(scale_ptr + rows * stride_gn, mask=row_mask, other=0.0)
    if F16:
        scale *= F16_TILE_UNIT  # the fp16 tiles' weights / F16_TILE_UNIT
    offs = tokens[:, None].to(tl.int64) * N + rows[None, :]
    mask = (tokens[:, None] < T) & row_mask[None, :]
    finish_split(acc, scale[None, :], out_ptr + offs, part_ptr, offs, mask, s, T * N, counter_ptr + tile, SPLIT)
    if GREEDY:  # the values as stored (one split, fp32 out: acc * scale itself)
        best = best_packed(acc * scale[None, :], rows[None, :], mask, 1)  # [BLOCK_M]
        tl.atomic_max(greedy_ptr + tokens, best, mask=tokens < T, sem="relaxed")


def nvfp4_linear(x: torch.Tensor, w, num_splits: int | None = None,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [T, K], w NVFP4 [N, K] (`.packed`, `.scales`, `.scale`) -> [T, N] in out_dtype (default
    x.dtype). num_splits: K splits (default: enough programs for two per SM)."""
    n, k = _check_inputs(x, w)
    if out_dtype not in (None, torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"nvfp4_linear: out_dtype is {out_dtype}, expected bfloat16, float16, float32 or None")
    out = torch.empty((x.shape[0], n), dtype=out_dtype or x.dtype, device=x.device)
    _launch(x, w, out, num_splits, None)
    return out


def wants_f16_activations(t: int) -> bool:
    """Whether nvfp4_linear of t tokens runs the fp16 decoding tiles and its producer should
    write x in fp16 (tuning.FP4_GEMM_F16_ACTIVATIONS), rounded to its own dtype first: the tiles
    would convert it so in each K step, so the products are the same."""
    return (tuning.FP4_GEMM_F16_ACTIVATIONS and tuning.FP4_MMA_F16 and t > GEMV_MAX_TOKENS
            and not dequantizes(t, head=False))


def dequantizes(t: int, head: bool) -> bool:
    """A GEMM of t tokens (not an LM head's) decodes the weight once into a scratch
    (tuning.FP4_DEQUANT_MIN_TOKENS) instead of in its tiles."""
    return tuning.FP4_DEQUANT_MIN_TOKENS is not None and t >= tuning.FP4_DEQUANT_MIN_TOKENS and not head


def silu_nvfp4_linear(gate_up: torch.Tensor, w, num_splits: int | None = None) -> torch.Tensor:
    """The SwiGLU before a linear, folded into its GEMV (one launch instead of two): gate_up
    [T, 2K] (gate columns first; T <= GEMV_MAX_TOKENS), w NVFP4 [N, K] -> silu_mul(gate_up) @ W.T
    [T, N] in gate_up's dtype, with silu_mul's roundings (each program applies it to the columns
    it loads). num_splits as in nvfp4_linear."""
    x, n = _check_silu_inputs(gate_up, w)
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    _launch(gate_up, w, out, num_splits, None, silu=True)
    return out


def rms_norm_nvfp4_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor, eps: float, w,
                          num_splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add + RMSNorm before a linear, folded into its GEMV (one launch instead of
    two): -> (rms_norm(residual + x, norm_w) @ W.T [T, N], residual + x [T, K] in a new tensor;
    x itself when residual is None). Computes rms_norm(x, norm_w, eps, residual) then nvfp4_linear
    with their roundings (the sum of squares may be reduced in another order). x, residual:
    contiguous [T, K] of one dtype, T <= GEMV_MAX_TOKENS."""
    n, k = _check_inputs(x, w)
    check_norm_inputs("rms_norm_nvfp4_linear", x, residual, norm_w, GEMV_MAX_TOKENS)
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    res_out = x if residual is None else torch.empty_like(x)
    _launch(x, w, out, num_splits, (residual, res_out, norm_w, eps))
    return out, res_out


def nvfp4_logits(h: torch.Tensor, w, greedy: torch.Tensor | None = None) -> torch.Tensor:
    """An NVFP4 LM head: h [T, K], w NVFP4 [V, K] -> fp32 logits [T, V], never rounded to h's
    dtype: fp32 accumulation (no fp16 products), the global scale applied to the fp32 sums. Decode
    batches (T <= GEMV_MAX_TOKENS) through the GEMV, larger T through the GEMM whose tiles decode
    the weight in their K loop (no [V, K] decoded scratch: 0.6 GB for flint-40b's head).
    greedy: [T] int64 slots holding greedy.EMPTY: each gets the packed argmax of its row
    (greedy.pack_argmax(logits)), inside the launch (the GEMV's or the GEMM's, in one split)."""
    _check_inputs(h, w)
    greedy = _checked_greedy(h, greedy)
    out = torch.empty((h.shape[0], w.packed.shape[0]), dtype=torch.float32, device=h.device)
    _launch(h, w, out, None, None, head=True, greedy=greedy)
    return out


def rms_norm_nvfp4_logits(x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor, eps: float, w,
                          greedy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The final residual add + RMSNorm folded into the NVFP4 LM head's GEMV (one launch):
    -> (nvfp4_logits(rms_norm(residual + x, norm_w), w, greedy), residual + x), as
    rms_norm_nvfp4_linear folds it. Decode batches (T <= GEMV_MAX_TOKENS)."""
    _check_inputs(x, w)
    check_norm_inputs("rms_norm_nvfp4_logits", x, residual, norm_w, GEMV_MAX_TOKENS)
    out = torch.empty((x.shape[0], w.packed.shape[0]), dtype=torch.float32, device=x.device)
    res_out = x if residual is None else torch.empty_like(x)
    _launch(x, w, out, None, (residual, res_out, norm_w, eps), head=True, greedy=_checked_greedy(x, greedy))
    return out, res_out


def _checked_greedy(x: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor | None:
    if greedy is not None and (greedy.shape != (x.shape[0],) or greedy.dtype != torch.int64
                               or greedy.device != x.device):
        raise ValueError(f"nvfp4_logits: greedy is {greedy.dtype} {tuple(greedy.shape)} on {greedy.device}, "
                         f"expected int64 [{x.shape[0]}] on {x.device}")
    return greedy


def _launch(x: torch.Tensor, w, out: torch.Tensor, num_splits: int | None, norm: tuple | None,
            silu: bool = False, head: bool = False, greedy: torch.Tensor | None = None) -> None:
    """norm: (residual or None, res_out, norm_w, eps) to fold the RMSNorm in; silu: x is [T, 2K]
    gate | up, the SwiGLU folded in (GEMV only, both). head: an LM head's fp32 logits (out fp32):
    fp32 products in the GEMV, and the GEMM decodes in its tiles (no scratch). greedy: argmax
    slots (an LM head's, one split: every program holds whole sums of its rows)."""
    t, n, k = x.shape[0], out.shape[1], w.packed.shape[-1] * 2  # (x is [T, 2K] with silu)
    if t == 0 or n == 0:
        return
    _, stride_gn = scale_strides(w)
    words = tuning.FP4_GEMV_WORDS
    gemv_block_n = GEMV_BLOCK_N
    if t <= GEMV_MAX_TOKENS and tuning.FP4_GEMV_WIDE_ROWS and n >= tuning.FP4_GEMV_WIDE_N:
        gemv_block_n = tuning.FP4_GEMV_WIDE_ROWS
    if t <= GEMV_MAX_TOKENS:
        tiles = t * triton.cdiv(n, gemv_block_n)
        block_k = min(GEMV_WORDS_BLOCK_K if words else GEMV_BLOCK_K, triton.next_power_of_2(k))
    else:
        dequant = dequantizes(t, head)
        block_m, block_n, warps, stages = (dequant and tuning.FP4_DEQUANT_GEMM_TILES) or _gemm_tiles(t, n, dequant)
        tiles, block_k = triton.cdiv(t, block_m) * triton.cdiv(n, block_n), GEMM_BLOCK_K
        f16 = tuning.FP4_MMA_F16 and not dequant and x.dtype != torch.float32
        if f16 and not INTERPRET:
            block_k = F16_BLOCK_K
        if tuning.FP4_GEMM_TILES and not dequant:
            block_m, block_n, warps, stages, asked_splits = tuning.FP4_GEMM_TILES
            tiles = triton.cdiv(t, block_m) * triton.cdiv(n, block_n)
            num_splits = num_splits or asked_splits or None
    k_blocks = triton.cdiv(k, block_k)
    splits = 1 if greedy is not None else num_splits or pick_splits(tiles, k_blocks, x.device)
    prefetch_steps = tuning.GEMV_PREFETCH_STEPS
    if num_splits is None and greedy is None and t <= GEMV_MAX_TOKENS and tuning.FP4_GEMV_LONG_K_SPLITS and words \
            and k_blocks > prefetch_steps:
        splits = min(tuning.FP4_GEMV_LONG_K_SPLITS, k_blocks)
    if num_splits is None and t <= GEMV_MAX_TOKENS and tuning.FP4_GEMV_UNSPLIT_ROWS and splits > 1 and words \
            and k % block_k == 0 and k_blocks <= prefetch_steps:
        splits, gemv_block_n = 1, tuning.FP4_GEMV_UNSPLIT_ROWS  # one prefetching split of fewer rows
    if not 1 <= splits <= k_blocks:
        raise ValueError(f"nvfp4_linear: num_splits {splits}, expected 1..{k_blocks} for K={k}")
    k_per_split = triton.cdiv(k_blocks, splits) * block_k
    splits = triton.cdiv(k, k_per_split)  # no empty split
    part = torch.empty((splits, t, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    counters = arrival_counters(tiles, x.device) if splits > 1 else out
    common = dict(x_ptr=x, scales_ptr=w.scales, scale_ptr=w.scale, out_ptr=out,
                  part_ptr=part, counter_ptr=counters, greedy_ptr=out if greedy is None else greedy,
                  GREEDY=greedy is not None, T=t, N=n, K=k, stride_xt=x.stride(0),
                  stride_sn=w.scales.stride(0), stride_gn=stride_gn,
                  k_per_split=k_per_split, SPLIT=splits, MASK_K=k % block_k != 0)
    if t <= GEMV_MAX_TOKENS:
        data = packed_words(w) if words else w.packed
        # whole word steps a split, loaded before the wait for the previous kernel (pdl.py)
        steps = k_per_split // block_k
        prefetch = steps if words and k % k_per_split == 0 and steps <= prefetch_steps else 0
        residual, res_out, norm_w, eps = norm or (None, x, x, 0.0)
        _nvfp4_gemv_kernel[(t, triton.cdiv(n, gemv_block_n), splits)](
            **common, w_ptr=data, stride_wn=data.stride(0), BLOCK_N=gemv_block_n, BLOCK_K=block_k,
            res_ptr=x if residual is None else residual, res_out_ptr=res_out, norm_w_ptr=norm_w, eps=eps,
            NORM=norm is not None, HAS_RESIDUAL=residual is not None, BLOCK_H=triton.next_power_of_2(k),
            SILU=silu, F16=tuning.FP4_GEMV_F16 and prefetch > 0 and x.dtype == torch.bfloat16 and not head,
            # one split whose prefetched steps hold the whole row (prefetch 0: 0 != k)
            ROW_IN_STEPS=norm is not None and prefetch * block_k == k,
            **launch_args(x.device),
            NUM_STAGES=GEMV_STAGES, WORDS=words, PTX=nvfp4.ptx_decode(), PREFETCH=prefetch,
            num_warps=GEMV_WARPS)
    else:
        if norm is not None:
            raise ValueError(f"nvfp4_linear: the folded RMSNorm takes at most {GEMV_MAX_TOKENS} tokens, got {t}")
        weight = dequantize_for_gemm(w, x.dtype) if dequant else w.packed
        desc = dequant and tuning.FP4_DEQUANT_GEMM_TMA and _descriptor_ok(x) and _descriptor_ok(weight)
        x_desc, w_desc = (TensorDescriptor.from_tensor(x, [block_m, block_k]),
                          TensorDescriptor.from_tensor(weight, [block_n, block_k])) if desc else (None, None)
        _nvfp4_matmul_kernel[(tiles, splits)](
            **common, packed_ptr=weight, stride_pn=weight.stride(0), x_desc=x_desc, w_desc=w_desc, DESC=desc,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=GROUP_M,
            DOT_FP32=DOT_FP32, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", FP4=not dequant,
            F16=f16, PTX=nvfp4.ptx_decode(),
            **launch_args(x.device),
            num_warps=warps, num_stages=stages)


def _descriptor_ok(t: torch.Tensor) -> bool:
    """Whether a [rows, K] operand can be read through a tensor descriptor: 2-byte elements, unit
    stride in K, rows and base 16-byte aligned (TMA's rules)."""
    return (t.element_size() == 2 and t.stride(-1) == 1 and t.stride(0) * 2 % 16 == 0
            and t.data_ptr() % 16 == 0)


def dequantize_for_gemm(w, dtype: torch.dtype) -> torch.Tensor:
    """NVFP4 w [N, K] -> [N, K] in `dtype`: E2M1 x E4M3 block scale, exact (the global scale is
    not applied: the GEMM applies it to its outputs). One launch (_dequantize_kernel)."""
    n, k = w.packed.shape[0], w.packed.shape[1] * 2
    out = torch.empty((n, k), dtype=dtype, device=w.packed.device)
    block_k = min(DEQUANT_BLOCK_K, triton.next_power_of_2(k))
    _dequantize_kernel[(triton.cdiv(n, DEQUANT_BLOCK_N), triton.cdiv(k, block_k))](
        packed_ptr=w.packed, scales_ptr=w.scales, out_ptr=out, N=n, K=k, stride_pn=w.packed.stride(0),
        stride_sn=w.scales.stride(0), BLOCK_N=DEQUANT_BLOCK_N, BLOCK_K=block_k, MASK_K=k % block_k != 0,
        **launch_args(w.packed.device), num_warps=4)
    return out


def _gemm_tiles(t: int, n: int, dequant: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, warps, stages): M tiles just cover small batches; large T gets the
    H100/H200 128x128 tile, and the GEMM over the decoded weight at long chunks 256 x 128."""
    if INTERPRET:
        return 16, 32, 4, 1
    if dequant and t >= DEQUANT_WIDE_M_TOKENS:
        return 256, 128, 8, 3
    if t <= 16:
        return 16, 64, 4, 4
    if t <= 64 and n >= GEMM_WIDE_N:  # the LM head: sweep_tiles.py, H100 2026-12-07, T=64: 217 -> 147 us
        return 64, 128, 4, 3          # (qkv 13.6 -> 17.9, o_proj 13.7 -> 19.9 in these tiles)
    if t <= 64:  # sweep_tiles.py, H100 2026-12-06, T=64: qkv 17.3 -> 13.9 us against 64 x 64 (o_proj 14.2 both)
        return 64, 32, 4, 4
    return 128, 128, 8, 3


def rms_norm_nvfp4_linear_torch(x, residual, norm_w, eps, w, num_splits=None):
    """Same signature and semantics as `rms_norm_nvfp4_linear` (residual itself is not modified)."""
    check_norm_inputs("rms_norm_nvfp4_linear", x, residual, norm_w, GEMV_MAX_TOKENS)
    res_out = x if residual is None else residual.clone()
    h = rms_norm_torch(x, norm_w, eps, residual=None if residual is None else res_out)
    return nvfp4_linear_torch(h, w), res_out


def silu_nvfp4_linear_torch(gate_up, w, num_splits=None):
    """Same signature and semantics as `silu_nvfp4_linear`."""
    _check_silu_inputs(gate_up, w)
    return nvfp4_linear_torch(silu_mul_torch(gate_up), w)


def nvfp4_linear_torch(x: torch.Tensor, w, num_splits: int | None = None) -> torch.Tensor:
    """Same signature and semantics as `nvfp4_linear`: dequantise (fp32, exact), matmul in fp32,
    round to x.dtype."""
    _check_inputs(x, w)
    weight = w.dequantize(torch.float32)
    return F.linear(x.float(), weight).to(x.dtype)


def nvfp4_logits_torch(h: torch.Tensor, w, greedy: torch.Tensor | None = None) -> torch.Tensor:
    """Same signature and semantics as `nvfp4_logits`: the dequantised weight (fp32, exact) times
    h in fp32, in slices of HEAD_TORCH_ROWS rows of the weight (no fp32 copy of a whole head)."""
    _check_inputs(h, w)
    greedy = _checked_greedy(h, greedy)
    n = w.packed.shape[0]
    per_row = w.scale.dim() == w.packed.dim() - 1
    out = torch.empty((h.shape[0], n), dtype=torch.float32, device=h.device)
    for a in range(0, n, HEAD_TORCH_ROWS):
        b = min(n, a + HEAD_TORCH_ROWS)
        rows = type(w)(w.packed[a:b], w.scales[a:b], w.scale[a:b] if per_row else w.scale)
        out[:, a:b] = F.linear(h.float(), rows.dequantize(torch.float32))
    if greedy is not None:
        greedy.copy_(pack_argmax(out))
    return out


def rms_norm_nvfp4_logits_torch(x, residual, norm_w, eps, w, greedy=None):
    """Same signature and semantics as `rms_norm_nvfp4_logits` (residual itself is not modified)."""
    check_norm_inputs("rms_norm_nvfp4_logits", x, residual, norm_w, GEMV_MAX_TOKENS)
    res_out = x if residual is None else residual.clone()
    h = rms_norm_torch(x, norm_w, eps, residual=None if residual is None else res_out)
    return nvfp4_logits_torch(h, w, greedy), res_out


def _check_silu_inputs(gate_up, w) -> tuple[torch.Tensor, int]:
    """silu_nvfp4_linear's inputs, checked -> (the gate half [T, K], N)."""
    x = gate_half(gate_up, "silu_nvfp4_linear")
    n, _ = _check_inputs(x, w)
    if x.shape[0] > GEMV_MAX_TOKENS:
        raise ValueError(f"silu_nvfp4_linear: {x.shape[0]} tokens, expected at most {GEMV_MAX_TOKENS} "
                         "(a decode batch)")
    return x, n


def _check_inputs(x, w) -> tuple[int, int]:
    n, k = check_nvfp4("nvfp4_linear: w", w)
    if w.packed.dim() != 2:
        raise ValueError(f"nvfp4_linear: w has shape {tuple(w.packed.shape[:-1])} x K, expected a matrix [N, K]")
    if x.dim() != 2 or x.shape[1] != k or x.stride(-1) != 1:
        raise ValueError(f"nvfp4_linear: x has shape {tuple(x.shape)} strides {x.stride()}, expected [T, {k}] "
                         "with unit stride in K")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"nvfp4_linear: x is {x.dtype}, expected bfloat16, float16 or float32")
    return n, k
