"""Builds a step's `StepBatch` (flint_backend.step_batch) from the engine's scheduled sequences."""

from __future__ import annotations

import numpy as np
import torch

from flint_backend.engine.sequence import Sequence
from flint_backend.step_batch import StepBatch


def build_step_batch(entries: list[tuple[Sequence, int]], block_size: int, window: int,
                     device: torch.device) -> StepBatch:
    """entries: (sequence, its n new tokens this step, from its num_computed on). The per-token
    lists grow by a range a KV block (and a ring period), not a token at a time: a prefill chunk's
    host time, which the GPU waits for (prefill steps run synchronously), is ~1.4 ms for 8192
    tokens against 4.6 token by token (CPU, bench_engine_overhead.py --prefill)."""
    ids, positions, full_slots, ring_slots, window_slots = [], [], [], [], []
    starts, context_lens, ring_rows, tables, sample_rows, sample_seqs = [0], [], [], [], [], []
    pages_open = False
    for seq, n in entries:
        first, end = seq.num_computed, seq.num_computed + n
        new = seq.token_ids[first:end]
        if len(new) != n:
            raise IndexError(f"{seq.request_id}: {n} tokens from {first} scheduled, {len(seq.token_ids)} known")
        ids += new
        positions += range(first, end)
        for j in range(first // block_size, (end - 1) // block_size + 1):  # the KV blocks the tokens fall in
            lo, hi = max(j * block_size, first), min((j + 1) * block_size, end)
            shift = (seq.block_table[j] - j) * block_size  # position -> slot
            full_slots += range(lo + shift, hi + shift)
            page = seq.open_pages.get(j)
            if page is None:
                window_slots += [-1] * (hi - lo)
            else:
                shift = (page.page - j) * block_size
                window_slots += range(lo + shift, hi + shift)
                pages_open = True
        kept = max(first, end - window)  # only a chunk's last W land in the ring
        ring_slots += [-1] * (kept - first)
        for w in range(kept // window, (end - 1) // window + 1):  # ring periods: at most two
            lo, hi = max(w * window, kept), min((w + 1) * window, end)
            shift = (seq.ring_row - w) * window
            ring_slots += range(lo + shift, hi + shift)
        starts.append(starts[-1] + n)
        context_lens.append(first)
        ring_rows.append(seq.ring_row)
        tables.append(seq.block_table)
        if end == seq.num_tokens:
            sample_rows.append(starts[-1] - 1)
            sample_seqs.append(seq)
    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) for t in tables]

    def tensor(values, dtype):  # (through numpy: torch converts a list of ints ~7x slower)
        return torch.from_numpy(np.array(values, dtype)).to(device, non_blocking=True)

    return StepBatch(
        input_ids=tensor(ids, np.int64),
        positions=tensor(positions, np.int64),
        query_start_loc=tensor(starts, np.int32),
        context_lens=tensor(context_lens, np.int32),
        block_tables=tensor(padded, np.int32),
        ring_rows=tensor(ring_rows, np.int32),
        full_slots=tensor(full_slots, np.int64),
        ring_slots=tensor(ring_slots, np.int64),
        sample_rows=tensor(sample_rows, np.int64),
        window_slots=tensor(window_slots, np.int64) if pages_open else None,
        decode_only=all(n == 1 for _, n in entries),
        max_query_len=max(n for _, n in entries),
        sample_seqs=sample_seqs,
    )
