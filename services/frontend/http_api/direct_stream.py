"""A streamed response's SSE events written to its connection in the engine dispatch pass that produced
them, under uvicorn's httptools protocol: one pass per engine step over every stream, no response task
woken and no ASGI send per token. Runs on each API server's event loop."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from services.frontend.engine_client.inflight import EngineFailure
from services.frontend.generation.output import OutputProcessor, Piece

# The scope extension under which the frontend's uvicorn protocol (connections.py) puts the request's
# uvicorn RequestResponseCycle, the object behind the ASGI send.
CYCLE = "fleet.http_cycle"


class _Flow(Protocol):
    write_paused: bool


class HttpCycle(Protocol):
    """What is read of uvicorn's httptools RequestResponseCycle: its transport and the state its send keeps."""

    transport: asyncio.Transport
    flow: _Flow
    disconnected: bool
    response_complete: bool
    chunked_encoding: bool | None


def cycle_of(scope: Any) -> HttpCycle | None:
    extensions = scope.get("extensions")
    return extensions.get(CYCLE) if extensions else None


class DirectStream:
    """One choice's stream, its events written as its outputs are fed. The response task starts the
    response and ends it through ASGI as before; in between, run() attaches this as the stream's sink
    (engine_client/inflight.py) and waits. At the end of each dispatch pass that fed the stream, its
    outputs are processed and their events written as one HTTP chunk, the bytes uvicorn's send would
    write. The sink lets go, and run() returns, at the
    stream's end (its last output is left for the task), a failure (raised by run()), a stop string
    matched here, or a transport that stopped taking bytes (a slow reader) or closed: the events not
    written are returned for the task to send through ASGI, whose send waits for the transport."""

    __slots__ = ("_cycle", "_events", "_failure", "_future", "_outputs", "_stash", "_text")

    def __init__(self, cycle: HttpCycle, outputs: OutputProcessor,
                 events: Callable[[list[Piece]], list[bytes]], text: Callable[[str], bytes] | None = None) -> None:
        self._cycle = cycle
        self._outputs = outputs
        self._events = events  # the SSE events of a batch of pieces (and the finish's, once finished)
        # `text`: the event of one plain text piece, when that is all `events` would make of it (no usage
        # or logprobs in the chunk): OutputProcessor.plain_text() steps are written with it.
        self._text = text
        self._future: asyncio.Future[None] | None = None
        self._stash: list[bytes] = []
        self._failure: EngineFailure | None = None

    def usable(self) -> bool:
        """The response is under way in chunks and its transport takes bytes now."""
        cycle = self._cycle
        return (cycle.chunked_encoding is True and not cycle.response_complete and not cycle.disconnected
                and not cycle.flow.write_paused)

    async def run(self) -> list[bytes]:
        """Serve the stream from the dispatch pass until the sink lets go; the events left to send.
        Raises EngineFailure."""
        stream = self._outputs.stream
        self._future = asyncio.get_running_loop().create_future()
        stream.sink = self
        try:
            await self._future
        finally:
            if stream.sink is self:  # cancelled (the response task ended): the task owns the stream again
                stream.sink = None
            self._future = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        stash, self._stash = self._stash, []
        return stash

    # ---- the sink (inflight.end_of_pass, InFlight.feed and fail call these, in the dispatch pass) ----

    def on_output(self) -> None:
        outputs = self._outputs
        cycle = self._cycle
        chunk = self._text
        if chunk is not None:
            text = outputs.plain_text()
            if text is not None:
                if cycle.flow.write_paused or cycle.disconnected:
                    if text:
                        self._stash.append(chunk(text))
                    self._let_go()
                elif text:
                    body = chunk(text)
                    cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
                return
        try:
            events = self._events(outputs.take_pieces())
        except EngineFailure as exc:
            self._failure = exc
            self._let_go()
            return
        if outputs.finish is not None or cycle.flow.write_paused or cycle.disconnected:
            self._stash += events
            self._let_go()
            return
        if events:
            body = events[0] if len(events) == 1 else b"".join(events)
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))

    def on_end(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def _let_go(self) -> None:
        self._outputs.stream.sink = None
        self.on_end()
