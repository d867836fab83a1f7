"""Worker processes for the heavy part of translation: long bodies parsed, rendered and tokenized
away from the API server's event loop. Used by each API server process; the workers are spawned
processes of their own, each holding the model's tokenizer and chat template.

Why processes and not threads: HF tokenizers' `encode` holds the GIL from start to end (a 2 MB
prompt: 2.3 s in which no other thread of the process ran) and so do msgspec's decoding and
minijinja's rendering of a long conversation (100k short messages: 0.08 s and 0.28 s), so a worker
thread stalled every stream and the engines' heartbeats with them. A worker process costs a pickle
of the body on the way out and of the prepared request on the way back (its token ids as an array),
a few milliseconds for the largest body (bench/isolation.py).
"""
from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import logging
import multiprocessing
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Generic, TypeVar

from services.frontend.errors import APIError

__all__ = ["PreparePool"]

log = logging.getLogger("frontend.workers")
_T = TypeVar("_T")
_PR_SET_PDEATHSIG = 1


class PreparePool(Generic[_T]):
    """`workers` processes, each set up by `initializer(*initargs)`, running `call(kind, body)`.
    Started at the first body sent (short bodies never need it); a worker that dies fails the
    bodies it held with a 503, and the next body starts a fresh pool."""

    def __init__(self, workers: int, initializer: Callable[..., None], initargs: tuple[Any, ...],
                 call: Callable[[str, bytes], _T]) -> None:
        self._workers = workers
        self._initializer, self._initargs, self._call = initializer, initargs, call
        self._pool: ProcessPoolExecutor | None = None

    async def prepare(self, kind: str, body: bytes) -> _T:
        pool = self._pool
        if pool is None:
            pool = self._pool = ProcessPoolExecutor(
                self._workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
                initargs=(self._initializer, self._initargs))
        try:
            return await asyncio.wrap_future(pool.submit(self._call, kind, body))
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
                log.error("a tokenizer worker process died; starting new ones for the next long request")
            raise APIError(503, "the worker process preparing this request died; retry it") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _start(initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
    """In each worker: Ctrl-C is the API server's to handle, and the worker ends with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.__stderr__ is not None:  # `kill -USR1`: every stack, as its service's (not tracing's: no OpenTelemetry here)
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    initializer(*initargs)
