"""A chat request whose output holds reasoning and a tool call, through a real tritonserver.

The tiny random model never writes a call by itself, and a static logit_bias cannot force a
sequence; so this server runs a "successor" checkpoint (successor_checkpoint.py) that, after the
prompt's last token `<think>`, greedily writes: reasoning, `</think>`, a glm47 tool call, and the
stop token `<|observation|>`."""

import json

import pytest

from flint_backend.tokenizer import load_tokenizer
from successor_checkpoint import successor_checkpoint
from triton_server import TritonServer, configured_repository

pytest.importorskip("tritonclient")
pytestmark = pytest.mark.server

REASONING = "Let me check."
CALL = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
MESSAGES = json.dumps([{"role": "user", "content": "What is the weather in Paris?"}])
TOOLS = json.dumps([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                      "parameters": {"type": "object",
                                                                     "properties": {"city": {"type": "string"}}}}}])


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triton_tools")
    tokenizer = load_tokenizer(tiny_checkpoint)
    text = "<think>" + REASONING + "</think>" + CALL + "<|observation|>"
    chain = tokenizer(text, add_special_tokens=False).input_ids
    model = successor_checkpoint(tiny_checkpoint, tmp / "successor", chain)
    repo = configured_repository(tmp, "--model", str(model), "--device", "cpu", "--dtype", "float32",
                                 "--cpu-threads", "1", "--max-model-len", "1024", "--max-num-seqs", "4",
                                 "--enable-auto-tool-choice", "--tool-call-parser", "glm47",
                                 "--reasoning-parser", "glm47", "--exclude-tools-when-tool-choice-none")
    with TritonServer(repo, tmp / "tritonserver.log") as s:
        yield s


def request(**extra):
    return {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 64, "temperature": 0.0, **extra}


def test_non_streamed_chat_returns_reasoning_and_parsed_tool_calls(server):
    status, body = server.generate(request())
    assert status == 200, body
    assert body["reasoning_output"] == REASONING
    assert body["text_output"] == ""
    calls = json.loads(body["tool_calls"])
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}
    assert body["finish_reason"] == "tool_calls"
    assert body["num_output_tokens"] >= 10 and body["num_input_tokens"] > 20


def test_streamed_chat_gives_the_same_call_in_deltas(server):
    events = server.generate_stream(request(stream=True))
    assert len(events) >= 2 and events[-1]["finish_reason"] == "tool_calls"
    assert "".join(e["reasoning_output"] for e in events) == REASONING
    assert "".join(e["text_output"] for e in events) == ""
    deltas = [d for e in events for d in json.loads(e["tool_calls"])]
    assert deltas[0]["function"]["name"] == "get_weather" and deltas[0]["type"] == "function"
    assert {d["index"] for d in deltas} == {0}
    assert "".join(d["function"]["arguments"] for d in deltas) == json.dumps({"city": "Paris"})


def test_tool_choice_none_leaves_the_call_text_as_content(server):
    status, body = server.generate(request(tool_choice="none"))
    assert status == 200, body
    assert json.loads(body["tool_calls"]) == [] and body["finish_reason"] == "stop"
    assert CALL in body["text_output"]


TIME_TOOL = [{"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
@pytest.mark.parametrize("parallel", [None, False], ids=["parallel-default", "parallel-false"])
def test_required_and_named_choices_hold_the_output_to_a_call(server, tool_choice, parallel):
    """The successor model wants get_weather, which this request does not list: the grammar
    turns its call into one to get_time with schema-valid arguments, and ends the output there."""
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    status, body = server.generate(request(tools=json.dumps(TIME_TOOL), tool_choice=json.dumps(tool_choice),
                                           max_tokens=128, **extra))
    assert status == 200, body
    assert body["reasoning_output"] == REASONING and body["finish_reason"] == "tool_calls", body
    calls = json.loads(body["tool_calls"])
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    assert json.loads(calls[0]["function"]["arguments"])["zone"] in ("UTC", "CET")


def test_auto_calls_are_held_to_the_listed_tools(server):
    status, body = server.generate(request(tools=json.dumps(TIME_TOOL), max_tokens=128))
    assert status == 200, body
    calls = json.loads(body["tool_calls"])
    assert calls and all(c["function"]["name"] == "get_time" for c in calls), body  # the model's call, redirected
    assert "get_weather" not in body["text_output"]
