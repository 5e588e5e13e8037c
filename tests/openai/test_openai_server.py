"""The OpenAI server over a real tritonserver, driven with the official `openai` client (and lm-eval).

One tritonserver runs a "successor" checkpoint (tests/serving/successor_checkpoint.py): after the
prompt's last token `<think>` it greedily writes reasoning, `</think>`, a glm47 tool call and the
stop token `<|observation|>`. Its repository keeps the default chat flags (all off), so what the
clients see comes from each OpenAI server's own flags, sent with every request as chat_options.
"""

import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import httpx
import pytest

from flint_backend.chat.chat_options import ANNOUNCED_OPTIONS, ChatOptions
from flint_backend.chat.request import encode_text_input, render_chat_request
from flint_backend.tokenizer import load_tokenizer
from openai_server import OpenAIServer
from successor_checkpoint import successor_checkpoint
from triton_server import TritonServer, configured_repository, free_port

openai = pytest.importorskip("openai")
pytest.importorskip("tritonclient.grpc.aio")

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key"
REASONING = "Let me check."
CALL = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
ANNOUNCED_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "glm47", "--reasoning-parser", "glm47",
                   "--exclude-tools-when-tool-choice-none"]
NO_EXCLUDE = ChatOptions(enable_auto_tool_choice=True, tool_call_parser="glm47", reasoning_parser="glm47")


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return load_tokenizer(tiny_checkpoint)


@pytest.fixture(scope="module")
def chain(tokenizer):
    return tokenizer("<think>" + REASONING + "</think>" + CALL + "<|observation|>", add_special_tokens=False).input_ids


@pytest.fixture(scope="module")
def successor(tiny_checkpoint, chain, tmp_path_factory):
    return successor_checkpoint(tiny_checkpoint, tmp_path_factory.mktemp("successor") / "model", chain)


@pytest.fixture(scope="module")
def triton(successor, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openai_triton")
    repo = configured_repository(tmp, "--model", str(successor), "--device", "cpu", "--dtype", "float32",
                                 "--cpu-threads", "1", "--max-model-len", "512", "--max-num-seqs", "8")
    with TritonServer(repo, tmp / "tritonserver.log") as server:
        yield server


def start(triton, tmp_path_factory, *flags, triton_url=None):
    log = tmp_path_factory.mktemp("openai_server") / "server.log"
    return OpenAIServer(triton_url or triton.grpc_url, list(flags), log,
                        metrics_url=f"http://127.0.0.1:{triton.metrics_port}/metrics")


@pytest.fixture(scope="module")
def server(triton, tmp_path_factory):
    """The announcement's flags, an API key, two model names."""
    with start(triton, tmp_path_factory, *ANNOUNCED_FLAGS, "--api-key", KEY,
               "--served-model-name", "flint", "flint-tiny") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def client_of(server, key=KEY):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def prompt_tokens(tokenizer, options, **request):
    return len(render_chat_request(tokenizer, MESSAGES, options=options, **request).prompt_ids)


def streamed(stream):
    """A chat stream reassembled: (reasoning, content, calls {index: [name, arguments, id]}, finish, usage, chunks)."""
    reasoning, content, calls, finish, usage, chunks = "", "", {}, None, None, []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", "", None])
                entry[0] += (call.function.name or "") if call.function else ""
                entry[1] += (call.function.arguments or "") if call.function else ""
                entry[2] = entry[2] or call.id
            finish = choice.finish_reason or finish
    return reasoning, content, calls, finish, usage, chunks


# --- chat ----------------------------------------------------------------------------------


def test_chat_returns_reasoning_and_a_parsed_tool_call_with_the_tokenizers_counts(client, tokenizer, chain):
    response = client.chat.completions.create(model="flint", messages=MESSAGES, tools=TOOLS, temperature=0,
                                              max_tokens=64)
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == REASONING == choice.message.reasoning
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert response.usage.prompt_tokens == prompt_tokens(tokenizer, ANNOUNCED_OPTIONS, tools=TOOLS)
    assert response.usage.completion_tokens == len(chain) - 1  # everything after <think>, the stop token too
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_streamed_chat_equals_the_non_streamed_one(client):
    kwargs = dict(model="flint-tiny", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=64)
    whole = client.chat.completions.create(**kwargs)
    reasoning, content, calls, finish, usage, chunks = streamed(client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.model == "flint-tiny" for c in chunks)
    assert len({c.id for c in chunks}) == 1 and chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
    assert reasoning == whole.choices[0].message.reasoning_content and content == ""
    assert finish == whole.choices[0].finish_reason == "tool_calls"
    ((name, arguments, call_id),) = calls.values()
    expected = whole.choices[0].message.tool_calls[0]
    assert (name, arguments) == (expected.function.name, expected.function.arguments) and call_id.startswith("call_")
    # the same counts; the cached tokens may differ (the first request may have cached the prompt for the second)
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(usage, c) for c in counts] == [getattr(whole.usage, c) for c in counts]
    assert usage.prompt_tokens_details is not None and whole.usage.prompt_tokens_details is not None


def test_streamed_content_equals_the_non_streamed_content_without_thinking(client):
    kwargs = dict(model="flint", messages=MESSAGES, temperature=0, max_tokens=64,
                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    whole = client.chat.completions.create(**kwargs)
    reasoning, content, calls, finish, _, _ = streamed(client.chat.completions.create(**kwargs, stream=True))
    assert whole.choices[0].message.content == content == CALL  # no tools: the call's text is content
    assert reasoning == "" and whole.choices[0].message.reasoning_content is None and not calls
    assert finish == whole.choices[0].finish_reason == "stop"


def test_chat_logprobs_have_one_entry_a_generated_token_streamed_or_not(client, tokenizer, chain):
    kwargs = dict(model="flint", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=64, logprobs=True,
                  top_logprobs=2)
    whole = client.chat.completions.create(**kwargs)
    content = whole.choices[0].logprobs.content
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in chain[1:]]
    assert [e.token for e in content] == tokens  # reasoning, </think>, the call and the stop token
    assert len(content) == whole.usage.completion_tokens
    for e in content:
        assert e.logprob == pytest.approx(0.0, abs=1e-6)  # the successor model is sure of each token
        assert bytes(e.bytes).decode("utf-8") == e.token and len(e.top_logprobs) == 2
        assert (e.top_logprobs[0].token, e.top_logprobs[0].logprob) == (e.token, e.logprob)
        assert e.top_logprobs[1].logprob < -100  # any other token: LOGIT times sqrt(hidden) below
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [e for c in chunks for choice in c.choices if choice.logprobs for e in choice.logprobs.content]
    assert [(e.token, e.logprob, e.bytes) for e in streamed] == [(e.token, e.logprob, e.bytes) for e in content]
    assert chunks[0].choices[0].logprobs is None  # the role chunk
    plain = client.chat.completions.create(model="flint", messages=MESSAGES, temperature=0, max_tokens=4)
    assert plain.choices[0].logprobs is None


def test_response_format_holds_the_content_to_the_schema_after_the_reasoning(client):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    kwargs = dict(model="flint", messages=MESSAGES, temperature=0, max_tokens=64,
                  response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    whole = client.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    assert choice.message.reasoning_content == REASONING  # the reasoning is free, then the schema holds
    assert set(json.loads(choice.message.content)) == {"answer"} and choice.finish_reason == "stop"
    _, content, _, finish, _, _ = streamed(client.chat.completions.create(**kwargs, stream=True))
    assert content == choice.message.content and finish == "stop"
    no_thinking = client.chat.completions.create(
        model="flint", messages=MESSAGES, temperature=0, max_tokens=64, response_format={"type": "json_object"},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    # without the format the content is CALL, "<tool_call>..."; an object's first key is any string, in
    # which this model writes its chain on (so it may not end within 64 tokens)
    assert no_thinking.choices[0].message.content.startswith('{"')
    text = client.completions.create(model="flint", prompt="Hello world", temperature=1.0, seed=3, max_tokens=64,
                                     extra_body={"guided_json": schema})
    assert set(json.loads(text.choices[0].text)) == {"answer"}


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt_with_the_exclude_flag(client, tokenizer):
    response = client.chat.completions.create(model="flint", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                              temperature=0, max_tokens=64)
    without_tools = prompt_tokens(tokenizer, ANNOUNCED_OPTIONS)
    assert response.usage.prompt_tokens == without_tools
    assert without_tools < prompt_tokens(tokenizer, ANNOUNCED_OPTIONS, tools=TOOLS)
    message = response.choices[0].message
    assert not message.tool_calls and message.content == CALL and response.choices[0].finish_reason == "stop"


@pytest.fixture(scope="module")
def server_without_exclude(triton, tmp_path_factory):
    with start(triton, tmp_path_factory, "--enable-auto-tool-choice", "--tool-call-parser", "glm47",
               "--reasoning-parser", "glm47") as s:
        yield s


def test_tool_choice_none_keeps_the_tools_in_the_prompt_without_the_exclude_flag(server_without_exclude, tokenizer):
    response = client_of(server_without_exclude).chat.completions.create(
        model="flint", messages=MESSAGES, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=64)
    assert response.usage.prompt_tokens == prompt_tokens(tokenizer, NO_EXCLUDE, tools=TOOLS, tool_choice="none")
    assert response.usage.prompt_tokens == prompt_tokens(tokenizer, NO_EXCLUDE, tools=TOOLS)
    assert not response.choices[0].message.tool_calls and response.choices[0].message.content == CALL


def test_auto_tool_choice_needs_the_flag(triton, tmp_path_factory):
    with start(triton, tmp_path_factory, "--tool-call-parser", "glm47", "--reasoning-parser", "glm47") as s:
        client = client_of(s)
        for tool_choice in ("auto", openai.NOT_GIVEN):  # not given, with tools, means auto
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model="flint", messages=MESSAGES, tools=TOOLS,
                                               tool_choice=tool_choice, max_tokens=8)
            error = caught.value.body
            assert caught.value.status_code == 400 and error["param"] == "tool_choice"
            assert "--enable-auto-tool-choice" in error["message"]
        required = client.chat.completions.create(model="flint", messages=MESSAGES, tools=TOOLS,
                                                  tool_choice="required", temperature=0, max_tokens=64)
        assert required.choices[0].message.tool_calls[0].function.name == "get_weather"


# --- completions, models, health, metrics --------------------------------------------------


def test_completions_stream_and_non_stream_agree(client, tokenizer):
    kwargs = dict(model="flint", prompt="Hello world", temperature=0, max_tokens=6, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == len(encode_text_input(tokenizer, "Hello world"))
    assert whole.usage.completion_tokens == 6
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage == whole.usage and chunks[-2].choices[0].finish_reason == "length"
    echoed = client.completions.create(**kwargs, echo=True)
    assert echoed.choices[0].text == "Hello world" + whole.choices[0].text
    both = client.completions.create(**{**kwargs, "prompt": ["Hello world", "Hello world"]})
    assert [c.text for c in both.choices] == [whole.choices[0].text] * 2 and both.usage.completion_tokens == 12
    ids = encode_text_input(tokenizer, "Hello world")
    as_ids = client.completions.create(**{**kwargs, "prompt": ids}, echo=True)
    assert as_ids.choices[0].text == echoed.choices[0].text and as_ids.usage == whole.usage
    lists = client.completions.create(**{**kwargs, "prompt": [ids, ids[:-1]]})
    assert lists.choices[0].text == whole.choices[0].text and len(lists.choices) == 2
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**{**kwargs, "prompt": [1, 10**6]})
    assert caught.value.body["param"] == "prompt" and "outside the vocabulary" in caught.value.body["message"]


def test_completions_logprobs_with_text_offsets_streamed_or_not(client, tokenizer, chain):
    kwargs = dict(model="flint", prompt="Think first.<think>", temperature=0, max_tokens=64, logprobs=2)
    whole = client.completions.create(**kwargs)  # the successor chain follows the prompt's <think>
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in chain[1:]]
    choice = whole.choices[0]
    assert choice.text == "".join(tokens[:-1]) and choice.finish_reason == "stop"  # the stop token is not text
    logprobs = choice.logprobs
    assert logprobs.tokens == tokens and len(tokens) == whole.usage.completion_tokens
    assert logprobs.text_offset == [len("".join(tokens[:i])) for i in range(len(tokens))]
    assert logprobs.token_logprobs == pytest.approx([0.0] * len(tokens), abs=1e-6)
    assert [next(iter(top)) for top in logprobs.top_logprobs] == tokens
    assert all(len(top) == 2 and min(top.values()) < -100 for top in logprobs.top_logprobs)
    chunks = list(client.completions.create(**kwargs, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == tokens
    assert [o for p in parts for o in p.text_offset] == logprobs.text_offset
    assert [lp for p in parts for lp in p.token_logprobs] == logprobs.token_logprobs
    echoed = client.completions.create(**{**kwargs, "max_tokens": 1}, echo=True)  # as lm-eval scores a prompt
    prompt_tokens = [tokenizer.decode([t], skip_special_tokens=False)
                     for t in encode_text_input(tokenizer, kwargs["prompt"])]
    logprobs = echoed.choices[0].logprobs
    assert echoed.choices[0].text == kwargs["prompt"] + tokens[0] and logprobs.tokens == prompt_tokens + tokens[:1]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None  # nothing precedes it
    assert all(lp < 0 and len(top) == 2 for lp, top in zip(logprobs.token_logprobs[1:-1], logprobs.top_logprobs[1:]))
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]


def test_completions_n_choices_sample_with_seed_plus_j(client, tokenizer):
    kwargs = dict(model="flint", prompt="Hello world", temperature=1.0, max_tokens=6, extra_body={"ignore_eos": True})
    singles = [client.completions.create(**kwargs, seed=7 + j).choices[0].text for j in range(3)]
    assert len(set(singles)) > 1  # the seeds draw different samples
    whole = client.completions.create(**kwargs, seed=7, n=3)
    assert [c.index for c in whole.choices] == [0, 1, 2] and [c.text for c in whole.choices] == singles
    prompt_tokens = len(encode_text_input(tokenizer, "Hello world"))
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (prompt_tokens, 18)  # the prompt once
    chunks = list(client.completions.create(**kwargs, seed=7, n=3, stream=True,
                                            stream_options={"include_usage": True}))
    texts = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == j) for j in range(3)]
    assert texts == singles and chunks[-1].usage == whole.usage
    both = client.completions.create(**{**kwargs, "prompt": ["Hello world", "Once upon"]}, seed=7, n=2)
    assert [c.text for c in both.choices[:2]] == singles[:2] and len(both.choices) == 4
    assert both.usage.prompt_tokens == prompt_tokens + len(encode_text_input(tokenizer, "Once upon"))


def test_the_second_turn_of_a_conversation_reports_cached_prompt_tokens(client, triton):
    """Issue 45 through the OpenAI server: turn 2 (turn 1's prompt, its tool call and the tool's
    result) reports usage.prompt_tokens_details.cached_tokens, streamed or not; another cache_salt
    finds nothing cached; the engine's hit counter moves."""
    hits = triton.metric("flint:prefix_cache_hits_total")
    kwargs = dict(model="flint", tools=TOOLS, temperature=0, max_tokens=64)
    turn1 = client.chat.completions.create(messages=MESSAGES, **kwargs)
    call = turn1.choices[0].message.tool_calls[0]
    assert turn1.usage.prompt_tokens_details.cached_tokens >= 0  # earlier tests may have cached the tools' part
    second = MESSAGES + [
        {"role": "assistant", "content": None, "reasoning_content": turn1.choices[0].message.reasoning_content,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    salted = client.chat.completions.create(messages=second, **kwargs, extra_body={"cache_salt": uuid.uuid4().hex})
    assert salted.usage.prompt_tokens > turn1.usage.prompt_tokens
    assert salted.usage.prompt_tokens_details.cached_tokens == 0  # a salt no request used before
    turn2 = client.chat.completions.create(messages=second, **kwargs)
    *_, usage, _ = streamed(client.chat.completions.create(messages=second, **kwargs, stream=True,
                                                           stream_options={"include_usage": True}))
    assert turn2.usage.prompt_tokens == usage.prompt_tokens == salted.usage.prompt_tokens
    # the rest needs the engine's prefix cache (issue 45)
    for cached in (turn2.usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens_details.cached_tokens):
        assert 0 < cached < turn2.usage.prompt_tokens
    deadline = time.monotonic() + 5  # the engine's metrics are published every 0.5 s
    while triton.metric("flint:prefix_cache_hits_total") < hits + turn2.usage.prompt_tokens_details.cached_tokens:
        assert time.monotonic() < deadline, (hits, triton.metric("flint:prefix_cache_hits_total"))
        time.sleep(0.2)


def test_chat_n_choices_each_stream_their_own_deltas(client):
    kwargs = dict(model="flint", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=64)
    one = client.chat.completions.create(**kwargs)
    two = client.chat.completions.create(**kwargs, n=2)
    assert [c.index for c in two.choices] == [0, 1]
    for choice in two.choices:  # greedy: both as the single one
        assert choice.message.reasoning_content == REASONING and choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls[0].function.arguments == one.choices[0].message.tool_calls[0].function.arguments
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens
    assert two.usage.prompt_tokens == one.usage.prompt_tokens
    chunks = list(client.chat.completions.create(**kwargs, n=2, stream=True))
    for j in range(2):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == j]
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == "tool_calls"
        assert "".join(getattr(c.delta, "reasoning_content", None) or "" for c in mine) == REASONING
        assert [c.finish_reason for c in mine[:-1]] == [None] * (len(mine) - 1)


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list()] == ["flint", "flint-tiny"]
    assert client.models.retrieve("flint-tiny").id == "flint-tiny"
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    text = httpx.get(server.url + "/metrics").text
    assert "flint:kv_cache_usage_perc" in text  # Triton's, passed through
    assert re.search(r'flint_openai:requests_total\{endpoint="/v1/chat/completions",status="200"\} [1-9]', text)
    assert re.search(r"^flint_openai:requests_running 0$", text, re.M)  # idle: the scrape does not count itself


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_choice_required_returns_a_call_to_a_listed_tool(client, stream):
    """The successor model wants get_weather, which is not listed: "required" holds it to get_time."""
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}]
    kwargs = dict(model="flint", messages=MESSAGES, tools=tools, tool_choice="required", temperature=0, max_tokens=128)
    if stream:
        reasoning, content, calls, finish, _, _ = streamed(client.chat.completions.create(**kwargs, stream=True))
        names_args = [(name, arguments) for name, arguments, _ in calls.values()]
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        finish = choice.finish_reason
        names_args = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert finish == "tool_calls" and [name for name, _ in names_args] == ["get_time"], names_args
    assert json.loads(names_args[0][1])["zone"] in ("UTC", "CET")


# --- errors --------------------------------------------------------------------------------


def test_wrong_or_missing_api_key_is_401(server):
    with pytest.raises(openai.AuthenticationError) as caught:
        client_of(server, "wrong").models.list()
    assert caught.value.status_code == 401 and caught.value.body["code"] == "invalid_api_key"
    response = httpx.post(server.url + "/v1/chat/completions", json={"model": "flint", "messages": MESSAGES})
    assert response.status_code == 401 and set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert caught.value.body["code"] == "model_not_found" and caught.value.body["param"] == "model"


@pytest.mark.parametrize("kwargs, param", [
    ({"n": 0}, "n"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}}, "guided_json"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"extra_body": {"temperature": "hot"}}, "temperature"),
    ({"extra_body": {"cache_salt": ""}}, "cache_salt"),
    ({"extra_body": {"cache_salt": 5}}, "cache_salt"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "hello " * 600}]}, "messages"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "banana", "properties": 5}}}]},
     "tools[0].function.parameters.type"),
])
def test_bad_requests_are_400_naming_the_field(client, kwargs, param):
    kwargs = {"model": "flint", "messages": MESSAGES, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**kwargs)
    assert caught.value.body["param"] == param, caught.value.body
    assert caught.value.body["message"].startswith(param + ":")


def test_a_tool_schema_the_parser_cannot_use_is_a_400_before_anything_runs(client, triton):
    """Issue 44: it was a 500 from the postprocessor while the engine generated to max_tokens."""
    prompts = triton.metric("flint:prompt_tokens_total")
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="flint", messages=MESSAGES, tools=bad, max_tokens=400,
                                           stream=stream, extra_body={"ignore_eos": True})
        assert caught.value.body["param"] == "tools[0].function.parameters.properties"
        assert caught.value.body["message"] == ("tools[0].function.parameters.properties: expected an object of "
                                                "property schemas, got 5")
    time.sleep(1.0)  # the engine's metrics are published every 0.5 s
    assert triton.metric("flint:prompt_tokens_total") == prompts and triton.metric("flint:num_requests_running") == 0


def test_max_tokens_over_the_context_is_400_and_none_runs_to_the_context(client, tokenizer):
    """As vLLM and OpenAI answer (issue 44: it was clamped); without one, chat runs to the context."""
    n = prompt_tokens(tokenizer, ANNOUNCED_OPTIONS)
    room = 512 - n
    for stream, field in ((False, "max_tokens"), (True, "max_completion_tokens")):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="flint", messages=MESSAGES, stream=stream, **{field: room + 1})
        assert caught.value.body["param"] == field and caught.value.body["code"] == "context_length_exceeded"
        assert caught.value.body["message"] == (f"{field}: got {room + 1}, expected at most {room} (the prompt's {n} "
                                                f"tokens plus max_tokens must fit the context of 512 tokens)")
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="flint", prompt="Hello", max_tokens=10**9)
    assert caught.value.body["param"] == "max_tokens" and caught.value.body["code"] == "context_length_exceeded"
    response = client.chat.completions.create(model="flint", messages=MESSAGES, temperature=0,
                                              extra_body={"ignore_eos": True})
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == room


def test_prompt_over_the_context_is_400_in_a_stream_too(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="flint", messages=[{"role": "user", "content": "hello " * 600}],
                                       stream=True)
    assert caught.value.body["code"] == "context_length_exceeded"


def test_triton_unavailable_is_503(triton, tmp_path_factory):
    with start(triton, tmp_path_factory, triton_url=f"127.0.0.1:{free_port()}") as s:
        with pytest.raises(openai.InternalServerError) as caught:
            client_of(s).chat.completions.create(model="flint", messages=MESSAGES, max_tokens=4)
        assert caught.value.status_code == 503 and caught.value.body["code"] == "triton_unavailable"
        health = httpx.get(s.url + "/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "triton_unavailable"


# --- cancellation --------------------------------------------------------------------------


def wait_for_engine_idle(triton, aborts_before: float, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (triton.metric("flint:kv_cache_usage_perc") > 0 or triton.metric("flint:num_requests_running") > 0
           or triton.metric("flint:request_success_total", finished_reason="abort") <= aborts_before):
        assert time.monotonic() < deadline, [line for line in triton.metrics().splitlines()
                                             if line.startswith(("flint:kv", "flint:num_req", "flint:request_succ"))]
        time.sleep(0.2)


def wait_for_kv_in_use(triton, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while triton.metric("flint:kv_cache_usage_perc") == 0:  # published every 0.5 s
        assert time.monotonic() < deadline, "KV usage never rose"
        time.sleep(0.05)


# These tests wait for events (tokens streamed, KV in use, aborts counted), never for a time a
# request is assumed to still be running: a faster CPU must not finish the request first.
LONG = {"model": "flint", "messages": MESSAGES, "max_tokens": 400, "ignore_eos": True, "temperature": 0}


def test_a_client_that_leaves_a_stream_cancels_the_engine_request(server, triton):
    aborts = triton.metric("flint:request_success_total", finished_reason="abort")
    tokens = triton.metric("flint:generation_tokens_total")
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**LONG, "stream": True},
                      headers=headers, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(4):  # tokens arrive: the engine runs the request; leave at once
            next(lines)
    wait_for_engine_idle(triton, aborts)
    assert 0 < triton.metric("flint:generation_tokens_total") - tokens < 400


def test_a_client_that_leaves_a_non_streamed_request_cancels_it(server, triton):
    """The client leaves once the engine shows the request's KV in use. Its n = 64 choices run
    8 at a time (max_num_seqs), hundreds of engine steps in all: far more than the metrics'
    0.5 s and the server's 0.25 s disconnect poll, however fast the CPU."""
    aborts = triton.metric("flint:request_success_total", finished_reason="abort")
    tokens = triton.metric("flint:generation_tokens_total")
    url = urllib.parse.urlsplit(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps({**LONG, "n": 64}),
                           {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        wait_for_kv_in_use(triton)
    finally:
        connection.close()  # unread: the client leaves
    wait_for_engine_idle(triton, aborts)
    assert triton.metric("flint:generation_tokens_total") - tokens < 64 * 400


# --- lm-eval -------------------------------------------------------------------------------


def test_lm_eval_local_chat_completions_runs_a_task(server, tmp_path):
    pytest.importorskip("lm_eval")
    env = dict(os.environ, OPENAI_API_KEY=KEY, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp_path / "datasets"), TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "lm_eval", "--model", "local-chat-completions", "--model_args",
               f"model=flint,base_url={server.url}/v1/chat/completions,num_concurrent=1,max_retries=1,"
               "tokenized_requests=False", "--apply_chat_template", "--include_path", "tests/openai/lm_eval_task",
               "--tasks", "flint_echo", "--limit", "2", "--output_path", str(tmp_path / "out")]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (results,) = (tmp_path / "out").rglob("results_*.json")
    data = json.loads(results.read_text())
    assert data["results"]["flint_echo"]["exact_match,none"] == 0.0  # the successor model answers with its chain
    assert data["n-samples"]["flint_echo"]["effective"] == 2


@pytest.mark.parametrize("tokenized", [True, False], ids=["token-ids", "text"])
def test_lm_eval_local_completions_scores_choices_by_the_references_loglikelihoods(server, successor, tokenizer,
                                                                                 tokenized, tmp_path):
    """A multiple-choice task through /v1/completions with echo and logprobs, prompts sent as token
    ids (lm-eval's default) or text: lm-eval's loglikelihood of every choice equals the fp64
    reference's on the served checkpoint."""
    pytest.importorskip("lm_eval")
    from reference_texts import reference_logprobs

    env = dict(os.environ, OPENAI_API_KEY=KEY, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp_path / "datasets"), TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
               f"model=flint,base_url={server.url}/v1/completions,num_concurrent=1,max_retries=1,"
               f"tokenized_requests={tokenized},tokenizer_backend=huggingface,tokenizer={successor}",
               "--include_path", "tests/openai/lm_eval_task", "--tasks", "flint_choice", "--log_samples",
               "--output_path", str(tmp_path / "out")]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (samples,) = (tmp_path / "out").rglob("samples_flint_choice_*.jsonl")
    docs = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(docs) == 2
    for sample in docs:
        doc = sample["doc"]
        context = f"Question: {doc['question']}\nAnswer:"
        for choice, ((loglikelihood, _),) in zip(doc["choices"], sample["resps"]):
            context_ids = tokenizer(context, add_special_tokens=False).input_ids
            ids = tokenizer(context + " " + choice, add_special_tokens=False).input_ids
            reference = reference_logprobs(successor, ids)  # [len(ids) - 1, vocab]
            expected = sum(float(reference[p - 1, ids[p]]) for p in range(len(context_ids), len(ids)))
            assert len(ids) > len(context_ids) and float(loglikelihood) == pytest.approx(expected, abs=1e-3), \
                (doc["question"], choice)
