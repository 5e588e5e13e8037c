"""fp16 activations in the halves layout, for NVFP4 tiles computed transposed.

A decoded NVFP4 weight tile comes out of nvfp4.weight_halves_f16 as its even and its odd columns,
each already an MMA operand (a register holds two bytes' low or two bytes' high nibbles). Pairing
them back into k order costs instructions in every K step; instead the activations are stored
so that each BLOCK_K columns of a row hold the even columns, then the odd ones, and each half
of the weight tile meets its half of the activations in a dot of its own (dot_halves).
The weight sits on the MMA's A side (registers), the activations on its B side: a tile
[BLOCK_N weight rows, BLOCK_M tokens], the layout of the grouped MoE's decode tiles
(moe_grouped.py). Measured slower elsewhere (H100, 2026-12-06): upright tiles, which sm_90 runs
on wgmma with the decoded weight in shared memory (grouped MoE at 8192 tokens 1989 -> 2798 us,
326bb96); the W4A16 GEMM at 64 tokens, whose 64-token tiles sm_90 runs on wgmma with the weight
reshuffled into its register layout, plus a conversion launch (qkv 13.8 -> 15.5 us, o_proj 14.0
-> 15.4, 8ead2a5).

Values: fp16 of x (x is bf16 after its own rounding; fp16 holds it exactly in [2**-14, 65504],
the range tuning.FP4_MMA_F16 accepts for activations). K must be a multiple of BLOCK_K.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .nvfp4 import weight_halves_f16
from .pdl import launch_args, pdl_prologue


@triton.jit
def halves_col(cols, BLOCK_K: tl.constexpr):
    """Where column c of a row sits in the halves layout."""
    j = cols % BLOCK_K
    return cols - j + j // 2 + (j % 2) * (BLOCK_K // 2)


@triton.jit
def _halves_kernel(x_ptr, out_ptr, N, stride_x, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """out [T, N] fp16 = x [T, N] in the halves layout (program: row, BLOCK_K columns)."""
    pdl_prologue(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + t * stride_x + cols, mask=cols < N)
    tl.store(out_ptr + t * N + halves_col(cols, BLOCK_K), x.to(tl.float16), mask=cols < N)


def to_halves(x: torch.Tensor, block_k: int) -> torch.Tensor:
    """x [T, N] (N a multiple of block_k) -> fp16 [T, N] in the halves layout: one launch."""
    t, n = x.shape
    if n % block_k:
        raise ValueError(f"to_halves: N={n} is not a multiple of BLOCK_K={block_k}")
    out = torch.empty((t, n), dtype=torch.float16, device=x.device)
    if t:
        _halves_kernel[(t, n // block_k)](x_ptr=x, out_ptr=out, N=n, stride_x=x.stride(0), BLOCK_K=block_k,
                                          **launch_args(x.device), num_warps=1)
    return out


@triton.jit
def dot_halves(acc, a_rows_ptr, a_mask, w_ptr, scales_ptr, rows, row_mask, k_lo, k_hi, stride_wn, stride_sn,
               BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr, PTX: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] += W[rows, k_lo:k_hi] @ A[:, k_lo:k_hi].T as two dots a K step:
    the weight tile's even and odd columns with A's, which the halves layout stores apart.
    a_rows_ptr [BLOCK_M]: each A row's first column (fp16, halves layout); k_lo, k_hi multiples
    of BLOCK_K."""
    for k0 in range(k_lo, k_hi, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K // 2)
        a_even = tl.load(a_rows_ptr[:, None] + cols[None, :], mask=a_mask[:, None], other=0.0)
        a_odd = tl.load(a_rows_ptr[:, None] + (cols + BLOCK_K // 2)[None, :], mask=a_mask[:, None], other=0.0)
        w_even, w_odd = weight_halves_f16(w_ptr, scales_ptr, rows, row_mask, k0, k_hi, stride_wn, stride_sn,
                                          BLOCK_K, False, PTX)
        if DOT_FP32:
            a_even, a_odd, w_even, w_odd = a_even.to(tl.float32), a_odd.to(tl.float32), w_even.to(tl.float32), \
                w_odd.to(tl.float32)
        acc = tl.dot(w_even, tl.trans(a_even), acc, input_precision=DOT_PRECISION)
        acc = tl.dot(w_odd, tl.trans(a_odd), acc, input_precision=DOT_PRECISION)
    return acc
