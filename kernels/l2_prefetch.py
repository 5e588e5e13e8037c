"""L2 prefetch: a kernel asks for a later kernel's weights to be brought from HBM into L2.

At batch 1 a kernel's programs load their weights before the PDL wait (pdl.py), but only once
they are resident, and a launch whose programs fill the register file keeps the next launch's
programs off the SMs until it retires: the MoE gate/up launch (4 programs an SM, ~55K of the
64K registers) holds back the down launch (37K a program), whose "prefetched" expert rows then
load from HBM on the critical path. `l2_prefetch` issues one `cp.async.bulk.prefetch.L2` (the
SM's TMA unit fetches the range into L2; no registers, nothing to wait for), so the later loads
hit L2. It changes no result: a hint, skipped under the interpreter (no PTX there) and off
wherever a launcher passes ON=False. On the H200 both uses measured slower (the prefetch competes
with the launch's own HBM reads: benchmarks/NOTES.md §14), so their knobs default to off.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BULK_PREFETCH_PTX = tl.constexpr(
    "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }")


@triton.jit
def l2_prefetch(address, nbytes, THREADS: tl.constexpr, ON: tl.constexpr):
    """Brings bytes [address, address + nbytes) (int64 address) into L2: the 16-byte-aligned part
    of the range, one bulk request from one of the program's THREADS (= 32 * num_warps) threads."""
    if ON:
        lane = tl.arange(0, THREADS)  # one element a thread: lane 0 issues, the others skip
        start = (address + 15) // 16 * 16
        end = (address + nbytes) // 16 * 16
        size = tl.where(lane == 0, tl.maximum(end - start, 0), 0).to(tl.int32)
        tl.inline_asm_elementwise(_BULK_PREFETCH_PTX, "=r,l,r", [start + lane * 0, size], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def address_of(ptr):
    """A pointer as an int64 byte address."""
    return ptr.to(tl.int64, bitcast=True)


@triton.jit
def l2_prefetch_share(ptr, nbytes, part, parts, THREADS: tl.constexpr, ON: tl.constexpr):
    """Program `part` of `parts` brings its 1/parts of bytes [ptr, ptr + nbytes) into L2."""
    chunk = tl.cdiv(nbytes, parts)
    lo = part.to(tl.int64) * chunk
    l2_prefetch(address_of(ptr) + lo, tl.minimum(chunk, nbytes - lo), THREADS, ON)


def prefetchable(w) -> bool:
    """Whether weight_regions takes w (its regions are contiguous)."""
    parts = (w.packed, w.scales) if all(hasattr(w, a) for a in ("packed", "scales", "scale")) else (w,)
    return all(isinstance(t, torch.Tensor) and t.is_contiguous() for t in parts)


def weight_regions(w) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """A weight's bytes as two regions (pointer tensors and byte sizes): an NVFP4 weight's packed
    values and block scales (duck-typed, nvfp4.py), or a dense tensor and nothing; each region
    contiguous. -> (values, scales, values' bytes, scales' bytes)."""
    parts = (w.packed, w.scales) if all(hasattr(w, a) for a in ("packed", "scales", "scale")) else (w,)
    for t in parts:
        if not t.is_contiguous():
            raise ValueError(f"l2_prefetch: weight region {tuple(t.shape)} strides {t.stride()}, expected contiguous")
    values, scales = parts[0], parts[-1]
    return values, scales, values.numel() * values.element_size(), \
        (scales.numel() * scales.element_size() if len(parts) == 2 else 0)
