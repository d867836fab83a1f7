from __future__ import annotations

import logging

import pytest

from protocol import BlockStored, Ready, Stats
from services.frontend.engine_client.engines import Engine
from services.frontend.engine_client.placement import DECODE_WEIGHT, NoEngine, Placement


def _engine(rank: int, *, running: int = 0, waiting: int = 0, state: str = "ready", draining: bool = False) -> Engine:
    e = Engine(rank, f"tcp://127.0.0.1:{5555 + rank}", rank)
    e.state = state
    e.ready = Ready(rank, "tiny", 4096, 16, 100, "sim", "0", "ep")
    e.stats = Stats(rank, 1, 0.0, running, waiting, 0.0, draining=draining, session_epoch="ep")
    return e


def _no_hashes(block_size: int) -> list[int]:
    return []


def test_least_loaded_wins() -> None:
    engines = [_engine(0, running=3), _engine(1, running=1)]
    engine, _ = Placement().choose(engines, 100, _no_hashes)
    assert engine.rank == 1


def test_ties_rotate() -> None:
    engines = [_engine(0), _engine(1), _engine(2)]
    p = Placement()
    assert [p.choose(engines, 10, _no_hashes)[0].rank for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_own_requests_sent_since_stats_count() -> None:
    engines = [_engine(0), _engine(1)]
    engines[0].sent_since_stats = 2
    assert Placement().choose(engines, 10, _no_hashes)[0].rank == 1


def test_prefix_cache_overlap_beats_a_little_load() -> None:
    engines = [_engine(0), _engine(1, running=1)]
    hashes = [11, 22, 33, 44, 55, 66]
    engines[1].kv.apply(BlockStored(1, 1, hashes, None, 16))
    engine, cached = Placement().choose(engines, 100, lambda bs: hashes)
    assert engine.rank == 1 and cached == 96  # six blocks of 16
    assert 96 > DECODE_WEIGHT  # why it wins: more cached work than one running request costs


def test_pin_and_its_errors() -> None:
    engines = [_engine(0), _engine(1, running=50)]
    assert Placement().choose(engines, 10, _no_hashes, pinned=1)[0].rank == 1
    with pytest.raises(NoEngine, match="not a rank"):
        Placement().choose(engines, 10, _no_hashes, pinned=5)
    engines[1].state, engines[1].reason = "dead", "no heartbeat for 2.0s"
    with pytest.raises(NoEngine, match="rank 1 .* not available: no heartbeat"):
        Placement().choose(engines, 10, _no_hashes, pinned=1)


def test_dead_and_draining_engines_are_skipped() -> None:
    engines = [_engine(0, state="dead"), _engine(1, draining=True), _engine(2, running=9)]
    assert Placement().choose(engines, 10, _no_hashes)[0].rank == 2
    engines[2].state = "connecting"
    with pytest.raises(NoEngine, match="no engine is ready"):
        Placement().choose(engines, 10, _no_hashes)


def test_each_choice_is_explained_in_one_debug_line(caplog: pytest.LogCaptureFixture) -> None:
    engines = [_engine(0, running=1), _engine(1)]
    with caplog.at_level(logging.DEBUG, logger="services.frontend.engine_client.placement"):
        Placement().choose(engines, 10, _no_hashes, request_id="req-9")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("placed req-9 on rank 1") and "rank 0: 1 req" in line


def test_a_single_engine_or_a_pin_is_picked_without_hashing_the_prompt() -> None:
    """pick(): no prefix-cache lookup where it cannot change the choice (one engine taking requests, or
    a pinned rank), though their KV indexes hold blocks; with two, the cached prefix still decides."""
    hashed: list[int] = []

    def hashes(block_size: int) -> list[int]:
        hashed.append(block_size)
        return [11, 22, 33, 44, 55, 66]

    engines = [_engine(0, state="dead"), _engine(1, running=1), _engine(2)]
    engines[1].kv.apply(BlockStored(1, 1, [11, 22, 33, 44, 55, 66], None, 16))
    engines[2].kv.apply(BlockStored(1, 1, [99], None, 16))
    p = Placement()
    assert p.pick(engines[:2], 100, hashes).rank == 1 and p.pick(engines, 100, hashes, pinned=2).rank == 2
    assert hashed == []
    assert p.pick(engines, 100, hashes).rank == 1  # two live: scored, and rank 1's cached prefix wins
    assert hashed
