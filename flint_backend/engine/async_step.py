"""A decode step launched on the device whose sampled tokens the host has not read yet (async
scheduling, see engine.py).

The tokens stay on the device in the step's argmax slots (greedy.py; decode_graphs.py), where the
next step's first launch reads its input ids; a non-blocking copy of the slots into pinned host
memory on a side stream, followed by an event, brings them to the host while the device runs that
next step.
"""

from __future__ import annotations

import torch

from flint_backend.engine.sequence import Sequence
from flint_kernels import greedy


class InFlightStep:
    def __init__(self, seqs: list[Sequence], slots: torch.Tensor, host: torch.Tensor,
                 copied: torch.cuda.Event | None):
        """slots [B] int64 on the device: row r's token for seqs[r], packed (greedy.py); host: their
        copy in host memory, complete once `copied` has happened (None: already complete)."""
        self.seqs, self.slots = seqs, slots
        self._host, self._copied = host, copied
        self._row = {id(seq): r for r, seq in enumerate(seqs)}

    def rows_of(self, seqs: list[Sequence]) -> list[int]:
        """The row of each of `seqs` (all launched in this step) in `slots`."""
        return [self._row[id(seq)] for seq in seqs]

    def token_ids(self) -> list[int]:
        """Waits for the copy to the host -> the B sampled token ids."""
        if self._copied is not None:
            self._copied.synchronize()
        return greedy.token(self._host).tolist()
