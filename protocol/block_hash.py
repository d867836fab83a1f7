"""Chained prefix-block hashes. Engines publish them in KV events and frontends recompute them from
prompt token ids, so both sides must agree on this one definition (it is part of the protocol).
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence
from hashlib import blake2b

# The parent of a request's first block: salted requests (cache_salt, LoRA) start a separate chain.
ROOT = 0


def root(salt: str | None = None, lora: str | None = None) -> int:
    if salt is None and lora is None:
        return ROOT
    key = f"{salt or ''}\x00{lora or ''}".encode()
    return int.from_bytes(blake2b(key, digest_size=8, person=b"fleet-root").digest(), "little")


def chain(parent: int, block_token_ids: Sequence[int]) -> int:
    """Hash of one full block given its parent's hash: a 64-bit unsigned int."""
    h = blake2b(parent.to_bytes(8, "little"), digest_size=8)
    h.update(array("I", block_token_ids).tobytes())
    return int.from_bytes(h.digest(), "little")


def block_hashes(
    token_ids: Sequence[int], block_size: int, *, salt: str | None = None, lora: str | None = None
) -> list[int]:
    """Hashes of every full block of `token_ids`, in order; a trailing partial block has none."""
    parent = root(salt, lora)
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes
