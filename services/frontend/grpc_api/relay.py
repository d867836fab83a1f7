"""Calls the gRPC port (grpc_port.py) does not serve itself, relayed unchanged to grpc.aio on an internal
socket: one HTTP/2 client connection there (Upstream) per client connection, opened at its first relayed
call; each call (Relayed) passes the client's bytes up and grpc.aio's back, flow control honoured both ways."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from services.frontend.grpc_api.h2_frames import (
    MAX_FRAME,
    FrameFault,
    FrameWatch,
    initiate,
    send_buffered,
    write_frames,
)
from services.frontend.grpc_api.native_call import status_headers


class Connection(Protocol):
    """What the relay uses of a client connection (grpc_port.py's)."""

    h2: h2.connection.H2Connection
    paused: bool  # its transport takes no more bytes for now

    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], *, end_stream: bool = False,
                     reset: bool = False) -> None: ...

    def forget(self, call: Any) -> None: ...

    def drop(self, upstream: Upstream) -> None: ...

    def flush(self) -> None: ...


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
            sent = send_buffered(h2c, self.up_id, buffered)
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
                sent = send_buffered(h2c, self.stream_id, buffered)
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
        initiate(self.h2, {})
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
        write_frames(h2c, transport, call.up_id, data)
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
