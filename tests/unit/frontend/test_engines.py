from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import zmq

from protocol import GenerateRequest, SamplingParams, Stats
from services.frontend.engine_client import engines as engines_module
from services.frontend.engine_client.engines import STATS_LAG_S, EngineSet
from services.frontend.engine_client.inflight import InFlight


def test_a_dead_socket_thread_fails_every_engine_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_poll(self: zmq.Poller, timeout: int | None = None) -> list[Any]:
        raise RuntimeError("a bug in the socket thread")

    monkeypatch.setattr(zmq.Poller, "poll", broken_poll)

    async def main() -> None:
        engines = EngineSet(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], frontend_id="t", engine_timeout_s=60,
                            heartbeat_interval_s=1)
        engines.start()
        try:
            async with asyncio.timeout(5):
                while engines.broken is None:
                    await asyncio.sleep(0.01)
            assert "socket thread stopped" in engines.broken and "a bug in the socket thread" in engines.broken
            assert {e.state for e in engines.engines} == {"dead"}
            assert all("socket thread stopped" in reason for reason in engines.not_ready().values())
        finally:
            await engines.close()

    asyncio.run(main())


def test_timers_that_stop_on_a_bug_give_the_engines_up_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The handshake and heartbeat timers' task failing is said and fails every engine, as a dead socket
    thread does, rather than leaving a rank that restarts never handshaken again and nothing in the log."""
    def broken_hello(*args: Any) -> Any:
        raise RuntimeError("a bug in the timers")

    monkeypatch.setattr(engines_module, "make_hello", broken_hello)

    async def main() -> None:
        engines = EngineSet(["tcp://127.0.0.1:1"], frontend_id="t", engine_timeout_s=60, heartbeat_interval_s=1)
        engines.start()
        try:
            async with asyncio.timeout(5):
                while engines.broken is None:
                    await asyncio.sleep(0.01)
            assert "engine timers stopped" in engines.broken and "a bug in the timers" in engines.broken
            assert {e.state for e in engines.engines} == {"dead"}
        finally:
            await engines.close()

    asyncio.run(main())


def test_an_address_that_cannot_work_fails_only_its_engine() -> None:
    async def main() -> None:
        engines = EngineSet(["bogus://nowhere", "tcp://127.0.0.1:1"], frontend_id="t", engine_timeout_s=60,
                            heartbeat_interval_s=1)
        engines.start()
        try:
            async with asyncio.timeout(5):
                while engines.engines[0].state != "rejected":
                    await asyncio.sleep(0.01)
            assert "cannot connect to bogus://nowhere" in engines.engines[0].reason
            assert engines.broken is None and engines.engines[1].state == "connecting"
        finally:
            await engines.close()

    asyncio.run(main())


class _Bridge:
    """Stands in for the socket thread: records what would be sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[Any]]] = []

    def send(self, index: int, frames: list[Any]) -> None:
        self.sent.append((index, frames))


def test_requests_sent_just_before_a_stats_snapshot_stay_counted() -> None:
    engines = EngineSet(["tcp://127.0.0.1:1"], frontend_id="t", engine_timeout_s=60, heartbeat_interval_s=1)
    engines._bridge = _Bridge()  # type: ignore[assignment]
    engine = engines.engines[0]
    engine.epoch = "e1"
    for i in range(3):
        request = GenerateRequest(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=4), time.time())
        engines.submit(engine, InFlight(f"r{i}", 3, 4), request)
    assert engine.sent_since_stats == 3
    # A snapshot arriving right away may predate the three: they stay counted on top of it.
    engines._on_stats(engine, Stats(0, 1, time.time(), running=0, waiting=0, kv_usage=0.0, session_epoch="e1"))
    assert engine.sent_since_stats == 3
    time.sleep(STATS_LAG_S * 2)
    engines._on_stats(engine, Stats(0, 2, time.time(), running=3, waiting=0, kv_usage=0.0, session_epoch="e1"))
    assert engine.sent_since_stats == 0  # a later snapshot counts them itself
    # What counts is when the socket thread read a snapshot, not when the busy loop got to it.
    read_at = time.monotonic()
    for i in range(3, 5):
        request = GenerateRequest(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=4), time.time())
        engines.submit(engine, InFlight(f"r{i}", 3, 4), request)
    time.sleep(STATS_LAG_S * 2)
    engines._on_stats(engine, Stats(0, 3, time.time(), running=3, waiting=0, kv_usage=0.0, session_epoch="e1"),
                      read_at)
    assert engine.sent_since_stats == 2
    engines._on_stats(engine, Stats(0, 1, time.time(), running=9, waiting=0, kv_usage=0.0, session_epoch="e1"))
    assert engine.stats is not None and engine.stats.seq == 3  # an older snapshot (via PUB) changes nothing


def test_a_peer_claiming_the_frontend_id_first_does_not_shut_the_frontend_out() -> None:
    """An engine's ROUTER keeps a session under the peer's routing id and ignores a second connection with
    an id it knows. The frontend id is no secret (logs, GetServerInfo), so the routing id is not it: a
    stranger that connects first under the frontend id leaves the frontend's Hello still heard."""
    from protocol import Hello, decode

    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    squatter = ctx.socket(zmq.DEALER)
    squatter.setsockopt(zmq.IDENTITY, b"fe-known")
    squatter.connect(f"tcp://127.0.0.1:{port}")
    squatter.send(b"x")
    assert router.poll(5000) and router.recv_multipart()[0] == b"fe-known"  # the squatter is known first

    async def main() -> None:
        engines = EngineSet([f"tcp://127.0.0.1:{port}"], frontend_id="fe-known", engine_timeout_s=60,
                            heartbeat_interval_s=1)
        engines.start()
        try:
            deadline = time.monotonic() + 10
            while not router.poll(0):
                assert time.monotonic() < deadline, "the frontend's Hello never arrived"
                await asyncio.sleep(0.02)
            identity, *frames = router.recv_multipart()
            assert identity != b"fe-known" and isinstance(decode(frames), Hello)
            assert decode(frames).frontend_id == "fe-known"  # the id it names itself by is unchanged
        finally:
            await engines.close()

    try:
        asyncio.run(main())
    finally:
        squatter.close(0)
        router.close(0)


def test_every_consumer_of_changed_sees_each_change() -> None:
    """wait_ready and the gRPC health task both wait on `changed`: a handshake wakes both, with no recheck
    timer (once, each cleared one shared event and wait_ready looked again only every second)."""
    from protocol import Ready

    async def main() -> None:
        engines = EngineSet(["tcp://127.0.0.1:1"], frontend_id="t", engine_timeout_s=60, heartbeat_interval_s=1)
        loop = asyncio.get_running_loop()
        other = loop.create_task(asyncio.wait_for(engines.changed.wait(), 30))  # the other consumer
        waiting = loop.create_task(engines.wait_ready(30))
        await asyncio.sleep(0)  # wait_ready has looked and scheduled its wait, which has not run yet
        engine = engines.engines[0]
        engines._on_ready(engine, Ready(0, "m", 64, 16, 10, "sim", "t", "epoch"), time.monotonic())
        again = loop.create_task(asyncio.wait_for(engines.changed.wait(), 30))  # the other re-arms at once
        for _ in range(10):  # a few turns of the loop, far less than any timer
            await asyncio.sleep(0)
        assert waiting.done() and other.done()
        await waiting
        again.cancel()

    asyncio.run(main())
