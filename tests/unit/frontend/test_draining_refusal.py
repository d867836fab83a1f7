"""The frontend's answer to engine refusals, in process, with the engine sockets replaced by a fake
bridge (the port): a draining rank's refusal is placed again on another rank; a refusal of the request
itself is a 400."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from protocol import GenerateRequest, Outputs, Ready, RequestOutput, decode
from services.frontend.config import FrontendConfig
from services.frontend.engine_client.engines import EngineSet
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.generation.metrics import Metrics
from services.frontend.http_api.app import Frontend
from services.frontend.model import Model


class _Bridge:
    def __init__(self) -> None:
        self.requests: list[tuple[int, GenerateRequest]] = []

    def send(self, index: int, frames: list[Any]) -> None:
        msg = decode(frames)
        if isinstance(msg, GenerateRequest):
            self.requests.append((index, msg))


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load("tiny", "tiny")


async def _call(app: Frontend, body: dict[str, Any]) -> tuple[int, Any]:
    """Status and body (JSON, or the SSE data lines of a stream); headers land in _call.headers."""
    raw = json.dumps(body).encode()
    sent: list[dict[str, Any]] = []
    received = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not received.is_set():
            received.set()
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "query_string": b""}
    await asyncio.wait_for(app(scope, receive, send), 10)  # a request left waiting is a failure, not a hang
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    _call.headers = dict(sent[0]["headers"])  # type: ignore[attr-defined]
    if body.startswith(b"data: "):
        return sent[0]["status"], [line[6:].decode() for line in body.split(b"\n") if line.startswith(b"data: ")]
    return sent[0]["status"], json.loads(body)


def _fleet(model: Model) -> tuple[Frontend, EngineSet, _Bridge]:
    engines = EngineSet(["tcp://a:1", "tcp://b:2"], frontend_id="t", engine_timeout_s=60, heartbeat_interval_s=1)
    bridge = _Bridge()
    engines._bridge = bridge  # type: ignore[assignment]
    for e in engines.engines:
        engines._on_ready(e, Ready(e.index, "tiny", 4096, 16, 1000, "sim", "test", f"epoch-{e.index}"),
                          time.monotonic())
    config = FrontendConfig(model="tiny", data_parallel_size=2, data_parallel_size_local=0,
                            engine_addresses=("tcp://a:1", "tcp://b:2"))
    return Frontend(FrontendCore(config, model, engines, Metrics("tiny"))), engines, bridge


async def _answer(engines: EngineSet, bridge: _Bridge, n: int, *outputs: RequestOutput) -> int:
    """Wait for the n-th request sent, answer it from its engine with `outputs`; its engine index."""
    deadline = time.monotonic() + 10
    while len(bridge.requests) < n:
        assert time.monotonic() < deadline, f"request {n} was never sent (sent: {len(bridge.requests)})"
        await asyncio.sleep(0.001)
    index, request = bridge.requests[n - 1]
    engine = engines.engines[index]
    outs = [RequestOutput(request.request_id, o.new_token_ids, o.finish_reason, error=o.error,
                          error_kind=o.error_kind) for o in outputs]
    engines._on_outputs(engine, Outputs(engine.rank, 1, outs, time.time()))
    return index


def test_a_draining_ranks_refusal_is_placed_on_another_rank(model: Model) -> None:
    async def main() -> None:
        app, engines, bridge = _fleet(model)
        call = asyncio.get_running_loop().create_task(_call(app, {"model": "tiny", "prompt": "hi", "max_tokens": 2}))
        first = await _answer(engines, bridge, 1, RequestOutput("", [], "error", error="rank 0 is draining",
                                                                error_kind="draining"))
        second = await _answer(engines, bridge, 2, RequestOutput("", [9707, 1879], "length"))
        status, body = await call
        assert first != second  # the same request, sent again to the other rank
        assert bridge.requests[0][1].request_id == bridge.requests[1][1].request_id
        assert status == 200 and body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 2

    asyncio.run(main())


def test_when_every_rank_drains_the_client_gets_503(model: Model) -> None:
    async def main() -> None:
        app, engines, bridge = _fleet(model)
        call = asyncio.get_running_loop().create_task(_call(app, {"model": "tiny", "prompt": "hi", "max_tokens": 2}))
        for n in (1, 2):
            await _answer(engines, bridge, n, RequestOutput("", [], "error", error=f"rank draining ({n})",
                                                            error_kind="draining"))
        status, body = await call
        assert status == 503 and "draining (2)" in body["error"]["message"]
        assert len(bridge.requests) == 2  # each rank tried once, then it gave up

    asyncio.run(main())


def test_a_refusal_of_the_request_itself_is_a_400(model: Model) -> None:
    async def main() -> None:
        app, engines, bridge = _fleet(model)
        call = asyncio.get_running_loop().create_task(_call(app, {"model": "tiny", "prompt": "hi", "max_tokens": 2}))
        await _answer(engines, bridge, 1, RequestOutput("", [], "error", error="token id out of range",
                                                        error_kind="invalid"))
        status, body = await call
        assert status == 400 and body["error"]["message"] == "token id out of range"
        assert len(bridge.requests) == 1  # not retried: it would fail anywhere

    asyncio.run(main())


def test_a_stream_moved_off_a_draining_rank_names_the_rank_that_served_it(model: Model) -> None:
    async def main() -> None:
        app, engines, bridge = _fleet(model)
        call = asyncio.get_running_loop().create_task(
            _call(app, {"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}))
        await _answer(engines, bridge, 1, RequestOutput("", [], "error", error="draining", error_kind="draining"))
        second = await _answer(engines, bridge, 2, RequestOutput("", [9707, 1879], "length"))
        status, events = await call
        assert status == 200 and events[-1] == "[DONE]"
        assert _call.headers[b"x-data-parallel-rank"] == str(engines.engines[second].rank).encode()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_stream_refused_before_any_output_gets_a_status_not_an_event(model: Model) -> None:
    async def main() -> None:
        app, engines, bridge = _fleet(model)
        call = asyncio.get_running_loop().create_task(
            _call(app, {"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}))
        await _answer(engines, bridge, 1, RequestOutput("", [], "error", error="bad token", error_kind="invalid"))
        status, body = await call
        assert status == 400 and body["error"]["message"] == "bad token"

    asyncio.run(main())


def test_a_client_gone_while_a_draining_rank_refuses_is_not_placed_again(model: Model) -> None:
    async def main() -> None:
        app, engines, bridge = _fleet(model)
        call = asyncio.get_running_loop().create_task(_call(app, {"model": "tiny", "prompt": "hi", "max_tokens": 2}))
        while not bridge.requests:
            await asyncio.sleep(0.001)
        index, request = bridge.requests[0]
        stream = engines.engines[index].inflight[request.request_id]
        # In one loop iteration: the refusal arrives, then the client's disconnect, before the handler runs.
        await _answer(engines, bridge, 1, RequestOutput("", [], "error", error="draining", error_kind="draining"))
        stream.fail("client disconnected")
        status, _ = await call
        assert status == 503 and len(bridge.requests) == 1

    asyncio.run(main())
