"""Frames: [header (major, minor, tag: 3 bytes), msgpack body (positional array), raw buffers...].

Raw trailing frames travel untouched (zero-copy buffers for large arrays); readers that do not
expect them ignore them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import msgspec

from protocol.errors import ProtocolError
from protocol.messages import MESSAGE_TYPES, Message
from protocol.version import MAJOR, MINOR

Buffer = Union[bytes, bytearray, memoryview]
Frames = list[Buffer]

_encoder = msgspec.msgpack.Encoder()
_decoders = {tag: msgspec.msgpack.Decoder(cls) for tag, cls in MESSAGE_TYPES.items()}
_headers = {tag: bytes((MAJOR, MINOR, tag)) for tag in MESSAGE_TYPES}


def encode(msg: Message, *buffers: Buffer) -> Frames:
    """Frames for one message; `buffers` are appended as raw frames."""
    return [_headers[msg.TAG], _encoder.encode(msg), *buffers]


def peek_header(frame: Buffer) -> tuple[int, int, int]:
    """(major, minor, tag) of a header frame, whatever its version."""
    if len(frame) != 3:
        raise ProtocolError(f"header frame must be 3 bytes (major, minor, tag), got {len(frame)}")
    major, minor, tag = bytes(frame)
    return major, minor, tag


def decode(frames: Sequence[Buffer], *, any_major: bool = False) -> Message:
    """Decode one message. A foreign major raises unless `any_major` (used only for Hello/Reject,
    whose layout is frozen across majors)."""
    if len(frames) < 2:
        raise ProtocolError(f"a message needs a header and a body frame, got {len(frames)} frame(s)")
    major, minor, tag = peek_header(frames[0])
    if major != MAJOR and not any_major:
        raise ProtocolError(
            f"protocol major mismatch: peer speaks {major}.{minor}, this side speaks {MAJOR}.{MINOR}"
        )
    decoder = _decoders.get(tag)
    if decoder is None:
        raise ProtocolError(f"unknown message tag {tag} (protocol {major}.{minor})")
    try:
        return decoder.decode(frames[1])
    except msgspec.ValidationError as exc:  # a subclass of DecodeError: well-formed, wrong shape
        raise ProtocolError(f"{decoder.type.__name__}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"{decoder.type.__name__}: malformed msgpack body: {exc}") from None
