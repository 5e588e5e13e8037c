"""ASGI middleware in front of every route: the API key on /v1/*, and request counts.

Plain ASGI rather than Starlette's BaseHTTPMiddleware, so that a streaming response still
sees its client's disconnect (and cancels the Triton request)."""

from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse

from flint_backend.openai.errors import OpenAIError, invalid_api_key
from flint_backend.openai.metrics import ServerMetrics

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
GENERATION = ("/v1/chat/completions", "/v1/completions")  # what requests_running counts (not its own scrape)


def error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


class Gate:
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

        running = int(endpoint in GENERATION)
        self.metrics.running += running
        try:
            await self.app(scope, receive, counted_send)
        finally:
            self.metrics.running -= running
            self.metrics.observe(endpoint, status)

    def _authorized(self, scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, key = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), self.api_key.encode())
