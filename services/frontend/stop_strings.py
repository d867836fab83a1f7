"""Stop-string matching on a request's streamed text: holds back what could still begin a stop
string and cuts the output where one completes. Runs in every frontend API-server process."""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["StopChecker"]


class StopChecker:
    """Feed text deltas in order; get back the text safe to emit and the stop string that matched.

    The match is the first stop string to be complete as the text grows (earliest end; at the
    same end the longest wins), so the output does not depend on how the text was split into
    deltas. The stop string and everything after it are never emitted, unless
    ``include_stop_str_in_output`` (then the stop string is, and nothing after it). After a match
    push() returns ("", matched) and flush() returns "".
    """

    __slots__ = ("_hold", "_include", "_matched", "_partial", "_stops", "_tail")

    def __init__(self, stops: Sequence[str], *, include_stop_str_in_output: bool = False) -> None:
        for i, stop in enumerate(stops):
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop[{i}]: expected a non-empty string, got {stop!r}")
        unique = dict.fromkeys(stops)  # duplicates would only cost time
        self._stops = tuple((stop, len(stop)) for stop in unique)
        # A held tail is a proper prefix of a stop: at most this long.
        self._hold = max(map(len, unique), default=1) - 1
        # Matches "the text ends with a proper prefix of some stop"; searching from the leftmost
        # candidate position finds the longest such tail. None when no stop has a proper prefix.
        prefixes = {stop[:n] for stop in unique for n in range(1, len(stop))}
        self._partial = (re.compile("(?:" + "|".join(map(re.escape, sorted(prefixes))) + r")\Z")
                         if prefixes else None)
        self._include = include_stop_str_in_output
        # The end of the text that could still begin a stop string: held back from the output
        # unless include_stop_str_in_output, where it has been emitted and is only search context.
        self._tail = ""
        self._matched: str | None = None

    @property
    def matched(self) -> str | None:
        """The stop string that ended the text, or None."""
        return self._matched

    def push(self, delta: str) -> tuple[str, str | None]:
        """Add the next text; return (text to emit now, the stop string if one just matched)."""
        if self._matched is not None:
            return "", self._matched
        if not delta or not self._stops:
            return delta, None
        tail = self._tail
        held = len(tail)
        buf = tail + delta if held else delta
        # The tail holds no complete stop, so a match must end inside delta: search from there.
        best: str | None = None
        end = 0
        for stop, size in self._stops:
            start = buf.find(stop, held - size + 1 if held >= size else 0)
            if start >= 0 and (best is None or start + size < end
                               or (start + size == end and size > len(best))):
                best, end = stop, start + size
        if best is not None:
            self._matched = best
            self._tail = ""
            return (buf[held:end] if self._include else buf[:end - len(best)]), best
        size = len(buf)
        found = (None if self._partial is None
                 else self._partial.search(buf, size - self._hold if size > self._hold else 0))
        if found is None:
            self._tail = ""
            return delta if self._include else buf, None
        cut = found.start()
        self._tail = buf[cut:]
        return delta if self._include else buf[:cut], None

    def flush(self) -> str:
        """At finish without a match: return the held-back text."""
        tail = self._tail
        self._tail = ""
        return "" if self._include or self._matched is not None else tail
