"""The per-token path's reference servers: HTTP servers that do no work but the HTTP layer, sending
prebuilt chat-completion chunks at a fixed step cadence to every POST /v1/chat/completions stream.
Each runs in a process of its own (bench/frontend_stream.py starts them beside the fleet).

`asgi`: a bare ASGI app on uvicorn + httptools (the frontend's server and loop), one task per stream, one
wake-up (a shared per-step ticker, as an engine step wakes the streams) and one ASGI send per token.
`onepass`: an asyncio Protocol with httptools parsing, HTTP/1.1 keep-alive and chunked encoding, whose one
timer per step writes every live stream's chunk to its transport in one pass.
The bytes are the fleet's: a role chunk, one content chunk per token (with `top_logprobs`, a logprobs
object of that many alternatives), the finish chunk, the usage chunk if asked for, `data: [DONE]`.
Usage: python bench/stream_floor.py --kind onepass|asgi --port P [--host 127.0.0.1] [--decode-ms 20]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from functools import cache
from typing import Any, cast

import httptools

KINDS = ("asgi", "onepass")
PROMPT_TOKENS = 12
# Token texts of mixed scripts and lengths, as the sim's random vocabulary gives: a chunk's bytes (and a
# top-5 logprobs object's) come out at the fleet's size.
TOKENS = ("wró", " addTarget", "标识", "バック", " огр", "sville", ".Animation", "改革发展")
MAX_TOP_LOGPROBS = 20

_Scope = dict[str, Any]
_Receive = Callable[[], Awaitable[dict[str, Any]]]
_Send = Callable[[dict[str, Any]], Awaitable[None]]


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@cache
def _token_tails(top_logprobs: int | None) -> tuple[bytes, ...]:
    """Each token's chunk after its `"delta":{"content":` (the part no request changes): made once per
    top_logprobs value, so a stream's set-up is a few concatenations."""
    def entry(j: int, rank: int) -> dict[str, object]:
        alt = TOKENS[j % len(TOKENS)]
        return {"token": alt, "logprob": -0.6931471824645996 * (1 + rank), "bytes": list(alt.encode())}

    tails = []
    for i, text in enumerate(TOKENS):
        logprobs: object = None
        if top_logprobs is not None:
            top = [entry(i + j, j) for j in range(top_logprobs)]
            logprobs = {"content": [{**entry(i, 0), "top_logprobs": top}]}
        tails.append(_dumps(text) + b'},"logprobs":' + _dumps(logprobs) + b',"finish_reason":null}]}\n\n')
    return tuple(tails)


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """What a reference server reads from a chat completion request."""

    model: str
    max_tokens: int
    top_logprobs: int | None
    include_usage: bool

    @classmethod
    def parse(cls, body: bytes) -> StreamRequest:
        try:
            req = json.loads(body)
        except ValueError as e:
            raise ValueError(f"body: not JSON ({e})") from None
        if not isinstance(req, dict):
            raise ValueError("body: a JSON object is required")
        if req.get("stream") is not True:
            raise ValueError("stream: must be true (a reference server only streams)")
        max_tokens = req.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: an integer >= 1 is required, got {max_tokens!r}")
        top = req.get("top_logprobs") if req.get("logprobs") else None
        if top is not None and (not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
            raise ValueError(f"top_logprobs: an integer in 0..{MAX_TOP_LOGPROBS} is required, got {top!r}")
        options = req.get("stream_options") or {}
        return cls(str(req.get("model", "tiny")), max_tokens, top, bool(options.get("include_usage")))


@dataclass(frozen=True, slots=True)
class StreamBytes:
    """One stream's SSE events, prebuilt: `tokens[i % len(tokens)]` is token i's."""

    role: bytes
    tokens: tuple[bytes, ...]
    end: bytes  # the finish chunk, the usage chunk if asked for, [DONE]

    @classmethod
    def build(cls, req: StreamRequest) -> StreamBytes:
        head = (b'data: {"id":"chatcmpl-' + secrets.token_hex(12).encode()
                + b'","object":"chat.completion.chunk","created":' + str(int(time.time())).encode()
                + b',"model":' + _dumps(req.model) + b',"choices":[')
        role = (head + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
                b'"finish_reason":null}]}\n\n')
        tokens = tuple(head + b'{"index":0,"delta":{"content":' + tail for tail in _token_tails(req.top_logprobs))
        end = head + b'{"index":0,"logprobs":null,"finish_reason":"length","delta":{}}]}\n\n'
        if req.include_usage:
            usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": req.max_tokens,
                     "total_tokens": PROMPT_TOKENS + req.max_tokens}
            end += head + b'],"usage":' + _dumps(usage) + b"}\n\n"
        return cls(role, tokens, end + b"data: [DONE]\n\n")


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (chunked transfer encoding)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


# ---- asgi: a bare ASGI app under uvicorn, one task per stream ----

class Ticker:
    """The engine step of the asgi server: one timer per step resolves the future every waiting stream
    awaits. The timer runs only while someone waits, at a fixed cadence while it does."""

    def __init__(self, step_s: float) -> None:
        self._step_s = step_s
        self._future: asyncio.Future[None] | None = None
        self._due = 0.0

    def tick(self) -> asyncio.Future[None]:
        if self._future is None:
            loop = asyncio.get_running_loop()
            self._future = loop.create_future()
            self._due = max(self._due + self._step_s, loop.time())
            loop.call_at(self._due, self._fire)
        return self._future

    def _fire(self) -> None:
        future, self._future = self._future, None
        assert future is not None
        future.set_result(None)


def asgi_app(step_s: float) -> Callable[[_Scope, _Receive, _Send], Awaitable[None]]:
    ticker = Ticker(step_s)

    async def reply(send: _Send, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] in ("/ready", "/health"):
            return await reply(send, 200, b"{}")
        if scope["method"] != "POST" or scope["path"] != "/v1/chat/completions":
            return await reply(send, 404, b'{"error":{"message":"POST /v1/chat/completions only"}}')
        try:
            req = StreamRequest.parse(body)
        except ValueError as e:
            return await reply(send, 400, _dumps({"error": {"message": str(e)}}))
        events = StreamBytes.build(req)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "body": events.role, "more_body": True})
        tokens, n = events.tokens, len(events.tokens)
        for i in range(req.max_tokens):
            await ticker.tick()
            await send({"type": "http.response.body", "body": tokens[i % n], "more_body": True})
        await send({"type": "http.response.body", "body": events.end})

    return app


async def _serve_asgi(host: str, port: int, step_s: float) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        """Ticks once a second, as the frontend's uvicorn does (its _Uvicorn), not ten times."""

        async def main_loop(self) -> None:
            counter = 0
            while not await self.on_tick(counter):
                counter = (counter + 10) % 864000
                await asyncio.sleep(1.0)

    config = uvicorn.Config(asgi_app(step_s), host=host, port=port, http="httptools", ws="none", lifespan="off",
                            interface="asgi3", access_log=False, log_config=None, proxy_headers=False,
                            backlog=2048, timeout_keep_alive=75, timeout_graceful_shutdown=1)
    await Server(config).serve()


# ---- onepass: one timer per step writes every stream's chunk ----

@dataclass(slots=True)
class _Stream:
    conn: _Connection
    tokens: tuple[bytes, ...]  # framed as HTTP chunks
    end: bytes  # framed, with the terminating chunk
    total: int
    sent: int = 0


class OnePass:
    """The step: one timer per step, while any stream is live, writes each stream's next chunk."""

    def __init__(self, step_s: float) -> None:
        self._step_s = step_s
        self._live: list[_Stream] = []
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0

    def add(self, stream: _Stream) -> None:
        self._live.append(stream)
        if self._timer is None:
            self._schedule()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        self._due = max(self._due + self._step_s, loop.time())
        self._timer = loop.call_at(self._due, self._step)

    def _step(self) -> None:
        live, self._live = self._live, []  # a stream that ends may start the next on its connection
        for stream in live:
            conn = stream.conn
            if conn.closed:
                continue
            if conn.write_paused:  # a slow reader: its stream holds this step's token, as a send would wait
                self._live.append(stream)
                continue
            data = stream.tokens[stream.sent % len(stream.tokens)]
            stream.sent += 1
            if stream.sent < stream.total:
                conn.transport.write(data)
                self._live.append(stream)
            else:
                conn.transport.write(data + stream.end)
                conn.done()
        self._timer = None
        if self._live:
            self._schedule()


class _Date:
    """The Date header, made once a second."""

    def __init__(self) -> None:
        self._at = 0
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._at:
            self._at, self._line = now, b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._line


_DATE = _Date()
_STATUS = {200: b"200 OK", 400: b"400 Bad Request", 404: b"404 Not Found"}


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: requests parsed by httptools, answered one at a time (a pipelined one
    waits for the stream before it, reading paused meanwhile), kept alive unless the client says not."""

    def __init__(self, floor: OnePass) -> None:
        self._floor = floor
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._body: list[bytes] = []
        self._pending: deque[tuple[bytes, bytes, bytes, bool]] = deque()  # method, url, body, keep-alive
        self._streaming = False
        self._keep_alive = True
        self.transport: asyncio.Transport
        self.closed = False
        self.write_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of asyncio's

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True  # the step drops its stream

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._write_reply(400, b'{"error":{"message":"malformed HTTP request"}}', keep_alive=False)
            return
        self._next()

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self._url, self._body = b"", []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._pending.append((self._parser.get_method(), self._url, b"".join(self._body),
                              self._parser.should_keep_alive()))

    def _next(self) -> None:
        while self._pending and not self._streaming and not self.closed:
            method, url, body, keep_alive = self._pending.popleft()
            self._answer(method, url.partition(b"?")[0], body, keep_alive)
        if self._streaming and not self.closed:
            self.transport.pause_reading()  # HTTP/1.1 answers in order: the next request waits

    def _answer(self, method: bytes, path: bytes, body: bytes, keep_alive: bool) -> None:
        if path in (b"/ready", b"/health"):
            return self._write_reply(200, b"{}", keep_alive)
        if method != b"POST" or path != b"/v1/chat/completions":
            return self._write_reply(404, b'{"error":{"message":"POST /v1/chat/completions only"}}', keep_alive)
        try:
            req = StreamRequest.parse(body)
        except ValueError as e:
            return self._write_reply(400, _dumps({"error": {"message": str(e)}}), keep_alive)
        events = StreamBytes.build(req)
        self._streaming, self._keep_alive = True, keep_alive
        self.transport.write(b"HTTP/1.1 200 OK\r\n" + _DATE.line()
                             + b"server: stream-floor\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                             + (b"" if keep_alive else b"connection: close\r\n")
                             + b"transfer-encoding: chunked\r\n\r\n" + _chunk(events.role))
        self._floor.add(_Stream(self, tuple(_chunk(t) for t in events.tokens), _chunk(events.end) + b"0\r\n\r\n",
                                req.max_tokens))

    def _write_reply(self, status: int, body: bytes, keep_alive: bool) -> None:
        self.transport.write(b"HTTP/1.1 " + _STATUS[status] + b"\r\n" + _DATE.line()
                             + b"server: stream-floor\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(body)).encode() + b"\r\n" + (b"" if keep_alive else b"connection: close\r\n")
                             + b"\r\n" + body)
        if not keep_alive:
            self.transport.close()
            self.closed = True

    def done(self) -> None:
        """The stream's last bytes are written: the next request, if any, or the end of the connection."""
        self._streaming = False
        if not self._keep_alive:
            self.transport.close()
            self.closed = True
            return
        self.transport.resume_reading()
        self._next()


async def _serve_onepass(host: str, port: int, step_s: float) -> None:
    loop = asyncio.get_running_loop()
    floor = OnePass(step_s)
    server = await loop.create_server(lambda: _Connection(floor), host, port, backlog=2048)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def serve(kind: str, host: str, port: int, decode_ms: float) -> None:
    """Run one reference server until SIGTERM or SIGINT, on the frontend's loop (uvloop when installed)."""
    if kind not in KINDS:
        raise ValueError(f"kind: one of {', '.join(KINDS)}, got {kind!r}")
    if decode_ms <= 0:
        raise ValueError(f"decode_ms: a step in ms > 0 is required, got {decode_ms}")
    run = _serve_asgi if kind == "asgi" else _serve_onepass
    coro = run(host, port, decode_ms / 1e3)
    try:
        import uvloop
    except ImportError:  # as the frontend: plain asyncio works, a little slower
        return asyncio.run(coro)
    uvloop.run(coro)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=KINDS, default="onepass")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    p.add_argument("--decode-ms", type=float, default=20.0, help="the step: one token per stream per step")
    args = p.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        serve(args.kind, args.host, args.port, args.decode_ms)


if __name__ == "__main__":
    main()
