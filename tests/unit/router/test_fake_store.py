"""The unit tests' in-memory store (tests/support/fake_store.py) against the real SQLite store: the same calls
give the same answers, so that a plugin's unit test over the fake says what the router does."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from services.router.config.plugins import StoreConfig
from services.router.plugins.store.base import Item, Store
from services.router.plugins.store.factory import open_store
from tests.support.fake_store import FakeStore

T = TypeVar("T")


def run(work: Awaitable[T]) -> T:
    return asyncio.run(work)  # type: ignore[arg-type]


async def trims(store: Store) -> list[object]:
    """A trim in a scope beside another scope's expired items, then one over the whole kind, with ties."""
    now = time.time()
    await store.open()
    for n in range(4):
        await store.put(Item("memory", "ann", f"a{n}", b"{}", created=float(n)))
    await store.put(Item("memory", "ann", "a-tie", b"{}", created=3.0))  # as new as a3, and put later
    await store.put(Item("memory", "bob", "b-old", b"{}", created=0.5, expires=now - 1))
    await store.put(Item("memory", "bob", "b0", b"{}", created=1.5))
    await store.put(Item("cache", "ann", "c0", b"{}", created=0.0, expires=now - 1))
    seen: list[object] = [await store.trim("memory", "ann", 2)]  # bob's expired one is not ann's to drop
    seen.append([i.key for i in await store.items("memory", "ann", 10)])
    seen.append(await store.trim("memory", None, 2))  # now bob's expired one goes, and his b0 (the oldest)
    seen.append([i.key for scope in ("ann", "bob") for i in await store.items("memory", scope, 10)])
    seen.append(await store.trim("cache", None, 10))  # another kind's expired item: only now
    await store.close()
    return seen


def test_trim_drops_the_expired_and_the_oldest_within_the_scope_only_as_sqlite_does(tmp_path: Path) -> None:
    sqlite = run(trims(open_store(StoreConfig(backend="sqlite", path=str(tmp_path / "state.db")))))
    assert sqlite == [3, ["a-tie", "a3"], 2, ["a-tie", "a3"], 1]  # of equal times, the later put is newer
    assert run(trims(FakeStore())) == sqlite
