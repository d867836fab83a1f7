"""The gRPC port takes a peer's GOAWAY out of the bytes h2 sees (grpc_port.py: h2 would end every
running stream on one): every other byte passes in order, however the reads split the frames, each
GOAWAY's error code is told, and a client's with an error code closes its connection."""
from __future__ import annotations

import struct
from typing import Any

import pytest

from services.frontend.grpc_api.grpc_port import Connection
from services.frontend.grpc_api.h2_frames import PREFACE, FrameWatch


def _frame(kind: int, payload: bytes, stream: int = 0, flags: int = 0) -> bytes:
    return struct.pack(">IBI", len(payload) << 8 | kind, flags, stream) + payload


SETTINGS = _frame(4, b"")
HEADERS = _frame(1, b"\x82\x86\x84" + b"h" * 40, 1, 4)
DATA = _frame(0, b"d" * 300, 1)
WINDOW = _frame(8, struct.pack(">I", 1000))
GOAWAY = _frame(7, struct.pack(">II", 1, 0) + b"debug")
BAD_GOAWAY = _frame(7, struct.pack(">II", 1, 2))


class _Closing(Connection):
    def __init__(self) -> None:
        super().__init__(port=None)  # type: ignore[arg-type]
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def _through(frames: FrameWatch, stream: bytes, cuts: list[int]) -> tuple[bytes, list[int]]:
    out, codes, last = [], [], 0
    for cut in [*cuts, len(stream)]:
        passed, seen = frames.feed(stream[last:cut])
        out.append(passed)
        codes += seen
        last = cut
    return b"".join(out), codes


@pytest.mark.parametrize("preface", [PREFACE, b""])  # a client's bytes, and a server's (no preface)
def test_every_split_passes_all_but_the_goaway(preface: bytes) -> None:
    stream = preface + SETTINGS + HEADERS + DATA + GOAWAY + WINDOW + DATA + BAD_GOAWAY
    expected = preface + SETTINGS + HEADERS + DATA + WINDOW + DATA
    for cut in range(len(stream) + 1):
        assert _through(FrameWatch(len(preface), 1 << 20), stream, [cut]) == (expected, [0, 2]), cut
    for step in (1, 2, 5, 9, 13):
        assert _through(FrameWatch(len(preface), 1 << 20), stream, list(range(step, len(stream), step))) == (
            expected, [0, 2]), step


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_a_client_goaway_with_an_error_code_closes_the_connection(step: int) -> None:
    conn: Any = _Closing()
    stream = PREFACE + SETTINGS + BAD_GOAWAY
    for i in range(0, len(stream), step):
        conn.data_received(stream[i:i + step])
    assert conn.closed >= 1


def _payloads(frames: FrameWatch) -> dict[int, list[bytes]]:
    return {sid: [b"".join(bytes(p) for p in pieces) for pieces in fifo] for sid, fifo in frames.payloads.items()}


@pytest.mark.parametrize("step", [1, 2, 5, 9, 13, 301, 10_000])
def test_a_raw_streams_data_payloads_are_taken_out_whole_however_the_reads_split(step: int) -> None:
    """An UploadCall's stream (FrameWatch.raw): h2 gets each of its DATA frames empty, flags kept (the
    END_STREAM), where the frame ends; the payloads wait in order. Another stream's DATA, a padded one
    and a GOAWAY pass as before."""
    first, last = _frame(0, b"a" * 300, 3), _frame(0, b"b" * 5000, 3, flags=1)
    padded = _frame(0, b"\x02" + b"p" * 10 + b"\0\0", 3, flags=8)
    stream = PREFACE + SETTINGS + first + DATA + GOAWAY + _frame(0, b"", 3) + padded + last
    frames = FrameWatch(len(PREFACE), 1 << 20)
    frames.raw.add(3)
    passed, codes = _through(frames, stream, list(range(step, len(stream), step)))
    assert passed == PREFACE + SETTINGS + _frame(0, b"", 3) + DATA + _frame(0, b"", 3) + padded + \
        _frame(0, b"", 3, flags=1)
    assert codes == [0]
    assert _payloads(frames) == {3: [b"a" * 300, b"", b"b" * 5000]}

