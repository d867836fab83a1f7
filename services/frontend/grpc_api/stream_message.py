"""GenerateStream's common message (the request id, the new token ids, their text, the rank) encoded by
hand into GenerateResponse's protobuf bytes, equal to protobuf's own serialization: a message object
built and serialized per token costs more than encoding these few fields. Runs on API server 0's loop."""
from __future__ import annotations

from collections.abc import Sequence

# GenerateResponse's field tags (protocol/grpc/fleet/v1/fleet.proto): (number << 3) | wire type.
_REQUEST_ID = b"\x0a"  # 1, length-delimited
_TOKEN_IDS = b"\x12"  # 2, packed varints
_TEXT = b"\x22"  # 4, length-delimited
_RANK = b"\x50"  # 10, varint
_INT64 = (1 << 64) - 1  # a negative int32 is sent as its 64-bit two's complement, protobuf's rule


def varint(n: int) -> bytes:
    """A non-negative integer as a protobuf varint (7 bits a byte, low first, high bit: more follow)."""
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class StreamMessage:
    """One stream's encoder: its request id and rank encoded once, each message the ids and text since
    the previous one. Fields come in number order and defaults are left out, as protobuf writes them."""

    __slots__ = ("_head", "_tail")

    def __init__(self, request_id: str, rank: int) -> None:
        rid = request_id.encode()
        self._head = _REQUEST_ID + varint(len(rid)) + rid if rid else b""
        self._tail = _RANK + varint(rank & _INT64) if rank else b""

    def encode(self, token_ids: Sequence[int], text: str) -> bytes:
        parts = [self._head]
        if token_ids:
            ids = b"".join(map(varint, token_ids))
            parts += (_TOKEN_IDS, varint(len(ids)), ids)
        if text:
            raw = text.encode()
            parts += (_TEXT, varint(len(raw)), raw)
        parts.append(self._tail)
        return b"".join(parts)
