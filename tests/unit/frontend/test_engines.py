from __future__ import annotations

import asyncio
import time
from typing import Any

from protocol import GenerateRequest, SamplingParams, Stats
from services.frontend.engines import STATS_LAG_S, EngineSet
from services.frontend.stream import Stream


def test_a_dead_socket_thread_fails_every_engine_at_once() -> None:
    async def main() -> None:
        # An address zmq refuses kills the socket thread at its first connect.
        engines = EngineSet(["bogus://nowhere", "tcp://127.0.0.1:1"], frontend_id="t", engine_timeout_s=60,
                            heartbeat_interval_s=1)
        engines.start()
        try:
            async with asyncio.timeout(5):
                while engines.broken is None:
                    await asyncio.sleep(0.01)
            assert "socket thread stopped" in engines.broken and "ZMQError" in engines.broken
            assert {e.state for e in engines.engines} == {"dead"}
            assert all("socket thread stopped" in reason for reason in engines.not_ready().values())
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
        engines.submit(engine, Stream(f"r{i}", 3, 4), request)
    assert engine.sent_since_stats == 3
    # A snapshot arriving right away may predate the three: they stay counted on top of it.
    engines._on_stats(engine, Stats(0, 1, time.time(), running=0, waiting=0, kv_usage=0.0, session_epoch="e1"))
    assert engine.sent_since_stats == 3
    time.sleep(STATS_LAG_S * 2)
    engines._on_stats(engine, Stats(0, 2, time.time(), running=3, waiting=0, kv_usage=0.0, session_epoch="e1"))
    assert engine.sent_since_stats == 0  # a later snapshot counts them itself
    engines._on_stats(engine, Stats(0, 1, time.time(), running=9, waiting=0, kv_usage=0.0, session_epoch="e1"))
    assert engine.stats is not None and engine.stats.seq == 2  # an older snapshot (via PUB) changes nothing
