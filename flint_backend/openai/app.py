"""The FastAPI app: routes, the API key, request counting, and cancelling Triton requests whose
client went away.

A streaming response starts only once the ensemble's first output is in, so a request that
Triton refuses (a prompt over the context, a sampling value out of range) still gets its
4xx status; errors after that arrive as an SSE error event followed by `[DONE]`. A client
that disconnects cancels its Triton stream: streaming, when Starlette stops the response;
not streaming, through a poll of the connection while waiting.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager, suppress
from typing import AsyncIterator, TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from flint_backend.openai import chat, completions
from flint_backend.openai.errors import (OpenAIError, bad_request, from_validation_error, internal_error,
                                         invalid_api_key, model_not_found, triton_unavailable)
from flint_backend.openai.metrics import ServerMetrics, scrape
from flint_backend.openai.protocol import ChatCompletionRequest, CompletionRequest
from flint_backend.openai.responses import Envelope
from flint_backend.openai.server_args import ServerArgs
from flint_backend.openai.triton import EnsembleOutput, TritonEnsemble

log = logging.getLogger("flint_backend.openai")

DISCONNECT_POLL_S = 0.25
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
T = TypeVar("T")
Body = TypeVar("Body", bound=BaseModel)


class ClientGone(Exception):
    pass


class EventStream(StreamingResponse):
    """SSE whose generator is closed however the response ends (so its Triton stream is cancelled)."""

    def __init__(self, events: AsyncIterator[str]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


class Gate:
    """ASGI middleware: the API key on /v1/*, and request counts (plain ASGI, so that
    Starlette still sees a streaming client's disconnect)."""

    def __init__(self, app, api_key: str | None, metrics: ServerMetrics):
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
        if self.api_key and scope["path"].startswith("/v1") and not self._authorized(scope):
            self.metrics.observe(endpoint, 401)
            return await error_response(invalid_api_key())(scope, receive, send)
        status = 500

        async def counted_send(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.running += 1
        try:
            await self.app(scope, receive, counted_send)
        finally:
            self.metrics.running -= 1
            self.metrics.observe(endpoint, status)

    def _authorized(self, scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, key = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), self.api_key.encode())


def error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def parse_body(request: Request, model: type[Body]) -> Body:
    try:
        data = json.loads(await request.body())
    except ValueError as error:
        raise bad_request(f"request body: expected JSON, got invalid JSON ({error})") from None
    if not isinstance(data, dict):
        raise bad_request(f"request body: expected a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise from_validation_error(error, model) from None


async def until_disconnected(request: Request, awaitable) -> T:
    """The awaitable's result, or ClientGone (after cancelling it) once the client has left."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task


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


def build_app(args: ServerArgs) -> FastAPI:
    metrics = ServerMetrics()
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.ensemble = TritonEnsemble(args.triton_url, args.model)
        app.state.http = httpx.AsyncClient()
        await check_repository(app.state.ensemble)
        try:
            yield
        finally:
            await app.state.http.aclose()
            await app.state.ensemble.close()

    app = FastAPI(title="Flint OpenAI-compatible server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(Gate, api_key=args.api_key, metrics=metrics)

    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, error: OpenAIError):
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        message = f"{request.method} {request.url.path}: {error.detail}"
        return error_response(OpenAIError(error.status_code, message, "invalid_request_error", None, None))

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, _: ClientGone):
        log.info("%s %s: client disconnected, Triton request cancelled", request.method, request.url.path)
        return Response(status_code=499)

    def served_name(model: str | None) -> str:
        if model is None:
            return args.model_names[0]
        if model not in args.model_names:
            raise model_not_found(model, args.model_names)
        return model

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse_body(request, ChatCompletionRequest)
        kind = "chat.completion.chunk" if body.stream else "chat.completion"
        envelope = Envelope.new("chatcmpl", kind, served_name(body.model))
        ensemble_request, tool_choice = chat.ensemble_request(body, envelope.id, args.chat)
        stream = app.state.ensemble.generate(ensemble_request)
        if not body.stream:
            outputs = await until_disconnected(request, collect(stream))
            return JSONResponse(chat.completion(envelope, outputs, tool_choice))
        first = await until_disconnected(request, first_of(stream))
        return EventStream(chat.chunks(envelope, first, stream, body.include_usage, tool_choice))

    @app.post("/v1/completions")
    async def text_completions(request: Request):
        body = await parse_body(request, CompletionRequest)
        envelope = Envelope.new("cmpl", "text_completion", served_name(body.model))
        streams = [app.state.ensemble.generate(r) for r in completions.ensemble_requests(body, envelope.id)]
        if not body.stream:
            outputs = await until_disconnected(request, collect_all(streams))
            return JSONResponse(completions.completion(envelope, outputs))
        merged = completions.merge(streams)
        first = await until_disconnected(request, first_of(merged))
        return EventStream(completions.chunks(envelope, first, merged, body.include_usage))

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(name) for name in args.model_names]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str):
        return model_card(served_name(name))

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": started, "owned_by": "flint", "root": args.model}

    @app.get("/health")
    async def health():
        ready, why = await app.state.ensemble.ready()
        if not ready:
            return error_response(triton_unavailable(why))
        return {"status": "ok", "triton_url": args.triton_url, "model": args.model}

    @app.get("/metrics")
    async def metrics_text():
        triton = await scrape(app.state.http, args.metrics_url)
        text = (triton.rstrip("\n") + "\n" if triton else "") + metrics.render(triton is not None)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return app


async def check_repository(ensemble: TritonEnsemble) -> None:
    """Warn at start-up when the ensemble cannot take this server's flags (an older repository)."""
    try:
        names = await asyncio.wait_for(ensemble.input_names(), timeout=5)
    except Exception as error:  # noqa: BLE001 - Triton may come up later; requests get 503 until then
        log.warning("Triton at %s not reachable yet (%s); requests get 503 until it is", ensemble.url, error)
        return
    if "chat_options" not in names:
        log.error("model %r on Triton has no `chat_options` input: chat requests would fail; "
                  "serve this project's model_repository", ensemble.model)
