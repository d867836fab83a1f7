"""The frame every output parser shares (frontend API-server processes): text that cannot be emitted
yet waits in a buffer, and the end of a text that could still begin a tag is held back, so that no
half tag is emitted."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from services.frontend.parsers.delta import ParsedDelta

__all__ = ["BufferedParser", "held_suffix"]


class BufferedParser(ABC):
    """`push` appends the text to `_buf` and runs `_step` until it returns False; `flush` does the
    same with `final` set. A subclass's `_step` advances its state and emits into `out`."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = ""  # text received and not yet emitted or consumed

    def push(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buf += text
        while self._step(out, final=False):
            pass
        return out

    def flush(self) -> ParsedDelta:
        out = ParsedDelta()
        while self._step(out, final=True):
            pass
        return out

    @abstractmethod
    def _step(self, out: ParsedDelta, *, final: bool) -> bool:
        """Advance; False when more text is needed (or, at flush, all is done)."""


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
