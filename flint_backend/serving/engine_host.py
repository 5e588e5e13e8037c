"""The flint_model step without Triton: the engine runs on its own thread (EngineThread);
requests go in from `execute`, and every output leaves through one queue, ended by a
sentinel, that the model's response thread drains.

One response per engine step and request; when the response thread falls behind (a slow
client or postprocessor), the outputs of a request waiting in the queue go out together
as one chunk, so a slow reader gets a few tokens per response instead of a growing backlog.
When many streams run, ResponsePacing (response_pacing.py) holds a request's outputs for a few
steps so that responses, each of which costs the same host work in every stage after this one,
stay within what those stages keep up with.
Every request gets a fresh key (the postprocessor's per-request state is keyed by it), unique
across instances and starting with `key_prefix` (the instance's address: abort_relay.py), and
numbered chunks; its output config rides on chunk 0 only.
"""

from __future__ import annotations

import json
import queue
import time
import uuid
from dataclasses import dataclass
from typing import Iterator

from flint_backend.engine.engine import LLMEngine, RequestOutput
from flint_backend.engine.engine_thread import EngineThread
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.serving.chunks import EngineChunk
from flint_backend.serving.response_pacing import ResponsePacing, merge_outputs
from flint_backend.serving.tensors import Inputs, scalar


@dataclass(eq=False)
class HostedRequest:
    handle: object              # the Triton response sender (opaque here)
    key: str
    config: str
    num_prompt_tokens: int = 0
    next_index: int = 0
    cancelled: bool = False


class EngineHost:
    def __init__(self, engine: LLMEngine, key_prefix: str = "", busy_fraction: float = 0.0):
        """busy_fraction: ResponsePacing's bound on the response thread's busy time (0: a response a step)."""
        self.engine = engine
        self.key_prefix = key_prefix
        self.pacing = ResponsePacing(busy_fraction)
        self._thread = EngineThread(engine)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # (HostedRequest, RequestOutput) | None

    def submit(self, handle, inputs: Inputs) -> HostedRequest:
        """A request from the tokenizer step; a refused one still answers, with an error chunk."""
        request = HostedRequest(handle, self.key_prefix + uuid.uuid4().hex, scalar(inputs, "output_config") or "")
        ids = inputs.get("prompt_ids")
        prompt = [int(t) for t in ids.reshape(-1)] if ids is not None else []
        request.num_prompt_tokens = len(prompt)
        try:  # the one place sampling values are validated: a bad one refuses this request only
            params = SamplingParams.from_dict(json.loads(scalar(inputs, "sampling_params") or "{}"))
            self._thread.add_request(prompt, params, request.key, callback=lambda out: self._queue.put((request, out)))
        except ValueError as error:  # RequestError, SamplingParamsError, bad JSON
            self._queue.put((request, RequestOutput(request.key, [], [], True, "rejected", len(prompt), 0, str(error))))
        return request

    def abort(self, key: str) -> None:
        self._thread.abort(key)

    def poll_cancelled(self, request: HostedRequest) -> bool:
        """The response sender says the client cancelled: abort the engine request (once)."""
        if not request.cancelled and request.handle.is_cancelled():
            request.cancelled = True
            self.abort(request.key)
        return request.cancelled

    def responses(self) -> Iterator[tuple[HostedRequest, EngineChunk]]:
        """Blocks; ends at the sentinel that `shutdown` queues after the last output. The time the
        consumer takes for each response (until it asks for the next) paces the next ones."""
        while True:
            items = self._take(self.pacing.wait_s())
            for request, output in _coalesce([i for i in items if i is not None]):
                self.pacing.add(request, output)
            stop = any(i is None for i in items)
            for request, output in self.pacing.ready(flush=stop):
                start = time.perf_counter()
                yield request, self._chunk(request, output)
                self.pacing.sent(time.perf_counter() - start)
            if stop:
                return

    def _take(self, timeout: float | None) -> list:
        """What the queue holds, once it holds something or `timeout` s have passed ([])."""
        try:
            items = [self._queue.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items

    def _chunk(self, request: HostedRequest, out: RequestOutput) -> EngineChunk:
        logprobs = [[lp.token_logprob, [list(pair) for pair in lp.top]] for lp in out.logprobs if lp is not None]
        prompt_logprobs = [[token, None, []] if lp is None else [token, lp.token_logprob, [list(p) for p in lp.top]]
                           for token, lp in out.prompt_logprobs or ()]
        chunk = EngineChunk(request.key, request.next_index, list(out.new_token_ids), out.finished,
                            out.finish_reason or "", out.num_prompt_tokens, out.num_output_tokens, out.error or "",
                            request.config if request.next_index == 0 else "", logprobs, prompt_logprobs,
                            num_cached_tokens=out.num_cached_tokens)
        request.next_index += 1
        return chunk

    def shutdown(self) -> None:
        """Stops the engine (its running requests end with an error chunk), then ends the queue."""
        self._thread.shutdown()
        self._queue.put(None)


def _coalesce(items: list[tuple[HostedRequest, RequestOutput]]) -> list[tuple[HostedRequest, RequestOutput]]:
    """One output a request: the ones queued together, merged in order."""
    merged: dict[int, tuple[HostedRequest, RequestOutput]] = {}
    for request, out in items:
        earlier = merged.get(id(request))
        merged[id(request)] = (request, out if earlier is None else merge_outputs(earlier[1], out))
    return list(merged.values())


