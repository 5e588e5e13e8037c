"""Token pairs sorted by expert for the grouped MoE GEMMs: one or two launches, no host sync.

A pair is (token t, slot k), p = t * SLOTS + k: slots 0..K-1 are the routed choices, slot K (when
SLOTS = K + 1) the shared expert, expert id E. (Index bookkeeping only: no arithmetic on values.) Output: each expert's pairs in a run padded to a
multiple of BLOCK_M (padding rows hold P), runs in expert order; block_expert[b] = the expert of
rows [b BLOCK_M, (b + 1) BLOCK_M), >= the expert count past the last run. The number of blocks is
bounded on the host by cdiv(P, BLOCK_M) + experts, so the grid never waits on the device.

Program c owns pairs [c BLOCK_P, (c + 1) BLOCK_P) (none past P: the grid also has a program for
each BLOCK_B blocks of the block table, which it fills with the others): it needs each expert's
pair count (all pairs, and those in the chunks before its own), so it knows each run's start and
how many of the expert's pairs come before its chunk. A few chunks (decode batches): every
program histograms every pair itself, one step a chunk. From HIST_MIN_CHUNKS chunks (prefill) a
launch before it writes each chunk's histogram to a [chunks, E] table, which every program then
sums (a prefill chunk of 8192 tokens is 56 chunks: 56 dependent histogram steps a program
otherwise). Atomics on the program's own per-expert cursors order its pairs inside their runs
(the order within a run is arbitrary; every pair's GEMM row is computed alone, so results are
not). The cursors live in the cached zero buffer of split_k.py; each program zeroes its own again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_args, pdl_prologue
from .split_k import arrival_counters
from .tuning import INTERPRET

BLOCK_P = 64 if INTERPRET else 1024  # pairs per program
BLOCK_B = 16                         # blocks per step of the block-table loop
# From this many chunks of BLOCK_P pairs the chunks' histograms come from a launch of their own
# (_moe_hist_kernel) instead of each program's loop over every chunk. H100 2026-12-06 (4f7e8c3,
# sweep_tiles.py --only sort): 256 tokens (2 chunks) 12.1 -> 10.8 us, 1024 (7) 19.9 -> 11.3, 8192
# (56) 111.6 -> 17.9; one chunk (64 tokens) 10.5 either way
HIST_MIN_CHUNKS = 2
HIST_ROWS = 8                        # table rows a step of the sum over it


@triton.jit
def _chunk_experts(ids_ptr, c, P, E, K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_P: tl.constexpr):
    """-> (pairs [BLOCK_P] of chunk c, their experts: E for the shared slot and past P)."""
    pairs = c * BLOCK_P + tl.arange(0, BLOCK_P)
    slot = pairs % SLOTS
    return pairs, tl.load(ids_ptr + (pairs // SLOTS) * K + slot, mask=(pairs < P) & (slot < K), other=E)


@triton.jit(do_not_specialize=["P"])  # counts of tokens (moe_grouped.py: first-use compiles)
def _moe_hist_kernel(
    ids_ptr,   # [T, K] int32
    hist_ptr,  # [chunks, E_POW2] int32 out: pairs of each expert in chunk c
    P, E,
    K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_P: tl.constexpr, E_POW2: tl.constexpr, PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    c = tl.program_id(0)
    pairs, e = _chunk_experts(ids_ptr, c, P, E, K, SLOTS, BLOCK_P)
    tl.store(hist_ptr + c * E_POW2 + tl.arange(0, E_POW2), tl.histogram(e, E_POW2, mask=pairs < P))


@triton.jit(do_not_specialize=["P", "num_blocks", "chunks"])  # counts of tokens (moe_grouped.py: first-use compiles)
def _moe_sort_kernel(
    ids_ptr,           # [T, K] int32
    sorted_pairs_ptr,  # [NUM_BLOCKS * BLOCK_M] int32 out
    block_expert_ptr,  # [NUM_BLOCKS] int32 out
    base_ptr,          # [programs, E_POW2] int32 scratch: where this chunk's pairs of each expert start
    cursor_ptr,        # [programs, E_POW2] int32, zero (left zero)
    hist_ptr,          # [chunks, E_POW2] int32: each chunk's histogram (HIST: _moe_hist_kernel's)
    P, E, N_EXP, num_blocks, chunks,
    K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_B: tl.constexpr, E_POW2: tl.constexpr, HIST: tl.constexpr, HIST_ROWS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    c = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    total = tl.zeros([E_POW2], tl.int32)   # pairs per expert
    before = tl.zeros([E_POW2], tl.int32)  # ... in the chunks before this program's
    if HIST:
        for r0 in range(0, chunks, HIST_ROWS):
            rows = r0 + tl.arange(0, HIST_ROWS)
            h = tl.load(hist_ptr + rows[:, None] * E_POW2 + experts[None, :], mask=rows[:, None] < chunks, other=0)
            total += tl.sum(h, axis=0)
            before += tl.sum(tl.where(rows[:, None] < c, h, 0), axis=0)
    else:
        for chunk in range(chunks):
            pairs, e = _chunk_experts(ids_ptr, chunk, P, E, K, SLOTS, BLOCK_P)
            h = tl.histogram(e, E_POW2, mask=pairs < P)
            total += h
            before += tl.where(chunk < c, h, 0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded

    pairs, e = _chunk_experts(ids_ptr, c, P, E, K, SLOTS, BLOCK_P)
    valid = pairs < P
    row = c * E_POW2
    tl.store(base_ptr + row + experts, starts + before)
    tl.debug_barrier()
    rank = tl.atomic_add(cursor_ptr + row + e, 1, mask=valid)  # order among this chunk's pairs of e
    tl.store(sorted_pairs_ptr + tl.load(base_ptr + row + e, mask=valid, other=0) + rank, pairs, mask=valid)
    tl.debug_barrier()
    tl.store(cursor_ptr + row + experts, tl.zeros([E_POW2], tl.int32))

    step = tl.num_programs(0) * BLOCK_B
    for b0 in range(c * BLOCK_B, num_blocks, step):  # this program's share of the block table
        blocks = b0 + tl.arange(0, BLOCK_B)
        owner = tl.sum((ends[None, :] <= blocks[:, None] * BLOCK_M).to(tl.int32), axis=1)  # [BLOCK_B]
        tl.store(block_expert_ptr + blocks, owner, mask=blocks < num_blocks)
        hit = experts[None, :] == owner[:, None]
        used = tl.sum(tl.where(hit, total, 0), axis=1)       # the owner's pairs
        first = tl.sum(tl.where(hit, starts, 0), axis=1)     # its run's first row
        rows = blocks[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        pad = (owner[:, None] >= N_EXP) | (rows - first[:, None] >= used[:, None])
        tl.store(sorted_pairs_ptr + rows, tl.full([BLOCK_B, BLOCK_M], 0, tl.int32) + P,
                 mask=pad & (blocks[:, None] < num_blocks))


def sort_pairs(topk_ids: torch.Tensor, num_experts: int, has_shared: bool,
               block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [T, K] int32 -> sorted_pairs [B * block_m] int32, block_expert [B] int32,
    B = cdiv(P, block_m) + experts (experts = num_experts + has_shared, P = T * (K + has_shared))."""
    t, k = topk_ids.shape
    slots, n_exp = k + has_shared, num_experts + has_shared
    p = t * slots
    blocks = triton.cdiv(p, block_m) + n_exp
    device = topk_ids.device
    sorted_pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=device)
    # a program a chunk of pairs, and at least one a BLOCK_B step of the block table (decode
    # batches: one chunk, ~E / BLOCK_B steps)
    chunks = triton.cdiv(p, BLOCK_P)
    programs = max(1, chunks, triton.cdiv(blocks, BLOCK_B))
    e_pow2 = triton.next_power_of_2(n_exp)
    warps = 4 if INTERPRET else 8
    hist = chunks >= HIST_MIN_CHUNKS
    table = torch.empty((chunks, e_pow2), dtype=torch.int32, device=device) if hist else topk_ids  # (unread)
    if hist:
        _moe_hist_kernel[(chunks,)](
            ids_ptr=topk_ids, hist_ptr=table, P=p, E=num_experts,
            K=k, SLOTS=slots, BLOCK_P=BLOCK_P, E_POW2=e_pow2, **launch_args(device), num_warps=warps)
    _moe_sort_kernel[(programs,)](
        ids_ptr=topk_ids, sorted_pairs_ptr=sorted_pairs, block_expert_ptr=block_expert,
        base_ptr=torch.empty((programs, e_pow2), dtype=torch.int32, device=device),
        cursor_ptr=arrival_counters(programs * e_pow2, device), hist_ptr=table,
        P=p, E=num_experts, N_EXP=n_exp, num_blocks=blocks, chunks=chunks,
        K=k, SLOTS=slots, BLOCK_M=block_m, BLOCK_P=BLOCK_P, BLOCK_B=BLOCK_B, E_POW2=e_pow2,
        HIST=hist, HIST_ROWS=HIST_ROWS, **launch_args(device), num_warps=warps,
    )
    return sorted_pairs, block_expert


def sort_pairs_torch(topk_ids: torch.Tensor, num_experts: int, has_shared: bool,
                     block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same signature and layout as `sort_pairs`; pairs in increasing order within each run."""
    t, k = topk_ids.shape
    device = topk_ids.device
    ids = topk_ids.long()
    if has_shared:
        ids = torch.cat([ids, torch.full((t, 1), num_experts, dtype=torch.long, device=device)], dim=1)
    flat = ids.reshape(-1)                                                        # [P] expert of pair p
    n_exp = num_experts + has_shared
    counts = torch.zeros(n_exp, dtype=torch.long, device=device).index_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)                                      # pairs by expert
    expert = flat[order]
    rank = torch.arange(flat.numel(), device=device) - (counts.cumsum(0) - counts)[expert]
    blocks = triton.cdiv(flat.numel(), block_m) + n_exp
    sorted_pairs = torch.full((blocks * block_m,), flat.numel(), dtype=torch.int32, device=device)
    sorted_pairs[ends[expert] - padded[expert] + rank] = order.to(torch.int32)
    starts = torch.arange(blocks, device=device) * block_m
    block_expert = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    return sorted_pairs, block_expert
