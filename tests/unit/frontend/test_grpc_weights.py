"""UpdateWeights' tensors in pieces: protocol.grpc.tensor_messages splits a tensor larger than one message
(all but the last piece set `more`), grpc_api/rl_control.py joins them back and refuses a stream that
breaks the rule, naming the field."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
import pytest

from protocol.grpc import TENSOR_OVERHEAD_BYTES, pb2, tensor_messages
from services.frontend.grpc_api.rl_control import _tensors
from services.frontend.grpc_api.rpc import Failed

LIMIT = TENSOR_OVERHEAD_BYTES + 1000  # pieces of 1000 bytes


async def _stream(messages: Iterable[Any]) -> AsyncIterator[Any]:
    for m in messages:
        yield m


def _joined(messages: Iterable[Any]) -> list[tuple[str, str, list[int], bytes]]:
    async def collect() -> list[tuple[str, str, list[int], bytes]]:
        return [(t.name, t.dtype, list(t.shape), data) async for t, data in _tensors(_stream(messages))]
    return asyncio.run(collect())


@pytest.mark.parametrize("size", [0, 1, 1000, 1001, 2999, 3000, 3001])
def test_pieces_join_back_into_the_tensor(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    pieces = tensor_messages("w", "uint8", [size], data, LIMIT)
    assert len(pieces) == max(1, -(-size // 1000))
    assert [p.more for p in pieces] == [True] * (len(pieces) - 1) + [False]
    assert all(len(p.data) <= 1000 and p.ByteSize() <= LIMIT for p in pieces)
    assert all(not (p.name or p.dtype or p.shape) for p in pieces[1:])  # only the first names it
    other = tensor_messages("b", "float32", [1], bytes(4), LIMIT)
    assert _joined([*other, *pieces, *other]) == [("b", "float32", [1], bytes(4)), ("w", "uint8", [size], data),
                                                  ("b", "float32", [1], bytes(4))]


def test_a_typed_memoryview_is_split_by_its_bytes() -> None:
    """A float32 array's memoryview counts 4-byte items: the pieces are still bytes within the limit."""
    import array

    floats = array.array("f", range(750))  # 3,000 bytes, 750 items
    pieces = tensor_messages("w", "float32", [750], memoryview(floats), LIMIT)
    assert len(pieces) == 3 and all(len(p.data) <= 1000 and p.ByteSize() <= LIMIT for p in pieces)
    assert _joined(pieces) == [("w", "float32", [750], floats.tobytes())]


def test_a_piece_may_repeat_what_the_first_said() -> None:
    messages = [pb2.Tensor(name="w", dtype="uint8", shape=[4], data=b"ab", more=True),
                pb2.Tensor(name="w", dtype="uint8", shape=[4], data=b"cd")]
    assert _joined(messages) == [("w", "uint8", [4], b"abcd")]


@pytest.mark.parametrize(("messages", "says"), [
    ([pb2.Tensor(name="w", dtype="uint8", shape=[4], data=b"ab", more=True), pb2.Tensor(name="v", data=b"cd")],
     "name: 'v' in a piece of tensor 'w'"),
    ([pb2.Tensor(name="w", dtype="uint8", shape=[4], data=b"ab", more=True), pb2.Tensor(dtype="int8", data=b"cd")],
     "dtype: 'int8' in a piece of tensor 'w'"),
    ([pb2.Tensor(name="w", dtype="uint8", shape=[4], data=b"ab", more=True), pb2.Tensor(shape=[2, 2], data=b"cd")],
     "shape: [2, 2] in a piece of tensor 'w'"),
    ([pb2.Tensor(name="w", dtype="uint8", shape=[4], data=b"ab", more=True)],
     "more: the stream ended inside tensor 'w' (2 bytes came"),
    ([pb2.Tensor(name="w", dtype="uint8", shape=[1], data=bytes(10), more=True), pb2.Tensor(data=bytes(10))],
     "data: tensor 'w' came with more than the 16 bytes its shape [1] holds"),
    ([pb2.Tensor(dtype="uint8", shape=[1], data=b"a")], "name: must be set"),
    ([pb2.Tensor(name="w", shape=[1], data=b"a")], "dtype: must be set"),
])
def test_a_broken_stream_is_refused_naming_the_field(messages: list[Any], says: str) -> None:
    with pytest.raises(Failed) as err:
        _joined(messages)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and says in str(err.value)
