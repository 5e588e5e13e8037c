"""Greedy tokens picked inside the LM head's launch: a packed int64 argmax slot per token.

torch's argmax over a decode step's [S, V] fp32 logits is a launch of its own after the CUDA
graph (8.7 us on the H200 at V = 151552, plus a memset and the gaps between them, 2026-12-04;
~34 us at 64 tokens, H100 2026-12-06). Instead each LM-head program packs the best of its rows
into one int64 and does one atomic max into the token's slot: the dense GEMV (dense_gemv.py),
the NVFP4 GEMV and, for decode batches above its tokens, the NVFP4 GEMM (nvfp4_linear.py):

    packed = (key(logit) << 32) | (0xFFFFFFFF - row)

key() (sampling.order_key) maps fp32 to int32 in the same order (negative floats get their low 31 bits flipped), so
the largest packed value is the largest logit, and among equal logits the smallest row: torch's
argmax (the first maximal index). A slot holds EMPTY before the head (the step's first kernel
clears it, decode_embedding) and a packed value after; token() recovers the row. A slot filled by
the sampler instead holds pack_token(id), which token() reads back the same way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sampling import order_key

EMPTY = -(1 << 63)  # a slot before any program's atomic max
EMPTY_SLOT = tl.constexpr(EMPTY)  # the same, inside kernels
LOW = 0xFFFFFFFF


@triton.jit
def best_packed(logits, rows, mask, AXIS: tl.constexpr = 0):
    """logits [BLOCK] fp32, rows [BLOCK] their vocabulary ids, mask [BLOCK] -> the packed int64 of
    the largest (smallest row among equals); EMPTY when no row is in the mask. A GEMM tile's
    [TOKENS, BLOCK] logits with rows [1, BLOCK] and AXIS 1 -> [TOKENS], each token's best."""
    packed = (order_key(logits).to(tl.int64) << 32) | (0xFFFFFFFF - rows.to(tl.int64))
    return tl.max(tl.where(mask, packed, EMPTY_SLOT), axis=AXIS)


@triton.jit
def packed_token(packed):
    """A slot's packed int64 -> its token id (int64)."""
    return 0xFFFFFFFF - (packed & 0xFFFFFFFF)


def pack_argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [S, V] fp32 -> [S] packed slots of their argmax: what the fused head stores (torch twin)."""
    values, rows = logits.max(dim=-1)  # the first maximal index, as argmax
    bits = values.float().contiguous().view(torch.int32)
    key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(torch.int64)  # order_key
    return (key << 32) | (LOW - rows)


def pack_token(tokens: torch.Tensor) -> torch.Tensor:
    """tokens [S] int64 (sampled) -> packed slots whose token() is the same ids."""
    return LOW - tokens


def token(packed: torch.Tensor) -> torch.Tensor:
    """packed slots [S] int64 -> token ids [S] int64."""
    return LOW - (packed & LOW)
