"""GenerateStream's hand-encoded message (grpc_api/stream_message.py) equals protobuf's own serialization
of the same GenerateResponse, at every varint width and for odd values; grpc-timeout's parse
(grpc_api/native_call.py) follows the spec's units and refuses malformed values."""
from __future__ import annotations

import pytest

from protocol.grpc import pb2
from services.frontend.grpc_api.native_call import frame, timeout_of
from services.frontend.grpc_api.stream_message import StreamMessage, varint

IDS = [[], [0], [1, 127, 128, 255], [16383, 16384, 2_097_151, 2_097_152], [151_643, 151_645], [(1 << 32) - 1],
       list(range(0, 300_000, 997))]


@pytest.mark.parametrize("request_id", ["", "req-1", "é" * 200])
@pytest.mark.parametrize("rank", [0, 1, 127, 128, -1, -(1 << 31), (1 << 31) - 1])
def test_hand_encoded_equals_protobuf(request_id: str, rank: int) -> None:
    encoder = StreamMessage(request_id, rank)
    for ids in IDS:
        for text in ("", "Hello", " world\n\t\"\\", "é🙂\x00", "x" * 200):
            ours = encoder.encode(ids, text)
            theirs = pb2.GenerateResponse(request_id=request_id, token_ids=ids, text=text,
                                          data_parallel_rank=rank).SerializeToString()
            assert ours == theirs, (ids, text)
            back = pb2.GenerateResponse.FromString(ours)
            assert (back.request_id, list(back.token_ids), back.text, back.data_parallel_rank) == (
                request_id, ids, text, rank)


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16383, 16384, 1 << 21, (1 << 32) - 1, (1 << 64) - 1])
def test_varint(n: int) -> None:
    if 0 < n < (1 << 32):  # protobuf's own, a uint32 field's bytes after its tag
        assert varint(n) == pb2.Usage(prompt_tokens=n).SerializeToString()[1:]
    value, shift = 0, 0
    for b in varint(n):
        value |= (b & 0x7F) << shift
        shift += 7
    assert value == n


def test_frame_is_the_length_prefixed_message() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert frame(b"") == b"\x00\x00\x00\x00\x00"


@pytest.mark.parametrize(("value", "seconds"), [(b"1S", 1.0), (b"100m", 0.1), (b"2M", 120.0), (b"1H", 3600.0),
                                                (b"5000u", 0.005), (b"99999999n", 0.099999999),
                                                (b"0m", 0.0)])
def test_grpc_timeout_units(value: bytes, seconds: float) -> None:
    assert timeout_of(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"1", b"1s", b"1.5S", b"-1S", b"123456789S", b" 1S", b"1SS"])
def test_malformed_grpc_timeout_is_no_deadline(value: bytes) -> None:
    assert timeout_of(value) is None
