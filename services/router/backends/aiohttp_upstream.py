"""The router process's calls to replicas over aiohttp (the `Upstream` port of upstream.py): one
shared session (keep-alive connections per replica), responses opened so bytes pass through as they
arrive, and 5xx/429 heads raised as UpstreamError, which may be retried (nothing reached the client yet).

aiohttp rather than httpx: httpcore's pool walks every pooled connection (a poll() each) on every
request, which made it most of the router's CPU at 64 concurrent requests (encode/httpcore#1035).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import aiohttp
from opentelemetry.trace import Span

import tracing
from services.router.backends.http1 import Connection, Http1Client, Http1Response, NotConnected
from services.router.backends.upstream import READ_ERRORS, StallTimer, UpstreamError

# Connecting failed (refused, no route), or the connection broke before the response head: the replica
# may be down, which a passing health check then answers (pool.py). A timeout says it is slow.
_UNREACHABLE = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
# No connection was made (refused, no route, DNS, the connect timeout): no byte of the request left the
# router. Any later failure (the connection dropped after the request was written, a read timeout) may
# follow a request the replica read and is running: sending it elsewhere could run it twice.
_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
# Heads that say the replica did not take the request (overloaded, not ready, draining): another may.
_REFUSALS = (429, 503)


class AiohttpResponse:
    """An upstream response whose head has arrived (the `UpstreamResponse` port)."""

    __slots__ = ("_raw", "_read_timeout_s", "content_type", "span", "status", "url")

    def __init__(self, raw: aiohttp.ClientResponse, span: Span | None = None, read_timeout_s: float = 0.0) -> None:
        self._raw = raw
        self.span = span  # the attempt's span (tracing on): it ends with the response
        self._read_timeout_s = read_timeout_s  # a stalled body: no byte for this long (0: no bound)
        self.status = raw.status
        self.content_type = raw.headers.get("content-type", "application/json")
        self.url = str(raw.url)

    async def read(self) -> bytes:
        return await self._raw.read()

    def ready(self) -> bytes:
        return b""  # not used where this client serves (https replicas): chunks() yields them all

    async def chunks(self, forward: Callable[[bytes], bool] | None = None) -> AsyncIterator[bytes]:
        """Body bytes as they arrive, without waiting to fill a buffer. No byte for the read timeout
        while waiting for one raises aiohttp.SocketTimeoutError (a stalled upstream).

        aiohttp's own sock_read bound cancels a timer and arms a new one on every read from the socket:
        per streamed chunk, that was a cost of the relay's hot path. Here it is off once the body
        streams; one timer checks, when it fires, how long this reader has been waiting, and otherwise
        re-arms for what is left. Time spent in the consumer (a slow client's backpressure) is not
        counted, as aiohttp does not count it (it stops the timer while reading is paused). `forward` is
        not used: every chunk is yielded (https replicas, where this client serves generation calls)."""
        content = self._raw.content
        read = content.readany
        if not self._read_timeout_s:
            while chunk := await read():
                yield chunk
            return
        connection = self._raw.connection
        if connection is not None and connection.protocol is not None:
            connection.protocol.read_timeout = None  # its armed timer is cancelled by the next read
        stall = StallTimer(asyncio.get_running_loop(), self._read_timeout_s, content.set_exception)
        stall.waiting()
        try:
            while chunk := await read():
                stall.got()
                yield chunk
                stall.waiting()
        finally:
            stall.cancel()

    @property
    def complete(self) -> bool:
        return self._raw.content.at_eof()

    def close(self) -> None:
        """Done with it: a finished body gives the connection back to the pool; an unfinished one
        closes it, which is how the replica learns the request was abandoned."""
        complete = self._raw.content.at_eof()
        if complete:
            self._raw.release()
        else:
            self._raw.close()
        if self.span is not None:
            self.span.set_attribute("router.upstream.body_complete", complete)
            self.span.end()
            self.span = None


class AiohttpUpstream:
    def __init__(self) -> None:
        # limit=0: no pool-wide cap; the router's per-replica in-flight cap bounds connections.
        # keepalive_timeout under uvicorn's 5 s (vLLM's server; ours keeps 75 s): an idle connection is
        # dropped here before a replica closes it, since a request sent as the replica's close crosses it
        # fails with nothing to show it never ran there, and is then not retried (dispatch.py).
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4, enable_cleanup_closed=True),
            auto_decompress=False, skip_auto_headers=("User-Agent",))
        self.http1 = Http1Client()  # generation calls to http:// replicas (https ones, and health checks: aiohttp)

    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None,
                   timeout_s: float) -> AiohttpResponse | Http1Response:
        """POST and wait for the response head. Connection errors and 5xx/429 heads raise
        UpstreamError (`retryable` when nothing was sent, or the head is a 429 or 503 refusal); other
        statuses are returned for the caller to pass on.
        `timeout_s` bounds the wait for the head and then each read (a stalled stream)."""
        headers = request_headers(api_key)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=timeout_s)
        # Each attempt is a span of its own (a retry is another call), its context sent as `traceparent`
        # so that the replica's server span continues it; it ends when the response is closed.
        span = tracing.start_span("router.upstream", kind=tracing.CLIENT, attributes={
            "server.address": base_url, "url.full": base_url + path, "http.request.method": "POST"})
        if span is not None:
            headers.update(tracing.headers_of(span))
        elif (passed := tracing.passed()) is not None:
            headers.update(passed)
        response: AiohttpResponse | Http1Response
        try:
            if base_url.startswith("http://"):  # the lean client (http1.py); it sends no redirects either
                response = await self.http1.post(base_url, path, body, headers, timeout_s=timeout_s)
            else:
                # No redirects: following one would turn the POST into a bodiless GET.
                raw = await self.session.post(base_url + path, data=body, headers=headers, timeout=timeout,
                                              allow_redirects=False)
                response = AiohttpResponse(raw, None, timeout_s)
        except NotConnected as exc:  # nothing was sent: another replica may take it
            error = UpstreamError(base_url, str(exc), unreachable=not exc.timed_out, retryable=True)
            _failed(span, str(error), error.retryable)
            raise error from None
        except READ_ERRORS as exc:
            raise _read_error(base_url, exc, span) from None
        except BaseException:  # cancelled (the client left): the span still ends
            _failed(span, "cancelled", False)
            raise
        return await self._headed(base_url, response, span)

    async def sent(self, base_url: str, path: str, conn: Connection, timeout_s: float) -> Http1Response:
        """`open`'s answer for a request the router's lane wrote itself on an idle connection of `http1`
        (Http1Client.send; tracing off, so no span): the head, or UpstreamError as `open` raises it."""
        try:
            response = await self.http1.head(base_url, path, conn, timeout_s)
        except READ_ERRORS as exc:
            raise _read_error(base_url, exc, None) from None
        headed = await self._headed(base_url, response, None)
        assert isinstance(headed, Http1Response)  # as given
        return headed

    async def _headed(self, base_url: str, response: AiohttpResponse | Http1Response,
                      span: Span | None) -> AiohttpResponse | Http1Response:
        """A response whose head is in: returned, or UpstreamError for a 5xx or 429 (its body read for
        the message, and closed)."""
        if span is not None:
            span.set_attribute("http.response.status_code", response.status)
        if response.status >= 500 or response.status == 429:
            try:
                detail = (await response.read())[:300].decode(errors="replace")
            except READ_ERRORS:
                detail = ""
            finally:
                response.close()
            _failed(span, f"HTTP {response.status}", response.status in _REFUSALS)
            raise UpstreamError(base_url, f"HTTP {response.status}: {detail}",
                                retryable=response.status in _REFUSALS)
        response.span = span
        return response

    async def get_ok(self, url: str, timeout_s: float, *, api_key: str | None = None) -> tuple[bool, str]:
        """An active health check: any status below 400 passes."""
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        try:
            async with self.session.get(url, headers=headers,
                                        timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                await r.read()
                return r.status < 400, f"HTTP {r.status}"
        except READ_ERRORS as exc:
            return False, _describe(exc)

    async def close(self) -> None:
        self.http1.close()
        await self.session.close()


def request_headers(api_key: str | None) -> dict[str, str]:
    """Every generation call's headers but for the trace context."""
    # identity: bytes pass through to the client as they are, without re-encoding.
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def _read_error(base_url: str, exc: BaseException, span: Span | None) -> UpstreamError:
    """A failure before the head (aiohttp's types, which both clients raise) as an UpstreamError."""
    error = UpstreamError(base_url, _describe(exc), unreachable=isinstance(exc, _UNREACHABLE),
                          retryable=isinstance(exc, _NOT_SENT))
    _failed(span, str(error), error.retryable)
    return error


def _failed(span: Span | None, why: str, retryable: bool) -> None:
    if span is not None:
        span.set_attribute("router.upstream.retryable", retryable)
        tracing.fail(span, why)
        span.end()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
