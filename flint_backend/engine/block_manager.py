"""KV-cache bookkeeping, no tensors: paged blocks for full-attention layers, ring rows for sliding layers.

With prefix caching a full block whose tokens are known carries its hash (engine.prefix_cache) and
can be shared: running sequences reference it (counted), and when none does it stays cached,
evictable, until a new block is needed and none is free. Eviction is least recently released
first; a sequence releases its blocks last to first, so a prefix loses its tail before its head
(a chain is only found up to its first missing block).
"""

from __future__ import annotations

from collections import OrderedDict

from flint_backend.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, num_ring_rows: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_ring_rows = num_ring_rows
        self._free_blocks = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._free_rows = list(range(num_ring_rows - 1, -1, -1))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, bytes] = {}   # cached block -> its hash
        self._block_of: dict[bytes, int] = {}  # hash -> cached block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; first out first

    @property
    def num_free_blocks(self) -> int:
        """Blocks a sequence can get: free ones and cached ones no sequence references."""
        return len(self._free_blocks) + len(self._evictable)

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_of)

    @property
    def usage(self) -> float:
        """Fraction of the blocks running sequences hold (cached, unreferenced blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, self.blocks_for(seq.num_computed + num_new_tokens) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        row_ok = seq.ring_row is not None or self._free_rows
        return bool(row_ok) and self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def grow(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give `seq` room for `num_new_tokens` more tokens (callers check can_grow first)."""
        if seq.ring_row is None:
            seq.ring_row = self._free_rows.pop()
        for _ in range(self.blocks_needed(seq, num_new_tokens)):
            block = self._allocate()
            self._refs[block] = 1
            seq.block_table.append(block)

    def free(self, seq: Sequence) -> None:
        for block in reversed(seq.block_table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._hash_of:
                    self._evictable[block] = None
                else:
                    self._free_blocks.append(block)
        seq.block_table = []
        if seq.ring_row is not None:
            self._free_rows.append(seq.ring_row)
            seq.ring_row = None

    # ------------------------------------------------------------------ prefix caching
    def cached_prefix(self, hashes: list[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of `hashes` (a chain: each hash covers its prefix)."""
        blocks = []
        for h in hashes:
            block = self._block_of.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def can_take(self, seq: Sequence, blocks: list[int], num_new_tokens: int) -> bool:
        """Whether a waiting `seq` fits with `blocks` (a cached prefix) and room for `num_new_tokens` after it."""
        revived = sum(1 for b in blocks if self._refs[b] == 0)
        new = self.blocks_for(len(blocks) * self.block_size + num_new_tokens) - len(blocks)
        return bool(self._free_rows) and revived + new <= self.num_free_blocks

    def take(self, seq: Sequence, blocks: list[int]) -> None:
        """Start `seq`'s block table (empty) with the cached `blocks`."""
        assert not seq.block_table and seq.num_computed == 0, "take: the sequence holds blocks"
        for block in blocks:
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
        seq.block_table = list(blocks)

    def register(self, block: int, block_hash: bytes) -> None:
        """`block` is full and its tokens known: cache it under `block_hash`. A block already cached
        under that hash (computed by another sequence at the same time) stays the cached one."""
        if block_hash not in self._block_of and block not in self._hash_of:
            self._block_of[block_hash] = block
            self._hash_of[block] = block_hash

    def reset_cache(self) -> None:
        """Forget every cached block (after a failed step their contents are not trusted)."""
        self._free_blocks.extend(reversed(self._evictable))
        self._evictable.clear()
        self._hash_of.clear()
        self._block_of.clear()

    def _allocate(self) -> int:
        if self._free_blocks:
            return self._free_blocks.pop()
        block, _ = self._evictable.popitem(last=False)
        del self._block_of[self._hash_of.pop(block)]
        return block
