"""Requests to a tritonserver and an OpenAI server through every front door, as asyncio tasks,
each ending in an Outcome: a final response, a clean error, a client cancellation, or lost.

Front doors: Triton gRPC streaming (tritonclient.grpc.aio, one stream a request, as the OpenAI
server calls it), Triton HTTP `generate` and `generate_stream`, and the OpenAI server's
/v1/chat/completions and /v1/completions, streamed or not. A request given `cancel_after`
leaves after that many responses (streamed) or that many seconds (not streamed): the client
closes its stream or connection, as a user pressing ^C does. Every wait is bounded: a request
that neither finishes nor fails within its timeout is `lost`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import grpc
import httpx

from triton_server import grpc_inputs

OK, ERROR, CANCELLED, LOST = "final", "error", "cancelled", "lost"
FINISH_REASONS = {"stop", "length", "tool_calls"}


@dataclass
class Outcome:
    status: str                   # OK, ERROR, CANCELLED or LOST
    text: str = ""
    reasoning: str = ""
    finish_reason: str = ""
    num_output_tokens: int = 0
    logprobs: int = 0             # logprob entries received
    tool_calls: list = field(default_factory=list)
    http_status: int | None = None
    error: str = ""
    responses: int = 0            # responses (streamed events) that carried outputs


@dataclass
class Request:
    """One request: `inputs` are the ensemble's (Triton doors) or `body` the OpenAI body."""
    door: str                     # grpc, http, http_stream, chat, completions
    inputs: dict = field(default_factory=dict)
    body: dict = field(default_factory=dict)
    stream: bool = False
    cancel_after: float | None = None   # responses (streamed) or seconds (not streamed)
    timeout: float = 180.0


class Doors:
    """The clients of one tritonserver (and optionally one OpenAI server), for one event loop."""

    def __init__(self, triton, openai_url: str | None = None, api_key: str | None = None):
        import tritonclient.grpc.aio as grpcaio

        self.triton, self.openai_url = triton, openai_url
        self.grpc = grpcaio.InferenceServerClient(triton.grpc_url)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)  # a connection a request
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=10), headers=headers)
        self._ids = 0

    async def close(self) -> None:
        await self.grpc.close()
        await self.http.aclose()

    async def send(self, request: Request) -> Outcome:
        run = {"grpc": self._grpc, "http": self._http, "http_stream": self._http_stream,
               "chat": self._openai, "completions": self._openai}[request.door]
        task = asyncio.ensure_future(run(request))
        budget = request.timeout
        if request.cancel_after is not None and not request.stream:
            budget = request.cancel_after  # a client that leaves after so many seconds
        done, _ = await asyncio.wait({task}, timeout=budget)
        if done:
            error = task.exception()
            if isinstance(error, (httpx.TransportError, grpc.aio.AioRpcError)):  # e.g. the server went away
                return Outcome(ERROR, error=f"{type(error).__name__}: {error}")
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if request.cancel_after is not None and not request.stream:
            return Outcome(CANCELLED)
        return Outcome(LOST, error=f"no final response or error within {request.timeout:.0f} s")

    # ------------------------------------------------------------------ Triton gRPC
    async def _grpc(self, request: Request) -> Outcome:
        self._ids += 1
        inputs = grpc_inputs(**request.inputs)

        async def requests():
            yield {"model_name": "flint", "inputs": inputs, "request_id": f"r{self._ids}",
                   "parameters": {"triton_enable_empty_final_response": True}}

        out = Outcome(LOST)
        call = self.grpc.stream_infer(requests())
        try:
            async for result, error in call:
                if error is not None:
                    return Outcome(ERROR, error=error.message())
                response = result.get_response()
                if response.outputs:
                    _add_tensors(out, result)
                    if _leaves(request, out):
                        return Outcome(CANCELLED, responses=out.responses)
                if response.parameters["triton_final_response"].bool_param:
                    out.status = OK
                    return out
            out.error = "the stream ended before its final response"
            return out
        except grpc.aio.AioRpcError as error:  # the client's error: the server went away, or refused the stream
            return Outcome(ERROR, error=f"gRPC {error.code().name}: {error.details()}")
        finally:
            call.cancel()

    # ------------------------------------------------------------------ Triton HTTP
    def _triton_url(self, endpoint: str) -> str:
        return f"http://{self.triton.http_url}/v2/models/flint/{endpoint}"

    async def _http(self, request: Request) -> Outcome:
        response = await self.http.post(self._triton_url("generate"), content=_json(request.inputs))
        return _triton_http_outcome(response.status_code, response.content)

    async def _http_stream(self, request: Request) -> Outcome:
        out = Outcome(LOST)
        async with self.http.stream("POST", self._triton_url("generate_stream"),
                                    content=_json(request.inputs)) as response:
            out.http_status = response.status_code
            async for data in _sse_data(response):
                event = json.loads(data)
                if "error" in event:
                    return Outcome(ERROR, http_status=response.status_code, error=str(event["error"]))
                _add_event(out, event)
                if _leaves(request, out):
                    return Outcome(CANCELLED, responses=out.responses)
        if out.finish_reason:
            out.status = OK
        else:
            out.error = "the event stream ended without a finish_reason"
        return out

    # ------------------------------------------------------------------ OpenAI server
    async def _openai(self, request: Request) -> Outcome:
        url = f"{self.openai_url}/v1/{'chat/completions' if request.door == 'chat' else 'completions'}"
        body = {**request.body, "stream": request.stream}
        if not request.stream:
            response = await self.http.post(url, json=body)
            if response.status_code != 200:
                return _openai_error(response.status_code, response.content)
            return _openai_whole(response.json())
        out = Outcome(LOST)
        async with self.http.stream("POST", url, json=body) as response:
            out.http_status = response.status_code
            if response.status_code != 200:
                return _openai_error(response.status_code, await response.aread())
            async for data in _sse_data(response):
                if data == "[DONE]":
                    out.status = OK if out.finish_reason else LOST
                    out.error = "" if out.finish_reason else "[DONE] without a finish_reason"
                    return out
                chunk = json.loads(data)
                if "error" in chunk:
                    return Outcome(ERROR, http_status=200, error=json.dumps(chunk["error"]))
                _add_chunk(out, chunk)
                if _leaves(request, out):
                    return Outcome(CANCELLED, responses=out.responses)
        out.error = "the event stream ended without [DONE]"
        return out


def _json(value: dict) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


def _leaves(request: Request, out: Outcome) -> bool:
    return request.stream and request.cancel_after is not None and out.responses >= request.cancel_after


async def _sse_data(response: httpx.Response):
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            yield line[len("data: "):]


def _text(result, name: str) -> str:
    array = result.as_numpy(name)
    return "" if array is None else array.reshape(-1)[0].decode("utf-8")


def _add_tensors(out: Outcome, result) -> None:
    out.responses += 1
    out.text += _text(result, "text_output")
    out.reasoning += _text(result, "reasoning_output")
    out.tool_calls += json.loads(_text(result, "tool_calls") or "[]")
    out.finish_reason = _text(result, "finish_reason") or out.finish_reason
    count = result.as_numpy("num_output_tokens")
    out.num_output_tokens = int(count.reshape(-1)[0]) if count is not None else out.num_output_tokens
    out.logprobs += len(json.loads(_text(result, "logprobs") or "[]"))


def _add_event(out: Outcome, event: dict) -> None:
    out.responses += 1
    out.text += event.get("text_output", "")
    out.reasoning += event.get("reasoning_output", "")
    out.tool_calls += json.loads(event.get("tool_calls") or "[]")
    out.finish_reason = event.get("finish_reason") or out.finish_reason
    out.num_output_tokens = event.get("num_output_tokens", out.num_output_tokens)
    out.logprobs += len(json.loads(event.get("logprobs") or "[]"))


def _triton_http_outcome(status: int, content: bytes) -> Outcome:
    try:
        body = json.loads(content)
    except ValueError:
        return Outcome(LOST, http_status=status, error=f"not JSON: {content[:200]!r}")
    if status != 200:
        return Outcome(ERROR, http_status=status, error=str(body.get("error", body)))
    out = Outcome(OK, http_status=status)
    _add_event(out, body)
    return out


def _openai_error(status: int, content: bytes) -> Outcome:
    try:
        error = json.loads(content)["error"]
        return Outcome(ERROR, http_status=status, error=json.dumps(error))
    except (ValueError, KeyError, TypeError):
        return Outcome(ERROR, http_status=status, error=f"not OpenAI's error shape: {content[:200]!r}")


def _openai_whole(body: dict) -> Outcome:
    choice = body["choices"][0]
    message = choice.get("message")
    out = Outcome(OK, http_status=200, finish_reason=choice["finish_reason"] or "", responses=1,
                  num_output_tokens=body["usage"]["completion_tokens"])
    if message is not None:
        out.text = message.get("content") or ""
        out.reasoning = message.get("reasoning_content") or ""
        out.tool_calls = message.get("tool_calls") or []
        logprobs = choice.get("logprobs")
        out.logprobs = len(logprobs["content"]) if logprobs else 0
    else:
        out.text = choice["text"]
        out.logprobs = len(choice["logprobs"]["tokens"]) if choice.get("logprobs") else 0
    return out


def _add_chunk(out: Outcome, chunk: dict) -> None:
    if chunk.get("usage"):
        out.num_output_tokens = chunk["usage"]["completion_tokens"]
    for choice in chunk.get("choices", []):
        out.responses += 1
        delta = choice.get("delta")
        if delta is not None:
            out.text += delta.get("content") or ""
            out.reasoning += delta.get("reasoning_content") or ""
            out.tool_calls += delta.get("tool_calls") or []
            logprobs = choice.get("logprobs")
            out.logprobs += len(logprobs["content"]) if logprobs else 0
        else:
            out.text += choice.get("text", "")
            out.logprobs += len(choice["logprobs"]["tokens"]) if choice.get("logprobs") else 0
        out.finish_reason = choice.get("finish_reason") or out.finish_reason
