"""Which prefix blocks each engine holds, from its KV events; scores a request's cached prefix.

A gap in an engine's event sequence means we missed events: the index for that engine is dropped
rather than trusted (stale hits would route work to an engine that no longer has the blocks).
"""
from __future__ import annotations

import logging

from protocol import AllCleared, BlockRemoved, BlockStored

log = logging.getLogger(__name__)


class KVIndex:
    __slots__ = ("blocks", "last_seq", "rank")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.blocks: set[int] = set()
        self.last_seq = 0

    def apply(self, event: BlockStored | BlockRemoved | AllCleared) -> bool:
        """Apply one event; True when a gap before it dropped what the index held."""
        gap = bool(self.last_seq) and event.seq != self.last_seq + 1
        if gap:
            log.warning("rank %d: KV event gap (%d -> %d); prefix index reset", self.rank,
                        self.last_seq, event.seq)
            self.blocks.clear()
        self.last_seq = event.seq
        if isinstance(event, BlockStored):
            self.blocks.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            self.blocks.difference_update(event.block_hashes)
        else:
            self.blocks.clear()
        return gap

    def reset(self) -> None:
        self.blocks.clear()
        self.last_seq = 0

    def cached_blocks(self, hashes: list[int]) -> int:
        """How many leading blocks of a request (by chained hash) this engine holds."""
        n = 0
        blocks = self.blocks
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n
