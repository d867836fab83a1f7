"""A tiny HTTP/2 client over a plain socket for wire-level gRPC tests (the test process): it sends the frames
a test asks for and records every frame the server sends per stream; the test decides when to grant flow
control (auto_ack) so it can play a reader that stops reading."""
from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame

GRPC_HEADERS = (("content-type", "application/grpc"), ("te", "trailers"))


def grpc_frame(payload: bytes, *, compressed: bool = False) -> bytes:
    """One gRPC length-prefixed message: a compressed flag, a 4-byte big-endian length, the bytes."""
    return struct.pack(">BI", int(compressed), len(payload)) + payload


def grpc_messages(data: bytes) -> list[tuple[int, bytes]]:
    """The (compressed flag, payload) of every length-prefixed message in `data`, which must hold whole
    messages and nothing else."""
    out, at = [], 0
    while at < len(data):
        assert len(data) - at >= 5, f"a message prefix cut at byte {at} of {len(data)}"
        flag, size = struct.unpack_from(">BI", data, at)
        assert len(data) - at - 5 >= size, f"a message of {size} bytes cut at byte {at} of {len(data)}"
        out.append((flag, data[at + 5:at + 5 + size]))
        at += 5 + size
    return out


@dataclass
class Stream:
    """What the server sent on one stream, in order: `frames` names each HEADERS / DATA / RST_STREAM."""
    headers: dict[str, str] | None = None
    trailers: dict[str, str] | None = None
    data: bytearray = field(default_factory=bytearray)
    data_frames: list[int] = field(default_factory=list)  # each DATA frame's payload size
    frames: list[str] = field(default_factory=list)  # "headers", "headers+end", "data", "trailers", "reset"
    ended: bool = False
    reset_code: int | None = None
    unacked: int = 0  # flow-controlled bytes received and not yet granted back

    @property
    def closed(self) -> bool:
        return self.ended or self.reset_code is not None

    @property
    def status(self) -> dict[str, str]:
        """grpc-status and grpc-message, from the trailers or from a trailers-only response's headers."""
        return self.trailers if self.trailers is not None else (self.headers or {})


class H2Client:
    """One HTTP/2 connection (prior knowledge, no TLS). `pump` reads what arrived and answers what h2
    answers by itself (SETTINGS and PING acks); DATA is granted back only when `auto_ack` or `ack` says."""

    def __init__(self, port: int, *, auto_ack: bool = True, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.auto_ack = auto_ack
        self.authority = f"{host}:{port}"
        self.streams: dict[int, Stream] = {}
        self.events: list[h2.events.Event] = []  # every event, in order
        self.eof = False
        self.conn.initiate_connection()
        self.flush()

    def flush(self) -> None:
        if out := self.conn.data_to_send():
            self.sock.sendall(out)

    def request(self, path: str, body: bytes | None = None, *, headers: Iterable[tuple[str, str]] = GRPC_HEADERS,
                end: bool = True) -> int:
        """A POST on a new stream: the headers, then `body` as one DATA frame's worth (h2 splits it to the
        peer's frame size), ending the stream when `end`."""
        sid = self.conn.get_next_available_stream_id()
        self.streams[sid] = Stream()
        pseudo = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", self.authority)]
        self.conn.send_headers(sid, [*pseudo, *headers], end_stream=body is None and end)
        if body is not None:
            self.send(sid, body, end=end)
        self.flush()
        return sid

    def send(self, sid: int, body: bytes, *, end: bool = False) -> None:
        """`body` on the stream, as the server's windows allow (pumping for WINDOW_UPDATEs meanwhile); the
        rest dropped once the server has ended or reset the stream (it answered before reading it all)."""
        try:
            while body:
                room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
                if room == 0:
                    self.pump(1.0)
                    continue
                self.conn.send_data(sid, body[:room])
                body = body[room:]
                self.flush()
            if end:
                self.conn.end_stream(sid)
        except h2.exceptions.StreamClosedError:
            pass
        self.flush()

    def ack(self, sid: int) -> None:
        """Grant back what the stream has received (its window and the connection's)."""
        s = self.streams[sid]
        if s.unacked:  # h2 grants the connection's window back even once the stream is closed
            self.conn.acknowledge_received_data(s.unacked, sid)
        s.unacked = 0
        self.flush()

    def reset(self, sid: int, code: int = 8) -> None:  # 8: CANCEL, what a client sends to abandon a call
        self.conn.reset_stream(sid, code)
        self.flush()

    def update_settings(self, changes: dict[h2.settings.SettingCodes, int]) -> None:
        """A SETTINGS frame with `changes`; the server's acknowledgement comes as a SettingsAcknowledged."""
        self.conn.update_settings(changes)
        self.flush()

    def ping(self, opaque: bytes) -> None:
        self.conn.ping(opaque)
        self.flush()

    def goaway(self) -> None:
        self.conn.close_connection()
        self.flush()

    def send_goaway_frame(self) -> None:
        """A GOAWAY written past h2's state machine, which would refuse to read anything after its own: a
        client that stops opening streams and still reads the ones it has."""
        frame = hyperframe.frame.GoAwayFrame(0)
        frame.last_stream_id = 0  # the server started none
        self.sock.sendall(frame.serialize())

    def close(self) -> None:
        self.sock.close()

    def pump(self, timeout_s: float) -> bool:
        """Read what arrives within `timeout_s` (one read) and record it; False on the server's EOF."""
        if self.eof:
            return False
        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        if not ready:
            return True
        try:
            got = self.sock.recv(1 << 20)
        except ConnectionResetError:
            got = b""
        if not got:
            self.eof = True
            return False
        for ev in self.conn.receive_data(got):
            self._record(ev)
        self.flush()
        return True

    def wait(self, what: str, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Pump until `done()`, or fail saying `what` did not happen."""
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            assert left > 0, f"{what}: not within {timeout_s}s"
            if not self.pump(min(left, 0.1)) and not done():
                raise AssertionError(f"{what}: the server closed the connection first")

    def _record(self, ev: h2.events.Event) -> None:
        self.events.append(ev)
        sid = getattr(ev, "stream_id", None)
        s = self.streams.get(sid) if sid else None
        if s is None:
            return
        if isinstance(ev, h2.events.ResponseReceived):
            s.headers = dict(ev.headers)
            s.frames.append("headers+end" if ev.stream_ended else "headers")
        elif isinstance(ev, h2.events.TrailersReceived):
            s.trailers = dict(ev.headers)
            s.frames.append("trailers")
        elif isinstance(ev, h2.events.DataReceived):
            s.data += ev.data
            s.data_frames.append(len(ev.data))
            s.frames.append("data")
            s.unacked += ev.flow_controlled_length
            if self.auto_ack:
                self.ack(sid)
        elif isinstance(ev, h2.events.StreamEnded):
            s.ended = True
        elif isinstance(ev, h2.events.StreamReset):
            s.reset_code = int(ev.error_code)
            s.frames.append("reset")


@contextlib.contextmanager
def connections(port: int) -> Iterator[Callable[..., H2Client]]:
    """A maker of raw HTTP/2 connections to `port` (auto_ack= optional), each closed on leaving whatever
    happened: the `raw` fixture of the gRPC wire tests."""
    clients: list[H2Client] = []

    def connect(*, auto_ack: bool = True) -> H2Client:
        clients.append(H2Client(port, auto_ack=auto_ack))
        return clients[-1]

    try:
        yield connect
    finally:
        for c in clients:
            c.close()
