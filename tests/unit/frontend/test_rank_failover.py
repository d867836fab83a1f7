"""A rank whose connection is gone, in process, with the socket thread replaced by a fake (the port):
a request the socket refused for want of a connection never left this process and goes to another
rank; a closed connection takes the rank out at once and fails the requests that may have reached it;
none of those is ever sent twice."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from protocol import GenerateRequest, Outputs, Ready, RequestOutput, decode
from services.frontend.config import FrontendConfig
from services.frontend.engine_client.bridge import DISCONNECTED, FLUSHED, SEND_FAILED, Inbound
from services.frontend.engine_client.engines import EngineSet
from services.frontend.generation.frontend_core import FrontendCore
from services.frontend.generation.metrics import Metrics
from services.frontend.http_api.app import Frontend
from services.frontend.model import Model
from tests.support.asgi_client import Answer, request

BODY = {"model": "tiny", "prompt": "hi", "max_tokens": 2}


class _Sockets:
    """The socket thread as the loop sees it: frames to a rank whose connection is down are refused
    (SEND_FAILED), a flush answers FLUSHED after them, in order, as the real bridge does. With
    auto=False the test hands the items over itself (deliver)."""

    def __init__(self, engines: EngineSet, *, auto: bool = True) -> None:
        self.engines = engines
        self.auto = auto
        self.down: set[int] = set()
        self.sent: list[tuple[int, GenerateRequest]] = []  # requests that left for an engine
        self.pending: list[Inbound] = []

    def send(self, index: int, frames: list[Any]) -> None:
        if index in self.down:
            self._queue((index, SEND_FAILED, frames))
            return
        msg = decode(frames)
        if isinstance(msg, GenerateRequest):
            self.sent.append((index, msg))

    def flush(self, index: int) -> None:
        self._queue((index, FLUSHED, []))

    def close_connection(self, index: int) -> None:
        """The engine process went away: its connection closes and the monitor says so."""
        self.down.add(index)
        self._queue((index, DISCONNECTED, []))

    def deliver(self) -> None:
        batch, self.pending = self.pending, []
        if batch:
            self.engines._on_batch(batch, time.monotonic())

    def _queue(self, item: Inbound) -> None:
        self.pending.append(item)
        if self.auto and len(self.pending) == 1:
            asyncio.get_running_loop().call_soon(self.deliver)


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load("tiny", "tiny")


def _fleet(model: Model, *, auto: bool = True) -> tuple[Frontend, EngineSet, _Sockets]:
    engines = EngineSet(["tcp://a:1", "tcp://b:2"], frontend_id="t", engine_timeout_s=60, heartbeat_interval_s=1)
    sockets = _Sockets(engines, auto=auto)
    engines._bridge = sockets  # type: ignore[assignment]
    for e in engines.engines:
        engines._on_ready(e, Ready(e.index, "tiny", 4096, 16, 1000, "sim", "test", f"epoch-{e.index}"),
                          time.monotonic())
    config = FrontendConfig(model="tiny", data_parallel_size=2, data_parallel_size_local=0,
                            engine_addresses=("tcp://a:1", "tcp://b:2"))
    return Frontend(FrontendCore(config, model, engines, Metrics("tiny"))), engines, sockets


async def _sent(sockets: _Sockets, n: int) -> tuple[int, GenerateRequest]:
    """The n-th request that left for an engine (waits for it, with a deadline)."""
    async with asyncio.timeout(10):
        while len(sockets.sent) < n:
            await asyncio.sleep(0.001)
    return sockets.sent[n - 1]


def _answer(engines: EngineSet, index: int, request_id: str, tokens: list[int], finish: str | None) -> None:
    engine = engines.engines[index]
    engines._on_outputs(engine, Outputs(engine.rank, 1, [RequestOutput(request_id, tokens, finish)], time.time()))


def test_a_request_the_socket_refused_is_placed_on_another_rank(model: Model) -> None:
    async def main() -> None:
        app, engines, sockets = _fleet(model)
        sockets.down.add(0)  # rank 0 died; nothing has told the loop yet (the heartbeat window)
        call = asyncio.get_running_loop().create_task(request(app, "POST", "/v1/completions", BODY))
        index, sent = await _sent(sockets, 1)
        assert index == 1  # first placed on rank 0 (ties rotate from it), refused there, sent to rank 1
        assert engines.engines[0].state == "dead" and "no connection" in engines.engines[0].reason
        _answer(engines, 1, sent.request_id, [9707, 1879], "length")
        answer = await call
        assert answer.status == 200 and answer.headers["x-data-parallel-rank"] == "1"
        assert len(sockets.sent) == 1
        # New requests avoid rank 0 from now on.
        later = asyncio.get_running_loop().create_task(request(app, "POST", "/v1/completions", BODY))
        index, sent = await _sent(sockets, 2)
        _answer(engines, index, sent.request_id, [9707, 1879], "length")
        assert (await later).status == 200 and index == 1

    asyncio.run(main())


def test_a_request_refused_after_the_loop_learned_of_the_disconnect_still_moves(model: Model) -> None:
    """The disconnect can reach the loop before the refusal of a request submitted just before it:
    the rank's in-flight requests fail only once every queued send was tried (FLUSHED)."""
    async def main() -> None:
        app, engines, sockets = _fleet(model, auto=False)
        sockets.down.add(0)
        call = asyncio.get_running_loop().create_task(request(app, "POST", "/v1/completions", BODY))
        async with asyncio.timeout(10):
            while not sockets.pending:  # submitted to rank 0, refused there, not yet told
                await asyncio.sleep(0.001)
        engines._on_batch([(0, DISCONNECTED, [])], time.monotonic())
        assert engines.engines[0].state == "dead"
        sockets.auto = True
        sockets.deliver()  # SEND_FAILED, then FLUSHED
        index, sent = await _sent(sockets, 1)
        _answer(engines, index, sent.request_id, [9707, 1879], "length")
        answer = await call
        assert answer.status == 200 and index == 1

    asyncio.run(main())


def test_a_closed_connection_fails_its_streams_at_once_and_they_are_not_sent_again(model: Model) -> None:
    async def main() -> None:
        app, engines, sockets = _fleet(model)
        body = {**BODY, "max_tokens": 50, "stream": True}
        call = asyncio.get_running_loop().create_task(
            request(app, "POST", "/v1/completions", body, headers={"X-Data-Parallel-Rank": "0"}))
        index, sent = await _sent(sockets, 1)
        _answer(engines, index, sent.request_id, [9707], None)  # the stream has started
        sockets.close_connection(0)
        answer: Answer = await call
        events = answer.events()
        assert answer.status == 200 and events[-1] == "[DONE]"
        assert "engine rank 0 failed: its connection closed" in events[-2]["error"]["message"]
        assert len(sockets.sent) == 1  # it may have reached rank 0: never sent anywhere else
        assert "connection closed" in engines.not_ready()[0]

    asyncio.run(main())


def test_a_request_sent_before_the_connection_closed_fails_rather_than_moves(model: Model) -> None:
    async def main() -> None:
        app, engines, sockets = _fleet(model)
        call = asyncio.get_running_loop().create_task(request(app, "POST", "/v1/completions", BODY))
        index, _ = await _sent(sockets, 1)
        sockets.close_connection(index)
        answer = await call
        assert answer.status == 503 and f"engine rank {index} failed" in answer.json()["error"]["message"]
        assert len(sockets.sent) == 1

    asyncio.run(main())


def test_a_pinned_request_to_an_unreachable_rank_is_a_503_naming_it(model: Model) -> None:
    async def main() -> None:
        app, engines, sockets = _fleet(model)
        sockets.down.add(1)
        answer = await request(app, "POST", "/v1/completions", BODY, headers={"X-Data-Parallel-Rank": "1"})
        assert answer.status == 503
        assert answer.json()["error"]["message"] == "engine rank 1 is unreachable (the request was never sent)"
        assert sockets.sent == []

    asyncio.run(main())


def test_requests_of_a_rank_awaiting_its_flush_fail_when_the_socket_thread_dies(model: Model) -> None:
    async def main() -> None:
        app, engines, sockets = _fleet(model, auto=False)
        call = asyncio.get_running_loop().create_task(request(app, "POST", "/v1/completions", BODY))
        index, _ = await _sent(sockets, 1)
        engines._on_batch([(index, DISCONNECTED, [])], time.monotonic())  # its FLUSHED never comes
        engines._on_bridge_dead("a bug")
        answer = await call
        assert answer.status == 503 and "socket thread stopped: a bug" in answer.json()["error"]["message"]

    asyncio.run(main())
