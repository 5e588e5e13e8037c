"""The flattened inputs of one forward step: every scheduled token of every sequence in one row,
with the KV-cache metadata the attention kernels read. The engine builds it
(`flint_backend.engine.step_batch.build_step_batch`); the model reads it.

N tokens this step, B sequences, S sequences that sample a token (their prefill is complete).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    sample_seqs: list              # host side: the engine's sequences that sample, in sample_rows order
    window_slots: torch.Tensor | None = None  # [N] int64, prefill steps: window-page slot of every token
                                              #   (prefix caching), -1 where none; None: no page open
    # decode graphs under async scheduling (decode_graphs.py; None elsewhere):
    prev_rows: torch.Tensor | None = None     # [N] int64, row of prev_slots holding the id, or -1
    prev_slots: torch.Tensor | None = None    # [M] int64, the previous step's tokens (greedy.py slots)
    greedy_slots: torch.Tensor | None = None  # [S] int64, this step's: the LM head's argmax lands here

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
