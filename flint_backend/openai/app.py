"""The FastAPI app: routes over the ensemble, with the Gate (API key, counts) in front.

A streaming response starts only once the ensemble's first output is in, so a request that
Triton refuses (a prompt over the context, a sampling value out of range) still gets its
4xx status; errors after that arrive as an SSE error event followed by `[DONE]`.
Handlers find the server's state on `request.app.state`: `args`, `ensemble`, `http` (for
Triton's /metrics), `metrics`, `started`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from typing import TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from flint_backend.openai import chat, completions
from flint_backend.openai.disconnect import ClientGone, EventStream, until_disconnected
from flint_backend.openai.errors import (INVALID_REQUEST, OpenAIError, bad_request, from_validation_error,
                                         model_not_found, triton_unavailable)
from flint_backend.openai.gate import Gate, error_response
from flint_backend.openai.metrics import ServerMetrics, scrape
from flint_backend.openai.protocol import ChatCompletionRequest, CompletionRequest
from flint_backend.openai.responses import Envelope
from flint_backend.openai.server_args import ServerArgs
from flint_backend.openai.triton import TritonEnsemble, collect_all, first_of, merge

log = logging.getLogger("flint_backend.openai")

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; only the access log sees it
Body = TypeVar("Body", bound=BaseModel)


def build_app(args: ServerArgs) -> FastAPI:
    app = FastAPI(title="Flint OpenAI-compatible server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.args, app.state.metrics, app.state.started = args, ServerMetrics(), int(time.time())
    app.add_middleware(Gate, api_key=args.api_key, metrics=app.state.metrics)
    app.add_exception_handler(OpenAIError, openai_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ClientGone, client_gone)
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", text_completions, methods=["POST"])
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/v1/models/{name:path}", get_model, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics_text, methods=["GET"])
    return app


@asynccontextmanager
async def lifespan(app: FastAPI):
    args: ServerArgs = app.state.args
    app.state.ensemble = TritonEnsemble(args.triton_url, args.model)
    app.state.http = httpx.AsyncClient()
    await check_repository(app.state.ensemble)
    try:
        yield
    finally:
        await app.state.http.aclose()
        await app.state.ensemble.close()


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


# --- errors --------------------------------------------------------------------------------


async def openai_error(_: Request, error: OpenAIError) -> JSONResponse:
    return error_response(error)


async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    message = f"{request.method} {request.url.path}: {error.detail}"
    return error_response(OpenAIError(error.status_code, message, INVALID_REQUEST))


async def client_gone(request: Request, _: ClientGone) -> Response:
    log.info("%s %s: client disconnected, Triton request cancelled", request.method, request.url.path)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


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


def served_name(request: Request, model: str | None) -> str:
    """The name to answer with; a request without `model` goes to the first served name."""
    names = request.app.state.args.model_names
    if model is None:
        return names[0]
    if model not in names:
        raise model_not_found(model, names)
    return model


# --- routes --------------------------------------------------------------------------------


async def chat_completions(request: Request):
    body = await parse_body(request, ChatCompletionRequest)
    kind = "chat.completion.chunk" if body.stream else "chat.completion"
    envelope = Envelope.new("chatcmpl", kind, served_name(request, body.model))
    requests, tool_choice = chat.ensemble_requests(body, envelope.id, request.app.state.args.chat)
    streams = [request.app.state.ensemble.generate(r) for r in requests]
    if not body.stream:
        outputs = await until_disconnected(request, collect_all(streams))
        return JSONResponse(chat.completion(envelope, outputs, tool_choice, body.wants_logprobs))
    merged = merge(streams)
    first = await until_disconnected(request, first_of(merged))
    return EventStream(chat.chunks(envelope, first, merged, len(requests), body.include_usage, tool_choice,
                                   body.wants_logprobs))


async def text_completions(request: Request):
    body = await parse_body(request, CompletionRequest)
    envelope = Envelope.new("cmpl", "text_completion", served_name(request, body.model))
    ensemble = request.app.state.ensemble
    streams = [ensemble.generate(r) for r in completions.ensemble_requests(body, envelope.id)]
    if not body.stream:
        outputs = await until_disconnected(request, collect_all(streams))
        return JSONResponse(completions.completion(envelope, outputs, body.choices, body.wants_logprobs))
    merged = merge(streams)
    first = await until_disconnected(request, first_of(merged))
    return EventStream(completions.chunks(envelope, first, merged, body.include_usage, body.choices,
                                          body.wants_logprobs))


def model_card(request: Request, name: str) -> dict:
    return {"id": name, "object": "model", "created": request.app.state.started, "owned_by": "flint",
            "root": request.app.state.args.model}


async def list_models(request: Request):
    return {"object": "list", "data": [model_card(request, name) for name in request.app.state.args.model_names]}


async def get_model(request: Request, name: str):
    return model_card(request, served_name(request, name))


async def health(request: Request):
    ready, why = await request.app.state.ensemble.ready()
    if not ready:
        return error_response(triton_unavailable(why))
    args = request.app.state.args
    return {"status": "ok", "triton_url": args.triton_url, "model": args.model}


async def metrics_text(request: Request):
    state = request.app.state
    triton = await scrape(state.http, state.args.metrics_url)
    text = (triton.rstrip("\n") + "\n" if triton else "") + state.metrics.render(triton is not None)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
