"""A chat request (OpenAI-style messages, tools, tool_choice, chat_template_kwargs) -> prompt ids,
and a raw completion prompt (`text_input`) -> ids.

The prompt is rendered by the GLM-4.7 template (flint_backend/tokenizer/chat_template.jinja)
with the generation prompt added. `chat_template_kwargs` takes `enable_thinking` (default
true: the prompt ends `<|assistant|><think>`) and `clear_thinking` (default true: reasoning
of turns before the last user message is dropped); other keys are errors, since anything
else would reach the template as a variable it may not expect (e.g. `messages`).
What the postprocessor needs to parse the output travels in `RenderedPrompt`:
`ChatOutputParser(p.thinking, p.tools_for_parser, p.tool_choice,
reasoning_parser=options.reasoning_parser, tool_call_parser=options.tool_call_parser)`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from flint_backend.chat.chat_options import ChatOptions
from flint_backend.chat.messages import normalize_messages
from flint_backend.chat.request_error import ChatRequestError, describe
from flint_backend.chat.tool_choice import CHOICES, ToolPlan, plan_tools

TEMPLATE_KWARGS = ("enable_thinking", "clear_thinking")  # both booleans


@dataclass(frozen=True)
class RenderedPrompt:
    prompt_text: str
    prompt_ids: list[int]
    thinking: bool  # False only with enable_thinking: false
    tools_for_parser: list[dict] | None  # None: no tool call is parsed
    tool_choice: str | dict  # "none", "auto", "required" or {"type": "function", "function": {"name": N}}


@dataclass(frozen=True)
class CheckedChatRequest:
    messages: list[dict]  # what the template reads
    tools: ToolPlan
    template_kwargs: dict


def check_chat_request(messages: object, tools: object = None, tool_choice: object = None,
                       chat_template_kwargs: object = None, options: ChatOptions = ChatOptions()) -> CheckedChatRequest:
    """Validation alone (no tokenizer): raises ChatRequestError naming the field."""
    return CheckedChatRequest(normalize_messages(messages), plan_tools(tools, tool_choice, options),
                              _template_kwargs(chat_template_kwargs))


def render_chat_request(tokenizer, messages: object, tools: object = None, tool_choice: object = None,
                        chat_template_kwargs: object = None, options: ChatOptions = ChatOptions()) -> RenderedPrompt:
    checked = check_chat_request(messages, tools, tool_choice, chat_template_kwargs, options)
    template_messages, plan, kwargs = checked.messages, checked.tools, checked.template_kwargs
    text = tokenizer.apply_chat_template(template_messages, tools=plan.prompt_tools, tokenize=False,
                                         add_generation_prompt=True, **kwargs)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return RenderedPrompt(text, ids, kwargs.get("enable_thinking", True), plan.parser_tools, plan.tool_choice)


def _template_kwargs(kwargs: object) -> dict:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise ChatRequestError("chat_template_kwargs", "an object", describe(kwargs))
    for key, value in kwargs.items():
        if key not in TEMPLATE_KWARGS:
            raise ChatRequestError(f"chat_template_kwargs.{key}", "only " + " and ".join(TEMPLATE_KWARGS),
                                   describe(value))
        if not isinstance(value, bool):
            raise ChatRequestError(f"chat_template_kwargs.{key}", "true or false", describe(value))
    return dict(kwargs)


def encode_text_input(tokenizer, text_input: object) -> list[int]:
    """A raw completion prompt: no template and no ids added; tag text in it (`<|user|>`) still
    becomes the tag's id, so a client can write a chat prompt by hand."""
    if not isinstance(text_input, str) or not text_input:
        raise ChatRequestError("text_input", "a non-empty string", describe(text_input))
    return tokenizer(text_input, add_special_tokens=False).input_ids


def load_json_field(field: str, text: str | bytes | None) -> object:
    """A request field that arrives as JSON text (Triton's `messages`, `tools`, `tool_choice`);
    empty or missing is None. A bare "auto"/"none"/"required" is accepted unquoted."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if text is None or not text.strip():
        return None
    if text.strip() in CHOICES:
        return text.strip()
    try:
        return json.loads(text)
    except ValueError as error:
        raise ChatRequestError(field, "JSON text", f"invalid JSON ({error}): {describe(text)}") from None
