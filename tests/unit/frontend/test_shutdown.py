"""The frontend's graceful shutdown, in process, with the engine sockets replaced by a fake: new
requests refused, running ones finishing within the timeout, and at the deadline streams ended by an
error event and [DONE], an unstarted response by an error response, the engines told to abort."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from protocol import Abort, GenerateRequest, Outputs, Ready, RequestOutput, decode
from services.frontend.config import FrontendConfig
from services.frontend.engine_client.engines import EngineSet
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.generation.metrics import Metrics
from services.frontend.http_api.app import Frontend
from services.frontend.model import Model
from tests.support.asgi_client import request

BODY = {"model": "tiny", "prompt": "hi", "max_tokens": 50}


class _Bridge:
    def __init__(self) -> None:
        self.requests: list[GenerateRequest] = []
        self.aborted: list[str] = []

    def send(self, index: int, frames: list[Any]) -> None:
        msg = decode(frames)
        if isinstance(msg, GenerateRequest):
            self.requests.append(msg)
        elif isinstance(msg, Abort):
            self.aborted += msg.request_ids


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load("tiny", "tiny")


def _frontend(model: Model) -> tuple[Frontend, EngineSet, _Bridge]:
    engines = EngineSet(["tcp://a:1"], frontend_id="t", engine_timeout_s=60, heartbeat_interval_s=1)
    bridge = _Bridge()
    engines._bridge = bridge  # type: ignore[assignment]
    engines._on_ready(engines.engines[0], Ready(0, "tiny", 4096, 16, 1000, "sim", "test", "e"), time.monotonic())
    config = FrontendConfig(model="tiny", data_parallel_size=1, data_parallel_size_local=0,
                            engine_addresses=("tcp://a:1",))
    return Frontend(FrontendCore(config, model, engines, Metrics("tiny"))), engines, bridge


async def _running(app: Frontend, engines: EngineSet, bridge: _Bridge, n: int, **body: Any) -> list[asyncio.Task]:  # type: ignore[type-arg]
    """n requests sent to the engine, each with one token out (streams have started)."""
    tasks = [asyncio.get_running_loop().create_task(request(app, "POST", "/v1/completions", {**BODY, **body}))
             for _ in range(n)]
    async with asyncio.timeout(10):
        while len(bridge.requests) < n:
            await asyncio.sleep(0.001)
    engine = engines.engines[0]
    engines._on_outputs(engine, Outputs(0, 1, [RequestOutput(r.request_id, [9707], None) for r in bridge.requests],
                                        time.time()))
    return tasks


def test_new_requests_are_refused_and_ready_fails_once_draining(model: Model) -> None:
    async def main() -> None:
        app, engines, bridge = _frontend(model)
        drain = asyncio.get_running_loop().create_task(app.shutdown.drain(30, asyncio.Event()))
        await asyncio.sleep(0)
        refused = await request(app, "POST", "/v1/completions", BODY)
        assert refused.status == 503 and refused.headers["connection"] == "close"
        assert "shutting down" in refused.json()["error"]["message"]
        ready = await request(app, "GET", "/ready")
        assert ready.status == 503 and ready.json() == {"ready": False, "draining": True}
        assert (await request(app, "GET", "/health")).status == 200  # alive: no restart while draining
        await asyncio.wait_for(drain, 5)  # nothing was running: done at once
        assert bridge.requests == []

    asyncio.run(main())


def test_running_requests_finish_within_the_timeout(model: Model) -> None:
    async def main() -> None:
        app, engines, bridge = _frontend(model)
        tasks = await _running(app, engines, bridge, 2, stream=True)
        drain = asyncio.get_running_loop().create_task(app.shutdown.drain(30, asyncio.Event()))
        await asyncio.sleep(0.01)
        assert not drain.done()
        engines._on_outputs(engines.engines[0], Outputs(0, 2, [RequestOutput(r.request_id, [1879], "length")
                                                               for r in bridge.requests], time.time()))
        for answer in await asyncio.gather(*tasks):
            events = answer.events()
            assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        await asyncio.wait_for(drain, 5)
        assert app.shutdown.cut is None

    asyncio.run(main())


@pytest.mark.parametrize("second_signal", [False, True])
def test_requests_still_running_at_the_deadline_end_with_an_error(model: Model, second_signal: bool) -> None:
    async def main() -> None:
        app, engines, bridge = _frontend(model)
        streams = await _running(app, engines, bridge, 2, stream=True)
        whole = await _running(app, engines, bridge, 3)  # the third: not streamed, no response yet
        now = asyncio.Event()
        drain = asyncio.get_running_loop().create_task(app.shutdown.drain(3600 if second_signal else 0.05, now))
        if second_signal:
            await asyncio.sleep(0.01)
            now.set()
        await asyncio.wait_for(drain, 10)
        for answer in await asyncio.gather(*streams):
            events = answer.events()
            assert answer.status == 200 and events[-1] == "[DONE]"
            assert "the frontend is shutting down" in events[-2]["error"]["message"]
            assert events[-2]["error"]["code"] == 503
        answer = await whole[0]
        assert answer.status == 503 and "--shutdown-timeout" in answer.json()["error"]["message"]
        assert sorted(bridge.aborted) == sorted(r.request_id for r in bridge.requests)  # engines stop them

    asyncio.run(main())
