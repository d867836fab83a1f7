from __future__ import annotations

from protocol.block_hash import block_hashes
from services.engine.backend import Cleared, Removed, Stored
from services.engine.backends.sim.block_pool import BlockPool

BS = 4


def tokens(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


def cache_request(pool: BlockPool, toks: list[int]) -> tuple[list[int], list[int]]:
    """Allocate blocks for `toks`, register every full block, and return (block ids, hashes)."""
    hashes = block_hashes(toks, BS)
    blocks = pool.allocate(len(hashes))
    assert blocks is not None
    pool.commit(blocks, hashes, 0, len(hashes), toks, None)
    return blocks, hashes


def test_allocate_free_and_usage() -> None:
    pool = BlockPool(8, BS)
    assert pool.usage() == 0.0
    blocks = pool.allocate(6)
    assert blocks is not None and len(set(blocks)) == 6
    assert pool.usage() == 0.75
    assert pool.allocate(3) is None
    assert pool.num_free == 2  # a refused allocation takes nothing
    pool.free(blocks)
    assert pool.usage() == 0.0


def test_commit_emits_stored_with_protocol_hashes_parent_and_tokens() -> None:
    pool = BlockPool(8, BS)
    toks = tokens(100, 3 * BS)
    expected = block_hashes(toks, BS)
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.commit(blocks, expected, 0, 2, toks, None)
    pool.commit(blocks, expected, 2, 3, toks, "adapter")
    assert pool.events == [
        Stored(expected[:2], None, toks[: 2 * BS], None),
        Stored(expected[2:3], expected[1], toks[2 * BS :], "adapter"),
    ]


def test_lookup_finds_longest_cached_prefix_within_limit() -> None:
    pool = BlockPool(8, BS)
    toks = tokens(0, 3 * BS)
    blocks, hashes = cache_request(pool, toks)
    assert pool.lookup(hashes, 10) == blocks
    assert pool.lookup(hashes, 2) == blocks[:2]
    other = block_hashes(toks[:BS] + tokens(500, 2 * BS), BS)
    assert pool.lookup(other, 10) == blocks[:1]  # the chain diverges at the second block
    assert pool.lookup(block_hashes(toks, BS, salt="s"), 10) == []  # a salted chain is separate


def test_duplicate_hash_is_not_registered_twice() -> None:
    pool = BlockPool(8, BS)
    toks = tokens(0, 2 * BS)
    first, hashes = cache_request(pool, toks)
    pool.events.clear()
    second = pool.allocate(2)
    assert second is not None
    pool.commit(second, hashes, 0, 2, toks, None)
    assert pool.events == []
    assert pool.lookup(hashes, 2) == first


def test_lru_eviction_takes_the_longest_free_block_first_and_emits_removed() -> None:
    pool = BlockPool(4, BS)
    a_blocks, a_hashes = cache_request(pool, tokens(0, 2 * BS))
    b_blocks, b_hashes = cache_request(pool, tokens(100, 2 * BS))
    pool.free(a_blocks)  # A's blocks are free first, so they are the oldest
    pool.free(b_blocks)
    pool.events.clear()

    assert pool.allocate(1) == [a_blocks[1]]  # a request's tail goes before its head
    assert pool.events == [Removed([a_hashes[1]])]
    assert pool.allocate(1) == [a_blocks[0]]
    assert pool.events[-1] == Removed([a_hashes[0]])
    assert pool.lookup(a_hashes, 2) == []
    assert pool.lookup(b_hashes, 2) == b_blocks


def test_touched_cached_block_is_not_evicted() -> None:
    pool = BlockPool(3, BS)
    blocks, hashes = cache_request(pool, tokens(0, 2 * BS))
    pool.free(blocks)
    pool.touch(pool.lookup(hashes, 1))  # a cache hit on the oldest free block
    assert pool.num_free_among(blocks) == 1
    assert pool.allocate(2) == [2, blocks[1]]  # never-used block 2 was free longest
    assert pool.allocate(1) is None
    assert pool.lookup(hashes, 2) == blocks[:1]


def test_reset_refused_while_in_use_then_clears() -> None:
    pool = BlockPool(4, BS)
    blocks, hashes = cache_request(pool, tokens(0, 2 * BS))
    pool.events.clear()
    assert pool.reset() is False
    assert pool.events == [] and pool.lookup(hashes, 2) == blocks
    pool.free(blocks)
    assert pool.reset() is True
    assert pool.events == [Cleared()]
    assert pool.lookup(hashes, 2) == [] and pool.num_cached == 0
    pool.events.clear()
    assert len(pool.allocate(4) or []) == 4
    assert pool.events == []  # cleared blocks carry no hash left to remove
