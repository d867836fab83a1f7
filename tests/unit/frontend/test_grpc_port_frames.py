"""The gRPC port takes a client's GOAWAY out of the bytes h2 sees (grpc_port.py: h2 would end every
running stream on one): every other byte passes in order, however the reads split the frames, and a
GOAWAY with an error code closes the connection."""
from __future__ import annotations

import struct
from typing import Any

import pytest

from services.frontend.grpc_api.grpc_port import _PREFACE, Connection


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


def _through(conn: Connection, stream: bytes, cuts: list[int]) -> bytes:
    out, last = [], 0
    for cut in [*cuts, len(stream)]:
        out.append(conn._without_goaway(stream[last:cut]))
        last = cut
    return b"".join(out)


def test_every_split_passes_all_but_the_goaway() -> None:
    stream = _PREFACE + SETTINGS + HEADERS + DATA + GOAWAY + WINDOW + DATA + GOAWAY
    expected = _PREFACE + SETTINGS + HEADERS + DATA + WINDOW + DATA
    for cut in range(len(stream) + 1):
        conn = _Closing()
        assert _through(conn, stream, [cut]) == expected, cut
        assert conn.closed == 0
    for step in (1, 2, 5, 9, 13):
        conn = _Closing()
        assert _through(conn, stream, list(range(step, len(stream), step))) == expected, step


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_a_goaway_with_an_error_code_closes_the_connection(step: int) -> None:
    conn: Any = _Closing()
    stream = _PREFACE + SETTINGS + BAD_GOAWAY
    assert _through(conn, stream, list(range(step, len(stream), step))) == _PREFACE + SETTINGS
    assert conn.closed == 1
