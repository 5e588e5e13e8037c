"""The OpenAI server's flags, request checks and error mapping, without a server."""

import asyncio
import json

import pytest
from pydantic import ValidationError

from flint_backend.chat.chat_options import ANNOUNCED_OPTIONS
from flint_backend.openai import chat, completions
from flint_backend.openai.errors import OpenAIError, from_triton_error, from_validation_error
from flint_backend.openai.protocol import (COMPLETIONS_DEFAULT_MAX_TOKENS, MAX_LOGPROBS,
                                           ChatCompletionRequest, CompletionRequest, choice_sampling)
from flint_backend.openai.responses import Envelope
from flint_backend.openai.server_args import parse_args
from flint_backend.openai.triton import EnsembleOutput

MESSAGES = [{"role": "user", "content": "hi"}]


def test_flags_default_to_localhost_and_the_announcement_spelling_parses():
    args = parse_args([])
    assert (args.host, args.port, args.model, args.model_names, args.api_key) == ("127.0.0.1", 9000, "flint",
                                                                                   ("flint",), None)
    args = parse_args(["--triton-url", "triton.local:8101", "--served-model-name", "a", "b",
                       "--enable-auto-tool-choice", "--tool-call-parser", "glm47", "--reasoning-parser", "glm47",
                       "--exclude-tools-when-tool-choice-none"])
    assert args.chat == ANNOUNCED_OPTIONS and args.model_names == ("a", "b")
    assert args.metrics_url == "http://triton.local:8002/metrics"


@pytest.mark.parametrize("flags", [["--enable-auto-tool-choice"], ["--tool-call-parser", "hermes"], ["--port", "0"]])
def test_bad_flags_stop_the_server(flags):
    with pytest.raises(SystemExit):
        parse_args(flags)


def test_sampling_parameters_carry_only_what_was_given():
    body = ChatCompletionRequest(messages=MESSAGES, temperature=0, stop="x", seed=-3, top_k=5,
                                 max_completion_tokens=9, ignore_eos=True)
    assert body.sampling(body.output_limit()) == {"temperature": 0.0, "top_k": 5, "seed": -3, "ignore_eos": True,
                                                  "max_tokens": 9, "stop": ["x"]}
    assert body.max_tokens_param == "max_completion_tokens"
    unbounded = ChatCompletionRequest(messages=MESSAGES)  # until the context is full: the ensemble's null
    assert unbounded.output_limit() is None and unbounded.sampling(unbounded.output_limit()) == {"max_tokens": None}
    assert CompletionRequest(prompt="p").output_limit() == COMPLETIONS_DEFAULT_MAX_TOKENS


def test_cache_salt_goes_to_the_sampling_parameters():
    for body in (ChatCompletionRequest(messages=MESSAGES, cache_salt="tenant-a"),
                 CompletionRequest(prompt="p", cache_salt="tenant-a")):
        body.check()
        assert body.sampling(4)["cache_salt"] == "tenant-a"
    assert "cache_salt" not in ChatCompletionRequest(messages=MESSAGES).sampling(4)


def test_response_format_becomes_guided_json():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = [({"type": "text"}, None), ({"type": "json_object"}, {"type": "object"}),
             ({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}, schema)]
    for response_format, expected in cases:
        body = ChatCompletionRequest(messages=MESSAGES, response_format=response_format)
        body.check()
        assert body.sampling(4).get("guided_json") == expected
    assert CompletionRequest(prompt="p", guided_json=schema).sampling(4)["guided_json"] == schema


def test_choice_j_samples_with_seed_plus_j():
    body = CompletionRequest(prompt="p", n=3, seed=7, temperature=1.0)
    body.check()
    assert body.choices == 3 and [choice_sampling(body.sampling(4), j)["seed"] for j in range(3)] == [7, 8, 9]
    unseeded = CompletionRequest(prompt="p", n=2).sampling(4)
    assert choice_sampling(unseeded, 1) == unseeded and "seed" not in unseeded


def test_logprobs_become_the_sampling_logprobs():
    chat = ChatCompletionRequest(messages=MESSAGES, logprobs=True, top_logprobs=3)
    chat.check()
    assert chat.wants_logprobs and chat.sampling(4) == {"max_tokens": 4, "logprobs": 3}
    assert ChatCompletionRequest(messages=MESSAGES, logprobs=True).sampling(4) == {"max_tokens": 4, "logprobs": 0}
    off = ChatCompletionRequest(messages=MESSAGES, logprobs=False)
    assert not off.wants_logprobs and off.sampling(4) == {"max_tokens": 4}
    text = CompletionRequest(prompt="p", logprobs=0)
    text.check()
    assert text.wants_logprobs and text.sampling(2) == {"max_tokens": 2, "logprobs": 0}
    echoed = CompletionRequest(prompt="p", logprobs=1, echo=True)
    assert echoed.sampling(1) == {"max_tokens": 1, "logprobs": 1, "prompt_logprobs": 1}
    assert not CompletionRequest(prompt="p").wants_logprobs


@pytest.mark.parametrize("prompt, expected", [
    ("Hello", ["Hello"]),
    (["Hello", "world"], ["Hello", "world"]),
    ([5, 6, 7], [[5, 6, 7]]),
    ([[5, 6], [7]], [[5, 6], [7]]),
])
def test_completion_prompts_are_text_or_token_ids(prompt, expected):
    assert CompletionRequest(prompt=prompt).prompts() == expected


@pytest.mark.parametrize("body, param", [
    (ChatCompletionRequest(messages=MESSAGES, n=0), "n"),
    (CompletionRequest(prompt="p", n=65), "n"),
    (ChatCompletionRequest(messages=MESSAGES, top_logprobs=2), "top_logprobs"),
    (ChatCompletionRequest(messages=MESSAGES, response_format={"type": "yaml"}), "response_format"),
    (ChatCompletionRequest(messages=MESSAGES, stream_options={"include_usage": True}), "stream_options"),
    (ChatCompletionRequest(messages=MESSAGES, logprobs=True, top_logprobs=21), "top_logprobs"),
    (ChatCompletionRequest(messages=MESSAGES, logprobs=True, top_logprobs=-1), "top_logprobs"),
    (CompletionRequest(prompt="p", logprobs=21), "logprobs"),
    (CompletionRequest(prompt="p", suffix="s"), "suffix"),
    (CompletionRequest(prompt="p", best_of=2), "best_of"),
    (CompletionRequest(prompt=[[1, -2]]), "prompt"),
    (CompletionRequest(prompt=[[]]), "prompt"),
    (CompletionRequest(prompt=["a", 3]), "prompt"),
    (CompletionRequest(prompt=[]), "prompt"),
    (ChatCompletionRequest(messages=MESSAGES, cache_salt=""), "cache_salt"),
    (CompletionRequest(prompt="p", cache_salt=""), "cache_salt"),
])
def test_what_the_server_cannot_honour_is_a_400_naming_the_field(body, param):
    with pytest.raises(OpenAIError) as caught:
        body.check()
    assert caught.value.status == 400 and caught.value.param == param and caught.value.message.startswith(param)


def test_the_logprobs_limit_is_the_engines():
    from flint_backend.engine import sampling_params  # the test may look; the server imports no engine

    assert MAX_LOGPROBS == sampling_params.MAX_LOGPROBS


@pytest.mark.parametrize("data, path", [
    ({"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    ({"messages": MESSAGES, "stop": ["a", 3]}, "stop[1]"),
    ({"messages": MESSAGES, "temperature": "0.5"}, "temperature"),
    ({"messages": MESSAGES, "max_tokens": 1.5}, "max_tokens"),
    ({"messages": MESSAGES, "cache_salt": 5}, "cache_salt"),
    ({"messages": MESSAGES, "cache_salt": ["a"]}, "cache_salt"),
    ({}, "messages"),
])
def test_type_errors_name_the_field(data, path):
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(data)
    error = from_validation_error(caught.value, ChatCompletionRequest)
    assert (error.status, error.param) == (400, path) and error.message.startswith(path + ": ")


@pytest.mark.parametrize("message, status, param, code", [
    ("in ensemble 'flint', max_tokens: got -4, expected a positive integer", 400, "max_completion_tokens", None),
    ("in ensemble 'flint', sampling_parameters.top_k: expected an integer, got 1.5", 400, "top_k", None),
    ("in ensemble 'flint', prompt: 900 tokens do not fit the context of 512 tokens", 400, "prompt",
     "context_length_exceeded"),
    ("in ensemble 'flint', max_tokens: got 1000, expected at most 412 (the prompt's 100 tokens plus max_tokens "
     "must fit the context of 512 tokens)", 400, "max_completion_tokens", "context_length_exceeded"),
    ("in ensemble 'flint', text_input: expected a non-empty string, got \"\"", 400, "prompt", None),
    ("in ensemble 'flint', messages[1].content: expected a string", 400, "messages[1].content", None),
    ("in ensemble 'flint', logprobs: got 30, expected an integer in [0, 20]", 400, "top_logprobs", None),
    ("in ensemble 'flint', sampling_parameters.cache_salt: expected a non-empty string, got 5", 400, "cache_salt",
     None),
    ("in ensemble 'flint', cache_salt: got '', expected a non-empty string", 400, "cache_salt", None),
    ("in ensemble 'flint', postprocess: KeyError: 'x'", 500, None, "internal_error"),
    ("Stub process is unhealthy", 500, None, "internal_error"),
])
def test_triton_refusals_map_to_400_naming_the_field_and_the_rest_to_500(message, status, param, code):
    error = from_triton_error(message, prompt_param="prompt",
                              renamed={"max_tokens": "max_completion_tokens", "logprobs": "top_logprobs"})
    assert (error.status, error.param, error.code) == (status, param, code)
    assert error.body()["error"]["message"].startswith(param + ":" if param else "Triton: ")


def outputs_of(prompt: int, cached: int, counts: list[int]) -> list[EnsembleOutput]:
    """One choice's outputs: `counts` output tokens so far in each, the last with the finish reason."""
    return [EnsembleOutput(text="x", finish_reason="stop" if i == len(counts) - 1 else "", num_input_tokens=prompt,
                           num_output_tokens=count, num_cached_tokens=cached) for i, count in enumerate(counts)]


def streamed_usage(events) -> dict:
    async def text():
        return [event async for event in events]

    *_, usage, done = asyncio.run(text())
    assert done == "data: [DONE]\n\n"
    return json.loads(usage.removeprefix("data: "))["usage"]


async def rest_of(items: list):
    for item in items:
        yield item


def test_usage_has_the_cached_prompt_tokens_streamed_or_not():
    """OpenAI's usage.prompt_tokens_details.cached_tokens, from the ensemble's num_cached_tokens; the
    choices of one prompt count its tokens (and its cached ones) once."""
    envelope = Envelope("id", "chat.completion", "flint", 0)
    two = [outputs_of(200, 128, [1, 3]), outputs_of(200, 128, [2, 4])]
    expected = {"prompt_tokens": 200, "completion_tokens": 7, "total_tokens": 207,
                "prompt_tokens_details": {"cached_tokens": 128}}
    assert chat.completion(envelope, two, "auto")["usage"] == expected
    merged = [(j, o) for pair in zip(*two) for j, o in enumerate(pair)]
    assert streamed_usage(chat.chunks(envelope, merged[0], rest_of(merged[1:]), 2, True, "auto")) == expected
    prompts = [outputs_of(200, 128, [4]), outputs_of(200, 128, [3]), outputs_of(50, 0, [2]), outputs_of(50, 0, [1])]
    expected = {"prompt_tokens": 250, "completion_tokens": 10, "total_tokens": 260,
                "prompt_tokens_details": {"cached_tokens": 128}}
    assert completions.completion(envelope, prompts, n=2)["usage"] == expected
    merged = [(i, parts[0]) for i, parts in enumerate(prompts)]
    assert streamed_usage(completions.chunks(envelope, merged[0], rest_of(merged[1:]), True, n=2)) == expected
