"""KV-cache bookkeeping, no tensors: paged blocks for full-attention layers, ring rows for sliding layers."""

from __future__ import annotations

from flint_backend.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, num_ring_rows: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_ring_rows = num_ring_rows
        self._free_blocks = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._free_rows = list(range(num_ring_rows - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free_blocks) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, self.blocks_for(seq.num_computed + num_new_tokens) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        row_ok = seq.ring_row is not None or self._free_rows
        return bool(row_ok) and self.blocks_needed(seq, num_new_tokens) <= len(self._free_blocks)

    def grow(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give `seq` room for `num_new_tokens` more tokens (callers check can_grow first)."""
        if seq.ring_row is None:
            seq.ring_row = self._free_rows.pop()
        for _ in range(self.blocks_needed(seq, num_new_tokens)):
            seq.block_table.append(self._free_blocks.pop())

    def free(self, seq: Sequence) -> None:
        self._free_blocks.extend(reversed(seq.block_table))
        seq.block_table = []
        if seq.ring_row is not None:
            self._free_rows.append(seq.ring_row)
            seq.ring_row = None
