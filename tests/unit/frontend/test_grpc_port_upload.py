"""RlControl.UpdateWeights served on the gRPC port itself (grpc_api/upload_call.py), a grpc.aio client over a
real socket, a stand-in for RlControl's handler behind the port (the WeightUpdates port): a large update
arrives whole and equal, in order; a handler that stops taking messages holds the client at the
flow-control windows instead of the frontend buffering the stream; the handler's refusal is the status."""
from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest

from edge.api_keys import ApiKeys
from protocol.grpc import pb2, pb2_grpc, tensor_messages
from services.frontend.grpc_api.grpc_port import GrpcPort
from services.frontend.grpc_api.h2_frames import STREAM_WINDOW, UPLOAD_WINDOW
from services.frontend.grpc_api.rpc import CallContext

LIMIT = 1 << 20  # the port's message limit here


class _Handler:
    """Takes every message (or stops after `take` of them until `go` is set) and keeps them."""

    def __init__(self, take: int | None = None, refuse: str | None = None) -> None:
        self.got: list[Any] = []  # (name, dtype, shape, data, more) of each message
        self.take, self.refuse = take, refuse
        self.go = asyncio.Event()
        self.stalled = asyncio.Event()

    async def UpdateWeights(self, request_iterator: AsyncIterator[Any], context: CallContext) -> Any:
        if self.take == 0:
            await self.go.wait()
        async for t in request_iterator:
            self.got.append((t.name, t.dtype, list(t.shape), bytes(t.data), t.more))
            if self.refuse is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.refuse)
            if self.take is not None and len(self.got) == self.take:
                self.stalled.set()
                await self.go.wait()
        return pb2.UpdateWeightsResponse(tensors=len(self.got), bytes=sum(len(t[3]) for t in self.got))


async def _port(handler: _Handler) -> tuple[GrpcPort, grpc.aio.Channel]:
    wire = GrpcPort(None, ApiKeys(["k"]), LIMIT, "/nonexistent", weights=handler)  # type: ignore[arg-type]
    port = await wire.start("127.0.0.1", 0)
    return wire, grpc.aio.insecure_channel(f"127.0.0.1:{port}")


def _fields(messages: list[Any]) -> list[tuple[Any, ...]]:
    return [(m.name, m.dtype, list(m.shape), m.data, m.more) for m in messages]


def _messages(count: int) -> list[Any]:
    """`count` MiB of tensors, each of its own bytes, the large ones in pieces of the message limit."""
    out: list[Any] = []
    for i in range(count // 4):
        data = bytes([i]) * 7 + bytes(range(256)) * ((4 << 20) // 256)
        out += tensor_messages(f"layer.{i}.weight", "uint8", [len(data)], data, LIMIT)
    return out


async def _raw_upload(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, h2.connection.H2Connection]:
    """A raw HTTP/2 connection to the port with an UpdateWeights call's headers ready to send (stream 1)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                            (":path", "/fleet.v1.RlControl/UpdateWeights"),
                            ("content-type", "application/grpc"), ("te", "trailers")])
    return reader, writer, client


KEY = (("authorization", "Bearer k"),)


def test_a_large_update_arrives_whole_and_equal_in_order() -> None:
    async def main() -> None:
        handler = _Handler()
        wire, channel = await _port(handler)
        try:
            messages = _messages(32)
            resp = await pb2_grpc.RlControlStub(channel).UpdateWeights(iter(messages), metadata=KEY, timeout=60)
            assert handler.got == _fields(messages)
            assert (resp.tensors, resp.bytes) == (len(messages), sum(len(m.data) for m in messages))
            assert len(messages) > 32 and max(m.ByteSize() for m in messages) > STREAM_WINDOW // 8
        finally:
            await channel.close()
            await wire.stop(0)
    asyncio.run(main())


def test_a_handler_that_stops_taking_messages_holds_the_client_at_the_window() -> None:
    """The client's bytes are given back to its windows only as the handler takes its messages: with the
    handler stalled after the first, the port holds at most one message and the call's window (16 MiB)
    past it, and the client (grpc's own buffers aside) is held, not the 96 MiB read into the frontend.
    Before, the port gave every DATA frame back as it came: the client sent it all."""
    async def main() -> None:
        handler = _Handler(take=1)
        wire, channel = await _port(handler)
        pulled = 0
        messages = _messages(96)

        async def requests() -> AsyncIterator[Any]:
            nonlocal pulled
            for m in messages:
                pulled += 1
                yield m

        try:
            call = pb2_grpc.RlControlStub(channel).UpdateWeights(requests(), metadata=KEY, timeout=60)
            await asyncio.wait_for(handler.stalled.wait(), 10)
            deadline = asyncio.get_running_loop().time() + 3
            while pulled < len(messages) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)  # the failure: the client gets every message out
            (conn,) = wire.connections
            (upload,) = conn.calls.values()
            held = upload.held  # the bytes the call holds that the handler has not taken
            assert held <= LIMIT + 5 + UPLOAD_WINDOW, held
            assert pulled < len(messages) // 2, f"the client sent {pulled} of {len(messages)} MiB-messages"
            handler.go.set()
            resp = await call
            assert handler.got == _fields(messages) and resp.tensors == len(messages)
        finally:
            await channel.close()
            await wire.stop(0)
    asyncio.run(main())


async def _refused(call: Callable[[], Awaitable[Any]]) -> grpc.aio.AioRpcError:
    """The error of a call the port ends while the client is still sending, as the port sent it. grpc's aio
    client reports INTERNAL ("Internal error from Core", its own SendMessageOperation failed) in place of the
    status when the stream's end fails a send of its before the status is read: a race in the client, the
    same against grpc's own server (bench/grpc_refusal_race.py: a refused 8 MiB upload, 150 times on a loaded
    host, INTERNAL 57 times from grpc.aio's server, 41 from this port). Such a call is made again."""
    for _ in range(20):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call()
        lost = err.value.code() == grpc.StatusCode.INTERNAL and \
            "SendMessageOperation" in (err.value.debug_error_string() or "")
        if not lost:
            return err.value
    raise AssertionError("every call lost the client's race")


def test_the_handlers_refusal_and_the_size_limit_are_the_calls_status() -> None:
    async def main() -> None:
        handler = _Handler(refuse="name: 'x' is not a parameter")
        wire, channel = await _port(handler)
        stub = pb2_grpc.RlControlStub(channel)
        try:
            err = await _refused(lambda: stub.UpdateWeights(iter(_messages(8)), metadata=KEY, timeout=30))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.details() == "name: 'x' is not a parameter"
            big = pb2.Tensor(name="w", dtype="uint8", shape=[LIMIT], data=bytes(LIMIT))
            err = await _refused(lambda: stub.UpdateWeights(iter([big]), metadata=KEY, timeout=30))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"vs. {LIMIT})" in (err.details() or "")
            err = await _refused(lambda: stub.UpdateWeights(iter([big]), metadata=(("authorization", "Bearer no"),),
                                                            timeout=30))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert wire.connections and all(not c.calls for c in wire.connections)  # nothing left running
        finally:
            await channel.close()
            await wire.stop(0)
    asyncio.run(main())


def test_a_client_that_sends_past_the_window_loses_its_connection() -> None:
    """h2 never sees an UploadCall's DATA payloads (h2_frames.FrameWatch takes them out), so the port tells
    h2's windows itself: a client that ignores them is a FLOW_CONTROL_ERROR, as h2 would answer, not
    bytes held without bound. Here the handler takes nothing; the client sends 24 MiB by hand."""
    async def main() -> None:
        handler = _Handler(take=0)
        wire = GrpcPort(None, ApiKeys([]), LIMIT, "/nonexistent", weights=handler)  # type: ignore[arg-type]
        port = await wire.start("127.0.0.1", 0)
        reader, writer, client = await _raw_upload(port)
        writer.write(client.data_to_send())
        message = b"\0" + (LIMIT - 100).to_bytes(4, "big") + bytes(LIMIT - 100)
        body = b"".join(message for _ in range(24))
        try:
            events: list[Any] = []
            with contextlib.suppress(ConnectionResetError):  # the port closes with our bytes unread: a reset
                for i in range(0, len(body), 16384):  # past every window, framed by hand: h2 would refuse to
                    writer.write(struct.pack(">IBI", len(body[i:i + 16384]) << 8, 0, 1) + body[i:i + 16384])
                await writer.drain()
                while data := await asyncio.wait_for(reader.read(1 << 20), 10):
                    events += client.receive_data(data)
            goaway = [e.error_code for e in events if isinstance(e, h2.events.ConnectionTerminated)]
            assert goaway in ([], [h2.errors.ErrorCodes.FLOW_CONTROL_ERROR]), goaway  # the reset may drop it
            assert not wire.connections and not handler.got
        finally:
            writer.close()
            await wire.stop(0)
    asyncio.run(main())


def test_a_refusal_in_the_read_that_opened_the_call_is_still_answered() -> None:
    """The headers and a message whose length prefix is past the limit in one read: the call's task is
    cancelled before its first step, so the coroutine never runs its handlers; the status must come all
    the same (it was DEADLINE_EXCEEDED at the client when the two shared a TCP segment)."""
    async def main() -> None:
        handler = _Handler()
        wire = GrpcPort(None, ApiKeys([]), LIMIT, "/nonexistent", weights=handler)  # type: ignore[arg-type]
        port = await wire.start("127.0.0.1", 0)
        reader, writer, client = await _raw_upload(port)
        client.send_data(1, b"\0" + (LIMIT + 1).to_bytes(4, "big") + bytes(100))
        writer.write(client.data_to_send())  # one write: one read at the port
        try:
            status: dict[bytes, bytes] = {}
            while not status:
                data = await asyncio.wait_for(reader.read(1 << 16), 10)
                assert data, "the connection closed without the call's status"
                for event in client.receive_data(data):
                    if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                        status = dict(event.headers).get(b"grpc-status") and dict(event.headers) or {}
                writer.write(client.data_to_send())
            assert status[b"grpc-status"] == b"8", status  # RESOURCE_EXHAUSTED
            assert f"vs. {LIMIT})".encode() in status[b"grpc-message"]
            assert not handler.got and all(not c.calls for c in wire.connections)
        finally:
            writer.close()
            await wire.stop(0)
    asyncio.run(main())
