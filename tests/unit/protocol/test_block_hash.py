from __future__ import annotations

from protocol.block_hash import ROOT, block_hashes, chain, root


def test_full_blocks_only_and_chained() -> None:
    ids = list(range(40))
    hashes = block_hashes(ids, 16)
    assert len(hashes) == 2
    assert hashes[0] == chain(ROOT, ids[:16])
    assert hashes[1] == chain(hashes[0], ids[16:32])


def test_prefix_property() -> None:
    a = block_hashes(list(range(64)), 16)
    b = block_hashes(list(range(48)) + [999] * 16, 16)
    assert a[:3] == b[:3] and a[3] != b[3]


def test_same_block_different_parent_differs() -> None:
    assert chain(1, [5] * 16) != chain(2, [5] * 16)


def test_salt_and_lora_start_separate_chains() -> None:
    ids = list(range(16))
    plain, salted, lora = (block_hashes(ids, 16), block_hashes(ids, 16, salt="t1"),
                           block_hashes(ids, 16, lora="a"))
    assert len({plain[0], salted[0], lora[0]}) == 3
    assert root("t1") != root(None, "t1")
    assert 0 <= chain(ROOT, ids) < 2**64


def test_stable_across_processes() -> None:
    # A literal value: the hash is part of the wire contract, so it must never drift.
    assert chain(ROOT, [1, 2, 3]) == 44643602327473170
