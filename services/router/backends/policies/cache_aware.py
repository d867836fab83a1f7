"""Cache-aware policy (router process), after sgl-router's: an approximate prefix tree of request text
per replica guesses what its prefix cache holds; requests go where their prefix is, else to the
replica caching least, unless in-flight load is imbalanced, then to the least loaded.
"""
from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

from services.router.backends.policies.load import imbalance
from services.router.backends.policies.load import least_loaded as _least_loaded
from services.router.backends.replica import Replica


class _Node:
    __slots__ = ("children", "entry", "label", "last_access", "parent")

    def __init__(self, label: str, parent: _Node | None, now: float) -> None:
        self.label = label  # the edge from the parent; children are keyed by their label's first char
        self.children: dict[str, _Node] = {}
        self.parent = parent  # None for the root and for evicted nodes
        self.last_access = now
        self.entry = -1  # sequence number of this node's live entry in the leaf heap


def _common(label: str, text: str, i: int) -> int:
    """Length of the common prefix of `label` and text[i:], given label[0] == text[i] and that
    label is not wholly a prefix of text[i:]. Gallops then bisects so the C-level compares copy
    about as many characters as match, not the whole label."""
    limit = min(len(label), len(text) - i)
    k, step = 1, 16
    while k < limit:
        end = min(k + step, limit)
        if not text.startswith(label[k:end], i + k):
            lo, hi = k, end - 1  # the answer lies in [k, end - 1]
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if text.startswith(label[k:mid], i + k):
                    lo = mid
                else:
                    hi = mid - 1
            return lo
        k, step = end, step * 2
    return k


class PrefixTree:
    """A radix tree over characters (edges hold whole substrings, so walking a text costs one dict
    lookup and one C compare per edge, not per character), with LRU eviction of leaves: a heap of
    (last access, seq, leaf) with stale entries skipped when popped."""

    def __init__(self, max_chars: int | None = None) -> None:
        self.root = _Node("", None, 0.0)
        self.max_chars = max_chars
        self.size = 0  # characters stored
        self.nodes = 0
        self._heap: list[tuple[float, int, _Node]] = []
        self._seq = 0

    def match(self, text: str) -> int:
        """How many leading characters of `text` the tree holds."""
        node, i, n = self.root, 0, len(text)
        while i < n:
            child = node.children.get(text[i])
            if child is None:
                return i
            if not text.startswith(child.label, i):
                return i + _common(child.label, text, i)
            i += len(child.label)
            node = child
        return i

    def insert(self, text: str, now: float) -> None:
        """Add `text` and mark its path used at `now`; then evict down to `max_chars`."""
        node, i, n = self.root, 0, len(text)
        while i < n:
            child = node.children.get(text[i])
            if child is None:
                leaf = _Node(text[i:], node, now)
                node.children[text[i]] = leaf
                self.size += n - i
                self.nodes += 1
                self._push(leaf)
                break
            label = child.label
            if text.startswith(label, i):
                child.last_access = now
                i += len(label)
                node = child
                continue
            k = _common(label, text, i)
            mid = _Node(label[:k], node, now)  # split the edge where the text leaves it
            node.children[text[i]] = mid
            child.label, child.parent = label[k:], mid
            mid.children[label[k]] = child
            self.nodes += 1
            i += k
            node = mid
        else:
            if node is not self.root and not node.children:
                node.last_access = now
                self._push(node)
        if self.max_chars is not None and self.size > self.max_chars:
            self.evict_to(self.max_chars)

    def evict_older_than(self, deadline: float) -> int:
        """Drop every node last used before `deadline`; the characters freed."""
        freed = 0
        # A parent is touched whenever a child is, so stale subtrees go leaf by leaf from the bottom.
        while self._heap and self._heap[0][0] < deadline:
            freed += self._pop_leaf()
        return freed

    def evict_to(self, max_chars: int) -> int:
        """Drop least recently used leaves until at most `max_chars` remain; the characters freed."""
        freed = 0
        while self.size > max_chars and self._heap:
            freed += self._pop_leaf()
        return freed

    def _push(self, node: _Node) -> None:
        self._seq += 1
        node.entry = self._seq
        heapq.heappush(self._heap, (node.last_access, self._seq, node))
        if len(self._heap) > 2 * self.nodes + 64:
            self._compact()

    def _pop_leaf(self) -> int:
        """Pop one heap entry; remove its node if the entry is live. The characters freed."""
        _, seq, node = heapq.heappop(self._heap)
        if node.entry != seq or node.children or node.parent is None:
            return 0  # stale: touched since, grew children, or already gone
        parent = node.parent
        del parent.children[node.label[0]]
        node.parent = None
        self.size -= len(node.label)
        self.nodes -= 1
        if parent is not self.root and not parent.children:
            self._push(parent)
        return len(node.label)

    def _compact(self) -> None:
        """Rebuild the heap from the live leaves (amortised: runs after ~nodes stale pushes)."""
        heap: list[tuple[float, int, _Node]] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                self._seq += 1
                node.entry = self._seq
                heap.append((node.last_access, self._seq, node))
        heapq.heapify(heap)
        self._heap = heap



class CacheAware:
    """Imbalance is measured in in-flight requests, as sgl-router does, over the candidates the pool
    passes (ready and below its cap). sgl-router's default of 64 could never fire under the
    default cap of 32 requests per replica, so ours is 16."""

    reads_body = False

    def __init__(self, *, cache_threshold: float = 0.5, balance_abs: int = 16, balance_rel: float = 1.5,
                 max_tree_chars: int = 2_000_000, eviction_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold!r}")
        if balance_abs < 0:
            raise ValueError(f"balance_abs must be >= 0, got {balance_abs!r}")
        if balance_rel < 1.0:
            raise ValueError(f"balance_rel must be >= 1, got {balance_rel!r}")
        if max_tree_chars < 1:
            raise ValueError(f"max_tree_chars must be >= 1, got {max_tree_chars!r}")
        if not eviction_s > 0:
            raise ValueError(f"eviction_s must be > 0, got {eviction_s!r}")
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.max_tree_chars = max_tree_chars
        self.eviction_s = eviction_s
        self._clock = clock
        self._trees: dict[str, PrefixTree] = {}
        self.last_reason = ""
        self.last_match = 0.0  # fraction of the latest chosen request's text its replica holds

    async def prepare(self, body: dict[str, Any], size: int) -> None:
        return None

    def choose(self, candidates: list[Replica], request_bytes: int, text: str | None,
               prepared: object = None) -> Replica:
        deadline = self._clock() - self.eviction_s
        for tree in self._trees.values():
            tree.evict_older_than(deadline)
        self.last_match = 0.0
        skew = imbalance(candidates, self.balance_abs, self.balance_rel)
        if skew is not None:
            best = min(candidates, key=_least_loaded)
            self.last_reason = (f"cache_aware: imbalanced (in-flight max {skew[0]}, min {skew[1]}) "
                                f"-> least loaded {best.url}")
            return best
        if not text:
            best = min(candidates, key=_least_loaded)
            self.last_reason = f"cache_aware: no text -> least loaded {best.url}"
            return best
        best, matched = candidates[0], -1
        matches: dict[str, int] = {}
        for r in candidates:
            held = self._trees.get(r.url)
            m = matches[r.url] = held.match(text) if held is not None else 0
            if m > matched or (m == matched and _least_loaded(r) < _least_loaded(best)):
                best, matched = r, m
        rate = matched / len(text)
        if rate > self.cache_threshold:
            self.last_match = rate
            self.last_reason = f"cache_aware: match {rate:.2f} > {self.cache_threshold:.2f} -> {best.url}"
            return best
        best = min(candidates, key=self._cached_then_load)
        self.last_match = matches[best.url] / len(text)
        self.last_reason = (f"cache_aware: best match {rate:.2f} <= {self.cache_threshold:.2f} "
                            f"-> smallest tree {best.url} ({self.cached_chars(best.url)} chars)")
        return best

    def on_assigned(self, replica: Replica, text: str | None, prepared: object = None) -> None:
        # Also when the choice was by load, as sgl-router does: the replica will cache this text.
        if text:
            tree = self._trees.get(replica.url)
            if tree is None:
                tree = self._trees[replica.url] = PrefixTree(self.max_tree_chars)
            tree.insert(text, self._clock())

    def on_removed(self, url: str) -> None:
        self._trees.pop(url, None)

    def cached_chars(self, url: str) -> int:
        tree = self._trees.get(url)
        return tree.size if tree is not None else 0

    def _cached_then_load(self, r: Replica) -> tuple[int, int, int, float]:
        return (self.cached_chars(r.url), *_least_loaded(r))
