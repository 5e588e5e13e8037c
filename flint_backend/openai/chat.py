"""POST /v1/chat/completions: a chat request -> the ensemble's chat inputs -> `chat.completion`
or a stream of `chat.completion.chunk`s.

The request is checked here with the same code and flags the ensemble's tokenizer step
uses (flint_backend.chat.check_chat_request), so a bad request is a 400 naming the field
before anything reaches Triton; the flags then travel as `chat_options`. Reasoning is
returned as `reasoning_content` and, vLLM's newer name, `reasoning`. With tool calls and
no text, `content` is null (as OpenAI answers). With `logprobs`, `choices[0].logprobs.content`
has one entry per generated token (`token`, `logprob`, `bytes`, `top_logprobs`), whichever
of content, reasoning or tool call its text went to, as vLLM gives them; a streamed chunk
carries its tokens' entries (one whose text the parsers still hold back has an empty delta).
"""

from __future__ import annotations

import logging
from typing import AsyncIterator

from flint_backend.chat.chat_options import ChatOptions
from flint_backend.chat.request import check_chat_request
from flint_backend.chat.request_error import ChatRequestError
from flint_backend.chat.tool_choice import unmet_tool_choice
from flint_backend.openai.errors import OpenAIError, bad_request
from flint_backend.openai.protocol import ChatCompletionRequest, choice_sampling
from flint_backend.openai.responses import DONE, Envelope, sse, sse_error, usage
from flint_backend.openai.triton import EnsembleOutput, EnsembleRequest

log = logging.getLogger("flint_backend.openai")


def ensemble_requests(body: ChatCompletionRequest, request_id: str,
                      options: ChatOptions) -> tuple[list[EnsembleRequest], str | dict]:
    """The ensemble's requests (one a choice) and the effective tool_choice; raises OpenAIError (400)."""
    body.check()
    try:
        checked = check_chat_request(body.messages, body.tools, body.tool_choice, body.chat_template_kwargs, options)
    except ChatRequestError as error:
        raise bad_request(str(error), error.field) from None
    chat = {"messages": body.messages, "tools": body.tools, "tool_choice": body.tool_choice,
            "chat_template_kwargs": body.chat_template_kwargs, "chat_options": options.to_dict()}
    flags = {} if body.parallel_tool_calls is None else {"parallel_tool_calls": body.parallel_tool_calls}
    sampling, n = body.sampling(body.output_limit()), body.choices
    requests = [EnsembleRequest(request_id if n == 1 else f"{request_id}-{j}", choice_sampling(sampling, j),
                                chat=chat, flags=flags, stream=bool(body.stream),
                                renamed={"max_tokens": body.max_tokens_param, "logprobs": "top_logprobs"})
                for j in range(n)]
    return requests, checked.tools.tool_choice


def _reasoning(text: str) -> dict:
    return {"reasoning_content": text, "reasoning": text} if text else {}


def _logprobs(outputs: list[EnsembleOutput]) -> dict:
    """OpenAI's chat `logprobs` of the outputs' tokens."""
    def entry(e: dict) -> dict:
        return {"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"]}

    return {"content": [{**entry(e), "top_logprobs": [entry(t) for t in e["top_logprobs"]]}
                        for o in outputs for e in o.logprobs]}


def completion(envelope: Envelope, outputs: list[list[EnsembleOutput]], tool_choice,
               logprobs: bool = False) -> dict:
    """outputs: each choice's, in choice order."""
    choices = []
    for index, parts in enumerate(outputs):
        text = "".join(o.text for o in parts)
        reasoning = "".join(o.reasoning for o in parts)
        calls = [c for o in parts for c in o.tool_calls]
        _log_unmet(envelope.id, tool_choice, calls)
        message = {"role": "assistant", "content": None if calls and not text else text,
                   "reasoning_content": reasoning or None, "reasoning": reasoning or None}
        if calls:
            message["tool_calls"] = calls
        choices.append({"index": index, "message": message, "logprobs": _logprobs(parts) if logprobs else None,
                        "finish_reason": parts[-1].finish_reason or "stop"})
    return envelope.wrap(choices, usage=_usage([parts[-1] for parts in outputs]))


def _usage(lasts: list[EnsembleOutput]) -> dict:
    """The choices share one prompt: counted once (its cached tokens as choice 0 found them)."""
    return usage(lasts[0].num_input_tokens, sum(o.num_output_tokens for o in lasts), lasts[0].num_cached_tokens)


async def chunks(envelope: Envelope, first: tuple[int, EnsembleOutput],
                 rest: AsyncIterator[tuple[int, EnsembleOutput]], n: int, include_usage: bool, tool_choice,
                 logprobs: bool = False) -> AsyncIterator[str]:
    """SSE events of the merged choices (triton.merge: (choice index, output)): a role delta each,
    content/reasoning/tool-call deltas (with their tokens' logprobs), each choice's finish reason
    after its last output, usage, [DONE]."""
    extra = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: dict, finish_reason: str | None = None, lp: dict | None = None) -> str:
        return sse(envelope.wrap([{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}],
                                 **extra))

    for index in range(n):
        yield chunk(index, {"role": "assistant", "content": ""})
    last: dict[int, EnsembleOutput] = {}
    calls: dict[int, list] = {index: [] for index in range(n)}
    try:
        item = first
        while item is not None:
            index, output = item
            delta = {**_reasoning(output.reasoning), **({"content": output.text} if output.text else {})}
            if output.tool_calls:
                delta["tool_calls"] = output.tool_calls
                calls[index] += output.tool_calls
            if delta or (logprobs and output.logprobs):
                yield chunk(index, delta, lp=_logprobs([output]) if logprobs else None)
            if output.finish_reason:
                _log_unmet(envelope.id, tool_choice, calls[index])
                yield chunk(index, {}, output.finish_reason)
            last[index] = output
            item = await anext(rest, None)
    except OpenAIError as error:
        yield sse_error(error)
        return
    finally:
        await rest.aclose()  # cancels the Triton streams when the client left mid-way
    for index in range(n):  # a stream that ended without a finish reason (never, if sound)
        if not last.get(index, EnsembleOutput()).finish_reason:
            yield chunk(index, {}, "stop")
    if include_usage:
        yield sse(envelope.wrap([], usage=_usage([last.get(index, EnsembleOutput()) for index in range(n)])))
    yield DONE


def _log_unmet(request_id: str, tool_choice, calls: list[dict]) -> None:
    note = unmet_tool_choice(tool_choice, bool(calls))
    if note:
        log.warning("%s: %s", request_id, note)
