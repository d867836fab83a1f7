"""The router's port to its replicas (a `typing.Protocol`, so tests drive dispatch with a fake), the
errors that tell a failed replica from a bad request, and the checks on what a replica answered.
The aiohttp implementation is aiohttp_upstream.py; both run in the router process."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import aiohttp
import msgspec

# Errors of a replica or the network while a response is read: the stream broke off.
READ_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)

_decode = msgspec.json.Decoder()


class StallTimer:
    """How long a body has waited on its replica, bounded: no byte for `timeout_s` while waiting calls
    `on_stall` with aiohttp.SocketTimeoutError (a stalled replica); time spent in the consumer (a slow
    client's backpressure) does not count. One timer per wait period, checked when it fires, not one per
    chunk. Both upstream clients' chunk readers use it."""

    __slots__ = ("_handle", "_loop", "_on_stall", "_since", "_timeout_s")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float,
                 on_stall: Callable[[BaseException], None]) -> None:
        self._loop, self._timeout_s, self._on_stall = loop, timeout_s, on_stall
        self._since: float | None = None  # None: in the consumer, not waiting on the replica
        self._handle: asyncio.TimerHandle | None = None

    def waiting(self) -> None:
        """The replica owes the next bytes from now."""
        self._since = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_at(self._since + self._timeout_s, self._check)

    def got(self) -> None:
        """Bytes came: the consumer has them."""
        self._since = None

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        now = self._loop.time()
        since = now if self._since is None else self._since
        if now - since < self._timeout_s:
            self._handle = self._loop.call_at(since + self._timeout_s, self._check)
        else:
            self._handle = None
            self._on_stall(aiohttp.SocketTimeoutError(f"no body bytes from upstream for {self._timeout_s:g} s"))


class UpstreamError(Exception):
    """The replica failed before any response byte, or answered something that is not what its API
    promises (the replica's fault, a 502). `retryable`: the replica provably did not take the request
    (no connection was made, or it refused the request with 429 or 503), so another replica may run it;
    a request that may have reached a replica and run there is never sent again. `unreachable`: no
    connection could be made, or it dropped before the response head: the replica may be down."""

    def __init__(self, url: str, message: str, *, unreachable: bool = False, retryable: bool = False) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.unreachable = unreachable
        self.retryable = retryable


class UpstreamResponse(Protocol):
    """An upstream response whose head has arrived; the body is read or streamed, then closed."""

    status: int
    content_type: str
    url: str

    async def read(self) -> bytes:
        """The whole body."""
        ...

    def ready(self) -> bytes:
        """Body bytes already here, taken (chunks() will not yield them), when more is to come; b"" when
        none are, or when the body is complete (all of it then comes from chunks(), with its end). An
        implementation may always say b"" (the fake, aiohttp's)."""
        ...

    def chunks(self, forward: Callable[[bytes], bool] | None = None) -> AsyncIterator[bytes]:
        """Body bytes as they arrive, without waiting to fill a buffer. `forward`, where the client
        can take them: bytes may be handed to it as they arrive instead (it says whether it took them),
        and only what it did not take is yielded; an implementation may ignore it and yield everything."""
        ...

    @property
    def complete(self) -> bool:
        """The whole body has arrived and been handed over (true with the last chunk when the end came
        with it)."""
        ...

    def close(self) -> None:
        """Done with it; closing an unfinished body is how the replica learns the request was abandoned."""
        ...


class Upstream(Protocol):
    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None,
                   timeout_s: float) -> UpstreamResponse:
        """POST and wait for the response head. Connection errors and 5xx/429 heads raise
        UpstreamError (`retryable` only when the request never reached the replica or was refused
        by a 429 or 503); other statuses are returned for the caller to pass on.
        `timeout_s` bounds the wait for the head and then each read (a stalled stream)."""
        ...

    async def get_ok(self, url: str, timeout_s: float, *, api_key: str | None = None) -> tuple[bool, str]:
        """An active health check: whether it passed, and a short detail."""
        ...


def decode_object(raw: bytes) -> dict[str, Any]:
    """An upstream JSON body or chunk, which must be an object: anything else is the replica's fault."""
    try:
        value = _decode.decode(raw)
    except msgspec.DecodeError as exc:
        raise UpstreamError("upstream", f"answered invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UpstreamError("upstream", f"answered JSON that is not an object: {raw[:100]!r}")
    return value


def shaped(translate: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A codec's translation of an upstream answer; a chat body of another shape than chat's
    (choices that are not objects, say) is the replica's fault, not a crash of the router."""
    try:
        return translate(*args, **kwargs)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise UpstreamError("upstream", f"answered a body that is not a chat completion: {exc!r}") from None
