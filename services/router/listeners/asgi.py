"""ASGI plumbing of the router's listeners (router process): the request body read under a size limit,
JSON responses, the response state of a request, the disconnect watcher, and lifespan. Raw ASGI but
for starlette's body reading: the hot path stays thin."""
from __future__ import annotations

import asyncio
import enum
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive, Scope, Send

from services.router.errors import HTTPError

JSON = [(b"content-type", b"application/json")]


class ClientGone(Exception):
    """The client disconnected while its request body was being read."""


class ResponseState(enum.Enum):
    NOT_STARTED = "not started"  # a status can still be sent
    STARTED = "started"  # the head went out: too late for another status
    COMPLETE = "complete"  # the last body message went out


class TrackedSend:
    """The ASGI send of one request, keeping its response state."""

    __slots__ = ("_send", "counted", "state")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.state = ResponseState.NOT_STARTED
        self.counted = False  # in router_requests_total already

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.state = ResponseState.STARTED
        elif not message.get("more_body", False):
            self.state = ResponseState.COMPLETE
        await self._send(message)

    async def end(self) -> None:
        """Finish a response that started and broke off: the client sees it end short."""
        if self.state is ResponseState.STARTED:
            await self({"type": "http.response.body", "body": b"", "more_body": False})


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body; 413 past `limit` bytes (told by content-length, or counted as it comes)."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise HTTPError(413, f"request body is {int(value)} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in Request(scope, receive).stream():  # starlette's reading of http.request messages
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone from None
    return b"".join(chunks)


async def send_json(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*JSON, (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def watch_disconnect(receive: Receive, task: asyncio.Task[Any], gone: asyncio.Event,
                           send: TrackedSend) -> None:
    """A client leaving shows only as http.disconnect from receive(). uvicorn also returns it once the
    response is complete, which must not cancel the handler's remaining bookkeeping."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if send.state is not ResponseState.COMPLETE:
                gone.set()
                task.cancel()
            return


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
