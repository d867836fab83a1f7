"""A rank whose connection is gone, or that went silent, in process, with the socket thread replaced by
a fake (the port): a request the socket refused for want of a connection never left this process and
goes to another rank; a closed connection takes the rank out at once and fails the requests that
produced output there (those that produced none go to another rank: their client saw nothing of them);
a rank silent past --engine-timeout takes no new requests but keeps its running ones, which fail only
past --engine-dead-timeout; /ready stays 200 while any rank serves."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from protocol import EngineDead, GenerateRequest, Outputs, Ready, RequestOutput, Stats, decode, encode
from services.frontend.config import FrontendConfig, parse_args
from services.frontend.engine_client.bridge import DEALER, DISCONNECTED, FLUSHED, SEND_FAILED, Inbound
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


def _fleet(model: Model, *, auto: bool = True, timeout_s: float = 60,
           dead_timeout_s: float = 60) -> tuple[Frontend, EngineSet, _Sockets]:
    engines = EngineSet(["tcp://a:1", "tcp://b:2"], frontend_id="t", engine_timeout_s=timeout_s,
                        heartbeat_interval_s=1, engine_dead_timeout_s=dead_timeout_s)
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


def test_a_request_sent_before_the_connection_closed_moves_while_it_has_no_output(model: Model) -> None:
    """It may have reached the rank, but nothing of it reached the client: the other rank serves it."""
    async def main() -> None:
        app, engines, sockets = _fleet(model)
        call = asyncio.get_running_loop().create_task(request(app, "POST", "/v1/completions", BODY))
        index, first = await _sent(sockets, 1)
        sockets.close_connection(index)
        again, sent = await _sent(sockets, 2)
        assert again == 1 - index and sent.request_id == first.request_id
        _answer(engines, again, sent.request_id, [9707, 1879], "length")
        answer = await call
        assert answer.status == 200 and answer.headers["x-data-parallel-rank"] == str(again)
        assert answer.json()["choices"][0]["text"]

    asyncio.run(main())


def test_a_request_with_no_output_on_a_rank_that_reports_its_death_moves(model: Model) -> None:
    async def main() -> None:
        app, engines, sockets = _fleet(model)
        body = {**BODY, "stream": True}
        call = asyncio.get_running_loop().create_task(request(app, "POST", "/v1/completions", body))
        index, first = await _sent(sockets, 1)
        engines._on_batch([(index, DEALER, encode(EngineDead(index, "CUDA error")))], time.monotonic())
        again, sent = await _sent(sockets, 2)
        assert again == 1 - index and sent.request_id == first.request_id
        _answer(engines, again, sent.request_id, [9707, 1879], "length")
        answer = await call
        events = answer.events()
        assert answer.status == 200 and events[-1] == "[DONE]"
        assert "error" not in events[-2] and events[-2]["choices"][0]["finish_reason"] == "length"

    asyncio.run(main())


def test_a_pinned_request_with_no_output_on_a_rank_that_died_is_a_503_naming_it(model: Model) -> None:
    async def main() -> None:
        app, engines, sockets = _fleet(model)
        call = asyncio.get_running_loop().create_task(
            request(app, "POST", "/v1/completions", BODY, headers={"X-Data-Parallel-Rank": "0"}))
        await _sent(sockets, 1)
        sockets.close_connection(0)
        answer = await call
        assert answer.status == 503 and "engine rank 0 failed" in answer.json()["error"]["message"]
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


async def _until(condition: Any, what: str) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.005)


def _speak(engines: EngineSet, index: int) -> None:
    """A Stats message from the rank, as the socket thread hands it over."""
    engine = engines.engines[index]
    stats = Stats(engine.rank, 99, time.time(), 1, 0, 0.0, session_epoch=engine.epoch)
    engines._on_batch([(index, DEALER, encode(stats))], time.monotonic())


async def _keep_alive(engines: EngineSet, index: int) -> None:
    """The rank speaks every 50 ms, as a healthy engine's Stats do."""
    while True:
        _speak(engines, index)
        await asyncio.sleep(0.05)


def test_a_silent_rank_takes_no_new_requests_but_keeps_its_streams_until_it_speaks_again(model: Model) -> None:
    async def main() -> None:
        app, engines, sockets = _fleet(model, timeout_s=0.5, dead_timeout_s=60)
        alive = asyncio.get_running_loop().create_task(_keep_alive(engines, 1))
        engines._ticker = asyncio.get_running_loop().create_task(engines._tick())
        body = {**BODY, "max_tokens": 3, "stream": True}
        call = asyncio.get_running_loop().create_task(
            request(app, "POST", "/v1/completions", body, headers={"X-Data-Parallel-Rank": "0"}))
        _, sent = await _sent(sockets, 1)
        _answer(engines, 0, sent.request_id, [9707], None)
        engines.engines[0].last_seen = time.monotonic() - 1.0  # rank 0 went quiet a second ago (SIGSTOP)
        await _until(lambda: engines.engines[0].slow is not None, "rank 0 slow")
        assert engines.engines[0].state == "ready" and not call.done()
        ready = await request(app, "GET", "/ready")
        assert ready.status == 200 and ready.json()["ranks"] == [1]
        assert ready.json()["missing"]["0"].startswith("slow: no message for")
        # New work goes to rank 1 meanwhile; a request pinned to rank 0 is told why not.
        other = asyncio.get_running_loop().create_task(request(app, "POST", "/v1/completions", BODY))
        index, new = await _sent(sockets, 2)
        assert index == 1
        _answer(engines, 1, new.request_id, [9707, 1879], "length")
        assert (await other).status == 200
        pinned = await request(app, "POST", "/v1/completions", BODY, headers={"X-Data-Parallel-Rank": "0"})
        assert pinned.status == 503 and "slow: no message for" not in pinned.json()["error"]["message"]
        assert "no message for" in pinned.json()["error"]["message"]
        # It speaks again: its stream goes on, and it takes new work.
        _speak(engines, 0)
        _answer(engines, 0, sent.request_id, [1879, 13], "length")
        answer = await call
        events = answer.events()
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        assert engines.engines[0].slow is None and engines.engines[0].accepting
        assert (await request(app, "GET", "/ready")).json() == {"ready": True, "ranks": [0, 1]}
        engines._ticker.cancel()
        alive.cancel()

    asyncio.run(main())


def test_a_rank_silent_past_the_dead_deadline_fails_its_streams_and_moves_those_with_no_output(
        model: Model) -> None:
    async def main() -> None:
        app, engines, sockets = _fleet(model, timeout_s=0.5, dead_timeout_s=2)
        loop = asyncio.get_running_loop()
        body = {**BODY, "max_tokens": 3, "stream": True}
        unpinned = loop.create_task(request(app, "POST", "/v1/completions", BODY))
        index, moving = await _sent(sockets, 1)
        assert index == 0  # a tie: rank 0 first
        started = loop.create_task(
            request(app, "POST", "/v1/completions", body, headers={"X-Data-Parallel-Rank": "0"}))
        _, first = await _sent(sockets, 2)
        _answer(engines, 0, first.request_id, [9707], None)
        waiting = loop.create_task(
            request(app, "POST", "/v1/completions", body, headers={"X-Data-Parallel-Rank": "0"}))
        await _sent(sockets, 3)
        engines.engines[0].last_seen = time.monotonic() - 3.0  # silent past both deadlines
        alive = loop.create_task(_keep_alive(engines, 1))
        engines._ticker = loop.create_task(engines._tick())
        answer = await started  # it produced output: it fails, naming the deadline
        events = answer.events()
        assert events[-1] == "[DONE]"
        assert "engine rank 0 failed: no message for" in events[-2]["error"]["message"]
        assert "--engine-dead-timeout 2s" in events[-2]["error"]["message"]
        pinned = await waiting  # no output, but pinned to rank 0: a 503 naming why
        assert pinned.status == 503 and "--engine-dead-timeout" in pinned.json()["error"]["message"]
        again, sent = await _sent(sockets, 4)  # no output, not pinned: on rank 1 now
        assert again == 1 and sent.request_id == moving.request_id
        _answer(engines, 1, sent.request_id, [9707, 1879], "length")
        assert (await unpinned).status == 200
        assert engines.engines[0].state == "dead"
        engines._ticker.cancel()
        alive.cancel()

    asyncio.run(main())


def test_the_dead_deadline_defaults_past_the_slow_one_and_may_not_precede_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    config = parse_args(["--model", "tiny"])
    assert (config.engine_timeout_s, config.engine_dead_timeout_s) == (2.0, 10.0)
    same = parse_args(["--model", "tiny", "--engine-timeout", "5", "--engine-dead-timeout", "5"])
    assert same.engine_dead_timeout_s == 5  # no slow phase: silent past 5 s is dead, as before
    assert parse_args(["--model", "tiny", "--engine-timeout", "15"]).engine_dead_timeout_s == 75  # follows it
    with pytest.raises(SystemExit):
        parse_args(["--model", "tiny", "--engine-timeout", "5", "--engine-dead-timeout", "4"])
    assert "--engine-dead-timeout=4.0 is invalid: allowed >= --engine-timeout (5.0)" in capsys.readouterr().err
