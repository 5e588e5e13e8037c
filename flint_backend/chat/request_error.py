"""The client-error type of the chat layer: the front ends map it to HTTP 400."""

from __future__ import annotations

import json

_SHOWN_CHARS = 80  # a found value is quoted up to this many characters


class ChatRequestError(ValueError):
    """`FIELD: expected EXPECTED, got FOUND`, with the field path kept in `.field`."""

    def __init__(self, field: str, expected: str, found: str):
        super().__init__(f"{field}: expected {expected}, got {found}")
        self.field = field


def describe(value: object) -> str:
    """A found value for an error message: its JSON type and a short quote of it."""
    if value is None:
        return "null"
    kind = {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "array", dict: "object"}.get(type(value), type(value).__name__)
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > _SHOWN_CHARS:
        text = text[:_SHOWN_CHARS] + "…"
    return text if kind in ("boolean", "integer", "number") else f"{kind} {text}"
