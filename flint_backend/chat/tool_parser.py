"""Streaming GLM-4.7 tool-call parser (vLLM's `--tool-call-parser glm47`), on content text.

A call reads `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`.
Whitespace between the pieces (GLM-4.5 puts newlines there) is ignored, and so is whitespace
around a value: the text inside `<arg_value>`, stripped, is the value (the grammar that holds
constrained calls, xgrammar's glm_xml style, treats that whitespace as layout too). Each accepted call streams as one
header delta `{index, id, type: "function", name}` and then argument deltas whose
concatenation is the final arguments JSON, `json.dumps(args, ensure_ascii=False)`.
String-typed values stream as they arrive; other values are sent when complete.

Decisions where the format leaves room:
- The name runs to the first `<arg_key>` or `</tool_call>` and is stripped; a name no
  declared tool has is not a call: its raw text, up to `</tool_call>`, is content.
  `tools=None` declares nothing and accepts every name, all values strings.
- A value ends at `</arg_value>`, or, when that was left out, at the next `<arg_key>`
  or `</tool_call>`. A key without a value is dropped; a repeated key keeps its first
  value (so the streamed JSON has unique keys and equals `json.dumps` of the result).
- A call still open at the end of the output is not a call: its raw text is content in
  `finish()` and `result()`. A streaming client may already have received its header
  and part of its arguments; `has_tool_calls` counts only closed calls.
- Text before, between and after calls is content, verbatim.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Callable

from flint_backend.chat.tag_scanner import TagScanner, TagSet
from flint_backend.chat.tool_schema import ONLY_STRING, ToolSchema, decode_value

TOOL_CALL = "<tool_call>"
END_TOOL_CALL = "</tool_call>"
ARG_KEY = "<arg_key>"
END_ARG_KEY = "</arg_key>"
ARG_VALUE = "<arg_value>"
END_ARG_VALUE = "</arg_value>"

# Parser states and the tags each one looks for.
CONTENT, REJECTED, NAME, KEY, AFTER_KEY, VALUE, AFTER_VALUE = (
    "content", "rejected", "name", "key", "after_key", "value", "after_value")
_TAGS = {
    CONTENT: TagSet(TOOL_CALL),
    REJECTED: TagSet(END_TOOL_CALL),
    NAME: TagSet(ARG_KEY, END_TOOL_CALL),
    KEY: TagSet(END_ARG_KEY, ARG_VALUE, END_TOOL_CALL),
    AFTER_KEY: TagSet(ARG_VALUE, ARG_KEY, END_TOOL_CALL),
    VALUE: TagSet(END_ARG_VALUE, ARG_KEY, END_TOOL_CALL),
    AFTER_VALUE: TagSet(ARG_KEY, END_TOOL_CALL),
}
_STATE_AFTER = {ARG_KEY: KEY, END_ARG_KEY: AFTER_KEY, END_ARG_VALUE: AFTER_VALUE}

# How a value's text is handled while it arrives.
STREAM, TYPED, SKIP = "stream", "typed", "skip"

_ID_ALPHABET = string.ascii_letters + string.digits


def random_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass
class ToolCallDelta:
    index: int
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ToolDelta:
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON object text


@dataclass
class ToolParseResult:
    content: str
    calls: list[ToolCall]


@dataclass
class _OpenCall:
    raw: list[str]  # the call as written, given back as content if it never closes
    name_parts: list[str] = field(default_factory=list)
    index: int = -1
    id: str = ""
    name: str = ""
    key_parts: list[str] = field(default_factory=list)
    key: str | None = None
    value_mode: str = SKIP
    value_types: frozenset[str] = ONLY_STRING
    value_parts: list[str] = field(default_factory=list)
    value_started: bool = False     # a streamed value's first non-whitespace text was sent
    held_whitespace: str = ""       # a streamed value's trailing whitespace, sent if more text follows
    keys: set[str] = field(default_factory=set)
    arguments: list[str] = field(default_factory=list)


class _DeltaBuilder:
    """Collects one feed's output; consecutive argument pieces of a call become one delta."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self._calls: list[tuple[ToolCallDelta, list[str]]] = []

    def header(self, index: int, call_id: str, name: str) -> None:
        self._calls.append((ToolCallDelta(index, call_id, "function", name), []))

    def arguments(self, index: int, text: str) -> None:
        if not self._calls or self._calls[-1][0].index != index or self._calls[-1][0].name is not None:
            self._calls.append((ToolCallDelta(index), []))
        self._calls[-1][1].append(text)

    def build(self) -> ToolDelta:
        for delta, parts in self._calls:
            delta.arguments = "".join(parts)
        return ToolDelta("".join(self.content), [delta for delta, _ in self._calls])


class Glm47ToolParser:
    def __init__(self, tools: list[dict] | None, id_factory: Callable[[], str] | None = None):
        self._schemas = None if tools is None else {s.name: s for s in map(ToolSchema.from_openai, tools)}
        self._new_id = id_factory or random_call_id
        self._scanner = TagScanner()
        self._state = CONTENT
        self._call: _OpenCall | None = None
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._headers_sent = 0
        self._finished = False

    @property
    def has_tool_calls(self) -> bool:
        """Whether a call has been closed (finish_reason "tool_calls")."""
        return bool(self._calls)

    def feed(self, text: str) -> ToolDelta:
        if self._finished:
            raise RuntimeError("Glm47ToolParser.feed() called after finish()")
        out = _DeltaBuilder()
        self._scanner.push(text)
        while True:
            piece, tag = self._scanner.next(_TAGS[self._state])
            if piece:
                self._on_text(piece, out)
            if tag is None:
                return out.build()
            self._on_tag(tag, out)

    def finish(self) -> ToolDelta:
        if self._finished:
            raise RuntimeError("Glm47ToolParser.finish() called twice")
        self._finished = True
        out = _DeltaBuilder()
        unclosed = "".join(self._call.raw) if self._call is not None else ""
        self._call = None
        self._emit_content(unclosed + self._scanner.rest(), out)
        return out.build()

    def result(self) -> ToolParseResult:
        if not self._finished:
            raise RuntimeError("Glm47ToolParser.result() called before finish()")
        return ToolParseResult("".join(self._content), list(self._calls))

    def _emit_content(self, text: str, out: _DeltaBuilder) -> None:
        if text:
            self._content.append(text)
            out.content.append(text)

    def _emit_arguments(self, call: _OpenCall, text: str, out: _DeltaBuilder) -> None:
        call.arguments.append(text)
        out.arguments(call.index, text)

    def _on_text(self, text: str, out: _DeltaBuilder) -> None:
        call = self._call
        if call is None:  # content, or the text of a rejected call
            self._emit_content(text, out)
            return
        call.raw.append(text)
        if self._state == NAME:
            call.name_parts.append(text)
        elif self._state == KEY:
            call.key_parts.append(text)
        elif self._state == VALUE:
            self._value_text(call, text, out)
        # AFTER_KEY, AFTER_VALUE: the whitespace between tags, ignored

    def _on_tag(self, tag: str, out: _DeltaBuilder) -> None:
        if self._state == CONTENT:  # <tool_call>
            self._call = _OpenCall(raw=[tag])
            self._state = NAME
            return
        if self._state == REJECTED:  # </tool_call> ends a rejected call's text
            self._emit_content(tag, out)
            self._state = CONTENT
            return
        call = self._call
        call.raw.append(tag)
        # First finish what the current state was reading, then follow the tag.
        if self._state == NAME and not self._open_call(call, tag, out):
            return
        if self._state == KEY:
            call.key = "".join(call.key_parts).strip()
        elif self._state == VALUE:
            self._close_value(call, out)
        if tag == ARG_VALUE:
            self._open_value(call, out)
        elif tag == END_TOOL_CALL:
            self._close_call(call, out)
        else:
            if tag == ARG_KEY:
                call.key_parts, call.key = [], None
            self._state = _STATE_AFTER[tag]

    def _open_call(self, call: _OpenCall, tag: str, out: _DeltaBuilder) -> bool:
        """Send the header of a call to a declared tool, or give a rejected call's text back as content."""
        name = "".join(call.name_parts).strip()
        if not name or (self._schemas is not None and name not in self._schemas):
            self._emit_content("".join(call.raw), out)
            self._call = None
            self._state = CONTENT if tag == END_TOOL_CALL else REJECTED
            return False
        call.name, call.id, call.index = name, self._new_id(), self._headers_sent
        self._headers_sent += 1
        out.header(call.index, call.id, name)
        self._emit_arguments(call, "{", out)
        return True

    def _argument_prefix(self, call: _OpenCall) -> str:
        separator = ", " if call.keys else ""
        call.keys.add(call.key)
        return f"{separator}{json.dumps(call.key, ensure_ascii=False)}: "

    def _open_value(self, call: _OpenCall, out: _DeltaBuilder) -> None:
        self._state = VALUE
        call.value_parts, call.value_started, call.held_whitespace = [], False, ""
        if call.key is None or call.key in call.keys:
            call.value_mode = SKIP
            return
        schema = self._schemas.get(call.name) if self._schemas is not None else None
        call.value_types = schema.types_of(call.key) if schema is not None else ONLY_STRING
        call.value_mode = STREAM if call.value_types == ONLY_STRING else TYPED
        if call.value_mode == STREAM:
            self._emit_arguments(call, self._argument_prefix(call) + '"', out)

    def _value_text(self, call: _OpenCall, text: str, out: _DeltaBuilder) -> None:
        if call.value_mode == STREAM:
            if not call.value_started:
                text = text.lstrip()
                call.value_started = bool(text)
            text = call.held_whitespace + text
            kept = text.rstrip()
            call.held_whitespace = text[len(kept):]
            if kept:  # JSON escapes character by character: escaped pieces concatenate to the escaped whole
                self._emit_arguments(call, json.dumps(kept, ensure_ascii=False)[1:-1], out)
        elif call.value_mode == TYPED:
            call.value_parts.append(text)

    def _close_value(self, call: _OpenCall, out: _DeltaBuilder) -> None:
        if call.value_mode == STREAM:
            self._emit_arguments(call, '"', out)
        elif call.value_mode == TYPED:
            value = decode_value("".join(call.value_parts).strip(), call.value_types)
            self._emit_arguments(call, self._argument_prefix(call) + json.dumps(value, ensure_ascii=False), out)
        call.value_mode, call.key = SKIP, None

    def _close_call(self, call: _OpenCall, out: _DeltaBuilder) -> None:
        self._emit_arguments(call, "}", out)
        self._calls.append(ToolCall(call.id, call.name, "".join(call.arguments)))
        self._call = None
        self._state = CONTENT
