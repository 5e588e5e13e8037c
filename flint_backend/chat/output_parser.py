"""One request's output parsing: reasoning split first, then tool calls in the content.

`ChatOutputParser` is fed detokenised text deltas and returns `ChatDelta`s for a
streaming response; a non-streaming response is the same machine fed once, then
`finish()` and `result()`.

Decisions where the OpenAI protocol leaves room:
- Tool calls are parsed only with a tool-call parser, declared tools and a tool_choice
  other than "none"; otherwise every call's text stays content. `None` tool_choice
  means "auto". "required" parses like "auto" (serving.tool_constraint's grammar is what
  forces a call). A named choice `{"type": "function", "function": {"name": N}}` accepts
  only calls to N.
- `<tool_call>` before `</think>` ends the reasoning only when calls are parsed.
- Without a reasoning parser nothing is split off: all output is content, whatever
  `thinking` says.
- finish_reason becomes "tool_calls" when a call was closed and the engine stopped
  normally ("stop" or none given); "length" and other reasons are kept, since they say
  the output was cut short.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from flint_backend.chat.reasoning_parser import Glm47ReasoningParser, ReasoningDelta
from flint_backend.chat.tool_parser import Glm47ToolParser, ToolCall, ToolCallDelta, ToolDelta

REASONING_PARSERS = ("glm47",)
TOOL_CALL_PARSERS = ("glm47",)
NORMAL_STOPS = ("stop", None)


@dataclass
class ChatDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class ChatResult:
    reasoning: str
    content: str
    tool_calls: list[ToolCall]
    finish_reason: str | None


def tools_to_parse(tools: list[dict] | None, tool_choice: str | dict | None) -> list[dict] | None:
    """The tools whose calls count, or None when no call is parsed at all."""
    if not tools or tool_choice == "none":
        return None
    if tool_choice in (None, "auto", "required"):
        return tools
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if name is None:
        raise ValueError(f'tool_choice: expected "none", "auto", "required" or '
                         f'{{"type": "function", "function": {{"name": ...}}}}, got {tool_choice!r}')
    chosen = [t for t in tools if isinstance(t, dict) and t.get("function", {}).get("name") == name]
    if not chosen:
        raise ValueError(f"tool_choice.function.name: {name!r} is not one of the request's tools")
    return chosen


class ChatOutputParser:
    def __init__(self, thinking: bool, tools: list[dict] | None, tool_choice: str | dict | None = "auto",
                 reasoning_parser: str | None = "glm47", tool_call_parser: str | None = "glm47",
                 id_factory: Callable[[], str] | None = None):
        if reasoning_parser not in (None, *REASONING_PARSERS):
            raise ValueError(f"reasoning_parser: expected one of {REASONING_PARSERS} or None, got {reasoning_parser!r}")
        if tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise ValueError(f"tool_call_parser: expected one of {TOOL_CALL_PARSERS} or None, got {tool_call_parser!r}")
        parsed_tools = tools_to_parse(tools, tool_choice)
        self._tool_parser = None
        if tool_call_parser is not None and parsed_tools is not None:
            self._tool_parser = Glm47ToolParser(parsed_tools, id_factory)
        self._reasoning_parser = None
        if reasoning_parser is not None:
            self._reasoning_parser = Glm47ReasoningParser(thinking, end_reasoning_at_tool_call=self._tool_parser is not None)
        self._reasoning: list[str] = []
        self._content: list[str] = []  # used when no tool parser keeps it
        self._finished = False

    @property
    def has_tool_calls(self) -> bool:
        return self._tool_parser is not None and self._tool_parser.has_tool_calls

    def feed(self, text: str) -> ChatDelta:
        if self._finished:
            raise RuntimeError("ChatOutputParser.feed() called after finish()")
        split = self._reasoning_parser.feed(text) if self._reasoning_parser else ReasoningDelta(content=text)
        return self._combine(split, self._tool_parser.feed(split.content) if self._tool_parser else None)

    def finish(self) -> ChatDelta:
        if self._finished:
            raise RuntimeError("ChatOutputParser.finish() called twice")
        self._finished = True
        split = self._reasoning_parser.finish() if self._reasoning_parser else ReasoningDelta()
        if self._tool_parser is None:
            return self._combine(split, None)
        tools = self._tool_parser.feed(split.content)
        last = self._tool_parser.finish()
        return self._combine(split, ToolDelta(tools.content + last.content, tools.calls + last.calls))

    def finish_reason(self, engine_reason: str | None) -> str | None:
        return "tool_calls" if self.has_tool_calls and engine_reason in NORMAL_STOPS else engine_reason

    def result(self, engine_reason: str | None = "stop") -> ChatResult:
        if not self._finished:
            raise RuntimeError("ChatOutputParser.result() called before finish()")
        if self._tool_parser is None:
            content, calls = "".join(self._content), []
        else:
            parsed = self._tool_parser.result()
            content, calls = parsed.content, parsed.calls
        return ChatResult("".join(self._reasoning), content, calls, self.finish_reason(engine_reason))

    def _combine(self, split: ReasoningDelta, tools: ToolDelta | None) -> ChatDelta:
        self._reasoning.append(split.reasoning)
        if tools is None:
            self._content.append(split.content)
            return ChatDelta(split.reasoning, split.content)
        return ChatDelta(split.reasoning, tools.content, tools.calls)


def parse_chat_output(text: str, thinking: bool, tools: list[dict] | None, tool_choice: str | dict | None = "auto",
                      engine_reason: str | None = "stop", **options) -> ChatResult:
    """Non-streaming: the streaming machine fed the whole output at once."""
    parser = ChatOutputParser(thinking, tools, tool_choice, **options)
    parser.feed(text)
    parser.finish()
    return parser.result(engine_reason)
