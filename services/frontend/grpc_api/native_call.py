"""A call served on the gRPC port's own HTTP/2 connection (grpc_port.py), PortCall: its headers checked
(API key, deadline, compression), its status as trailers, its ends; and NativeCall, one
Inference.GenerateStream or Inference.Generate: its request message gathered and checked (size,
compression), then its response messages framed by hand, a stream's mostly written in the engine dispatch
pass that produced them (http_api/direct_stream.py), every window honoured. Runs on API server 0's
event loop."""
from __future__ import annotations

import asyncio
import logging
import zlib
from abc import ABC, abstractmethod
from typing import Any, Protocol
from urllib.parse import quote

import grpc

import tracing
from edge.api_keys import ApiKeys, KeyCheck
from services.frontend.engine_client.inflight import EngineFailure
from services.frontend.generation.direct_stream import DirectStream
from services.frontend.grpc_api.auth import MESSAGE as UNAUTHENTICATED_MESSAGE
from services.frontend.grpc_api.inference import Inference, StreamMessages, ended, next_pieces
from services.frontend.grpc_api.rpc import Failed

log = logging.getLogger(__name__)

# grpc-timeout's units (the gRPC over HTTP/2 spec): hours, minutes, seconds, milli-, micro-, nanoseconds.
_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}
_WBITS = {b"gzip": 31, b"deflate": 15}  # zlib's window bits for each grpc-encoding's format
ENCODINGS = (b"identity", *_WBITS)
ONE_MESSAGE = "the request must be one message (GenerateRequest), whole"
# What the spec leaves unescaped in grpc-message: printable ASCII but "%" (urllib's quote keeps
# letters, digits and "_.-~" on its own).
_PLAIN = " !\"#$&'()*+,/:;<=>?@[\\]^`{|}"
RESPONSE_HEAD = [(b":status", b"200"), (b"content-type", b"application/grpc"),
                 (b"grpc-accept-encoding", b",".join(ENCODINGS))]


class Connection(Protocol):
    """What a call uses of its HTTP/2 connection (grpc_port.py's)."""

    paused: bool  # its transport takes no more bytes for now

    def room(self, stream_id: int) -> int: ...

    def write_data(self, stream_id: int, data: bytes) -> None: ...

    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], *, end_stream: bool = False,
                     reset: bool = False) -> None: ...

    async def writable(self) -> None: ...

    def forget(self, call: Any) -> None: ...

    def acknowledge(self, stream_id: int, n: int) -> None:
        """Give `n` received bytes back to the client's windows (sent at the next flush)."""

    def flush(self) -> None: ...


def status_headers(code: grpc.StatusCode, message: str, *, started: bool) -> list[tuple[bytes, bytes]]:
    """A call's status as trailers, or, when no response HEADERS went out (`started` false), as a whole
    trailers-only response; grpc-message percent-encoded as the spec says."""
    headers = [] if started else RESPONSE_HEAD[:]
    headers.append((b"grpc-status", str(code.value[0]).encode()))
    if message:
        headers.append((b"grpc-message", quote(message, safe=_PLAIN).encode()))
    return headers


def timeout_of(value: bytes) -> float | None:
    """grpc-timeout's seconds ("100m": 0.1); None when it is malformed (the call then has no deadline)."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit() or value[-1] not in _UNITS:
        return None
    return int(value[:-1]) * _UNITS[value[-1]]


def frame(message: bytes) -> bytes:
    """A gRPC message on the wire: not compressed, its length (4 bytes, big-endian), its bytes."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


class PortCall(ABC):
    """A call served on the port's own connection: its headers checked (the API key; the deadline and
    the encoding noted), its response written with every window honoured, its end (trailers, a reset,
    the connection's loss, the deadline). Subclasses read the request and serve it (_serve's task).
    A reset by the client, its connection's loss or the deadline cancels the task."""

    def __init__(self, conn: Connection, stream_id: int, method: str, headers: list[tuple[bytes, bytes]],
                 keys: ApiKeys, limit: int) -> None:
        self.conn, self.stream_id, self.method = conn, stream_id, method
        self._headers = headers
        self._limit = limit
        self.task: asyncio.Task[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._why: tuple[grpc.StatusCode, str] | None = None  # the status a cancel of the task answers
        self.started = False  # the response's HEADERS are out
        self.closed = False  # trailers sent or the stream reset: nothing more goes out on it
        self.remote_ended = False
        self._encoding = b"identity"
        refusal = self._refusal(headers, keys)
        if refusal is not None:
            self.finish(*refusal)

    def _refusal(self, headers: list[tuple[bytes, bytes]], keys: ApiKeys) -> tuple[grpc.StatusCode, str] | None:
        """A refusal from the headers alone (the message is never read), or None; sets the deadline."""
        if keys and keys.check(headers) is not KeyCheck.ACCEPTED:
            return grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE
        for name, value in headers:
            if name == b"grpc-timeout":
                seconds = timeout_of(value)
                if seconds is not None:
                    self._deadline = asyncio.get_running_loop().call_later(seconds, self._expire)
            elif name == b"grpc-encoding":
                self._encoding = value
        return None

    def time_remaining(self) -> float | None:
        """Seconds to the call's deadline (None: it has none), as grpc.aio's ServicerContext says it."""
        if self._deadline is None:
            return None
        return max(self._deadline.when() - asyncio.get_running_loop().time(), 0.0)

    def inflate(self, message: bytes | memoryview) -> bytes:
        """A compressed message's bytes, in the call's grpc-encoding, inflated no further than the limit
        (a small bomb must not take the memory it unpacks to); Failed when it cannot be."""
        wbits = _WBITS.get(self._encoding)
        if wbits is None:
            raise Failed(grpc.StatusCode.INTERNAL, f"a compressed message with grpc-encoding "
                                                   f"{self._encoding.decode(errors='replace')!r}: supported: "
                                                   f"{', '.join(e.decode() for e in ENCODINGS)}")
        inflate = zlib.decompressobj(wbits)
        try:
            plain = inflate.decompress(message, self._limit + 1)
        except zlib.error as exc:
            raise Failed(grpc.StatusCode.INTERNAL, f"the request message does not decompress: {exc}") from None
        if len(plain) > self._limit:
            raise Failed(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"Received message larger than max (more than {self._limit} bytes decompressed vs. "
                         f"{self._limit})")
        if not inflate.eof:
            raise Failed(grpc.StatusCode.INTERNAL, "the request message does not decompress: it is cut short")
        return plain

    @abstractmethod
    def on_data(self, data: bytes, flow_controlled: int = 0) -> None:
        """A DATA frame's payload (`flow_controlled`: its bytes the call gives back to the windows itself)."""

    @abstractmethod
    def on_end(self) -> None:
        """The client's END_STREAM."""

    def on_reset(self, code: int) -> None:
        """The client reset the stream (it cancelled the call)."""
        self.closed = True
        self._stop()

    def on_lost(self) -> None:
        """The connection closed."""
        self.closed = True
        self._stop()

    def cancel(self, code: grpc.StatusCode, message: str) -> None:
        """End the call now with this status (a server stop past its grace, a refused message)."""
        if self.task is None:
            self.finish(code, message)
        elif not self.task.done():
            self._why = (code, message)
            self.task.cancel()
            # A task cancelled before its first step never enters _serve (the headers and a refused
            # message in one read): its status is then said here, once the task is done.
            self.task.add_done_callback(self._cancelled)

    def _cancelled(self, task: asyncio.Task[None]) -> None:
        if self._why is not None and not self.closed:
            self.finish(*self._why)

    def _expire(self) -> None:
        self._deadline = None
        self.cancel(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.conn.forget(self)

    async def _serve(self) -> None:
        """The task: the call's work, its status as the trailers."""
        code, message = grpc.StatusCode.OK, ""
        try:
            metadata = self._headers if tracing.enabled() else ()
            with tracing.server_span("frontend.request", metadata, {"rpc.method": self.method}):
                await self._work()
        except Failed as exc:
            code, message = exc.code, str(exc)
        except asyncio.CancelledError:
            if self._why is None:  # reset, or the connection lost: there is no one to tell
                raise
            code, message = self._why
        except Exception as exc:  # a bug: the call's status says so, the connection lives on
            log.exception("%s failed", self.method)
            code, message = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}"
        self.finish(code, message)

    @abstractmethod
    async def _work(self) -> None:
        """The call's work: read the request and send the response (its status is _serve's)."""

    async def send(self, data: bytes) -> None:
        """Write framed messages, waiting for window or a paused transport as needed."""
        conn = self.conn
        if not self.started:
            self.started = True
            conn.send_headers(self.stream_id, RESPONSE_HEAD)
        while data:
            if self.closed:
                raise asyncio.CancelledError
            room = 0 if conn.paused else conn.room(self.stream_id)
            if room <= 0:
                await conn.writable()
                continue
            conn.write_data(self.stream_id, data[:room])
            data = data[room:]

    def finish(self, code: grpc.StatusCode, message: str) -> None:
        """The trailers (the whole response when nothing was sent: trailers-only); the stream's end."""
        if self.closed:
            return
        self.closed = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.conn.send_headers(self.stream_id, status_headers(code, message, started=self.started),
                               end_stream=True, reset=not self.remote_ended)
        self.conn.forget(self)


class NativeCall(PortCall):
    """One call of `method` (GenerateStream or Generate) on a connection: the request's DATA gathered
    (refused past the message limit from its length prefix alone), then a task that serves it and ends
    the stream with trailers. Cancelling the task leaves the request at its engine (Inference.launched
    aborts it there)."""

    def __init__(self, conn: Connection, stream_id: int, method: str, headers: list[tuple[bytes, bytes]],
                 inference: Inference, keys: ApiKeys, limit: int) -> None:
        self._inference = inference
        self._body = bytearray()
        self._request = b""
        super().__init__(conn, stream_id, method, headers, keys, limit)

    # ---- the client's side of the stream (Connection dispatches its events) ----

    def on_data(self, data: bytes, flow_controlled: int = 0) -> None:
        if self.closed or self.task is not None:
            return
        body = self._body
        body += data
        if len(body) >= 5:
            size = int.from_bytes(body[1:5], "big")
            if size > self._limit:
                self.finish(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"Received message larger than max ({size} vs. {self._limit})")
            elif len(body) > 5 + size:  # past its one message: never held past the limit
                self.finish(grpc.StatusCode.INTERNAL, ONE_MESSAGE)

    def on_end(self) -> None:
        self.remote_ended = True
        if self.closed or self.task is not None:
            return
        message = self._message()
        if message is not None:
            self._request = message
            self.task = asyncio.get_running_loop().create_task(self._serve())

    def _message(self) -> bytes | None:
        """The one request message, decompressed; None after answering a malformed body."""
        body = self._body
        if len(body) < 5 or len(body) != 5 + int.from_bytes(body[1:5], "big"):
            self.finish(grpc.StatusCode.INTERNAL, ONE_MESSAGE)
            return None
        message = bytes(body[5:])
        self._body = bytearray()
        if body[0] == 0:
            return message
        try:
            return self.inflate(message)
        except Failed as exc:
            self.finish(exc.code, str(exc))
            return None

    # ---- the response ----

    async def _work(self) -> None:
        request, self._request = self._request, b""
        inference = self._inference
        if self.method == "Generate":
            await self.send(frame((await inference.generate(request)).SerializeToString()))
        else:
            engine_request = await inference.translate(request, stream=True)
            with inference.launched(engine_request) as outputs:
                await self._stream(StreamMessages(engine_request, outputs), outputs)

    async def _stream(self, messages: StreamMessages, outputs: Any) -> None:
        """The response messages: the first and last from this task, those between mostly from the
        dispatch pass (a DirectStream), this task taking over whenever the outlet takes no bytes."""
        stream = outputs.stream

        def events(pieces: list[Any]) -> list[bytes]:
            message = messages.message(pieces)
            return [] if message is None else [frame(message)]

        direct = DirectStream(self, outputs, events)
        while outputs.finish is None:
            if self.started and not stream.ready and self.usable():
                try:
                    framed = await direct.run()
                except EngineFailure as exc:
                    ended(outputs, exc)
                    framed = events([])
            else:
                framed = events(await next_pieces(outputs))
            for data in framed:
                await self.send(data)

    def usable(self) -> bool:
        return not self.closed and not self.conn.paused

    def native_target(self) -> None:
        """No C step writes a gRPC call's messages (DirectStream.native_target)."""
        return None

    def put(self, data: bytes) -> bool:
        """The outlet (DirectStream's): `data` written whole now when the windows and the transport
        take it, else nothing written."""
        if self.closed or self.conn.paused or self.conn.room(self.stream_id) < len(data):
            return False
        self.conn.write_data(self.stream_id, data)
        return True
