"""A client that goes away cancels its Triton requests.

Streaming: Starlette stops the response when the client disconnects, and `EventStream`
then closes the event generator, which closes the ensemble stream (cancelling the RPC).
Not streaming (and while a stream waits for its first output): `until_disconnected` polls
the connection and cancels the waiting task."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import AsyncIterator, Awaitable, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

POLL_S = 0.25
T = TypeVar("T")


class ClientGone(Exception):
    pass


class EventStream(StreamingResponse):
    """SSE whose generator is closed however the response ends."""

    def __init__(self, events: AsyncIterator[str]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def until_disconnected(request: Request, awaitable: Awaitable[T]) -> T:
    """The awaitable's result, or ClientGone (after cancelling it) once the client has left."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
