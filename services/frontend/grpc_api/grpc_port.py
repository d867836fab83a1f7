"""The gRPC port (--grpc-port): an HTTP/2 server of the frontend's own, h2 keeping each connection's
state. It serves Inference.GenerateStream and Generate itself (native_call.py: messages framed here, a
stream's mostly written in the engine dispatch pass) and relays every other call, unchanged, to grpc.aio on an
internal socket: one HTTP/2 client connection there per client connection, opened at its first relayed
call, flow control honoured both ways. grpc.aio's per-message path costs several times SSE's per token
(docs/grpc.md). The relay is relay.py; the frames below h2, h2_frames.py. Runs on API server 0's event loop."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
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
from services.frontend.grpc_api.h2_frames import (
    FRAME,
    GOAWAY,
    MAX_CONTROL_FRAMES,
    MAX_FRAME,
    MAX_STREAMS,
    PREFACE,
    STREAM_WINDOW,
    UPLOAD_WINDOW,
    FrameFault,
    FrameWatch,
    header_fault,
    initiate,
    write_frames,
)
from services.frontend.grpc_api.inference import Inference
from services.frontend.grpc_api.native_call import ENCODINGS, NativeCall, PortCall, status_headers
from services.frontend.grpc_api.relay import Relayed, Upstream
from services.frontend.grpc_api.upload_call import UploadCall, WeightUpdates

log = logging.getLogger(__name__)

# The methods served here (native_call.py), by path.
NATIVE = {b"/fleet.v1.Inference/GenerateStream": "GenerateStream", b"/fleet.v1.Inference/Generate": "Generate",
          b"/fleet.v1.RlControl/UpdateWeights": "UpdateWeights"}
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
        self._relayed: dict[int, Relayed] = {}  # those of `calls` relayed: a window opening flushes them
        self._waiters: list[asyncio.Future[None]] = []
        # Connections to grpc.aio, the newest taking new relayed calls (one that said GOAWAY takes none).
        self._upstreams: list[Upstream] = []
        self._frames = FrameWatch(len(PREFACE), MAX_FRAME, MAX_CONTROL_FRAMES)

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.port.connections.add(self)
        initiate(self.h2, {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS})
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.port.connections.discard(self)
        for call in list(self.calls.values()):
            call.on_lost()
        self.calls.clear()
        self._relayed.clear()
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
            if type(call) is Relayed:
                self._relayed[stream_id] = call
            if ended:
                call.on_end()

    def forget(self, call: PortCall | Relayed) -> None:
        stream_id = call.stream_id
        if self.calls.get(stream_id) is call:
            del self.calls[stream_id]
            self._frames.raw.discard(stream_id)
        if self._relayed.get(stream_id) is call:  # a reset call left `calls` first
            del self._relayed[stream_id]

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
        write_frames(self.h2, self.transport, stream_id, data)

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
        for call in list(self._relayed.values()):
            call.flush_down()

    def goaway(self) -> None:
        """Tell the client to open no more streams here (GOAWAY, NO_ERROR), the running ones going on.
        Written by hand: h2 would take no frame after its own GOAWAY, and running calls still need theirs."""
        if self.transport is not None and not self.transport.is_closing():
            self.flush()
            self.transport.write(FRAME.pack(8 << 8 | GOAWAY, 0, 0)
                                 + struct.pack(">II", self.h2.highest_inbound_stream_id, 0))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
