"""A fake of the router's `Upstream` port (services/router/backends/upstream.py) for in-process router tests:
each replica URL answers from a script of `Reply`s, and every request it was sent is kept."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from services.router.backends.upstream import UpstreamError


@dataclass(frozen=True)
class Reply:
    """One scripted answer. `refuse`: open() raises UpstreamError with it (a connect error, a 5xx or
    429 head), `retryable` as given (False: the request may have reached the replica); `hang`: open()
    never answers. Otherwise a head with `status`, then the body: `chunks`
    one by one, raising a read error after `break_after` of them, or waiting forever after
    `stall_after` (a stream that goes silent). `ends_with_last`: the body's end arrives with its last
    chunk (the response reports itself `complete` once that chunk is handed over), as a replica's
    final event and end usually do."""
    status: int = 200
    chunks: tuple[bytes, ...] = ()
    content_type: str = "application/json"
    break_after: int | None = None
    stall_after: int | None = None
    refuse: str | None = None
    retryable: bool = True
    hang: bool = False
    ends_with_last: bool = False


@dataclass
class Sent:
    url: str
    path: str
    body: dict[str, Any]
    api_key: str | None
    timeout_s: float


class FakeResponse:
    """The `UpstreamResponse` port over a Reply; `closed` and `drained` tell how the router left it."""

    def __init__(self, url: str, reply: Reply) -> None:
        self.url, self.status, self.content_type = url, reply.status, reply.content_type
        self._reply = reply
        self.closed = False
        self.drained = False  # the whole body was read
        self._last_out = False  # the last chunk was handed over

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def ready(self) -> bytes:
        return b""

    async def chunks(self, forward: Callable[[bytes], bool] | None = None) -> AsyncIterator[bytes]:
        reply = self._reply
        for i, chunk in enumerate(reply.chunks):
            if i == reply.break_after:
                raise aiohttp.ClientPayloadError("Response payload is not completed")
            if i == reply.stall_after:
                await asyncio.Event().wait()
            self._last_out = i == len(reply.chunks) - 1 and reply.break_after is None
            yield chunk
        if reply.break_after == len(reply.chunks):
            raise aiohttp.ClientPayloadError("Response payload is not completed")
        self.drained = True

    @property
    def complete(self) -> bool:
        return self.drained or (self._reply.ends_with_last and self._last_out)

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeUpstream:
    """Replies per replica URL, in order; the last one repeats once the script runs out."""
    scripts: dict[str, list[Reply]] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    responses: list[FakeResponse] = field(default_factory=list)

    def answer(self, url: str, *replies: Reply) -> None:
        self.scripts[url] = list(replies)

    def urls(self) -> list[str]:
        """The replicas called, in call order."""
        return [s.url for s in self.sent]

    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None,
                   timeout_s: float) -> FakeResponse:
        self.sent.append(Sent(base_url, path, json.loads(body), api_key, timeout_s))
        script = self.scripts.get(base_url) or [Reply(chunks=(completion(f"from {base_url}"),))]
        reply = script.pop(0) if len(script) > 1 else script[0]
        if reply.hang:
            await asyncio.Event().wait()
        if reply.refuse is not None:
            raise UpstreamError(base_url, reply.refuse, retryable=reply.retryable)
        response = FakeResponse(base_url, reply)
        self.responses.append(response)
        return response

    async def get_ok(self, url: str, timeout_s: float, *, api_key: str | None = None) -> tuple[bool, str]:
        return True, "HTTP 200"


def completion(text: str, finish: str = "stop", *, model: str = "m") -> bytes:
    """A non-streamed chat completion body."""
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "finish_reason": finish}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()


def chunk_events(pieces: list[str], finish: str = "stop", *, done: bool = True) -> tuple[bytes, ...]:
    """A streamed chat completion as SSE events, one per piece, then the finish, usage and [DONE]."""
    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": choices, **extra}
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    events = [event([{"index": 0, "delta": {"content": p}, "finish_reason": None}]) for p in pieces]
    events.append(event([{"index": 0, "delta": {}, "finish_reason": finish}]))
    usage = {"prompt_tokens": 3, "completion_tokens": len(pieces), "total_tokens": 3 + len(pieces)}
    events.append(event([], usage=usage))
    if done:
        events.append(b"data: [DONE]\n\n")
    return tuple(events)
