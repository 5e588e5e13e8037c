"""A request's `tools` and `tool_choice`: validation, what goes into the prompt, what is parsed.

tool_choice, as OpenAI defines it (what holds the output to it is serving.tool_constraint's
grammar; here: validation, the prompt, the parse):
- not given: "auto" when tools are given. Any tool_choice without tools is an error
  (OpenAI answers 400); an empty `tools` array counts as no tools.
- "auto": the model decides; calls are parsed. Allowed only when the server runs with
  --enable-auto-tool-choice (and so a --tool-call-parser); otherwise a client error that
  says so, as vLLM answers.
- "none": no call is parsed (call text stays content). The tools stay in the prompt,
  unless the server runs with --exclude-tools-when-tool-choice-none, which leaves them
  out so the model is not tempted to call.
- "required" and `{"type": "function", "function": {"name": N}}`: calls are parsed (only
  calls to N for a named choice; calls to other tools stay content). They need a
  --tool-call-parser; the prompt is the same as for "auto", and the grammar makes the output
  calls. When the output still holds no call (max_tokens cut it short), the response is returned as generated:
  its text is the content and finish_reason is the engine's ("stop" or "length"); the
  postprocessor reports `unmet_tool_choice(...)` — a sentence naming the choice — and
  the OpenAI server logs it and passes it on (non-streaming: the response still comes
  with HTTP 200; clients that need a call can retry).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flint_backend.chat.chat_options import ChatOptions
from flint_backend.chat.request_error import ChatRequestError, describe
from flint_backend.chat.tool_schema import check_schema

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
CHOICES = ("none", "auto", "required")
_CHOICE_FORMS = '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'


@dataclass(frozen=True)
class ToolPlan:
    prompt_tools: list[dict] | None  # what the template lists
    parser_tools: list[dict] | None  # what ChatOutputParser gets: None parses no call
    tool_choice: str | dict  # "none", "auto", "required" or the named-function object


def validate_tools(tools: object) -> list[dict] | None:
    """OpenAI function tools, unchanged (the template lists them as given), or None for none."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatRequestError("tools", "an array of function tools", describe(tools))
    names: dict[str, int] = {}
    for i, tool in enumerate(tools):
        name = _tool_name(f"tools[{i}]", tool)
        if name in names:
            raise ChatRequestError(f"tools[{i}].function.name", f"a name no other tool has (tools[{names[name]}] "
                                   "has it)", describe(name))
        names[name] = i
    return tools or None


def _tool_name(path: str, tool: object) -> str:
    if not isinstance(tool, dict):
        raise ChatRequestError(path, '{"type": "function", "function": {"name", "description"?, "parameters"?}}',
                               describe(tool))
    if tool.get("type") != "function":
        raise ChatRequestError(f"{path}.type", '"function"', describe(tool.get("type")))
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ChatRequestError(f"{path}.function", 'an object {"name", "description"?, "parameters"?}',
                               describe(function))
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ChatRequestError(f"{path}.function.name", "1 to 64 of a-z, A-Z, 0-9, _ and -", describe(name))
    # null counts as absent: some clients serialise unset fields
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise ChatRequestError(f"{path}.function.description", "a string", describe(function["description"]))
    if function.get("parameters") is not None:
        if not isinstance(function["parameters"], dict):
            raise ChatRequestError(f"{path}.function.parameters", "a JSON Schema object",
                                   describe(function["parameters"]))
        check_schema(f"{path}.function.parameters", function["parameters"])  # what the tool-call parser reads
    return name


def plan_tools(tools: object, tool_choice: object, options: ChatOptions) -> ToolPlan:
    tools = validate_tools(tools)
    if tool_choice is not None and tools is None:
        raise ChatRequestError("tool_choice", "no tool_choice when the request has no tools", describe(tool_choice))
    if tools is None:
        return ToolPlan(None, None, "none")
    choice = "auto" if tool_choice is None else _choice(tool_choice, tools)
    if choice == "none":
        return ToolPlan(None if options.exclude_tools_when_tool_choice_none else tools, None, "none")
    if choice == "auto" and not options.enable_auto_tool_choice:
        given = "" if tool_choice is not None else " (the default when tools are given)"
        raise ChatRequestError("tool_choice", '"none", "required" or a named function; "auto" needs the server '
                               "started with --enable-auto-tool-choice --tool-call-parser glm47", f'"auto"{given}')
    if options.tool_call_parser is None:
        raise ChatRequestError("tool_choice", '"none" (this server was started without --tool-call-parser, '
                               "so it parses no tool calls)", describe(choice))
    return ToolPlan(tools, tools, choice)


def _choice(tool_choice: object, tools: list[dict]) -> str | dict:
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise ChatRequestError("tool_choice", _CHOICE_FORMS, describe(tool_choice))
        return tool_choice
    if not isinstance(tool_choice, dict):
        raise ChatRequestError("tool_choice", _CHOICE_FORMS, describe(tool_choice))
    if tool_choice.get("type") != "function":
        raise ChatRequestError("tool_choice.type", '"function"', describe(tool_choice.get("type")))
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ChatRequestError("tool_choice.function.name", "the name of one of the request's tools",
                               describe(name))
    known = [t["function"]["name"] for t in tools]
    if name not in known:
        raise ChatRequestError("tool_choice.function.name", "one of the request's tools (" + ", ".join(known) + ")",
                               describe(name))
    return {"type": "function", "function": {"name": name}}


def unmet_tool_choice(tool_choice: str | dict | None, has_tool_calls: bool) -> str | None:
    """Why the output fails its tool_choice ("required" or named, and no call), else None."""
    if has_tool_calls or tool_choice in (None, "none", "auto"):
        return None
    if tool_choice == "required":
        return 'tool_choice "required": the model answered without a tool call'
    return f"tool_choice {tool_choice['function']['name']}: the model answered without calling it"
