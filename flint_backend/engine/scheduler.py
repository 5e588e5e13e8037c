"""Continuous batching: which tokens of which sequences run in the next step.

Every step takes all running decodes first (one token each, so streams never stall behind a
long prompt), then prefill chunks — running prefills first, then waiting requests in arrival
order — until the per-step token budget is spent: max_num_batched_tokens, or the smaller
max_num_batched_tokens_with_decodes in a step that decodes (its streams wait for the step).
When the KV pool runs out, the latest-arrived running sequence is preempted: its blocks are
freed and it is recomputed later (FCFS).
A waiting request starts after the longest prefix the prefix cache holds (engine.prefix_cache).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from flint_backend.engine.block_manager import BlockManager
from flint_backend.engine.prefix_cache import PrefixCache
from flint_backend.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    entries: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens this step)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 cache: PrefixCache | None = None, max_num_batched_tokens_with_decodes: int | None = None):
        self.blocks = blocks
        self.cache = cache or PrefixCache(blocks, 0, window=1, enabled=False)
        self.max_num_seqs = min(max_num_seqs, blocks.num_ring_rows)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_batched_tokens_with_decodes = max_num_batched_tokens_with_decodes  # None: the above
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in arrival order

    @property
    def decoding_step_tokens(self) -> int:
        """The token budget of a step that decodes."""
        return min(self.max_num_batched_tokens, self.max_num_batched_tokens_with_decodes or self.max_num_batched_tokens)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and free its KV at once (what it computed stays cached)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.cache.release(seq)
        self.blocks.free(seq)

    def decodes_only_next(self, max_batch: int) -> bool:
        """Whether the next schedule() is sure to be one decode token for each running sequence and
        nothing else (no admission, no preemption, none left out), at most `max_batch` of them: a
        step async scheduling may launch before the host has read the previous step's tokens."""
        running = self.running
        if not running or len(running) > min(max_batch, self.decoding_step_tokens):
            return False
        if self.waiting and len(running) < self.max_num_seqs:
            return False  # it may admit a request (a prefill)
        if not all(seq.is_decoding for seq in running):
            return False
        return sum(self.blocks.blocks_needed(seq, 1) for seq in running) <= self.blocks.num_free_blocks

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        scheduled: set[int] = set()
        decodes = [s for s in self.running if s.is_decoding]
        prefills = [s for s in self.running if not s.is_decoding]
        budget = self.decoding_step_tokens if decodes else self.max_num_batched_tokens
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_uncomputed, budget)
            if not self._make_room(seq, n, scheduled, batch):
                continue
            self.blocks.grow(seq, n)
            self.cache.open_pages(seq, n)
            batch.entries.append((seq, n))
            scheduled.add(id(seq))
            budget -= n
        if batch.preempted:
            return batch  # memory is short: admit nothing new this step
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self.cache.lookup(seq)
            blocks = hit.blocks if hit else []
            n = min(seq.num_uncomputed - len(blocks) * self.blocks.block_size, budget)
            if not self.blocks.can_take(seq, blocks, n):
                break  # new work never preempts running work
            self.waiting.popleft()
            self.cache.count_query(seq, hit)
            seq.status = SequenceStatus.RUNNING
            if hit:
                self.blocks.take(seq, blocks)
            self.blocks.grow(seq, n + len(blocks) * self.blocks.block_size)
            if hit:
                self.cache.take(seq, hit)
            self.cache.open_pages(seq, n)
            self.running.append(seq)
            batch.entries.append((seq, n))
            scheduled.add(id(seq))
            budget -= n
        return batch

    def _make_room(self, seq: Sequence, n: int, scheduled: set[int], batch: ScheduledBatch) -> bool:
        """Preempt later arrivals not yet scheduled this step until `seq` fits; False if `seq` itself went."""
        while not self.blocks.can_grow(seq, n):
            victims = [s for s in self.running if id(s) not in scheduled and s is not seq]
            victim = max(victims, key=lambda s: s.arrival) if victims else seq
            if victim.arrival < seq.arrival:
                victim = seq
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cache.release(seq)
        self.blocks.free(seq)
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
