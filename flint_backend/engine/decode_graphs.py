"""CUDA-graph decode: the forward of an all-decode step (one new token per sequence), captured
once per batch-size bucket over static input buffers, then replayed.

A step of B sequences replays the smallest bucket >= B; rows B..bucket-1 are padding (context 0,
no cache writes, their logits ignored). Larger batches and steps with prefill run eagerly.
Buckets up to `low_latency_max_batch` run the model's low-latency decode path.
All buckets share one memory pool. On the CPU the same static-buffer path runs without capture,
so the bucketing and padding are tested there too.

With async scheduling (engine.py) a step's input ids can be the previous step's sampled tokens,
still on the device: the host copy leaves them 0 and a gather on the device fills them in.
"""

from __future__ import annotations

import torch

from flint_backend.engine.kv_cache import KVCache
from flint_backend.engine.sequence import Sequence
from flint_backend.engine.step_batch import StepBatch
from flint_backend.model import FlintModel

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class DecodeGraphs:
    def __init__(self, model: FlintModel, kv: KVCache, max_batch: int, max_blocks_per_seq: int,
                 window: int, block_size: int, capture: bool, low_latency_max_batch: int = 0):
        self.model, self.kv = model, kv
        self.low_latency_max_batch = low_latency_max_batch
        self.window, self.block_size = window, block_size
        self.buckets = [b for b in BUCKETS if b < max_batch] + [min(max_batch, BUCKETS[-1])]
        self.max_batch, self.max_blocks = self.buckets[-1], max_blocks_per_seq
        device = model.embed.device
        m, nb = self.max_batch, max_blocks_per_seq
        # two packed buffers, one host->device copy each per step:
        #   i64: ids [m] | positions [m] | full slots [m] | ring slots [m] | previous-step rows [m]
        #   i32: query_start_loc [m+1] | context_lens [m] | ring rows [m] | block tables [m, nb]
        # the tables come last, so a step copies only the rows of its bucket
        self.i64 = torch.zeros(5 * m, dtype=torch.int64, device=device)
        self.i32 = torch.zeros(3 * m + 1 + m * nb, dtype=torch.int32, device=device)
        # two host staging sets used in turn: with async scheduling the host fills step n+1's inputs
        # while step n's copy may still wait on the stream behind step n-1 (whose tokens the host has
        # read by then, so the set of step n-1 is free again)
        self._staging = [_Staging(self.i64.shape, self.i32.shape, m, nb, pin=device.type == "cuda")
                         for _ in range(2)]
        self._turn = 0
        self.rows = torch.arange(m, device=device)  # sample rows: static too (a graph keeps reading them)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def _batch(self, b: int) -> StepBatch:
        """The static views of bucket b (fixed addresses: what a graph reads)."""
        m, nb = self.max_batch, self.max_blocks
        i64, i32 = self.i64, self.i32
        return StepBatch(
            input_ids=i64[:b], positions=i64[m:m + b], full_slots=i64[2 * m:2 * m + b],
            ring_slots=i64[3 * m:3 * m + b],
            query_start_loc=i32[:b + 1], context_lens=i32[m + 1:m + 1 + b],
            ring_rows=i32[2 * m + 1:2 * m + 1 + b], block_tables=i32[3 * m + 1:].view(m, nb)[:b],
            sample_rows=self.rows[:b], decode_only=True, max_query_len=1, sample_seqs=[])

    def _forward(self, bucket: int):
        """The low-latency path up to low_latency_max_batch sequences, the regular one beyond."""
        if bucket <= self.low_latency_max_batch:
            return self.model.forward_low_latency
        return self.model.forward

    def bucket_for(self, batch_size: int) -> int | None:
        return next((b for b in self.buckets if b >= batch_size), None)

    def _fill(self, seqs: list[Sequence], bucket: int, prev_tokens: torch.Tensor | None = None,
              prev_rows: list[int] | None = None) -> None:
        """prev_tokens [B'] (on the device) and prev_rows [len(seqs)]: with async scheduling the
        input ids are the pending tokens of the step before, prev_tokens[prev_rows], gathered on
        the device after the host->device copy."""
        m, nb, bs, w = self.max_batch, self.max_blocks, self.block_size, self.window
        staging = self._staging[self._turn]
        self._turn ^= 1
        h64, h32 = staging.np64, staging.np32  # numpy views of the (pinned) host buffers: cheap scalar writes
        h64[:2 * m] = 0
        h64[2 * m:4 * m] = -1  # padding rows write nothing
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
        if prev_tokens is not None:
            h64[4 * m:4 * m + len(seqs)] = prev_rows
        used = 3 * m + 1 + bucket * nb
        self.i64.copy_(staging.i64, non_blocking=True)
        self.i32[:used].copy_(staging.i32[:used], non_blocking=True)
        if prev_tokens is not None:
            b = len(seqs)
            torch.index_select(prev_tokens, 0, self.i64[4 * m:4 * m + b], out=self.i64[:b])

    def run(self, seqs: list[Sequence], prev_tokens: torch.Tensor | None = None,
            prev_rows: list[int] | None = None) -> torch.Tensor:
        """-> logits [len(seqs), V] for an all-decode step; prev_* as in _fill."""
        bucket = self.bucket_for(len(seqs))
        self._fill(seqs, bucket, prev_tokens, prev_rows)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            return self.outputs[bucket][:len(seqs)]
        return self._forward(bucket)(self._batch(bucket), self.kv)[:len(seqs)]

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        self.i64.zero_()
        self.i64[2 * self.max_batch:] = -1  # warm-up and capture write nothing to the cache
        self.i32.zero_()
        for bucket in reversed(self.buckets):  # largest first: later graphs reuse its pool memory
            batch = self._batch(bucket)
            self.i32[:bucket + 1] = torch.arange(bucket + 1, dtype=torch.int32, device=self.i32.device)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            forward = self._forward(bucket)
            with torch.cuda.stream(stream):
                forward(batch, self.kv)  # compile and warm up outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bucket] = forward(batch, self.kv)
            self.graphs[bucket] = graph
            # the eager ops around a replay under async scheduling, once: greedy sampling's argmax
            # and the input-id gather. A kernel's first launch loads its CUDA module, which stalled
            # the first engine's third decode step by ~55 ms on an H200 (benchmarks/NOTES.md §15).
            tokens = self.outputs[bucket].argmax(-1)  # [bucket]
            rows = torch.zeros(bucket, dtype=torch.int64, device=tokens.device)
            torch.index_select(tokens, 0, rows, out=torch.empty_like(tokens))
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
