"""Tool calls held to their format and schemas (serving.tool_constraint, engine.guided) on the
random-weight tiny model, which never calls a tool by itself: every "required" and named request
yields parsed calls whose arguments validate against the tool's schema, "auto" never calls an
unknown tool or breaks a schema, `parallel_tool_calls: false` never gives two calls; thinking on
and off; the streamed parse equals the whole one. Sampled, seeded: SEEDS requests a case.

The random model ends its reasoning and starts calls only by chance (about 1 in 8,000 a token),
so the thinking cases raise `</think>`'s logit and the "auto" cases `<tool_call>`'s (logit_bias):
what follows is the grammar's doing.
"""

import json
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch

from flint_backend.chat.chat_options import ANNOUNCED_OPTIONS
from flint_backend.chat.request_error import ChatRequestError
from flint_backend.config import FlintConfig
from flint_backend.engine.engine import LLMEngine
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.engine.sampling_params import SamplingParams
from flint_backend.serving.chunks import EngineChunk
from flint_backend.serving.postprocess import Postprocessor
from flint_backend.serving.preprocess import Preprocessor
from flint_backend.tokenizer import load_tokenizer
from flint_backend.weights.random_init import random_stacked_weights

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from engine_cases import run_to_completion  # noqa: E402

SEEDS = 50
STOP_TOKENS = [8175, 8179, 8181]  # <|endoftext|>, <|user|>, <|observation|>: flint-tiny's config.json
MAX_TOKENS = 128  # a call takes 35-60 tokens of the tiny tokenizer
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                                         "loud": {"type": "boolean"}},
        "required": ["hour", "loud"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
NAMED = {"type": "function", "function": {"name": "set_alarm"}}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def engine():
    """flint-tiny's layer kinds on three layers (the test is the grammar's, the time the model's), with
    the checkpoint's stop tokens, which end a constrained output."""
    config = FlintConfig.preset("flint-tiny", num_hidden_layers=3, eos_token_id=STOP_TOKENS)
    return LLMEngine(EngineArgs(dtype="float32", device="cpu", block_size=16, max_num_seqs=SEEDS,
                                num_kv_blocks=1024, max_num_batched_tokens=1024, max_model_len=512),
                     config=config, weights=random_stacked_weights(config, 0, torch.float32))


def tensors(**values) -> dict:
    out = {}
    for name, value in values.items():
        if isinstance(value, str):
            out[name] = np.array([[value.encode()]], dtype=np.object_)
        elif isinstance(value, bool):
            out[name] = np.array([[value]])
        else:
            out[name] = np.array([[value]], dtype=np.int32)
    return out


def run(engine, tokenizer, tool_choice, thinking: bool, parallel: bool | None = None, seeds=range(SEEDS)):
    """Per seed: (calls as (name, arguments), finish_reason, calls of the streamed parse)."""
    pre = Preprocessor(tokenizer, ANNOUNCED_OPTIONS)
    bias = {}
    if thinking:
        bias[tokenizer.convert_tokens_to_ids("</think>")] = 9.0
    if tool_choice == "auto":
        bias[tokenizer.convert_tokens_to_ids("<tool_call>")] = 6.0
    flags = {} if parallel is None else {"parallel_tool_calls": parallel}
    requests = []
    for seed in seeds:
        p = pre(tensors(messages=json.dumps([{"role": "user", "content": "What now?"}]), tools=json.dumps(TOOLS),
                        tool_choice=tool_choice if isinstance(tool_choice, str) else json.dumps(tool_choice),
                        chat_template_kwargs=json.dumps({"enable_thinking": thinking}), max_tokens=MAX_TOKENS,
                        sampling_parameters=json.dumps({"seed": seed, "temperature": 1.0, "logit_bias": bias}),
                        **flags))
        params = SamplingParams.from_dict(json.loads(p.sampling_json))
        assert params.structural_tag is not None
        requests.append((engine.add_request(p.prompt_ids, params), p.output_config))
    run_to_completion(engine)
    return [(parse(tokenizer, seq, config, stream=False), parse(tokenizer, seq, config, stream=True))
            for seq, config in requests]


def parse(tokenizer, seq, config, stream: bool):
    """(calls [(name, arguments)], finish_reason) of the postprocessor, token by token when streamed."""
    config.stream = stream
    post = Postprocessor(tokenizer)
    ids = seq.output_ids
    steps = [ids[i:i + 1] for i in range(len(ids))] if stream else [ids]
    chunks = [EngineChunk("k", i, step, False, "", seq.num_prompt_tokens, sum(map(len, steps[:i + 1])),
                          config=config.to_json() if i == 0 else "") for i, step in enumerate(steps)]
    chunks.append(EngineChunk("k", len(chunks), [], True, seq.finish_reason, 0, len(ids)))
    outputs = [o for c in chunks for o in post.process(c).outputs]
    calls = [c for o in outputs for c in o.tool_calls]
    merged: dict[int, list] = {}
    for call in calls:  # streamed: a header then argument pieces, by index
        entry = merged.setdefault(call.get("index", len(merged)), [None, ""])
        entry[0] = entry[0] or call["function"].get("name")
        entry[1] += call["function"].get("arguments") or ""
    calls = [tuple(v) for v in merged.values()]
    if stream and calls and not complete(calls[-1][1]):  # a call the length limit cut: its header was sent
        calls.pop()
    return calls, outputs[-1].finish_reason


def complete(arguments: str) -> bool:
    try:
        json.loads(arguments)
        return True
    except ValueError:
        return False


def check_calls(calls, names=SCHEMAS):
    for name, arguments in calls:
        assert name in names, name
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
def test_required_always_calls_listed_tools_with_valid_arguments(engine, tokenizer, thinking):
    for (calls, reason), (streamed, _) in run(engine, tokenizer, "required", thinking):
        assert calls, reason
        check_calls(calls)
        assert streamed == calls


@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
def test_a_named_choice_is_exactly_one_call_to_it(engine, tokenizer, thinking):
    for (calls, reason), (streamed, _) in run(engine, tokenizer, NAMED, thinking):
        assert len(calls) == 1 and reason == "tool_calls", (calls, reason)
        check_calls(calls, names={"set_alarm"})
        assert streamed == calls


@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
def test_auto_calls_are_listed_tools_with_valid_arguments(engine, tokenizer, thinking):
    results = run(engine, tokenizer, "auto", thinking)
    for (calls, _), (streamed, _) in results:
        check_calls(calls)
        assert streamed == calls
    assert sum(bool(calls) for (calls, _), _ in results) >= SEEDS // 2  # the constraint was exercised


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_no_parallel_calls_is_one_call_at_most(engine, tokenizer, choice):
    results = run(engine, tokenizer, choice, thinking=False, parallel=False)
    for (calls, reason), _ in results:
        assert len(calls) <= 1
        if calls:
            check_calls(calls)
            assert reason == "tool_calls", reason  # nothing may follow the call but a stop token
    with_calls = sum(bool(calls) for (calls, _), _ in results)
    assert with_calls == SEEDS if choice == "required" else with_calls >= SEEDS // 2  # exercised


def test_a_schema_xgrammar_cannot_compile_is_refused_naming_the_tool(tokenizer):
    tools = [TOOLS[0], {"type": "function", "function": {"name": "odd", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(unclosed"}}}}}]
    pre = Preprocessor(tokenizer, ANNOUNCED_OPTIONS)
    with pytest.raises(ChatRequestError, match=r"^tools\[1\]\.function\.parameters: expected a JSON schema that "
                                               r"xgrammar can compile"):
        pre(tensors(messages=json.dumps([{"role": "user", "content": "hi"}]), tools=json.dumps(tools),
                    tool_choice="required"))


def test_tool_choice_none_and_no_tools_are_not_constrained(tokenizer):
    pre = Preprocessor(tokenizer, ANNOUNCED_OPTIONS)
    messages = json.dumps([{"role": "user", "content": "hi"}])
    for inputs in (dict(tools=json.dumps(TOOLS), tool_choice="none"), {}):
        p = pre(tensors(messages=messages, **inputs))
        assert "structural_tag" not in json.loads(p.sampling_json)
