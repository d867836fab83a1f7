"""A frontend ASGI app (services/frontend/app.py) for in-process tests: the tiny model, one engine rank
handshaken, its socket replaced by a fake bridge that answers every request at once with one token."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from protocol import GenerateRequest, Outputs, Ready, RequestOutput, decode
from services.frontend.app import Frontend
from services.frontend.config import FrontendConfig
from services.frontend.engines import EngineSet
from services.frontend.metrics import Metrics
from services.frontend.model import Model

ADDRESS = "tcp://engine:1"


class AnsweringBridge:
    """Each GenerateRequest sent is answered, on the loop, by one token and finish "length"."""

    def __init__(self, engines: EngineSet) -> None:
        self.engines = engines
        self.requests: list[GenerateRequest] = []

    def send(self, index: int, frames: list[Any]) -> None:
        message = decode(frames)
        if isinstance(message, GenerateRequest):
            self.requests.append(message)
            engine = self.engines.engines[index]
            outputs = Outputs(engine.rank, len(self.requests), [RequestOutput(message.request_id, [9707], "length")],
                              time.time())
            asyncio.get_running_loop().call_soon(self.engines._on_outputs, engine, outputs)


def frontend_app(max_model_len: int = 4096, *, backend: str = "sim", minor: int = 0) -> Frontend:
    """`backend` and `minor`: what the engine's Ready says (a vllm engine of protocol 1.3 honours every
    field a sim engine refuses)."""
    engines = EngineSet([ADDRESS], frontend_id="test", engine_timeout_s=60, heartbeat_interval_s=1)
    engines._bridge = AnsweringBridge(engines)  # type: ignore[assignment]
    for e in engines.engines:
        engines._on_ready(e, Ready(e.index, "tiny", max_model_len, 16, 1000, backend, "test", "epoch", 0, 1, minor),
                          time.monotonic())
    config = FrontendConfig(model="tiny", data_parallel_size=1, data_parallel_size_local=0,
                            engine_addresses=(ADDRESS,))
    return Frontend(config, Model.load("tiny", "tiny"), engines, Metrics("tiny"))


def render_only_app(max_model_len: int | None = None) -> Frontend:
    """A frontend started with --render-only: the tiny model, no engine at all."""
    engines = EngineSet([], frontend_id="test", engine_timeout_s=60, heartbeat_interval_s=1)
    config = FrontendConfig(model="tiny", data_parallel_size_local=0, render_only=True, max_model_len=max_model_len)
    return Frontend(config, Model.load("tiny", "tiny"), engines, Metrics("tiny"))
