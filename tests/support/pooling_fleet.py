"""A frontend ASGI app over fake engine ranks of protocol 1.5 that answer pooling requests as an engine
does: the pooled float32 values in a raw frame (vector(ids): exact in float32, one per prompt; one row per
token for token_embed), generation requests with one token. For the in-process pooling tests."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from protocol import (
    ERROR_DRAINING,
    ERROR_INVALID,
    MAJOR,
    Abort,
    GenerateRequest,
    Outputs,
    PackedPooled,
    Ready,
    RequestOutput,
    UtilityCall,
    UtilityResult,
    decode,
)
from protocol.pooled import pack
from services.frontend.config import FrontendConfig
from services.frontend.engine_client.engines import EngineSet
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.generation.metrics import Metrics
from services.frontend.http_api.app import Frontend
from services.frontend.model import Model

DIM = 4


def vector(ids: list[int]) -> list[float]:
    """The fake engine's embedding of a prompt: exact in float32, different for each prompt."""
    return [float(len(ids)), float(ids[0]), float(ids[-1]), float(sum(ids) % 1024)]


def scores(ids: list[int], labels: int) -> list[float]:
    """The fake engine's class scores of a prompt (or a pair): exact in float32, summing to 1 (one label:
    a probability of its own)."""
    if labels == 1:
        return [(sum(ids) % 8) / 8]
    raw = [float((sum(ids) + k) % 4 + 1) for k in range(labels)]
    return [v / sum(raw) for v in raw]


class PoolingBridge:
    """Answers each pooling request on the loop with vector(ids) (token_embed: one row per token; classify:
    scores(ids, labels)), unless
    `fail` names an input index (its request fails as invalid, with the message `fail_with`), the rank is
    in `draining` (refused as draining) or `hold` is set or the rank `silent` (nothing is answered)."""

    def __init__(self, engines: EngineSet) -> None:
        self.engines = engines
        self.sent: list[tuple[int, GenerateRequest]] = []
        self.aborted: list[str] = []
        self.fail: int | None = None
        self.fail_with = "prompt is not allowed"
        self.labels = 3  # classify: values per input, the model's labels (a cross-encoder has one)
        self.draining: set[int] = set()  # engine indices that refuse every request as draining
        self.silent: set[int] = set()  # engine indices that answer nothing (as `hold`, for one rank)
        self.shape: list[int] | None = None  # set: every pooled output claims this shape (a faulty engine)
        self.hold = False

    def send(self, index: int, frames: list[Any]) -> None:
        message = decode(frames)
        if isinstance(message, Abort):
            self.aborted += message.request_ids
        if isinstance(message, UtilityCall):
            future = self.engines._calls[message.call_id]
            asyncio.get_running_loop().call_soon(future.set_result, UtilityResult(message.call_id, True, []))
        if not isinstance(message, GenerateRequest):
            return
        self.sent.append((index, message))
        if self.hold or index in self.silent:
            return
        engine = self.engines.engines[index]
        ids = message.prompt_token_ids
        if message.pooling is None:
            out, raw = RequestOutput(message.request_id, [9707], "length"), b""
        elif index in self.draining:
            out, raw = RequestOutput(message.request_id, [], "error", error="engine is draining",
                                     error_kind=ERROR_DRAINING), b""
        elif self.fail is not None and message.request_id.endswith(f"-{self.fail}"):
            out, raw = RequestOutput(message.request_id, [], "error", error=self.fail_with,
                                     error_kind=ERROR_INVALID), b""
        elif message.pooling.task == "classify":
            raw = pack(scores(ids, self.labels))
            out = RequestOutput(message.request_id, [], "stop", pooled=PackedPooled(0, 0, [self.labels]))
        elif message.pooling.task == "token_embed":
            raw = pack([v for t in ids for v in vector([t])])
            out = RequestOutput(message.request_id, [], "stop", pooled=PackedPooled(0, 0, [len(ids), DIM]))
        else:
            raw = pack(vector(ids))
            out = RequestOutput(message.request_id, [], "stop", pooled=PackedPooled(0, 0, [DIM]))
        if self.shape is not None and out.pooled is not None:
            out.pooled = PackedPooled(0, 0, self.shape)
        outputs = Outputs(engine.rank, len(self.sent), [out], time.time())
        asyncio.get_running_loop().call_soon(self.engines._on_outputs, engine, outputs, [raw] if raw else [])


def fleet(model: Model, tasks: list[list[str]] | None = None, *, max_model_len: int = 512,
          minor: int = 5) -> tuple[Frontend, PoolingBridge]:
    """A frontend over one engine rank per entry of `tasks` (what each one's Ready lists)."""
    tasks = tasks or [["embed", "token_embed"]]
    addresses = [f"tcp://engine:{i}" for i in range(len(tasks))]
    engines = EngineSet(addresses, frontend_id="test", engine_timeout_s=60, heartbeat_interval_s=1)
    bridge = PoolingBridge(engines)
    engines._bridge = bridge  # type: ignore[assignment]
    for e, served in zip(engines.engines, tasks, strict=True):
        runner = "generate" if served == ["generate"] else "pooling"
        ready = Ready(e.index, model.name, max_model_len, 16, 1000, "sim", "test", f"epoch-{e.index}", 0, MAJOR,
                      minor, runner, served)
        engines._on_ready(e, ready, time.monotonic())
    config = FrontendConfig(model=model.name, data_parallel_size=len(tasks), data_parallel_size_local=0,
                            engine_addresses=tuple(addresses))
    core = FrontendCore(config, model, engines, Metrics(model.name))
    bridge.labels = core.pooling_model.num_labels
    return Frontend(core), bridge
