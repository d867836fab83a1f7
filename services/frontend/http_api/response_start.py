"""A response's head and its first body bytes written to the connection together: under uvicorn's
httptools protocol, one transport write (one send call, one wake-up of the client) where two ASGI sends
make two. Runs on each API server's event loop."""
from __future__ import annotations

from typing import Any

from starlette.types import Message, Send

from services.frontend.http_api.direct_stream import cycle_of


class _Gathered:
    """Stands in for a request cycle's transport while uvicorn's send writes a response's head and first
    body: their bytes are kept, to go out as one write, and a close it asks for follows that write."""

    __slots__ = ("closes", "data")

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.closes = False

    def write(self, data: bytes) -> None:
        self.data.append(data)

    def close(self) -> None:
        self.closes = True

    def is_closing(self) -> bool:
        return False


async def start_response(send: Send, start: Message, body: Message | None) -> None:
    """Send `start` (http.response.start), then `body` (the first http.response.body, if any yet). Under
    uvicorn both go through its own send (its head, chunk framing and state), their bytes one write."""
    cycle: Any = cycle_of(send)
    if body is None or cycle is None or cycle.response_started or cycle.disconnected or cycle.flow.write_paused:
        await send(start)
        if body is not None:
            await send(body)
        return
    transport = cycle.transport
    gathered = _Gathered()
    cycle.transport = gathered
    try:
        # Neither send waits (the transport takes bytes): nothing else runs, or writes, in between.
        await send(start)
        await send(body)
    finally:
        cycle.transport = transport
        if gathered.data:
            transport.write(b"".join(gathered.data))
        if gathered.closes:
            transport.close()
