"""A frontend with --grpc-port over sim engine ranks, and a channel with a stub per service: what the
gRPC integration tests drive (test_grpc.py, test_grpc_wire.py, test_grpc_abuse.py)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import grpc

from protocol.grpc import pb2_grpc
from tests.support.procs import EngineProc, FrontendProc, free_port_block, start_engine, start_frontend


class Fleet:
    def __init__(self, engine: EngineProc, frontend: FrontendProc, grpc_port: int) -> None:
        self.engine, self.frontend, self.grpc_port = engine, frontend, grpc_port
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.inference = pb2_grpc.InferenceStub(self.channel)
        self.control = pb2_grpc.ControlStub(self.channel)
        self.rl = pb2_grpc.RlControlStub(self.channel)
        self.kv = pb2_grpc.KvEventsStub(self.channel)


F = TypeVar("F", bound=Fleet)


@contextlib.contextmanager
def running(tmp: Path, engine_args: Sequence[str], frontend_args: Sequence[str], *, ranks: int = 1,
            make: Callable[[EngineProc, FrontendProc, int], F] = Fleet) -> Iterator[F]:  # type: ignore[assignment]
    """`ranks` headless engine ranks and a frontend over them serving gRPC; stopped on leaving."""
    engine = start_engine(tmp, *engine_args, ranks=ranks)
    grpc_port = free_port_block(1, spread=0)
    try:
        fe = start_frontend(tmp, "--data-parallel-size", str(ranks), "--data-parallel-size-local", "0",
                            "--engine-addresses", ",".join(engine.endpoint(i) for i in range(ranks)),
                            "--grpc-port", str(grpc_port), *frontend_args)
        try:
            f = make(engine, fe, grpc_port)
            yield f
            f.channel.close()
        finally:
            fe.stop()
    finally:
        engine.stop()
