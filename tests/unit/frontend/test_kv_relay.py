"""KvRelay (KvEvents.Subscribe's source): gapless numbering, resume after a seq it holds, and a snapshot
for a subscriber it cannot resume (another relay epoch, a seq it no longer holds, or one that fell
behind its ring)."""
from __future__ import annotations

import asyncio
from typing import Any

from protocol import AllCleared, BlockRemoved, BlockStored
from services.frontend.grpc_api.kv_relay import KvRelay

HELD = {0: {11, 12}, 1: set()}


def _relay(keep: int = 100) -> KvRelay:
    return KvRelay(lambda: [(rank, f"ep{rank}", blocks, 16) for rank, blocks in HELD.items()], keep=keep)


def _stored(seq: int, *hashes: int) -> BlockStored:
    return BlockStored(0, seq, list(hashes), None, 16, [], None)


async def _take(agen: Any, n: int) -> list[Any]:
    return [await asyncio.wait_for(agen.__anext__(), 1.0) for _ in range(n)]


def _kind(ev: Any) -> str:
    return str(ev.WhichOneof("event"))


def test_a_first_subscriber_gets_a_snapshot_then_live_events_in_order() -> None:
    async def run() -> None:
        relay = _relay()
        relay.event(0, "ep0", _stored(1, 99))  # before anyone subscribed: not kept, but counted
        sub = relay.subscribe(0, "")
        snap = await _take(sub, 3)
        assert [(e.rank, _kind(e), e.snapshot) for e in snap] == [(0, "cleared", True), (0, "stored", True),
                                                                   (1, "cleared", True)]
        assert list(snap[1].stored.block_hashes) == [11, 12] and {e.seq for e in snap} == {1}
        relay.event(0, "ep0", _stored(2, 5, 6))
        relay.event(1, "ep1", BlockRemoved(1, 7, [3]))
        relay.cleared(1, "ep1")
        relay.event(0, "ep0", AllCleared(0, 3))
        live = await _take(sub, 4)
        assert [e.seq for e in live] == [2, 3, 4, 5]
        assert [_kind(e) for e in live] == ["stored", "removed", "cleared", "cleared"]
        assert list(live[0].stored.block_hashes) == [5, 6] and list(live[1].removed.block_hashes) == [3]
        assert all(e.relay_epoch == relay.epoch and not e.snapshot for e in live)
        await sub.aclose()
    asyncio.run(run())


def test_resume_after_a_held_seq_replays_without_a_snapshot() -> None:
    async def run() -> None:
        relay = _relay()
        first = relay.subscribe(0, "")
        await _take(first, 3)
        for seq in range(1, 6):
            relay.event(0, "ep0", _stored(seq, seq))
        got = await _take(first, 5)
        await first.aclose()
        relay.event(0, "ep0", _stored(6, 60))
        again = relay.subscribe(got[2].seq, relay.epoch)
        replay = await _take(again, 3)
        assert [e.seq for e in replay] == [got[2].seq + 1, got[2].seq + 2, got[2].seq + 3]
        assert not any(e.snapshot for e in replay)
        await again.aclose()
    asyncio.run(run())


def test_another_relay_epoch_or_a_seq_not_held_starts_from_a_snapshot() -> None:
    async def run() -> None:
        relay = _relay(keep=4)
        warm = relay.subscribe(0, "")
        await _take(warm, 3)
        for seq in range(1, 10):
            relay.event(0, "ep0", _stored(seq, seq))
        for after, epoch in ((3, "elsewhere"), (1, relay.epoch), (10_000, relay.epoch)):
            sub = relay.subscribe(after, epoch)
            first = await _take(sub, 1)
            assert first[0].snapshot and _kind(first[0]) == "cleared", (after, epoch)
            await sub.aclose()
        await warm.aclose()
    asyncio.run(run())


def test_a_subscriber_that_falls_behind_the_ring_starts_over() -> None:
    async def run() -> None:
        relay = _relay(keep=3)
        sub = relay.subscribe(0, "")
        await _take(sub, 3)
        relay.event(0, "ep0", _stored(1, 1))
        assert (await _take(sub, 1))[0].seq == 1
        for seq in range(2, 12):  # 10 more while it does not read: the ring keeps 3
            relay.event(0, "ep0", _stored(seq, seq))
        again = await _take(sub, 1)
        assert again[0].snapshot and again[0].seq == relay.seq
        await sub.aclose()
    asyncio.run(run())
