"""How often grpc's aio client reports a refused upload as INTERNAL ("Internal error from Core", its own failed
send) in place of the status the server sent: the same refused UpdateWeights (8 MiB, refused at its first
message, INVALID_ARGUMENT) against grpc.aio's own server and against the frontend's gRPC port
(grpc_api/grpc_port.py), `--calls` each, with `--load` busy processes beside (the race needs a loaded host).
Counts of each status code per server. docs/grpc.md quotes it; tests/unit/frontend/test_grpc_port_upload.py
reads statuses past it.

Usage: .venv/bin/python bench/grpc_refusal_race.py [--calls 150] [--load 2]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.grpc import pb2_grpc
from tests.unit.frontend.test_grpc_port_upload import KEY, _Handler, _messages, _port


class _Refusing(pb2_grpc.RlControlServicer):
    async def UpdateWeights(self, request_iterator: Any, context: Any) -> Any:
        async for _ in request_iterator:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused")


async def _refused_upload(channel: grpc.aio.Channel, messages: list[Any], seen: collections.Counter[str]) -> None:
    try:
        await pb2_grpc.RlControlStub(channel).UpdateWeights(iter(messages), metadata=KEY, timeout=30)
        seen["OK"] += 1
    except grpc.aio.AioRpcError as exc:
        seen[exc.code().name] += 1


async def _grpc_server(calls: int) -> collections.Counter[str]:
    server = grpc.aio.server()
    pb2_grpc.add_RlControlServicer_to_server(_Refusing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    seen: collections.Counter[str] = collections.Counter()
    messages = _messages(8)
    try:
        for _ in range(calls):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await _refused_upload(channel, messages, seen)
    finally:
        await server.stop(0)
    return seen


async def _our_port(calls: int) -> collections.Counter[str]:
    seen: collections.Counter[str] = collections.Counter()
    messages = _messages(8)
    for _ in range(calls):
        wire, channel = await _port(_Handler(refuse="refused"))
        try:
            await _refused_upload(channel, messages, seen)
        finally:
            await channel.close()
            await wire.stop(0)
    return seen


def _busy() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--load", type=int, default=2, help="busy processes run beside the calls")
    args = ap.parse_args()
    hogs = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for hog in hogs:
        hog.start()
    try:
        print(f"refused 8 MiB uploads, {args.calls} each, {args.load} busy processes beside")
        print(f"  grpc.aio's server: {dict(asyncio.run(_grpc_server(args.calls)))}")
        print(f"  the frontend's port: {dict(asyncio.run(_our_port(args.calls)))}")
    finally:
        for hog in hogs:
            hog.terminate()


if __name__ == "__main__":
    main()
