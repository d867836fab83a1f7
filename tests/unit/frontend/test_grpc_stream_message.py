"""GenerateStream's hand-encoded message is byte for byte protobuf's own serialization of the same
GenerateResponse, and parses back to it, for every shape the stream sends."""
from __future__ import annotations

import random

import pytest
from google.protobuf.internal.encoder import _VarintBytes

from protocol.grpc import pb2
from services.frontend.grpc_api.stream_message import StreamMessage, varint

IDS = [[], [0], [1], [127], [128], [16383], [16384], [151_935], [2_097_151], [2_097_152], [2**32 - 1],
       [5, 300, 70_000, 2**28]]


@pytest.mark.parametrize("request_id", ["", "r", "gen-" + "x" * 200, "é✓"])
@pytest.mark.parametrize("rank", [0, 1, 127, 300, -1, -(2**31), 2**31 - 1])
def test_equals_protobufs_serialization(request_id: str, rank: int) -> None:
    message = StreamMessage(request_id, rank)
    for ids in IDS:
        for text in ("", "a", " the", "ü🙂" * 50):
            want = pb2.GenerateResponse(request_id=request_id, token_ids=ids, text=text, data_parallel_rank=rank)
            got = message.encode(ids, text)
            assert got == want.SerializeToString(), (ids, text)
            assert pb2.GenerateResponse.FromString(got) == want


def test_long_messages_equal_protobufs_serialization() -> None:
    rng = random.Random(7)
    message = StreamMessage("gen-1", 3)
    for n in (1, 2, 16, 200, 5000):
        ids = [rng.randrange(2**32) for _ in range(n)]
        text = "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(n))
        want = pb2.GenerateResponse(request_id="gen-1", token_ids=ids, text=text, data_parallel_rank=3)
        assert message.encode(ids, text) == want.SerializeToString()


def test_varint_of_each_length_is_protobufs() -> None:
    for n in (0, 1, 127, 128, 255, 16383, 16384, 2**21 - 1, 2**21, 2**35, 2**64 - 1):
        assert varint(n) == _VarintBytes(n), n
