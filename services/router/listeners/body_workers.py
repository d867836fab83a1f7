"""A request body made ready for routing, and the worker processes that do it for long bodies (router
process; the workers are spawned processes of its own): the JSON decoded and checked, translated by
the API's codec, the text signals read, and for a long body its bulk (messages, prompt, input) encoded
once for upstream, so that what comes back to the router's event loop is small.

Why processes: msgspec's decode, the codecs' walk and the text join of a 4 MB body of 100k short
messages hold the GIL for ~80 ms in all, during which no other stream moved; a thread holds the same
GIL. Bringing the decoded dicts back would cost as much again (unpickling 100k dicts), so a worker
sends back the body without its bulk, the bulk as JSON bytes, and the text: a copy of a few MB.
"""
from __future__ import annotations

import asyncio
import faulthandler
import logging
import multiprocessing
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import msgspec

from services.router.decision.signals import request_text
from services.router.errors import HTTPError
from services.router.listeners.codecs.codec import CodecError
from services.router.listeners.codecs.registry import CODECS
from services.router.listeners.json_body import BodyError, decode_object
from services.router.parent_death import die_with_parent

log = logging.getLogger("router")
_json = msgspec.json.Encoder()
UPSTREAM_BULK = ("messages", "prompt")  # the fields of an upstream chat or completions body the router never reads


@dataclass(slots=True)
class Parsed:
    """A request ready for routing."""
    request: dict[str, Any]  # the body as the client sent it, but for its codec's bulk when split
    chat: dict[str, Any]  # the upstream body, but for its bulk when split
    text: str  # what signals and cache-aware placement read
    bulk: bytes = b""  # the upstream body's bulk as a JSON object, when split off; b"" when not


def parse(api: str, raw: bytes, *, split: bool = False) -> Parsed:
    """`raw` as a request of the API `api` ("explain": of the API its shape says); BodyError (a 400)
    names what is wrong. `split`: leave the bulk out of the dicts (for a worker, whose answer is copied
    back to the router)."""
    request = decode_object(raw)
    if api == "explain":  # a Responses body is routed as what it would send; the others as they are
        api = "chat" if "messages" in request else "completions" if "prompt" in request else "responses"
    codec = CODECS[api]
    try:
        chat = codec.to_chat(request)
    except CodecError as exc:
        raise BodyError(str(exc), exc.param) from None
    text = request_text(chat)
    if not split:
        return Parsed(request, chat, text)
    bulk = {key: chat.pop(key) for key in UPSTREAM_BULK if key in chat}
    light = {key: value for key, value in request.items() if key not in codec.bulk}
    return Parsed(light, chat, text, _json.encode(bulk) if bulk else b"")


class BodyWorkers:
    """`workers` processes running `parse`, started by `warm` (at the router's start: a worker's imports
    take a core for a second, which would stall the streams of a router under way) or at the first long
    body; a worker that dies fails the bodies it held with a 503, and the next body starts a fresh pool."""

    def __init__(self, workers: int = 2) -> None:
        self._workers = workers
        self._pool: ProcessPoolExecutor | None = None

    @property
    def started(self) -> bool:
        return self._pool is not None

    async def warm(self) -> None:
        """Every worker started and ready, before the first request."""
        await asyncio.gather(*(self.parse("chat", b'{"model": "", "messages": []}') for _ in range(self._workers)))

    async def parse(self, api: str, raw: bytes) -> Parsed:
        pool = self._pool
        if pool is None:
            pool = self._pool = ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("spawn"),
                                                    initializer=_start)
        try:
            return await asyncio.wrap_future(pool.submit(_parse_split, api, raw))
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
                log.error("a body worker process died; starting new ones for the next long request")
            raise HTTPError(503, "the worker process reading this request died; retry it") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _parse_split(api: str, raw: bytes) -> Parsed:
    return parse(api, raw, split=True)


def _start() -> None:
    """In each worker: Ctrl-C is the router's to handle, and the worker ends when the router does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.__stderr__ is not None:  # `kill -USR1`: every stack, as its service's (not tracing's: no OpenTelemetry here)
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    die_with_parent()
