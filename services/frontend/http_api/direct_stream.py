"""A streamed response's SSE events written in the engine dispatch pass (generation/direct_stream.py)
under uvicorn's httptools protocol: the request's uvicorn RequestResponseCycle, found behind the ASGI
send, as the stream's outlet. Runs on each API server's event loop."""
from __future__ import annotations

import asyncio
from typing import Any, Protocol, cast

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class _Flow(Protocol):
    write_paused: bool


class HttpCycle(Protocol):
    """What is read of uvicorn's httptools RequestResponseCycle: its transport and the state its send keeps."""

    transport: asyncio.Transport
    flow: _Flow
    disconnected: bool
    response_complete: bool
    chunked_encoding: bool | None


def cycle_of(send: Any) -> HttpCycle | None:
    """uvicorn's httptools RequestResponseCycle behind an ASGI `send` (uvicorn passes the app its bound
    send method), or None under another server. Found from the send rather than put in the scope: a
    scope that held its own cycle would be a reference cycle, each request's state left to the collector."""
    owner = getattr(send, "__self__", None)
    return cast(HttpCycle, owner) if type(owner) is RequestResponseCycle else None


# The transports whose socket is the connection's bytes themselves (TLS is a separate transport class).
_PLAIN_TCP = {("uvloop.loop", "TCPTransport"), ("asyncio.selector_events", "_SelectorSocketTransport")}


class HttpOutlet:
    """A chunked HTTP/1.1 response under uvicorn: each body one chunk, the bytes its send would write."""

    __slots__ = ("cycle",)

    def __init__(self, cycle: HttpCycle) -> None:
        self.cycle = cycle

    def usable(self) -> bool:
        cycle = self.cycle
        return (cycle.chunked_encoding is True and not cycle.response_complete and not cycle.disconnected
                and not cycle.flow.write_paused)

    def put(self, body: bytes) -> bool:
        cycle = self.cycle
        if cycle.flow.write_paused or cycle.disconnected:
            return False
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    def native_target(self) -> tuple[object, int]:
        """The cycle, and its socket's descriptor where the transport is uvloop's or asyncio's plain TCP one
        (a TLS transport's socket carries ciphertext: -1, through its write)."""
        transport = self.cycle.transport
        kind = type(transport)
        if (kind.__module__, kind.__qualname__) not in _PLAIN_TCP:
            return self.cycle, -1
        sock = transport.get_extra_info("socket")
        return self.cycle, sock.fileno() if sock is not None else -1

