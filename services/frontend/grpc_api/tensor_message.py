"""UpdateWeights' Tensor message read with its data left in place: protobuf copies a bytes field into its
arena when it parses and again at every read of the field, megabytes a message; here the data is a view
of the message's own bytes and protobuf parses the rest (the name, dtype, shape, more: a few bytes).
Used by the gRPC port's UploadCall (upload_call.py), on API server 0's loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.grpc import pb2

_DATA = 4  # Tensor.data's field number (protocol/grpc/fleet/v1/fleet.proto)
_LEN = 2  # the length-delimited wire type


@dataclass(slots=True)
class TensorPiece:
    """What RlControl reads of a Tensor message, as pb2.Tensor names it (data: a view, not a copy)."""

    name: str
    dtype: str
    shape: list[int]
    data: bytes | memoryview
    more: bool


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; IndexError or ValueError when it is malformed."""
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def parse(message: bytes | memoryview) -> TensorPiece:
    """The message as pb2.Tensor.FromString reads it (the last `data` field wins, as protobuf's rule for a
    singular field; every other field, unknown ones too, parsed by protobuf itself). A message this
    cannot walk goes to protobuf whole, which raises DecodeError as for any malformed message."""
    buf = memoryview(message)
    rest: list[memoryview] = []
    data: memoryview | None = None
    pos, end = 0, len(buf)
    try:
        while pos < end:
            start = pos
            tag, pos = _varint(buf, pos)
            kind = tag & 7
            if kind == 0:
                _, pos = _varint(buf, pos)
            elif kind == _LEN:
                size, pos = _varint(buf, pos)
                if pos + size > end:
                    raise ValueError("a field past the message's end")
                if tag >> 3 == _DATA:
                    data = buf[pos:pos + size]
                    pos += size
                    continue
                pos += size
            else:  # fixed-size or group fields: Tensor has none; protobuf decides what they mean
                raise ValueError("a wire type Tensor does not use")
            rest.append(buf[start:pos])
    except (IndexError, ValueError):
        return _whole(pb2.Tensor.FromString(message))
    if data is None:
        return _whole(pb2.Tensor.FromString(message))
    meta = pb2.Tensor.FromString(b"".join(rest))
    return TensorPiece(meta.name, meta.dtype, list(meta.shape), data, meta.more)


def _whole(t: Any) -> TensorPiece:
    return TensorPiece(t.name, t.dtype, list(t.shape), t.data, t.more)
