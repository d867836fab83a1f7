"""The router's lean HTTP/1.1 client (services/router/backends/http1.py) against a scripted server on a
loopback socket: keep-alive reuse, bodies framed by length or chunks, a replica that drops the connection
before the head or mid-body, an abandoned response, idle expiry, a refused connection, stalls, and
backpressure on a body nobody reads."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import uvloop

from services.router.backends import http1
from services.router.backends.http1 import Http1Client, NotConnected

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A loopback server; `reply(n)` scripts the n-th request's answer (0-based, over all connections)."""

    def __init__(self, reply: Callable[[int, asyncio.StreamWriter], Awaitable[bool]]) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()  # a connection the client closed
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: Any) -> None:
        assert self.server is not None
        self.server.close()
        await asyncio.sleep(0)  # the handlers' last turns: each closes its writer

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                              if line.startswith(b"content-length:"))
                self.requests.append(head + await reader.readexactly(length))
                if not await self.reply(len(self.requests) - 1, writer):
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()


def chunked(*pieces: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + b"".join(
        b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


def test_keep_alive_reuses_one_connection_for_length_and_chunked_bodies() -> None:
    async def reply(n: int, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}" if n == 0
                else chunked(b"data: a\n\n", b"data: b\n\n"))
        return True

    async def main() -> None:
        server = Server(reply)
        async with server as url:
            client = Http1Client()
            r = await client.post(url, "/v1/chat/completions", b'{"x":1}', {"content-type": "application/json"},
                                  timeout_s=5)
            assert (r.status, r.content_type, await r.read()) == (200, "application/json", b"{}")
            r.close()
            r = await client.post(url, "/v1/chat/completions", b"{}", {}, timeout_s=5)
            assert r.content_type == "text/event-stream"
            assert b"".join([c async for c in r.chunks()]) == b"data: a\n\ndata: b\n\n"
            r.close()
            assert server.connections == 1
            assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert b"content-type: application/json\r\n" in server.requests[0]
            assert server.requests[0].endswith(b'\r\n\r\n{"x":1}')
            client.close()

    run(main())


def test_a_connection_dropped_before_the_head_is_server_disconnected() -> None:
    async def reply(n: int, w: asyncio.StreamWriter) -> bool:
        return False  # read the request, close without a word

    async def main() -> None:
        async with Server(reply) as url:
            client = Http1Client()
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await client.post(url, "/p", b"{}", {}, timeout_s=5)
            client.close()

    run(main())


def test_a_body_broken_off_mid_way_raises_a_payload_error() -> None:
    async def reply(n: int, w: asyncio.StreamWriter) -> bool:
        w.write(chunked(b"data: a\n\n")[:-len(b"0\r\n\r\n")])  # the first chunk, no end
        await w.drain()
        return False

    async def main() -> None:
        async with Server(reply) as url:
            client = Http1Client()
            r = await client.post(url, "/p", b"{}", {}, timeout_s=5)
            got = []
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in r.chunks():
                    got.append(chunk)
            assert got == [b"data: a\n\n"]
            r.close()
            client.close()

    run(main())


def test_an_abandoned_response_closes_its_connection_and_is_not_reused() -> None:
    async def reply(n: int, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")  # more to come
        return True

    async def main() -> None:
        server = Server(reply)
        async with server as url:
            client = Http1Client()
            r = await client.post(url, "/p", b"{}", {}, timeout_s=5)
            async for _ in r.chunks():
                break
            r.close()
            await asyncio.wait_for(server.closed.wait(), 5)  # the replica learns it was abandoned
            (await client.post(url, "/p", b"{}", {}, timeout_s=5)).close()
            assert server.connections == 2
            client.close()

    run(main())


def test_a_connection_idle_past_the_keep_alive_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    async def reply(n: int, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        return True

    async def main() -> None:
        server = Server(reply)
        async with server as url:
            client = Http1Client()
            (await client.post(url, "/p", b"{}", {}, timeout_s=5)).close()
            monkeypatch.setattr(http1, "KEEPALIVE_S", 0.0)
            (await client.post(url, "/p", b"{}", {}, timeout_s=5)).close()
            assert server.connections == 2
            client.close()

    run(main())


def test_a_refused_connection_is_not_connected() -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(NotConnected) as caught:
            await Http1Client().post(f"http://127.0.0.1:{port}", "/p", b"{}", {}, timeout_s=5)
        assert not caught.value.timed_out

    run(main())


def test_a_connection_the_replica_closes_before_the_request_is_written_is_not_connected(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica that accepts and closes at once (one killed with connections in its listen backlog), its
    close read before the task that connected runs again, as under load: NotConnected (nothing was sent,
    so the request may go to another replica), not uvloop's RuntimeError from a write to a closed transport."""
    async def main() -> None:
        async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connect = Http1Client._connection

        async def connect_then_wait(self: Http1Client, key: tuple[str, int]) -> Any:
            conn = await connect(self, key)
            for _ in range(200):  # other callbacks run (the replica's close read) before this task resumes
                if conn.lost:
                    break
                await asyncio.sleep(0.005)
            return conn

        monkeypatch.setattr(Http1Client, "_connection", connect_then_wait)
        try:
            with pytest.raises(NotConnected, match="closed the connection before the request was sent") as caught:
                await Http1Client().post(f"http://127.0.0.1:{port}", "/p", b"{}", {}, timeout_s=5)
            assert not caught.value.timed_out
        finally:
            server.close()

    uvloop.run(asyncio.wait_for(main(), 20))  # the router's loop: its write to a closed transport raises


def test_no_head_in_time_and_a_stalled_body_time_out() -> None:
    async def reply(n: int, w: asyncio.StreamWriter) -> bool:
        if n == 1:
            w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")  # then nothing
        return True  # request 0: no head at all

    async def main() -> None:
        async with Server(reply) as url:
            client = Http1Client()
            with pytest.raises(aiohttp.SocketTimeoutError):
                await client.post(url, "/p", b"{}", {}, timeout_s=0.2)
            r = await client.post(url, "/p", b"{}", {}, timeout_s=0.2)
            got = []
            with pytest.raises(aiohttp.SocketTimeoutError):
                async for chunk in r.chunks():
                    got.append(chunk)
            assert got == [b"a"]
            r.close()
            client.close()

    run(main())


def test_a_body_nobody_reads_stops_reading_the_replica_until_it_is_taken() -> None:
    big = b"x" * (4 << 20)

    async def reply(n: int, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big) + big)
        await w.drain()
        return True

    async def main() -> None:
        async with Server(reply) as url:
            client = Http1Client()
            r = await client.post(url, "/p", b"{}", {}, timeout_s=5)
            conn = r._conn
            for _ in range(200):  # until the buffer passes its bound (the loop reads meanwhile)
                if conn.paused:
                    break
                await asyncio.sleep(0.01)
            assert conn.paused and conn.buffered <= 2 * http1._PAUSE_BYTES
            assert len(await r.read()) == len(big) and not conn.paused
            r.close()
            client.close()

    run(main())
