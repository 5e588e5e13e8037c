"""Prefix caching for Flint's hybrid KV cache: a request computes only the tokens after the longest
prefix whose KV another request left behind. Host bookkeeping only; the runner makes the copies.

Full-attention layers share paged blocks (block_manager.py): a full block whose tokens are known
is cached under a hash of its tokens chained with every block before it (and the request's
cache_salt, so only requests with the same salt share).

Sliding layers keep only a ring of the last W positions per running sequence, overwritten as it
goes, so a hit at a block boundary b also needs the window as it was there: the K/V of positions
[b - (W - 1), b) in every sliding layer. Those live in *window pages*, one block's sliding K/V each
(kv_cache.py; at full size 35 layers x 64 tokens x 4 x 128 x 2 x 2 B = 4.6 MB, 2.5x a full-layer
block), cached under the same block hash. A hit copies the pages its window covers into the new
sequence's ring row (at full size 8 pages, 37 MB; 512 = 8 x 64). A page is written
  - by prefill steps, directly: a chunk's sliding K/V go to the ring and to the pages opened for
    its blocks (one more index_copy a sliding layer, prefill only);
  - when a block computed in part by decode steps (which write only the ring) is complete, from
    the ring, which still holds it then;
and committed once its block is computed and its tokens are known. A page may hold only the end
of its block (block_size > W - 1, as in the tiny test model): `valid_from` says where its valid
positions start, and a window needs only its last W - 1 positions.
No running sequence reads pages, so every committed page is evictable: least recently used first,
and *tail* pages (the last blocks before a prompt's or a sequence's end: where a conversation's
next turn resumes) only after all others, so a long prefill that streams through the pool does
not evict every session's resume point.

Lookup: the longest run of cached full blocks, cut back to the last boundary b whose window pages
are all there; at most (tokens - 1) // block_size blocks, as the last token is computed for its
logits. Requests asking for prompt_logprobs look nothing up (they need every prompt position).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from flint_backend.engine.block_manager import BlockManager
from flint_backend.engine.sequence import Sequence


@dataclass
class OpenPage:
    """A window page a sequence is filling for block j."""
    page: int
    written: int = 0              # positions written directly (by prefill steps), from the block's start
    valid_from: int | None = None  # set when the block is computed: its first valid position


@dataclass
class WindowCopy:
    """A copy between a ring row and window pages, made before the next step (in order)."""
    to_ring: bool
    ring_row: int
    ring_slots: list[int]   # p % W
    page_slots: list[int]   # page * block_size + p % block_size


@dataclass
class PrefixHit:
    blocks: list[int]    # the full layers' cached blocks, b = len(blocks) * block_size tokens
    window: WindowCopy   # pages -> ring (its ring_row set at admission)
    pages: list[int]     # the window's pages (refreshed as used)

    def num_tokens(self, block_size: int) -> int:
        return len(self.blocks) * block_size


class WindowPages:
    """Committed window pages by block hash, with their free list and eviction order."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))
        self._page_of: dict[bytes, int] = {}
        self._entry: dict[int, tuple[bytes, int]] = {}  # committed page -> (hash, valid_from)
        self._lru: tuple[OrderedDict, OrderedDict] = (OrderedDict(), OrderedDict())  # (others, tails)

    def get(self, block_hash: bytes) -> tuple[int, int] | None:
        """-> (page, valid_from) committed under `block_hash`, or None."""
        page = self._page_of.get(block_hash)
        return None if page is None else (page, self._entry[page][1])

    def allocate(self) -> int | None:
        """A page to write (free, else the least recently used non-tail, else tail), or None."""
        if self._free:
            return self._free.pop()
        for lru in self._lru:
            if lru:
                page, _ = lru.popitem(last=False)
                del self._page_of[self._entry.pop(page)[0]]
                return page
        return None

    def commit(self, page: int, block_hash: bytes, valid_from: int, tail: bool) -> None:
        old = self.get(block_hash)
        if old is not None and old[1] <= valid_from:  # as good a page is cached: keep it
            self.release(page)
            self.use(old[0], tail)
            return
        if old is not None:
            self._drop(old[0])
        self._page_of[block_hash] = page
        self._entry[page] = (block_hash, valid_from)
        self._lru[tail][page] = None

    def use(self, page: int, tail: bool = False) -> None:
        """A committed page was used (or is a tail now): it goes last in its order."""
        was_tail = page in self._lru[1]
        for lru in self._lru:
            lru.pop(page, None)
        self._lru[tail or was_tail][page] = None

    def release(self, page: int) -> None:
        """An uncommitted page back to the free list."""
        self._free.append(page)

    def reset(self) -> None:
        for page in list(self._entry):
            self._drop(page)

    def _drop(self, page: int) -> None:
        block_hash, _ = self._entry.pop(page)
        del self._page_of[block_hash]
        for lru in self._lru:
            lru.pop(page, None)
        self._free.append(page)


class PrefixCache:
    def __init__(self, blocks: BlockManager, num_window_pages: int, window: int, enabled: bool):
        self.blocks, self.enabled = blocks, enabled
        self.block_size = blocks.block_size
        self.context = window - 1  # positions before a token that its sliding layers read
        self.pages = WindowPages(num_window_pages if enabled else 0)
        self.copies: list[WindowCopy] = []  # made by the runner before the next step
        self.queries = 0  # prompt tokens looked up, of them found (hits)
        self.hits = 0

    # ------------------------------------------------------------------ admission
    def lookup(self, seq: Sequence) -> PrefixHit | None:
        """The longest cached prefix of a waiting `seq` with its window, or None."""
        if not self.enabled or seq.params.prompt_logprobs is not None:
            return None
        hashes = self._hashes(seq)
        limit = (seq.num_tokens - 1) // self.block_size
        blocks = self.blocks.cached_prefix(hashes[:limit])
        bs = self.block_size
        for k in range(len(blocks), 0, -1):
            end = k * bs
            start = max(0, end - self.context)
            pages = []
            for j in range(start // bs, k):
                found = self.pages.get(hashes[j])
                if found is None or found[1] > max(0, start - j * bs):
                    break
                pages.append(found[0])
            else:
                positions = range(start, end)
                page_slots = [pages[p // bs - start // bs] * bs + p % bs for p in positions]
                ring_slots = [p % (self.context + 1) for p in positions]
                return PrefixHit(blocks[:k], WindowCopy(True, -1, ring_slots, page_slots), pages)
        return None

    def count_query(self, seq: Sequence, hit: PrefixHit | None) -> None:
        """First admission of a request that looks up: the metrics and the request's cached count."""
        if not self.enabled or seq.num_preemptions or seq.params.prompt_logprobs is not None:
            return
        seq.num_cached_tokens = hit.num_tokens(self.block_size) if hit else 0
        self.queries += seq.num_prompt_tokens
        self.hits += seq.num_cached_tokens

    def take(self, seq: Sequence, hit: PrefixHit) -> None:
        """After the blocks are taken and the ring row given: start `seq` at the hit."""
        seq.num_computed = hit.num_tokens(self.block_size)
        seq.num_registered_blocks = len(hit.blocks)
        seq.num_window_blocks = len(hit.blocks)
        hit.window.ring_row = seq.ring_row
        self.copies.append(hit.window)
        for page in hit.pages:
            self.pages.use(page)

    # ------------------------------------------------------------------ steps
    def open_pages(self, seq: Sequence, num_new_tokens: int) -> None:
        """Pages for the blocks that a prefill chunk of `seq` (more than one token: a step that
        writes them directly) starts; blocks whose page is cached already get none."""
        if not self.enabled or num_new_tokens < 2:
            return
        bs, first = self.block_size, seq.num_computed
        hashes = self._hashes(seq)
        for j in range(-(-first // bs), (first + num_new_tokens - 1) // bs + 1):
            if j in seq.open_pages or (j < len(hashes) and self._has_page(hashes[j])):
                continue
            page = self.pages.allocate()
            if page is None:
                return
            seq.open_pages[j] = OpenPage(page)

    def computed(self, seq: Sequence, first: int, num_new_tokens: int, direct: bool) -> None:
        """After a step computed `seq`'s positions [first, first + num_new_tokens) (num_computed
        already counts them); `direct`: the step wrote open pages directly (a prefill-path step)."""
        if not self.enabled:
            return
        bs, end = self.block_size, seq.num_computed
        if direct:
            for j, open_page in seq.open_pages.items():
                lo, hi = max(first, j * bs), min(first + num_new_tokens, (j + 1) * bs)
                if hi > lo and lo == j * bs + open_page.written:
                    open_page.written += hi - lo
        if end // bs > seq.num_window_blocks:
            ring_start = end - self.context - 1  # the ring holds positions [end - W, end)
            for j in range(seq.num_window_blocks, end // bs):
                self._block_computed(seq, j, ring_start)
            seq.num_window_blocks = end // bs
        self.update(seq)

    def update(self, seq: Sequence) -> None:
        """Cache what `seq` has computed and knows the tokens of: full blocks and ready pages."""
        known = min(seq.num_computed, len(seq.token_ids)) // self.block_size
        if not self.enabled or (known <= seq.num_registered_blocks and not seq.open_pages):
            return  # a decode step inside a block: nothing new
        hashes = self._hashes(seq)
        for j in range(seq.num_registered_blocks, min(known, len(hashes))):
            self.blocks.register(seq.block_table[j], hashes[j])
        seq.num_registered_blocks = max(seq.num_registered_blocks, min(known, len(hashes)))
        tail_from = seq.num_prompt_tokens // self.block_size - self._window_blocks
        for j in [j for j, p in seq.open_pages.items() if p.valid_from is not None and j < len(hashes)]:
            open_page = seq.open_pages.pop(j)
            self.pages.commit(open_page.page, hashes[j], open_page.valid_from,
                              tail=tail_from <= j < seq.num_prompt_tokens // self.block_size)

    def release(self, seq: Sequence) -> None:
        """`seq` leaves the running batch (finished, aborted, preempted), before its blocks are freed:
        cache what it can, mark the pages of its last blocks as tails, give back the rest."""
        if not self.enabled:
            return
        self.update(seq)
        hashes = self._hashes(seq)
        done = min(seq.num_registered_blocks, len(hashes))
        for j in range(max(0, done - self._window_blocks), done):
            found = self.pages.get(hashes[j])
            if found is not None:
                self.pages.use(found[0], tail=True)
        for open_page in seq.open_pages.values():
            self.pages.release(open_page.page)
        seq.open_pages.clear()
        seq.num_registered_blocks = seq.num_window_blocks = 0

    def reset(self) -> None:
        """Forget everything cached (a step failed: what it wrote is not trusted)."""
        self.blocks.reset_cache()
        self.pages.reset()
        self.copies.clear()

    def take_copies(self) -> list[WindowCopy]:
        copies, self.copies = self.copies, []
        return copies

    # ------------------------------------------------------------------ internals
    @property
    def _window_blocks(self) -> int:
        return -(-self.context // self.block_size)

    def _has_page(self, block_hash: bytes) -> bool:
        found = self.pages.get(block_hash)
        return found is not None and found[1] == 0

    def _block_computed(self, seq: Sequence, j: int, ring_start: int) -> None:
        """Block j of `seq` is computed: its page complete (written directly), or filled from the ring."""
        bs = self.block_size
        open_page = seq.open_pages.get(j)
        if open_page is not None and open_page.written == bs:
            open_page.valid_from = 0
            return
        hashes = self._hashes(seq)
        if open_page is None and j < len(hashes) and self._has_page(hashes[j]):
            return
        lo = max(j * bs, ring_start)
        written = open_page.written if open_page is not None else 0
        if written >= lo - j * bs:  # the direct writes reach where the ring's part begins
            valid_from, lo = 0, j * bs + written
        elif (j + 1) * bs - lo >= min(bs, self.context):
            valid_from = lo - j * bs  # only the block's end, enough for the window right after it
        else:  # too little of the block is left anywhere to be of use
            if open_page is not None:
                self.pages.release(seq.open_pages.pop(j).page)
            return
        if open_page is None:
            page = self.pages.allocate()
            if page is None:
                return
            open_page = seq.open_pages[j] = OpenPage(page)
        open_page.valid_from = valid_from
        ring = self.context + 1
        positions = range(lo, (j + 1) * bs)
        self.copies.append(WindowCopy(False, seq.ring_row, [p % ring for p in positions],
                                      [open_page.page * bs + p % bs for p in positions]))

    def _hashes(self, seq: Sequence) -> list[bytes]:
        """The hashes of `seq`'s full blocks of known tokens, extended as tokens arrive."""
        hashes, bs, ids = seq.block_hashes, self.block_size, seq.token_ids
        if not hashes and len(ids) >= bs:
            salt = seq.params.cache_salt
            seq.block_hash_root = hashlib.sha256(b"salt:" + salt.encode()).digest() if salt else b""
        while (len(hashes) + 1) * bs <= len(ids):
            j = len(hashes)
            parent = hashes[-1] if hashes else seq.block_hash_root
            hashes.append(hashlib.sha256(parent + array("q", ids[j * bs:(j + 1) * bs]).tobytes()).digest())
        return hashes
