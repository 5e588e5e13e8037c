"""Per-request sampling parameters, validated on construction (errors name the field, the value
and what was expected). Served requests are validated once, where they enter the engine
(serving.engine_host, for the ensemble and for direct flint_model clients alike): the
flint_tokenizer step only gathers and types the settings (serving.generate_request).

Stop *strings* are not handled here: they are matched on detokenized text in one place,
`flint_backend.chat` (the postprocessor and the OpenAI server), which then aborts the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

MAX_LOGPROBS = 20


class SamplingParamsError(ValueError):
    """`FIELD: DETAIL` (the value found and what was expected), the field path kept in `.field`."""

    def __init__(self, field: str, detail: str):
        super().__init__(f"{field}: {detail}")
        self.field = field


@dataclass
class SamplingParams:
    temperature: float = 1.0          # 0 -> greedy
    top_p: float = 1.0                # (0, 1]
    top_k: int = 0                    # 0 or -1 -> no top-k
    min_p: float = 0.0                # [0, 1]
    repetition_penalty: float = 1.0   # > 0; 1 -> off (prompt and output tokens, HF/vLLM convention)
    presence_penalty: float = 0.0     # [-2, 2], output tokens (OpenAI convention)
    frequency_penalty: float = 0.0    # [-2, 2], output tokens
    seed: int | None = None           # same seed -> same tokens, whatever else is in the batch
    max_tokens: int | None = None     # None -> until the context is full; more than the context leaves: refused
    default_max_tokens: int | None = None  # without max_tokens: at most this many, clamped to the context (a
                                           #   server's default, which must not refuse a long prompt)
    min_tokens: int = 0               # stop tokens are suppressed until this many tokens exist
    stop_token_ids: list[int] | None = None  # None -> the model's stop tokens
    ignore_eos: bool = False          # keep going past stop tokens (benchmarks)
    logprobs: int | None = None       # None -> none; N -> the sampled token's and the top-N logprobs
    prompt_logprobs: int | None = None  # None -> none; N -> each prompt token's (after the first) and the top N
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    guided_json: dict | None = None   # a JSON schema the output must follow (engine.guided)
    guided_start_token_id: int | None = None  # the schema applies after this token (None: from the first)
    structural_tag: dict | None = None  # xgrammar's structural tag (vLLM's field): tool calls held to their
                                        #   format and schemas from the first token (serving.tool_constraint)
    cache_salt: str | None = None     # prefix-cache isolation (vLLM's field): cached prefixes are shared only
                                      #   between requests with the same salt (engine.prefix_cache)

    def __post_init__(self):
        self.validate()

    @classmethod
    def from_dict(cls, data: dict) -> "SamplingParams":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SamplingParamsError(unknown[0],
                                      f"got the unknown field(s) {unknown}, expected fields of {sorted(known)}")
        data = dict(data)
        if data.get("logit_bias"):
            data["logit_bias"] = {int(k): float(v) for k, v in data["logit_bias"].items()}
        return cls(**{k: v for k, v in data.items() if v is not None})  # None -> the default

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        _number(self.temperature, "temperature", lo=0.0, hi=None, what=">= 0")
        _number(self.top_p, "top_p", lo=0.0, hi=1.0, lo_open=True, what="in (0, 1]")
        _integer(self.top_k, "top_k", lo=-1, what="-1, 0 (off) or a positive integer")
        _number(self.min_p, "min_p", lo=0.0, hi=1.0, what="in [0, 1]")
        _number(self.repetition_penalty, "repetition_penalty", lo=0.0, hi=None, lo_open=True, what="> 0")
        _number(self.presence_penalty, "presence_penalty", lo=-2.0, hi=2.0, what="in [-2, 2]")
        _number(self.frequency_penalty, "frequency_penalty", lo=-2.0, hi=2.0, what="in [-2, 2]")
        if self.seed is not None:
            _integer(self.seed, "seed", lo=None, what="an integer")
        for name in ("max_tokens", "default_max_tokens"):
            if getattr(self, name) is not None:
                _integer(getattr(self, name), name, lo=1, what="a positive integer")
        _integer(self.min_tokens, "min_tokens", lo=0, what="an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingParamsError("min_tokens",
                                      f"got {self.min_tokens}, expected at most max_tokens={self.max_tokens}")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, (list, tuple)) or not all(
                    isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
                raise SamplingParamsError("stop_token_ids",
                                          f"got {self.stop_token_ids!r}, expected a list of token ids")
        if not isinstance(self.ignore_eos, bool):
            raise SamplingParamsError("ignore_eos", f"got {self.ignore_eos!r}, expected true or false")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _integer(getattr(self, name), name, lo=0, hi=MAX_LOGPROBS,
                         what=f"an integer in [0, {MAX_LOGPROBS}]")
        if self.guided_json is not None and not isinstance(self.guided_json, dict):
            raise SamplingParamsError("guided_json",
                                      f"got {self.guided_json!r}"[:187] + ", expected a JSON schema object")
        if self.structural_tag is not None:
            if not isinstance(self.structural_tag, dict) or self.structural_tag.get("type") != "structural_tag":
                raise SamplingParamsError("structural_tag", f"got {self.structural_tag!r}"[:187]
                                          + ', expected an object {"type": "structural_tag", "format": ...}')
            if self.guided_json is not None:
                raise SamplingParamsError("structural_tag", "expected no structural_tag with guided_json (one "
                                          "grammar a request)")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            raise SamplingParamsError("cache_salt", f"got {self.cache_salt!r}"[:187] + ", expected a non-empty string")
        if self.guided_start_token_id is not None:
            _integer(self.guided_start_token_id, "guided_start_token_id", lo=0, what="a token id")
        for token, bias in self.logit_bias.items():
            _integer(token, "logit_bias key", lo=0, what="a token id")
            _number(bias, f"logit_bias[{token}]", lo=-100.0, hi=100.0, what="in [-100, 100]")


def _number(value, name, lo, hi, what, lo_open=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        raise SamplingParamsError(name, f"got {value!r}, expected a number {what}")


def _integer(value, name, lo, what, hi=None):
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and lo is not None:
        ok = value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        raise SamplingParamsError(name, f"got {value!r}, expected {what}")
