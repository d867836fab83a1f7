"""The header timeout and the connection limit (edge/connection_limits.py) applied to the frontend's
HTTP servers, neither of which has them: uvicorn (httptools) holds a connection that never finishes its
headers forever, and hypercorn until its keep-alive timeout; neither bounds how many it holds. Under
uvicorn, a lost connection also tells the request it carried (on_client_gone). Runs in each API server
process, on its event loop."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import h11
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.events import Event, Updated
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from edge.connection_limits import header_timeout_message, refusal, too_many_message
from services.frontend.engine_client.inflight import CLIENT_GONE

# The attribute of a uvicorn request cycle (a plain object) that holds what to call when its client leaves.
_ON_GONE = "fleet_on_client_gone"


def on_client_gone(cycle: Any, callback: Callable[[str], None] | None) -> bool:
    """Have `callback(CLIENT_GONE)` called if the client of this request's cycle leaves before its
    response ends (None: no longer), from the connection's own connection_lost: no task waiting on
    receive() for it. False, and nothing done, when the cycle is not one of this protocol's."""
    if not hasattr(cycle, _ON_GONE):
        return False
    setattr(cycle, _ON_GONE, callback)
    return True


def uvicorn_protocol(header_timeout_s: float, max_connections: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with both bounds (uvicorn.Config takes the class as `http`)."""

    class Guarded(_GuardedHttpTools):
        pass

    Guarded.header_timeout_s, Guarded.max_connections = header_timeout_s, max_connections
    return Guarded


class _GuardedHttpTools(HttpToolsProtocol):
    """One connection. The head timer runs from the connection's opening (for its first request) or
    from a request's first byte (after a keep-alive wait, which uvicorn's own timer bounds) until that
    request's headers are complete; a pipelined request's headers are timed once the request before it
    has been answered, since reading waits for that."""

    header_timeout_s: float
    max_connections: int

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._reading_head = False
        if len(self.connections) > self.max_connections:  # this one included
            transport.write(refusal(503, too_many_message(self.max_connections)))
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # the client left before its response ended
            gone: Callable[[str], None] | None = getattr(cycle, _ON_GONE, None)
            if gone is not None:
                gone(CLIENT_GONE)

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


def guard_hypercorn(header_timeout_s: float, max_connections: int) -> None:
    """Make hypercorn's asyncio worker serve each connection with both bounds. hypercorn has no hook
    for its connection handler: its worker looks the class up by name in hypercorn.asyncio.run when a
    connection arrives, so that name is pointed at the subclass below (in this process only)."""
    import hypercorn.asyncio.run as worker

    _GuardedTCPServer.header_timeout_s, _GuardedTCPServer.max_connections = header_timeout_s, max_connections
    worker.TCPServer = _GuardedTCPServer  # type: ignore[misc, assignment]


class _GuardedTCPServer(TCPServer):
    """hypercorn's connection: refused when one too many; reads bounded by the head deadline while a
    request's headers are awaited (hypercorn reports a request begun, and a connection idle again)."""

    header_timeout_s: float = 0.0
    max_connections: int = 0
    open = 0  # this process's connections

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.reader = _HeadReader(self.reader, self.header_timeout_s, self._head_timed_out,  # type: ignore[assignment]
                                  self.idle_task.stop)

    async def _head_timed_out(self, begun: bool) -> None:
        await self.idle_task.stop()
        if begun:  # a request begun and stalled: say why; a connection that sent nothing just ends
            self.writer.write(refusal(408, header_timeout_message(self.header_timeout_s)))
        self.writer.close()

    async def run(self) -> None:
        cls = _GuardedTCPServer
        if cls.open >= self.max_connections:
            self.writer.write(refusal(503, too_many_message(self.max_connections)))
            self.writer.close()
            return
        cls.open += 1
        try:
            await super().run()
        finally:
            cls.open -= 1

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            reader = self.reader
            assert isinstance(reader, _HeadReader)
            # A pipelined request's head may have come while the one before it was answered: h11 holds it.
            connection = getattr(getattr(self.protocol, "protocol", None), "connection", None)
            reader.awaiting_head(event.idle, begun=isinstance(connection, h11.Connection)
                                 and bool(connection.trailing_data[0]))
        await super().protocol_send(event)


class _HeadReader:
    """The connection's StreamReader, its reads bounded by the head deadline while one is set. Past
    it, and at the client's EOF, the connection's idle timer is stopped: hypercorn's read loop ends
    either way, but its connection task would wait for that timer (the keep-alive timeout, 75 s)
    before it closed the socket, holding the connection that long after the client had gone."""

    def __init__(self, reader: asyncio.StreamReader, timeout_s: float,
                 on_timeout: Callable[[bool], Awaitable[None]], on_eof: Callable[[], Awaitable[None]]) -> None:
        self._reader = reader
        self._on_timeout = on_timeout  # called with whether the awaited head had begun
        self._on_eof = on_eof
        self._timeout_s = timeout_s
        self._awaiting = True
        self._begun = False  # bytes of the awaited head have come
        self._deadline: float | None = time.monotonic() + timeout_s  # from the connection's opening

    def awaiting_head(self, idle: bool, *, begun: bool = False) -> None:
        """hypercorn's Updated event: idle again (the next request's head is awaited, timed from its
        first byte, or from now if `begun`: bytes of it came already) or a request's headers received
        (no deadline). hypercorn says idle once at the start too: the head awaited since the opening
        keeps its deadline."""
        if idle and self._awaiting:
            return
        self._awaiting = idle
        self._begun = idle and begun
        self._deadline = time.monotonic() + self._timeout_s if self._begun else None

    def at_eof(self) -> bool:
        return self._reader.at_eof()

    async def read(self, n: int = -1) -> bytes:
        if self._deadline is None:
            data = await self._reader.read(n)
        else:
            try:
                data = await asyncio.wait_for(self._reader.read(n), max(self._deadline - time.monotonic(), 0.0))
            except TimeoutError:
                await self._on_timeout(self._begun)
                raise
        if not data:
            await self._on_eof()
        elif self._awaiting:
            self._begun = True
            if self._deadline is None:
                self._deadline = time.monotonic() + self._timeout_s
        return data
