"""A frontend with --grpc-port and its engine, and a channel with a stub per service: what the gRPC
integration tests drive (test_grpc.py, test_grpc_wire.py)."""
from __future__ import annotations

import grpc

from protocol.grpc import pb2_grpc
from tests.support.procs import EngineProc, FrontendProc


class Fleet:
    def __init__(self, engine: EngineProc, frontend: FrontendProc, grpc_port: int) -> None:
        self.engine, self.frontend, self.grpc_port = engine, frontend, grpc_port
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.inference = pb2_grpc.InferenceStub(self.channel)
        self.control = pb2_grpc.ControlStub(self.channel)
        self.rl = pb2_grpc.RlControlStub(self.channel)
        self.kv = pb2_grpc.KvEventsStub(self.channel)
