"""HTTP/2 below h2, for the gRPC port (grpc_port.py) and its relay to grpc.aio (relay.py): our SETTINGS and
windows, the frame heads a peer's bytes show on their way to h2 (FrameWatch), a request's headers checked
per stream, and DATA frames written by hand."""
from __future__ import annotations

import asyncio
import struct
from collections import deque

import h2.connection
import h2.settings

# Our receive windows: a stream's and the connection's. A relayed call's bytes are acknowledged as they
# go on, so these bound what a connection buffers; large enough that a weight update's tensors are not
# held to a round trip per 64 KiB.
STREAM_WINDOW = 4 << 20
CONNECTION_WINDOW = 16 << 20
UPLOAD_WINDOW = 16 << 20  # an UpdateWeights stream's: its bytes go on to the engines as they come
MAX_FRAME = 1 << 20  # the largest frame we take: fewer frames to parse when a call sends megabytes
MAX_STREAMS = 1 << 16  # per connection; grpc.aio's own bound is higher still
FRAME = struct.Struct(">IBI")  # a frame's head: length << 8 | type, flags, stream id
_DATA, _HEADERS, _SETTINGS, _PING, GOAWAY = 0x0, 0x1, 0x4, 0x6, 0x7
_CONTROL = (_SETTINGS, _PING)
_ACK = 0x1
_PADDED = 0x8
_FRAME_SIZE_ERROR, _ENHANCE_YOUR_CALM = 0x6, 0xB
MAX_CONTROL_FRAMES = 100  # PINGs and SETTINGS in a row with no HEADERS or DATA: past it, a flood
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"



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
                    self._raw_head = FRAME.pack(0, data[pos + 4], stream_id)
                    pos += 9
                    start = pos
                    self._left = length
                    if not length:
                        self._taken(kept)
                    continue
            if kind != GOAWAY:
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


def initiate(h2c: h2.connection.H2Connection, settings: dict[h2.settings.SettingCodes, int]) -> None:
    """Our side's SETTINGS and windows, either side of the relay: frames up to MAX_FRAME, a stream's
    window STREAM_WINDOW, the connection's CONNECTION_WINDOW."""
    h2c.local_settings = h2.settings.Settings(client=h2c.config.client_side, initial_values={
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
        h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME,
        h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: h2c.DEFAULT_MAX_HEADER_LIST_SIZE, **settings})
    h2c.max_inbound_frame_size = MAX_FRAME
    h2c.initiate_connection()
    h2c.increment_flow_control_window(CONNECTION_WINDOW - 65535)


def write_frames(h2c: h2.connection.H2Connection, transport: asyncio.Transport, stream_id: int, data: bytes) -> None:
    """`data` as DATA frames of the peer's largest size, written by hand after whatever h2 holds (a
    stream's HEADERS before its DATA: the caller flushed it); h2 told of the windows they use, which the
    caller checked take them."""
    n = len(data)
    h2c.outbound_flow_control_window -= n
    h2c.streams[stream_id].outbound_flow_control_window -= n
    size = h2c.max_outbound_frame_size
    if n <= size:
        transport.write(FRAME.pack(n << 8, 0, stream_id) + data)
        return
    view = memoryview(data)
    transport.writelines([part for i in range(0, n, size)
                          for part in (FRAME.pack(len(view[i:i + size]) << 8, 0, stream_id), view[i:i + size])])


def send_buffered(h2c: h2.connection.H2Connection, stream_id: int, buffered: bytearray) -> int:
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
