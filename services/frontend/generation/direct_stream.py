"""A stream's events written to its connection in the engine dispatch pass that produced them, through
an outlet: SSE chunks under uvicorn (http_api/direct_stream.py), gRPC messages on the frontend's own
HTTP/2 port (grpc_api/native_call.py). One pass per engine step over every stream, no response task
woken and no send per token. Runs on each API server's event loop."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from services.frontend.engine_client import inflight
from services.frontend.engine_client.inflight import EngineFailure
from services.frontend.generation.output import OutputProcessor, Piece

log = logging.getLogger(__name__)


class Outlet(Protocol):
    """Where a DirectStream's bytes go: an HTTP/1.1 response's chunks (HttpOutlet) or a gRPC call's DATA
    frames (grpc_api/native_call.py)."""

    def usable(self) -> bool:
        """The response is under way and takes bytes now."""

    def put(self, body: bytes) -> bool:
        """Write `body` now and say True, or say False (nothing written: the transport paused or closed,
        or a flow-control window is shut) and the stream lets go."""


# The bodies the streams of this dispatch pass made, in the order they made them, written once every
# stream of the pass has been processed (inflight.after_pass): the pass's Python first, then its sends
# back to back, each warm in the caches the other would have evicted (docs/frontend.md, "Two phases").
_bodies: list[tuple[DirectStream, bytes]] = []


def _write_pass() -> None:
    """Write each body of the pass to its stream's outlet; a stream whose outlet takes nothing (or whose
    write raised) keeps the body for its response task and lets go."""
    if not _bodies:
        return
    bodies = _bodies[:]
    _bodies.clear()
    for stream, body in bodies:
        try:
            if stream._outlet.put(body):
                continue
        except Exception:  # a bug under one outlet: its response task sends the body its own way, or fails
            log.exception("writing a streamed body failed for %s", stream._outputs.stream.request_id)
        stream._stash.append(body)
        stream._let_go()


inflight.after_pass.append(_write_pass)


class DirectStream:
    """One choice's stream, its events written as its outputs are fed. The response task starts the
    response and ends it as before; in between, run() attaches this as the stream's sink
    (engine_client/inflight.py) and waits. At the end of each dispatch pass that fed the stream, its
    outputs are processed and their events written to the outlet as one body. The sink lets go, and
    run() returns, at the stream's end (its last output is left for the task), a failure (raised by
    run()), a stop string matched here, or an outlet that took no bytes (a slow reader, a closed
    connection): the events not written are returned for the task to send its own way, which waits."""

    __slots__ = ("_events", "_failure", "_future", "_outlet", "_outputs", "_stash", "_text")

    def __init__(self, outlet: Outlet, outputs: OutputProcessor,
                 events: Callable[[list[Piece]], list[bytes]], text: Callable[[str], bytes] | None = None) -> None:
        self._outlet = outlet
        self._outputs = outputs
        self._events = events  # the events of a batch of pieces (and the finish's, once finished)
        # `text`: the event of one text piece (with the step's logprobs entries, when asked), when that is
        # all `events` would make of it (no usage in the chunk): OutputProcessor.plain_text() steps.
        self._text = text
        self._future: asyncio.Future[None] | None = None
        self._stash: list[bytes] = []
        self._failure: EngineFailure | None = None

    def usable(self) -> bool:
        return self._outlet.usable()

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
        chunk = self._text
        if chunk is not None:
            text = outputs.plain_text()
            if text is not None:
                if text:
                    _bodies.append((self, chunk(text)))
                return
            texts = outputs.plain_texts()
            if texts is not None:  # several steps at once, a loop running late: one write for them all
                if texts:
                    _bodies.append((self, b"".join([chunk(text) for text in texts])))
                return
        try:
            events = self._events(outputs.take_pieces())
        except EngineFailure as exc:
            self._failure = exc
            self._let_go()
            return
        if outputs.finish is not None:
            self._stash += events
            self._let_go()
        elif events:
            _bodies.append((self, events[0] if len(events) == 1 else b"".join(events)))

    def on_end(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def _let_go(self) -> None:
        self._outputs.stream.sink = None
        self.on_end()
