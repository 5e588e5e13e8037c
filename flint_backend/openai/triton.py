"""The `flint` ensemble over tritonclient's asyncio gRPC streaming: one stream per request.

Every request is sent on the streaming RPC (decoupled models answer nowhere else), with
`triton_enable_empty_final_response` so that the end is always marked. Leaving the
`generate` iterator early (the client went away, a task was cancelled) cancels the RPC;
Triton then cancels the ensemble request and the postprocessor aborts the engine request,
which frees its KV cache.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import AsyncIterator, TypeVar

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from flint_backend.openai.errors import OpenAIError, from_triton_error, internal_error, triton_unavailable

UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
NOT_SERVED = ("Request for unknown model", "is not ready", "is not found")  # Triton's words for a missing model
T = TypeVar("T")


@dataclass
class EnsembleRequest:
    """The ensemble's inputs; JSON fields as decoded values (None: not sent)."""
    request_id: str
    sampling: dict
    text_input: str | None = None
    input_ids: list[int] | None = None        # a prompt as token ids, instead of text_input
    chat: dict = field(default_factory=dict)  # messages, tools, tool_choice, chat_template_kwargs, chat_options
    flags: dict[str, bool] = field(default_factory=dict)  # BOOL inputs: parallel_tool_calls
    stream: bool = False
    echo: bool = False
    prompt_param: str = "messages"            # the name the client gave the prompt, for errors
    renamed: dict[str, str] = field(default_factory=dict)  # Triton field -> the client's name

    def inputs(self) -> list[grpcclient.InferInput]:
        texts = {"sampling_parameters": json.dumps(self.sampling)}
        if self.text_input is not None:
            texts["text_input"] = self.text_input
        texts.update({k: json.dumps(v) for k, v in self.chat.items() if v is not None})
        tensors = [_tensor(name, text.encode(), "BYTES", np.object_) for name, text in texts.items()]
        if self.input_ids is not None:
            ids = grpcclient.InferInput("input_ids", [1, len(self.input_ids)], "INT32")
            ids.set_data_from_numpy(np.array([self.input_ids], dtype=np.int32))
            tensors.append(ids)
        tensors.append(_tensor("stream", self.stream, "BOOL", np.bool_))
        tensors += [_tensor(name, value, "BOOL", np.bool_) for name, value in self.flags.items()]
        if self.echo:
            tensors.append(_tensor("exclude_input_in_output", False, "BOOL", np.bool_))
        return tensors


@dataclass
class EnsembleOutput:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # deltas when streaming, whole calls otherwise
    finish_reason: str = ""                                # set on the last output
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0                             # of the prompt's, those the prefix cache held
    logprobs: list[dict] = field(default_factory=list)    # chat.token_logprobs entries of this output's tokens
    prompt_logprobs: list[dict] = field(default_factory=list)  # the prompt tokens' entries (first output)


def _tensor(name: str, value, triton_type: str, dtype) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1, 1], triton_type)
    tensor.set_data_from_numpy(np.array([[value]], dtype=dtype))
    return tensor


def _text(result, name: str) -> str:
    array = result.as_numpy(name)
    return "" if array is None else array.reshape(-1)[0].decode("utf-8")


def _count(result, name: str) -> int:
    array = result.as_numpy(name)
    return 0 if array is None else int(array.reshape(-1)[0])


def _output(result) -> EnsembleOutput:
    calls, logprobs, prompt_logprobs = (_text(result, n) for n in ("tool_calls", "logprobs", "prompt_logprobs"))
    return EnsembleOutput(_text(result, "text_output"), _text(result, "reasoning_output"),
                          json.loads(calls) if calls else [], _text(result, "finish_reason"),
                          _count(result, "num_input_tokens"), _count(result, "num_output_tokens"),
                          _count(result, "num_cached_tokens"), json.loads(logprobs or "[]"),
                          json.loads(prompt_logprobs or "[]"))


class TritonEnsemble:
    def __init__(self, url: str, model: str):
        self.url, self.model = url, model
        self._client = grpcaio.InferenceServerClient(url)

    async def close(self) -> None:
        await self._client.close()

    async def generate(self, request: EnsembleRequest) -> AsyncIterator[EnsembleOutput]:
        """The ensemble's responses that carry outputs; raises OpenAIError (400, 500, 503)."""
        async def requests():
            yield {"model_name": self.model, "inputs": request.inputs(), "request_id": request.request_id,
                   "parameters": {"triton_enable_empty_final_response": True}}

        call = self._client.stream_infer(requests())
        try:
            async for result, error in call:
                if error is not None:
                    raise self._refusal(error.message(), request)
                response = result.get_response()
                if response.outputs:
                    yield _output(result)
                if response.parameters["triton_final_response"].bool_param:
                    return
            raise triton_unavailable(f"the stream of {self.model} ended before its final response")
        except grpc.aio.AioRpcError as error:
            raise self._rpc_error(error) from None
        finally:
            call.cancel()  # no-op when the stream is complete; otherwise Triton cancels the request

    def _refusal(self, message: str, request: EnsembleRequest) -> OpenAIError:
        if any(words in message for words in NOT_SERVED):
            return triton_unavailable(f"model {self.model!r}: {message}")
        return from_triton_error(message, request.prompt_param, request.renamed)

    def _rpc_error(self, error: grpc.aio.AioRpcError) -> OpenAIError:
        if error.code() in UNREACHABLE:
            return triton_unavailable(f"{self.url}: {error.code().name}: {error.details()}")
        return from_triton_error(f"{error.code().name}: {error.details()}")

    async def ready(self) -> tuple[bool, str]:
        """(ready, why not): the server is ready and so is the ensemble."""
        try:
            if not await self._client.is_server_ready():
                return False, f"Triton at {self.url} is not ready"
            if not await self._client.is_model_ready(self.model):
                return False, f"model {self.model!r} is not ready on Triton at {self.url}"
        except (InferenceServerException, grpc.aio.AioRpcError) as error:
            return False, f"Triton at {self.url}: {error}"
        return True, ""

    async def input_names(self) -> set[str]:
        metadata = await self._client.get_model_metadata(self.model, as_json=True)
        return {i["name"] for i in metadata.get("inputs", [])}


async def collect(stream: AsyncIterator[EnsembleOutput]) -> list[EnsembleOutput]:
    outputs = [output async for output in stream]
    if not outputs:
        raise internal_error("Triton answered without outputs")
    return outputs


async def collect_all(streams: list[AsyncIterator[EnsembleOutput]]) -> list[list[EnsembleOutput]]:
    """Every stream's outputs; the first error (or a cancel) cancels the other requests."""
    tasks = [asyncio.ensure_future(collect(s)) for s in streams]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def first_of(stream: AsyncIterator[T]) -> T:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        raise internal_error("Triton answered without outputs") from None


async def merge(streams: list[AsyncIterator[EnsembleOutput]]) -> AsyncIterator[tuple[int, EnsembleOutput]]:
    """(stream index, output) as they come; the first error ends it, and leaving it early
    cancels every stream (and so its Triton request)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[EnsembleOutput]) -> None:
        try:
            async for output in stream:
                await queue.put((i, output, None))
            await queue.put((i, None, None))
        except Exception as error:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, None, error))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(tasks)
        while open_streams:
            i, output, error = await queue.get()
            if error is not None:
                raise error
            if output is None:
                open_streams -= 1
            else:
                yield i, output
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
