"""One in-flight engine request (InFlight) as output processing sees it: outputs queue up as the engine
steps, and the response task drains everything queued at once (one wake-up per batch, not per token)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from protocol import RequestOutput

log = logging.getLogger(__name__)

# error_kind of the output that tells a stream its request was refused by the socket for want of a
# connection: it never left this process, so it may go to another rank. Frontend-local, never on the wire.
NOT_SENT = "not_sent"
# error_kind of the output that tells a stream its rank died (or dropped this frontend's session) before
# it produced anything for it: nothing of it reached the client, so it too may go to another rank.
LOST = "lost"


# What a stream fails with when its client disconnects (its request is aborted, not failed).
CLIENT_GONE = "client disconnected"

class EngineFailure(RuntimeError):
    """The engine serving a request died, went silent or refused it; the message says which and why.
    `status`: 400 when the request itself was at fault, else 503; `param`: the request field at fault."""

    def __init__(self, message: str, status: int = 503, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class Sink(Protocol):
    """A consumer that takes a stream's outputs at the end of the dispatch pass that fed them, instead
    of a response task woken per output (http_api/direct_stream.py)."""

    def on_output(self) -> None:
        """Outputs were queued in this pass (not the last): take them now (InFlight.take). Called once
        per pass, however many outputs of the stream the pass carried, so they go out together."""

    def on_end(self) -> None:
        """The stream finished or failed, its last outputs still queued: the sink is detached, the
        response task takes the rest."""


# The streams with a sink that were fed in the current dispatch pass, in the order they were first fed;
# end_of_pass() hands each its outputs. One event loop per API server process: a module's list suffices.
_due: list[InFlight] = []
# Run at the end of each dispatch pass, after every sink took its outputs: what the sinks left to do
# together (generation/direct_stream.py writes the pass's bodies here, one send after another).
after_pass: list[Callable[[], None]] = []


def end_of_pass() -> None:
    """The dispatch pass is over (engines.py, after each batch from the socket thread): each stream fed
    in it whose sink is still attached takes its outputs, once; then the after_pass hooks run (also
    after a pass whose outputs were all plain steps, InFlight.plain, which fed nothing)."""
    if _due:
        _take_due()
    for hook in after_pass:
        hook()


def _take_due() -> None:
    due = _due[:]
    _due.clear()
    for stream in due:
        stream._is_due = False
        sink = stream.sink
        if sink is not None and stream._pending:
            try:
                sink.on_output()
            except Exception as exc:
                stream.processing_failed(exc)


class InFlight:
    """`raw_frames`: with `keeps_frames` set (a request that asked for logprobs), the raw frames of the
    Outputs message each output of the latest batch came in, in the batch's order."""

    __slots__ = (
        "_error",
        "_frames",
        "_is_due",
        "_pending",
        "_waiter",
        "engine_index",
        "finished",
        "generated",
        "_woken",
        "gone",
        "group",
        "interval",
        "max_tokens",
        "keeps_frames",
        "plain",
        "prompt_len",
        "rank",
        "raw_frames",
        "request_id",
        "sink",
        "started",
    )

    def __init__(self, request_id: str, prompt_len: int, max_tokens: int) -> None:
        self.request_id = request_id
        self.rank = -1
        self.engine_index = -1  # position in the frontend's engine list (ranks need not match it)
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.generated = 0
        self._pending: list[RequestOutput] = []
        self._waiter: asyncio.Future[None] | None = None
        self._error: str | None = None
        self.finished = False
        self.started = False  # the engine has produced something for it (its prefill is done)
        self.gone: str | None = None  # fail() was called: never send it to an engine again
        self.keeps_frames = False
        self._frames: list[Sequence[bytes]] = []
        self.raw_frames: list[Sequence[bytes]] = []
        self.group: Wakeup | None = None  # one of a request's several choices: feed and fail wake it too
        # Tokens per wake-up of the consumer (a stream_interval): woken at the first output, then once
        # `interval` tokens came since the last wake, and at the end.
        self.interval = 1
        self._woken = -1  # `generated` at the last wake; -1: never woken
        # With a sink attached, feed hands it each output in place of waking the consumer, and the end
        # (a finish or a failure) detaches it; see Sink.
        self.sink: Sink | None = None
        # A sink's own step for an output while nothing is queued (generation/direct_stream.py): called by
        # the dispatch pass in place of feed, with the message's raw frames and when it was read. True: it
        # took the output whole and counted its tokens in `generated`; False: the output is fed as usual,
        # and the step has set this to None, so the stream's later outputs queue behind it (the sink sets
        # it again once it took them).
        self.plain: Callable[[RequestOutput, Sequence[bytes], float], bool] | None = None
        self._is_due = False  # in _due

    # ---- producer side (the engine dispatch pass on the event loop) ----

    def feed(self, out: RequestOutput, raw_frames: Sequence[bytes] = ()) -> None:
        self._pending.append(out)
        if self.keeps_frames:
            self._frames.append(raw_frames)
        self.generated += len(out.new_token_ids)
        if out.finish_reason is not None:
            self.finished = True
        elif self.interval > 1 and self._woken >= 0 and self.generated - self._woken < self.interval:
            return  # the consumer is woken once `interval` tokens are here
        self._woken = self.generated
        sink = self.sink
        if sink is not None:
            if not self.finished:
                if not self._is_due:
                    self._is_due = True
                    _due.append(self)
                return
            self.sink = None
            sink.on_end()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.group is not None:
            self.group.wake()

    def processing_failed(self, exc: Exception) -> None:
        """A bug in this stream's output processing (its sink's, in the dispatch pass): logged, and the
        stream fails, not the pass."""
        log.exception("output processing failed for %s", self.request_id)
        self.fail(f"output processing failed: {type(exc).__name__}: {exc}")

    def fail(self, message: str) -> None:
        self.gone = self.gone or message
        if self.finished:
            return
        self.finished = True
        self._error = message
        self.plain = None
        sink = self.sink
        if sink is not None:
            self.sink = None
            sink.on_end()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.group is not None:
            self.group.wake()

    # ---- consumer side (the response task) ----

    @property
    def pending(self) -> list[RequestOutput]:
        """The outputs queued now (read only: take() or take_one() takes them)."""
        return self._pending

    @property
    def pending_frames(self) -> list[Sequence[bytes]]:
        """With keeps_frames, the raw frames of each output queued now, in order (read only)."""
        return self._frames

    @property
    def ready(self) -> bool:
        """next() would return (or raise) without waiting."""
        return bool(self._pending) or self._error is not None

    async def next(self) -> list[RequestOutput]:
        """Everything queued since the last call; waits if nothing is. Raises EngineFailure."""
        while not self._pending:
            if self._error is not None:
                raise EngineFailure(self._error)
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        return self.take()

    def take_one(self) -> RequestOutput | None:
        """The one output queued, taken as take() would; None (nothing taken) when there are more, or
        it keeps raw frames."""
        pending = self._pending
        if len(pending) != 1 or self.keeps_frames:
            return None
        self._pending = []
        self._woken = self.generated
        return pending[0]

    def take(self) -> list[RequestOutput]:
        """Everything queued since the last call, without waiting (a sink's on_output, or next())."""
        batch, self._pending = self._pending, []
        # The interval counts from what the consumer took, not from the wake: a consumer that ran late
        # took the tokens fed since, and the next wake must wait for `interval` more (else a short chunk).
        self._woken = self.generated
        if self.keeps_frames:
            self.raw_frames, self._frames = self._frames, []
        return batch


class Wakeup:
    """One waiter for the streams of a request's several choices (n > 1, a batch of prompts): any of
    them fed or failed wakes it, so one response task serves them all with one wake-up per batch."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None

    def wake(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    async def wait(self) -> None:
        """Until the next wake(); callers check their streams' `ready` first (no wake is kept)."""
        self._future = asyncio.get_running_loop().create_future()
        try:
            await self._future
        finally:
            self._future = None
