"""UpdateWeights' Tensor read with its data in place (grpc_api/tensor_message.py) reads what protobuf reads:
every field, in any order, a repeated data field (the last wins), unknown fields, an unpacked shape; a
malformed message is protobuf's DecodeError."""
from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from protocol.grpc import pb2
from services.frontend.grpc_api.stream_message import varint
from services.frontend.grpc_api.tensor_message import parse


def _field(number: int, kind: int, payload: bytes) -> bytes:
    head = varint(number << 3 | kind)
    return head + (varint(len(payload)) + payload if kind == 2 else payload)


def _same(message: bytes) -> None:
    want = pb2.Tensor.FromString(message)
    got = parse(message)
    assert (got.name, got.dtype, got.shape, bytes(got.data), got.more) == \
        (want.name, want.dtype, list(want.shape), want.data, want.more)


def test_it_reads_what_protobuf_reads() -> None:
    data = bytes(range(256)) * 1000
    _same(pb2.Tensor(name="layer.0.weight", dtype="bfloat16", shape=[500, 256], data=data, more=True)
          .SerializeToString())
    _same(pb2.Tensor(data=data).SerializeToString())
    _same(pb2.Tensor(name="w").SerializeToString())  # no data field: protobuf reads it all
    _same(b"")
    odd = (_field(4, 2, b"first") + _field(5, 0, b"\x01") + _field(3, 0, varint(7)) + _field(3, 0, varint(9))
           + _field(99, 2, b"unknown") + _field(1, 2, b"n") + _field(4, 2, b"last") + _field(2, 2, b"uint8"))
    _same(odd)
    assert bytes(parse(odd).data) == b"last" and parse(odd).shape == [7, 9]


def test_the_data_is_a_view_not_a_copy() -> None:
    message = memoryview(pb2.Tensor(name="w", data=b"x" * 1000).SerializeToString())
    data = parse(message).data
    assert isinstance(data, memoryview) and data.obj is message.obj


@pytest.mark.parametrize("message", [
    b"\x0a\x05ab",  # a field past the end
    b"\x22\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # an over-long varint
    b"\x0d\x00\x00",  # a fixed32 cut short
    b"\x0a\x02\xff\xfe",  # a name that is not UTF-8
])
def test_a_malformed_message_is_protobufs_decode_error(message: bytes) -> None:
    with pytest.raises(DecodeError):
        pb2.Tensor.FromString(message)
    with pytest.raises(DecodeError):
        parse(message)
