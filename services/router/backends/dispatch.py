"""Dispatch of one request to a pool's replicas (router process): a lease on a free replica, retry on
another for failures before the first response byte, then upstream's answer to the client: passed
through as it arrives, translated by the request's API adapter, or an upstream refusal in its shape."""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.types import Send

from services.router.backends.pool import Lease, NoReplica, Overloaded, Pool
from services.router.backends.upstream import (
    READ_ERRORS,
    Upstream,
    UpstreamError,
    UpstreamResponse,
    decode_object,
    shaped,
)
from services.router.config import ListenerConfig, RouterConfig
from services.router.decision.engine import Choice
from services.router.listeners.asgi import JSON, HTTPError
from services.router.listeners.codecs.codec import Adapter
from services.router.listeners.sse import SSEData
from services.router.metrics import RouterMetrics

log = logging.getLogger("router")

SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_json = msgspec.json.Encoder()


@dataclass(slots=True)
class Call:
    """One public request on its way through the router."""
    listener: ListenerConfig
    adapter: Adapter  # of the API the client called
    request: dict[str, Any]  # the body as the client sent it
    chat: dict[str, Any]  # as a chat or completions body (what goes upstream, but for the model)
    choice: Choice
    status: int = 0  # of the response started to the client
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # x-router-* for the client
    escalation: dict[str, Any] | None = None  # which escalate stage answered, told in non-streamed bodies

    async def start(self, send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        await send({"type": "http.response.start", "status": status, "headers": headers + self.headers})


@dataclass(slots=True)
class Opened:
    """A replica's response head, with the lease that holds its slot."""
    response: UpstreamResponse
    lease: Lease
    pool: str
    attempts: int


class Dispatcher:
    def __init__(self, config: RouterConfig, pools: Mapping[str, Pool], upstream: Upstream,
                 metrics: RouterMetrics) -> None:
        self.config = config
        self.pools = pools
        self.upstream = upstream
        self.metrics = metrics

    async def dispatch(self, call: Call, send: Send) -> None:
        """The request to the first pool of its plan that has a free replica, and the answer to the client."""
        opened = await self.open_any(call, call.choice.plan, {})
        call.headers += [(b"x-router-pool", opened.pool.encode()),
                         (b"x-router-replica", opened.lease.replica.url.encode()),
                         (b"x-router-attempts", str(opened.attempts).encode())]
        response = opened.response
        ok: bool | None = None  # None: abandoned (the client left), which says nothing about the replica
        try:
            if response.status != 200:
                await self._upstream_refusal(call, response, send)
                ok = True
            elif call.adapter.passthrough:
                ok = await self._pass_through(call, response, send)
            elif call.chat.get("stream"):
                ok = await self._adapt_stream(call, response, send)
            else:
                chat = decode_object(await response.read())
                await self.send_adapted(call, chat, send)
                ok = True
        except (*READ_ERRORS, UpstreamError) as exc:
            ok = False
            log.warning("upstream %s failed mid-response: %s", opened.lease.replica.url, exc)
            if call.status == 0:
                raise HTTPError(502, f"upstream {opened.lease.replica.url} failed: {exc}") from None
        finally:
            response.close()
            opened.lease.release(ok)
            if ok is False:
                self.metrics.upstream_errors.labels(opened.pool).inc()

    async def open_any(self, call: Call, pools: tuple[str, ...], payloads: dict[str, bytes], *,
                       stream: bool | None = None) -> Opened:
        """The first of `pools` with a free replica that answers; the refusal that says most otherwise.
        `payloads` keeps each pool's request body across calls; stream=False asks for a whole answer."""
        refusals: list[HTTPError] = []
        for name in pools:
            payload = payloads.get(name)
            if payload is None:
                body = {**call.chat, "model": self.config.pools[name].model}
                if stream is False:
                    body.pop("stream", None)
                    body.pop("stream_options", None)
                payload = payloads[name] = _json.encode(body)
            result = await self._open(call, name, payload)
            if isinstance(result, Opened):
                return result
            refusals.append(result)
        overloaded = [r for r in refusals if r.status == 429]
        if overloaded:
            for name in pools:
                self.metrics.overloaded.labels(name).inc()
            raise overloaded[0]
        raise refusals[-1]

    async def _open(self, call: Call, name: str, payload: bytes) -> Opened | HTTPError:
        """One pool: a free replica, retried on the next one for failures before the first byte."""
        pool, config = self.pools[name], self.config.pools[name]
        tried: set[str] = set()
        last_error = ""
        prepared = await pool.prepare(call.chat, len(payload))
        while True:
            lease = pool.acquire(len(payload), text=call.choice.text, exclude=frozenset(tried), prepared=prepared)
            if isinstance(lease, Overloaded):
                if last_error:
                    return HTTPError(502, f"pool {name!r}: {len(tried)} replica(s) failed ({last_error}) and "
                                     "the rest are at their in-flight cap")
                return HTTPError(429, f"{lease.reason}; retry after {lease.retry_after_s}s",
                                 code="overloaded", headers=[(b"retry-after", str(lease.retry_after_s).encode())])
            if isinstance(lease, NoReplica):
                if last_error:
                    return HTTPError(502, f"pool {name!r}: every replica tried failed; last: {last_error}")
                return HTTPError(503, lease.reason, code="no_replica")
            if tried:
                self.metrics.retries.labels(name).inc()
            url = lease.replica.url
            tried.add(url)
            started = time.perf_counter()
            try:
                response = await self.upstream.open(url, call.adapter.upstream_path, payload,
                                                     api_key=config.api_key, timeout_s=config.timeout_s)
            except UpstreamError as exc:
                lease.release(False, unreachable=exc.unreachable)
                self.metrics.upstream_errors.labels(name).inc()
                last_error = str(exc)
                log.warning("pool %s: %s; trying another replica", name, exc)
                continue
            except BaseException:
                lease.release(None)
                raise
            if lease.probe:
                # A half-open breaker closes at the head: the replica answers. Other requests count as
                # a success only when they end well, so responses that keep breaking off open it.
                lease.succeeded()
            self.metrics.upstream_latency.labels(name).observe(time.perf_counter() - started)
            return Opened(response, lease, name, len(tried))

    async def _pass_through(self, call: Call, response: UpstreamResponse, send: Send) -> bool:
        """Upstream bytes to the client: a stream as each piece arrives, a JSON body in one send once
        complete (it is useless to a client before then). False when upstream broke off."""
        content_type = response.content_type.encode()
        streaming = content_type.startswith(b"text/event-stream")
        try:
            if not streaming:
                body = await response.read()
                await call.start(send, 200, [(b"content-type", content_type),
                                             (b"content-length", str(len(body)).encode())])
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return True
            await call.start(send, 200, [(b"content-type", content_type)])
            async for chunk in response.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except READ_ERRORS as exc:
            log.warning("upstream %s broke off a response: %s", response.url, exc)
            if call.status == 0:
                raise
            if streaming:
                tail = call.adapter.stream(call.request).error(f"upstream failed mid-stream: {type(exc).__name__}")
                await send({"type": "http.response.body", "body": tail, "more_body": False})
            return False
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def _adapt_stream(self, call: Call, response: UpstreamResponse, send: Send) -> bool:
        """Upstream chat chunks as the API's events, translated as each arrives."""
        stream = call.adapter.stream(call.request)
        await call.start(send, 200, SSE)
        await send({"type": "http.response.body", "body": stream.start(), "more_body": True})
        done, reader = False, SSEData()

        async def translate(events: list[bytes]) -> None:
            """Send what translates; a bad event is raised after the good ones before it went out."""
            nonlocal done
            out, bad = [], None
            for data in events:
                if data.strip() == b"[DONE]":
                    done = True
                elif data.strip():
                    try:
                        out.append(shaped(stream.feed, decode_object(data)))
                    except UpstreamError as exc:
                        bad = exc
                        break
            if out:
                await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
            if bad is not None:
                raise bad

        try:
            async for chunk in response.chunks():
                await translate(reader.feed(chunk))
            await translate(reader.finish())
        except (*READ_ERRORS, UpstreamError) as exc:
            log.warning("upstream %s broke off a stream: %s", response.url, exc)
        # A stream that ended without [DONE] (or was no event stream at all) broke off.
        tail = stream.finish() if done else stream.error("upstream ended the stream early")
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return done

    async def send_adapted(self, call: Call, chat: dict[str, Any], send: Send) -> None:
        """A whole upstream answer as the API's response body."""
        body = shaped(call.adapter.from_chat, chat, call.request)
        if call.escalation is not None:
            body["router"] = call.escalation
        data = _json.encode(body)
        await call.start(send, 200, [*JSON, (b"content-length", str(len(data)).encode())])
        await send({"type": "http.response.body", "body": data, "more_body": False})

    async def _upstream_refusal(self, call: Call, response: UpstreamResponse, send: Send) -> None:
        """A 4xx from upstream (bad request, unknown model there, ...): passed on in the API's shape."""
        raw = await response.read()
        body = call.adapter.refusal_body(response.status, raw)
        if body is None:
            await call.start(send, response.status, [(b"content-type", response.content_type.encode())])
            await send({"type": "http.response.body", "body": raw, "more_body": False})
            return
        await call.start(send, response.status, JSON)
        await send({"type": "http.response.body", "body": body, "more_body": False})
