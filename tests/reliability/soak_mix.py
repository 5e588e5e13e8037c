"""The soak's mixed requests, drawn from a seeded random.Random: raw text, token ids, chat with
tools and thinking, chat without, logprobs, guided JSON, seeded sampling pairs, the oracle's
greedy prompts and a few bad requests, through every door, streamed or not, some cancelled by
their client. Each planned request knows what its outcome must satisfy."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from traffic import CANCELLED, ERROR, FINISH_REASONS, OK, Outcome, Request

TRITON_DOORS = ("grpc", "http", "http_stream")
CANCEL_SHARE = 0.25
GUIDED_SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
                 "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]
WORDS = "the quick brown fox jumps over a lazy dog while Triton serves Flint on two cores".split()


@dataclass
class Planned:
    kind: str
    request: Request
    expected_text: str | None = None   # the exact text (greedy reference)
    exact_tokens: int | None = None    # num_output_tokens (ignore_eos, no stop strings)
    pair: int | None = None            # seeded pairs: same text as the other request of the pair
    error_field: str | None = None     # a bad request: a clean error naming this field

    def problem(self, outcome: Outcome) -> str | None:
        """What is wrong with the outcome, or None."""
        if outcome.status == CANCELLED:
            return None if self.request.cancel_after is not None else "cancelled without leaving"
        if self.error_field is not None:
            if outcome.status != ERROR or self.error_field not in outcome.error:
                return f"expected an error naming {self.error_field}"
            if outcome.http_status not in (None, 400):
                return f"expected HTTP 400, got {outcome.http_status}"
            return None
        if outcome.status != OK:
            return "expected a final response"
        if outcome.finish_reason not in FINISH_REASONS:
            return f"finish_reason {outcome.finish_reason!r}"
        if self.expected_text is not None and outcome.text != self.expected_text:
            return f"text {outcome.text!r} != the oracle's {self.expected_text!r}"
        if self.exact_tokens is not None and outcome.num_output_tokens != self.exact_tokens:
            return f"{outcome.num_output_tokens} output tokens, expected {self.exact_tokens}"
        if self.kind == "logprobs" and outcome.logprobs != outcome.num_output_tokens:
            return f"{outcome.logprobs} logprob entries for {outcome.num_output_tokens} tokens"
        if self.kind == "guided":
            try:
                value = json.loads(outcome.text)
            except ValueError:
                return f"guided output is not JSON: {outcome.text!r}"
            if set(value) != {"answer"} or value["answer"] not in ("yes", "no") or outcome.finish_reason != "stop":
                return f"guided output {outcome.text!r} ({outcome.finish_reason}) does not follow the schema"
        return None


class Mix:
    def __init__(self, rng: random.Random, tokenizer, reference_texts: dict, pairs_from: int = 0):
        self.rng, self.tokenizer, self.references = rng, tokenizer, reference_texts
        self.pairs = pairs_from

    def draw(self, n: int) -> list[Planned]:
        planned: list[Planned] = []
        kinds = ("reference", "text", "ids", "chat_tools", "chat_plain", "logprobs", "guided", "pair", "bad")
        weights = (2, 3, 2, 3, 2, 2, 2, 2, 1)
        while len(planned) < n:
            kind = self.rng.choices(kinds, weights)[0]
            planned += getattr(self, kind)()
        for p in planned:
            if p.error_field is None and p.kind != "reference" and self.rng.random() < CANCEL_SHARE:
                p.request.cancel_after = self.rng.randint(1, 3) if p.request.stream else self.rng.uniform(0.05, 2.0)
        return planned[:n]

    # ------------------------------------------------------------------ helpers
    def _door(self, *extra: str) -> tuple[str, bool]:
        door = self.rng.choice(TRITON_DOORS + extra)
        stream = {"http": False, "http_stream": True}.get(door, self.rng.random() < 0.5)
        return door, stream

    def _prompt(self) -> str:
        return " ".join(self.rng.choices(WORDS, k=self.rng.randint(1, 24)))

    def _max_tokens(self) -> int:
        return self.rng.randint(2, 24) if self.rng.random() < 0.9 else self.rng.randint(48, 96)

    def _triton(self, kind: str, door: str, stream: bool, inputs: dict, **planned) -> Planned:
        if door != "http":
            inputs = {**inputs, "stream": stream}
        return Planned(kind, Request(door, inputs=inputs, stream=stream), **planned)

    def _openai(self, kind: str, door: str, stream: bool, body: dict, **planned) -> Planned:
        if stream:
            body = {**body, "stream_options": {"include_usage": True}}
        return Planned(kind, Request(door, body={"model": "flint", **body}, stream=stream), **planned)

    # ------------------------------------------------------------------ kinds
    def reference(self) -> list[Planned]:
        from reference_texts import N_TOKENS

        prompt, (_, expected) = self.rng.choice(sorted(self.references.items()))
        door, stream = self._door("completions")
        fields = {"max_tokens": N_TOKENS, "temperature": 0.0, "ignore_eos": True}
        if door == "completions":
            return [self._openai("reference", door, stream, {"prompt": prompt, **fields},
                                 expected_text=expected, exact_tokens=N_TOKENS)]
        return [self._triton("reference", door, stream, {"text_input": prompt, **fields},
                             expected_text=expected, exact_tokens=N_TOKENS)]

    def text(self) -> list[Planned]:
        door, stream = self._door("completions")
        n, seed, prompt = self._max_tokens(), self.rng.randrange(2**32), self._prompt()
        stops = self.rng.sample(WORDS, 2) if self.rng.random() < 0.3 else None
        exact = None if stops else n
        if door == "completions":
            body = {"prompt": prompt, "max_tokens": n, "temperature": 1.0, "seed": seed, "ignore_eos": True,
                    **({"stop": stops} if stops else {})}
            return [self._openai("text", door, stream, body, exact_tokens=exact)]
        inputs = {"text_input": prompt, "max_tokens": n, "temperature": 1.0, "seed": seed, "ignore_eos": True,
                  **({"stop_words": stops} if stops else {})}
        return [self._triton("text", door, stream, inputs, exact_tokens=exact)]

    def ids(self) -> list[Planned]:
        door, stream = self._door("completions")
        n = self._max_tokens()
        ids = self.tokenizer(self._prompt(), add_special_tokens=False).input_ids
        fields = {"max_tokens": n, "temperature": 0.7, "top_k": 50, "ignore_eos": True}
        if door == "completions":
            return [self._openai("ids", door, stream, {"prompt": ids, **fields}, exact_tokens=n)]
        return [self._triton("ids", door, stream, {"input_ids": ids, **fields}, exact_tokens=n)]

    def _chat(self, kind: str, thinking: bool, tools: bool, sampling: dict | None = None,
              openai: dict | None = None, max_tokens: int | None = None) -> Planned:
        door, stream = self._door("chat")
        messages = [{"role": "user", "content": self._prompt()}]
        if self.rng.random() < 0.3:
            messages = [{"role": "system", "content": "Be brief."}, *messages,
                        {"role": "assistant", "content": self._prompt()}, {"role": "user", "content": "And?"}]
        n = max_tokens or self._max_tokens()
        chat = {"messages": messages, "chat_template_kwargs": {"enable_thinking": thinking},
                **({"tools": TOOLS, "tool_choice": self.rng.choice(["auto", "none", "required"])} if tools else {})}
        if door == "chat":
            return self._openai(kind, door, stream, {**chat, "max_tokens": n, "temperature": 1.0,
                                                     "seed": self.rng.randrange(2**31), **(openai or {})})
        inputs = {k: json.dumps(v) for k, v in chat.items()}
        inputs.update(max_tokens=n, temperature=1.0, seed=self.rng.randrange(2**32))
        if sampling:
            inputs["sampling_parameters"] = json.dumps(sampling)
        return self._triton(kind, door, stream, inputs)

    def chat_tools(self) -> list[Planned]:
        return [self._chat("chat_tools", thinking=True, tools=True)]

    def chat_plain(self) -> list[Planned]:
        return [self._chat("chat_plain", thinking=self.rng.random() < 0.5, tools=False)]

    def logprobs(self) -> list[Planned]:
        door, stream = self._door("chat", "completions")
        n, k = self._max_tokens(), self.rng.randint(0, 5)
        if door == "chat":
            body = {"messages": [{"role": "user", "content": self._prompt()}], "max_tokens": n, "ignore_eos": True,
                    "logprobs": True, "top_logprobs": k, "chat_template_kwargs": {"enable_thinking": False}}
            return [self._openai("logprobs", door, stream, body, exact_tokens=n)]
        if door == "completions":
            body = {"prompt": self._prompt(), "max_tokens": n, "ignore_eos": True, "logprobs": k,
                    "echo": self.rng.random() < 0.3}
            return [self._openai("logprobs", door, stream, body, exact_tokens=n)] if not body["echo"] else \
                [self._openai("logprobs_echo", door, stream, body, exact_tokens=n)]
        params = {"logprobs": k, "prompt_logprobs": self.rng.randint(0, 3), "ignore_eos": True}
        return [self._triton("logprobs", door, stream, {"text_input": self._prompt(), "max_tokens": n,
                                                         "sampling_parameters": json.dumps(params)}, exact_tokens=n)]

    def guided(self) -> list[Planned]:
        door, stream = self._door("chat", "completions")
        if door == "chat":
            schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": GUIDED_SCHEMA}}
            return [self._chat("guided", thinking=False, tools=False, sampling={"guided_json": GUIDED_SCHEMA},
                               openai={"response_format": schema}, max_tokens=48)]
        if door == "completions":
            return [self._openai("guided", door, stream, {"prompt": self._prompt(), "max_tokens": 48,
                                                          "temperature": 1.0, "guided_json": GUIDED_SCHEMA})]
        params = {"guided_json": GUIDED_SCHEMA, "temperature": 1.0, "seed": self.rng.randrange(2**32)}
        return [self._triton("guided", door, stream, {"text_input": self._prompt(), "max_tokens": 48,
                                                       "sampling_parameters": json.dumps(params)})]

    def pair(self) -> list[Planned]:
        """The same prompt and seed through two doors: the same text (sampling depends on the seed only)."""
        self.pairs += 1
        prompt, n, seed = self._prompt(), self._max_tokens(), self.rng.randrange(2**31)
        planned = []
        for _ in range(2):
            door, stream = self._door("completions")
            if door == "completions":
                planned.append(self._openai("pair", door, stream, {"prompt": prompt, "max_tokens": n, "seed": seed,
                                                                   "temperature": 1.0, "ignore_eos": True},
                                            exact_tokens=n, pair=self.pairs))
            else:
                planned.append(self._triton("pair", door, stream, {"text_input": prompt, "max_tokens": n, "seed": seed,
                                                                   "temperature": 1.0, "ignore_eos": True},
                                            exact_tokens=n, pair=self.pairs))
        return planned

    def bad(self) -> list[Planned]:
        door, stream = self._door("chat", "completions")
        if door in ("chat", "completions"):
            prompt = {"messages": [{"role": "user", "content": "hi"}]} if door == "chat" else {"prompt": "hi"}
            return [self._openai("bad", door, stream, {**prompt, "max_tokens": 4, "temperature": -1.0},
                                 error_field="temperature")]
        field, inputs = self.rng.choice([
            ("max_tokens", {"text_input": "hi", "max_tokens": -3}),
            ("temperature", {"text_input": "hi", "max_tokens": 4, "temperature": -2.0}),
            ("sampling_parameters.temprature", {"text_input": "hi", "sampling_parameters": '{"temprature": 1}'}),
            ("messages", {"messages": '[{"role": "user"', "max_tokens": 4}),
        ])
        return [self._triton("bad", door, stream, inputs, error_field=field)]


def pair_problems(planned: list[Planned], outcomes: list[Outcome]) -> list[str]:
    texts: dict[int, list[str]] = {}
    for p, outcome in zip(planned, outcomes):
        if p.pair is not None and outcome.status == OK:
            texts.setdefault(p.pair, []).append(outcome.text)
    return [f"pair {pair}: texts differ {found!r}" for pair, found in texts.items() if len(set(found)) > 1]
