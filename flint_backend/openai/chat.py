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
from flint_backend.openai.protocol import ChatCompletionRequest
from flint_backend.openai.responses import DONE, Envelope, sse, sse_error, usage
from flint_backend.openai.triton import EnsembleOutput, EnsembleRequest

log = logging.getLogger("flint_backend.openai")


def ensemble_request(body: ChatCompletionRequest, request_id: str,
                     options: ChatOptions) -> tuple[EnsembleRequest, str | dict]:
    """The ensemble's request and the effective tool_choice; raises OpenAIError (400)."""
    body.check()
    try:
        checked = check_chat_request(body.messages, body.tools, body.tool_choice, body.chat_template_kwargs, options)
    except ChatRequestError as error:
        raise bad_request(str(error), error.field) from None
    chat = {"messages": body.messages, "tools": body.tools, "tool_choice": body.tool_choice,
            "chat_template_kwargs": body.chat_template_kwargs, "chat_options": options.to_dict()}
    request = EnsembleRequest(request_id, body.sampling(body.output_limit()), chat=chat, stream=bool(body.stream),
                              renamed={"max_tokens": body.max_tokens_param, "logprobs": "top_logprobs"})
    return request, checked.tools.tool_choice


def _reasoning(text: str) -> dict:
    return {"reasoning_content": text, "reasoning": text} if text else {}


def _logprobs(outputs: list[EnsembleOutput]) -> dict:
    """OpenAI's chat `logprobs` of the outputs' tokens."""
    def entry(e: dict) -> dict:
        return {"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"]}

    return {"content": [{**entry(e), "top_logprobs": [entry(t) for t in e["top_logprobs"]]}
                        for o in outputs for e in o.logprobs]}


def completion(envelope: Envelope, outputs: list[EnsembleOutput], tool_choice, logprobs: bool = False) -> dict:
    text = "".join(o.text for o in outputs)
    reasoning = "".join(o.reasoning for o in outputs)
    calls = [c for o in outputs for c in o.tool_calls]
    last = outputs[-1]
    _log_unmet(envelope.id, tool_choice, calls)
    message = {"role": "assistant", "content": None if calls and not text else text,
               "reasoning_content": reasoning or None, "reasoning": reasoning or None}
    if calls:
        message["tool_calls"] = calls
    choice = {"index": 0, "message": message, "logprobs": _logprobs(outputs) if logprobs else None,
              "finish_reason": last.finish_reason or "stop"}
    return envelope.wrap([choice], usage=usage(last.num_input_tokens, last.num_output_tokens))


async def chunks(envelope: Envelope, first: EnsembleOutput, rest: AsyncIterator[EnsembleOutput],
                 include_usage: bool, tool_choice, logprobs: bool = False) -> AsyncIterator[str]:
    """SSE events: a role delta, content/reasoning/tool-call deltas (with their tokens' logprobs),
    the finish reason, usage, [DONE]."""
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict, finish_reason: str | None = None, lp: dict | None = None) -> str:
        return sse(envelope.wrap([{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}],
                                 **extra))

    yield chunk({"role": "assistant", "content": ""})
    last, calls = first, []
    try:
        output = first
        while output is not None:
            delta = {**_reasoning(output.reasoning), **({"content": output.text} if output.text else {})}
            if output.tool_calls:
                delta["tool_calls"] = output.tool_calls
                calls += output.tool_calls
            if delta or (logprobs and output.logprobs):
                yield chunk(delta, lp=_logprobs([output]) if logprobs else None)
            last = output
            output = await anext(rest, None)
    except OpenAIError as error:
        yield sse_error(error)
        return
    finally:
        await rest.aclose()  # cancels the Triton stream when the client left mid-way
    _log_unmet(envelope.id, tool_choice, calls)
    yield chunk({}, last.finish_reason or "stop")
    if include_usage:
        yield sse(envelope.wrap([], usage=usage(last.num_input_tokens, last.num_output_tokens)))
    yield DONE


def _log_unmet(request_id: str, tool_choice, calls: list[dict]) -> None:
    note = unmet_tool_choice(tool_choice, bool(calls))
    if note:
        log.warning("%s: %s", request_id, note)
