"""Token embedding lookup: out[n] = weight[ids[n]].

A decode step starts with this gather. As torch's indexing kernel it is the one launch of the
step's CUDA graph without PDL (~5 us on the H200), and the first GEMV, which folds the first
RMSNorm, can only start its weight prefetch once it completes; as a Triton launch with the PDL
prologue the GEMV's programs load their weights while it runs (pdl.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_args, pdl_prologue

BLOCK_H = 1024  # hidden columns a program copies
MAX_TOKENS = 64  # batches up to here take the kernel (decode steps); prefill chunks index with torch


@triton.jit
def _embedding_kernel(
    weight_ptr,   # [V, H]
    ids_ptr,      # [N] int32 / int64
    out_ptr,      # [N, H], contiguous
    H, stride_v,
    BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):
    """Program (token n, column block): copies BLOCK_H columns of row ids[n]."""
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    pdl_prologue(PDL)  # the ids are written before the step (the sampler's gather)
    row = tl.load(ids_ptr + n).to(tl.int64)
    mask = cols < H
    tl.store(out_ptr + n * H + cols, tl.load(weight_ptr + row * stride_v + cols, mask=mask), mask=mask)


def embedding(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """weight [V, H] (unit stride in H), ids [N] int32/int64 in [0, V) -> [N, H] in weight.dtype."""
    _check_inputs(weight, ids)
    n, h = ids.shape[0], weight.shape[1]
    if n > MAX_TOKENS:
        return weight[ids]
    out = torch.empty((n, h), dtype=weight.dtype, device=weight.device)
    if n == 0:
        return out
    _embedding_kernel[(n, triton.cdiv(h, BLOCK_H))](
        weight_ptr=weight, ids_ptr=ids, out_ptr=out, H=h, stride_v=weight.stride(0), BLOCK_H=BLOCK_H,
        **launch_args(weight.device), num_warps=4)
    return out


def embedding_torch(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Same signature and semantics as `embedding`."""
    _check_inputs(weight, ids)
    return weight[ids]


def _check_inputs(weight: torch.Tensor, ids: torch.Tensor) -> None:
    if weight.dim() != 2 or weight.stride(-1) != 1:
        raise ValueError(f"embedding: weight has shape {tuple(weight.shape)} strides {weight.stride()}, "
                         "expected [V, H] with unit stride in H")
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"embedding: ids is {ids.dtype} {tuple(ids.shape)}, expected int32 or int64 [N]")
