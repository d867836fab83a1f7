"""protocol/pooled.py: pooled outputs as float32 arrays in raw frames, read back exactly or refused."""
from __future__ import annotations

import struct

import pytest

from protocol import PackedPooled, ProtocolError, decode, encode
from protocol.pooled import pack, size, to_list, unpack
from tests.contract.samples import RAW_FRAMES, SAMPLES


def test_a_vector_and_rows_round_trip_through_a_frame() -> None:
    frame = pack([1.0, -2.5, 0.125]) + pack([0.5, 0.25, 4.0, 8.0])
    assert to_list([frame], PackedPooled(0, 0, [3])) == [1.0, -2.5, 0.125]
    assert to_list([frame], PackedPooled(0, size([3]), [2, 2])) == [[0.5, 0.25], [4.0, 8.0]]


def test_rows_pack_row_major_little_endian() -> None:
    """The one packer every writer of float32 bytes uses (gRPC's PooledValues, base64 on /v1/embeddings
    and /v2/embed): a per-token output's rows flattened, always little-endian."""
    assert pack([[1.0, -2.0], [0.5, 4.0]]) == struct.pack("<4f", 1.0, -2.0, 0.5, 4.0)
    assert pack([1.0, -2.0]) == struct.pack("<2f", 1.0, -2.0) and pack([]) == b""


def test_float32_bytes_pass_through_as_they_are() -> None:
    data = pack([3.0, 1.5])
    assert pack(data) == data and pack(memoryview(data)) == data
    with pytest.raises(ValueError, match="multiple of 4"):
        pack(b"\x00\x01\x02")


def test_the_golden_outputs_carry_req_5s_embedding() -> None:
    frames = encode(SAMPLES["Outputs"], *RAW_FRAMES["Outputs"])
    message = decode(frames)
    out = message.outputs[-1]  # type: ignore[union-attr]
    assert out.request_id == "req-5" and out.new_token_ids == []
    assert to_list(frames[2:], out.pooled) == [0.5, -0.25, 0.125]


@pytest.mark.parametrize("ref, message", [
    (PackedPooled(1, 0, [1]), "raw frame 1, the message has 1"),
    (PackedPooled(0, 0, [3]), "ends at byte 12"),
    (PackedPooled(0, 2, [1]), "unaligned"),
    (PackedPooled(0, 0, []), "bad shape"),
    (PackedPooled(0, 0, [1, 1, 1]), "bad shape"),
    (PackedPooled(0, 0, [-1]), "bad shape"),
    (PackedPooled(0, 0, [0]), "bad shape"),
    (PackedPooled(0, 0, [3_000_000, 0]), "bad shape"),  # zero bytes, yet three million rows to build
    (PackedPooled(-1, 0, [1]), "raw frame -1"),
])
def test_a_bad_reference_is_a_protocol_error(ref: PackedPooled, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        unpack([pack([1.0, 2.0])], ref)
