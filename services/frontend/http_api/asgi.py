"""The frontend's own ASGI plumbing for the lean generation routes: read the body, send a JSON
response, watch for the client leaving. Runs on each API server process's event loop."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from edge.connection_limits import BodyClock
from services.frontend.engine_client.inflight import CLIENT_GONE
from services.frontend.errors import APIError
from services.frontend.http_api.response_start import start_response

JSON_HEADERS = [(b"content-type", b"application/json")]
CLOSE = [(b"connection", b"close")]  # with a 408: the rest of a stalled body is not waited for
LOOP_SLACK_S = 0.05  # a timer this late is punctual; later, this loop was busy and the client not to blame


class ClientGone(Exception):
    """The client disconnected before its request body was read: there is no one to answer."""


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of a request header (`name` in lower case, as ASGI gives names)."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


async def read_body(scope: Scope, receive: Receive, limit: int, timeout_s: float) -> bytes:
    """The whole request body; 413 past `limit` bytes, refused early when content-length says so; 408 when
    it stops arriving (edge.connection_limits.BodyClock: no bytes for `timeout_s`, or too slow), which the
    caller answers with `connection: close` (CLOSE)."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise APIError(413, f"request body is {int(value)} bytes; the limit is {limit}")
    loop = asyncio.get_running_loop()
    clock = BodyClock(timeout_s, loop.time())
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive() if _arrived(receive) else await _receive_by(receive, clock, loop)
        if message["type"] == "http.disconnect":
            raise ClientGone
        if message["type"] != "http.request":
            continue
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes")
        clock.received(len(chunk), loop.time())
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _arrived(receive: Receive) -> bool:
    """uvicorn's receive() with its next message already there (the usual case: a small body comes in
    the packet of its headers), which it returns at once: no deadline to arm."""
    cycle = getattr(receive, "__self__", None)
    return type(cycle) is RequestResponseCycle and cycle.message_event.is_set()


async def _receive_by(receive: Receive, clock: BodyClock, loop: asyncio.AbstractEventLoop) -> Message:
    """The next message, or 408 at the clock's deadline (receive() cancelled then, as asyncio.timeout
    does: one timer, no task). A deadline passed while this loop was busy elsewhere is credited to the
    client, not blamed on it: bytes that came meanwhile reach receive() a few turns later."""
    task = asyncio.current_task()
    assert task is not None  # a request is always read in a task
    cancelling = task.cancelling()
    deadline = _Deadline(clock, loop, task)
    try:
        return await receive()
    except asyncio.CancelledError:
        if deadline.expired and task.uncancel() <= cancelling:
            raise APIError(408, clock.message()) from None
        raise
    finally:
        deadline.cancel()


class _Deadline:
    """The timer of one receive(): at the clock's deadline it cancels the reading task, unless this loop
    itself was late (then the lateness is credited and the timer set again)."""

    __slots__ = ("_clock", "_handle", "_loop", "_task", "expired")

    def __init__(self, clock: BodyClock, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self._clock, self._loop, self._task = clock, loop, task
        self.expired = False
        self._handle: asyncio.TimerHandle | None = loop.call_at(clock.deadline(), self._fire)

    def _fire(self) -> None:
        late = self._loop.time() - self._clock.deadline()
        if late > LOOP_SLACK_S:
            self._clock.credit(late + LOOP_SLACK_S)
            self._handle = self._loop.call_at(self._clock.deadline(), self._fire)
            return
        self.expired = True
        self._task.cancel()

    def cancel(self) -> None:
        # The handle holds self._fire, which holds this: dropped here, so that the read's objects (its
        # task among them) are freed by their counts, not left in a cycle for the collector to find.
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def send_json(send: Send, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await start_response(send, {"type": "http.response.start", "status": status,
                                "headers": JSON_HEADERS + headers if headers else JSON_HEADERS},
                         {"type": "http.response.body", "body": body, "more_body": False})


async def watch_disconnect(receive: Receive, on_disconnect: Callable[[str], None]) -> None:
    """hypercorn speaks ASGI 2.1: the only way to see a client leave is to keep reading receive()."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            on_disconnect(CLIENT_GONE)
            return
