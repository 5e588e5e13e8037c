"""POST /v1/completions: raw prompts (no template) -> `text_completion` objects.

A prompt is text or token ids (the ensemble's `input_ids`). A list of prompts runs as that
many concurrent ensemble requests; choice i answers prompt i, and usage is their sum. `echo`
puts the prompt (token ids: their text) in front of the text (the ensemble's
exclude_input_in_output=false). With `logprobs` = N, each choice's `logprobs` has
the generated tokens' `tokens`, `token_logprobs`, `top_logprobs` (the top N as {token: logprob})
and `text_offset` (where each token's text starts in the choice's text); with `echo` too, the
prompt's tokens come first, the very first with null logprob and top_logprobs (as OpenAI and
vLLM answer, and lm-eval's loglikelihood requests read).
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from flint_backend.openai.errors import OpenAIError
from flint_backend.openai.protocol import CompletionRequest
from flint_backend.openai.responses import DONE, Envelope, sse, sse_error, usage
from flint_backend.openai.triton import EnsembleOutput, EnsembleRequest


def ensemble_requests(body: CompletionRequest, request_id: str) -> list[EnsembleRequest]:
    body.check()
    sampling = body.sampling(body.output_limit())
    return [EnsembleRequest(f"{request_id}-{i}", sampling, text_input=prompt if isinstance(prompt, str) else None,
                            input_ids=None if isinstance(prompt, str) else prompt, stream=bool(body.stream),
                            echo=bool(body.echo), prompt_param="prompt")
            for i, prompt in enumerate(body.prompts())]


class TextOffsets:
    """Where each token's text starts in a choice's text, across its streamed outputs."""

    def __init__(self):
        self.next = 0

    def logprobs(self, entries: list[dict]) -> dict:
        """OpenAI's completions `logprobs` of some tokens (the next ones of the choice)."""
        offsets = []
        for e in entries:
            offsets.append(self.next)
            self.next += len(e["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [None if e["logprob"] is None else {t["token"]: t["logprob"] for t in e["top_logprobs"]}
                                 for e in entries],
                "text_offset": offsets}


def completion(envelope: Envelope, outputs: list[list[EnsembleOutput]], logprobs: bool = False) -> dict:
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for i, parts in enumerate(outputs):
        last = parts[-1]
        lp = TextOffsets().logprobs([e for p in parts for e in p.prompt_logprobs + p.logprobs]) if logprobs else None
        choices.append({"index": i, "text": "".join(p.text for p in parts), "logprobs": lp,
                        "finish_reason": last.finish_reason or "stop"})
        prompt_tokens += last.num_input_tokens
        completion_tokens += last.num_output_tokens
    return envelope.wrap(choices, usage=usage(prompt_tokens, completion_tokens))


async def chunks(envelope: Envelope, first: tuple[int, EnsembleOutput],
                 rest: AsyncIterator[tuple[int, EnsembleOutput]], include_usage: bool,
                 logprobs: bool = False) -> AsyncIterator[str]:
    extra = {"usage": None} if include_usage else {}
    last: dict[int, EnsembleOutput] = {}
    offsets: dict[int, TextOffsets] = {}
    try:
        item = first
        while item is not None:
            i, output = item
            last[i] = output
            entries = output.prompt_logprobs + output.logprobs
            if output.text or output.finish_reason or (logprobs and entries):
                lp = offsets.setdefault(i, TextOffsets()).logprobs(entries) if logprobs else None
                choice = {"index": i, "text": output.text, "logprobs": lp,
                          "finish_reason": output.finish_reason or None}
                yield sse(envelope.wrap([choice], **extra))
            item = await anext(rest, None)
    except OpenAIError as error:
        yield sse_error(error)
        return
    finally:
        await rest.aclose()  # cancels the Triton streams when the client left mid-way
    if include_usage:
        yield sse(envelope.wrap([], usage=usage(sum(o.num_input_tokens for o in last.values()),
                                                sum(o.num_output_tokens for o in last.values()))))
    yield DONE


async def merge(streams: list[AsyncIterator[EnsembleOutput]]) -> AsyncIterator[tuple[int, EnsembleOutput]]:
    """(stream index, output) as they come; the first error ends it, and leaving it early
    cancels every stream (and so its Triton request)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[EnsembleOutput]) -> None:
        try:
            async for output in stream:
                await queue.put((i, output, None))
            await queue.put((i, None, None))
        except Exception as error:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, None, error))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(tasks)
        while open_streams:
            i, output, error = await queue.get()
            if error is not None:
                raise error
            if output is None:
                open_streams -= 1
            else:
                yield i, output
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
