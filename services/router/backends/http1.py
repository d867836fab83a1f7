"""A lean HTTP/1.1 client for the router process's generation calls to plain-http replicas: one POST at a
time per connection, connections kept alive per replica, the response parsed by httptools as it
arrives and its body handed over as it comes. aiohttp_upstream.py uses it for `http://` replicas.

Why not aiohttp for these: aiohttp's request path (its request and response objects, header multidicts,
cookie jar, timers, a StreamReader per body) cost ~280 us of CPU per POST here against ~90 us for a
bare asyncio-streams client, one loop POSTing to the test backend in turn; and a router relays every
request (bench/router_latency.py --stream measures the router before and after). Errors keep
aiohttp's types (READ_ERRORS in upstream.py covers them), so what calls the port cannot tell the two
clients apart.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import httptools

from services.router.backends.upstream import StallTimer

# A body buffered past this while the relay is busy sending (a slow client): stop reading the replica.
_PAUSE_BYTES = 1 << 20
# Under the replicas' keep-alive (uvicorn's 5 s): a connection idle longer is not reused, since a request
# sent as the replica closes it fails with nothing to show it never ran there (dispatch.py).
KEEPALIVE_S = 4.0
CONNECT_TIMEOUT_S = 5.0


class NotConnected(Exception):
    """No connection could be made: no byte of the request left the router."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class Watcher(Protocol):
    """What follows a response in the connection's callbacks instead of a reader (listeners/lane.py)."""

    def fed(self) -> None:
        """A read was parsed (the head, body bytes, the end: see the connection's state)."""

    def failed(self, exc: BaseException) -> None:
        """The response failed (the connection lost or broken, a timer's error): `exc`, as a reader gets it."""


class Connection(asyncio.Protocol):
    """One keep-alive connection to a replica and the response in progress on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.idle_since = 0.0
        self.reset()

    def reset(self) -> None:
        """Ready for the next request's response."""
        self.head: asyncio.Future[None] | None = None
        self.head_timer: asyncio.TimerHandle | None = None  # the head's deadline (Http1Client.send arms it)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.framed = False  # content-length or chunked: else the body runs to the connection's end
        self.keep_alive = False  # read with the head: the parser forgets it once the message is complete
        self.body: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None
        self.done = False
        self.error: BaseException | None = None
        # While the reader waits: where body bytes go as they arrive, without waking it (None: to the reader).
        self.forward: Callable[[bytes], bool] | None = None
        self.stall: StallTimer | None = None  # the reader's: bytes forwarded restart its wait
        # The router's lane (listeners/lane.py) in place of a reader: told of each read, the end, a failure.
        self.watcher: Watcher | None = None

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(aiohttp.ClientPayloadError(f"invalid HTTP response: {exc}"))
            if self.transport is not None:
                self.transport.close()
            return
        if self.watcher is not None:
            self.watcher.fed()
            return
        if not self.body:
            return
        # The body bytes this read brought: forwarded at once when the reader is parked with nothing of
        # its own to send (so the order holds) and the forward takes them; else the reader is woken. The
        # end of the body wakes it anyway (on_message_complete): its last piece goes out with the end.
        forward, waiter = self.forward, self.waiter
        if forward is not None and waiter is not None and not waiter.done():
            data = self.take()
            if forward(data):
                if self.stall is not None:
                    self.stall.waiting()
                return
            self.body.append(data)  # refused (the client's transport is paused or gone): the reader's again
            self.buffered = len(data)
        self.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.head is not None and self.head.done() and not self.framed and not self.done:
            self.on_message_complete()  # a body that runs to the connection's end has ended
            if self.watcher is not None:
                self.watcher.fed()
        elif not self.done:
            self.fail(aiohttp.ServerDisconnectedError() if self.head is None or not self.head.done() else
                      aiohttp.ClientPayloadError("Response payload is not completed: the connection was lost"))

    # ---- httptools callbacks ----

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self.headers.append((name, value))
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self._disarm_head()
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _PAUSE_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.done = True
        self.wake()

    # ----

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _disarm_head(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def fail(self, exc: BaseException) -> None:
        self._disarm_head()
        if self.error is None:
            self.error = exc
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        self.wake()
        if self.watcher is not None:
            self.watcher.failed(exc)

    def take(self) -> bytes:
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return (self.done and not self.lost and self.error is None and self.keep_alive
                and self.transport is not None and not self.transport.is_closing())


class Http1Response:
    """A response whose head has arrived (the `UpstreamResponse` port)."""

    __slots__ = ("_client", "_conn", "_key", "_read_timeout_s", "content_type", "span", "status", "url")

    def __init__(self, client: Http1Client, key: tuple[str, int], conn: Connection, url: str,
                 read_timeout_s: float, span: Any = None) -> None:
        self._client = client
        self._key = key
        self._conn = conn
        self._read_timeout_s = read_timeout_s
        self.span = span  # the attempt's span (tracing on): it ends with the response
        self.url = url
        self.status = conn.status
        self.content_type = next((v.decode("latin-1") for k, v in conn.headers if k == b"content-type"),
                                 "application/json")

    @property
    def complete(self) -> bool:
        return self._conn.done and not self._conn.body

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def ready(self) -> bytes:
        """Body bytes that came with the head, taken, when more is to come (b"" otherwise)."""
        conn = self._conn
        return conn.take() if conn.body and not conn.done and conn.error is None else b""

    async def chunks(self, forward: Callable[[bytes], bool] | None = None) -> AsyncIterator[bytes]:
        """Body bytes as they arrive. No byte for the read timeout while waiting for one raises
        aiohttp.SocketTimeoutError (a stalled replica); time spent in the consumer does not count (a
        slow client's backpressure). One timer per wait period, checked when it fires, not one per chunk.

        `forward`: while this waits, each read's body bytes are handed to it in the connection's own
        callback, and not yielded when it takes them (True): no wake-up of this reader per chunk. What it
        refuses (False: the client's transport is paused, say) is yielded, in order, and the body's last
        piece always is (it goes out with the response's end)."""
        conn, timeout = self._conn, self._read_timeout_s
        stall = StallTimer(conn.loop, timeout, conn.fail) if timeout else None
        conn.forward, conn.stall = forward, stall
        try:
            while True:
                if conn.body:
                    if stall is not None:
                        stall.got()
                    yield conn.take()
                elif conn.error is not None:
                    raise conn.error
                elif conn.done:
                    return
                else:
                    if stall is not None:
                        stall.waiting()
                    conn.waiter = conn.loop.create_future()
                    await conn.waiter
        finally:
            conn.forward = conn.stall = None
            if stall is not None:
                stall.cancel()

    def close(self) -> None:
        """Done with it: a finished body gives the connection back to the pool; an unfinished one
        closes it, which is how the replica learns the request was abandoned."""
        conn = self._conn
        complete = conn.done and not conn.body
        if complete and conn.reusable():
            self._client.give_back(self._key, conn)
        elif conn.transport is not None:
            conn.transport.close()
        if self.span is not None:
            self.span.set_attribute("router.upstream.body_complete", complete)
            self.span.end()
            self.span = None


class Http1Client:
    """Keep-alive connections per replica (host, port), the most recently used first."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self._targets: dict[str, tuple[tuple[str, int], str, bytes]] = {}

    def _target(self, base_url: str) -> tuple[tuple[str, int], str, bytes]:
        """(host, port), path prefix and Host header of a base URL, parsed once."""
        target = self._targets.get(base_url)
        if target is None:
            parts = urlsplit(base_url)
            host = parts.hostname or "localhost"
            target = ((host, parts.port or 80), parts.path.rstrip("/"), parts.netloc.encode())
            self._targets[base_url] = target
        return target

    async def post(self, base_url: str, path: str, body: bytes, headers: dict[str, str], *,
                   timeout_s: float) -> Http1Response:
        """POST and wait for the response head. NotConnected when no connection could be made; aiohttp's
        errors after (ServerDisconnectedError: lost before the head; SocketTimeoutError: no head within
        `timeout_s`, which then bounds each wait for body bytes too)."""
        key = self._target(base_url)[0]
        conn = await self._connection(key)
        if conn.lost or conn.transport is None or conn.transport.is_closing():
            # Connected, then closed by the replica before a byte was written (one dying with connections
            # in its listen backlog, its close read while this task waited to run): nothing was sent, so it
            # is a connection not made. (uvloop's write would raise RuntimeError on the closed transport.)
            raise NotConnected(f"{key[0]}:{key[1]} closed the connection before the request was sent",
                               timed_out=False)
        self.send(base_url, conn, path, body, headers, timeout_s)
        return await self.head(base_url, path, conn, timeout_s)

    def send(self, base_url: str, conn: Connection, path: str, body: bytes, headers: dict[str, str],
             timeout_s: float) -> None:
        """The request written on `conn` (open, idle), its response head awaited from now: no head within
        `timeout_s` (0: no bound) fails the connection with aiohttp.SocketTimeoutError."""
        _, prefix, host = self._target(base_url)
        conn.reset()
        conn.head = conn.loop.create_future()
        if timeout_s:
            conn.head_timer = conn.loop.call_later(timeout_s, conn.fail,
                                                   aiohttp.SocketTimeoutError("no response head in time"))
        lines = [b"POST %b HTTP/1.1\r\nhost: %b\r\ncontent-length: %d\r\n"
                 % ((prefix + path).encode(), host, len(body))]
        lines += [b"%b: %b\r\n" % (name.encode(), value.encode()) for name, value in headers.items()]
        lines.append(b"\r\n")
        lines.append(body)
        assert conn.transport is not None  # connected
        conn.transport.write(b"".join(lines))

    async def head(self, base_url: str, path: str, conn: Connection, timeout_s: float) -> Http1Response:
        """The response of the request `send` wrote on `conn`, once its head is in (at once when it is in
        already, or failed; `send`'s deadline bounds the wait)."""
        assert conn.head is not None  # a request was sent
        try:
            await conn.head
        except BaseException:
            if conn.transport is not None:
                conn.transport.close()  # no head (or abandoned): the connection is not reused
            raise
        return Http1Response(self, self._target(base_url)[0], conn, base_url + path, timeout_s)

    def idle(self, base_url: str) -> Connection | None:
        """A kept-alive connection to `base_url`'s replica that may be used now (taken), or None."""
        return self._take_idle(self._target(base_url)[0])

    def _take_idle(self, key: tuple[str, int]) -> Connection | None:
        """The most recently used idle connection to `key` still fit to send on (taken); the unfit closed."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if (not conn.lost and conn.loop.time() - conn.idle_since < KEEPALIVE_S and conn.transport is not None
                    and not conn.transport.is_closing()):
                return conn
            if conn.transport is not None:
                conn.transport.close()
        return None

    async def _connection(self, key: tuple[str, int]) -> Connection:
        conn = self._take_idle(key)
        if conn is not None:
            return conn
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(loop.create_connection(lambda: Connection(loop), *key),
                                                 CONNECT_TIMEOUT_S)
        except OSError as exc:  # TimeoutError among them
            timed_out = isinstance(exc, TimeoutError)
            why = "connect timed out" if timed_out else f"cannot connect to {key[0]}:{key[1]}: {exc}"
            raise NotConnected(why, timed_out=timed_out) from None
        return protocol

    def give_back_to(self, base_url: str, conn: Connection) -> None:
        """`conn` (its response read whole, reusable) kept for `base_url`'s next request."""
        self.give_back(self._target(base_url)[0], conn)

    def give_back(self, key: tuple[str, int], conn: Connection) -> None:
        conn.idle_since = conn.loop.time()
        conn.reset()
        self._idle.setdefault(key, []).append(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()
