"""The header timeout and the connection limit (edge/connection_limits.py) on each listener's uvicorn
server, which has neither: uvicorn (httptools) holds a connection that never finishes its headers
forever, and as many connections as arrive. Under it, a lost connection also tells the request it
carried (on_client_gone), and a streamed answer's chunks may be written to the client's transport
straight from the upstream connection's callback (chunk_writer). Runs on the router's event loop.

The frontend's HTTP servers get the same bounds from services/frontend/http_api/connections.py (which
also covers hypercorn); the rule and the answers live in edge/, the uvicorn hooks in each service."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from edge.connection_limits import header_timeout_message, refusal, too_many_message

# The attribute of a uvicorn request cycle (a plain object) that holds what to call when its client leaves.
_ON_GONE = "router_on_client_gone"


def cycle_of(call: Any) -> RequestResponseCycle | None:
    """uvicorn's httptools request cycle behind an ASGI `send` or `receive` (uvicorn passes the app its
    bound methods), or None under another server (the tests' in-process ASGI client). Found from them
    rather than put in the scope: a scope that held its own cycle would be a reference cycle."""
    owner = getattr(call, "__self__", None)
    return owner if type(owner) is RequestResponseCycle else None


def on_client_gone(cycle: RequestResponseCycle, callback: Callable[[], None] | None) -> bool:
    """Have `callback()` called if the client of this request's cycle leaves before its response ends
    (None: no longer), from the connection's own connection_lost: no task waiting on receive() for it.
    False, and nothing done, when the cycle is not one of this protocol's."""
    if not hasattr(cycle, _ON_GONE):
        return False
    setattr(cycle, _ON_GONE, callback)
    return True


def chunk_writer(cycle: RequestResponseCycle) -> Callable[[bytes], bool] | None:
    """For a response under way in chunked encoding (a stream, begun through uvicorn's send): write a
    body piece as the one chunk uvicorn's send would write, at once, and say True; or say False and
    write nothing when the client's transport is paused (backpressure: the caller then sends it through
    uvicorn's send, which waits for the drain) or the client is gone. None when the response is not such."""
    if cycle.chunked_encoding is not True or cycle.response_complete or cycle.scope["method"] == "HEAD":
        return None
    transport, flow = cycle.transport, cycle.flow

    def write(body: bytes) -> bool:
        if flow.write_paused or cycle.disconnected:
            return False
        if body:  # an empty chunk would end the response
            transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    return write


class _Held:
    """A request cycle's transport while uvicorn's send writes its response head: the bytes kept."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


async def start_with_first(cycle: RequestResponseCycle, start: Callable[[], Awaitable[None]], first: bytes) -> bool:
    """`start()` (the response head sent through uvicorn's send, which builds and checks it) with the
    head's bytes held, then written in one transport write with `first`, the body's first piece, as a
    chunk: one syscall and one wake-up of the client fewer per response. False when `first` was not
    written (the response is not chunked, or the client left) and is still to send."""
    transport = cycle.transport
    held = _Held()
    cycle.transport = held  # type: ignore[assignment]  # only write() is called while the head is sent
    try:
        await start()
    finally:
        cycle.transport = transport
    if cycle.chunked_encoding is True and held.data and not cycle.disconnected:
        transport.write(b"%b%x\r\n%b\r\n" % (held.data, len(first), first))
        return True
    if held.data and not cycle.disconnected:  # (uvloop raises on a write to a closed transport)
        transport.write(held.data)
    return False


class LaneStream(Protocol):
    """A request the lane is answering on a connection: told of the connection's events."""

    def gone(self) -> None:
        """The connection was lost before the response ended."""

    def drained(self) -> None:
        """The client's transport, full, takes writes again."""


class LaneConnection(Protocol):
    """What the lane needs of a client connection: its tasks (a hand-over's task joins them, as uvicorn's
    own do, so that shutdown waits for it) and the stream it answers (told of the connection's events:
    the connection's, not a request cycle's, since a pipelined request's cycle replaces the one answered)."""

    tasks: set[asyncio.Task[None]]
    lane_stream: LaneStream | None


class Lane(Protocol):
    """The router's lane (listeners/lane.py), as the connection sees it."""

    enabled: bool

    def wants(self, scope: dict[str, Any]) -> bool: ...

    def take(self, cycle: RequestResponseCycle, connection: LaneConnection) -> bool: ...


def uvicorn_protocol(header_timeout_s: float, max_connections: int,
                     lane: Lane | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with both bounds (uvicorn.Config takes the class as `http`); each
    listener's server counts its own connections. `lane`: offered each request it may want, its body
    whole, before uvicorn's ASGI task would start."""

    class Guarded(_GuardedHttpTools):
        pass

    Guarded.header_timeout_s, Guarded.max_connections = header_timeout_s, max_connections
    # The lane is offered requests through uvicorn's _start_asgi_task (pyproject: uvicorn>=0.55): with a
    # uvicorn without it, no request reaches the lane and every one takes the ASGI path.
    Guarded.lane = lane if lane is not None and lane.enabled and hasattr(HttpToolsProtocol, "_start_asgi_task") \
        else None
    return Guarded


class _GuardedHttpTools(HttpToolsProtocol):
    """One connection. The head timer runs from the connection's opening (for its first request) or
    from a request's first byte (after a keep-alive wait, which uvicorn's own timer bounds) until that
    request's headers are complete; a pipelined request's headers are timed once the request before it
    has been answered, since reading waits for that."""

    header_timeout_s: float
    max_connections: int
    lane: Lane | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._reading_head = False
        self._lane_pending: RequestResponseCycle | None = None  # the lane's, once its body is whole
        self._reading = False  # in data_received: a request parked for its body is decided by its end
        self.lane_stream: LaneStream | None = None  # the request the lane answers on this connection
        if len(self.connections) > self.max_connections:  # this one included
            transport.write(refusal(503, too_many_message(self.max_connections)))
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._reading = True
        try:
            super().data_received(data)
        finally:
            self._reading = False
        pending = self._lane_pending
        if pending is not None:  # its body did not come whole with its head: the ASGI path reads the rest
            self._lane_pending = None
            if not self.transport.is_closing():
                super()._start_asgi_task(pending, self.app)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        lane = self.lane
        if lane is not None and app is self.app and lane.wants(cycle.scope):  # type: ignore[arg-type]
            if cycle.more_body:
                if self._reading:  # its body may come in this read: decided at its end, or the read's
                    self._lane_pending = cycle
                    return
            elif lane.take(cycle, self):
                return
        super()._start_asgi_task(cycle, app)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        cycle = self._lane_pending
        if cycle is not None and cycle is self.cycle and not cycle.more_body:
            self._lane_pending = None
            assert self.lane is not None  # pending only when there is one
            if not self.lane.take(cycle, self):
                super()._start_asgi_task(cycle, self.app)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.lane_stream is not None:
            self.lane_stream.drained()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._lane_pending = None
        if self.lane_stream is not None:
            stream, self.lane_stream = self.lane_stream, None
            stream.gone()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # the client left before its response ended
            gone: Callable[[], None] | None = getattr(cycle, _ON_GONE, None)
            if gone is not None:
                gone()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._disarm()
        super().on_headers_complete()
        if self.cycle is not None:
            setattr(self.cycle, _ON_GONE, None)  # this protocol's: on_client_gone() may watch it

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._reading_head and self._head_timer is None and not self.transport.is_closing():
            self._arm()  # a pipelined request's headers, unfinished while the one before it was answered

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._reading_head:  # a request begun and stalled: say why; a connection that sent nothing just ends
            self.transport.write(refusal(408, header_timeout_message(self.header_timeout_s)))
        self.transport.close()
