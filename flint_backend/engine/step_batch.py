"""The flattened inputs of one forward step: every scheduled token of every sequence in one row,
with the KV-cache metadata the attention kernels read.

N tokens this step, B sequences, S sequences that sample a token (their prefill is complete).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint_backend.engine.sequence import Sequence


@dataclass
class StepBatch:
    input_ids: torch.Tensor        # [N] int64
    positions: torch.Tensor        # [N] int64
    query_start_loc: torch.Tensor  # [B+1] int32
    context_lens: torch.Tensor     # [B] int32, tokens already cached before this step
    block_tables: torch.Tensor     # [B, max_blocks] int32, full-attention layers
    ring_rows: torch.Tensor        # [B] int32, sliding layers
    full_slots: torch.Tensor       # [N] int64, paged slot of every token
    ring_slots: torch.Tensor       # [N] int64, ring slot of every token; -1 where a later token of the
                                   #   same chunk lands on the same slot (only the last W are kept)
    sample_rows: torch.Tensor      # [S] int64, rows of the tokens whose logits are sampled
    decode_only: bool              # every sequence has exactly one new token
    max_query_len: int
    sample_seqs: list[Sequence]    # host side: who samples, in sample_rows order
    # decode graphs under async scheduling (decode_graphs.py; None elsewhere):
    prev_rows: torch.Tensor | None = None     # [N] int64, row of prev_slots holding the id, or -1
    prev_slots: torch.Tensor | None = None    # [M] int64, the previous step's tokens (greedy.py slots)
    greedy_slots: torch.Tensor | None = None  # [S] int64, this step's: the LM head's argmax lands here

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


def build_step_batch(entries: list[tuple[Sequence, int]], block_size: int, window: int,
                     device: torch.device) -> StepBatch:
    ids, positions, full_slots, ring_slots = [], [], [], []
    starts, context_lens, ring_rows, tables, sample_rows, sample_seqs = [0], [], [], [], [], []
    for seq, n in entries:
        first = seq.num_computed
        for p in range(first, first + n):
            ids.append(seq.token_ids[p])
            positions.append(p)
            full_slots.append(seq.block_table[p // block_size] * block_size + p % block_size)
            keep = p >= first + n - window
            ring_slots.append(seq.ring_row * window + p % window if keep else -1)
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
        decode_only=all(n == 1 for _, n in entries),
        max_query_len=max(n for _, n in entries),
        sample_seqs=sample_seqs,
    )
