"""The lane (router process): a plain streamed request relayed in the client connection's and the upstream
connection's callbacks, with no ASGI task, no ASGI messages and no task wake-up between its request's
arrival and its first byte out. The same answer as the ASGI path's, byte for byte but for the `date`
header, at a fraction of the CPU: a router that reads HTTP in Python adds ~nothing to the time to first
byte when its request path is this short (bench/router_floor.py, docs/router.md "The lane").

The lane takes a request only when nothing on its way needs a wait or a hook: a streamed chat or completions
request (`stream: true`) of a pass-through codec, its body whole with its head and under OFF_LOOP_BYTES, its
connection kept alive, tracing off, no plugins, no rate limit on the listener, the decision made on rule
signals alone (or a published pool called by name), not escalate, the plan's first pool's policy needing
no preparation, a free replica there over http:// with an idle kept-alive connection. Anything else, a
refused request included, takes the ASGI path with nothing done: it answers as it always has.

Once the request has gone upstream the lane follows its response in the upstream connection's callbacks
(http1.Watcher): a 200 event stream goes to the client as it comes, head and first bytes in one write;
the end, a break-off (the stream's error tail) and the client's leaving are settled there. Any other head
(a refusal, an error, a non-streamed body), a failure before the head, and a client whose transport is
paused at the head are handed to a task that goes on through the ASGI path's own code from that attempt
(Dispatcher's `first`): retries, refusals in the API's shape and errors are that code's."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Generator
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

import tracing
from services.router.backends.aiohttp_upstream import AiohttpUpstream, request_headers
from services.router.backends.dispatch import Attempt
from services.router.backends.fair_queue import Ticket
from services.router.backends.http1 import Connection, Http1Response
from services.router.backends.pool import Lease, Pool
from services.router.backends.upstream import StallTimer, Upstream
from services.router.config import EscalateAlgorithm, RouterConfig
from services.router.decision.decisions import NoEligibleDecision
from services.router.decision.engine import Choice, Router, UnknownModel
from services.router.errors import HTTPError
from services.router.listeners.access import authorize
from services.router.listeners.body_workers import parse
from services.router.listeners.call import Call
from services.router.listeners.caller import Caller, caller_of
from services.router.listeners.codecs.codec import Codec
from services.router.listeners.codecs.registry import CODECS, output_of
from services.router.listeners.connections import LaneConnection
from services.router.listeners.direct import DirectPools
from services.router.listeners.json_body import BodyError
from services.router.listeners.limits import RateLimiter
from services.router.listeners.listener import Listener
from services.router.listeners.relay import Relay
from services.router.metrics import RouterMetrics

log = logging.getLogger("router")

_EVENT_STREAM = b"text/event-stream"
_WAITING, _STREAMING, _HANDED, _DONE = range(4)


class LaneHost(Protocol):
    """What the lane needs of the router's app (app.py, which makes it): its parts, its count of a choice,
    and the ASGI path's code for a request handed over at its first attempt."""

    @property
    def config(self) -> RouterConfig: ...

    @property
    def pools(self) -> dict[str, Pool]: ...

    @property
    def metrics(self) -> RouterMetrics: ...

    @property
    def relay(self) -> Relay: ...

    @property
    def direct(self) -> DirectPools: ...

    @property
    def router(self) -> Router: ...

    @property
    def limits(self) -> RateLimiter: ...

    @property
    def plugins(self) -> object:
        """Falsy when the config has no plugins."""

    @property
    def listeners_by_port(self) -> dict[int, Listener]: ...

    def count(self, choice: Choice) -> None: ...

    async def handed(self, listener: Listener, call: Call, cycle: RequestResponseCycle, first: Attempt) -> None: ...


class Lane:
    """Which requests the lane takes (module docstring), and their start."""

    def __init__(self, app: LaneHost, upstream: Upstream, off_loop_bytes: int) -> None:
        self.app = app
        self.http1 = upstream.http1 if isinstance(upstream, AiohttpUpstream) else None
        self.upstream = upstream
        self.off_loop_bytes = off_loop_bytes
        self.paths = {codec.path: codec for codec in CODECS.values() if codec.passthrough and not codec.part_of}
        # The listeners it may serve, by port: none with a rate limit (a charge is a wait on the store).
        self.listeners = {port: listener for port, listener in app.listeners_by_port.items()
                          if not app.limits.applies(listener.config)}
        self.enabled = self.http1 is not None and not app.plugins and bool(self.listeners)

    def wants(self, scope: dict[str, Any]) -> bool:
        """Whether a request whose head this is may be the lane's (its body decides the rest)."""
        return scope["method"] == "POST" and scope["path"] in self.paths and not tracing.enabled()

    def take(self, cycle: RequestResponseCycle, connection: LaneConnection) -> bool:
        """Start `cycle`'s request (its body whole) in the lane and say True; or say False with nothing
        done (not counted, nothing leased or sent; a weighted plan's draw aside): the ASGI path has it.
        `connection`: the client's, which tells the lane's stream when it is lost or drains."""
        scope = cycle.scope
        server = scope.get("server")
        listener = self.listeners.get(server[1] if server and server[1] is not None else -1)
        codec = self.paths[scope["path"]]
        body = bytes(cycle.body)
        if (listener is None or codec.name not in listener.config.apis or not cycle.keep_alive
                or cycle.waiting_for_100_continue or not body or len(body) > self.off_loop_bytes):
            return False
        headers = scope["headers"]
        app = self.app
        try:
            authorize(listener.keys, headers)
            parsed = parse(codec.name, body)
            chat = parsed.chat
            if chat.get("stream") is not True or parsed.bulk:
                return False
            caller = caller_of(listener.config, app.config.admission, headers, parsed.request)
            choice = self._choose(listener, chat, parsed.text, output_of(codec.name))
        except (HTTPError, BodyError, UnknownModel, NoEligibleDecision):
            return False  # the ASGI path answers it, in the API's shape
        if choice is None or isinstance(choice.entry.algorithm, EscalateAlgorithm):
            return False
        name = choice.plan[0]
        pool = app.pools[name]
        if pool.policy.reads_body:  # it prepares (tokenizes) before it chooses: a wait
            return False
        if not codec.judged:
            choice = choice.with_text("")  # as the ASGI path: nothing to learn from a token count
        payload = app.relay.dispatcher.payload(name, chat)
        lease = pool.acquire(len(payload), text=choice.text)
        if not isinstance(lease, Lease):
            return False  # a queue, a 429 or a 503: the ASGI path's
        # Leased: the request is the lane's from here (a lease taken and given back would still have
        # moved the policy's choices).
        try:
            self._send(cycle, connection, listener, codec, parsed.request, chat, choice, caller, name, lease, payload)
        except BaseException:  # a bug: the lease is not kept (the client gets uvicorn's answer to a callback's error)
            lease.release(None)
            raise
        return True

    def _send(self, cycle: RequestResponseCycle, connection: LaneConnection, listener: Listener, codec: Codec,
              request: dict[str, Any], chat: dict[str, Any], choice: Choice, caller: Caller, name: str,
              lease: Lease, payload: bytes) -> None:
        """A leased request counted and sent, on an idle connection by the lane's stream, else handed over."""
        app = self.app
        config = app.config.pools[name]
        # Reading stays paused past a long body's high-water mark until the request reads its body, which
        # here is whole already: read on, to see the client leave (a pipelined request pauses it again).
        cycle.flow.resume_reading()
        # Its ticket: how a hand-over's retry waits in the pool's queue, as on the ASGI path.
        call = Call(listener.config, codec, request, chat, choice,
                    ticket=Ticket.of(app.config.admission, caller.tenant, caller.priority))
        call.headers = [(b"x-router-entry", choice.entry.name.encode()),
                        (b"x-router-decision", choice.decision.name.encode())]
        url = lease.replica.url
        assert self.http1 is not None  # enabled
        conn = self.http1.idle(url) if url.startswith("http://") else None
        if conn is None:  # a connection to open first: the ASGI path's code opens it and sends the request
            app.count(choice)
            self.hand_over(cycle, connection, listener, call, (lease, self.upstream.open(
                url, codec.upstream_path, payload, api_key=config.api_key, timeout_s=config.timeout_s),
                time.perf_counter()))
            return
        upstream_headers = request_headers(config.api_key)
        for key, _ in cycle.scope["headers"]:
            if key == b"traceparent":  # a client's trace goes on through the replicas, as on the ASGI path
                upstream_headers.update(tracing.carrier_of(cycle.scope["headers"]))
                break
        self.http1.send(url, conn, codec.upstream_path, payload, upstream_headers, config.timeout_s)
        _Stream(self, cycle, connection, listener, call, name, lease, conn, config.timeout_s)
        app.count(choice)  # the books once the request is on its way (the replica works meanwhile)

    def hand_over(self, cycle: RequestResponseCycle, connection: LaneConnection, listener: Listener,
                  call: Call, first: Attempt) -> None:
        """`call` answered from its first attempt on by the ASGI path's code, in a task of the connection's."""
        self.app.metrics.lane_of(listener.name, "handed").inc()
        task = asyncio.get_running_loop().create_task(self.app.handed(listener, call, cycle, first))
        connection.tasks.add(task)
        task.add_done_callback(connection.tasks.discard)

    def _choose(self, listener: Listener, chat: dict[str, Any], text: str, output: str) -> Choice | None:
        """The ASGI path's choice when it can be made without a wait (None: it cannot)."""
        model = chat.get("model")
        if model not in listener.entries:
            return self.app.direct.choose(listener.config, model, text, output)
        return self.app.router.choose_now(chat, text, outputs=output)


class _Stream:
    """One lane request from its upstream write: the upstream connection's watcher (http1.Watcher)."""

    __slots__ = ("call", "conn", "connection", "cycle", "lane", "lease", "listener", "pool", "sent", "stall",
                 "state", "timeout_s")

    def __init__(self, lane: Lane, cycle: RequestResponseCycle, connection: LaneConnection, listener: Listener,
                 call: Call, pool: str, lease: Lease, conn: Connection, timeout_s: float) -> None:
        self.lane, self.cycle, self.connection, self.listener = lane, cycle, connection, listener
        self.call, self.pool, self.lease, self.conn, self.timeout_s = call, pool, lease, conn, timeout_s
        self.state = _WAITING
        self.sent = time.perf_counter()
        self.stall: StallTimer | None = None
        conn.watcher = self  # its request sent: the head (or its deadline, the send's) is what comes next
        connection.lane_stream = self  # told when the client leaves, or its full transport drains

    # ---- the upstream connection's events ----

    def fed(self) -> None:
        conn = self.conn
        if self.state == _STREAMING:
            self._forward()
        elif self.state == _WAITING and conn.head is not None and conn.head.done():
            cycle = self.cycle
            content_type = next((v for k, v in conn.headers if k == b"content-type"), b"")
            if (conn.status != 200 or not content_type.startswith(_EVENT_STREAM) or conn.error is not None
                    or cycle.flow.write_paused or cycle.disconnected):
                self._hand_over()
                return
            self._start(content_type)

    def failed(self, exc: BaseException) -> None:
        if self.state == _WAITING:
            self._hand_over()  # the ASGI path's code makes it a retry or a 502
        elif self.state == _STREAMING:
            log.warning("upstream %s broke off a response: %s", self.lease.replica.url, exc)
            tail = self.call.codec.stream(self.call.request).error(f"upstream failed mid-stream: {type(exc).__name__}")
            self._end(_chunk(tail) + b"0\r\n\r\n", ok=False)

    # ---- the client's ----

    def gone(self) -> None:
        """The client left before the response ended: upstream's response abandoned (its connection closed)."""
        if self.state in (_HANDED, _DONE):
            return
        self.state = _DONE
        self._detach()
        conn = self.conn
        if conn.head is not None and not conn.head.done():
            conn.head.cancel()  # no one awaits it: its failure is not news
        if conn.transport is not None:
            conn.transport.close()
        self.lease.release(None)
        self.lane.app.metrics.requests_of(self.listener.name, self.call.codec.name, "499").inc()

    def drained(self) -> None:
        """The client's transport takes writes again: upstream is read again."""
        if self.state == _STREAMING and self.conn.transport is not None:
            self.conn.transport.resume_reading()
            if self.stall is not None:
                self.stall.waiting()

    # ----

    def _start(self, content_type: bytes) -> None:
        """The client's head, as uvicorn's send writes it, with the bytes that came with upstream's."""
        call, cycle, conn = self.call, self.cycle, self.conn
        self.lane.app.relay.dispatcher.answered(self.pool, self.lease, self.sent)
        call.headers += [(b"x-router-pool", self.pool.encode()), (b"x-router-replica", self.lease.replica.url.encode()),
                         (b"x-router-attempts", b"1")]
        call.status = 200
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.chunked_encoding = True
        cycle.expected_content_length = 0
        parts = [STATUS_LINE[200]]
        for name, value in [*cycle.default_headers, (b"content-type", content_type), *call.headers]:
            parts += (name.lower(), b": ", value, b"\r\n")
        if not cycle.keep_alive:  # a shutdown under way
            parts.append(b"connection: close\r\n")
        parts.append(b"transfer-encoding: chunked\r\n\r\n")
        if conn.body:
            parts.append(_chunk(conn.take()))
        if conn.done:
            self._end(b"".join(parts) + b"0\r\n\r\n", ok=True)
        elif self._write(b"".join(parts)):
            self.state = _STREAMING
            if self.timeout_s:
                self.stall = StallTimer(conn.loop, self.timeout_s, conn.fail)
                self.stall.waiting()
            self._watch_flow()
        self.lane.app.metrics.lane_of(self.listener.name, "streamed").inc()  # counted once its head is out

    def _forward(self) -> None:
        conn = self.conn
        if conn.done:
            self._end((_chunk(conn.take()) if conn.body else b"") + b"0\r\n\r\n", ok=True)
            return
        if conn.body:
            if not self._write(_chunk(conn.take())):
                return
            if self.stall is not None:
                self.stall.waiting()
            self._watch_flow()

    def _watch_flow(self) -> None:
        """A client whose transport is full: upstream is not read until it drains (the stall not counted)."""
        if self.cycle.flow.write_paused and self.conn.transport is not None:
            self.conn.transport.pause_reading()
            if self.stall is not None:
                self.stall.got()

    def _end(self, last: bytes, *, ok: bool) -> None:
        """The response's last bytes out, the client's cycle complete (as uvicorn's send completes it), and
        the books: the connection back to the pool (or closed), the lease, the request's count."""
        self.state = _DONE
        cycle, conn = self.cycle, self.conn
        self._detach()
        if not cycle.transport.is_closing():  # (its loss is on its way: the books are kept all the same)
            cycle.transport.write(last)
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        http1 = self.lane.http1
        assert http1 is not None  # the lane runs only over it
        if ok and conn.reusable():
            http1.give_back_to(self.lease.replica.url, conn)
        elif conn.transport is not None:
            conn.transport.close()
        self.lease.release(ok)
        app = self.lane.app
        if not ok:
            app.metrics.upstream_errors.labels(self.pool).inc()
        app.metrics.requests_of(self.listener.name, self.call.codec.name, "200").inc()
        cycle.on_response()

    def _hand_over(self) -> None:
        """The rest to the ASGI path's code, in a task, from this attempt on."""
        self.state = _HANDED
        conn, lane = self.conn, self.lane
        self._detach()
        url = self.lease.replica.url
        assert isinstance(lane.upstream, AiohttpUpstream)  # the lane runs only over it
        attempt = _Sent(lane.upstream.sent(url, self.call.codec.upstream_path, conn, self.timeout_s), conn)
        lane.hand_over(self.cycle, self.connection, self.listener, self.call, (self.lease, attempt, self.sent))

    def _write(self, data: bytes) -> bool:
        """`data` to the client; False when its transport is closing (its loss not told yet): then it left."""
        transport = self.cycle.transport
        if transport.is_closing():
            self.gone()
            return False
        transport.write(data)
        return True

    def _detach(self) -> None:
        """No longer told of either connection's events, the stall bound off: the stream ended or handed over."""
        if self.stall is not None:
            self.stall.cancel()
        self.conn.watcher = None
        if self.connection.lane_stream is self:
            self.connection.lane_stream = None


class _Sent:
    """The head of a request the lane wrote itself, as a hand-over's first attempt: awaited by the dispatcher,
    or, let go unawaited (its client gone first), closed with its connection (the replica's answer abandoned)."""

    __slots__ = ("_conn", "_head")

    def __init__(self, head: Coroutine[Any, Any, Http1Response], conn: Connection) -> None:
        self._head, self._conn = head, conn

    def __await__(self) -> Generator[Any, None, Http1Response]:
        return self._head.__await__()

    def close(self) -> None:
        self._head.close()
        if self._conn.transport is not None:
            self._conn.transport.close()


def _chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body (uvicorn's framing)."""
    return b"%x\r\n%b\r\n" % (len(data), data)

