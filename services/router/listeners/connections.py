"""The header timeout and the connection limit (edge/connection_limits.py) on each listener's uvicorn
server, which has neither: uvicorn (httptools) holds a connection that never finishes its headers
forever, and as many connections as arrive. Runs on the router's event loop.

The frontend's HTTP servers get the same bounds from services/frontend/http_api/connections.py (which
also covers hypercorn); the rule and the answers live in edge/, the uvicorn hooks in each service."""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from edge.connection_limits import header_timeout_message, refusal, too_many_message


def uvicorn_protocol(header_timeout_s: float, max_connections: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with both bounds (uvicorn.Config takes the class as `http`); each
    listener's server counts its own connections."""

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
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._disarm()
        super().on_headers_complete()

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
