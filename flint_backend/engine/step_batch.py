"""Builds a step's `StepBatch` (flint_backend.step_batch) from the engine's scheduled sequences."""

from __future__ import annotations

import torch

from flint_backend.engine.sequence import Sequence
from flint_backend.step_batch import StepBatch


def build_step_batch(entries: list[tuple[Sequence, int]], block_size: int, window: int,
                     device: torch.device) -> StepBatch:
    ids, positions, full_slots, ring_slots, window_slots = [], [], [], [], []
    starts, context_lens, ring_rows, tables, sample_rows, sample_seqs = [0], [], [], [], [], []
    for seq, n in entries:
        first = seq.num_computed
        for p in range(first, first + n):
            ids.append(seq.token_ids[p])
            positions.append(p)
            full_slots.append(seq.block_table[p // block_size] * block_size + p % block_size)
            keep = p >= first + n - window
            ring_slots.append(seq.ring_row * window + p % window if keep else -1)
            page = seq.open_pages.get(p // block_size)
            window_slots.append(page.page * block_size + p % block_size if page is not None else -1)
        starts.append(starts[-1] + n)
        context_lens.append(first)
        ring_rows.append(seq.ring_row)
        tables.append(seq.block_table)
        if first + n == seq.num_tokens:
            sample_rows.append(starts[-1] - 1)
            sample_seqs.append(seq)
    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) for t in tables]

    def tensor(values, dtype):
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    return StepBatch(
        input_ids=tensor(ids, torch.int64),
        positions=tensor(positions, torch.int64),
        query_start_loc=tensor(starts, torch.int32),
        context_lens=tensor(context_lens, torch.int32),
        block_tables=tensor(padded, torch.int32),
        ring_rows=tensor(ring_rows, torch.int32),
        full_slots=tensor(full_slots, torch.int64),
        ring_slots=tensor(ring_slots, torch.int64),
        sample_rows=tensor(sample_rows, torch.int64),
        window_slots=tensor(window_slots, torch.int64) if any(s >= 0 for s in window_slots) else None,
        decode_only=all(n == 1 for _, n in entries),
        max_query_len=max(n for _, n in entries),
        sample_seqs=sample_seqs,
    )
