"""Split reductions finished inside the same launch ("last program to arrive").

Each program of a split stores its fp32 partial, then bumps the arrival counter of its output
tile; the program that arrives last sums the partials in split order (deterministic: the same
bits on every run) and writes the result, then resets the counter to 0. So a split-K GEMV
costs one launch, no memset and no atomics on data. Counters live in a per-device cached int32
buffer that is zero between launches; launches that run concurrently on several streams must
not share it (the engine runs one stream). Numerics: partials and their sum in fp32, so a split
launch differs from an unsplit one by the order of the fp32 sum only.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

_COUNTERS: dict[tuple[str, int | None], torch.Tensor] = {}
# 1 MB: prefill-sized launches fit, so the buffer is not reallocated under a captured CUDA graph
# (capture after a warm-up at the largest batch, as for every cached buffer)
MIN_COUNTERS = 1 << 18


def arrival_counters(count: int, device: torch.device) -> torch.Tensor:
    """A zero int32 buffer of at least `count` counters on `device` (cached; kernels leave it zero)."""
    key = (device.type, device.index)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < count:
        buf = torch.zeros(max(count, MIN_COUNTERS), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


@triton.jit
def last_to_arrive(counter_ptr, num_splits):
    """True in exactly one of the `num_splits` programs sharing the counter: the last one, which
    then sees every other program's stores (call after storing the partial)."""
    tl.debug_barrier()  # all threads' partial stores precede the release of the atomic
    old = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = old == num_splits - 1
    tl.store(counter_ptr, 0, mask=last)  # every program has arrived: ready for the next launch
    return last


@triton.jit
def finish_split(y, scale, out_ptrs, part_ptr, offs, mask, s, split_stride, counter_ptr,
                 SPLIT: tl.constexpr, ROUND_TO: tl.constexpr = None):
    """Writes out = sum over splits of y, times `scale` (broadcast to y), in out's dtype
    (rounded to ROUND_TO first, when given: fp32 logits with a bf16 linear's roundings).

    y: this program's fp32 partial; offs: its element offsets inside one split's slice of the
    fp32 scratch part_ptr ([SPLIT, ...], slices split_stride apart); s: this program's split."""
    if SPLIT == 1:
        tl.store(out_ptrs, _rounded(y * scale, ROUND_TO).to(out_ptrs.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + s.to(tl.int64) * split_stride + offs, y, mask=mask)
        if last_to_arrive(counter_ptr, SPLIT):
            total = tl.zeros(y.shape, tl.float32)
            for i in tl.static_range(SPLIT):
                total += tl.load(part_ptr + i * split_stride.to(tl.int64) + offs, mask=mask, other=0.0,
                                 cache_modifier=".cg")
            tl.store(out_ptrs, _rounded(total * scale, ROUND_TO).to(out_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _rounded(y, ROUND_TO: tl.constexpr):
    if ROUND_TO is not None:
        y = y.to(ROUND_TO)
    return y


@triton.jit
def gemv_program(N, K, k_per_split, BLOCK_N: tl.constexpr):
    """The split-K GEMV grid (token, row block, split) -> (t, nb, s, rows [BLOCK_N], row_mask,
    k range [k_lo, k_hi) of this split)."""
    t = tl.program_id(0)
    nb = tl.program_id(1)
    s = tl.program_id(2)
    rows = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = s * k_per_split
    return t, nb, s, rows, rows < N, k_lo, tl.minimum(k_lo + k_per_split, K)


# SMs assumed without a GPU: the interpreter keeps grids small; tools/bench/compile_kernels.py sets
# the H200's count to compile the launches a GPU would make
HOST_SMS = 4


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return HOST_SMS
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def pick_splits(programs: int, k_blocks: int, device: torch.device, waves: int = 2) -> int:
    """Splits of the reduction so `programs` output tiles give about `waves` programs per SM,
    each split keeping at least one K block; a power of two."""
    want = triton.cdiv(waves * num_sms(device), max(programs, 1))
    splits = 1
    while splits * 2 <= min(want, k_blocks):
        splits *= 2
    return splits
