"""OpenAI-style chat `messages` -> the plain messages the GLM-4.7 template reads.

Accepted (anything else is a ChatRequestError naming the field):
- role "system", "developer" (OpenAI's newer name for system; rendered as system),
  "user", "assistant" or "tool"; other keys than the ones below (`name`, `refusal`, ...)
  are ignored.
- content: a string or a list of `{"type": "text", "text": str}` parts, joined with no
  separator (as the template joins them). Other part types (images, audio) are errors:
  Flint reads text only. Required except on an assistant message with tool_calls,
  where it may be null or absent.
- assistant `tool_calls[]`: `{"id"?, "type"?: "function", "function": {"name", "arguments"}}`
  where arguments is the JSON text of an object (as OpenAI sends it; "" counts as {}) or
  already an object. The template needs an object, so the text is decoded here.
- assistant `reasoning_content` (or `reasoning`, the newer name): a string or null.
- tool `tool_call_id`: a string, required. The GLM-4.7 prompt does not show it (tool
  results follow the calls in order), but OpenAI requires it and every OpenAI client
  sends it, so a message without it is a malformed request, reported as such.
"""

from __future__ import annotations

import json

from flint_backend.chat.request_error import ChatRequestError, describe

ROLES = ("system", "developer", "user", "assistant", "tool")
ROLE_ALIASES = {"developer": "system"}


def normalize_messages(messages: object) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("messages", "a non-empty array of messages", describe(messages))
    return [_message(f"messages[{i}]", m) for i, m in enumerate(messages)]


def _message(path: str, message: object) -> dict:
    if not isinstance(message, dict):
        raise ChatRequestError(path, "an object with a role", describe(message))
    role = message.get("role")
    if role not in ROLES:
        raise ChatRequestError(f"{path}.role", "one of " + ", ".join(ROLES), describe(role))
    role = ROLE_ALIASES.get(role, role)
    if role == "assistant":
        return _assistant(path, message)
    out = {"role": role, "content": _content(f"{path}.content", message.get("content"))}
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise ChatRequestError(f"{path}.tool_call_id", "the id of the tool call this result answers (a string)",
                                   describe(call_id))
        out["tool_call_id"] = call_id
    return out


def _content(path: str, content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatRequestError(path, 'a string or an array of {"type": "text", "text": ...} parts', describe(content))
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise ChatRequestError(f"{path}[{i}]", 'a {"type": "text", "text": ...} part', describe(part))
        if part.get("type") != "text":
            raise ChatRequestError(f"{path}[{i}].type", '"text" (Flint reads text only)', describe(part.get("type")))
        if not isinstance(part.get("text"), str):
            raise ChatRequestError(f"{path}[{i}].text", "a string", describe(part.get("text")))
        texts.append(part["text"])
    return "".join(texts)


def _assistant(path: str, message: dict) -> dict:
    out: dict = {"role": "assistant"}
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise ChatRequestError(f"{path}.tool_calls", "an array of tool calls", describe(calls))
        out["tool_calls"] = [_tool_call(f"{path}.tool_calls[{i}]", c) for i, c in enumerate(calls)]
    content = message.get("content")
    if content is None and not calls:
        raise ChatRequestError(f"{path}.content", "a string or text parts (or tool_calls)", describe(content))
    out["content"] = "" if content is None else _content(f"{path}.content", content)
    key = "reasoning_content" if message.get("reasoning_content") is not None else "reasoning"
    reasoning = message.get(key)
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise ChatRequestError(f"{path}.{key}", "a string or null", describe(reasoning))
        out["reasoning_content"] = reasoning
    return out


def _tool_call(path: str, call: object) -> dict:
    if not isinstance(call, dict):
        raise ChatRequestError(path, 'an object {"type": "function", "function": {"name", "arguments"}}', describe(call))
    if call.get("type", "function") != "function":
        raise ChatRequestError(f"{path}.type", '"function"', describe(call.get("type")))
    function = call.get("function")
    if not isinstance(function, dict):
        raise ChatRequestError(f"{path}.function", 'an object {"name", "arguments"}', describe(function))
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ChatRequestError(f"{path}.function.name", "a non-empty string", describe(name))
    out = {"type": "function", "function": {"name": name, "arguments": _arguments(f"{path}.function.arguments",
                                                                                 function.get("arguments"))}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def _arguments(path: str, arguments: object) -> dict:
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        raise ChatRequestError(path, "the JSON text of an object", describe(arguments))
    if not arguments.strip():
        return {}  # some clients send "" for a call without arguments
    try:
        value = json.loads(arguments)
    except ValueError as error:
        raise ChatRequestError(path, "the JSON text of an object", f"invalid JSON ({error}): {describe(arguments)}")
    if not isinstance(value, dict):
        raise ChatRequestError(path, "the JSON text of an object", f"JSON {describe(value)}")
    return value
