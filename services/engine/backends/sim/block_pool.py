"""The sim engine's KV block pool: reference-counted blocks, a prefix cache keyed by chained block
hashes (protocol.block_hash) and LRU eviction of free cached blocks. Runs in the engine process.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from services.engine.backend import Cleared, KVEvent, Removed, Stored


class BlockPool:
    """Blocks are ids 0..num_blocks-1. A free block may still hold a cached hash until it is reused.

    The free queue is ordered least recently freed first; allocation takes from its head, so the
    cached block that has been unused longest is evicted first (vLLM's policy).
    """

    __slots__ = ("num_blocks", "block_size", "_ref", "_hash", "_free", "_cached", "events")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        # OrderedDict as an O(1) LRU queue: del for cache hits, popitem(last=False) for allocation.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self.events: list[KVEvent] = []  # drained by the backend once per step

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take, cached-but-free ones included."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of `hashes`, at most `max_blocks` of them."""
        cached = self._cached
        hit: list[int] = []
        for i in range(min(max_blocks, len(hashes))):
            block = cached.get(hashes[i])
            if block is None:
                break
            hit.append(block)
        return hit

    def num_free_among(self, block_ids: Sequence[int]) -> int:
        """How many of these blocks sit in the free queue (touching them takes them out of it)."""
        ref = self._ref
        return sum(1 for b in block_ids if ref[b] == 0)

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on cache-hit blocks; a free one leaves the eviction queue."""
        ref, free = self._ref, self._free
        for b in block_ids:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """n fresh blocks, evicting cached free ones oldest first; None if fewer than n are free."""
        free = self._free
        if n > len(free):
            return None
        ref, hashes, cached = self._ref, self._hash, self._cached
        out = []
        evicted: list[int] | None = None
        for _ in range(n):
            b = free.popitem(last=False)[0]
            h = hashes[b]
            if h is not None:
                hashes[b] = None
                del cached[h]
                if evicted is None:
                    evicted = []
                evicted.append(h)
            ref[b] = 1
            out.append(b)
        if evicted is not None:
            self.events.append(Removed(evicted))
        return out

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference each. Tail blocks are queued first so they are evicted first (vLLM):
        a later request is more likely to share a prompt's head than its tail."""
        ref, free = self._ref, self._free
        for b in reversed(block_ids):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None

    def commit(
        self,
        block_ids: list[int],
        hashes: list[int],
        start: int,
        end: int,
        token_ids: list[int],
        lora: str | None,
    ) -> None:
        """Register a request's newly full blocks [start, end) in the cache and emit Stored events.

        A hash already cached in another block (two requests computed the same prefix at once) is
        not registered twice; events stay consistent because the next run's parent is that hash.
        """
        cached, block_hash = self._cached, self._hash
        if end - start == 1:  # the common case, once per block_size decode steps: skip the run logic
            h = hashes[start]
            if h not in cached:
                cached[h] = block_ids[start]
                block_hash[block_ids[start]] = h
                self._stored(hashes, start, end, token_ids, lora)
            return
        run_start = -1
        for i in range(start, end):
            h = hashes[i]
            if h in cached:
                if run_start >= 0:
                    self._stored(hashes, run_start, i, token_ids, lora)
                    run_start = -1
                continue
            b = block_ids[i]
            cached[h] = b
            block_hash[b] = h
            if run_start < 0:
                run_start = i
        if run_start >= 0:
            self._stored(hashes, run_start, end, token_ids, lora)

    def _stored(
        self, hashes: list[int], start: int, end: int, token_ids: list[int], lora: str | None
    ) -> None:
        bs = self.block_size
        # The first block of a chain has no parent block (vLLM sends None too), salted or not.
        parent = hashes[start - 1] if start > 0 else None
        self.events.append(
            Stored(hashes[start:end], parent, token_ids[start * bs : end * bs], lora)
        )

    def reset(self) -> bool:
        """Forget every cached hash; refused (False) while any block is referenced."""
        if len(self._free) != self.num_blocks:
            return False
        block_hash = self._hash
        for b in self._cached.values():
            block_hash[b] = None
        self._cached.clear()
        self.events.append(Cleared())
        return True
