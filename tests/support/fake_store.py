"""An in-memory Store (services/router/plugins/store/base.py's port) for unit tests of the plugins: the
same answers as the real stores (expiry, scopes, cosine order) and the same refusals (their input guard),
no file and no server. `fail` makes every
call raise StoreUnavailable, as a store that is down does."""
from __future__ import annotations

import time
from collections.abc import Sequence

from services.router.plugins.store import guard
from services.router.plugins.store.base import Item, StoreUnavailable


class FakeStore:
    def __init__(self) -> None:
        self.items_by: dict[tuple[str, str, str], Item] = {}
        self.fail = False
        self.calls = 0
        self.clocks: dict[str, int] = {}  # rate limits' (advance), in microseconds as the real stores keep them

    def _check(self) -> None:
        self.calls += 1
        if self.fail:
            raise StoreUnavailable("fake store: down")

    def _live(self, item: Item) -> bool:
        return item.expires is None or item.expires > time.time()

    async def open(self) -> None:
        self._check()

    async def close(self) -> None:
        pass

    async def put(self, item: Item) -> None:
        self._check()
        guard.check_item(item)
        self.items_by[(item.kind, item.scope, item.key)] = item

    async def get(self, kind: str, scope: str, key: str) -> Item | None:
        self._check()
        guard.check_scope(kind, scope)
        guard.check_text("key", key)
        item = self.items_by.get((kind, scope, key))
        return item if item is not None and self._live(item) else None

    async def nearest(self, kind: str, scope: str, vector: tuple[float, ...], k: int,
                      min_similarity: float = -1.0) -> list[tuple[float, Item]]:
        self._check()
        guard.check_scope(kind, scope)
        guard.check_vector("vector", vector)
        guard.check_k(k)
        found = []
        for (kd, sc, _), item in self.items_by.items():
            if kd == kind and sc == scope and item.vector is not None and len(item.vector) == len(vector) \
                    and self._live(item):
                similarity = sum(a * b for a, b in zip(item.vector, vector, strict=True))
                if similarity >= min_similarity:
                    found.append((similarity, item))
        found.sort(key=lambda pair: -pair[0])
        return found[:k]

    def _newest_first(self) -> list[tuple[tuple[str, str, str], Item]]:
        """Every item, newest first; of equal `created`, the one first put later (the real stores order by
        created DESC, id DESC, and a put over a key keeps its id, as a dict keeps a key's place)."""
        return sorted(reversed(self.items_by.items()), key=lambda pair: -pair[1].created)

    async def items(self, kind: str, scope: str, limit: int, offset: int = 0) -> list[Item]:
        self._check()
        mine = [i for (kd, sc, _), i in self._newest_first() if kd == kind and sc == scope and self._live(i)]
        return mine[offset:offset + limit]

    async def delete(self, kind: str, scope: str, key: str | None = None) -> int:
        self._check()
        gone = [k for k in self.items_by if k[0] == kind and k[1] == scope and (key is None or k[2] == key)]
        for k in gone:
            del self.items_by[k]
        return len(gone)

    async def count(self, kind: str, scope: str | None = None) -> int:
        self._check()
        return sum(1 for (kd, sc, _), i in self.items_by.items()
                   if kd == kind and (scope is None or sc == scope) and self._live(i))

    async def trim(self, kind: str, scope: str | None, keep: int) -> int:
        """As the real stores: the expired, then the oldest beyond `keep`, both within the scope only."""
        self._check()

        def mine(k: tuple[str, str, str]) -> bool:
            return k[0] == kind and (scope is None or k[1] == scope)

        gone = [k for k, i in self.items_by.items() if mine(k) and not self._live(i)]
        for k in gone:
            del self.items_by[k]
        ordered = [(k, i) for k, i in self._newest_first() if mine(k)]
        for k, _ in ordered[keep:]:
            del self.items_by[k]
        return len(gone) + max(0, len(ordered) - keep)

    async def advance(self, clocks: Sequence[tuple[str, float]], now: float) -> list[float]:
        self._check()
        guard.check_clocks(clocks, now)
        at = round(now * 1e6)
        out = []
        for name, cost in clocks:
            us = round(cost * 1e6)
            self.clocks[name] = max(self.clocks.get(name, at), at) + us if us >= 0 else self.clocks.get(name, at) + us
            out.append(self.clocks[name] / 1e6)
        return out
