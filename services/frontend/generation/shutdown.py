"""Graceful shutdown of one API server process: once it begins, new generation requests are refused
(503) and /ready fails; running ones may finish until --shutdown-timeout, then each one still running
is ended as an engine failure is: a stream with an error event and [DONE], a request whose response
has not started with an error response. Runs on the API server's event loop."""
from __future__ import annotations

import asyncio
import logging
import time

from services.frontend.engine_client.inflight import InFlight

log = logging.getLogger(__name__)

# After the deadline, how long the requests just ended get to write their last bytes (a client that
# does not read could hold one forever; hypercorn's graceful timeout cuts what is left).
FINAL_WRITE_S = 5.0


class Shutdown:
    def __init__(self) -> None:
        self.draining = False  # new requests are refused
        self.cut: str | None = None  # why requests still running were ended (set at the deadline)
        self._streams: set[InFlight] = set()
        self._handlers = 0  # generation requests being served, from their first body byte on
        self._idle = asyncio.Event()
        self._idle.set()
        self._handling = _Handling(self)

    def handling(self) -> _Handling:
        """Around one generation request, so the drain can wait for it."""
        return self._handling

    def running(self, *streams: InFlight) -> _Running:
        """While a request is at an engine (each of its choices' streams): what an expired drain ends."""
        return _Running(self._streams, streams)

    def _begin(self) -> None:
        self._handlers += 1
        self._idle.clear()

    def _end(self) -> None:
        self._handlers -= 1
        if self._handlers == 0:
            self._idle.set()

    async def drain(self, timeout_s: float, now: asyncio.Event) -> None:
        """Refuse new requests, wait up to `timeout_s` (or until `now` is set: a second signal) for the
        running ones, then end the rest and wait briefly for their last bytes."""
        self.draining = True
        started = time.monotonic()
        log.info("shutting down: new requests refused; %d request(s) running may finish within %.0fs "
                 "(--shutdown-timeout)", self._handlers, timeout_s)
        waits = [asyncio.ensure_future(self._idle.wait()), asyncio.ensure_future(now.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if self._handlers == 0:
            log.info("every request finished in %.1fs; stopping", time.monotonic() - started)
            return
        self.cut = (f"the frontend is shutting down: the request was still running after "
                    f"{time.monotonic() - started:.0f}s (--shutdown-timeout {timeout_s:g}s)")
        log.warning("ending %d request(s) still running: %s", self._handlers, self.cut)
        for stream in list(self._streams):
            stream.fail(self.cut)
        try:
            await asyncio.wait_for(self._idle.wait(), FINAL_WRITE_S)
        except TimeoutError:
            log.warning("%d request(s) did not end within %.0fs of being told to", self._handlers, FINAL_WRITE_S)


# Context managers as small classes, not @contextmanager generators: each request enters both, and a
# generator's set-up and StopIteration cost several times a method call.
class _Handling:
    __slots__ = ("_shutdown",)

    def __init__(self, shutdown: Shutdown) -> None:
        self._shutdown = shutdown

    def __enter__(self) -> None:
        self._shutdown._begin()

    def __exit__(self, *exc: object) -> None:
        self._shutdown._end()


class _Running:
    __slots__ = ("_all", "_streams")

    def __init__(self, running: set[InFlight], streams: tuple[InFlight, ...]) -> None:
        self._all, self._streams = running, streams

    def __enter__(self) -> None:
        self._all.update(self._streams)

    def __exit__(self, *exc: object) -> None:
        self._all.difference_update(self._streams)
