"""Request bodies of /v1/chat/completions and /v1/completions, and what they become for Triton.

Types are checked strictly (no "0.5" for a number); value ranges are the engine's and are
checked by Triton, whose refusal names the field. Fields this server cannot honour are a
400 that says so, never silently dropped: suffix, best_of > 1, a response_format type other
than text, json_object or json_schema (these two become the ensemble's `guided_json`). Unknown
fields are ignored, as vLLM does. `n` choices run as n concurrent ensemble requests; with a
`seed`, choice j samples with seed + j, so the choices differ and each is reproducible.
Completion prompts are text or token ids (the ensemble's `input_ids`).
Log probabilities (chat `logprobs` + `top_logprobs`, completions `logprobs`) are the ensemble's
sampling `logprobs`: the top N of the model's raw distribution, N <= 20; completions with
`echo` also ask for the prompt's (`prompt_logprobs`), as lm-eval's loglikelihood requests do.
vLLM's extensions are accepted: top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
stop_token_ids, skip_special_tokens, chat_template_kwargs, guided_json, and cache_salt (a non-empty
string: cached prompt prefixes are reused only between requests with the same salt).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Strict

from flint_backend.openai.errors import bad_request, unsupported

Number = Annotated[float, Strict()]
Integer = Annotated[int, Strict()]
Flag = Annotated[bool, Strict()]
Text = Annotated[str, Strict()]

MAX_CHOICES = 64  # n
MAX_LOGPROBS = 20  # top_logprobs, OpenAI's limit and the engine's (test_protocol.py checks they agree)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
# request field -> sampling_parameters key of the ensemble
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "skip_special_tokens",
                   "logit_bias", "guided_json", "cache_salt")


class StreamOptions(BaseModel):
    include_usage: Flag = False


class GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Text | None = None
    max_tokens: Integer | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: Integer | None = None
    min_p: Number | None = None
    seed: Integer | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[Integer] | None = None
    min_tokens: Integer | None = None
    ignore_eos: Flag | None = None
    skip_special_tokens: Flag | None = None
    logit_bias: dict[str, Number] | None = None
    guided_json: dict[str, Any] | None = None  # vLLM's: a JSON schema the output follows
    cache_salt: Text | None = None  # vLLM's: prefix-cache isolation, a non-empty string
    n: Integer | None = None
    stream: Flag | None = False
    stream_options: StreamOptions | None = None
    user: Text | None = None

    def check(self) -> None:
        if self.n is not None and not 1 <= self.n <= MAX_CHOICES:
            raise bad_request(f"n: expected an integer in [1, {MAX_CHOICES}], got {self.n}", "n")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options: expected only with stream: true", "stream_options")
        if self.cache_salt == "":
            raise bad_request('cache_salt: expected a non-empty string, got ""', "cache_salt")

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling(self, max_tokens: int | None) -> dict:
        """The ensemble's `sampling_parameters` (max_tokens None: null, until the context is full)."""
        params = {name: getattr(self, name) for name in SAMPLING_FIELDS if getattr(self, name) is not None}
        params["max_tokens"] = max_tokens
        if self.stop is not None:
            params["stop"] = [self.stop] if isinstance(self.stop, str) else self.stop
        return params


class ChatCompletionRequest(GenerationRequest):
    messages: list[Any]  # checked by flint_backend.chat (names the field, e.g. messages[1].content)
    tools: list[Any] | None = None
    tool_choice: Text | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    max_completion_tokens: Integer | None = None
    logprobs: Flag | None = None
    top_logprobs: Integer | None = None
    parallel_tool_calls: Flag | None = None  # false: one call at most (serving.tool_constraint)
    response_format: dict[str, Any] | None = None

    def check(self) -> None:
        super().check()
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise bad_request("top_logprobs: expected only with logprobs: true", "top_logprobs")
            _check_logprobs("top_logprobs", self.top_logprobs)
        self.response_schema()  # raises on a bad response_format

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)

    def sampling(self, max_tokens: int | None) -> dict:
        params = super().sampling(max_tokens)
        if self.logprobs:
            params["logprobs"] = self.top_logprobs or 0
        schema = self.response_schema()
        if schema is not None:
            params["guided_json"] = schema
        return params

    def response_schema(self) -> dict | None:
        """The JSON schema response_format asks for: json_object -> any object, json_schema -> its
        `json_schema.schema`; text or none -> None. Raises OpenAIError (400) naming the field."""
        rf = self.response_format
        if rf is None or rf.get("type") == "text":
            return None
        if rf.get("type") == "json_object":
            return {"type": "object"}
        if rf.get("type") == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema", {}) if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise bad_request(f"response_format.json_schema.schema: expected a JSON schema object, "
                                  f"got {schema!r}"[:200], "response_format.json_schema.schema")
            return schema
        raise unsupported("response_format", f'expected type "text", "json_object" or "json_schema", '
                                             f"got {rf.get('type')!r}"[:200])

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def output_limit(self) -> int | None:
        """None: until a stop token or the end of the context (vLLM's chat default); a given limit
        that does not fit the context with the prompt is refused (context_length_exceeded)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(GenerationRequest):
    prompt: Any
    echo: Flag | None = None
    logprobs: Integer | None = None
    suffix: Text | None = None
    best_of: Integer | None = None

    def check(self) -> None:
        super().check()
        if self.logprobs is not None:
            _check_logprobs("logprobs", self.logprobs)
        if self.suffix:
            raise unsupported("suffix", "expected none: the model has no fill-in-the-middle prompt")
        if self.best_of not in (None, 1):
            raise unsupported("best_of", f"expected 1, got {self.best_of}")
        self.prompts()

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def sampling(self, max_tokens: int | None) -> dict:
        params = super().sampling(max_tokens)
        if self.logprobs is not None:
            params["logprobs"] = self.logprobs
            if self.echo:  # the echoed prompt's tokens get theirs too
                params["prompt_logprobs"] = self.logprobs
        return params

    def prompts(self) -> list[str | list[int]]:
        """OpenAI's four forms: a string, a list of strings, a list of token ids, or a list of such
        lists -> one prompt (text or token ids) a choice."""
        what = "a string, a list of strings, a list of token ids or a list of lists of token ids"
        if isinstance(self.prompt, str) or _token_ids(self.prompt):
            prompts = [self.prompt]
        elif isinstance(self.prompt, list) and self.prompt:
            prompts = self.prompt
        else:
            raise bad_request(f"prompt: expected {what}, got {self.prompt!r}"[:200], "prompt")
        for i, prompt in enumerate(prompts):
            if not ((isinstance(prompt, str) and prompt) or _token_ids(prompt)):
                name = "prompt" if len(prompts) == 1 and prompts[0] is self.prompt else f"prompt[{i}]"
                raise bad_request(f"{name}: expected a non-empty string or a non-empty list of token ids "
                                  f"(integers >= 0), got {prompt!r}"[:200], "prompt")
        return prompts

    def output_limit(self) -> int:
        return COMPLETIONS_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens


def choice_sampling(sampling: dict, choice: int) -> dict:
    """The sampling parameters of choice `choice` of n: a given seed becomes seed + choice."""
    if choice == 0 or sampling.get("seed") is None:
        return sampling
    return {**sampling, "seed": sampling["seed"] + choice}


def _token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def _check_logprobs(param: str, value: int) -> None:
    if not 0 <= value <= MAX_LOGPROBS:
        raise bad_request(f"{param}: expected an integer in [0, {MAX_LOGPROBS}], got {value}", param)
