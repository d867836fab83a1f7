"""Logprobs as packed arrays in an Outputs message's raw frames (since MINOR 3), not per-token maps.

Engines write segments, frontends read them; stdlib only (`array`, `memoryview`: reading is zero-copy,
but for one-row segments, which one struct read turns into values at once).
A RequestOutput's `packed_logprobs` (its new tokens) or `packed_prompt_logprobs` (prompt positions)
is a `PackedLogprobs(frame, offset, positions, k)`: a segment at byte `offset` of raw frame `frame`
(0 is the first frame after the msgpack body). With w = k + 1, a segment is three little-endian
arrays back to back, 4 bytes an item, so every offset is a multiple of 4:

    token_ids  int32[positions * w]    row-major, a row per position: column 0 is the position's own
                                       token (the sampled one, or the prompt's), columns 1..k the k
                                       most likely tokens, in rank order
    logprobs   float32[positions * w]  their logprobs, in the same layout
    ranks      int32[positions]        the rank of column 0's token among all tokens (1 = most likely)

This is vLLM's own layout (its LogprobsLists), so its arrays go out as they are. Prompt rows start at
the prompt's second token (the first has no logprob); the rows of a chunked prefill come in order.
"""
from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple, Union

from protocol.errors import ProtocolError
from protocol.messages import PackedLogprobs

Buffer = Union[bytes, bytearray, memoryview]
_LITTLE = sys.byteorder == "little"
assert array("i").itemsize == 4 and array("f").itemsize == 4, "int32/float32 must be C int/float here"


def segment_size(positions: int, k: int) -> int:
    """Bytes of a segment of `positions` rows with `k` alternatives each."""
    return 4 * positions * (2 * (k + 1) + 1)


def pack(token_ids: Sequence[int], logprobs: Sequence[float], ranks: Sequence[int]) -> bytes:
    """One segment from flat row-major sequences (len(token_ids) == len(logprobs) == rows * (k + 1))."""
    ids, lps, rks = array("i", token_ids), array("f", logprobs), array("i", ranks)
    if not rks or len(ids) != len(lps) or len(ids) % len(rks):
        raise ValueError(f"a segment needs rows * (k + 1) ids and logprobs and one rank per row, got "
                         f"{len(ids)} ids, {len(lps)} logprobs, {len(rks)} ranks")
    if not _LITTLE:
        for a in (ids, lps, rks):
            a.byteswap()
    return ids.tobytes() + lps.tobytes() + rks.tobytes()


class Segment(NamedTuple):
    """One segment read: row i's own token is token_ids[i * width], its alternatives follow it."""

    positions: int
    k: int
    token_ids: Sequence[int]
    logprobs: Sequence[float]
    ranks: Sequence[int]

    @property
    def width(self) -> int:
        return self.k + 1


def unpack(raw_frames: Sequence[Buffer], ref: PackedLogprobs) -> Segment:
    """The segment `ref` names, as views of the frame (copied only on a big-endian host); a one-row
    segment, a generated token's, as one struct read (cheaper than three views for a dozen values).
    Raises ProtocolError when the frame is missing or too short, or a token id is negative; never
    IndexError."""
    frame_no, offset, n, k = ref.frame, ref.offset, ref.positions, ref.k
    if n == 1 and k >= 0 and offset >= 0 and not offset % 4 and 0 <= frame_no < len(raw_frames):
        # A generated token's row, nearly every call: the struct read checks the frame's length itself,
        # and the Segment is made without NamedTuple's Python-level __new__.
        try:
            row = (_ROWS.get(k) or _row(k)).unpack_from(raw_frames[frame_no], offset)
        except struct.error:
            raise ProtocolError(f"PackedLogprobs segment ends at byte {offset + segment_size(1, k)}, raw frame "
                                f"{frame_no} is shorter") from None
        w = k + 1
        own_and_top = row[:w]
        if min(own_and_top) < 0:
            raise _negative(own_and_top)
        return _new(Segment, (1, k, own_and_top, row[w:-1], row[-1:]))
    if n < 0 or k < 0 or ref.offset < 0 or ref.offset % 4:
        raise ProtocolError(f"PackedLogprobs{(ref.frame, ref.offset, n, k)}: negative or unaligned")
    if not 0 <= ref.frame < len(raw_frames):
        raise ProtocolError(f"PackedLogprobs names raw frame {ref.frame}, the message has {len(raw_frames)}")
    frame = raw_frames[ref.frame]
    end = ref.offset + segment_size(n, k)
    size = len(frame) if isinstance(frame, (bytes, bytearray)) else memoryview(frame).nbytes
    if end > size:
        raise ProtocolError(f"PackedLogprobs segment ends at byte {end}, raw frame {ref.frame} has {size}")
    if n == 1:
        row = _row(k).unpack_from(frame, ref.offset)
        own_and_top = row[:k + 1]
        if min(own_and_top) < 0:
            raise _negative(own_and_top)
        return Segment(1, k, own_and_top, row[k + 1:-1], row[-1:])
    view = memoryview(frame).cast("B")
    cells = n * (k + 1) * 4
    a, b = ref.offset, ref.offset + cells
    ids, lps, rks = view[a:b].cast("i"), view[b:b + cells].cast("f"), view[b + cells:end].cast("i")
    seg = Segment(n, k, ids, lps, rks) if _LITTLE else Segment(n, k, _swapped("i", ids), _swapped("f", lps),
                                                                _swapped("i", rks))
    if n and min(seg.token_ids) < 0:
        raise _negative(seg.token_ids)
    return seg


def _negative(ids: Sequence[int]) -> ProtocolError:
    """A segment with a token id below 0: no token has one (read as an index, it would name another)."""
    return ProtocolError(f"PackedLogprobs segment has token id {min(ids)}: token ids are 0 or more")


_new = tuple.__new__
_ROWS: dict[int, struct.Struct] = {}  # per k, a one-row segment's layout


def _row(k: int) -> struct.Struct:
    layout = _ROWS.get(k)
    if layout is None:
        layout = struct.Struct(f"<{k + 1}i{k + 1}fi")
        if len(_ROWS) < 64:  # k is bounded by --max-logprobs; a bound all the same
            _ROWS[k] = layout
    return layout


def _swapped(code: str, view: memoryview[Any]) -> array[Any]:
    out = array(code, view.tobytes())
    out.byteswap()
    return out
