"""Builds a step's `StepBatch` (flint_backend.step_batch) from the engine's scheduled sequences."""

from __future__ import annotations

import numpy as np
import torch

from flint_backend.engine.sequence import Sequence
from flint_backend.step_batch import StepBatch


def build_step_batch(entries: list[tuple[Sequence, int]], block_size: int, window: int,
                     device: torch.device) -> StepBatch:
    """entries: (sequence, its n new tokens this step, from its num_computed on). The per-token
    arrays are computed for all tokens at once in numpy: a prefill chunk's host time, which the
    GPU waits for (prefill steps run synchronously), is 0.6 ms for 8192 tokens against 3.7 ms
    token by token (CPU, docs/performance.md)."""
    b = len(entries)
    counts = np.fromiter((n for _, n in entries), np.int64, b)
    firsts = np.fromiter((seq.num_computed for seq, _ in entries), np.int64, b)
    starts = np.zeros(b + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    entry = np.repeat(np.arange(b), counts)                            # [N] the entry of each token
    positions = np.arange(starts[-1]) - starts[entry] + firsts[entry]  # [N]
    ids = []  # (a list to a tensor through numpy: torch converts a list of ints ~7x slower)
    for seq, n in entries:
        new = seq.token_ids[seq.num_computed:seq.num_computed + n]
        if len(new) != n:
            raise IndexError(f"{seq.request_id}: {n} tokens from {seq.num_computed} scheduled, "
                             f"{len(seq.token_ids)} known")
        ids += new
    width = max(len(seq.block_table) for seq, _ in entries)
    tables = np.zeros((b, width), np.int64)                            # [B, width], 0 past a table's end
    for i, (seq, _) in enumerate(entries):
        tables[i, :len(seq.block_table)] = seq.block_table
    offsets = positions % block_size
    full_slots = tables[entry, positions // block_size] * block_size + offsets
    ring_rows = np.fromiter((seq.ring_row for seq, _ in entries), np.int64, b)
    keep = positions >= (firsts + counts)[entry] - window              # only the last W of a chunk
    ring_slots = np.where(keep, ring_rows[entry] * window + positions % window, -1)
    window_slots = np.full(starts[-1], -1, np.int64)
    for i, (seq, n) in enumerate(entries):
        for j, page in seq.open_pages.items():
            lo, hi = max(j * block_size, firsts[i]), min((j + 1) * block_size, firsts[i] + n)
            if lo < hi:
                rows = slice(starts[i] + lo - firsts[i], starts[i] + hi - firsts[i])
                window_slots[rows] = page.page * block_size + offsets[rows]
    sampled = [i for i, (seq, n) in enumerate(entries) if firsts[i] + n == seq.num_tokens]

    def tensor(values, dtype):
        return torch.from_numpy(np.asarray(values, dtype)).to(device, non_blocking=True)

    return StepBatch(
        input_ids=tensor(ids, np.int64),
        positions=tensor(positions, np.int64),
        query_start_loc=tensor(starts, np.int32),
        context_lens=tensor(firsts, np.int32),
        block_tables=tensor(tables, np.int32),
        ring_rows=tensor(ring_rows, np.int32),
        full_slots=tensor(full_slots, np.int64),
        ring_slots=tensor(ring_slots, np.int64),
        sample_rows=tensor(starts[1:][sampled] - 1, np.int64),
        window_slots=tensor(window_slots, np.int64) if (window_slots >= 0).any() else None,
        decode_only=bool((counts == 1).all()),
        max_query_len=int(counts.max()),
        sample_seqs=[entries[i][0] for i in sampled],
    )
