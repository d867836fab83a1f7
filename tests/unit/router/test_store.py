"""The plugins' two stores (services/router/plugins/store/): one conformance suite run on SQLite (a file per test)
and on a real PostgreSQL with pgvector (pgserver, one server for the module, a database per test), then
what only a server can do: be unreachable, die and come back."""
from __future__ import annotations

import asyncio
import math
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import apsw
import asyncpg
import pytest

from services.router.config.plugins import StoreConfig
from services.router.plugins.store.base import SCHEMA_VERSION, Item, SchemaError, Store, StoreUnavailable
from services.router.plugins.store.factory import open_store
from services.router.plugins.store.postgres import PostgresStore
from services.router.plugins.store.sqlite import SqliteStore
from tests.support.postgres import Server, running

T = TypeVar("T")
BACKENDS = ("sqlite", "postgres")


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def unit(*xs: float) -> tuple[float, ...]:
    norm = math.sqrt(sum(x * x for x in xs))
    return tuple(x / norm for x in xs)


def near(a: tuple[float, ...] | None, b: tuple[float, ...]) -> bool:
    """Both stores keep 32-bit components."""
    return a is not None and len(a) == len(b) and all(abs(x - y) < 1e-6 for x, y in zip(a, b, strict=True))


def item(scope: str, key: str, vector: tuple[float, ...] | None = None, *, kind: str = "cache",
         payload: bytes = b"{}", created: float = 1.0, expires: float | None = None) -> Item:
    return Item(kind, scope, key, payload, vector, created, expires)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running("store-pg-") as pg:
        yield pg


class Place:
    """Where one test's store lives: a fresh SQLite file, or a fresh database on the module's server; with
    what a test does to it from outside (another connection)."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config

    def store(self, timeout_s: float = 10.0) -> Store:
        return open_store(replace(self.config, timeout_s=timeout_s))

    async def opened(self, timeout_s: float = 10.0) -> Store:
        store = self.store(timeout_s)
        await store.open()
        return store

    async def set_version(self, version: int) -> None:
        if self.config.backend == "sqlite":
            db = apsw.Connection(self.config.path)
            db.execute("UPDATE router_schema SET version = ?", (version,))
            db.close()
        else:
            conn = await asyncpg.connect(self.config.dsn)
            await conn.execute("UPDATE router_schema SET version = $1", version)
            await conn.close()

    @asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """Another connection holds the store's table: SQLite's write lock, or PostgreSQL's ACCESS EXCLUSIVE."""
        if self.config.backend == "sqlite":
            db = apsw.Connection(self.config.path)
            db.execute("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                db.execute("ROLLBACK")
                db.close()
        else:
            conn = await asyncpg.connect(self.config.dsn)
            try:
                async with conn.transaction():
                    await conn.execute("LOCK TABLE router_items IN ACCESS EXCLUSIVE MODE")
                    yield
            finally:
                await conn.close()


@pytest.fixture(params=BACKENDS)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "sqlite":
        return Place(StoreConfig(backend="sqlite", path=str(tmp_path / "state.db")))
    server: Server = request.getfixturevalue("server")
    return Place(StoreConfig(backend="postgres", dsn=server.new_database()))


def test_the_factory_builds_the_configured_backend(tmp_path: Path) -> None:
    assert isinstance(open_store(StoreConfig(path=str(tmp_path / "a.db"))), SqliteStore)
    assert isinstance(open_store(StoreConfig(backend="postgres", dsn="postgresql://h/db")), PostgresStore)
    with pytest.raises(ValueError, match="store.dsn"):
        open_store(StoreConfig(backend="postgres"))
    with pytest.raises(ValueError, match="store.backend: 'redis' is not one of sqlite, postgres"):
        open_store(StoreConfig(backend="redis"))


def test_an_item_comes_back_as_it_was_put_with_any_unicode_and_a_1_mib_payload(place: Place) -> None:
    async def body() -> None:
        store = await place.opened()
        payload = os.urandom(1 << 20)
        expires = time.time() + 3600
        keys = ["🙂", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0010fffd", "e\u0301", "é", "\u200b", " ", "", "𓀀" * 16_000]  # the last: 64,000 bytes
        scope = "tenant 🧪/用户/\U0001f9ea"
        for n, key in enumerate(keys):
            await store.put(item(scope, key, unit(1, n, 2), payload=payload + key.encode(), created=n,
                                 expires=expires))
        for n, key in enumerate(keys):
            got = await store.get("cache", scope, key)
            assert got is not None and got.key == key and got.scope == scope and got.kind == "cache"
            assert got.payload == payload + key.encode()  # "e\u0301" and "é" are two keys, not one
            assert near(got.vector, unit(1, n, 2)) and got.created == n and got.expires == expires
        assert await store.count("cache", scope) == len(keys)
        # The same scope and key under another kind, and a scope that differs by one character, are apart.
        await store.put(item(scope, "🙂", kind="memory", payload=b"memory"))
        assert (await store.get("cache", scope, "🙂")).payload == payload + "🙂".encode()  # type: ignore[union-attr]
        assert await store.get("cache", scope + " ", "🙂") is None
        assert await store.get("cache", scope, "missing") is None
        await store.close()

    run(body())


def test_put_replaces_the_item_of_the_same_key_vector_and_dimension_count_included(place: Place) -> None:
    async def body() -> None:
        store = await place.opened()
        await store.put(item("s", "k", unit(1, 0, 0), payload=b"first", created=1))
        await store.put(item("s", "k", unit(0, 1, 0, 0), payload=b"second", created=2))
        got = await store.get("cache", "s", "k")
        assert got is not None and got.payload == b"second" and near(got.vector, unit(0, 1, 0, 0))
        assert await store.count("cache", "s") == 1
        assert await store.nearest("cache", "s", unit(1, 0, 0), 5) == []  # the old 3-dimensional vector went
        assert [i.payload for _, i in await store.nearest("cache", "s", unit(0, 1, 0, 0), 5)] == [b"second"]
        await store.put(item("s", "k", None, payload=b"third", created=3))
        assert await store.nearest("cache", "s", unit(0, 1, 0, 0), 5) == []
        assert (await store.get("cache", "s", "k")).vector is None  # type: ignore[union-attr]
        await store.close()

    run(body())


def test_an_expired_item_is_never_returned_and_never_hides_a_live_one(place: Place) -> None:
    async def body() -> None:
        store = await place.opened()
        now = time.time()
        await store.put(item("s", "old", unit(1, 0), expires=now - 1, created=2))  # the closest, but expired
        await store.put(item("s", "live", unit(1, 1), expires=now + 3600, created=1))
        await store.put(item("s", "forever", unit(0, 1), created=0))
        assert await store.get("cache", "s", "old") is None
        assert [i.key for _, i in await store.nearest("cache", "s", unit(1, 0), 1)] == ["live"]
        assert [i.key for i in await store.items("cache", "s", 10)] == ["live", "forever"]
        assert await store.count("cache", "s") == 2 and await store.count("cache") == 2
        await store.close()

    run(body())


def test_nearest_is_most_similar_first_within_k_and_the_threshold(place: Place) -> None:
    async def body() -> None:
        store = await place.opened()
        query = unit(1, 0, 0)
        for key, vector in {"same": query, "close": unit(1, 0.2, 0), "apart": unit(1, 1, 0), "far": unit(0, 1, 0),
                            "opposite": unit(-1, 0, 0), "nothing": None}.items():
            await store.put(item("s", key, vector))
        found = await store.nearest("cache", "s", query, 10)
        assert [i.key for _, i in found] == ["same", "close", "apart", "far", "opposite"]
        assert [round(s, 4) for s, _ in found] == [1.0, round(1 / math.sqrt(1.04), 4), round(1 / math.sqrt(2), 4),
                                                   0.0, -1.0]
        assert [i.key for _, i in await store.nearest("cache", "s", query, 2)] == ["same", "close"]
        assert [i.key for _, i in await store.nearest("cache", "s", query, 10, min_similarity=0.7)] == \
            ["same", "close", "apart"]
        assert await store.nearest("cache", "s", unit(0, 0, 1), 10, min_similarity=0.5) == []
        assert await store.nearest("cache", "nobody", query, 10) == []
        assert await store.nearest("cache", "s", unit(1, 0), 10) == []  # no 2-dimensional vector in the scope
        await store.close()

    run(body())


def test_nearest_finds_a_scopes_items_when_other_scopes_hold_many_closer_vectors(place: Place) -> None:
    """An index that filters after its search would answer scope "mine" with nothing: the 600 closest
    vectors to the query are all another tenant's, in the same kind, and the same scope name in another kind."""
    async def body() -> None:
        store = await place.opened()
        rng = random.Random(7)
        query = unit(*([1.0] + [0.0] * 15))
        for n in range(300):
            close = unit(*([1.0] + [rng.uniform(-0.01, 0.01) for _ in range(15)]))
            await store.put(item("theirs", f"t{n}", close))
            await store.put(item("mine", f"m{n}", close, kind="memory"))
        mine = [unit(*([0.5 + n / 10] + [rng.uniform(-1, 1) for _ in range(15)])) for n in range(3)]
        for n, vector in enumerate(mine):
            await store.put(item("mine", f"mine{n}", vector))
        found = await store.nearest("cache", "mine", query, 10)
        assert sorted(i.key for _, i in found) == ["mine0", "mine1", "mine2"]
        assert all(i.scope == "mine" and i.kind == "cache" for _, i in found)
        assert [round(s, 5) for s, _ in found] == sorted((round(v[0], 5) for v in mine), reverse=True)
        assert {i.scope for _, i in await store.nearest("cache", "theirs", query, 400)} == {"theirs"}
        await store.close()

    run(body())


def test_vectors_of_different_dimension_counts_live_side_by_side(place: Place) -> None:
    async def body() -> None:
        store = await place.opened()
        await store.put(item("s", "three", unit(1, 2, 3)))
        await store.put(item("s", "five", unit(1, 2, 3, 4, 5)))
        await store.put(item("s", "384", unit(*range(1, 385))))
        assert [i.key for _, i in await store.nearest("cache", "s", unit(1, 2, 3), 10)] == ["three"]
        assert [i.key for _, i in await store.nearest("cache", "s", unit(5, 4, 3, 2, 1), 10)] == ["five"]
        assert [i.key for _, i in await store.nearest("cache", "s", unit(*range(1, 385)), 10)] == ["384"]
        await store.close()

    run(body())


def test_items_are_newest_first_with_limit_and_offset(place: Place) -> None:
    async def body() -> None:
        store = await place.opened()
        for n in (3, 1, 4, 0, 2):
            await store.put(item("s", f"k{n}", created=100.0 + n))
        await store.put(item("other", "k9", created=500.0))
        assert [i.key for i in await store.items("cache", "s", 10)] == ["k4", "k3", "k2", "k1", "k0"]
        assert [i.key for i in await store.items("cache", "s", 2, offset=1)] == ["k3", "k2"]
        assert await store.items("cache", "s", 10, offset=5) == []
        assert await store.items("cache", "s", 0) == []
        await store.close()

    run(body())


def test_trim_drops_the_expired_then_the_oldest_beyond_keep(place: Place) -> None:
    async def body() -> None:
        store = await place.opened()
        now = time.time()
        for n in range(6):
            await store.put(item("a", f"a{n}", unit(1, n), created=float(n), expires=now - 1 if n == 5 else None))
        for n in range(3):
            await store.put(item("b", f"b{n}", unit(n, 1), created=10.0 + n))
        await store.put(item("a", "memory", kind="memory", created=0.0))
        assert await store.trim("cache", "a", 3) == 3  # a5 (expired, though newest), then a0 and a1
        assert [i.key for i in await store.items("cache", "a", 10)] == ["a4", "a3", "a2"]
        assert {i.key for _, i in await store.nearest("cache", "a", unit(1, 0), 10)} == {"a4", "a3", "a2"}
        assert await store.trim("cache", None, 4) == 2  # the whole kind: a2, a3 are its oldest
        assert [i.key for i in await store.items("cache", "a", 10)] == ["a4"]
        assert [i.key for i in await store.items("cache", "b", 10)] == ["b2", "b1", "b0"]
        assert await store.count("memory") == 1  # another kind is untouched
        assert await store.trim("cache", "nobody", 0) == 0
        assert await store.trim("cache", None, 0) == 4 and await store.count("cache") == 0
        await store.close()

    run(body())


def test_delete_removes_one_item_or_a_whole_scope_and_says_how_many(place: Place) -> None:
    async def body() -> None:
        store = await place.opened()
        for n in range(3):
            await store.put(item("a", f"k{n}", unit(1, n)))
        await store.put(item("b", "k0", unit(1, 0)))
        assert await store.delete("cache", "a", "k1") == 1
        assert await store.delete("cache", "a", "k1") == 0
        assert await store.get("cache", "a", "k1") is None
        assert {i.key for _, i in await store.nearest("cache", "a", unit(1, 1), 10)} == {"k0", "k2"}
        assert await store.delete("cache", "a") == 2
        assert await store.count("cache", "a") == 0 and await store.nearest("cache", "a", unit(1, 0), 10) == []
        assert await store.count("cache", "b") == 1 and await store.get("cache", "b", "k0") is not None
        assert await store.delete("cache", "nobody") == 0
        await store.put(item("a", "again", unit(1, 0)))  # a scope deleted whole can be used again
        assert [i.key for _, i in await store.nearest("cache", "a", unit(1, 0), 10)] == ["again"]
        await store.close()

    run(body())


def test_items_survive_a_restart_of_the_store(place: Place) -> None:
    async def body() -> None:
        store = await place.opened()
        await store.put(item("s", "k", unit(1, 2), payload=b"kept", created=5.0))
        await store.close()
        again = await place.opened()
        got = await again.get("cache", "s", "k")
        assert got is not None and got.payload == b"kept" and near(got.vector, unit(1, 2))
        assert [i.key for _, i in await again.nearest("cache", "s", unit(1, 2), 1)] == ["k"]
        await again.put(item("s", "k2", unit(2, 1)))  # the vector table made before the restart is found again
        assert [i.key for _, i in await again.nearest("cache", "s", unit(2, 1), 2)] == ["k2", "k"]
        await again.close()

    run(body())


def test_two_routers_on_one_store_see_each_others_items(place: Place) -> None:
    async def body() -> None:
        first, second = await place.opened(), await place.opened()
        await first.put(item("shared", "k", unit(1, 2, 3, 4), payload=b"from the first"))  # a dimension count new
        found = await second.nearest("cache", "shared", unit(1, 2, 3, 4), 1)  # to the second, opened before it
        assert [(i.key, i.payload) for _, i in found] == [("k", b"from the first")]
        assert await second.delete("cache", "shared", "k") == 1
        assert await first.get("cache", "shared", "k") is None
        await first.close()
        await second.close()

    run(body())


def test_a_schema_written_by_a_newer_router_is_refused(place: Place) -> None:
    async def body() -> None:
        store = await place.opened()
        await store.put(item("s", "k"))
        await store.close()
        await place.set_version(SCHEMA_VERSION + 1)
        with pytest.raises(SchemaError, match=f"schema version {SCHEMA_VERSION + 1} was written by a newer router"):
            await place.store().open()
        await place.set_version(SCHEMA_VERSION)
        again = await place.opened()
        assert await again.get("cache", "s", "k") is not None
        await again.close()

    run(body())


def test_routers_creating_the_schema_at_once_all_start(place: Place) -> None:
    """PostgreSQL: without the advisory lock, two CREATE EXTENSION / CREATE TABLE at once fail one of them.
    SQLite: two connections turning a new file to WAL at once get SQLITE_BUSY without a wait (seen here about
    once in ten runs of this module before the store retried it)."""
    async def body() -> None:
        stores = [place.store() for _ in range(8)]
        await asyncio.gather(*(s.open() for s in stores))
        await asyncio.gather(*(s.put(item("s", f"k{n}", unit(1, n))) for n, s in enumerate(stores)))
        assert await stores[0].count("cache", "s") == 8
        await asyncio.gather(*(s.close() for s in stores))

    run(body())


def test_rate_limit_clocks_move_on_together_from_now_and_refunds_come_off(place: Place) -> None:
    async def body() -> None:
        store, other = await place.opened(), await place.opened()  # two routers on one store
        now = 1_700_000_000.0
        assert await store.advance([("a", 1.0), ("b", 0.5)], now) == [now + 1, now + 0.5]
        assert await other.advance([("a", 1.0)], now + 0.25) == [now + 2]  # ahead of now: from the clock
        assert await store.advance([("a", -1.5)], now + 0.25) == [now + 0.5]  # a refund: as it is
        assert await other.advance([("b", 0.0)], now + 5) == [now + 5]  # behind now: from now
        assert await store.advance([("c", 1e-6), ("a", 0.0)], now) == [now + 1e-6, now + 0.5]  # to the microsecond
        # Many at once, through both: none lost (each statement is atomic).
        await asyncio.gather(*(s.advance([("x", 0.5), ("y", 1.0)], now) for _ in range(20) for s in (store, other)))
        assert await store.advance([("y", 0.0), ("x", 0.0)], now) == [now + 40, now + 20]
        await store.close()
        await other.close()

    run(body())


def test_spent_clocks_are_swept_and_a_version_1_store_made_before_them_gets_them(place: Place) -> None:
    async def rows(sql: str) -> int:
        if place.config.backend == "sqlite":
            db = apsw.Connection(place.config.path)
            try:
                return int(db.execute(sql).fetchall()[0][0]) if sql.startswith("SELECT") else db.execute(sql) and 0
            finally:
                db.close()
        conn = await asyncpg.connect(place.config.dsn)
        try:
            return int(await conn.fetchval(sql)) if sql.startswith("SELECT") else (await conn.execute(sql)) and 0
        finally:
            await conn.close()

    async def body() -> None:
        store = await place.opened()
        await store.close()
        await rows("DROP TABLE router_clocks")  # as a store made by a router before rate limits
        store = await place.opened()
        assert await rows("SELECT max(version) FROM router_schema") == SCHEMA_VERSION
        now = 1_700_000_000.0
        await store.advance([(f"u{n}", 1.0) for n in range(10)], now)  # the first call sweeps (nothing yet)
        assert await rows("SELECT count(*) FROM router_clocks") == 10
        await store.advance([("late", 1.0)], now + 30)
        assert await rows("SELECT count(*) FROM router_clocks") == 11  # not a minute since the last sweep
        await store.advance([("late", 1.0)], now + 61)
        assert await rows("SELECT count(*) FROM router_clocks") == 1  # the spent ten went
        await store.close()

    run(body())


@pytest.mark.parametrize(("call", "message"), [
    (lambda s: s.put(item("s", "k", (1.0, math.nan))), "vector: every component must be a finite 32-bit float"),
    (lambda s: s.put(item("s", "k", (math.inf, 1.0))), "vector: every component must be a finite 32-bit float"),
    (lambda s: s.put(item("s", "k", (1e39, 1.0))), "vector: every component must be a finite 32-bit float"),
    (lambda s: s.put(item("s", "k", (0.0, 0.0))), "vector: must not be all zeros"),
    (lambda s: s.put(item("s", "k", ())), "vector: 0 dimensions; allowed 1 to 8192"),
    (lambda s: s.put(item("s", "x" * 65_537)), "key: 65537 UTF-8 bytes; at most 65536"),
    (lambda s: s.put(item("🙂" * 16_385, "k")), "scope: 65540 UTF-8 bytes; at most 65536"),
    (lambda s: s.put(item("s", "a\x00b")), "key: must not contain NUL"),
    (lambda s: s.put(item("s", "\ud800")), "key: not encodable as UTF-8"),
    (lambda s: s.put(item("s", "k", kind="blob")), "kind: 'blob' is not one of cache, memory, chunk, file, response"),
    (lambda s: s.put(item("s", "k", expires=math.inf)), "expires: must be finite"),
    (lambda s: s.nearest("cache", "s", (1.0, math.nan), 1), "vector: every component must be a finite"),
    (lambda s: s.nearest("cache", "s", (1.0, 0.0), 0), "k: 0; allowed 1 to 4096"),
    (lambda s: s.nearest("cache", "s", (1.0, 0.0), 4097), "k: 4097; allowed 1 to 4096"),
    (lambda s: s.items("cache", "s", -1), "limit: -1; must be 0 or more"),
    (lambda s: s.trim("cache", None, -1), "keep: -1; must be 0 or more"),
    (lambda s: s.get("cache", "s\x00", "k"), "scope: must not contain NUL"),
    (lambda s: s.advance([("a", 1.0), ("a", 2.0)], 1.0), "clocks.1..name: .a. is given twice"),
    (lambda s: s.advance([("a", math.nan)], 1.0), "clocks.0..cost: nan; a finite number of seconds"),
    (lambda s: s.advance([("a", 1.0)], math.inf), "now: inf; finite unix seconds"),
], ids=["nan", "inf", "float32-overflow", "zeros", "empty", "long-key", "long-scope", "nul", "surrogate", "kind",
        "expires", "query-nan", "k-0", "k-big", "limit", "keep", "get-nul", "clock-twice", "clock-nan", "clock-now"])
def test_bad_input_is_a_value_error_naming_the_field_and_writes_nothing(
        place: Place, call: Callable[[Store], Awaitable[Any]], message: str) -> None:
    async def body() -> None:
        store = await place.opened()
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            await call(store)
        assert await store.count("cache") == 0
        await store.close()

    run(body())


def test_a_call_held_up_by_another_connection_fails_at_its_timeout_without_blocking_the_loop(place: Place) -> None:
    async def body() -> None:
        store = await place.opened(timeout_s=0.3)
        await store.put(item("s", "k"))
        async with place.locked():
            started = time.monotonic()
            call = asyncio.create_task(store.put(item("s", "k2")) if place.config.backend == "sqlite"
                                       else store.get("cache", "s", "k"))
            for _ in range(3):
                await asyncio.sleep(0)  # run the call up to its wait: were it on this loop, it would be done here
            assert not call.done()
            with pytest.raises(StoreUnavailable, match=r"store (put|get) .*no answer within timeout_s=0\.3"):
                await call
            assert time.monotonic() - started < 5.0  # the test's own limit is far above
        await store.put(item("s", "k3"))  # the lock gone, the same store answers again
        assert await store.count("cache", "s") == 2
        await store.close()

    run(body())


def test_a_store_that_cannot_be_reached_at_open_says_where_and_never_the_password(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again at once: nothing listens there
    store = open_store(StoreConfig(backend="postgres", dsn=f"postgresql://router:s3cret@127.0.0.1:{port}/db",
                                   timeout_s=0.5))
    with pytest.raises(StoreUnavailable, match=f"postgres store open \\(127.0.0.1:{port}\\)") as raised:
        run(store.open())
    assert "s3cret" not in str(raised.value)
    missing = tmp_path / "no-such-folder" / "state.db"
    with pytest.raises(StoreUnavailable, match=f"sqlite store open \\({missing}\\)"):
        run(open_store(StoreConfig(path=str(missing))).open())
    with pytest.raises(StoreUnavailable, match="not open"):
        run(open_store(StoreConfig(path=str(tmp_path / "x.db"))).count("cache"))


def test_a_server_that_dies_makes_calls_fail_and_the_store_recovers_when_it_is_back(server: Server) -> None:
    place = Place(StoreConfig(backend="postgres", dsn=server.new_database()))

    async def body() -> None:
        store = await place.opened(timeout_s=2.0)
        await store.put(item("s", "k", unit(1, 0)))
        server.stop()
        try:
            for _ in range(2):  # the pooled connection found dead, then no server to connect to
                with pytest.raises(StoreUnavailable, match=f"postgres store get \\({server.socket_dir}\\)"):
                    await store.get("cache", "s", "k")
        finally:
            server.start()
        got = await store.get("cache", "s", "k")
        assert got is not None and got.key == "k"
        await store.put(item("s", "k2", unit(0, 1)))
        assert await store.count("cache", "s") == 2
        await store.close()

    run(body())
