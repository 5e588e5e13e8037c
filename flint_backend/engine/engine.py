"""LLMEngine: add_request / abort / step. Single-threaded; `EngineThread` (engine_thread.py) runs
it in the background for servers.

Async scheduling (EngineArgs.async_scheduling, vLLM's idea): a step of decodes only, through the
static decode buffers, every sequence sampling on the device (greedy or the fused sampler, no
logprobs, penalties, bias or min_tokens) is launched before the host has read the previous
step's tokens. Its input ids are gathered on the device from those tokens, and while it runs the
host appends them, checks stops and builds outputs. So step() returns the tokens of the step
before the one it launched: the first step of a run of them returns nothing for its sequences.
When the next step cannot be launched ahead, a step() only drains the step in flight (reads its
tokens), and the next runs synchronously. A step() thus delivers at most one token per request.

A token is sampled before the host knows its predecessor: when that one ends the sequence (stop
token, max_tokens) or the request is aborted, the sequence finishes and frees its blocks at once,
and the token the step in flight computes for it is dropped unread. That step's late writes into
the freed blocks are harmless: whatever reuses them is queued after it on the same stream.
Preemption never meets a step in flight: a step is launched ahead only when every running
sequence can grow without preempting (Scheduler.decodes_only_next); a synchronous one drains first.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import torch

from flint_backend.config import FlintConfig
from flint_backend.engine.async_step import InFlightStep
from flint_backend.engine.block_manager import BlockManager
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.engine.guided import GuidedSchemaError
from flint_backend.engine.metrics import EngineMetrics
from flint_backend.engine.prefix_cache import PrefixCache
from flint_backend.engine.runner import ModelRunner, resolve_device, use_device
from flint_backend.engine.sampler import TokenLogprobs
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.engine.scheduler import Scheduler
from flint_backend.engine.sequence import Sequence, SequenceStatus


log = logging.getLogger(__name__)

# LLMEngine.warm_up's prompts: max_num_batched_tokens + WARMUP_PROMPTS[0] tokens (a full chunk,
# then an odd one), and WARMUP_PROMPTS[1] tokens beside it
WARMUP_PROMPTS = (17, 33)


def warmup_step_tokens(max_tokens: int) -> list[int]:
    """The token counts of LLMEngine.warm_up's one-prompt prefill steps: 2^k - 1, 2^k and 2^k + 1
    from 2 up to max_tokens (a step's cap, max_num_batched_tokens), and max_tokens itself. The
    kernel launchers choose tiles, splits and constexprs from a step's token count, at powers of
    two and at thresholds between them; tools/bench/token_specialisations.py counts the kernel
    specialisations that steps of 2..max_tokens tokens launch and those these steps miss."""
    counts = {max_tokens}
    p = 2
    while p - 1 <= max_tokens:
        counts.update(n for n in (p - 1, p, p + 1) if 2 <= n <= max_tokens)
        p *= 2
    return sorted(counts)


class RequestError(ValueError):
    """A request the engine cannot take; the message names the field."""


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    finished: bool
    finish_reason: str | None  # "stop", "length", "abort", "error"
    num_prompt_tokens: int
    num_output_tokens: int
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (not computed)
    # with the first token, when asked: (id, logprobs) of each prompt token (the first's logprobs None)
    prompt_logprobs: list[tuple[int, TokenLogprobs | None]] | None = None


def load_model_weights(args: EngineArgs, device: torch.device) -> tuple[FlintConfig, dict[str, torch.Tensor]]:
    from flint_backend.weights.random_init import random_stacked_weights

    dtype = getattr(torch, args.dtype)
    if args.model is None:
        config = FlintConfig.preset(args.preset)
        return config, random_stacked_weights(config, args.seed, dtype, device, nvfp4=args.quantization == "nvfp4")
    from flint_backend.weights.loader import load_checkpoint

    loaded = load_checkpoint(args.model, device=device, dtype=dtype, hf_config_path=args.hf_config_path)
    return loaded.config, loaded.tensors


class LLMEngine:
    def __init__(self, args: EngineArgs, config: FlintConfig | None = None,
                 weights: dict[str, torch.Tensor] | None = None):
        self.args = args
        self.device = resolve_device(args.device)
        use_device(self.device)
        if self.device.type == "cpu" and args.cpu_threads:
            torch.set_num_threads(args.cpu_threads)
        owned = weights is None  # then the model's fused copies replace the loaded tensors (80 GB at full size)
        if weights is None:
            config, weights = load_model_weights(args, self.device)
        self.config = config
        self.max_model_len = min(args.max_model_len or config.max_position_embeddings, config.max_position_embeddings)
        self.runner = ModelRunner(config, weights, args, self.device, self.max_model_len, release_weights=owned)
        spec = self.runner.kv_spec
        self.blocks = BlockManager(spec.num_blocks, spec.block_size, spec.num_ring_rows)
        self.prefix_cache = PrefixCache(self.blocks, spec.num_window_pages, config.sliding_window,
                                        enabled=args.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, args.max_num_seqs, args.max_num_batched_tokens, self.prefix_cache,
                                   args.max_num_batched_tokens_with_decodes)
        self.default_stop_ids = frozenset(config.eos_token_id or ())
        self.metrics = EngineMetrics()
        self._seqs: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self._in_flight: InFlightStep | None = None  # launched, its tokens not read yet
        warm = args.warmup if args.warmup is not None else (self.device.type == "cuda"
                                                             and args.kernel_backend == "triton")
        self.warmup_s = self.warm_up() if warm else None

    def warm_up(self) -> float:
        """Runs a prefill step of each of warmup_step_tokens' token counts (one prompt at a time,
        one token each), then WARMUP_PROMPTS (a full prefill chunk and then an odd remainder, and
        a short prompt beside it: steps of several sequences, and decode), two greedy tokens
        each, then forgets them: their blocks are freed and the metrics start again. Triton
        compiles a kernel for each new specialisation on its first launch (a new constexpr, tile
        or int class), up to seconds each, which the first requests to meet one would otherwise
        wait for. The prefix cache forgets them. -> seconds taken."""
        if self.has_work():
            raise RuntimeError("warm_up: the engine has requests; call it before adding any")
        t0 = time.perf_counter()
        room = min(self.max_model_len - 2, self.blocks.block_size * self.blocks.num_blocks // 2)  # half the pool
        steps = [n for n in warmup_step_tokens(self.args.max_num_batched_tokens) if n <= room]
        for i, n in enumerate(steps):  # each prompt its own first token: no prefix of another's
            self._warm_up_run([(self._warmup_prompt(n, first=i), f"warmup-step-{n}", 1)])
        long, short = self.args.max_num_batched_tokens + WARMUP_PROMPTS[0], WARMUP_PROMPTS[1]
        self._warm_up_run([(self._warmup_prompt(max(1, min(n, room)), first=len(steps) + i), f"warmup-{i}", 2)
                           for i, n in enumerate((long, short))])
        self.prefix_cache.reset()
        self.prefix_cache.queries = self.prefix_cache.hits = 0
        self.metrics = EngineMetrics()
        return time.perf_counter() - t0

    def _warmup_prompt(self, n: int, first: int) -> list[int]:
        vocab = self.config.vocab_size - 1
        return [1 + (first * 1009 + j) % vocab for j in range(n)]

    def _warm_up_run(self, requests: list[tuple[list[int], str, int]]) -> None:
        """(prompt, request id, tokens to generate) each, greedy, run until all have finished
        (finished sequences leave the engine: _finish)."""
        for prompt, request_id, max_tokens in requests:
            self.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                             request_id=request_id)
        while self.has_work():
            self.step()

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> Sequence:
        seq = self.make_sequence(prompt_ids, params, request_id)
        self.admit(seq)
        return seq

    def make_sequence(self, prompt_ids: list[int], params: SamplingParams | None = None,
                      request_id: str | None = None) -> Sequence:
        """Validate a request (any thread); raises RequestError naming the field."""
        params = params or SamplingParams()
        if not isinstance(prompt_ids, (list, tuple)) or not prompt_ids:
            raise RequestError("prompt: expected a non-empty list of token ids")
        vocab = self.config.vocab_size
        bad = next((t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"prompt: token id {bad!r} is outside the vocabulary [0, {vocab})")
        if len(prompt_ids) >= self.max_model_len:
            raise RequestError(f"prompt: {len(prompt_ids)} tokens do not fit the context of {self.max_model_len} "
                               f"tokens (the prompt plus at least one generated token)")
        if params.guided_json is not None or params.structural_tag is not None:
            try:
                self.runner.sampler.guided.grammar(params)
            except GuidedSchemaError as error:
                raise RequestError(str(error)) from None
        room = self.max_model_len - len(prompt_ids)
        if params.max_tokens is not None and params.max_tokens > room:
            raise RequestError(f"max_tokens: got {params.max_tokens}, expected at most {room} (the prompt's "
                               f"{len(prompt_ids)} tokens plus max_tokens must fit the context of "
                               f"{self.max_model_len} tokens)")
        stop_ids = frozenset(params.stop_token_ids) if params.stop_token_ids is not None else self.default_stop_ids
        return Sequence(
            request_id=request_id if request_id is not None else f"req-{next(self._ids)}",
            token_ids=list(prompt_ids), num_prompt_tokens=len(prompt_ids), params=params,
            max_tokens=params.max_tokens or min(params.default_max_tokens or room, room), stop_ids=stop_ids)

    def admit(self, seq: Sequence) -> None:
        if seq.request_id in self._seqs:
            raise RequestError(f"request_id: {seq.request_id!r} is already running")
        self._seqs[seq.request_id] = seq
        self.scheduler.add(seq)
        self.metrics.prompt_tokens += seq.num_prompt_tokens

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its KV blocks now (between steps); a token of it in flight is dropped."""
        seq = self._seqs.get(request_id)
        if seq is None:
            return None
        self._finish(seq, "abort")
        self._forget_dead_in_flight()
        self._update_gauges()  # the engine may now be idle: no step() would refresh them
        return self._output(seq, [], [])

    def has_work(self) -> bool:
        return self._in_flight is not None or self.scheduler.has_work()

    # ------------------------------------------------------------------ step
    def step(self) -> list[RequestOutput]:
        """One step -> the tokens it made known (at most one per request); with async scheduling
        those of the step launched before. Requests past max_request_seconds end first."""
        outputs = self._abort_expired()
        if self._can_launch_ahead():
            outputs += self._step_ahead()
        elif self._in_flight is not None:
            outputs += self._drain()
        else:
            outputs += self._step_sync()
        self._update_gauges()
        return outputs

    def _abort_expired(self) -> list[RequestOutput]:
        limit = self.args.max_request_seconds
        if limit is None:
            return []
        now = time.monotonic()
        expired = [seq.request_id for seq in self._seqs.values() if now - seq.arrival > limit]
        for request_id in expired:
            log.warning("request %s: aborted after max_request_seconds=%s", request_id, limit)
        return [self.abort(request_id) for request_id in expired]

    def _step_sync(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        self.metrics.preemptions += len(scheduled.preempted)
        outputs: list[RequestOutput] = []
        if scheduled:
            self.runner.copy_windows(self.prefix_cache.take_copies())
            sampled, result = self.runner.execute(scheduled)
            direct = not all(n == 1 for _, n in scheduled.entries)  # a prefill-path step: it wrote open pages
            for seq, n in scheduled.entries:
                seq.num_computed += n
                self.prefix_cache.computed(seq, seq.num_computed - n, n, direct)
            now = time.monotonic()
            for seq, token, logprobs in zip(sampled, result.tokens, result.logprobs):
                outputs.append(self._append_token(seq, token, logprobs, now))
        return outputs

    def _can_launch_ahead(self) -> bool:
        max_batch = self.runner.max_launch_ahead_batch
        return (max_batch > 0 and self.scheduler.decodes_only_next(max_batch)
                and all(map(self.runner.can_launch_ahead, self.scheduler.running)))

    def _step_ahead(self) -> list[RequestOutput]:
        """Launch an all-decode step, then read the one launched before it (if any)."""
        scheduled = self.scheduler.schedule()
        seqs = [seq for seq, _ in scheduled.entries]
        assert not scheduled.preempted and len(seqs) == len(self.scheduler.running), "not decodes only"
        self.runner.copy_windows(self.prefix_cache.take_copies())
        launched = self.runner.launch_decode(seqs, self._in_flight)
        for seq in seqs:
            seq.num_computed += 1
            seq.num_pending += 1
            self.prefix_cache.computed(seq, seq.num_computed - 1, 1, direct=False)
        previous, self._in_flight = self._in_flight, launched
        outputs = self._collect(previous) if previous is not None else []
        self._forget_dead_in_flight()
        return outputs

    def _drain(self) -> list[RequestOutput]:
        """Read the step in flight and launch nothing: the next step() runs synchronously (or, if
        the tokens read changed that, launches ahead again)."""
        previous, self._in_flight = self._in_flight, None
        return self._collect(previous)

    def _collect(self, step: InFlightStep) -> list[RequestOutput]:
        """Waits for a launched step's tokens and appends them; a sequence finished since the
        launch (by the token before, or an abort) drops its token."""
        tokens = step.token_ids()
        now = time.monotonic()
        outputs = []
        for seq, token in zip(step.seqs, tokens):
            if not seq.finished:
                seq.num_pending -= 1
                outputs.append(self._append_token(seq, token, None, now))
        return outputs

    def _forget_dead_in_flight(self) -> None:
        """A step in flight whose sequences have all finished has no token left to deliver."""
        if self._in_flight is not None and all(seq.finished for seq in self._in_flight.seqs):
            self._in_flight = None

    def _append_token(self, seq: Sequence, token: int, logprobs, now: float) -> RequestOutput:
        seq.token_ids.append(token)
        self.prefix_cache.update(seq)  # a block of it may be computed and now known
        self.metrics.generation_tokens += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
            self.metrics.observe("ttft", now - seq.arrival)
        else:
            self.metrics.observe("tpot", now - seq.last_token_time)
        seq.last_token_time = now
        p = seq.params
        if token in seq.stop_ids and not p.ignore_eos and seq.num_output_tokens >= p.min_tokens:
            self._finish(seq, "stop")
        elif seq.num_output_tokens >= seq.max_tokens:
            self._finish(seq, "length")
        out = self._output(seq, [token], [logprobs])
        if p.prompt_logprobs is not None and seq.num_output_tokens == 1:
            prompt = seq.token_ids[:seq.num_prompt_tokens]
            out.prompt_logprobs = list(zip(prompt, [None] + seq.prompt_logprobs))
        return out

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.remove(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        seq.num_pending = 0  # a token in flight is dropped
        del self._seqs[seq.request_id]
        self.metrics.finished[reason] += 1
        self.metrics.observe("e2e", time.monotonic() - seq.arrival)

    def fail_all(self, error: str) -> list[RequestOutput]:
        """A step raised: end every request with finish reason "error" and free the cache."""
        self._in_flight = None  # its tokens are never read
        outputs = []
        for seq in list(self._seqs.values()):
            self._finish(seq, "error")
            outputs.append(self._output(seq, [], [], error))
        self.prefix_cache.reset()  # what the failed step wrote is not trusted
        self._update_gauges()
        return outputs

    def _output(self, seq: Sequence, tokens: list[int], logprobs: list, error: str | None = None) -> RequestOutput:
        return RequestOutput(seq.request_id, tokens, logprobs, seq.finished, seq.finish_reason,
                             seq.num_prompt_tokens, seq.num_output_tokens, error, seq.num_cached_tokens)

    def _update_gauges(self) -> None:
        m = self.metrics
        m.num_running, m.num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        m.kv_usage = self.blocks.usage
        m.prefix_cache_queries, m.prefix_cache_hits = self.prefix_cache.queries, self.prefix_cache.hits
