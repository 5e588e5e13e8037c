"""POST /v1/completions: raw prompts (no template) -> `text_completion` objects.

A prompt is text or token ids (the ensemble's `input_ids`). Each prompt runs as `n`
concurrent ensemble requests (choice p * n + j is prompt p's j-th); usage counts each prompt
once and every choice's tokens. `echo`
puts the prompt (token ids: their text) in front of the text (the ensemble's
exclude_input_in_output=false). With `logprobs` = N, each choice's `logprobs` has
the generated tokens' `tokens`, `token_logprobs`, `top_logprobs` (the top N as {token: logprob})
and `text_offset` (where each token's text starts in the choice's text); with `echo` too, the
prompt's tokens come first, the very first with null logprob and top_logprobs (as OpenAI and
vLLM answer, and lm-eval's loglikelihood requests read).
"""

from __future__ import annotations

from typing import AsyncIterator

from flint_backend.openai.errors import OpenAIError
from flint_backend.openai.protocol import CompletionRequest, choice_sampling
from flint_backend.openai.responses import DONE, Envelope, sse, sse_error, usage
from flint_backend.openai.triton import EnsembleOutput, EnsembleRequest


def ensemble_requests(body: CompletionRequest, request_id: str) -> list[EnsembleRequest]:
    """One request a choice: choice p * n + j is prompt p's j-th."""
    body.check()
    sampling, n = body.sampling(body.output_limit()), body.choices
    return [EnsembleRequest(f"{request_id}-{p * n + j}", choice_sampling(sampling, j),
                            text_input=prompt if isinstance(prompt, str) else None,
                            input_ids=None if isinstance(prompt, str) else prompt, stream=bool(body.stream),
                            echo=bool(body.echo), prompt_param="prompt")
            for p, prompt in enumerate(body.prompts()) for j in range(n)]


def _usage(lasts: list[EnsembleOutput], n: int) -> dict:
    """Each prompt's tokens once (its n choices share it; its cached tokens as its first choice found
    them), every choice's output tokens."""
    firsts = [o for i, o in enumerate(lasts) if i % n == 0]
    return usage(sum(o.num_input_tokens for o in firsts), sum(o.num_output_tokens for o in lasts),
                 sum(o.num_cached_tokens for o in firsts))


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


def completion(envelope: Envelope, outputs: list[list[EnsembleOutput]], n: int = 1, logprobs: bool = False) -> dict:
    """outputs: each choice's, in choice order (ensemble_requests')."""
    choices = []
    for i, parts in enumerate(outputs):
        lp = TextOffsets().logprobs([e for p in parts for e in p.prompt_logprobs + p.logprobs]) if logprobs else None
        choices.append({"index": i, "text": "".join(p.text for p in parts), "logprobs": lp,
                        "finish_reason": parts[-1].finish_reason or "stop"})
    return envelope.wrap(choices, usage=_usage([parts[-1] for parts in outputs], n))


async def chunks(envelope: Envelope, first: tuple[int, EnsembleOutput],
                 rest: AsyncIterator[tuple[int, EnsembleOutput]], include_usage: bool, n: int = 1,
                 logprobs: bool = False) -> AsyncIterator[str]:
    """SSE events of the merged choices (triton.merge: (choice index, output)), usage, [DONE]."""
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
        yield sse(envelope.wrap([], usage=_usage([last[i] for i in sorted(last)], n)))
    yield DONE
