"""CUDA-graph decode: the forward of an all-decode step (one new token per sequence), captured
once per batch-size bucket over static input buffers, then replayed.

A step of B sequences replays the smallest bucket >= B; rows B..bucket-1 are padding (context 0,
no cache writes, their logits ignored). Larger batches and steps with prefill run eagerly.
All buckets share one memory pool. On the CPU the same static-buffer path runs without capture,
so the bucketing and padding are tested there too.

Steps alternate between two parities, each with its own input buffers and argmax slots and its
own graph of every bucket, so that nothing between two replays waits on the step before:
  - the host-to-device copy of a step's inputs runs on a side stream while the step before
    (the other parity) replays; the replay waits for it by an event;
  - the graph's LM head leaves every row's greedy token in its parity's slots (ops.greedy_slots), and
    a sampled step's tokens are packed into them; the device-to-host copy of the slots runs on
    another side stream after the replay;
  - with async scheduling (engine.py) a step's input id can be the previous step's token: its
    first launch reads it from the other parity's slots (decode_embedding), as it clears its own.
A parity's buffers are reused two steps later: its input copy waits for that parity's last
replay, and its replay for that parity's last slot copy (both long done when the host runs a
step ahead). bench_step_gaps.py measures what is left between two replays.
"""

from __future__ import annotations

import torch

from flint_backend.engine.sequence import Sequence
from flint_backend.kv_cache import KVCache
from flint_backend.model import FlintModel
from flint_backend.step_batch import StepBatch

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class DecodeGraphs:
    def __init__(self, model: FlintModel, kv: KVCache, max_batch: int, max_blocks_per_seq: int,
                 window: int, block_size: int, capture: bool):
        self.model, self.kv = model, kv
        self.window, self.block_size = window, block_size
        self.buckets = [b for b in BUCKETS if b < max_batch] + [min(max_batch, BUCKETS[-1])]
        self.max_batch, self.max_blocks = self.buckets[-1], max_blocks_per_seq
        device = model.embed.device
        m, nb = self.max_batch, max_blocks_per_seq
        # a parity's two packed input buffers, one host->device copy each per step:
        #   i64: ids [m] | positions [m] | full slots [m] | ring slots [m] | previous-step rows [m]
        #   i32: query_start_loc [m+1] | context_lens [m] | ring rows [m] | block tables [m, nb]
        # the tables come last, so a step copies only the rows of its bucket
        self.i64 = [torch.zeros(5 * m, dtype=torch.int64, device=device) for _ in range(2)]
        self.i32 = [torch.zeros(3 * m + 1 + m * nb, dtype=torch.int32, device=device) for _ in range(2)]
        self.slots = model.ops.greedy_slots(2 * m, device).view(2, m)  # [parity, row]
        self._staging = [_Staging(self.i64[0].shape, self.i32[0].shape, m, nb, pin=device.type == "cuda")
                         for _ in range(2)]
        self.parity = 0  # of the next step
        self.rows = torch.arange(m, device=device)  # sample rows: static too (a graph keeps reading them)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (bucket, parity)
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self._cuda = device.type == "cuda"
        if self._cuda:
            self._copy_in, self._copy_out = torch.cuda.Stream(device), torch.cuda.Stream(device)
        # per parity: its inputs on the device / its last replay done / its slots on the host
        self._inputs_copied: list[torch.cuda.Event | None] = [None, None]
        self._replayed: list[torch.cuda.Event | None] = [None, None]
        self._slots_read: list[torch.cuda.Event | None] = [None, None]
        if capture:
            self._capture_all()

    def _batch(self, b: int, parity: int) -> StepBatch:
        """The static views of bucket b and a parity (fixed addresses: what a graph reads)."""
        m, nb = self.max_batch, self.max_blocks
        i64, i32 = self.i64[parity], self.i32[parity]
        return StepBatch(
            input_ids=i64[:b], positions=i64[m:m + b], full_slots=i64[2 * m:2 * m + b],
            ring_slots=i64[3 * m:3 * m + b],
            query_start_loc=i32[:b + 1], context_lens=i32[m + 1:m + 1 + b],
            ring_rows=i32[2 * m + 1:2 * m + 1 + b], block_tables=i32[3 * m + 1:].view(m, nb)[:b],
            sample_rows=self.rows[:b], decode_only=True, max_query_len=1, sample_seqs=[],
            prev_rows=i64[4 * m:4 * m + b], prev_slots=self.slots[1 - parity], greedy_slots=self.slots[parity, :b])

    def bucket_for(self, batch_size: int) -> int | None:
        return next((b for b in self.buckets if b >= batch_size), None)

    def _fill(self, seqs: list[Sequence], bucket: int, parity: int, prev_rows: list[int] | None = None) -> None:
        """Copies the step's inputs into the parity's buffers. prev_rows [len(seqs)]: with async
        scheduling, the row of each sequence's pending token in the previous step's slots (its
        input id, read on the device)."""
        m, nb, bs, w = self.max_batch, self.max_blocks, self.block_size, self.window
        staging = self._staging[parity]
        if self._inputs_copied[parity] is not None:
            self._inputs_copied[parity].synchronize()  # its last copy has left the host buffers
        h64, h32 = staging.np64, staging.np32  # numpy views of the (pinned) host buffers: cheap scalar writes
        h64[:2 * m] = 0
        h64[2 * m:] = -1  # padding rows write nothing and take no previous token
        h32[:3 * m + 1] = 0  # padding rows: context 0, ring row 0 (the tables' stale entries are never read)
        for r, seq in enumerate(seqs):
            p = seq.num_computed  # position of the one uncomputed token
            h64[r] = 0 if seq.num_pending else seq.token_ids[p]
            h64[m + r] = p
            h64[2 * m + r] = seq.block_table[p // bs] * bs + p % bs
            h64[3 * m + r] = seq.ring_row * w + p % w
            h32[m + 1 + r] = p
            h32[2 * m + 1 + r] = seq.ring_row
            staging.copy_table(r, seq)
        h32[:bucket + 1] = range(bucket + 1)
        if prev_rows is not None:
            h64[4 * m:4 * m + len(seqs)] = prev_rows
        used = 3 * m + 1 + bucket * nb
        if not self._cuda:
            self.i64[parity].copy_(staging.i64)
            self.i32[parity][:used].copy_(staging.i32[:used])
            return
        stream = self._copy_in
        if self._replayed[parity] is not None:
            stream.wait_event(self._replayed[parity])  # that replay has read the buffers
        with torch.cuda.stream(stream):
            self.i64[parity].copy_(staging.i64, non_blocking=True)
            self.i32[parity][:used].copy_(staging.i32[:used], non_blocking=True)
            self._inputs_copied[parity] = torch.cuda.Event()
            self._inputs_copied[parity].record(stream)

    def run(self, seqs: list[Sequence], prev_slots: torch.Tensor | None = None,
            prev_rows: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (logits [B, V], slots [B]) of an all-decode step: the slots hold each row's greedy
        token (ops.greedy_slots) until the caller packs sampled ones in. prev_slots / prev_rows: with
        async scheduling, the previous step's slots (those of the run before this one) and the
        row there of each sequence's pending token."""
        bucket, parity = self.bucket_for(len(seqs)), self.parity
        if prev_slots is not None and prev_slots.data_ptr() != self.slots[1 - parity].data_ptr():
            raise RuntimeError("DecodeGraphs.run: prev_slots are not the slots of the step before this one")
        self.parity ^= 1
        self._fill(seqs, bucket, parity, prev_rows)
        if self._cuda:
            stream = torch.cuda.current_stream()
            stream.wait_event(self._inputs_copied[parity])
            if self._slots_read[parity] is not None:
                stream.wait_event(self._slots_read[parity])  # the slots' last values have left
        if (bucket, parity) in self.graphs:
            self.graphs[bucket, parity].replay()
            logits = self.outputs[bucket, parity][:len(seqs)]
        else:
            logits = self.model.forward(self._batch(bucket, parity), self.kv)[:len(seqs)]
        if self._cuda:
            self._replayed[parity] = torch.cuda.Event()
            self._replayed[parity].record(stream)
        return logits, self.slots[parity, :len(seqs)]

    def slots_to_host(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """slots: those `run` returned, final (sampled tokens packed in) -> (their copy in pinned host
        memory, the event after which it holds them; None on the CPU, where it does at once)."""
        if not self._cuda:
            return slots.clone(), None
        parity = 0 if slots.data_ptr() == self.slots[0].data_ptr() else 1
        host = torch.empty(slots.shape, dtype=slots.dtype, pin_memory=True)
        stream = self._copy_out
        stream.wait_stream(torch.cuda.current_stream())  # after the replay (and the sampler)
        with torch.cuda.stream(stream):
            host.copy_(slots, non_blocking=True)
            self._slots_read[parity] = torch.cuda.Event()
            self._slots_read[parity].record(stream)
        return host, self._slots_read[parity]

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        for i64, i32 in zip(self.i64, self.i32):
            i64.zero_()
            i64[2 * self.max_batch:] = -1  # warm-up and capture write nothing to the cache
            i32.zero_()
        for bucket in reversed(self.buckets):  # largest first: later graphs reuse its pool memory
            for parity in (0, 1):
                batch = self._batch(bucket, parity)
                self.i32[parity][:bucket + 1] = torch.arange(bucket + 1, dtype=torch.int32, device=self.i32[0].device)
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                forward = self.model.forward
                with torch.cuda.stream(stream):
                    forward(batch, self.kv)  # compile and warm up outside the capture
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[bucket, parity] = forward(batch, self.kv)
                self.graphs[bucket, parity] = graph
            # the eager ops around a replay, once: synchronous greedy steps' argmax, and a sampled
            # async step's packing of its tokens into the slots (a kernel's first launch loads its
            # CUDA module, which stalled the first engine's third decode step by ~55 ms on an
            # H200: benchmarks/NOTES.md §15)
            tokens = self.outputs[bucket, 0].argmax(-1)  # [bucket]
            self.slots[0, :bucket].copy_(self.model.ops.pack_tokens(tokens))
        torch.cuda.synchronize()


class _Staging:
    """Pinned host copies of DecodeGraphs' packed input buffers, and which blocks of each row's
    table they already hold."""

    def __init__(self, shape64: torch.Size, shape32: torch.Size, max_batch: int, max_blocks: int, pin: bool):
        self.i64 = torch.zeros(shape64, dtype=torch.int64, pin_memory=pin)
        self.i32 = torch.zeros(shape32, dtype=torch.int32, pin_memory=pin)
        self.np64, self.np32 = self.i64.numpy(), self.i32.numpy()
        self._tables = self.np32[3 * max_batch + 1:].reshape(max_batch, max_blocks)
        # per row: ((seq uid, preemptions), blocks already in the row); a preempted sequence gets new blocks
        self._row_owner: list[tuple[tuple[int, int], int]] = [((-1, 0), 0)] * max_batch

    def copy_table(self, r: int, seq: Sequence) -> None:
        """Row r of the block tables := seq's; a row keeps its sequence between steps, so copy new blocks only."""
        owner, done = self._row_owner[r]
        key = (seq.uid, seq.num_preemptions)
        start = done if owner == key else 0
        if start < len(seq.block_table):
            self._tables[r, start:len(seq.block_table)] = seq.block_table[start:]
        self._row_owner[r] = (key, len(seq.block_table))
