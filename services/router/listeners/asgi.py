"""ASGI plumbing of the router's listeners (router process): the request body read under a size limit
and a deadline, JSON responses, the response state of a request, the disconnect watcher, and lifespan.
Raw ASGI: the hot path stays thin."""
from __future__ import annotations

import asyncio
import enum
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from edge.connection_limits import BodyClock
from services.router.errors import HTTPError
from services.router.listeners.connections import cycle_of

JSON = [(b"content-type", b"application/json")]
LOOP_SLACK_S = 0.05  # a timer this late is punctual; later, this loop was busy and the client not to blame


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

    @property
    def raw(self) -> Send:
        """The server's send: for middle pieces of a body (more_body), which change no state."""
        return self._send

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


async def read_body(scope: Scope, receive: Receive, limit: int, timeout_s: float) -> bytes:
    """The whole request body; 413 past `limit` bytes (told by content-length, or counted as it comes);
    408 with `connection: close` when it stops arriving (edge.connection_limits.BodyClock: no bytes for
    `timeout_s`, or too slow)."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise HTTPError(413, f"request body is {int(value)} bytes; the limit is {limit}")
    cycle = cycle_of(receive)
    if cycle is not None and not cycle.more_body:
        # Under uvicorn, a body that arrived whole with its head (most do): receive() returns it at once,
        # so there is no deadline to keep, and no timer to arm and cancel.
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        body: bytes = message.get("body", b"")
        if len(body) > limit:
            raise HTTPError(413, f"request body exceeds the limit of {limit} bytes")
        return body
    loop = asyncio.get_running_loop()
    clock = BodyClock(timeout_s, loop.time())
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await _receive_by(receive, clock, loop)
        if message["type"] == "http.disconnect":
            raise ClientGone
        if message["type"] != "http.request":
            continue
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HTTPError(413, f"request body exceeds the limit of {limit} bytes")
        clock.received(len(chunk), loop.time())
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _receive_by(receive: Receive, clock: BodyClock, loop: asyncio.AbstractEventLoop) -> Message:
    """The next message, or 408 at the clock's deadline (receive() cancelled then, as asyncio.timeout
    does: one timer, no task). A deadline passed while this loop was busy elsewhere is credited to the
    client, not blamed on it: bytes that came meanwhile reach receive() a few turns later."""
    task = asyncio.current_task()
    assert task is not None  # a request is always read in a task
    cancelling = task.cancelling()
    expired = False
    handle: asyncio.TimerHandle

    def at_deadline() -> None:
        nonlocal handle, expired
        late = loop.time() - clock.deadline()
        if late > LOOP_SLACK_S:
            clock.credit(late + LOOP_SLACK_S)
            handle = loop.call_at(clock.deadline(), at_deadline)
            return
        expired = True
        task.cancel()

    handle = loop.call_at(clock.deadline(), at_deadline)
    try:
        return await receive()
    except asyncio.CancelledError:
        if expired and task.uncancel() <= cancelling:
            raise HTTPError(408, clock.message(), headers=[(b"connection", b"close")]) from None
        raise
    finally:
        handle.cancel()


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
