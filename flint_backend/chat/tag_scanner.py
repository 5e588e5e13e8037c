"""Finds literal tags in text that arrives in pieces, in time linear in the text.

The parsers are state machines whose states each look for a few tags (`</think>`,
`<arg_key>`, ...). `TagScanner.next(tags)` returns the text up to the earliest of
those tags and the tag; when no whole tag is buffered it returns the text that can
no longer become part of one and holds back the tail that still could (`</thi` at a
chunk end), so a tag split across chunks is found exactly as if it came in one piece.
"""

from __future__ import annotations

import re


class TagSet:
    """The tags one parser state looks for, compiled once."""

    def __init__(self, *tags: str):
        if not tags or not all(tags):
            raise ValueError(f"TagSet needs non-empty tags, got {tags!r}")
        self.tags = tags
        # One alternation finds the earliest tag of any kind in a single pass; no tag is a
        # prefix of another, so at one position at most one can match.
        self.pattern = re.compile("|".join(re.escape(t) for t in tags))
        self._prefixes = frozenset(t[:i] for t in tags for i in range(1, len(t)))
        self._longest_prefix = max(len(t) for t in tags) - 1

    def hold_from(self, buffer: str, start: int) -> int:
        """Index of the earliest tail of buffer[start:] that is the beginning of a tag (len if none)."""
        for i in range(max(start, len(buffer) - self._longest_prefix), len(buffer)):
            if buffer[i:] in self._prefixes:
                return i
        return len(buffer)


class TagScanner:
    def __init__(self) -> None:
        self._buffer = ""
        self._pos = 0  # buffer[:pos] has been handed out

    def push(self, text: str) -> None:
        # Only a held-back tail (shorter than the longest tag) is left unread here, so
        # this copy costs O(len(text)).
        self._buffer = self._buffer[self._pos:] + text
        self._pos = 0

    def next(self, tags: TagSet) -> tuple[str, str | None]:
        """(text before the next tag, the tag), or (text that cannot start a tag, None)."""
        match = tags.pattern.search(self._buffer, self._pos)
        if match is not None:
            text = self._buffer[self._pos:match.start()]
            self._pos = match.end()
            return text, match.group()
        cut = tags.hold_from(self._buffer, self._pos)
        text = self._buffer[self._pos:cut]
        self._pos = cut
        return text, None

    def rest(self) -> str:
        """Everything not handed out yet (the held-back tail at the end of the output)."""
        text = self._buffer[self._pos:]
        self._buffer, self._pos = "", 0
        return text
