"""A decode step launched on the device whose sampled tokens the host has not read yet (async
scheduling, see engine.py).

The tokens stay on the device in the step's argmax slots (ops.greedy_slots; decode_graphs.py), where the
next step's first launch reads its input ids; a non-blocking copy of the slots into pinned host
memory on a side stream, followed by an event, brings them to the host while the device runs that
next step.
"""

from __future__ import annotations

from typing import Callable

import torch

from flint_backend.engine.sequence import Sequence


class InFlightStep:
    def __init__(self, seqs: list[Sequence], slots: torch.Tensor, host: torch.Tensor,
                 copied: torch.cuda.Event | None, slot_tokens: Callable):
        """slots [B] int64 on the device: row r's token for seqs[r], packed (ops.greedy_slots); host:
        their copy in host memory, complete once `copied` has happened (None: already complete);
        slot_tokens: the op table's unpacking (ops.slot_tokens)."""
        self.seqs, self.slots = seqs, slots
        self._host, self._copied, self._slot_tokens = host, copied, slot_tokens
        self._row = {id(seq): r for r, seq in enumerate(seqs)}

    def rows_of(self, seqs: list[Sequence]) -> list[int]:
        """The row of each of `seqs` (all launched in this step) in `slots`."""
        return [self._row[id(seq)] for seq in seqs]

    def token_ids(self) -> list[int]:
        """Waits for the copy to the host -> the B sampled token ids."""
        if self._copied is not None:
            self._copied.synchronize()
        return self._slot_tokens(self._host).tolist()
