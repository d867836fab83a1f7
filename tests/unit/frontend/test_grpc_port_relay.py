"""The gRPC port's relay (grpc_api/relay.py): a call relayed to a live grpc.aio server behind it
passes through unchanged (the health service; an answer of megabytes, which grpc.aio sends in frames
as large as the relay takes); when grpc.aio cannot be reached or goes away, every relayed call ends
UNAVAILABLE with the reason, at once, and the port keeps serving."""
from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from edge.api_keys import ApiKeys
from services.frontend.grpc_api.grpc_port import GrpcPort


async def _check(port: int) -> health_pb2.HealthCheckResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)


def test_an_answer_of_megabytes_passes_through_whole() -> None:
    big = bytes(range(256)) * (12 << 12)  # 12 MiB: past every window and frame size on the way

    async def echo_big(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return big[:int(request)]

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            inner = str(Path(tmp) / "grpc.sock")
            server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20)])
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
                "test.Big", {"Get": grpc.unary_unary_rpc_method_handler(echo_big)}),))
            server.add_insecure_port(f"unix:{inner}")
            await server.start()
            wire = GrpcPort(None, ApiKeys([]), 1 << 20, inner)  # type: ignore[arg-type]  # relays only here
            port = await wire.start("127.0.0.1", 0)
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
                        ("grpc.max_receive_message_length", 64 << 20)]) as channel:
                    get = channel.unary_unary("/test.Big/Get")
                    for size in (10, 100_000, len(big)):
                        assert await get(str(size).encode(), timeout=30) == big[:size]
            finally:
                await wire.stop(0)
                await server.stop(0)
    asyncio.run(main())


def test_relayed_calls_pass_through_then_end_unavailable_when_grpc_aio_goes() -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            inner = str(Path(tmp) / "grpc.sock")
            server = grpc.aio.server()
            health = health_aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health, server)
            server.add_insecure_port(f"unix:{inner}")
            await server.start()
            wire = GrpcPort(None, ApiKeys([]), 1 << 20, inner)  # type: ignore[arg-type]  # relays only here
            port = await wire.start("127.0.0.1", 0)
            try:
                assert (await _check(port)).status == health_pb2.HealthCheckResponse.SERVING
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=30)
                    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
                    await server.stop(0)  # a relayed stream running: it ends, it does not hang
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await watch.read()
                    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), err.value
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await _check(port)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "gRPC services are unreachable" in (err.value.details() or "")
            finally:
                await wire.stop(0)
    asyncio.run(main())
