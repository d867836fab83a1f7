"""Stop-string matching on a request's streamed text: holds back what could still begin a stop
string and cuts the output where one completes. Runs in every frontend API-server process."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

__all__ = ["MAX_STOP_CHARS", "MAX_STOP_STRINGS", "StopChecker"]

# A request's limits (requests/openai_schema.py answers a 400 naming `stop` past them). Preparing the matcher costs
# time and memory in proportion to the characters of all stop strings together (about 0.5 us and 16
# bytes each), and matching costs the same per streamed character however many strings there are.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 16384


class _Automaton:
    """An Aho-Corasick automaton over the stop strings: reading text one character at a time, its
    state is the longest end of the text that is a prefix of some stop string, and it says, at each
    character, the longest stop string ending there. Linear in the stop strings' characters to build
    and in the text's to run.

    The trie is built from the strings in sorted order, which gives every inner node its first child
    at the next node id: a node is a character of `_label` and a few ints, and only a node with more
    than one child holds a dict (`_more`, at most one per string), so a 16k-character list stays small.
    """

    __slots__ = ("_depth", "_fail", "_label", "_more", "_root", "found", "starts", "stops")

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = sorted(set(stops))  # duplicates would only cost time
        labels = ["\0"]  # the root's: never compared
        depth = array("i", [0])
        more: dict[int, dict[str, int]] = {}
        ends: dict[int, int] = {}  # node -> index of the stop string that ends there
        path = array("i", [0])  # node ids along the previous string, by depth
        prev = ""
        for index, stop in enumerate(self.stops):
            lcp = _common_prefix_len(prev, stop)
            first = len(depth)
            if lcp < len(prev):  # a sibling; otherwise `prev` ended at its parent, the node before it
                more.setdefault(path[lcp], {})[stop[lcp]] = first
            labels.append(stop[lcp:])
            depth.extend(range(lcp + 1, len(stop) + 1))
            del path[lcp + 1:]
            path.extend(range(first, len(depth)))
            ends[len(depth) - 1] = index
            prev = stop
        depth.append(-2)  # a sentinel after the last node: never a child
        self._label, self._depth, self._more = "".join(labels) + "\0", depth, more
        self._root = {self._label[1]: 1, **more.get(0, {})}
        self.starts = frozenset(self._root)
        # Breadth first, so a node's failure link (the state for its longest proper suffix) is known
        # before its children's; `found` is the longest stop ending at a node, through those links.
        size = len(depth) - 1
        fail = self._fail = array("i", [0]) * size
        found = self.found = array("i", [-1]) * size
        label, step = self._label, self.step
        queue = list(self._root.values())
        for node in queue:
            found[node] = ends.get(node, -1)
        for node in queue:  # grows as it is read
            if depth[node + 1] != depth[node] + 1:
                continue  # a leaf: a node with children has its first one next
            kids = (node + 1, *more[node].values()) if node in more else (node + 1,)
            for child in kids:
                link = fail[child] = step(fail[node], label[child])
                found[child] = ends.get(child, found[link])
            queue.extend(kids)

    def step(self, state: int, char: str) -> int:
        """The state after reading `char` in `state`."""
        depth, label, more, fail = self._depth, self._label, self._more, self._fail
        while state:
            if label[state + 1] == char and depth[state + 1] == depth[state] + 1:
                return state + 1
            extra = more.get(state)
            if extra is not None and char in extra:
                return extra[char]
            state = fail[state]
        return self._root.get(char, 0)

    def scan(self, state: int, text: str) -> tuple[int, int]:
        """Read `text` from `state`: (the state after it, the index in `text` just past the first
        stop string to complete, or -1). The stop string is then `stops[found[state]]`."""
        if not state and self.starts.isdisjoint(text):  # the common case, at C speed: nothing begins here
            return 0, -1
        depth, label, root, found, step = self._depth, self._label, self._root, self.found, self.step
        for i, char in enumerate(text):
            if label[state + 1] == char and depth[state + 1] == depth[state] + 1:
                state += 1  # along a string: the most frequent step once one has begun
            elif state:
                state = step(state, char)
            else:
                state = root.get(char, 0)
                if not state:
                    continue
            if found[state] >= 0:
                return state, i + 1
        return state, -1

    def depth(self, state: int) -> int:
        """How many characters of the text the state stands for: the held-back length."""
        return self._depth[state]


def _common_prefix_len(a: str, b: str) -> int:
    """By bisection on slices, so two long strings cost C-speed compares, not a Python loop per char."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


class StopChecker:
    """Feed text deltas in order; get back the text safe to emit and the stop string that matched.

    The match is the first stop string to be complete as the text grows (earliest end; at the
    same end the longest wins), so the output does not depend on how the text was split into
    deltas. The stop string and everything after it are never emitted, unless
    ``include_stop_str_in_output`` (then the stop string is, and nothing after it). Held back is only
    the longest end of the text that is a prefix of some stop string. After a match push() returns
    ("", matched) and flush() returns "".

    vLLM's detokenizer searches the new text with ``str.find`` per stop string (the first in list
    order that is found wins) and holds back the longest stop string's length less one; here one
    automaton reads each character once for all the strings, and holds back only what could match.
    """

    __slots__ = ("_automaton", "_include", "_matched", "_state", "_tail")

    def __init__(self, stops: Sequence[str], *, include_stop_str_in_output: bool = False) -> None:
        for i, stop in enumerate(stops):
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop[{i}]: expected a non-empty string, got {stop!r}")
        self._automaton = _Automaton(stops) if stops else None
        self._include = include_stop_str_in_output
        self._state = 0
        # The end of the text that could still begin a stop string, held back from the output
        # (kept empty with include_stop_str_in_output: it has been emitted, the state is the context).
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
        automaton = self._automaton
        if not delta or automaton is None:
            return delta, None
        state, end = automaton.scan(self._state, delta)
        if end >= 0:
            stop = self._matched = automaton.stops[automaton.found[state]]
            if self._include:
                return delta[:end], stop
            text = self._tail + delta[:end]
            self._tail = ""
            return text[:len(text) - len(stop)], stop
        self._state = state
        if self._include:
            return delta, None
        text = self._tail + delta if self._tail else delta
        cut = len(text) - automaton.depth(state)
        self._tail = text[cut:]
        return text[:cut], None

    def flush(self) -> str:
        """At finish without a match: return the held-back text."""
        tail = self._tail
        self._tail, self._state = "", 0
        return tail
