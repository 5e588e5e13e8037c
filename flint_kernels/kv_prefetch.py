"""An L2 prefetch of a full-attention layer's first K/V pages, issued a layer ahead.

At 100K context a full layer's split kernel streams its 205 MB of K/V at ~94% of copy speed
(benchmarks/NOTES.md §16): the 14 full layers take ~0.7 ms of a batch-1 decode step, while the
sliding layer before each of them is a chain of latency-bound launches that leave HBM mostly
idle (~23 MB in ~28 us, NVFP4). `prefetch_first_pages` asks the TMA unit to bring the first
PAGES K and V pages of every split's range into L2 (`cp.async.bulk.prefetch.L2`: one request a
page, no registers, nothing to wait for), so that part of the split's read comes from L2 when it
starts. The engine launches it on a side stream of the decode step (flint_backend/ops.py), after
the previous layer's attention, so no launch of the step's chain waits for it or carries it.

§17 of the notes issued the same requests from the full layer's own qk_norm_rope, ~1-2 us before
the split: they arrived while the split already streamed (2.473 -> 2.469 ms). A layer ahead they
have ~20 us to arrive, and the question is whether they stay in L2 under the ~18 MB of weights
the launches between stream through it (EVICT_LAST marks them to be kept first).

A hint: it changes no result. Off under the interpreter (no PTX there), where DRY_RUN stores
the (block, K or V) each request names instead, for tests.

Shape legend: B sequences (one new token each), S splits, P pages a split, Hk KV heads, D head_dim.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import decode_attention as decode_attention_k
from . import pdl
from .decode_attention import split_range

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# K and V pages prefetched at the start of each split's range: 0 = off (a benchmark knob, read at
# each launch, like the two below)
PAGES = 0
# programs issuing the requests: 0 = one per (sequence, split); fewer issue them more slowly
# (one SM's TMA unit takes ~150 GB/s of prefetches: NOTES §17), spreading the read over the layer
PROGRAMS = 0
EVICT_LAST = False  # requests carry an L2 evict_last policy (createpolicy), else the default

_PTX = tl.constexpr("{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }")
_PTX_EVICT_LAST = tl.constexpr("{ .reg .pred p; .reg .b64 pol; setp.gt.s32 p, $2, 0; "
                   "createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
                   "@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol; mov.u32 $0, 0; }")


def can_prefetch(device: torch.device) -> bool:
    """Whether the bulk L2 prefetch runs on `device`: sm_90+, not under the interpreter (and on
    CPU tensors when scripts/compile_kernels.py compiles what an H200 launches: pdl.ON_HOST)."""
    if INTERPRET:
        return False
    if device.type != "cuda":
        return pdl.ON_HOST
    return torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def _first_pages_kernel(
    k_cache_ptr,       # [num_blocks, BLOCK_SIZE, Hk, D] contiguous
    v_cache_ptr,       # [num_blocks, BLOCK_SIZE, Hk, D] contiguous
    block_tables_ptr,  # [B, max_blocks] int32
    context_lens_ptr,  # [B] int32: cached positions [0, ctx) (the new token is not read)
    named_ptr,         # [B * S * 2P] int64 (DRY_RUN): the block each item names, -1 where none
    stride_bt, num_items, num_splits,
    PAGES: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, PAGE_BYTES: tl.constexpr,
    LANES: tl.constexpr, EVICT_LAST: tl.constexpr, DRY_RUN: tl.constexpr,
):
    """Item i = (sequence b, split s, page j < PAGES, K or V), in that order; program p takes
    items p * LANES + lane, then a stride of the grid. Reads only the step's metadata."""
    k_base = k_cache_ptr.to(tl.int64, bitcast=True)
    v_base = v_cache_ptr.to(tl.int64, bitcast=True)
    for i0 in range(tl.program_id(0) * LANES, num_items, tl.num_programs(0) * LANES):
        item = i0 + tl.arange(0, LANES)
        live = item < num_items
        b = (item // (num_splits * 2 * PAGES)).to(tl.int64)
        s = (item // (2 * PAGES)) % num_splits
        j = (item // 2) % PAGES
        # the split kernel's ranges: full layers (window 0), TILE_N-aligned split lengths
        start, end, n_splits = split_range(context_lens_ptr, tl.where(live, b, 0), s, 0, num_splits, TILE_N)
        page = start // BLOCK_SIZE + j  # [LANES] the j-th page of the split's range
        ok = live & (s < n_splits) & (page * BLOCK_SIZE < end)
        block = tl.load(block_tables_ptr + b * stride_bt + page, mask=ok, other=0).to(tl.int64)
        is_v = item % 2 == 1
        if DRY_RUN:
            tl.store(named_ptr + item, tl.where(ok, block, -1), mask=live)
        else:
            address = tl.where(is_v, v_base, k_base) + block * PAGE_BYTES
            size = tl.where(ok, PAGE_BYTES, 0).to(tl.int32)
            tl.inline_asm_elementwise(_PTX_EVICT_LAST if EVICT_LAST else _PTX, "=r,l,r", [address, size],
                                      dtype=tl.int32, is_pure=False, pack=1)


def prefetch_first_pages(k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                         context_lens: torch.Tensor, num_splits: int | None = None, pages: int | None = None,
                         programs: int | None = None, evict_last: bool | None = None,
                         dry_run: bool = False) -> torch.Tensor | None:
    """Bring the first `pages` (default PAGES) K and V pages of each of the `num_splits` (default:
    decode_attention's for a full layer) splits of each sequence's cached positions into L2;
    programs and evict_last default to PROGRAMS and EVICT_LAST.
    dry_run: issue nothing; -> [B, S, P, 2] int64 block numbers named (K, V), -1 where none."""
    pages = PAGES if pages is None else pages
    _check(k_cache, v_cache, block_tables, context_lens, num_splits, pages)
    batch, hk = context_lens.shape[0], k_cache.shape[2]
    splits = num_splits or decode_attention_k.default_num_splits(batch, hk, 0, context_lens.device)
    items = batch * splits * 2 * pages
    named = torch.full((items,), -1, dtype=torch.int64, device=k_cache.device) if dry_run else None
    if items == 0 or not (dry_run or can_prefetch(k_cache.device)):
        return None if named is None else named.view(batch, splits, pages, 2)
    lanes = triton.next_power_of_2(2 * pages)  # one program a (sequence, split) by default
    groups = triton.cdiv(items, lanes)
    programs = PROGRAMS if programs is None else programs
    _first_pages_kernel[(min(programs, groups) if programs > 0 else groups,)](
        k_cache_ptr=k_cache, v_cache_ptr=v_cache, block_tables_ptr=block_tables, context_lens_ptr=context_lens,
        named_ptr=named if dry_run else context_lens, stride_bt=block_tables.stride(0), num_items=items,
        num_splits=splits, PAGES=pages, BLOCK_SIZE=k_cache.shape[1], TILE_N=decode_attention_k.TILE_N,
        PAGE_BYTES=k_cache[0].numel() * k_cache.element_size(), LANES=lanes,
        EVICT_LAST=EVICT_LAST if evict_last is None else evict_last,
        DRY_RUN=dry_run, num_warps=1)
    return None if named is None else named.view(batch, splits, pages, 2)


def _check(k_cache, v_cache, block_tables, context_lens, num_splits, pages):
    """ValueError naming the field that does not describe a decode step of a paged layer."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or not (k_cache.is_contiguous()
                                                                    and v_cache.is_contiguous()):
        raise ValueError(f"prefetch_first_pages: k_cache {tuple(k_cache.shape)} and v_cache "
                         f"{tuple(v_cache.shape)}, expected equal contiguous [num_blocks, block_size, Hk, D]")
    batch = context_lens.shape[0]
    if context_lens.dim() != 1 or context_lens.dtype != torch.int32:
        raise ValueError(f"prefetch_first_pages: context_lens is {context_lens.dtype} "
                         f"{tuple(context_lens.shape)}, expected int32 [B]")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or block_tables.stride(1) != 1 \
            or block_tables.dtype != torch.int32:
        raise ValueError(f"prefetch_first_pages: block_tables is {block_tables.dtype} "
                         f"{tuple(block_tables.shape)}, expected int32 [{batch}, max_blocks] with unit stride")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"prefetch_first_pages: num_splits {num_splits}, expected >= 1")
    if pages < 1:
        raise ValueError(f"prefetch_first_pages: pages {pages}, expected >= 1")
