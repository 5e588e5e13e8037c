"""A decode step launched on the device whose sampled tokens the host has not read yet (async
scheduling, see engine.py).

The tokens stay on the device, where the next step gathers its input ids from them; a
non-blocking copy into pinned host memory, followed by an event, brings them to the host while
the device runs that next step. All on the engine thread's current stream, so stream order alone
makes the next step read the tokens after they are sampled.
"""

from __future__ import annotations

import torch

from flint_backend.engine.sequence import Sequence


class InFlightStep:
    def __init__(self, seqs: list[Sequence], tokens: torch.Tensor):
        """tokens [B] int64 on the device, row r sampled for seqs[r]."""
        self.seqs, self.tokens = seqs, tokens
        cuda = tokens.device.type == "cuda"
        self._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=cuda)  # [B]
        self._host.copy_(tokens, non_blocking=True)
        self._copied = None
        if cuda:  # on the CPU the copy above is done when it returns
            self._copied = torch.cuda.Event()
            self._copied.record()
        self._row = {id(seq): r for r, seq in enumerate(seqs)}

    def rows_of(self, seqs: list[Sequence]) -> list[int]:
        """The row of each of `seqs` (all launched in this step) in `tokens`."""
        return [self._row[id(seq)] for seq in seqs]

    def token_ids(self) -> list[int]:
        """Waits for the copy to the host -> the B sampled token ids."""
        if self._copied is not None:
            self._copied.synchronize()
        return self._host.tolist()
