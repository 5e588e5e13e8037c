"""The `flint` ensemble's inputs -> one generation request (validated; errors name the field).

Sampling settings come from three places, later ones winning: defaults, the
`sampling_parameters` JSON (vllm_backend style: values may be JSON numbers/booleans or
their text, e.g. "0.7"), then the individual tensors (`temperature`, `max_tokens`, ...,
TRT-LLM style; `min_length` is another name for `min_tokens`). Stop strings come from
`stop_words` (TRT-LLM) and `sampling_parameters.stop` (vLLM), together.
`sampling_parameters.guided_json` (vLLM's): a JSON schema the output follows (engine.guided).
`sampling_parameters.logprobs` = N (vLLM's): each response's `logprobs` output then holds, per
generated token, its logprob and the top N (serving.postprocess); `prompt_logprobs` = N the
same for the prompt's tokens, in the `prompt_logprobs` output of the first response.
`sampling_parameters.cache_salt` (vLLM's): a non-empty string; cached prompt prefixes are
shared only between requests with the same salt (engine.prefix_cache).
`max_tokens` given (tensor or sampling_parameters) is checked against the context by the engine
(prompt + max_tokens over it is refused, as vLLM does); `sampling_parameters.max_tokens` null runs
until the context is full (vLLM's None); neither, the repository's `default_max_tokens`
applies, clamped to the context.
`chat_options` (JSON, ChatOptions fields) replaces the repository's chat flags for one chat
request: the OpenAI server sends its own flags with each request this way.
Here the settings are gathered and typed (a value of the wrong type is a SamplingParamsError
naming the field); their values are validated once, where flint_model hands them to the engine
(serving.engine_host: SamplingParams).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from flint_backend.chat.chat_options import ChatOptions
from flint_backend.chat.request import load_json_field
from flint_backend.chat.request_error import ChatRequestError, describe
from flint_backend.engine.sampling_params import SamplingParamsError
from flint_backend.serving.tensors import Inputs, scalar, strings

# tensor -> SamplingParams field
TENSOR_FIELDS = {
    "max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
    "min_p": "min_p", "seed": "seed", "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "min_tokens": "min_tokens", "min_length": "min_tokens", "ignore_eos": "ignore_eos",
}
FLOAT_KEYS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
INT_KEYS = ("top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs")
BOOL_KEYS = ("ignore_eos", "skip_special_tokens")
# sampling_parameters keys besides the typed ones above
OTHER_KEYS = ("stop", "stop_token_ids", "logit_bias", "n", "guided_json", "cache_salt")
CHAT_FIELDS = ("messages", "tools", "tool_choice", "chat_template_kwargs")


@dataclass
class GenerateRequest:
    text_input: str | None              # a raw prompt, or None for a chat request or token ids
    input_ids: list[int] | None = None  # a prompt as token ids (no template), instead of text_input
    chat: dict = field(default_factory=dict)  # messages, tools, tool_choice, chat_template_kwargs (decoded JSON)
    chat_options: ChatOptions | None = None   # None: the repository's flags
    parallel_tool_calls: bool = True          # false: one tool call at most (serving.tool_constraint)
    sampling: dict = field(default_factory=dict)  # SamplingParams fields, typed, not yet validated
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    exclude_input_in_output: bool = True
    skip_special_tokens: bool = True


def parse_generate_request(inputs: Inputs, default_max_tokens: int = 16) -> GenerateRequest:
    text_input = scalar(inputs, "text_input")
    input_ids = _token_ids(inputs)
    chat = {name: load_json_field(name, scalar(inputs, name)) for name in CHAT_FIELDS}
    if text_input is not None and not isinstance(text_input, str):
        raise ChatRequestError("text_input", "a string", describe(text_input))
    prompts = [name for name, given in (("text_input", text_input is not None), ("input_ids", input_ids is not None),
                                        ("messages", chat["messages"] is not None)) if given]
    if len(prompts) > 1:
        raise ChatRequestError(prompts[0], f"either {prompts[0]} or {prompts[1]}, not both", "both")
    if not prompts:
        raise ChatRequestError("text_input", "a prompt in text_input (or token ids in input_ids), "
                                             "or chat messages in messages", "neither")
    if text_input is not None or input_ids is not None:
        given = {**chat, "parallel_tool_calls": scalar(inputs, "parallel_tool_calls")}
        extra = next((name for name, value in given.items() if value is not None), None)
        if extra is not None:
            raise ChatRequestError(extra, "no value without messages (it applies to chat requests)",
                                   describe(given[extra]))
    sampling = _sampling_json(scalar(inputs, "sampling_parameters"))
    settings = {} if "max_tokens" in sampling else {"default_max_tokens": default_max_tokens}
    settings.update(sampling)
    stop = _stop_list(settings.pop("stop", None)) + strings(inputs, "stop_words")
    settings.update({f: _tensor_value(inputs, t, f) for t, f in TENSOR_FIELDS.items() if scalar(inputs, t) is not None})
    skip_special = settings.pop("skip_special_tokens", True)
    if settings.pop("n", 1) != 1:
        raise _sampling_error("sampling_parameters.n", "1 (one output per request)", settings.get("n"))
    options = load_json_field("chat_options", scalar(inputs, "chat_options"))
    return GenerateRequest(
        text_input=text_input, input_ids=input_ids, chat={k: v for k, v in chat.items() if v is not None},
        chat_options=None if options is None else ChatOptions.from_request(options),
        sampling=settings, stop=[s for s in stop if s],
        parallel_tool_calls=_flag(inputs, "parallel_tool_calls", True),
        stream=_flag(inputs, "stream", False),
        exclude_input_in_output=_flag(inputs, "exclude_input_in_output", True),
        skip_special_tokens=skip_special)


def _token_ids(inputs: Inputs) -> list[int] | None:
    """`input_ids` [1, n] (or [n]) of non-negative ids; the engine checks them against the vocabulary."""
    array = inputs.get("input_ids")
    if array is None:
        return None
    ids = array.reshape(-1).tolist()
    if not ids:
        raise ChatRequestError("input_ids", "at least one token id", "none")
    bad = next((t for t in ids if not isinstance(t, int) or t < 0), None)
    if bad is not None:
        raise ChatRequestError("input_ids", "non-negative token ids", describe(bad))
    return ids


def _flag(inputs: Inputs, name: str, default: bool) -> bool:
    value = scalar(inputs, name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ChatRequestError(name, "a BOOL tensor", describe(value))
    return value


def _tensor_value(inputs: Inputs, name: str, key: str):
    value = scalar(inputs, name)
    if key in BOOL_KEYS:
        return bool(value)
    if key in INT_KEYS:
        return int(value)
    return float(value)


def _sampling_error(field: str, expected: str, value) -> SamplingParamsError:
    return SamplingParamsError(field, f"expected {expected}, got {describe(value)}")


def _json_text(field: str, text: str | None):
    if text is None or not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise SamplingParamsError(field, f"expected JSON text, got invalid JSON ({error}): {describe(text)}") from None


def _sampling_json(text: str | None) -> dict:
    data = _json_text("sampling_parameters", text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _sampling_error("sampling_parameters", "the JSON text of an object", data)
    known = FLOAT_KEYS + INT_KEYS + BOOL_KEYS + OTHER_KEYS
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise _sampling_error(f"sampling_parameters.{unknown[0]}", f"one of the keys {sorted(known)}",
                              data[unknown[0]])
    return {key: _coerce(key, value) for key, value in data.items() if value is not None or key == "max_tokens"}


def _coerce(key: str, value):
    """vllm_backend clients send numbers as text ({"temperature": "0.1"}): accept both."""
    path = f"sampling_parameters.{key}"
    if value is None:  # max_tokens only: until the context is full
        return None
    try:
        if key in BOOL_KEYS:
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if not isinstance(value, bool):
                raise ValueError
            return value
        if key in INT_KEYS + ("n",):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if key in FLOAT_KEYS:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
    except (TypeError, ValueError):
        kind = "true or false" if key in BOOL_KEYS else "an integer" if key in INT_KEYS else "a number"
        raise _sampling_error(path, kind, value) from None
    if key == "stop_token_ids" and not (isinstance(value, list) and all(isinstance(t, int) for t in value)):
        raise _sampling_error(path, "a list of token ids", value)
    if key == "logit_bias" and not (isinstance(value, dict) and all(str(k).isdigit() for k in value)):
        raise _sampling_error(path, 'an object {"token id": bias}', value)
    if key == "guided_json":  # vllm_backend clients may send the schema as JSON text
        value = _json_text(path, value) if isinstance(value, str) else value
        if not isinstance(value, dict):
            raise _sampling_error(path, "a JSON schema (an object, or its JSON text)", value)
    if key == "cache_salt" and not (isinstance(value, str) and value):
        raise _sampling_error(path, "a non-empty string", value)
    return value


def _stop_list(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _sampling_error("sampling_parameters.stop", "a string or a list of strings", stop)
    return stop


def sampling_json(settings: dict) -> str:
    """A request's sampling settings -> the JSON the tokenizer step hands the model step."""
    return json.dumps({k: v for k, v in settings.items() if v is not None})
