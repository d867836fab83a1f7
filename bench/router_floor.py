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

Usage (run by router_latency.py): python bench/router_floor.py PORT UPSTREAM_PORT [--model NAME]
"""
from __future__ import annotations

import argparse
import asyncio
from typing import cast

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

    def __init__(self, idle: list[Upstream], upstream_port: int, model: bytes) -> None:
        self.idle = idle
        self.upstream_port = upstream_port
        self.model = model.decode()
        self.head = b"\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\ncontent-length: " % upstream_port
        self.transport: asyncio.Transport | None = None
        self.upstream: Upstream | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []

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

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        if body:
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
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.client = None
            self.upstream.transport.close()  # a response half read cannot be reused

    def pause_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()


async def serve(port: int, upstream_port: int, model: str) -> None:
    loop = asyncio.get_running_loop()
    idle: list[Upstream] = []
    server = await loop.create_server(lambda: Client(idle, upstream_port, model.encode()), "127.0.0.1", port,
                                      backlog=2048)
    await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("port", type=int)
    ap.add_argument("upstream_port", type=int)
    ap.add_argument("--model", default="tiny", help="the model the upstream request names")
    args = ap.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port, args.upstream_port, args.model))
    else:
        uvloop.run(serve(args.port, args.upstream_port, args.model))


if __name__ == "__main__":
    main()
