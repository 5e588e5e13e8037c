"""Streaming GLM-4.7 reasoning parser: splits model output into reasoning and content.

With thinking on, the prompt ends `<|assistant|><think>`, so the output starts inside
the reasoning: everything up to `</think>` is reasoning, everything after is content.
With thinking off, everything is content.

Decisions where the format leaves room:
- A `<think>` at the very start of the output (thinking on) and a stray `</think>` at
  the very start (thinking off) are dropped; anywhere else they are plain text.
- `<tool_call>` before `</think>` ends the reasoning implicitly (the model skipped
  `</think>`), so the call is not lost inside the reasoning: the `<tool_call>` text and
  everything after it is content, for the tool parser to find. A later `</think>` is
  then ordinary content. `end_reasoning_at_tool_call=False` turns this off (for requests
  that parse no tool calls).
- Output that ends before `</think>` (truncated) is all reasoning.
- Only tags are held back at chunk ends (`</thi`); `finish()` flushes what is held.
"""

from __future__ import annotations

from dataclasses import dataclass

from flint_backend.chat.tag_scanner import TagScanner, TagSet

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class Glm47ReasoningParser:
    def __init__(self, thinking: bool = True, end_reasoning_at_tool_call: bool = True):
        self.thinking = thinking
        self._reasoning_tags = TagSet(THINK_END, TOOL_CALL_START) if end_reasoning_at_tool_call else TagSet(THINK_END)
        # The tag dropped when it opens the output; text is held in _head until that is decided.
        self._leading_tag = THINK_START if thinking else THINK_END
        self._head: str | None = ""  # None once decided
        self._in_reasoning = thinking
        self._scanner = TagScanner()
        self._finished = False

    def feed(self, text: str) -> ReasoningDelta:
        if self._finished:
            raise RuntimeError("Glm47ReasoningParser.feed() called after finish()")
        delta = ReasoningDelta()
        if self._head is not None:
            text = self._strip_leading_tag(text, at_end=False)
        self._split(text, delta)
        return delta

    def finish(self) -> ReasoningDelta:
        if self._finished:
            raise RuntimeError("Glm47ReasoningParser.finish() called twice")
        delta = ReasoningDelta()
        if self._head is not None:
            self._split(self._strip_leading_tag("", at_end=True), delta)
        held = self._scanner.rest()
        if self._in_reasoning:
            delta.reasoning += held
        else:
            delta.content += held
        self._finished = True
        return delta

    def _strip_leading_tag(self, text: str, at_end: bool) -> str:
        head = self._head + text
        if head.startswith(self._leading_tag):
            self._head = None
            return head[len(self._leading_tag):]
        if self._leading_tag.startswith(head) and not at_end:
            self._head = head  # still undecided: `<thi` may become `<think>`
            return ""
        self._head = None
        return head

    def _split(self, text: str, delta: ReasoningDelta) -> None:
        if not self._in_reasoning:
            delta.content += text  # content passes through: no tag matters after reasoning
            return
        self._scanner.push(text)
        piece, tag = self._scanner.next(self._reasoning_tags)
        delta.reasoning += piece
        if tag is not None:
            self._in_reasoning = False
            # `<tool_call>` belongs to the content it opens; `</think>` is dropped.
            delta.content += (tag if tag == TOOL_CALL_START else "") + self._scanner.rest()
