"""What passes between the Triton steps, the one module both sides of each hop import:
flint_tokenizer -> flint_postprocess (`OutputConfig`, JSON riding through flint_model),
flint_model -> flint_postprocess (`EngineChunk`) and flint_postprocess -> client (`TextDelta`);
the chunks and deltas as tensors, in the batch form ([1, n]) every flint model uses."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from flint_backend.serving.tensors import Inputs, bytes_tensor, scalar

# logprobs and prompt_logprobs: only in responses that carry some (_logprob_arrays)
CHUNK_OUTPUTS = ("request_key", "chunk_index", "token_ids", "finished", "finish_reason", "num_input_tokens",
                 "num_output_tokens", "num_cached_tokens", "error", "output_config", "logprobs", "prompt_logprobs")
TEXT_OUTPUTS = ("text_output", "reasoning_output", "tool_calls", "finish_reason", "num_input_tokens",
                "num_output_tokens", "num_cached_tokens", "logprobs", "prompt_logprobs")


@dataclass
class OutputConfig:
    """Per request, for flint_postprocess; travels as JSON through the model step."""
    stream: bool = False
    echo: str = ""                     # text put in front of the output
    prompt_tail: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    skip_special_tokens: bool = True
    chat: dict | None = None           # ChatOutputParser arguments; None: plain text output

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "OutputConfig":
        return cls(**json.loads(text))


@dataclass
class EngineChunk:
    """One flint_model response."""
    key: str
    index: int                  # 0, 1, 2, ... per request
    token_ids: list[int]
    finished: bool
    finish_reason: str = ""     # the engine's: "stop", "length", "abort", "error"; "rejected": refused at admission
    num_input_tokens: int = 0
    num_output_tokens: int = 0  # generated so far
    error: str = ""
    config: str = ""            # OutputConfig JSON, on index 0
    logprobs: list = field(default_factory=list)  # per token (logprob, [(id, logprob), ...]); [] if not asked
    prompt_logprobs: list = field(default_factory=list)  # per prompt token (id, logprob | None, top), once
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (on every chunk)


@dataclass
class TextDelta:
    """One flint response."""
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)  # token_logprobs entries of this delta's tokens
    prompt_logprobs: list[dict] = field(default_factory=list)  # entries of the prompt's tokens, once
    finish_reason: str = ""     # set on the final one: "stop", "length", "tool_calls", "abort", "error"
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # of num_input_tokens, those the engine took from its prefix cache
    final: bool = False
    error: str = ""
    client_error: bool = False  # the request was refused (bad input), not a server fault
    note: str = ""              # e.g. an unmet tool_choice, for the log

    def is_empty(self) -> bool:
        return not (self.text or self.reasoning or self.tool_calls or self.logprobs or self.prompt_logprobs
                    or self.final)


def chunk_arrays(chunk: EngineChunk) -> dict[str, np.ndarray]:
    return {
        "request_key": bytes_tensor(chunk.key),
        "chunk_index": np.array([[chunk.index]], np.int32),
        "token_ids": np.array(chunk.token_ids, np.int32).reshape(1, -1),
        "finished": np.array([[chunk.finished]], np.bool_),
        "finish_reason": bytes_tensor(chunk.finish_reason),
        "num_input_tokens": np.array([[chunk.num_input_tokens]], np.uint32),
        "num_output_tokens": np.array([[chunk.num_output_tokens]], np.uint32),
        "num_cached_tokens": np.array([[chunk.num_cached_tokens]], np.uint32),
        "error": bytes_tensor(chunk.error),
        "output_config": bytes_tensor(chunk.config),
        **_logprob_arrays(chunk.logprobs, chunk.prompt_logprobs),
    }


def chunk_from_arrays(inputs: Inputs) -> EngineChunk:
    ids = inputs.get("token_ids")
    return EngineChunk(
        key=scalar(inputs, "request_key"), index=int(scalar(inputs, "chunk_index")),
        token_ids=[int(t) for t in ids.reshape(-1)] if ids is not None else [],
        finished=bool(scalar(inputs, "finished")), finish_reason=scalar(inputs, "finish_reason") or "",
        num_input_tokens=int(scalar(inputs, "num_input_tokens") or 0),
        num_output_tokens=int(scalar(inputs, "num_output_tokens") or 0),
        num_cached_tokens=int(scalar(inputs, "num_cached_tokens") or 0),
        error=scalar(inputs, "error") or "", config=scalar(inputs, "output_config") or "",
        logprobs=json.loads(scalar(inputs, "logprobs") or "[]"),
        prompt_logprobs=json.loads(scalar(inputs, "prompt_logprobs") or "[]"))


def text_arrays(delta: TextDelta) -> dict[str, np.ndarray]:
    return {
        "text_output": bytes_tensor(delta.text),
        "reasoning_output": bytes_tensor(delta.reasoning),
        "tool_calls": bytes_tensor(json.dumps(delta.tool_calls, ensure_ascii=False)),
        "finish_reason": bytes_tensor(delta.finish_reason),
        "num_input_tokens": np.array([[delta.num_input_tokens]], np.uint32),
        "num_output_tokens": np.array([[delta.num_output_tokens]], np.uint32),
        "num_cached_tokens": np.array([[delta.num_cached_tokens]], np.uint32),
        **_logprob_arrays(delta.logprobs, delta.prompt_logprobs),
    }


def _logprob_arrays(logprobs: list, prompt_logprobs: list) -> dict[str, np.ndarray]:
    """The optional `logprobs` / `prompt_logprobs` tensors (JSON), only where there are some: a
    request that did not ask for them gets no extra tensors in its responses (as vllm_backend's
    additional outputs)."""
    named = {"logprobs": logprobs, "prompt_logprobs": prompt_logprobs}
    return {name: bytes_tensor(json.dumps(value, ensure_ascii=False)) for name, value in named.items() if value}
