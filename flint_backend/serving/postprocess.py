"""The flint_postprocess step: engine chunks (token ids, in order per request) -> text.

Each response of flint_model reaches this step as its own request; `Postprocessor` keeps
one `RequestText` per engine request, keyed by the request key the model forwards, and
applies a request's chunks in index order whatever order they arrive in (a chunk that
comes early waits for the ones before it). Per request: incremental detokenisation, stop
strings (the first match ends the output; the caller then aborts the engine request), the
echoed prompt, for chat requests the reasoning and tool-call parsers, and the log probabilities
of the generated tokens when the request asked for them (sampling `logprobs`), one entry a
token with its text and bytes (chat.token_logprobs), for every token counted in
`num_output_tokens`; the prompt's (sampling `prompt_logprobs`) go out once, with the first
generated token.

Streaming: one `TextDelta` per chunk that adds something, the last one final. Not
streaming: nothing until the final chunk, then everything in one `TextDelta`.

An error while a request's chunk is applied (a bug, or input the request checks let through)
ends that request alone: its final delta carries the error (finish_reason "error"), its later
chunks are dropped as a cancelled request's are, and, while the engine may still run it, the
outcome asks for the engine request's abort, so it stops generating and frees its KV cache.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from flint_backend.chat.detokenizer import IncrementalDetokenizer
from flint_backend.chat.output_parser import ChatDelta, ChatOutputParser
from flint_backend.chat.stop_strings import StopStringMatcher
from flint_backend.chat.token_logprobs import TokenLogprobEntries
from flint_backend.chat.tool_parser import ToolCallDelta
from flint_backend.chat.tool_choice import unmet_tool_choice
from flint_backend.serving.chunks import EngineChunk, OutputConfig, TextDelta

log = logging.getLogger(__name__)
MAX_REMEMBERED_CANCELS = 4096  # cancelled keys kept until their final chunk, at most


class RequestText:
    def __init__(self, tokenizer, config: OutputConfig, logprob_entries: TokenLogprobEntries):
        self.config = config
        self._logprob_entries = logprob_entries  # the postprocessor's: token texts cached across requests
        self._detok = IncrementalDetokenizer(tokenizer, config.prompt_tail, config.skip_special_tokens)
        self._stop = StopStringMatcher(config.stop)
        self._parser = ChatOutputParser(**config.chat) if config.chat else None
        self._echo = config.echo
        self._text: list[str] = []  # plain-text output so far (not streaming)
        self._logprobs: list[dict] = []  # logprob entries so far (not streaming)
        self._prompt_logprobs: list[dict] = []
        self.num_output_tokens = 0

    @property
    def stopped(self) -> bool:
        return self._stop.stopped

    def apply(self, chunk: EngineChunk) -> TextDelta | None:
        text = self._detok.push(chunk.token_ids) + (self._detok.flush() if chunk.finished else "")
        delta = TextDelta(num_input_tokens=chunk.num_input_tokens, num_cached_tokens=chunk.num_cached_tokens)
        if not self._stop.stopped:  # tokens made after a stop are not counted
            self.num_output_tokens = chunk.num_output_tokens
            if chunk.logprobs:
                delta.logprobs = self._logprob_entries.entries(chunk.token_ids, chunk.logprobs)
        delta.num_output_tokens = self.num_output_tokens
        if chunk.prompt_logprobs:
            delta.prompt_logprobs = self._logprob_entries.prompt_entries(chunk.prompt_logprobs)
        safe, _ = self._stop.push(text)
        if chunk.finished:
            safe += self._stop.flush()
        delta.text, self._echo = self._echo, ""
        if self._parser is None:
            delta.text += safe
        else:
            self._add(delta, self._parser.feed(safe))
            if chunk.finished:
                self._add(delta, self._parser.finish())
        if chunk.finished:
            self._finish(delta, chunk)
        if self.config.stream:
            return None if delta.is_empty() else delta
        self._text.append(delta.text)
        self._logprobs += delta.logprobs
        self._prompt_logprobs += delta.prompt_logprobs
        return self._whole(delta) if chunk.finished else None

    def _add(self, delta: TextDelta, part: ChatDelta) -> None:
        delta.text += part.content
        delta.reasoning += part.reasoning
        delta.tool_calls += [_call_delta(c) for c in part.tool_calls]

    def _finish(self, delta: TextDelta, chunk: EngineChunk) -> None:
        delta.final = True
        reason = "stop" if self._stop.stopped else chunk.finish_reason
        if chunk.error:
            delta.error, delta.client_error, reason = chunk.error, chunk.finish_reason == "rejected", "error"
        if self._parser is not None:
            reason = self._parser.finish_reason(reason)
            delta.note = unmet_tool_choice(self.config.chat.get("tool_choice"), self._parser.has_tool_calls) or ""
        delta.finish_reason = reason

    def _whole(self, last: TextDelta) -> TextDelta:
        whole = TextDelta(finish_reason=last.finish_reason, num_input_tokens=last.num_input_tokens,
                          num_output_tokens=last.num_output_tokens, num_cached_tokens=last.num_cached_tokens,
                          final=True, error=last.error, client_error=last.client_error, note=last.note,
                          logprobs=self._logprobs, prompt_logprobs=self._prompt_logprobs)
        if self._parser is None:
            whole.text = "".join(self._text)
            return whole
        result = self._parser.result()
        whole.text = result.content
        whole.reasoning = result.reasoning
        whole.tool_calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                            for c in result.tool_calls]
        return whole


def _call_delta(d: ToolCallDelta) -> dict:
    """OpenAI's streamed tool-call delta: header fields on the first, then argument pieces."""
    out: dict = {"index": d.index}
    if d.id:
        out["id"] = d.id
    if d.type:
        out["type"] = d.type
    function = {"name": d.name} if d.name else {}
    function["arguments"] = d.arguments
    out["function"] = function
    return out


@dataclass
class _Entry:
    text: RequestText | None = None
    next_index: int = 0
    early: dict[int, EngineChunk] = field(default_factory=dict)  # chunks that came before their turn
    abort_sent: bool = False


@dataclass
class Outcome:
    outputs: list[TextDelta]      # to send now, in order (empty: nothing)
    abort_engine: bool = False    # a stop string or an error ended the output: abort the engine request


class Postprocessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._logprob_entries = TokenLogprobEntries(tokenizer)  # token texts cached across requests
        self._entries: dict[str, _Entry] = {}
        self._cancelled: dict[str, None] = {}  # insertion-ordered set
        self._lock = threading.Lock()

    @property
    def num_open(self) -> int:
        return len(self._entries)

    def process(self, chunk: EngineChunk) -> Outcome:
        with self._lock:
            if chunk.key in self._cancelled:
                if chunk.finished:
                    del self._cancelled[chunk.key]
                return Outcome([])
            entry = self._entries.setdefault(chunk.key, _Entry())
            entry.early[chunk.index] = chunk
            outputs, finished = [], False
            try:
                while entry.next_index in entry.early:
                    ready = entry.early.pop(entry.next_index)
                    entry.next_index += 1
                    finished = finished or ready.finished
                    if entry.text is None:
                        entry.text = RequestText(self.tokenizer, OutputConfig.from_json(ready.config or "{}"),
                                                 self._logprob_entries)
                    delta = entry.text.apply(ready)
                    if delta is not None:
                        outputs.append(delta)
            except Exception as error:
                return self._fail(chunk.key, entry, finished, error)
            if finished:
                del self._entries[chunk.key]
            abort = bool(entry.text and entry.text.stopped and not finished and not entry.abort_sent)
            entry.abort_sent = entry.abort_sent or abort
            return Outcome(_merge(outputs), abort)

    def _fail(self, key: str, entry: _Entry, finished: bool, error: Exception) -> Outcome:
        """The request ends with the error; its engine request is aborted unless it is done."""
        log.exception("postprocess: request %s failed", key)
        del self._entries[key]
        engine_done = finished or any(c.finished for c in entry.early.values())
        if not engine_done:
            self._remember_cancelled(key)
        failure = TextDelta(final=True, finish_reason="error", error=f"postprocess: {type(error).__name__}: {error}")
        return Outcome([failure], abort_engine=not engine_done and not entry.abort_sent)

    def process_all(self, chunks: list[EngineChunk]) -> list[Outcome]:
        """Chunks that queued up together (the postprocessor fell behind): a request's outputs go
        out as one, with its last chunk in the batch; its earlier chunks answer nothing."""
        outcomes = [self.process(c) for c in chunks]
        last = {c.key: i for i, c in enumerate(chunks)}
        held: dict[str, list[TextDelta]] = {}
        for i, (chunk, outcome) in enumerate(zip(chunks, outcomes)):
            held.setdefault(chunk.key, []).extend(outcome.outputs)
            outcome.outputs = _merge(held.pop(chunk.key)) if i == last[chunk.key] else []
        return outcomes

    def cancel(self, key: str, finished: bool) -> bool:
        """The client cancelled; True when the engine request may still run (abort it once)."""
        with self._lock:
            if key in self._cancelled:
                if finished:
                    del self._cancelled[key]
                return False
            self._entries.pop(key, None)
            if not finished:
                self._remember_cancelled(key)
            return not finished

    def _remember_cancelled(self, key: str) -> None:
        self._cancelled[key] = None
        while len(self._cancelled) > MAX_REMEMBERED_CANCELS:
            del self._cancelled[next(iter(self._cancelled))]


def _merge(outputs: list[TextDelta]) -> list[TextDelta]:
    """Deltas released together (a late chunk let earlier-arrived ones through) go out as one."""
    if len(outputs) <= 1:
        return outputs
    merged = outputs[-1]
    merged.text = "".join(o.text for o in outputs)
    merged.reasoning = "".join(o.reasoning for o in outputs)
    merged.tool_calls = [c for o in outputs for c in o.tool_calls]
    merged.logprobs = [e for o in outputs for e in o.logprobs]
    merged.prompt_logprobs = [e for o in outputs for e in o.prompt_logprobs]
    return [merged]
