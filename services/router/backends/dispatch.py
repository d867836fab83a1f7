"""Dispatch to a pool's replicas (router process): a lease on a free replica of the first pool of a
plan that has one, else a wait in a pool's queue for a ticketed request (fair_queue.py), retried on
another replica when the request provably never reached the first (no connection) or was refused there
(429, 503, or the pool's api_key refused). What the replica answers goes back to the client through the
listeners (listeners/relay.py)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

import tracing
from services.router.backends.fair_queue import NO_ENDPOINT, Ticket
from services.router.backends.pool import Lease, NoReplica, Overloaded, Pool
from services.router.backends.upstream import READ_ERRORS, Upstream, UpstreamError, UpstreamResponse
from services.router.config import RouterConfig
from services.router.errors import HTTPError
from services.router.metrics import RouterMetrics

log = logging.getLogger("router")

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()


# A first attempt made outside the dispatcher: its lease, the awaitable of its response head, and when its
# request was sent (perf_counter).
Attempt = tuple["Lease", "Awaitable[UpstreamResponse]", float]


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

    async def open_any(self, chat: dict[str, Any], text: str, path: str, pools: tuple[str, ...],
                       payloads: dict[str, bytes], *, stream: bool | None = None, bulk: bytes = b"",
                       ticket: Ticket | None = None, first: Attempt | None = None) -> Opened:
        """`chat` (a chat or completions body, but for the model) POSTed to `path` on the first of `pools`
        with a free replica that answers; the refusal that says most otherwise. A failure after the
        request may have reached a replica is a 502 at once: neither another replica nor another pool
        is sent what may be running already. `text` is what the policies read of it. `payloads` keeps
        each pool's request body across calls; stream=False asks for a whole answer. `bulk`: fields
        left out of `chat` (a long body's messages or prompt), already encoded as a JSON object.
        `ticket`: whose request it is; when every pool of the plan is at its cap, it waits in the queue
        of the first one with room (None: 429 at once, as the judge's calls do). `first`: the first pool's
        first attempt, made already (its lease, and what answers its head: the router's lane's hand-over)."""
        refusals: list[HTTPError] = []
        single = len(pools) == 1  # no other pool to try first: it may wait at once
        for name in pools:
            result = await self._open(chat, text, path, name, self._payload(name, chat, payloads, stream, bulk), bulk,
                                      ticket if single else None, first)
            first = None
            if isinstance(result, Opened):
                return result
            refusals.append(result)
        if ticket is not None and not single:
            full = [name for name, r in zip(pools, refusals, strict=True) if r.status == 429]
            queued = next((n for n in full if (q := self.pools[n].queue) is not None and not q.full()),
                          full[0] if full else None)
            if queued is not None:
                result = await self._open(chat, text, path, queued, payloads[queued], bulk, ticket)
                if isinstance(result, Opened):
                    return result
                refusals[pools.index(queued)] = result
        overloaded = [r for r in refusals if r.status == 429]
        if overloaded:
            for name in pools:
                self.metrics.overloaded.labels(name).inc()
            raise overloaded[0]
        raise refusals[-1]

    def payload(self, name: str, chat: dict[str, Any]) -> bytes:
        """`chat` as pool `name`'s request body (its model in place of the client's)."""
        return self._payload(name, chat, {}, None, b"")

    def _payload(self, name: str, chat: dict[str, Any], payloads: dict[str, bytes], stream: bool | None,
                 bulk: bytes) -> bytes:
        payload = payloads.get(name)
        if payload is None:
            body = {**chat, "model": self.config.pools[name].model}
            if stream is False:
                body.pop("stream", None)
                body.pop("stream_options", None)
            payload = payloads[name] = _joined(_json.encode(body), bulk)
        return payload

    async def _open(self, chat: dict[str, Any], text: str, path: str, name: str, payload: bytes,
                    bulk: bytes, ticket: Ticket | None, first: Attempt | None = None) -> Opened | HTTPError:
        """One pool: a free replica, retried on the next one when the request never reached it or was
        refused there; a 502 raised when it may have run there. With a ticket, a wait in the pool's queue
        when every replica is at its cap; a retry (its replica failed) waits first in line, so it is
        never queued behind everyone again."""
        pool, config = self.pools[name], self.config.pools[name]
        tried: set[str] = set()
        last_error = ""
        try:
            if bulk and pool.policy.reads_body:  # precise_prefix renders the messages: it needs them whole
                chat = {**chat, **await asyncio.to_thread(_decode.decode, bulk)}
            prepared = await pool.prepare(chat, len(payload))
        except BaseException:  # cancelled (the client left): a first attempt made already is let go
            if first is not None:
                _abandon(first)
            raise
        while True:
            attempt: Awaitable[UpstreamResponse] | None = None
            lease: Lease | Overloaded | NoReplica
            if first is not None:  # made already: its lease taken, its request sent
                (lease, attempt, sent), first = first, None
            else:
                lease = await self._admit(pool, ticket, len(payload), text, frozenset(tried), prepared)
            if isinstance(lease, Overloaded):
                if last_error:
                    return HTTPError(502, f"pool {name!r}: {len(tried)} replica(s) failed ({last_error}) and "
                                     "the rest are at their in-flight cap")
                return HTTPError(429, f"{lease.reason}; retry after {lease.retry_after_s}s",
                                 headers=[(b"retry-after", str(lease.retry_after_s).encode())])
            if isinstance(lease, NoReplica):
                if last_error:
                    return HTTPError(502, f"pool {name!r}: every replica tried failed; last: {last_error}")
                return HTTPError(503, lease.reason)
            if tried:
                self.metrics.retries.labels(name).inc()
            url = lease.replica.url
            tried.add(url)
            started = sent if attempt is not None else time.perf_counter()
            try:
                response = await (attempt if attempt is not None else self.upstream.open(
                    url, path, payload, api_key=config.api_key, timeout_s=config.timeout_s))
            except UpstreamError as exc:
                lease.release(False, unreachable=exc.unreachable)
                self.metrics.upstream_errors.labels(name).inc()
                if not exc.retryable:
                    log.warning("pool %s: %s; not retried: the replica may have run the request", name, exc)
                    raise HTTPError(502, f"pool {name!r}: {exc}; not retried on another replica, as the request "
                                    "may have reached this one") from None
                last_error = str(exc)
                log.warning("pool %s: %s; trying another replica", name, exc)
                continue
            except BaseException:
                lease.release(None)
                raise
            if response.status in (401, 403):
                # The client's key was the router's to check, and it passed: this refusal is of the pool's
                # own api_key, which the client can do nothing about (a 502, not the replica's 401).
                detail = await _detail(response)
                lease.release(None)  # a config error, not a failing replica: its breaker stays as it is
                self.metrics.upstream_errors.labels(name).inc()
                last_error = (f"{url} refused the pool's api_key (HTTP {response.status}: {detail}); "
                              f"check pools.{name}.api_key")
                if not lease.replica.key_refused:
                    lease.replica.key_refused = True
                    log.error("pool %s: replica %s refuses the pool's api_key (HTTP %d: %s); check pools.%s.api_key",
                              name, url, response.status, detail, name)
                continue
            self.answered(name, lease, started)
            return Opened(response, lease, name, len(tried))

    async def _admit(self, pool: Pool, ticket: Ticket | None, size: int, text: str, tried: frozenset[str],
                     prepared: object) -> Lease | Overloaded | NoReplica:
        """A lease on a free replica of `pool`, or a wait in its queue for a ticketed request."""
        with tracing.span("router.admission", {"router.pool": pool.name, "router.attempt": len(tried) + 1}) as span:
            lease = pool.acquire(size, text=text, exclude=tried, prepared=prepared)
            if isinstance(lease, Overloaded) and ticket is not None:  # every replica at its cap: the queue
                if span is not None:
                    span.set_attribute("router.admission.queued", True)
                lease = await self._wait(pool, ticket, size, text, tried, prepared)
            if span is not None:
                span.set_attribute("router.admission.outcome", _outcome(lease))
        return lease

    def answered(self, name: str, lease: Lease, started: float) -> None:
        """A replica of pool `name` answered a head that is not a refusal (its request sent at `started`,
        perf_counter): its key flag and half-open breaker told, the latency observed."""
        if lease.replica.key_refused:
            lease.replica.key_refused = False
            log.warning("pool %s: replica %s accepts the pool's api_key again", name, lease.replica.url)
        if lease.probe:
            # A half-open breaker closes at the head: the replica answers. Other requests count as
            # a success only when they end well, so responses that keep breaking off open it.
            lease.succeeded()
        self.metrics.upstream_latency_of(name).observe(time.perf_counter() - started)

    async def _wait(self, pool: Pool, ticket: Ticket, size: int, text: str, tried: frozenset[str],
                    prepared: object) -> Lease | Overloaded | NoReplica:
        """A wait in `pool`'s queue, counted: its time when served, its refusal by reason."""
        started = time.perf_counter()
        m, name, cls = self.metrics, pool.name, ticket.priority
        try:
            got = await pool.wait(size, ticket, text=text, exclude=tried, prepared=prepared, retry=bool(tried))
        except BaseException:
            m.queue_abandoned.labels(name, cls).inc()
            raise
        if isinstance(got, Lease):
            m.queue_wait.labels(name, cls).observe(time.perf_counter() - started)
            m.queue_served.labels(name, cls).inc()
        else:
            reason = got.refusal if isinstance(got, Overloaded) else NO_ENDPOINT
            m.queue_rejections.labels(name, cls, ticket.tenant, reason).inc()
        return got


def _abandon(first: Attempt) -> None:
    """A first attempt never awaited: its lease given back, its head's awaitable closed (a coroutine that
    has not run sends nothing; one that has is the upstream response's, closed with it)."""
    lease, attempt, _ = first
    lease.release(None)
    close = getattr(attempt, "close", None)
    if close is not None:
        close()


def _outcome(lease: Lease | Overloaded | NoReplica) -> str:
    if isinstance(lease, Overloaded):
        return "overloaded"
    return "no_replica" if isinstance(lease, NoReplica) else "admitted"


def _joined(head: bytes, bulk: bytes) -> bytes:
    """Two encoded JSON objects with no key in common as one (`bulk` may be b"": none)."""
    if not bulk or bulk == b"{}":
        return head
    return head[:-1] + b"," + bulk[1:] if head != b"{}" else bulk


async def _detail(response: UpstreamResponse) -> str:
    """The start of a refusal's body, for the operator's log and the client's 502; the response closed."""
    try:
        return (await response.read())[:300].decode(errors="replace")
    except READ_ERRORS as exc:
        return f"body unread: {type(exc).__name__}"
    finally:
        response.close()
