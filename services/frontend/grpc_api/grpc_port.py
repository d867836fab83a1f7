"""The gRPC port (--grpc-port): an HTTP/2 server of the frontend's own, h2 keeping each connection's
state. It serves Inference.GenerateStream and Generate itself (native_call.py: messages framed here, a
stream's mostly written in the engine dispatch pass) and relays every other call, unchanged, to grpc.aio on an
internal socket: one HTTP/2 client connection there per client connection, opened at its first relayed
call, flow control honoured both ways. grpc.aio's per-message path costs several times SSE's per token
(docs/grpc.md). Runs on API server 0's event loop."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections import deque
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from edge.api_keys import ApiKeys
from services.frontend.grpc_api import frame_repr  # noqa: F401  (h2 reprs every frame it takes)
from services.frontend.grpc_api.inference import Inference
from services.frontend.grpc_api.native_call import ENCODINGS, NativeCall, PortCall, status_headers
from services.frontend.grpc_api.upload_call import UploadCall, WeightUpdates

log = logging.getLogger(__name__)

# The methods served here (native_call.py), by path.
NATIVE = {b"/fleet.v1.Inference/GenerateStream": "GenerateStream", b"/fleet.v1.Inference/Generate": "Generate",
          b"/fleet.v1.RlControl/UpdateWeights": "UpdateWeights"}
# Our receive windows: a stream's and the connection's. A relayed call's bytes are acknowledged as they
# go on, so these bound what a connection buffers; large enough that a weight update's tensors are not
# held to a round trip per 64 KiB.
STREAM_WINDOW = 4 << 20
CONNECTION_WINDOW = 16 << 20
UPLOAD_WINDOW = 16 << 20  # an UpdateWeights stream's: its bytes go on to the engines as they come
MAX_FRAME = 1 << 20  # the largest frame we take: fewer frames to parse when a call sends megabytes
MAX_STREAMS = 1 << 16  # per connection; grpc.aio's own bound is higher still
_FRAME = struct.Struct(">IBI")  # a frame's head: length << 8 | type, flags, stream id
_DATA, _HEADERS, _SETTINGS, _PING, _GOAWAY = 0x0, 0x1, 0x4, 0x6, 0x7
_CONTROL = (_SETTINGS, _PING)
_ACK = 0x1
_PADDED = 0x8
_FRAME_SIZE_ERROR, _ENHANCE_YOUR_CALM = 0x6, 0xB
MAX_CONTROL_FRAMES = 100  # PINGs and SETTINGS in a row with no HEADERS or DATA: past it, a flood
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SHUTTING_DOWN = "the frontend is shutting down; send the request to another replica"


class GrpcPort:
    """The listener. start() binds; stop(grace) stops taking connections, tells clients (GOAWAY), gives
    running native calls `grace` seconds, then ends them and closes every connection."""

    def __init__(self, inference: Inference, keys: ApiKeys, max_message_bytes: int, upstream: str,
                 weights: WeightUpdates | None = None) -> None:
        """`weights`: UpdateWeights' handler, the call served here (upload_call.py); None relays it."""
        self.inference, self.keys, self.max_message_bytes = inference, keys, max_message_bytes
        self.weights = weights
        self.upstream = upstream  # grpc.aio's internal socket (a path)
        self.connections: set[Connection] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Connection(self), host or None, port)
        return int(self._server.sockets[0].getsockname()[1])

    def calls(self) -> list[PortCall]:
        return [c for conn in self.connections for c in conn.calls.values() if isinstance(c, PortCall)]

    async def stop(self, grace: float) -> None:
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.goaway()
        running = [c.task for c in self.calls() if c.task is not None]
        if running and grace > 0:
            await asyncio.wait(running, timeout=grace)
        for call in self.calls():
            call.cancel(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        running = [c.task for c in self.calls() if c.task is not None and not c.task.done()]
        if running:  # their trailers go out as they end
            await asyncio.wait(running, timeout=1.0)
        for conn in list(self.connections):
            conn.close()


class Connection(asyncio.Protocol):
    """One client connection: its streams, each served here (a NativeCall or an UploadCall) or relayed
    (Relayed)."""

    def __init__(self, port: GrpcPort) -> None:
        self.port = port
        # Headers are checked per stream here (header_fault): h2's own check fails the whole connection.
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_inbound_headers=False))
        self.transport: asyncio.Transport | None = None
        self.paused = False  # the transport's buffer is full (a slow reader)
        self.calls: dict[int, PortCall | Relayed] = {}
        self._waiters: list[asyncio.Future[None]] = []
        # Connections to grpc.aio, the newest taking new relayed calls (one that said GOAWAY takes none).
        self._upstreams: list[Upstream] = []
        self._frames = FrameWatch(len(_PREFACE), MAX_FRAME, MAX_CONTROL_FRAMES)

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.port.connections.add(self)
        _initiate(self.h2, {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS})
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.port.connections.discard(self)
        for call in list(self.calls.values()):
            call.on_lost()
        self.calls.clear()
        self._wake()
        for upstream in self._upstreams:
            upstream.close()
        self._upstreams.clear()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake()

    def data_received(self, data: bytes) -> None:
        try:
            data, codes = self._frames.feed(data)
        except FrameFault as fault:
            log.info("gRPC port: closing a connection: %s", fault.why)
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.close_connection(error_code=fault.code, additional_data=fault.why.encode())
            self.flush()
            self.close()
            return
        if any(codes):
            log.debug("gRPC port: a client's GOAWAY with error code %d; closing its connection", max(codes))
            self.close()
        try:
            events: list[Any] = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.debug("gRPC port: a connection broke HTTP/2 (%s); closing it", exc)
            self.flush()
            self.close()
            return
        calls = self.calls
        h2c = self.h2
        payloads = self._frames.payloads
        for event in events:
            kind = type(event)
            if kind is h2.events.DataReceived:
                call = calls.get(event.stream_id)
                if payloads and not event.flow_controlled_length and event.stream_id in payloads:
                    # A frame whose payload FrameWatch took out (an UploadCall's): h2 got it empty.
                    if not self._take_payload(event.stream_id, call):
                        return
                    continue
                if type(call) is Relayed or type(call) is UploadCall:  # they give the bytes back as they go on
                    call.on_data(event.data, event.flow_controlled_length)
                    continue
                h2c.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                if call is not None:
                    call.on_data(event.data, 0)
            elif kind is h2.events.RequestReceived:
                self._open(event.stream_id, event.headers, event.stream_ended is not None)
            elif kind is h2.events.StreamEnded:
                call = calls.get(event.stream_id)
                if call is not None:
                    call.on_end()
            elif kind is h2.events.StreamReset:
                call = calls.pop(event.stream_id, None)
                if call is not None:
                    call.on_reset(event.error_code)
            elif kind in (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged):
                self._wake()
        if payloads:  # frames h2 took no event of (their stream ended here meanwhile): the windows back
            for stream_id, fifo in list(payloads.items()):
                del payloads[stream_id]
                n = sum(len(p) for pieces in fifo for p in pieces)
                if n and self._consumed(stream_id, n):
                    self.acknowledge(stream_id, n)
        self.flush()
        for upstream in self._upstreams:
            upstream.flush()

    def _take_payload(self, stream_id: int, call: PortCall | Relayed | None) -> bool:
        """The next taken-out payload of the stream to its call, h2 told of the windows it used; False
        when it broke them (the connection is closed)."""
        fifo = self._frames.payloads[stream_id]
        pieces = fifo.popleft()
        if not fifo:
            del self._frames.payloads[stream_id]
        n = sum(len(p) for p in pieces)
        if n and not self._consumed(stream_id, n):
            return False
        if type(call) is UploadCall:
            call.on_pieces(pieces, n)
        elif n:
            self.acknowledge(stream_id, n)
        return True

    def _consumed(self, stream_id: int, n: int) -> bool:
        """h2's receive windows take `n` bytes it never saw (their frames came to it empty), as its own
        receive path does; a peer past them breaks flow control: the connection ends (False)."""
        h2c = self.h2
        try:
            h2c._inbound_flow_control_window_manager.window_consumed(n)  # h2 has no public way to say it
            stream = h2c.streams.get(stream_id)
            if stream is not None and stream.open:
                stream._inbound_window_manager.window_consumed(n)
        except h2.exceptions.FlowControlError:
            log.debug("gRPC port: a client sent past its flow-control window; closing its connection")
            with contextlib.suppress(h2.exceptions.ProtocolError):
                h2c.close_connection(error_code=h2.errors.ErrorCodes.FLOW_CONTROL_ERROR)
            self.flush()
            self.close()
            return False
        return True

    # ---- streams ----

    def _open(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        path = method = content_type = None
        encoding = b"identity"
        trailers = False
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b":method":
                method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-encoding":
                encoding = value
            elif name == b"te":
                trailers = value == b"trailers"
        fault = header_fault(headers)
        if fault is not None:  # this stream alone is refused, as grpc.aio refuses it
            self.send_headers(stream_id, status_headers(grpc.StatusCode.INTERNAL, fault, started=False),
                              end_stream=True, reset=not ended)
            return
        call: PortCall | Relayed
        port = self.port
        native = NATIVE.get(path) if path is not None else None
        # Served here: a well-formed call of a native method. Anything odd goes to grpc.aio, which answers it.
        if (native is not None and method == b"POST" and trailers and content_type is not None
                and content_type.startswith(b"application/grpc") and encoding in ENCODINGS
                and (native != "UpdateWeights" or port.weights is not None)):
            if native == "UpdateWeights":
                assert port.weights is not None
                call = UploadCall(self, stream_id, headers, port.weights, port.keys, port.max_message_bytes)
                if not call.closed:
                    self._frames.raw.add(stream_id)
                    with contextlib.suppress(h2.exceptions.ProtocolError):
                        self.h2.increment_flow_control_window(UPLOAD_WINDOW - STREAM_WINDOW, stream_id)
            else:
                call = NativeCall(self, stream_id, native, headers, port.inference, port.keys,
                                  port.max_message_bytes)
        else:
            call = Relayed(self, stream_id, headers)
            upstreams = self._upstreams
            if not upstreams or upstreams[-1].draining:
                upstreams.append(Upstream(self, self.port.upstream))
            upstreams[-1].open(call)
        if not call.closed:
            self.calls[stream_id] = call
            if ended:
                call.on_end()

    def forget(self, call: PortCall | Relayed) -> None:
        if self.calls.get(call.stream_id) is call:
            del self.calls[call.stream_id]
            self._frames.raw.discard(call.stream_id)

    def drop(self, upstream: Upstream) -> None:
        """An upstream connection closed, or drained with no calls left."""
        if upstream in self._upstreams:
            self._upstreams.remove(upstream)
        upstream.close()

    # ---- writing ----

    def flush(self) -> None:
        """h2's pending bytes out, before any frame written by hand (a stream's HEADERS before its DATA)."""
        out = self.h2.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], *, end_stream: bool = False,
                     reset: bool = False) -> None:
        """HEADERS on a stream (a response's, or its trailers with end_stream), and with `reset` a
        RST_STREAM (NO_ERROR) after them: the response is whole, the client need send no more."""
        with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            self.h2.send_headers(stream_id, headers, end_stream=end_stream)
            if reset:
                self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
        self.flush()

    def acknowledge(self, stream_id: int, n: int) -> None:
        """`n` received bytes of a stream given back to the client's windows (h2 sends WINDOW_UPDATE once
        half a window is given back); out at the next flush."""
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.acknowledge_received_data(n, stream_id)

    def room(self, stream_id: int) -> int:
        """The bytes the flow-control windows let a stream send now."""
        h2c = self.h2
        stream = h2c.streams.get(stream_id)
        if stream is None:
            return 0
        return min(h2c.outbound_flow_control_window, stream.outbound_flow_control_window)

    def write_data(self, stream_id: int, data: bytes) -> None:
        """DATA frames written by hand, h2 told of the windows they use (room() bytes at most)."""
        assert self.transport is not None
        _write_frames(self.h2, self.transport, stream_id, data)

    async def writable(self) -> None:
        """Until a window opens, the transport resumes or the connection closes."""
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        await future

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)
        for call in list(self.calls.values()):
            if type(call) is Relayed:
                call.flush_down()

    def goaway(self) -> None:
        """Tell the client to open no more streams here (GOAWAY, NO_ERROR), the running ones going on.
        Written by hand: h2 would take no frame after its own GOAWAY, and running calls still need theirs."""
        if self.transport is not None and not self.transport.is_closing():
            self.flush()
            self.transport.write(_FRAME.pack(8 << 8 | _GOAWAY, 0, 0)
                                 + struct.pack(">II", self.h2.highest_inbound_stream_id, 0))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class FrameFault(Exception):
    """A peer broke a rule the frame heads show: the connection ends with this HTTP/2 error code."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code, self.why = code, why


class FrameWatch:
    """A peer's bytes as they pass to h2, their frame heads read on the way. GOAWAY frames are taken out:
    a GOAWAY says the peer opens no more streams, its running ones going on (RFC 9113 6.8: a client
    leaving, grpc.aio draining), but h2 takes no frame after one, so those would die; feed() says each
    one's error code. FrameFault for a frame past the largest we take (h2 would wait for all of it) and
    for more than `max_control` PING or SETTINGS frames with no HEADERS or DATA between (a flood,
    each answered on the event loop). A frame's head split between reads is held back until it is
    whole, a GOAWAY until all of it is here.
    The payload of a DATA frame (not padded) on a stream in `raw` is taken out too: h2 gets the frame
    empty, once all of its payload is here (its place in the stream, its END_STREAM flag), and the
    payload waits in `payloads`, views of the bytes read, no copy, for the h2 event of that frame
    (h2 copies a DATA frame's payload three times: a weight update's megabytes)."""

    def __init__(self, preface: int, max_frame: int, max_control: int | None = None) -> None:
        self._preface = preface  # bytes of the client's preface yet to pass
        self._max_frame = max_frame
        self._max_control = max_control
        self._control = 0  # PING and SETTINGS frames since the last HEADERS or DATA
        self._left = 0  # bytes of the current frame's payload yet to pass
        self._held = b""  # the start of a frame whose head (or GOAWAY) is not whole yet
        self.raw: set[int] = set()  # the streams whose DATA payloads are taken out
        self.payloads: dict[int, deque[list[memoryview]]] = {}  # per stream, each taken-out frame's pieces
        self._pieces: list[memoryview] | None = None  # the current frame's payload, when taken out
        self._raw_head = b""  # its head as h2 gets it: empty
        self._raw_id = 0

    def feed(self, data: bytes) -> tuple[bytes, list[int]]:
        """The bytes to give h2, and the error codes of the GOAWAYs taken out. Raises FrameFault."""
        if self._held:
            data, self._held = self._held + data, b""
        n = len(data)
        pos = min(self._preface, n)
        self._preface -= pos
        kept: list[bytes | memoryview] = []
        codes: list[int] = []
        start = 0
        view = memoryview(data)
        raw = self.raw
        while pos < n:
            if self._left:
                step = min(self._left, n - pos)
                self._left -= step
                pieces = self._pieces
                if pieces is not None:
                    pieces.append(view[pos:pos + step])
                    pos += step
                    start = pos
                    if not self._left:
                        self._taken(kept)
                    continue
                pos += step
                continue
            if n - pos < 9:
                self._held = data[pos:]
                break
            length = int.from_bytes(data[pos:pos + 3], "big")
            kind = data[pos + 3]
            if length > self._max_frame:
                raise FrameFault(_FRAME_SIZE_ERROR, f"a frame of {length} bytes; the largest taken is "
                                                    f"{self._max_frame}")
            if kind in _CONTROL and not data[pos + 4] & _ACK and self._max_control is not None:
                self._control += 1
                if self._control > self._max_control:
                    raise FrameFault(_ENHANCE_YOUR_CALM, "too_many_pings")
            elif kind <= _HEADERS:
                self._control = 0
            if kind == _DATA and raw and not data[pos + 4] & _PADDED:
                stream_id = int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF
                if stream_id in raw:
                    kept.append(view[start:pos])
                    self._pieces, self._raw_id = [], stream_id
                    self._raw_head = _FRAME.pack(0, data[pos + 4], stream_id)
                    pos += 9
                    start = pos
                    self._left = length
                    if not length:
                        self._taken(kept)
                    continue
            if kind != _GOAWAY:
                self._left = length
                pos += 9
                continue
            if n - pos < 9 + length:
                self._held = data[pos:]
                break
            codes.append(int.from_bytes(data[pos + 13:pos + 17], "big") if length >= 8 else 0)
            kept.append(view[start:pos])
            pos += 9 + length
            start = pos
        if self._held:
            n -= len(self._held)
        if not kept:
            if start:
                return data[start:n], codes
            return (data[:n] if n < len(data) else data), codes
        kept.append(view[start:n])
        return b"".join(kept), codes

    def _taken(self, kept: list[bytes | memoryview]) -> None:
        """The current frame's payload is all here: h2 gets the frame, empty, where it ends."""
        assert self._pieces is not None
        kept.append(self._raw_head)
        fifo = self.payloads.get(self._raw_id)
        if fifo is None:
            fifo = self.payloads[self._raw_id] = deque()
        fifo.append(self._pieces)
        self._pieces = None


# A request's headers that HTTP/2 forbids (RFC 9113 8.2): a connection-specific field, an upper-case name.
_CONNECTION_FIELDS = {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
_PSEUDO = {b":method", b":scheme", b":path", b":authority"}


def header_fault(headers: list[tuple[bytes, bytes]]) -> str | None:
    """What is wrong with a request's header list, or None (h2's inbound checks, made per stream)."""
    seen: set[bytes] = set()
    regular = False
    for name, value in headers:
        if name[:1] == b":":
            if regular or name not in _PSEUDO or name in seen:
                return f"Illegal header key {name.decode(errors='replace')!r}: a pseudo-header misplaced"
            seen.add(name)
            continue
        regular = True
        if not name or name != name.lower():
            return f"Illegal header key {name.decode(errors='replace')!r}: names are lower case"
        if name in _CONNECTION_FIELDS or (name == b"te" and value != b"trailers"):
            return f"Illegal header key {name.decode(errors='replace')!r}: a connection-specific field"
    if not {b":method", b":scheme", b":path"} <= seen:
        return "a request needs :method, :scheme and :path"
    return None


class Relayed:
    """A call relayed to grpc.aio: the client's HEADERS, DATA and end passed on as they come, grpc.aio's
    response passed back; each side's bytes acknowledged to its sender once the other side took them."""

    def __init__(self, down: Connection, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.down, self.stream_id, self.headers = down, stream_id, headers
        self.up: Upstream | None = None
        self.up_id = 0  # grpc.aio's stream, once opened
        self.closed = False
        self._finished = False  # _done() ran
        self.started = False  # grpc.aio's response HEADERS passed on
        self._to_up = bytearray()  # the client's bytes grpc.aio's window has no room for yet
        self._up_owed = 0  # the client's flow-controlled bytes not yet acknowledged
        self._up_end = False
        self._to_down = bytearray()
        self._down_owed = 0
        self._down_end: list[tuple[bytes, bytes]] | None = None  # the trailers ([]: a bare end) to send after
        self.remote_ended = False

    # ---- the client's side ----

    def on_data(self, data: bytes, flow_controlled: int) -> None:
        self._up_owed += flow_controlled
        up = self.up
        if not self._to_up and not self.closed and up is not None and up.write_data(self, data):
            # The common case, a weight update's megabytes: straight on, no copy into the buffer and out.
            self.down.h2.acknowledge_received_data(self._up_owed, self.stream_id)
            self._up_owed = 0
            return
        self._to_up += data
        self.flush_up()

    def on_end(self) -> None:
        self.remote_ended = True
        self._up_end = True
        self.flush_up()

    def on_reset(self, code: int) -> None:
        if self.up is not None:
            self.up.reset(self, code)
        self._done()

    def on_lost(self) -> None:
        self.closed = True

    def flush_up(self) -> None:
        up = self.up
        if up is None or not self.up_id or self.closed:
            return
        h2c = up.h2
        buffered = self._to_up
        sent = 0
        with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            sent = _send_buffered(h2c, self.up_id, buffered)
            if self._up_end and not buffered:
                self._up_end = False
                h2c.end_stream(self.up_id)
        if sent or (not buffered and self._up_owed):
            ack = self._up_owed if not buffered else min(sent, self._up_owed)
            self._up_owed -= ack
            self.down.h2.acknowledge_received_data(ack, self.stream_id)

    # ---- grpc.aio's side ----

    def on_response(self, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        self.started = True
        self.down.send_headers(self.stream_id, headers, end_stream=ended, reset=ended and not self.remote_ended)
        if ended:
            self._done()

    def on_up_data(self, data: bytes, flow_controlled: int) -> None:
        self._to_down += data
        self._down_owed += flow_controlled
        self.flush_down()

    def on_up_end(self, trailers: list[tuple[bytes, bytes]]) -> None:
        self._down_end = trailers
        self.flush_down()

    def flush_down(self) -> None:
        if self.closed:
            return
        h2c = self.down.h2
        buffered = self._to_down
        sent = 0
        try:
            if not self.down.paused:  # a slow reader: grpc.aio's bytes wait, unacknowledged, in its window
                sent = _send_buffered(h2c, self.stream_id, buffered)
            if self._down_end is not None and not buffered:
                if self._down_end:
                    h2c.send_headers(self.stream_id, self._down_end, end_stream=True)
                else:
                    h2c.end_stream(self.stream_id)
                if not self.remote_ended:
                    h2c.reset_stream(self.stream_id, h2.errors.ErrorCodes.NO_ERROR)
                self._done()
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            self._done()
        if sent and self.up is not None:
            ack = self._down_owed if not buffered else min(sent, self._down_owed)
            self._down_owed -= ack
            self.up.acknowledge(self, ack)

    def fail(self, message: str) -> None:
        """grpc.aio is unreachable or went: the call ends UNAVAILABLE."""
        if self.closed:
            return
        self.down.send_headers(self.stream_id, status_headers(grpc.StatusCode.UNAVAILABLE, message,
                                                              started=self.started),
                               end_stream=True, reset=not self.remote_ended)
        self._done()

    def reset_down(self, code: int) -> None:
        if not self.closed:
            with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                self.down.h2.reset_stream(self.stream_id, code)
            self._done()

    def _done(self) -> None:
        """The call is over here: what each side sent that the other never took is given back to its
        sender's window (else a connection's window shrinks by each call that ends mid-way)."""
        if self._finished:
            return
        self._finished = self.closed = True
        if self._up_owed:
            self.down.h2.acknowledge_received_data(self._up_owed, self.stream_id)
            self._up_owed = 0
        self._to_up.clear()
        if self._down_owed and self.up is not None and self.up_id:
            self.up.acknowledge(self, self._down_owed)
            self._down_owed = 0
        self._to_down.clear()
        self.down.forget(self)
        if self.up is not None:
            self.up.forget(self)


def _initiate(h2c: h2.connection.H2Connection, settings: dict[h2.settings.SettingCodes, int]) -> None:
    """Our side's SETTINGS and windows, either side of the relay: frames up to MAX_FRAME, a stream's
    window STREAM_WINDOW, the connection's CONNECTION_WINDOW."""
    h2c.local_settings = h2.settings.Settings(client=h2c.config.client_side, initial_values={
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
        h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME,
        h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: h2c.DEFAULT_MAX_HEADER_LIST_SIZE, **settings})
    h2c.max_inbound_frame_size = MAX_FRAME
    h2c.initiate_connection()
    h2c.increment_flow_control_window(CONNECTION_WINDOW - 65535)


def _write_frames(h2c: h2.connection.H2Connection, transport: asyncio.Transport, stream_id: int, data: bytes) -> None:
    """`data` as DATA frames of the peer's largest size, written by hand after whatever h2 holds (a
    stream's HEADERS before its DATA: the caller flushed it); h2 told of the windows they use, which the
    caller checked take them."""
    n = len(data)
    h2c.outbound_flow_control_window -= n
    h2c.streams[stream_id].outbound_flow_control_window -= n
    size = h2c.max_outbound_frame_size
    if n <= size:
        transport.write(_FRAME.pack(n << 8, 0, stream_id) + data)
        return
    view = memoryview(data)
    transport.writelines([part for i in range(0, n, size)
                          for part in (_FRAME.pack(len(view[i:i + size]) << 8, 0, stream_id), view[i:i + size])])


def _send_buffered(h2c: h2.connection.H2Connection, stream_id: int, buffered: bytearray) -> int:
    """As much of `buffered` as the stream's and the connection's windows take, in frames the peer takes,
    taken from it; the bytes sent."""
    sent = 0
    while buffered:
        n = min(len(buffered), h2c.local_flow_control_window(stream_id), h2c.max_outbound_frame_size)
        if n <= 0:
            break
        h2c.send_data(stream_id, bytes(buffered[:n]))
        del buffered[:n]
        sent += n
    return sent


class Upstream(asyncio.Protocol):
    """One client connection's relayed calls on an HTTP/2 connection to grpc.aio's internal socket."""

    def __init__(self, down: Connection, path: str) -> None:
        self.down = down
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.transport: asyncio.Transport | None = None
        self._by_id: dict[int, Relayed] = {}
        self._waiting: list[Relayed] = []
        self._gone: str | None = None  # why no more calls can go up
        self.draining = False  # grpc.aio said GOAWAY here: the running calls go on, new ones go elsewhere
        self._frames = FrameWatch(0, MAX_FRAME)  # the largest frame we take, as the port's own side
        self._connect: asyncio.Task[Any] | None = asyncio.get_running_loop().create_task(self._dial(path))

    async def _dial(self, path: str) -> None:
        try:
            await asyncio.get_running_loop().create_unix_connection(lambda: self, path)
        except OSError as exc:
            self._lost(f"the frontend's gRPC services are unreachable: {exc}")
            self.down.flush()
        finally:
            self._connect = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        _initiate(self.h2, {})
        waiting, self._waiting = self._waiting, []
        for call in waiting:
            self._start(call)
        self.flush()
        self.down.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._lost("the frontend's gRPC services went away")
        self.down.drop(self)
        self.down.flush()

    def _lost(self, why: str) -> None:
        self._gone = self._gone or why
        calls = [*self._waiting, *self._by_id.values()]
        self._waiting, self._by_id = [], {}
        for call in calls:
            call.fail(why)

    def open(self, call: Relayed) -> None:
        call.up = self
        if self._gone is not None:
            call.fail(self._gone)
        elif self.transport is None:
            self._waiting.append(call)
        else:
            self._start(call)

    def _start(self, call: Relayed) -> None:
        if call.closed:
            return
        h2c = self.h2
        try:
            call.up_id = h2c.get_next_available_stream_id()
            h2c.send_headers(call.up_id, call.headers)
        except h2.exceptions.ProtocolError as exc:
            call.fail(f"the frontend's gRPC services took no more calls: {exc}")
            return
        self._by_id[call.up_id] = call
        call.flush_up()

    def data_received(self, data: bytes) -> None:
        try:
            data, codes = self._frames.feed(data)
        except FrameFault as fault:
            self._lost(f"the frontend's gRPC services broke HTTP/2: {fault.why}")
            self.close()
            return
        if codes:  # grpc.aio stopping, or done with this connection: the running calls go on here
            self.draining = True
        try:
            events: list[Any] = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._lost(f"the frontend's gRPC services broke HTTP/2: {exc}")
            self.close()
            events = []
        by_id = self._by_id
        for event in events:
            kind = type(event)
            call = by_id.get(getattr(event, "stream_id", 0) or 0)
            if kind is h2.events.DataReceived:
                if call is None:
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                else:
                    call.on_up_data(event.data, event.flow_controlled_length)
                    if event.stream_ended is not None:
                        call.on_up_end([])
            elif kind is h2.events.ResponseReceived and call is not None:
                call.on_response(event.headers, event.stream_ended is not None)
            elif kind is h2.events.TrailersReceived and call is not None:
                call.on_up_end(event.headers)
            elif kind is h2.events.StreamReset and call is not None:
                by_id.pop(event.stream_id, None)
                call.reset_down(event.error_code)
            elif kind in (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged):
                for relayed in list(by_id.values()):
                    relayed.flush_up()
        self.flush()
        self.down.flush()

    def write_data(self, call: Relayed, data: bytes) -> bool:
        """`data` on the call's stream now, framed by hand, when the windows take it whole; else False
        (nothing written: the call buffers it)."""
        transport = self.transport
        h2c = self.h2
        stream = h2c.streams.get(call.up_id) if call.up_id else None
        if (transport is None or transport.is_closing() or stream is None or stream.closed
                or min(h2c.outbound_flow_control_window, stream.outbound_flow_control_window) < len(data)):
            return False
        self.flush()  # the stream's HEADERS, and anything else h2 holds, go first
        _write_frames(h2c, transport, call.up_id, data)
        return True

    def acknowledge(self, call: Relayed, n: int) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.acknowledge_received_data(n, call.up_id)
        self.flush()

    def reset(self, call: Relayed, code: int) -> None:
        if call.up_id and self._by_id.pop(call.up_id, None) is not None:
            with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                self.h2.reset_stream(call.up_id, code)
            self.flush()

    def forget(self, call: Relayed) -> None:
        if call.up_id:
            self._by_id.pop(call.up_id, None)
        if self.draining and not self._by_id and not self._waiting:
            self.down.drop(self)

    def flush(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            out = self.h2.data_to_send()
            if out:
                transport.write(out)

    def close(self) -> None:
        self._gone = self._gone or "the client's connection closed"
        if self._connect is not None:
            self._connect.cancel()
        if self.transport is not None:
            self.transport.close()

