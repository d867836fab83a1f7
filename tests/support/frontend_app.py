"""A frontend ASGI app (services/frontend/http_api/app.py) for in-process tests: the tiny model, one engine rank
handshaken, its socket replaced by a fake bridge that answers every request at once with one token (and
the logprobs it asked for: every token ranked first), and list_loras with no adapters."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from protocol import (
    MAJOR,
    MINOR,
    GenerateRequest,
    Outputs,
    PackedLogprobs,
    Ready,
    RequestOutput,
    UtilityCall,
    UtilityResult,
    decode,
)
from protocol.logprobs import pack
from services.frontend.config import FrontendConfig
from services.frontend.engine_client.engines import EngineSet
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.generation.metrics import Metrics
from services.frontend.http_api.app import Frontend
from services.frontend.model import Model

ADDRESS = "tcp://engine:1"


class AnsweringBridge:
    """Each GenerateRequest sent is answered, on the loop, by one token and finish "length"."""

    def __init__(self, engines: EngineSet) -> None:
        self.engines = engines
        self.requests: list[GenerateRequest] = []

    def send(self, index: int, frames: list[Any]) -> None:
        message = decode(frames)
        if isinstance(message, UtilityCall) and message.utility == "list_loras":
            answer = UtilityResult(message.call_id, True, [])
            future = self.engines._calls.get(message.call_id)
            assert future is not None
            asyncio.get_running_loop().call_soon(future.set_result, answer)
        if isinstance(message, GenerateRequest):
            self.requests.append(message)
            engine = self.engines.engines[index]
            out = RequestOutput(message.request_id, [9707], "length")
            raw = b""
            k, prompt_k = message.sampling.logprobs, message.sampling.prompt_logprobs
            if prompt_k is not None and len(message.prompt_token_ids) > 1:  # each prompt token ranked 1st
                rows = [t for t in message.prompt_token_ids[1:] for t in [t] * (prompt_k + 1)]
                out.packed_prompt_logprobs = PackedLogprobs(0, 0, len(message.prompt_token_ids) - 1, prompt_k)
                raw += pack(rows, [-1.0] * len(rows), [1] * (len(message.prompt_token_ids) - 1))
            if k is not None:
                out.packed_logprobs = PackedLogprobs(0, len(raw), 1, k)
                raw += pack([9707] * (k + 1), [-0.5] * (k + 1), [1])
            outputs = Outputs(engine.rank, len(self.requests), [out], time.time())
            asyncio.get_running_loop().call_soon(self.engines._on_outputs, engine, outputs, [raw] if raw else [])


def frontend_app(max_model_len: int = 4096, *, backend: str = "sim", minor: int = MINOR,
                 max_logprobs: int = 20) -> Frontend:
    """`backend` and `minor`: what the engine's Ready says (a vllm engine of protocol 1.3 honours every
    field a sim engine refuses; logprobs need 1.3 of either)."""
    engines = EngineSet([ADDRESS], frontend_id="test", engine_timeout_s=60, heartbeat_interval_s=1)
    engines._bridge = AnsweringBridge(engines)  # type: ignore[assignment]
    for e in engines.engines:
        engines._on_ready(e, Ready(e.index, "tiny", max_model_len, 16, 1000, backend, "test", "epoch", 0, MAJOR, minor),
                          time.monotonic())
    config = FrontendConfig(model="tiny", data_parallel_size=1, data_parallel_size_local=0,
                            engine_addresses=(ADDRESS,), max_logprobs=max_logprobs)
    return Frontend(FrontendCore(config, Model.load("tiny", "tiny"), engines, Metrics("tiny")))


def render_only_app(max_model_len: int | None = None) -> Frontend:
    """A frontend started with --render-only: the tiny model, no engine at all."""
    engines = EngineSet([], frontend_id="test", engine_timeout_s=60, heartbeat_interval_s=1)
    config = FrontendConfig(model="tiny", data_parallel_size_local=0, render_only=True, max_model_len=max_model_len)
    return Frontend(FrontendCore(config, Model.load("tiny", "tiny"), engines, Metrics("tiny")))
