"""Fuzz: request bodies generated from the two interfaces' own schemas (the ensemble's inputs in
model_repository/flint/config.pbtxt; the OpenAI server's request models' JSON schemas), each
a valid request mutated 0-2 times: a field given a hostile value (wrong JSON types, huge and
negative numbers, lone surrogates, bytes that are not UTF-8), dropped, or a field nobody
declared added. Every answer is a success or a 4xx that
names what was wrong in a clean message; never a 5xx from our code (Triton's own JSON parser's
500s, documented in README.md, are the one exception: tritonserver answers them before any model
runs). Afterwards the engine is idle and both servers still serve the oracle's greedy text.

Examples are derandomised (the same cases every run); the long form runs more of them.
"""

import json
import re
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flint_backend.openai.protocol import ChatCompletionRequest, CompletionRequest
from flint_backend.serving.launch import PROJECT_ROOT
from server_state import TRITON_HTTP_PARSER_500, check_openai_serves_reference, check_serves_reference, unclean, \
    wait_idle
from servers import KEY, MAX_MODEL_LEN

pytest.importorskip("tritonclient.grpc")
pytestmark = pytest.mark.server

ENSEMBLE_CONFIG = PROJECT_ROOT / "model_repository" / "flint" / "config.pbtxt"
BROKEN_UTF8 = "\u0000BROKEN\u0000"  # replaced, in the encoded body, by bytes that are not UTF-8
REQUEST_TIMEOUT = 120.0


def fuzz_settings(form):
    return settings(max_examples=form.fuzz_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------- values
huge = st.sampled_from([2**31, 2**32 + 1, 2**63, 2**64, -(2**63), 10**30, -1, -(2**31) - 1, 1e308, -1e308, 1e-320])
hostile_text = st.one_of(st.sampled_from(["\ud800", "a\udfffb", BROKEN_UTF8, "", " " * 3000, "\x00", "{", "[]",
                                          "null", "<|user|>", "</think>", "<tool_call>"]),
                         st.text(max_size=40))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), huge,
                    st.floats(allow_nan=False, allow_infinity=False), hostile_text)
any_json = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                        max_leaves=12)
hostile = st.one_of(any_json, huge, hostile_text)
small_count = st.integers(1, 16)   # max_tokens and the like: cheap requests
unit = st.floats(0.0, 1.0)
prompt_text = st.text(min_size=1, max_size=120)
token_ids = st.lists(st.integers(0, 8000), min_size=1, max_size=24)
messages = st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": prompt_text}), min_size=1, max_size=2)
tools = st.just([{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
EXTRA_FIELDS = ["banana", "text-input", "MAX_TOKENS", "__proto__", "model_name", ""]


def mutated(valid: dict[str, st.SearchStrategy], required: list[tuple[str, ...]]) -> st.SearchStrategy:
    """A valid body (one field of each `required` group, some optional ones), then 0-2 mutations:
    a field given a hostile value, a field dropped, or a field nobody declared added."""
    @st.composite
    def body(draw):
        names = {draw(st.sampled_from(group)) for group in required}
        names |= set(draw(st.lists(st.sampled_from(sorted(valid)), unique=True, max_size=5)))
        result = {name: draw(valid[name]) for name in sorted(names)}
        for _ in range(draw(st.integers(0, 2))):
            how = draw(st.sampled_from(["hostile", "hostile", "drop", "extra"]))
            if how == "hostile":
                result[draw(st.sampled_from(sorted(valid)))] = draw(hostile)
            elif how == "drop" and result:
                result.pop(draw(st.sampled_from(sorted(result))))
            elif how == "extra":
                result[draw(st.sampled_from(EXTRA_FIELDS))] = draw(any_json)
        return result

    return body()


def encode(body) -> bytes:
    data = json.dumps(body).encode()
    return data.replace(json.dumps(BROKEN_UTF8)[1:-1].encode(), b"\xc3\x28\xff\xfe")


# ---------------------------------------------------------------- the ensemble's interface
def ensemble_inputs() -> list[tuple[str, str, bool]]:
    """(name, data_type, is_list) of each input the ensemble declares."""
    text = ENSEMBLE_CONFIG.read_text()
    block = text[text.index("input ["):text.index("output [")]
    found = re.findall(r'name: "(\w+)" data_type: (TYPE_\w+) dims: \[ (-?\d+) \]', block)
    assert len(found) >= 20, found
    return [(name, dtype, dims == "-1") for name, dtype, dims in found]


ENSEMBLE_VALID = {  # inputs whose valid values are more than their type's
    "input_ids": token_ids,
    "messages": messages.map(json.dumps),
    "tools": tools.map(json.dumps),
    "tool_choice": st.sampled_from(["auto", "none", "required", '"auto"']),
    "chat_template_kwargs": st.fixed_dictionaries({"enable_thinking": st.booleans()}).map(json.dumps),
    "chat_options": st.just("{}"),
    "sampling_parameters": st.fixed_dictionaries({}, optional={
        "logprobs": st.integers(0, 5), "prompt_logprobs": st.integers(0, 3), "seed": st.integers(0, 2**32),
        "guided_json": st.just({"type": "object"}), "stop_token_ids": st.lists(st.integers(0, 8000), max_size=2),
    }).map(json.dumps),
    "max_tokens": small_count, "min_tokens": st.integers(0, 2), "min_length": st.integers(0, 2),
    "top_k": st.integers(0, 50), "seed": st.integers(0, 2**64 - 1),
}
ENSEMBLE_BY_TYPE = {"TYPE_STRING": prompt_text, "TYPE_BOOL": st.booleans(), "TYPE_FP32": unit}


def ensemble_body() -> st.SearchStrategy:
    valid = {}
    for name, dtype, is_list in ensemble_inputs():
        value = ENSEMBLE_VALID.get(name, ENSEMBLE_BY_TYPE.get(dtype, small_count))
        valid[name] = st.lists(value, min_size=1, max_size=2) if is_list and name != "input_ids" else value
    return mutated(valid, [("text_input", "input_ids", "messages")])


# ---------------------------------------------------------------- the OpenAI server's interface
def schema_value(schema: dict) -> st.SearchStrategy:
    """A valid value of a property of a pydantic model's JSON schema (small numbers: cheap requests)."""
    if "anyOf" in schema:
        return st.one_of([schema_value(s) for s in schema["anyOf"] if s.get("type") != "null"])
    return {"integer": small_count, "number": unit, "boolean": st.booleans(), "string": prompt_text,
            "array": st.lists(prompt_text, max_size=2)}.get(schema.get("type"), st.just({}))


OPENAI_VALID = {  # fields whose valid values are more than their schema says
    "messages": messages, "prompt": st.one_of(prompt_text, token_ids), "model": st.just("flint"),
    "tools": tools, "tool_choice": st.sampled_from(["auto", "none", "required"]),
    "n": st.integers(1, 3), "top_logprobs": st.integers(0, 5), "logprobs": st.just(True),
    "stop_token_ids": st.lists(st.integers(0, 8000), max_size=2), "logit_bias": st.just({"17": -5.0}),
    "guided_json": st.just({"type": "object"}), "stream_options": st.just({"include_usage": True}),
    "chat_template_kwargs": st.fixed_dictionaries({"enable_thinking": st.booleans()}),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
}


def openai_body(model) -> st.SearchStrategy:
    properties = model.model_json_schema()["properties"]
    valid = {name: OPENAI_VALID.get(name, schema_value(schema)) for name, schema in properties.items()}
    for name in ("suffix", "best_of", "echo"):  # refused or costly when valid; still fuzzed as hostile values
        valid.pop(name, None)
    if model is CompletionRequest:
        valid["logprobs"] = st.integers(0, 5)
    return mutated(valid, [("prompt",) if model is CompletionRequest else ("messages",), ("max_tokens",)])


# ---------------------------------------------------------------- answers
def problem(status: int, message: str, text: str) -> str | None:
    """What is wrong with an answer: a 5xx of ours, or an unclean message."""
    if status >= 500 and not (status == 500 and TRITON_HTTP_PARSER_500.match(message)):
        return f"HTTP {status}"
    if unclean(message):
        return "an unclean error message"
    if status >= 400 and not message.strip():
        return "an error without a message"
    if status == 200 and any(unclean(error) for error in stream_errors(text)):
        return "an unclean error in a 200's stream"
    return None


def stream_errors(text: str) -> list[str]:
    """The error messages of a 200's event stream (the model's own text may say anything)."""
    errors = []
    for line in text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[len("data: "):])
            if "error" in event:
                errors.append(json.dumps(event["error"]))
    return errors


def triton_error(content: bytes) -> str:
    try:
        return str(json.loads(content).get("error", ""))
    except (ValueError, AttributeError):
        return f"not JSON: {content[:200]!r}"


def openai_error(content: bytes) -> str:
    try:
        return json.loads(content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"not OpenAI's error shape: {content[:200]!r}"


def run_fuzz(check, client: httpx.Client, label: str, statuses: Counter, failures: list[str], form) -> None:
    """Runs hypothesis' cases, then: no failure, and every case sent."""
    try:
        check()
    finally:
        client.close()
    print(f"fuzz {label}: {sum(statuses.values())} cases, HTTP statuses {dict(statuses)}")
    assert not failures, "\n".join(failures[:20]) + f"\n({len(failures)} failures)"
    assert sum(statuses.values()) >= form.fuzz_examples


def test_fuzz_triton_generate_interface(triton, form):
    failures, statuses = [], Counter()
    client = httpx.Client(timeout=REQUEST_TIMEOUT)

    @fuzz_settings(form)
    @given(body=ensemble_body(), streamed=st.booleans())
    def check(body, streamed):
        endpoint = "generate_stream" if streamed else "generate"
        url = f"http://{triton.http_url}/v2/models/flint/{endpoint}"
        response = client.post(url, content=encode(body))
        statuses[response.status_code] += 1
        message = triton_error(response.content) if response.status_code != 200 else ""
        events = response.text if streamed and response.status_code == 200 else ""
        found = problem(response.status_code, message, events)
        if found:
            failures.append(f"{endpoint} {encode(body)[:400]!r}: {found}: {response.status_code} {response.text[:300]!r}")

    run_fuzz(check, client, "generate/generate_stream", statuses, failures, form)
    wait_idle(triton)


@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest], ids=["chat", "completions"])
def test_fuzz_openai_request_body(triton, openai_server, form, model):
    failures, statuses = [], Counter()
    path = "chat/completions" if model is ChatCompletionRequest else "completions"
    client = httpx.Client(timeout=REQUEST_TIMEOUT, headers={"Authorization": f"Bearer {KEY}"})

    @fuzz_settings(form)
    @given(body=openai_body(model))
    def check(body):
        response = client.post(f"{openai_server.url}/v1/{path}", content=encode(body),
                               headers={"Content-Type": "application/json"})
        statuses[response.status_code] += 1
        message = openai_error(response.content) if response.status_code != 200 else ""
        found = problem(response.status_code, message, response.text if response.status_code == 200 else "")
        if response.status_code == 500:  # the OpenAI server never passes Triton's parser a JSON body
            found = found or "HTTP 500"
        if found:
            failures.append(f"{path} {encode(body)[:400]!r}: {found}: {response.status_code} {response.text[:300]!r}")

    run_fuzz(check, client, f"/v1/{path}", statuses, failures, form)
    wait_idle(triton)


def test_after_the_fuzz_the_servers_serve_the_reference(triton, openai_server, reference_texts):
    wait_idle(triton)
    check_serves_reference(triton, reference_texts)
    check_openai_serves_reference(openai_server.url, KEY, reference_texts)
