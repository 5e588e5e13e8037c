"""How many tokens one flint_model response carries when many streams run.

A response costs the same host work whatever it carries: in flint_model a cancellation check and a
send (each a round trip to tritonserver), in tritonserver the ensemble's routing, in
flint_postprocess an execution of its own (its inputs, a cancellation check, a send: about twice
flint_model's part), then the client's event. At one response a token, 64 streams of a fast
engine ask more of these single-threaded stages than they have: flint_postprocess falls behind
and the served tokens/s with it (docs/performance.md, "Many streams: served through tritonserver").

So the host keeps its response thread busy at most `busy_fraction` of the time. Every WINDOW_S it
reads how many outputs arrived a second and how long its consumer took for a response; when one
response an output would take more, a request's outputs wait and go out together, k tokens a
response, k the least that keeps the thread under the fraction (at most MAX_TOKENS). A request's
first output (its TTFT), its last and an error never wait, nor does any output once it has
waited MAX_HOLD_S. Requests take turns: request i goes out when its token count passes a multiple
of k shifted by i, so each step sends about 1/k of them. busy_fraction 0: one response a step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from flint_backend.engine.engine import RequestOutput
from flint_backend.serving.repository import checked_busy_fraction

WINDOW_S = 0.5
MAX_TOKENS = 16
MAX_HOLD_S = 0.25


def merge_outputs(first: RequestOutput, later: RequestOutput) -> RequestOutput:
    """One output with both outputs' tokens (and log probabilities), the later one's state."""
    merged = RequestOutput(**vars(first))
    merged.new_token_ids = first.new_token_ids + later.new_token_ids
    merged.logprobs = first.logprobs + later.logprobs
    merged.prompt_logprobs = first.prompt_logprobs or later.prompt_logprobs
    merged.finished, merged.finish_reason = later.finished, later.finish_reason
    merged.num_output_tokens, merged.error = later.num_output_tokens, later.error
    merged.num_cached_tokens = later.num_cached_tokens
    return merged


@dataclass
class _Paced:
    request: object                      # the caller's handle (engine_host.HostedRequest)
    turn: int                            # the request's shift of the multiples of k
    sent_tokens: int = 0                 # num_output_tokens of its last response
    sent_any: bool = False
    held: RequestOutput | None = None    # outputs not sent yet, merged
    held_since: float = 0.0


class ResponsePacing:
    def __init__(self, busy_fraction: float, clock: Callable[[], float] = time.monotonic):
        self.busy_fraction = checked_busy_fraction(busy_fraction, "response_busy_fraction")
        self.tokens_per_response = 1
        self._clock = clock
        self._paced: dict[int, _Paced] = {}
        self._turns = 0
        self._window_start, self._arrived, self._sent, self._busy_s = clock(), 0, 0, 0.0

    def add(self, request, output: RequestOutput) -> None:
        """An output from the engine, to hold or send (ready)."""
        paced = self._paced.get(id(request))
        if paced is None:
            paced = self._paced[id(request)] = _Paced(request, self._turns)
            self._turns += 1
        if paced.held is None:
            paced.held, paced.held_since = output, self._clock()
        else:
            paced.held = merge_outputs(paced.held, output)
        self._arrived += 1

    def ready(self, flush: bool = False) -> list[tuple[object, RequestOutput]]:
        """The outputs to send now, one merged output a request, in the order they came."""
        now = self._clock()
        self._update(now)
        out = []
        for key, paced in list(self._paced.items()):
            if paced.held is None or not (flush or self._due(paced, now)):
                continue
            output, paced.held = paced.held, None
            paced.sent_any, paced.sent_tokens = True, output.num_output_tokens
            if output.finished:
                del self._paced[key]
            out.append((paced.request, output))
        return out

    def sent(self, seconds: float) -> None:
        """What the consumer took for one response (tensors, cancellation check, send)."""
        self._sent += 1
        self._busy_s += seconds

    def wait_s(self) -> float | None:
        """Seconds until the longest-held output must go; None when none is held."""
        since = [p.held_since for p in self._paced.values() if p.held is not None]
        return None if not since else max(0.0, min(since) + MAX_HOLD_S - self._clock())

    def _due(self, paced: _Paced, now: float) -> bool:
        output, k = paced.held, self.tokens_per_response
        if k == 1 or output.finished or output.error or not paced.sent_any or now - paced.held_since >= MAX_HOLD_S:
            return True
        return (output.num_output_tokens + paced.turn) // k > (paced.sent_tokens + paced.turn) // k

    def _update(self, now: float) -> None:
        elapsed = now - self._window_start
        if elapsed < WINDOW_S:
            return
        if self.busy_fraction == 0.0:
            self.tokens_per_response = 1
        elif self._sent:  # without a response this window, the last k stands
            busy_at_one = self._arrived / elapsed * (self._busy_s / self._sent)
            self.tokens_per_response = min(MAX_TOKENS, max(1, math.ceil(busy_at_one / self.busy_fraction)))
        self._window_start, self._arrived, self._sent, self._busy_s = now, 0, 0, 0.0
