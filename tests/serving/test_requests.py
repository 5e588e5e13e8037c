"""The tokenizer step and the postprocessor without a server."""

import dataclasses
import json
import random

import numpy as np
import pytest

from flint_backend.chat.chat_options import ANNOUNCED_OPTIONS, ChatOptions
from flint_backend.chat.request_error import ChatRequestError
from flint_backend.engine.sampling_params import SamplingParamsError
from flint_backend.serving.chunks import EngineChunk, OutputConfig, text_arrays
from flint_backend.serving.generate_request import parse_generate_request, sampling_json
from flint_backend.serving.postprocess import Postprocessor, RequestText
from flint_backend.serving.preprocess import Preprocessor
from flint_backend.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def tensors(batch: bool = True, **values):
    """Inputs as Triton hands them over: [1, 1] (or [1] without the batch dimension)."""
    out = {}
    for name, value in values.items():
        items = value if isinstance(value, list) else [value]
        array = np.array([v.encode() if isinstance(v, str) else v for v in items],
                         dtype=np.object_ if isinstance(items[0], str) else None)
        out[name] = array[None] if batch else array
    return out


@pytest.mark.parametrize("batch", [True, False])
def test_tensors_and_sampling_parameters_merge_tensor_winning(batch):
    request = parse_generate_request(tensors(
        batch, text_input="hi", max_tokens=np.int32(7), temperature=np.float32(0.5), stream=True,
        stop_words=["a", "b"], min_length=np.int32(2), seed=np.uint64(9),
        sampling_parameters=json.dumps({"temperature": "0.1", "top_k": "5", "stop": "c", "ignore_eos": "true",
                                        "cache_salt": "tenant-a"})))
    s = request.sampling
    assert (s["max_tokens"], s["temperature"], s["top_k"], s["min_tokens"], s["seed"], s["ignore_eos"]) == (
        7, 0.5, 5, 2, 9, True)
    assert json.loads(sampling_json(s))["cache_salt"] == "tenant-a"  # to the engine's SamplingParams
    assert request.stop == ["c", "a", "b"] and request.stream and request.exclude_input_in_output


@pytest.mark.parametrize("values, sampling", [
    ({}, {"default_max_tokens": 16}),  # the repository's default: the engine clamps it to the context
    ({"max_tokens": np.int32(9)}, {"default_max_tokens": 16, "max_tokens": 9}),  # given: checked against it
    ({"sampling_parameters": '{"max_tokens": 9}'}, {"max_tokens": 9}),
    ({"sampling_parameters": '{"max_tokens": null}'}, {}),  # vLLM's null: until the context is full
])
def test_max_tokens_given_null_or_left_to_the_default(values, sampling):
    request = parse_generate_request(tensors(text_input="hi", **values))
    assert json.loads(sampling_json(request.sampling)) == sampling


@pytest.mark.parametrize("values, field", [
    ({}, "text_input"),
    ({"text_input": "x", "messages": "[]"}, "not both"),
    ({"text_input": "x", "input_ids": np.array([1, 2], np.int32)}, "^text_input: expected either text_input or input_ids, not both"),
    ({"input_ids": np.array([1, -2], np.int32)}, "^input_ids: expected non-negative token ids"),
    ({"text_input": "x", "sampling_parameters": '{"guided_json": [1]}'}, "^sampling_parameters.guided_json: expected"),
    ({"text_input": "x", "sampling_parameters": '{"guided_json": "{no"}'}, "^sampling_parameters.guided_json: expected"),
    ({"input_ids": np.array([], np.int32)}, "^input_ids: expected at least one token id"),
    ({"text_input": "x", "tools": "[]"}, "tools"),
    ({"text_input": "x", "sampling_parameters": "[1]"}, "sampling_parameters"),
    ({"text_input": "x", "sampling_parameters": '{"top_k": "many"}'}, "sampling_parameters.top_k"),
    ({"text_input": "x", "sampling_parameters": '{"logit_bias": {"a": 1}}'}, "sampling_parameters.logit_bias"),
    ({"text_input": "x", "sampling_parameters": '{"n": 2}'}, "sampling_parameters.n"),
    ({"text_input": "x", "sampling_parameters": '{"cache_salt": ""}'},
     '^sampling_parameters.cache_salt: expected a non-empty string, got string ""'),
    ({"text_input": "x", "sampling_parameters": '{"cache_salt": 5}'},
     "^sampling_parameters.cache_salt: expected a non-empty string, got 5"),
    ({"text_input": "x", "stream": np.int32(1)}, "stream"),
    ({"text_input": ["x", "y"]}, "text_input"),
    ({"messages": '[{"role": "user", "content": "x"}]', "chat_options": '{"tool_call_parser": 1}'},
     "chat_options.tool_call_parser"),
])
def test_bad_inputs_name_the_field(values, field):
    with pytest.raises(ValueError, match=field):
        parse_generate_request(tensors(**values))


@pytest.mark.parametrize("values, field", [
    ({"sampling_parameters": '{"top_k": "many"}'}, "sampling_parameters.top_k"),
    ({"sampling_parameters": '{"n": 2}'}, "sampling_parameters.n"),
    ({"sampling_parameters": "{no"}, "sampling_parameters"),
])
def test_bad_sampling_values_are_sampling_errors_not_chat_errors(values, field):
    with pytest.raises(SamplingParamsError) as caught:
        parse_generate_request(tensors(text_input="x", **values))
    assert caught.value.field == field and not isinstance(caught.value, ChatRequestError)


def test_token_id_prompts_go_to_the_engine_as_given_and_echo_as_their_text(tokenizer):
    ids = tokenizer("naïve <think>prompt", add_special_tokens=False).input_ids
    pre = Preprocessor(tokenizer)
    out = pre({"input_ids": np.array([ids], np.int32), **tensors(exclude_input_in_output=False)})
    assert out.prompt_ids == ids and out.output_config.echo == "naïve <think>prompt"
    assert out.output_config.chat is None and out.output_config.prompt_tail == ids[-5:]
    assert pre({"input_ids": np.array([ids], np.int32)}).output_config.echo == ""


@pytest.mark.parametrize("schema", [{"type": "object"}, '{"type": "object"}'])
def test_guided_json_starts_after_the_reasoning_of_a_thinking_chat(tokenizer, schema):
    sampling = json.dumps({"guided_json": schema})
    messages = json.dumps([{"role": "user", "content": "hi"}])
    pre = Preprocessor(tokenizer, ANNOUNCED_OPTIONS)
    thinking = json.loads(pre(tensors(messages=messages, sampling_parameters=sampling)).sampling_json)
    assert thinking["guided_json"] == {"type": "object"}
    assert thinking["guided_start_token_id"] == tokenizer.convert_tokens_to_ids("</think>")
    off = pre(tensors(messages=messages, sampling_parameters=sampling,
                      chat_template_kwargs='{"enable_thinking": false}'))
    raw = pre(tensors(text_input="hi", sampling_parameters=sampling))
    for out in (off, raw):  # no reasoning first: the schema holds from the first token
        assert "guided_start_token_id" not in json.loads(out.sampling_json)


def test_chat_request_config_carries_the_parsers(tokenizer):
    pre = Preprocessor(tokenizer, ANNOUNCED_OPTIONS)
    out = pre(tensors(messages=json.dumps([{"role": "user", "content": "hi"}]),
                      chat_template_kwargs='{"enable_thinking": false}'))
    config = OutputConfig.from_json(out.output_config.to_json())
    assert config.chat["thinking"] is False and config.chat["tool_call_parser"] == "glm47"
    assert tokenizer.decode(out.prompt_ids).endswith("<|assistant|></think>")
    assert config.prompt_tail == out.prompt_ids[-5:] and json.loads(out.sampling_json)["default_max_tokens"] == 16


def test_chat_options_of_a_request_replace_the_repository_flags(tokenizer):
    pre = Preprocessor(tokenizer, ChatOptions())  # a repository configured without the chat flags
    tools = json.dumps([{"type": "function", "function": {"name": "f"}}])
    request = dict(messages=json.dumps([{"role": "user", "content": "hi"}]), tools=tools, tool_choice="none")
    with_tools = pre(tensors(**request))
    options = json.dumps(ANNOUNCED_OPTIONS.to_dict())  # --exclude-tools-when-tool-choice-none
    without_tools = pre(tensors(**request, chat_options=options))
    assert len(without_tools.prompt_ids) < len(with_tools.prompt_ids)
    with pytest.raises(ValueError, match="^tool_choice: .*--enable-auto-tool-choice"):
        pre(tensors(**{**request, "tool_choice": "auto"}))
    auto = pre(tensors(**{**request, "tool_choice": "auto"}, chat_options=options))
    assert auto.output_config.chat["tool_call_parser"] == "glm47" and auto.output_config.chat["tools"]


def fake_logprobs(ids: list[int]) -> list:
    """Engine logprobs for ids (exact binary fractions): the token's, and a top 2 of it and token 1."""
    return [[-(t % 7) / 8, [[t, -(t % 7) / 8], [1, -5.0]]] for t in ids]


def chunks_for(tokenizer, text: str, config: OutputConfig, key: str = "k", reason: str = "length",
               logprobs: bool = False):
    ids = tokenizer(text, add_special_tokens=False).input_ids
    rng = random.Random(0)
    out, i, index = [], 0, 0
    while i < len(ids):
        n = rng.randint(1, 3)
        out.append(EngineChunk(key, index, ids[i:i + n], False, "", 3, i + n,
                               config=config.to_json() if index == 0 else "",
                               logprobs=fake_logprobs(ids[i:i + n]) if logprobs else []))
        i, index = i + n, index + 1
    out.append(EngineChunk(key, index, [], True, reason, 3, len(ids)))
    return out


@pytest.mark.parametrize("stream", [True, False])
def test_chunks_in_any_order_give_the_text_in_order(tokenizer, stream):
    text = "naïve café: 東京 says hello, world"
    chunks = chunks_for(tokenizer, text, OutputConfig(stream=stream, echo="P:"))
    post = Postprocessor(tokenizer)
    order = list(chunks)
    random.Random(1).shuffle(order)
    outputs = [o for c in order for o in post.process(c).outputs]
    assert "".join(o.text for o in outputs) == "P:" + text
    assert outputs[-1].final and outputs[-1].finish_reason == "length" and post.num_open == 0
    assert len(outputs) == 1 if not stream else len(outputs) >= 1


@pytest.mark.parametrize("stream", [True, False])
def test_logprob_entries_follow_their_tokens_in_order(tokenizer, stream):
    text = "naïve café: 東京 says hello"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    chunks = chunks_for(tokenizer, text, OutputConfig(stream=stream), logprobs=True)
    post = Postprocessor(tokenizer)
    order = list(chunks)
    random.Random(2).shuffle(order)
    outputs = [o for c in order for o in post.process(c).outputs]
    entries = [e for o in outputs for e in o.logprobs]
    assert [e["token_id"] for e in entries] == ids and [e["logprob"] for e in entries] == [-(t % 7) / 8 for t in ids]
    assert bytes(b for e in entries for b in e["bytes"]).decode("utf-8") == text
    assert [[t["token_id"] for t in e["top_logprobs"]] for e in entries] == [[t, 1] for t in ids]
    assert all(e["top_logprobs"][1]["logprob"] == -5.0 for e in entries)
    if stream:  # each streamed delta carries its own tokens' entries: none is empty
        assert all(o.logprobs for o in outputs[:-1])


def test_logprobs_stop_with_the_counted_tokens_and_are_absent_unless_asked(tokenizer):
    config = OutputConfig(stream=True, stop=["world"])
    text = "hello big world and more text after it"
    post = Postprocessor(tokenizer)
    outputs = [d for c in chunks_for(tokenizer, text, config, reason="abort", logprobs=True)
               for d in post.process(c).outputs]
    entries = [e for d in outputs for e in d.logprobs]
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert len(entries) == outputs[-1].num_output_tokens < len(ids)
    assert [e["token_id"] for e in entries] == ids[:len(entries)]
    plain = [d for c in chunks_for(tokenizer, text, OutputConfig(stream=True)) for d in post.process(c).outputs]
    assert all(d.logprobs == [] for d in plain) and "".join(d.text for d in plain) == text


@pytest.mark.parametrize("stream", [True, False])
def test_every_delta_carries_the_prompt_tokens_the_prefix_cache_held(tokenizer, stream):
    text = "a prompt whose prefix was cached"
    chunks = [dataclasses.replace(c, num_cached_tokens=2)
              for c in chunks_for(tokenizer, text, OutputConfig(stream=stream))]
    post = Postprocessor(tokenizer)
    outputs = [d for c in chunks for d in post.process(c).outputs]
    assert "".join(d.text for d in outputs) == text and outputs[-1].final
    assert all((d.num_input_tokens, d.num_cached_tokens) == (3, 2) for d in outputs)
    cached = text_arrays(outputs[-1])["num_cached_tokens"]  # flint's output tensor
    assert cached.dtype == np.uint32 and cached.tolist() == [[2]]


def test_stop_string_cuts_the_text_and_asks_for_one_abort(tokenizer):
    config = OutputConfig(stream=True, stop=["world"])
    chunks = chunks_for(tokenizer, "hello big world and more text after it", config, reason="abort")
    post = Postprocessor(tokenizer)
    outcomes = [post.process(c) for c in chunks]
    assert sum(o.abort_engine for o in outcomes) == 1
    outputs = [d for o in outcomes for d in o.outputs]
    assert "".join(d.text for d in outputs) == "hello big "
    assert outputs[-1].finish_reason == "stop"


def test_chat_output_is_split_into_reasoning_and_tool_calls(tokenizer):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}}}}]
    config = OutputConfig(stream=False, chat={"thinking": True, "tools": tools, "tool_choice": "auto",
                                              "reasoning_parser": "glm47", "tool_call_parser": "glm47"})
    text = "think hard</think>Sure.<tool_call>f<arg_key>n</arg_key><arg_value>3</arg_value></tool_call>"
    post = Postprocessor(tokenizer)
    (out,) = [d for c in chunks_for(tokenizer, text, config, reason="stop") for d in post.process(c).outputs]
    assert (out.reasoning, out.text, out.finish_reason) == ("think hard", "Sure.", "tool_calls")
    assert [c["function"] for c in out.tool_calls] == [{"name": "f", "arguments": '{"n": 3}'}]


def test_cancel_drops_the_state_and_later_chunks(tokenizer):
    chunks = chunks_for(tokenizer, "some words to cancel", OutputConfig(stream=True))
    post = Postprocessor(tokenizer)
    post.process(chunks[0])
    assert post.cancel("k", finished=False) is True
    assert post.cancel("k", finished=False) is False  # aborted once
    assert post.process(chunks[1]).outputs == [] and post.num_open == 0
    assert post.cancel("k", finished=True) is False


def test_errors_are_reported_as_client_errors_when_refused(tokenizer):
    post = Postprocessor(tokenizer)
    (out,) = post.process(EngineChunk("k", 0, [], True, "rejected", 3, 0, "prompt: too long",
                                      OutputConfig().to_json())).outputs
    assert out.error == "prompt: too long" and out.client_error and out.final


def test_an_error_in_a_request_ends_it_alone_and_asks_for_one_engine_abort(tokenizer, monkeypatch):
    """Issue 44: a request whose text step raised kept running in the engine to max_tokens."""
    texts = {"a": "first request text here and more", "b": "second one, other words"}
    chunks = {k: chunks_for(tokenizer, t, OutputConfig(stream=True), key=k) for k, t in texts.items()}
    real_apply = RequestText.apply

    def apply(self, chunk):
        if chunk.key == "a" and chunk.index == 2:
            raise AttributeError("'int' object has no attribute 'items'")
        return real_apply(self, chunk)

    monkeypatch.setattr(RequestText, "apply", apply)
    post = Postprocessor(tokenizer)
    a, b = chunks["a"], chunks["b"]
    outcomes = post.process_all([a[0], b[0], a[1], a[2], b[1]])
    failed = outcomes[3]
    assert failed.abort_engine and [o.abort_engine for o in outcomes] == [False, False, False, True, False]
    (error,) = failed.outputs
    assert error.final and error.finish_reason == "error" and not error.client_error
    assert error.error == "postprocess: AttributeError: 'int' object has no attribute 'items'"
    later = [post.process(c) for c in a[3:]]  # the engine's chunks until its abort lands: dropped
    assert all(o.outputs == [] and not o.abort_engine for o in later)
    rest = "".join(d.text for c in b[2:] for d in post.process(c).outputs)
    assert outcomes[4].outputs[0].text + rest == texts["b"]  # the other request is untouched
    assert post.num_open == 0 and not post.cancel("a", finished=True)


def test_an_error_on_a_final_chunk_asks_for_no_abort(tokenizer, monkeypatch):
    monkeypatch.setattr(RequestText, "apply", lambda self, chunk: 1 / 0)
    post = Postprocessor(tokenizer)
    only = EngineChunk("k", 0, [5, 6], True, "stop", 3, 2, config=OutputConfig().to_json())
    outcome = post.process(only)  # the request's only chunk is its final one: the engine is done with it
    assert not outcome.abort_engine and outcome.outputs[0].error.startswith("postprocess: ZeroDivisionError")
    assert post.num_open == 0


def test_chunks_queued_together_answer_once_per_request(tokenizer):
    texts = {"a": "first request text here", "b": "second one, other words"}
    chunks = {k: chunks_for(tokenizer, t, OutputConfig(stream=True), key=k) for k, t in texts.items()}
    post = Postprocessor(tokenizer)
    a, b = chunks["a"], chunks["b"]
    batch = [a[0], b[0], a[1], a[2], b[1]]
    outcomes = post.process_all(batch)
    assert [len(o.outputs) for o in outcomes] == [0, 0, 0, 1, 1]
    got = {"a": outcomes[3].outputs[0].text, "b": outcomes[4].outputs[0].text}
    for outcome, chunk in zip(post.process_all(a[3:] + b[2:]), a[3:] + b[2:]):
        got[chunk.key] += "".join(d.text for d in outcome.outputs)
    assert got == texts and post.num_open == 0
