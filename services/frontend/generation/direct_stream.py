"""A stream's events written to its connection in the engine dispatch pass that produced them, through
an outlet: SSE chunks under uvicorn (http_api/direct_stream.py), gRPC messages on the frontend's own
HTTP/2 port (grpc_api/native_call.py). One pass per engine step over every stream, no response task
woken and no send per token. Runs on each API server's event loop."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from protocol import RequestOutput
from services.frontend.engine_client import inflight
from services.frontend.engine_client.inflight import EngineFailure
from services.frontend.generation.output import OutputProcessor, Piece, PlainStep, write_pass

log = logging.getLogger(__name__)


class Outlet(Protocol):
    """Where a DirectStream's bytes go: an HTTP/1.1 response's chunks (HttpOutlet) or a gRPC call's DATA
    frames (grpc_api/native_call.py)."""

    def usable(self) -> bool:
        """The response is under way and takes bytes now."""

    def put(self, body: bytes) -> bool:
        """Write `body` now and say True, or say False (nothing written: the transport paused or closed,
        or a flow-control window is shut) and the stream lets go."""

    def native_target(self) -> tuple[object, int] | None:
        """Where a C step (generation/_plainc.c) writes this outlet's bodies itself: the response's uvicorn
        cycle (its checks are put()'s) and its socket's descriptor where the transport is plain TCP (-1:
        through the transport's write). None: through put()."""


# The streams that made a body in this dispatch pass (DirectStream._body), in the order they first made
# one, written once every stream of the pass has been processed (inflight.after_pass): the pass's Python
# first, then its sends back to back, each warm in the caches the other would have evicted
# (docs/frontend.md, "Two phases"). A stream's bodies of one pass (a loop running late hands it several
# steps) go out as one write.
_writing: list[DirectStream] = []


def _write_pass() -> None:
    """Write each stream's body of the pass to its outlet; a stream whose outlet takes nothing (or whose
    write raised) keeps the body for its response task and lets go."""
    if not _writing:
        return
    streams = _writing[:]
    _writing.clear()
    if write_pass is not None:  # the loop below in C (a C step's own writes too); what was refused comes back
        refused = write_pass(streams)
        for stream, body, exc in refused or ():
            if stream is None:  # a C step's body after its run ended: a bug, nobody to hand it to
                log.error("a streamed body was left after its stream ended", exc_info=exc)
            else:
                if exc is not None:
                    log.error("writing a streamed body failed for %s", stream._outputs.stream.request_id,
                              exc_info=exc)
                stream._refused(body)
        return
    for stream in streams:
        body, stream._body = stream._body, b""
        try:
            if stream._outlet.put(body):
                continue
        except Exception:  # a bug under one outlet: its response task sends the body its own way, or fails
            log.exception("writing a streamed body failed for %s", stream._outputs.stream.request_id)
        stream._refused(body)


inflight.after_pass.append(_write_pass)

_NO_BOUNDS = [float("inf")]  # a C step that only writes: a histogram it never counts in


class DirectStream:
    """One choice's stream, its events written as its outputs are fed. The response task starts the
    response and ends it as before; in between, run() attaches this as the stream's sink
    (engine_client/inflight.py) and waits. A plain step (text, no finish) is taken as the dispatch pass
    reaches it (InFlight.plain: _plain_step); other outputs are fed, and processed at the end of the
    pass. Either way the pass's events of the stream are written to the outlet as one body at the end of
    the pass. The sink lets go, and
    run() returns, at the stream's end (its last output is left for the task), a failure (raised by
    run()), a stop string matched here, or an outlet that took no bytes (a slow reader, a closed
    connection): the events not written are returned for the task to send its own way, which waits."""

    __slots__ = ("_body", "_events", "_failure", "_frame", "_future", "_lent", "_native", "_native_steps",
                 "_outlet", "_outputs", "_retry", "_stash", "_step", "_target", "_text")

    def __init__(self, outlet: Outlet, outputs: OutputProcessor, events: Callable[[list[Piece]], list[bytes]],
                 text: Callable[[str], bytes] | None = None, frame: tuple[bytes, ...] | None = None) -> None:
        self._outlet = outlet
        self._outputs = outputs
        self._events = events  # the events of a batch of pieces (and the finish's, once finished)
        # `text`: the event of one text piece (with the step's logprobs entries, when asked), when that is
        # all `events` would make of it (no usage in the chunk): OutputProcessor.plain_text() steps.
        self._text = text
        self._future: asyncio.Future[None] | None = None
        self._stash: list[bytes] = []
        self._body = b""  # made in this dispatch pass, not yet written (_writing)
        self._failure: EngineFailure | None = None
        # While run() waits, with `text` given and a stream whose steps OutputProcessor.plain_step() serves:
        # _plain_step, as the stream's InFlight.plain (bound once per run()).
        self._step: Callable[[RequestOutput, Sequence[bytes], float], bool] | None = None
        self._retry: Callable[[RequestOutput, Sequence[bytes], float], bool] | None = None  # _until_native, bound
        # `frame`: what `text` puts around a piece's JSON string (and, with a chat completion's logprobs,
        # around its entries), when that is all it does (OutputProcessor.native_step): then the steps are
        # made in C where it is built: `_native` itself is the stream's InFlight.plain while it holds the
        # stream's state (`_lent`: native_load() to native_store()), and queues its chunks here (bind());
        # other outputs come to _native_other. With no frame (stop strings, a parser, completions'
        # logprobs), or no steps to make, a C step still writes the stream's bodies where its outlet lets it
        # (Outlet.native_target): `_native_steps` False.
        self._frame = frame
        self._native: PlainStep | None = None
        self._native_steps = False
        self._target: tuple[object, int] | None = None
        self._lent = False

    def usable(self) -> bool:
        return self._outlet.usable()

    async def run(self) -> list[bytes]:
        """Serve the stream from the dispatch pass until the sink lets go; the events left to send.
        Raises EngineFailure."""
        stream = self._outputs.stream
        self._future = asyncio.get_running_loop().create_future()
        stream.sink = self
        plain = self._text is not None and stream.interval == 1
        if self._native is None and PlainStep is not None:
            self._target = self._outlet.native_target()
            if self._target is not None:
                stepper = self._outputs.native_step(self._frame) if plain and self._frame is not None else None
                self._native_steps = stepper is not None
                self._native = stepper or PlainStep([], _NO_BOUNDS, [0, 0.0], b"", b"")  # a writer only
        if self._native is not None:  # the stream's bodies written straight to the response's socket, if it can
            self._native.bind(self, stream, _writing, *self._target)  # type: ignore[misc]  # set with _native
        if plain:
            self._step = self._plain_step
            self._retry = self._until_native
            self._arm()
        try:
            await self._future
        finally:
            if stream.sink is self:  # cancelled (the response task ended): the task owns the stream again
                stream.sink = None
            self._disarm()
            if self._native is not None:  # no reference cycle through it between runs
                left = self._native.unbind()
                if left:  # queued in a pass that never wrote (not expected): the task sends it, first
                    self._stash.insert(0, left)
            self._step = self._retry = None
            self._future = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        stash, self._stash = self._stash, []
        return stash

    # ---- the sink (inflight.end_of_pass, InFlight.feed and fail call these, in the dispatch pass) ----

    def _arm(self) -> None:
        """The stream's steps come to _plain_step while nothing of it is queued, when its outputs make
        plain steps (no stop strings, parser, logprobs, ...: OutputProcessor.plain_steps)."""
        stream = self._outputs.stream
        if self._step is not None and stream.sink is self and not stream.pending and self._outputs.plain_steps():
            native = self._native
            if native is None or not self._native_steps:
                stream.plain = self._step
            elif self._lent or self._outputs.native_load(native):
                self._lent = True
                stream.plain = native
            else:  # the C step cannot take the state yet (a token before the next ends inside a character)
                stream.plain = self._retry

    def _take_back(self) -> None:
        """The state the C step holds (since native_load()) is the stream's objects' again."""
        if self._lent:
            self._lent = False
            self._outputs.native_store(self._native)  # type: ignore[arg-type]  # lent only to one

    def _disarm(self) -> None:
        """No step is taken from the dispatch pass (InFlight.fail may have cleared `plain` already)."""
        self._take_back()
        self._outputs.stream.plain = None

    def _native_other(self, out: RequestOutput, raw_frames: Sequence[bytes], now: float) -> bool:
        """InFlight.plain for what the C step does not make (an output that is not one token and no finish,
        an added token): _plain_step's, with the state taken back (and lent again after a step it took)."""
        self._take_back()
        self._outputs.stream.plain = self._step
        if not self._plain_step(out, raw_frames, now):
            return False  # fed, and queued till on_output
        if self._outputs.stream.plain is self._step:
            self._arm()
        return True

    def _until_native(self, out: RequestOutput, raw_frames: Sequence[bytes], now: float) -> bool:
        """InFlight.plain while the C step cannot take the stream's state (native_load() refused it):
        _plain_step's, after which the C step takes the stream again where it can."""
        if not self._plain_step(out, raw_frames, now):
            return False
        if self._outputs.stream.plain is self._retry:
            self._arm()
        return True

    def _native_failed(self, exc: Exception) -> None:
        """A bug in the C step: this stream fails (its output dropped), as one in _plain_step does."""
        self._disarm()
        self._outputs.stream.processing_failed(exc)

    def _plain_step(self, out: RequestOutput, raw_frames: Sequence[bytes], now: float) -> bool:
        """InFlight.plain: a step with tokens and no finish is this stream's next text (with logprobs,
        its entries read from `raw_frames`), its event made here and written at the pass's end with the
        others'; any other output is fed (and queued, with what follows it, until on_output took them).
        A bug in it fails this stream (its output dropped, InFlight.processing_failed), as one in on_output
        does: the dispatch pass goes on with the other streams."""
        try:
            text = (self._outputs.plain_step(out, raw_frames, now) if out.new_token_ids and out.finish_reason is None
                    else None)
        except Exception as exc:
            self._outputs.stream.processing_failed(exc)
            return True
        if text is None:
            self._outputs.stream.plain = None
            return False
        if text:
            self._queue(self._text(text))  # type: ignore[misc]  # armed only with `text`
        return True

    def _queue(self, body: bytes) -> None:
        """`body` written at the pass's end, after what the stream made before in the pass (with a C step,
        queued there: the C step's own chunks go there too)."""
        if self._native is not None:
            self._native.queue(body)
        elif self._body:
            self._body += body
        else:
            self._body = body
            _writing.append(self)

    def on_output(self) -> None:
        self._disarm()  # outputs are queued only past a step taken back (or fed to a stream not armed)
        self._take_queued()
        self._arm()

    def _take_queued(self) -> None:
        outputs = self._outputs
        chunk = self._text
        if chunk is not None:
            text = outputs.plain_text()
            if text is not None:
                if text:
                    self._queue(chunk(text))
                return
            texts = outputs.plain_texts()
            if texts is not None:  # several steps at once, a loop running late: one write for them all
                if texts:
                    self._queue(b"".join([chunk(text) for text in texts]))
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
            self._queue(events[0] if len(events) == 1 else b"".join(events))

    def on_end(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def _refused(self, body: bytes) -> None:
        """The outlet took nothing of the pass's `body`: the response task sends it, before what the stream
        stashed in this pass (its finish's events, made after this body in the pass), and the sink lets go."""
        self._stash.insert(0, body)
        self._let_go()

    def _let_go(self) -> None:
        self._disarm()
        self._outputs.stream.sink = None
        self.on_end()
