"""OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, and where errors come from:
request validation (400, naming the field), the API key (401), the model name (404), Triton's
answers (400 for a request it refused, naming the field; 500 otherwise) and Triton being out
of reach (503)."""

from __future__ import annotations

import re
from typing import get_args

from pydantic import BaseModel, ValidationError

INVALID_REQUEST = "invalid_request_error"

# The project's request errors read "FIELD: ..." (ChatRequestError, SamplingParamsError, the
# engine's RequestError); Triton puts "in ensemble 'flint', " in front.
_TRITON_PREFIX = re.compile(r"^in ensemble '[^']*', (\[request id: [^\]]*\] )?")
_FIELD_MESSAGE = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")
# the roots of the fields a request error may name (request tensors and sampling fields)
_REQUEST_FIELDS = frozenset((
    "text_input", "input_ids", "messages", "tools", "tool_choice", "chat_template_kwargs", "chat_options", "prompt",
    "sampling_parameters", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "min_tokens", "stop_token_ids", "ignore_eos", "logit_bias",
    "stop_words", "stream", "exclude_input_in_output", "logprobs", "guided_json", "cache_salt"))
# a Triton field -> the request's name for it
_PARAM_NAMES = {"text_input": "prompt", "input_ids": "prompt", "stop_words": "stop",
                "exclude_input_in_output": "echo"}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, INVALID_REQUEST, param, code)


def unsupported(param: str, why: str) -> OpenAIError:
    return bad_request(f"{param}: {why}", param, "unsupported_parameter")


def invalid_api_key() -> OpenAIError:
    return OpenAIError(401, "Incorrect or missing API key: send `Authorization: Bearer <key>`", INVALID_REQUEST,
                       None, "invalid_api_key")


def model_not_found(name: object, served: tuple[str, ...]) -> OpenAIError:
    return OpenAIError(404, f"model: the model {name!r} does not exist; this server serves {', '.join(served)}",
                       INVALID_REQUEST, "model", "model_not_found")


def triton_unavailable(detail: str) -> OpenAIError:
    return OpenAIError(503, f"Triton is unavailable: {detail}", "service_unavailable_error", None,
                       "triton_unavailable")


def internal_error(detail: str) -> OpenAIError:
    return OpenAIError(500, detail, "server_error", None, "internal_error")


def from_validation_error(error: ValidationError, model: type[BaseModel]) -> OpenAIError:
    """pydantic's deepest error (in a union, the branch that got furthest) -> 400 naming the
    field (`stream_options.include_usage`, `stop[1]`)."""
    first = max(error.errors(), key=lambda e: len(e["loc"]))
    path = _field_path(model, first["loc"])
    found = "" if first["type"] == "missing" else f", got {first.get('input')!r}"[:200]
    return bad_request(f"{path}: {first['msg']}{found}", path or None)


def _field_path(model: type[BaseModel] | None, loc: tuple) -> str:
    """Field names and list indexes of a pydantic location; union branch labels are left out."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif model is not None and part in model.model_fields:
            path += ("." if path else "") + part
            annotation = model.model_fields[part].annotation
            model = next((a for a in get_args(annotation) or (annotation,)
                          if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return path


def from_triton_error(message: str, prompt_param: str = "messages",
                      renamed: dict[str, str] | None = None) -> OpenAIError:
    """Triton's answer to a request it refused: 400 naming the field when it is a request
    error, 500 otherwise. `prompt_param` names the prompt ("messages" or "prompt")."""
    text = _TRITON_PREFIX.sub("", message.strip())
    match = _FIELD_MESSAGE.match(text)
    if match is None or re.split(r"[.\[]", match.group(1))[0] not in _REQUEST_FIELDS:
        return internal_error(f"Triton: {text}")
    field = match.group(1).removeprefix("sampling_parameters.")
    root = re.split(r"[.\[]", field)[0]
    param = {"prompt": prompt_param, **_PARAM_NAMES, **(renamed or {})}.get(root, root) + field[len(root):]
    # the engine's refusals of a prompt, or of max_tokens, too long for the context
    code = "context_length_exceeded" if root in ("prompt", "max_tokens") and "fit the context of" in text else None
    return bad_request(param + text[len(match.group(1)):], param, code)
