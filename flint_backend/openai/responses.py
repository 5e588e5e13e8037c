"""OpenAI response objects shared by both endpoints: ids, usage, SSE framing."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

from flint_backend.openai.errors import OpenAIError

DONE = "data: [DONE]\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage; cached_tokens: of the prompt tokens, those the engine's prefix cache held."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def sse_error(error: OpenAIError) -> str:
    """An error after the stream has begun (the status line is gone): an error event, then [DONE]."""
    return sse(error.body()) + DONE


@dataclass(frozen=True)
class Envelope:
    """What every object of one response shares."""
    id: str
    object: str
    model: str
    created: int

    @classmethod
    def new(cls, prefix: str, object: str, model: str) -> "Envelope":
        return cls(new_id(prefix), object, model, int(time.time()))

    def wrap(self, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": choices, **extra}
