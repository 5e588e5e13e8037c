"""Tensors between the steps, in the batch form ([1, n]) every flint model uses:
flint_model -> flint_postprocess (`EngineChunk`) and flint_postprocess -> client (`TextDelta`)."""

from __future__ import annotations

import json

import numpy as np

from flint_backend.serving.postprocess import EngineChunk, TextDelta
from flint_backend.serving.tensors import Inputs, bytes_tensor, scalar

# logprobs and prompt_logprobs: only in responses that carry some (_logprob_arrays)
CHUNK_OUTPUTS = ("request_key", "chunk_index", "token_ids", "finished", "finish_reason", "num_input_tokens",
                 "num_output_tokens", "error", "output_config", "logprobs", "prompt_logprobs")
TEXT_OUTPUTS = ("text_output", "reasoning_output", "tool_calls", "finish_reason", "num_input_tokens",
                "num_output_tokens", "logprobs", "prompt_logprobs")


def chunk_arrays(chunk: EngineChunk) -> dict[str, np.ndarray]:
    return {
        "request_key": bytes_tensor(chunk.key),
        "chunk_index": np.array([[chunk.index]], np.int32),
        "token_ids": np.array(chunk.token_ids, np.int32).reshape(1, -1),
        "finished": np.array([[chunk.finished]], np.bool_),
        "finish_reason": bytes_tensor(chunk.finish_reason),
        "num_input_tokens": np.array([[chunk.num_input_tokens]], np.uint32),
        "num_output_tokens": np.array([[chunk.num_output_tokens]], np.uint32),
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
        **_logprob_arrays(delta.logprobs, delta.prompt_logprobs),
    }


def _logprob_arrays(logprobs: list, prompt_logprobs: list) -> dict[str, np.ndarray]:
    """The optional `logprobs` / `prompt_logprobs` tensors (JSON), only where there are some: a
    request that did not ask for them gets no extra tensors in its responses (as vllm_backend's
    additional outputs)."""
    named = {"logprobs": logprobs, "prompt_logprobs": prompt_logprobs}
    return {name: bytes_tensor(json.dumps(value, ensure_ascii=False)) for name, value in named.items() if value}
