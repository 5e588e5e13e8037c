"""A chat request's tool calls held to their format and schemas: xgrammar's glm_4_7 structural tag.

Which requests are constrained (the glm47 tool-call parser only):
- tool_choice "required": the output (after the reasoning, when thinking) is one or more calls
  to listed tools, and nothing else;
- a named function: exactly one call to it;
- "auto": free text, but what follows `<tool_call>` is a listed tool's name and arguments that
  follow its `parameters`; the server flag `--no-constrain-auto-tool-calls` leaves "auto" free;
- "none", or no tools: nothing.
Arguments follow the tool's `parameters` schema unless the tool says `"strict": false` (then
any arguments, as vLLM does); `parallel_tool_calls: false` allows one call at most. With
thinking on, the reasoning is free text up to `</think>` (the prompt ends with `<think>`); the
markers of a call cannot appear in it or in the content.

The tag travels as `SamplingParams.structural_tag`; the engine compiles it with its tokenizer
(engine.guided). Here each request's tag is checked without a tokenizer first, so a schema
xgrammar cannot compile is refused naming the tool, before anything runs. Built tags are
cached by (tools, tool_choice, thinking, parallel_tool_calls).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from flint_backend.chat.request_error import ChatRequestError

XGRAMMAR_MODEL = {"glm47": "glm_4_7"}  # our tool-call parser -> xgrammar's structural-tag model
MAX_CACHED = 256
MAX_WHITESPACE = 1  # around argument values (xgrammar needs >= 1): a sampler could extend whitespace without end

_cache: OrderedDict[str, dict] = OrderedDict()
_lock = threading.Lock()


def tool_call_tag(tools: list[dict] | None, tool_choice: str | dict, thinking: bool, parser: str | None,
                  parallel_tool_calls: bool = True, constrain_auto: bool = True) -> dict | None:
    """The structural tag (a JSON object) that holds the request's tool calls, or None when none
    applies. Raises ChatRequestError naming the tool whose schema xgrammar cannot compile."""
    if not tools or tool_choice == "none" or parser not in XGRAMMAR_MODEL:
        return None
    if tool_choice == "auto" and not constrain_auto:
        return None
    key = json.dumps([tools, tool_choice, thinking, parallel_tool_calls, parser], sort_keys=True)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    tag = _checked_tag(tools, tool_choice, thinking, parser, parallel_tool_calls)
    with _lock:
        _cache[key] = tag
        while len(_cache) > MAX_CACHED:
            _cache.popitem(last=False)
    return tag


def _build(tools: list[dict], tool_choice: str | dict, thinking: bool, parser: str, parallel: bool) -> dict:
    import xgrammar

    tag = xgrammar.get_model_structural_tag(XGRAMMAR_MODEL[parser], tools=tools, tool_choice=tool_choice,
                                            reasoning=thinking, parallel_tool_calls=parallel,
                                            max_whitespace_cnt=MAX_WHITESPACE).model_dump(mode="json")
    if tool_choice == "required":  # calls only: xgrammar's "required" lets free text follow the calls
        _calls_only(tag["format"])
    return tag


def _calls_only(node: dict) -> None:
    """The triggered tags (text, calls, text, ...) of a "required" tag made calls alone, back to back."""
    elements = node["elements"] if node["type"] == "sequence" else [node]
    for i, element in enumerate(elements):
        if element["type"] == "triggered_tags":
            calls = {"type": "tags_with_separator", "tags": element["tags"], "separator": "",
                     "at_least_one": True, "stop_after_first": element["stop_after_first"]}
            if node["type"] == "sequence":
                node["elements"][i] = calls
            else:
                node.clear()
                node.update(calls)


def _checked_tag(tools: list[dict], tool_choice: str | dict, thinking: bool, parser: str, parallel: bool) -> dict:
    import xgrammar

    try:
        tag = _build(tools, tool_choice, thinking, parser, parallel)
        xgrammar.Grammar.from_structural_tag(json.dumps(tag))
        return tag
    except Exception as error:  # noqa: BLE001 - find the tool it comes from
        whole = error
    for i, tool in enumerate(tools):
        if isinstance(tool_choice, dict) and tool["function"]["name"] != tool_choice["function"]["name"]:
            continue
        try:
            alone = _build([tool], "required", False, parser, True)
            xgrammar.Grammar.from_structural_tag(json.dumps(alone))
        except Exception as error:  # noqa: BLE001 - xgrammar's errors name no field
            raise ChatRequestError(f"tools[{i}].function.parameters",
                                   "a JSON schema that xgrammar can compile (tool calls are held to it)",
                                   str(error).splitlines()[0][:300]) from None
    raise ChatRequestError("tools", "tools whose calls xgrammar can constrain",
                           str(whole).splitlines()[0][:300]) from None
