"""Holding back the end of a text that could still begin a tag, so that no half tag is emitted.
Used by every output parser (frontend API-server processes)."""
from __future__ import annotations

from collections.abc import Sequence

__all__ = ["held_suffix"]


def held_suffix(text: str, tags: Sequence[str]) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of one of `tags`.

    Everything before that suffix can be emitted: no tag the parser looks for can start there,
    and the tags themselves are found with str.find before this is asked."""
    longest = min(len(text), max(map(len, tags), default=1) - 1)
    for size in range(longest, 0, -1):
        tail = text[-size:]
        if any(tag.startswith(tail) for tag in tags if len(tag) > size):
            return size
    return 0
