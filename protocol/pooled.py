"""Pooled outputs (embeddings, class scores, per-token rows) as float32 arrays in an Outputs message's raw
frames (since MINOR 5), never per-float msgpack.

A RequestOutput's `pooled` is a `PackedPooled(frame, offset, shape)`: `prod(shape)` little-endian
float32 values, row-major, at byte `offset` of raw frame `frame` (0 is the first frame after the
msgpack body). Engines write, frontends read; stdlib only. Reading is zero-copy on a little-endian host.
"""
from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence
from typing import Union

from protocol.errors import ProtocolError
from protocol.messages import PackedPooled

Buffer = Union[bytes, bytearray, memoryview]
_LITTLE = sys.byteorder == "little"
assert array("f").itemsize == 4, "float32 must be C float here"

MAX_DIMS = 2  # a sequence's vector, or one row per token


def pack(values: Sequence[float] | Sequence[Sequence[float]] | Buffer) -> bytes:
    """float32 little-endian bytes of `values`: a sequence of floats, rows of them (row-major, as a
    frontend writes a per-token output), or float32 bytes as they are."""
    if isinstance(values, (bytes, bytearray, memoryview)):
        data = bytes(values)
        if len(data) % 4:
            raise ValueError(f"float32 bytes must be a multiple of 4 long, got {len(data)}")
        if not _LITTLE:
            swapped = array("f", data)
            swapped.byteswap()
            return swapped.tobytes()
        return data
    out = array("f")
    if values and isinstance(values[0], Sequence):
        for row in values:
            out.extend(row)  # type: ignore[arg-type]
    else:
        out.extend(values)  # type: ignore[arg-type]
    if not _LITTLE:
        out.byteswap()
    return out.tobytes()


def size(shape: Sequence[int]) -> int:
    """Bytes of an array of `shape`."""
    return 4 * math.prod(shape)


def unpack(raw_frames: Sequence[Buffer], ref: PackedPooled) -> memoryview[float] | array[float]:
    """The flat float32 values `ref` names: a view of the frame (a copy on a big-endian host).
    Raises ProtocolError when the reference is malformed (a zero dimension too: no task pools nothing, and
    a reader that builds rows would loop over shape[0] empty ones) or the frame too short, never IndexError."""
    shape = ref.shape
    if not 1 <= len(shape) <= MAX_DIMS or any(d < 1 for d in shape) or ref.offset < 0 or ref.offset % 4:
        raise ProtocolError(f"PackedPooled{(ref.frame, ref.offset, list(shape))}: bad shape or unaligned offset")
    if not 0 <= ref.frame < len(raw_frames):
        raise ProtocolError(f"PackedPooled names raw frame {ref.frame}, the message has {len(raw_frames)}")
    view = memoryview(raw_frames[ref.frame]).cast("B")
    end = ref.offset + size(shape)
    if end > view.nbytes:
        raise ProtocolError(f"PackedPooled array ends at byte {end}, raw frame {ref.frame} has {view.nbytes}")
    values: memoryview[float] = view[ref.offset:end].cast("f")
    if not _LITTLE:
        copy = array("f", values.tobytes())
        copy.byteswap()
        return copy
    return values


def to_list(raw_frames: Sequence[Buffer], ref: PackedPooled) -> list[float] | list[list[float]]:
    """The values as Python floats: a flat list for a 1-d shape, one list per row for a 2-d one."""
    flat = unpack(raw_frames, ref)
    if len(ref.shape) == 1:
        return list(flat)
    width = ref.shape[1]
    return [list(flat[i * width:(i + 1) * width]) for i in range(ref.shape[0])]
