"""The KvEvents service and its source: every rank's KV events as this frontend receives them (the engines'
PUB sockets), numbered in one gapless sequence, kept in a bounded ring so a subscriber that comes back
resumes where it left off, and a snapshot (from the frontend's own KV indexes) for one that cannot.

Events are kept only once someone has subscribed (a frontend nobody subscribes to pays nothing per
event but the call), as the protocol's structs, and become messages only for a subscriber. A rank
whose engine restarts (a new session epoch), dies, or whose event sequence had a gap (the frontend's
index of it was dropped) gets a `cleared` event: what a subscriber held for it is gone.
"""
from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc

from protocol import AllCleared, BlockRemoved, BlockStored
from protocol.grpc import pb2, pb2_grpc

KEEP_EVENTS = 100_000  # the ring: a subscriber this far behind starts over from a snapshot

# (rank, epoch, blocks it holds, block size) of each ready rank, for a snapshot.
Snapshot = Callable[[], Iterable[tuple[int, str, set[int], int]]]
# seq, rank, epoch, event (None: the rank's blocks cleared)
_Event = tuple[int, int, str, "BlockStored | BlockRemoved | AllCleared | None"]


class KvRelay:
    def __init__(self, snapshot: Snapshot, keep: int = KEEP_EVENTS) -> None:
        self._snapshot = snapshot
        self.epoch = os.urandom(8).hex()  # this relay's: its seq means nothing to another process
        self.seq = 0  # the latest event's
        self._ring: deque[_Event] = deque(maxlen=keep)
        self._keeping = False
        self._closed = False
        self._waiters: list[asyncio.Future[None]] = []

    # ---- from the engine links (EngineSet) ----

    def event(self, rank: int, epoch: str, event: BlockStored | BlockRemoved | AllCleared) -> None:
        self._push(rank, epoch, event)

    def cleared(self, rank: int, epoch: str) -> None:
        """Everything `rank` held is gone (restart, death, an event gap)."""
        self._push(rank, epoch, None)

    def _push(self, rank: int, epoch: str, event: BlockStored | BlockRemoved | AllCleared | None) -> None:
        self.seq += 1
        if not self._keeping:
            return
        self._ring.append((self.seq, rank, epoch, event))
        self._wake()

    def close(self) -> None:
        """End every subscription (the process is shutting down: a stream that never ends would hold the
        gRPC server's graceful stop for its whole grace period). Subscribers resume elsewhere or later."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    # ---- to subscribers ----

    async def subscribe(self, after_seq: int, relay_epoch: str) -> AsyncIterator[Any]:
        """KvEvent messages from after `after_seq` (of `relay_epoch`), or from a snapshot when this relay
        no longer holds them; live until the caller stops."""
        self._keeping = True
        ring = self._ring
        cursor: int | None = after_seq
        if relay_epoch != self.epoch or not self._holds_after(after_seq):
            cursor = None
        while not self._closed:
            if cursor is None:
                cursor = self.seq
                for event in self._snapshot_events(cursor):
                    yield event
            if cursor < self.seq:
                if not self._holds_after(cursor):
                    cursor = None  # fell behind the ring: start over
                    continue
                start = cursor + 1 - ring[0][0]
                # A batch at a time, without awaiting between: the ring cannot shift under the index.
                batch = [ring[i] for i in range(start, len(ring))]
                for seq, rank, epoch, ev in batch:
                    yield self._message(seq, rank, epoch, ev)
                cursor = batch[-1][0] if batch else cursor
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _holds_after(self, seq: int) -> bool:
        """Every event after `seq` is in the ring (or there are none yet)."""
        if seq > self.seq:
            return False
        if seq == self.seq:
            return True
        return bool(self._ring) and self._ring[0][0] <= seq + 1

    def _snapshot_events(self, seq: int) -> list[Any]:
        out = []
        for rank, epoch, blocks, block_size in self._snapshot():
            out.append(pb2.KvEvent(seq=seq, rank=rank, epoch=epoch, snapshot=True, relay_epoch=self.epoch,
                                   cleared=pb2.AllBlocksCleared()))
            if blocks:
                out.append(pb2.KvEvent(seq=seq, rank=rank, epoch=epoch, snapshot=True, relay_epoch=self.epoch,
                                       stored=pb2.BlocksStored(block_hashes=sorted(blocks), block_size=block_size)))
        return out

    def _message(self, seq: int, rank: int, epoch: str, ev: BlockStored | BlockRemoved | AllCleared | None) -> Any:
        msg = pb2.KvEvent(seq=seq, rank=rank, epoch=epoch, relay_epoch=self.epoch)
        if isinstance(ev, BlockStored):
            stored = msg.stored
            stored.block_hashes.extend(ev.block_hashes)
            if ev.parent_block_hash is not None:
                stored.parent_block_hash = ev.parent_block_hash
            stored.block_size = ev.block_size
            stored.token_ids.extend(ev.token_ids)
            stored.lora_name = ev.lora or ""
        elif isinstance(ev, BlockRemoved):
            msg.removed.block_hashes.extend(ev.block_hashes)
        else:
            msg.cleared.SetInParent()
        return msg


class KvEvents(pb2_grpc.KvEventsServicer):
    def __init__(self, relay: KvRelay) -> None:
        self._relay = relay

    async def Subscribe(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for event in self._relay.subscribe(request.after_seq, request.relay_epoch):
            yield event
