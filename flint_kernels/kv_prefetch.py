"""An L2 prefetch of a sliding-window layer's K/V rings, issued while the layer before it runs.

At batch 1 a sliding layer's attention reads its sequence's whole ring (513 positions x 4 KV
heads x 128 x bf16: 513 KB of K and as much of V) in 36 one-tile split programs, each waiting one
HBM round trip for its tile after the PDL wait; the ring was written by earlier steps (this
step's row is written by the layer's own qk_norm_rope, into L2). `prefetch_rings` asks the TMA
unit to bring every sequence's K and V rings of a layer into L2 (`cp.async.bulk.prefetch.L2`: one
request a CHUNK_BYTES piece, no registers, nothing to wait for). The engine launches it on a side
stream of the decode step (flint_backend/ops.py) after the previous layer's attention, so no
launch of the step's chain waits for it, and the ~1 MB arrives while that layer's MoE launches
leave HBM mostly idle. (The same a layer ahead for a full layer's first pages, 17 MB of its 205,
lost: the pages did not stay in L2 and the requests slowed the launches they ran beside;
benchmarks/NOTES.md §23.)

A hint: it changes no result. Off under the interpreter (no PTX there), where DRY_RUN stores each
request's (byte offset into the cache, bytes) instead, for tests.

Shape legend: B sequences, R ring rows (one a running sequence), W window, Hk KV heads, D head_dim.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import pdl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# On when True (a benchmark knob, read at each decode step's capture: flint_backend/model.py)
RINGS = False
CHUNK_BYTES = 32768  # bytes a request (a multiple of 16)

_PTX = tl.constexpr("{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; "
                    "mov.u32 $0, 0; }")


def can_prefetch(device: torch.device) -> bool:
    """Whether the bulk L2 prefetch runs on `device`: sm_90+, not under the interpreter (and on
    CPU tensors when scripts/compile_kernels.py compiles what an H200 launches: pdl.ON_HOST)."""
    if INTERPRET:
        return False
    if device.type != "cuda":
        return pdl.ON_HOST
    return torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def _rings_kernel(
    k_cache_ptr,    # [R, W, Hk, D] contiguous
    v_cache_ptr,    # [R, W, Hk, D] contiguous
    ring_rows_ptr,  # [B] int32 (host-written step metadata)
    named_ptr,      # [B, 2 * CHUNKS, 2] int64 (DRY_RUN): each request's (byte offset, bytes)
    RING_BYTES: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr, LANES: tl.constexpr,
    DRY_RUN: tl.constexpr,
):
    """Program b: requests c < CHUNKS cover sequence b's K ring, CHUNKS + c its V ring."""
    b = tl.program_id(0).to(tl.int64)
    item = tl.arange(0, LANES)
    live = item < 2 * CHUNKS
    c = item % CHUNKS
    row = tl.load(ring_rows_ptr + b).to(tl.int64)
    live = live & (row >= 0)  # (no ring: nothing requested)
    offset = tl.maximum(row, 0) * RING_BYTES + c * CHUNK  # [LANES] bytes into the cache
    size = tl.where(live, tl.minimum(CHUNK, RING_BYTES - c * CHUNK), 0).to(tl.int32)
    if DRY_RUN:
        named = named_ptr + (b * (2 * CHUNKS) + item) * 2
        tl.store(named, offset, mask=live)
        tl.store(named + 1, size.to(tl.int64), mask=live)
    else:
        base = tl.where(item < CHUNKS, k_cache_ptr.to(tl.int64, bitcast=True), v_cache_ptr.to(tl.int64, bitcast=True))
        tl.inline_asm_elementwise(_PTX, "=r,l,r", [base + offset, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_rings(k_cache: torch.Tensor, v_cache: torch.Tensor, ring_rows: torch.Tensor,
                   dry_run: bool = False) -> torch.Tensor | None:
    """Bring the K and V rings of the sequences in ring_rows [B] int32 into L2.
    dry_run: issue nothing; -> [B, 2, CHUNKS, 2] int64: each request's (byte offset into k_cache
    (first CHUNKS) or v_cache, bytes)."""
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"prefetch_rings: k_cache and v_cache are {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}, expected one contiguous [R, W, Hk, D] shape")
    if ring_rows.dim() != 1 or ring_rows.dtype != torch.int32:
        raise ValueError(f"prefetch_rings: ring_rows is {ring_rows.dtype} {tuple(ring_rows.shape)}, expected int32 [B]")
    ring_bytes = k_cache[0].numel() * k_cache.element_size()
    if ring_bytes % 16:
        raise ValueError(f"prefetch_rings: a ring is {ring_bytes} bytes, expected a multiple of 16")
    batch, chunks = ring_rows.shape[0], triton.cdiv(ring_bytes, CHUNK_BYTES)
    named = torch.full((batch, 2, chunks, 2), -1, dtype=torch.int64, device=k_cache.device) if dry_run else None
    if batch == 0 or not (dry_run or can_prefetch(k_cache.device)):
        return named
    _rings_kernel[(batch,)](
        k_cache_ptr=k_cache, v_cache_ptr=v_cache, ring_rows_ptr=ring_rows,
        named_ptr=named if dry_run else ring_rows, RING_BYTES=ring_bytes, CHUNK=CHUNK_BYTES, CHUNKS=chunks,
        LANES=triton.next_power_of_2(2 * chunks), DRY_RUN=dry_run, num_warps=1)
    return named
