"""The splits of paged decode attention: which cached positions each reads, and an L2 prefetch
of the first pages of every split, issued by the launch before the split kernel.

At 100K context a full layer's split kernel streams its 205 MB of K/V at ~94% of copy speed
(benchmarks/NOTES.md §16), and it is the only launch of a layer that keeps HBM busy for long;
the GEMV before it (the QKV projection) has its weights in registers after its PDL wait and
then runs a few microseconds of latency-bound work while HBM idles. `prefetch_first_pages`
issues one `cp.async.bulk.prefetch.L2` (the SM's TMA unit brings a range into L2; no registers,
nothing to wait for) per K or V page that a split reads first, from the launch between them
(qk_norm_rope, before its PDL wait, so the requests go out while the QKV GEMV still runs), so
each split's first tiles are in L2 when it starts. A hint: it changes no result, and is off
under the interpreter (no PTX there).

Pages are those of the paged cache [num_blocks, ROWS_PER, Hk, D]: a page holds ROWS_PER
positions of every KV head, contiguous, so one request covers what the Hk split programs of
that range read.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import pdl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

_BULK_PREFETCH_PTX = tl.constexpr(
    "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }")


def can_prefetch(device: torch.device) -> bool:
    """Whether the bulk L2 prefetch runs on `device`: sm_90+, not under the interpreter (and on
    CPU tensors when scripts/compile_kernels.py compiles what an H200 launches: pdl.ON_HOST)."""
    if INTERPRET:
        return False
    if device.type != "cuda":
        return pdl.ON_HOST
    return torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def split_range(context_lens_ptr, b, s, window, num_splits, BLOCK_N: tl.constexpr):
    """Cached positions [start, end) of split s of sequence b, and how many splits are non-empty."""
    ctx = tl.load(context_lens_ptr + b)
    lo = tl.where(window > 0, tl.maximum(ctx - window + 1, 0), 0)
    split_len = tl.cdiv(tl.cdiv(ctx - lo, num_splits), BLOCK_N) * BLOCK_N
    split_len = tl.maximum(split_len, BLOCK_N)
    start = lo + s * split_len
    return start, tl.minimum(start + split_len, ctx), tl.cdiv(ctx - lo, split_len)


@triton.jit
def first_pages(block_tables_ptr, stride_bt, context_lens_ptr, b, item, num_splits,
                PAGES: tl.constexpr, ROWS_PER: tl.constexpr, BLOCK_N: tl.constexpr):
    """Work items [R] of sequence b's prefetch: item = (split s, its page j < PAGES, K or V)
    -> (block number [R] int64 of that page, whether it is one a split reads, whether it is V).
    Full-context splits only (window 0)."""
    s = item // (2 * PAGES)
    j = (item // 2) % PAGES
    start, end, n_splits = split_range(context_lens_ptr, b, s, 0, num_splits, BLOCK_N)
    page = start // ROWS_PER + j  # [R] the j-th page of the split's range
    ok = (s < n_splits) & (page * ROWS_PER < end)
    block = tl.load(block_tables_ptr + b * stride_bt + page, mask=ok, other=0).to(tl.int64)
    return block, ok, item % 2 == 1


@triton.jit
def prefetch_first_pages(k_cache_ptr, v_cache_ptr, block_tables_ptr, stride_bt, context_lens_ptr, b,
                         part, parts, num_splits, PAGES: tl.constexpr, ROWS_PER: tl.constexpr,
                         BLOCK_N: tl.constexpr, PAGE_BYTES: tl.constexpr, THREADS: tl.constexpr):
    """Program `part` of `parts` brings its share of the first PAGES K and V pages of every split
    of sequence b into L2, one bulk request a lane (THREADS = the program's threads). Reads only
    the step's metadata (context length, block table), so it may run before the PDL wait."""
    lanes = tl.arange(0, THREADS)
    k_base = k_cache_ptr.to(tl.int64, bitcast=True)
    v_base = v_cache_ptr.to(tl.int64, bitcast=True)
    for i0 in range(0, num_splits * 2 * PAGES, parts * THREADS):
        item = i0 + lanes * parts + part
        block, ok, is_v = first_pages(block_tables_ptr, stride_bt, context_lens_ptr, b, item, num_splits,
                                      PAGES, ROWS_PER, BLOCK_N)
        address = tl.where(is_v, v_base, k_base) + block * PAGE_BYTES
        size = tl.where(ok, PAGE_BYTES, 0).to(tl.int32)
        tl.inline_asm_elementwise(_BULK_PREFETCH_PTX, "=r,l,r", [address, size], dtype=tl.int32,
                                  is_pure=False, pack=1)


class KVPrefetch(NamedTuple):
    """What a launch needs to prefetch the first `pages` K/V pages of each of `num_splits` splits
    (tile_n positions a tile) of the sequences of a decode batch, one token a sequence."""
    block_tables: torch.Tensor  # [B, max_blocks] int32
    context_lens: torch.Tensor  # [B] int32
    num_splits: int
    tile_n: int
    pages: int
