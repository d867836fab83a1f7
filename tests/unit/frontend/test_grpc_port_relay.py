"""The gRPC port's relay (grpc_api/grpc_port.py) when grpc.aio behind it cannot be reached or goes
away: every relayed call ends UNAVAILABLE with the reason, at once, and the port keeps serving; a
call relayed to a live grpc.aio server behind it (the health service) passes through unchanged."""
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
