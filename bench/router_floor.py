"""The least HTTP router: the floor of a router written in Python on one asyncio loop (uvloop when
installed) that reads HTTP, measured by bench/router_latency.py (`--http-floor`) beside the router.

What it does per request is what any HTTP router must: parse the client's request (httptools), decode
its JSON body and replace `model` with the pool's (msgspec), write the request on a kept-alive upstream
connection (one pool of idle connections, opened as needed), and pass the response's bytes through as
they come while parsing them only to find the response's end (then the upstream connection goes back
to the pool). Nothing more: no routes, no access control, no decision, no metrics, no tracing, no
timeouts, no error bodies of an API's shape, the upstream's head passed as it is. A router that does
those cannot go under what this one costs on the same host, loop and sockets; the byte pipe
(`--floor`) is under both: it parses nothing.

With `--decide CONFIG` (router_latency.py's `--decide-floor`) it also does the router's own work a lane
request needs, with the router's own code and nothing around it: the API key checked, the body parsed as the
chat API's (services.router.listeners.body_workers.parse), the caller read, the decision (Router.choose_now),
a replica leased from the pool and given back at the response's end, the pool's upstream body, and the
lane's counts (the decision, the request, the lane's, the upstream latency). What it still leaves out is
the glue between those parts: uvicorn's protocol and request cycle, the lane's checks and objects, the HTTP
client's parse of the head, the client's head rebuilt with the router's headers. The router's request path
cannot go under this one's without making its own parts cheaper.

Usage (run by router_latency.py): python bench/router_floor.py PORT UPSTREAM_PORT [--model NAME] [--decide CONFIG]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any, cast

import httptools
import msgspec

_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()


class Upstream(asyncio.Protocol):
    """A kept-alive connection to the replica: a request's response passed to its client as it comes."""

    def __init__(self, idle: list[Upstream]) -> None:
        self.idle = idle
        self.transport: asyncio.Transport | None = None
        self.client: Client | None = None
        self.parser = httptools.HttpResponseParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is none of asyncio's classes

    def send(self, client: Client, request: bytes) -> None:
        assert self.transport is not None
        self.client, client.upstream = client, self
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        if self.client is not None and self.client.transport is not None:
            self.client.transport.write(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        if self.client is not None:
            self.client.upstream = None
            if self.client.done is not None:
                self.client.done(True)
                self.client.done = None
            self.client = None
        self.idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.idle:
            self.idle.remove(self)
        if self.client is not None and self.client.transport is not None:
            self.client.transport.close()  # the response cut: the client sees its connection end

    # Backpressure: the client's buffer full, stop reading the replica until it drains.
    def pause_writing(self) -> None:
        if self.client is not None and self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client is not None and self.client.transport is not None:
            self.client.transport.resume_reading()


class Client(asyncio.Protocol):
    """A client's connection: each request parsed, its body's model replaced, sent upstream."""

    def __init__(self, idle: list[Upstream], upstream_port: int, model: bytes, decider: Decider | None = None) -> None:
        self.idle = idle
        self.upstream_port = upstream_port
        self.model = model.decode()
        self.head = b"\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\ncontent-length: " % upstream_port
        self.transport: asyncio.Transport | None = None
        self.upstream: Upstream | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.decider = decider
        self.headers: list[tuple[bytes, bytes]] = []
        self.done: Any = None  # --decide: what ends a routed request's books at its response's end

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.decider is not None:
            self.headers.append((name.lower(), value))

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        self.done = None
        if self.decider is not None and body:  # (a GET, /health say, passes as the least router passes it)
            body, self.done = self.decider.decide(self.headers, body)
        elif body:
            request = _decode.decode(body)
            request["model"] = self.model
            body = _encode.encode(request)
        data = b"".join((self.parser.get_method(), b" ", self.url, b" HTTP/1.1", self.head,
                         b"%d\r\n\r\n" % len(body), body))
        if self.idle:
            self.idle.pop().send(self, data)
        else:
            asyncio.get_running_loop().create_task(self.open(data))

    async def open(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: Upstream(self.idle), "127.0.0.1", self.upstream_port)
        upstream.send(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None:  # left before its response's end: its lease given back, abandoned
            self.done(None)
            self.done = None
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.client = None
            self.upstream.transport.close()  # a response half read cannot be reused

    def pause_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()


class Decider:
    """--decide: the router's own parts, built from its config as the router builds them, run per request
    as the lane runs them (listeners/lane.py's take, _send, _start and _end), without the glue between them."""

    def __init__(self, config_path: str) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from services.router.backends.dispatch import Dispatcher
        from services.router.backends.pool import Lease, build_pools
        from services.router.config.loader import load_config
        from services.router.decision.engine import Router
        from services.router.listeners.access import authorize
        from services.router.listeners.body_workers import parse
        from services.router.listeners.caller import caller_of
        from services.router.listeners.listener import listeners_by_port
        from services.router.metrics import RouterMetrics

        config = load_config(Path(config_path))
        self.config = config
        self.router = Router(config)
        self.pools = build_pools(config)
        self.metrics = RouterMetrics(self.pools)
        self.listener = next(iter(listeners_by_port(config).values()))
        self.dispatcher = Dispatcher(config, self.pools, cast(Any, None), self.metrics)  # no upstream of its own
        self.authorize, self.parse, self.caller_of, self.lease_type = authorize, parse, caller_of, Lease

    def decide(self, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[bytes, Any]:
        """The upstream body, and what ends the request's books: called with True at its response's end, None
        when its client left first."""
        listener = self.listener
        self.authorize(listener.keys, headers)
        parsed = self.parse("chat", body)
        self.caller_of(listener.config, self.config.admission, headers, parsed.request)
        choice = self.router.choose_now(parsed.chat, parsed.text, outputs="text")
        assert choice is not None  # the bench's entry has no signal
        name = choice.plan[0]
        payload = self.dispatcher.payload(name, parsed.chat)
        lease = self.pools[name].acquire(len(payload), text=choice.text)
        assert isinstance(lease, self.lease_type), lease  # the bench's pool has room for every stream
        metrics, started = self.metrics, time.perf_counter()
        metrics.decisions_of(choice.entry.name, choice.decision.name).inc()

        def done(ok: bool | None) -> None:
            if ok:
                self.dispatcher.answered(name, lease, started)
                metrics.lane_of(listener.name, "streamed").inc()
            lease.release(ok)
            metrics.requests_of(listener.name, "chat", "200" if ok else "499").inc()

        return payload, done


async def serve(port: int, upstream_port: int, model: str, decide: str | None) -> None:
    loop = asyncio.get_running_loop()
    idle: list[Upstream] = []
    decider = Decider(decide) if decide else None
    server = await loop.create_server(lambda: Client(idle, upstream_port, model.encode(), decider), "127.0.0.1",
                                      port, backlog=2048)
    await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("port", type=int)
    ap.add_argument("upstream_port", type=int)
    ap.add_argument("--model", default="tiny", help="the model the upstream request names")
    ap.add_argument("--decide", metavar="CONFIG", help="also the router's own parts, from this router config")
    args = ap.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port, args.upstream_port, args.model, args.decide))
    else:
        uvloop.run(serve(args.port, args.upstream_port, args.model, args.decide))


if __name__ == "__main__":
    main()
