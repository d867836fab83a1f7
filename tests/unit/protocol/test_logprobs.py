"""protocol/logprobs.py: packed logprob segments round trip through raw frames, and a ref that does not
fit its frames is a ProtocolError, never an IndexError."""
from __future__ import annotations

import pytest

from protocol import PackedLogprobs, ProtocolError
from protocol.logprobs import pack, segment_size, unpack


def test_a_segment_round_trips_at_an_offset_in_a_shared_frame() -> None:
    first = pack([1, 2, 3, 4, 5, 6], [-0.5, -0.5, -2.0, -1.0, -0.25, -1.0], [1, 3])
    second = pack([9], [-4.0], [77])
    assert len(first) == segment_size(2, 2) and len(second) == segment_size(1, 0)
    frames = [b"other frame", first + second]
    a = unpack(frames, PackedLogprobs(1, 0, 2, 2))
    b = unpack(frames, PackedLogprobs(1, len(first), 1, 0))
    assert (a.width, list(a.token_ids), list(a.ranks)) == (3, [1, 2, 3, 4, 5, 6], [1, 3])
    assert list(a.logprobs) == [-0.5, -0.5, -2.0, -1.0, -0.25, -1.0]
    assert (list(b.token_ids), list(b.logprobs), list(b.ranks)) == ([9], [-4.0], [77])


def test_float32_rounding_is_what_the_reader_gets() -> None:
    seg = unpack([pack([1], [-0.1], [1])], PackedLogprobs(0, 0, 1, 0))
    assert seg.logprobs[0] != -0.1 and abs(seg.logprobs[0] + 0.1) < 1e-7


@pytest.mark.parametrize(("ref", "says"), [
    (PackedLogprobs(1, 0, 1, 0), "raw frame 1"),
    (PackedLogprobs(0, 4, 1, 0), "ends at byte 16"),
    (PackedLogprobs(0, 0, 2, 0), "ends at byte 24"),
    (PackedLogprobs(0, 2, 1, 0), "unaligned"),
    (PackedLogprobs(0, 0, -1, 0), "negative"),
])
def test_a_ref_past_its_frames_is_a_protocol_error(ref: PackedLogprobs, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        unpack([pack([1], [-1.0], [1])], ref)


@pytest.mark.parametrize("rows", [1, 3], ids=["one-row", "rows"])
@pytest.mark.parametrize("bad", [-1, -(2 ** 31)])
def test_a_negative_token_id_is_a_protocol_error(rows: int, bad: int) -> None:
    """A negative id read as an index names another token (the tables' last ones): refused, the own
    token's column or an alternative's, one row or several."""
    for at in (0, 2 * rows - 1):
        ids = [5] * (2 * rows)
        ids[at] = bad
        frame = pack(ids, [-1.0] * (2 * rows), [1] * rows)
        with pytest.raises(ProtocolError, match=f"token id {bad}: token ids are 0 or more"):
            unpack([frame], PackedLogprobs(0, 0, rows, 1))


def test_pack_refuses_mismatched_arrays() -> None:
    with pytest.raises(ValueError, match="rows"):
        pack([1, 2, 3], [-1.0, -2.0], [1])
