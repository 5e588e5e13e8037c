"""Token embedding lookup: out[n] = weight[ids[n]] (a copy: exact, as transformers' nn.Embedding).

A decode step starts with this gather. As torch's indexing kernel it is the one launch of the
step's CUDA graph without PDL (~5 us on the H200), and the first GEMV, which folds the first
RMSNorm, can only start its weight prefetch once it completes; as a Triton launch with the PDL
prologue the GEMV's programs load their weights while it runs (pdl.py).

decode_embedding is the same launch at the head of a decode step's CUDA graph under async
scheduling: a sequence's id can be the previous step's token, still on the device in that step's
argmax slot (greedy.py), and the launch clears this step's slots for its LM head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .greedy import EMPTY, EMPTY_SLOT, packed_token, token
from .pdl import launch_args, pdl_prologue

BLOCK_H = 1024  # hidden columns a program copies
MAX_TOKENS = 64  # batches up to here take the kernel (decode steps); prefill chunks index with torch


@triton.jit
def _embedding_kernel(
    weight_ptr,   # [V, H]
    ids_ptr,      # [N] int32 / int64
    out_ptr,      # [N, H], contiguous
    prev_rows_ptr,  # [N] int64: the row of the previous step's slots holding n's id, or -1 (PREV)
    prev_ptr,     # [M] int64 the previous step's argmax slots (PREV)
    clear_ptr,    # [N] int64 this step's argmax slots, set to EMPTY (PREV)
    H, stride_v,
    BLOCK_H: tl.constexpr, PREV: tl.constexpr, PDL: tl.constexpr,
):
    """Program (token n, column block): copies BLOCK_H columns of row ids[n] (with PREV: of the
    previous step's token where prev_rows[n] >= 0)."""
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    pdl_prologue(PDL)  # the ids are written before the step (host copies, the previous step's head)
    row = tl.load(ids_ptr + n).to(tl.int64)
    if PREV:
        prev_row = tl.load(prev_rows_ptr + n)
        packed = tl.load(prev_ptr + tl.maximum(prev_row, 0))
        row = tl.where(prev_row >= 0, packed_token(packed), row)
        tl.store(clear_ptr + n, EMPTY_SLOT, mask=tl.program_id(1) == 0)
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
        weight_ptr=weight, ids_ptr=ids, out_ptr=out, prev_rows_ptr=ids, prev_ptr=ids, clear_ptr=ids, H=h,
        stride_v=weight.stride(0), BLOCK_H=BLOCK_H, PREV=False, **launch_args(weight.device), num_warps=4)
    return out


def decode_embedding(weight: torch.Tensor, ids: torch.Tensor, prev_rows: torch.Tensor, prev: torch.Tensor,
                     clear: torch.Tensor) -> torch.Tensor:
    """A decode step's embedding: weight [V, H]; ids [N] int64; prev_rows [N] int64, where >= 0
    the id is greedy.token(prev[prev_rows[n]]) instead (prev: the previous step's [M] argmax
    slots); clear [N] int64, this step's slots, set to greedy.EMPTY (another tensor than prev).
    -> [N, H]. Beyond MAX_TOKENS in torch ops."""
    _check_decode_inputs(weight, ids, prev_rows, prev, clear)
    n, h = ids.shape[0], weight.shape[1]
    if n > MAX_TOKENS:
        return decode_embedding_torch(weight, ids, prev_rows, prev, clear)
    out = torch.empty((n, h), dtype=weight.dtype, device=weight.device)
    if n == 0:
        return out
    _embedding_kernel[(n, triton.cdiv(h, BLOCK_H))](
        weight_ptr=weight, ids_ptr=ids, out_ptr=out, prev_rows_ptr=prev_rows, prev_ptr=prev, clear_ptr=clear,
        H=h, stride_v=weight.stride(0), BLOCK_H=BLOCK_H, PREV=True, **launch_args(weight.device), num_warps=4)
    return out


def decode_embedding_torch(weight, ids, prev_rows, prev, clear):
    """Same signature and semantics as `decode_embedding`."""
    _check_decode_inputs(weight, ids, prev_rows, prev, clear)
    ids = torch.where(prev_rows >= 0, token(prev[prev_rows.clamp(min=0)]), ids)
    clear.fill_(EMPTY)
    return weight[ids]


def embedding_torch(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Same signature and semantics as `embedding`."""
    _check_inputs(weight, ids)
    return weight[ids]


def _check_decode_inputs(weight, ids, prev_rows, prev, clear) -> None:
    _check_inputs(weight, ids)
    n = ids.shape[0]
    for name, t, size in (("ids", ids, n), ("prev_rows", prev_rows, n), ("prev", prev, None), ("clear", clear, n)):
        if t.dtype != torch.int64 or t.dim() != 1 or (size is not None and t.shape[0] != size):
            raise ValueError(f"decode_embedding: {name} is {t.dtype} {tuple(t.shape)}, expected int64 "
                             f"[{size if size is not None else 'M'}]")
    if prev.data_ptr() == clear.data_ptr():
        raise ValueError("decode_embedding: prev and clear are the same slots; expected the previous step's "
                         "and this step's")


def _check_inputs(weight: torch.Tensor, ids: torch.Tensor) -> None:
    if weight.dim() != 2 or weight.stride(-1) != 1:
        raise ValueError(f"embedding: weight has shape {tuple(weight.shape)} strides {weight.stride()}, "
                         "expected [V, H] with unit stride in H")
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"embedding: ids is {ids.dtype} {tuple(ids.shape)}, expected int32 or int64 [N]")
