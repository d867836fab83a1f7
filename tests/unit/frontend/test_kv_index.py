from __future__ import annotations

from protocol import AllCleared, BlockRemoved, BlockStored
from services.frontend.engine_client.kv_index import KVIndex


def test_stored_removed_cleared() -> None:
    kv = KVIndex(0)
    kv.apply(BlockStored(0, 1, [1, 2, 3], None, 16))
    assert kv.cached_blocks([1, 2, 3, 4]) == 3
    kv.apply(BlockRemoved(0, 2, [2]))
    assert kv.cached_blocks([1, 2, 3]) == 1  # a prefix stops at the first missing block
    kv.apply(AllCleared(0, 3))
    assert kv.cached_blocks([1]) == 0


def test_a_gap_in_sequence_numbers_drops_the_index() -> None:
    kv = KVIndex(0)
    kv.apply(BlockStored(0, 1, [1, 2], None, 16))
    kv.apply(BlockStored(0, 3, [7], None, 16))  # seq 2 was lost
    assert kv.cached_blocks([1, 2]) == 0 and kv.cached_blocks([7]) == 1
