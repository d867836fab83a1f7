"""The embedded store (router process): one SQLite file in WAL mode through apsw, vectors in sqlite-vec vec0
tables (one per dimension count), every call run on the store's own thread so the event loop never
blocks, and bounded by timeout_s."""
from __future__ import annotations

import array
import asyncio
import hashlib
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import apsw
import sqlite_vec

from services.router.plugins.store import guard
from services.router.plugins.store.base import SCHEMA_VERSION, Item, SchemaError, StoreUnavailable

T = TypeVar("T")

# A vec0 table is partitioned by a bucket of the scope (its id mod BUCKETS), with the scope id and the expiry
# as metadata columns that vec0 checks during its scan: a query reads one bucket, never the whole table, and
# never returns another scope's item or an expired one. Measured on 100k vectors of 384 (k 10, p50):
#   layout                      1 scope   1,000 scopes   10,000 scopes of 10: size, inserts/s
#   scope id as partition key   44 ms     0.13 ms        261 MB, 4k/s (chunks of 8; of 128 it would be ~2 GB)
#   scope bucket (this)         70-80 ms  0.4 ms         182 MB, 19k/s (chunks of 64; of 128: 207 MB)
#   scope id as metadata only   40-60 ms  32 ms (it scans every scope)
#   a plain table, vec_distance_cosine over an index on the scope: 85-120 ms, 0.1 ms
# A partition by scope is faster for one huge scope, but vec0 gives every partition whole chunks of zeroed
# vectors, so many small scopes (a memory per user) cost a chunk each; buckets bound that to BUCKETS partial
# chunks. bench/store_lookup.py measures the whole store.
BUCKETS = 256
CHUNK = 64
NEVER = math.inf  # a vec0 metadata column cannot hold NULL: the expiry of an item that never expires
MMAP_BYTES = 1 << 30  # a scan reads vec0's chunks from the mapped file, not through the page cache (~1.5x faster)
PROGRESS_STEPS = 1000  # virtual machine steps between two checks of the call's deadline
SWEEP_S = 60.0  # how often `advance` deletes the clocks that hold nothing (not ahead of now)

_TABLES = """
CREATE TABLE IF NOT EXISTS router_scopes (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    scope TEXT NOT NULL,
    UNIQUE (kind, scope));
CREATE TABLE IF NOT EXISTS router_items (
    id INTEGER PRIMARY KEY,  -- the item's rowid in router_vec_<dims> too
    kind TEXT NOT NULL,  -- its scope's, kept here for whole-kind counts and trims
    scope_id INTEGER NOT NULL,
    key TEXT NOT NULL,
    payload BLOB NOT NULL,
    dims INTEGER,  -- NULL: no vector
    created REAL NOT NULL,
    expires REAL,
    UNIQUE (scope_id, key));
CREATE INDEX IF NOT EXISTS router_items_scope_newest ON router_items (scope_id, created, id);
CREATE INDEX IF NOT EXISTS router_items_kind_newest ON router_items (kind, created, id);
CREATE INDEX IF NOT EXISTS router_items_expires ON router_items (kind, expires) WHERE expires IS NOT NULL;
-- Rate limits' clocks (Store.advance), by a digest of their name; created on any open, so a store of
-- schema version 1 made before them gets them too (a table added is no new version: older routers ignore it).
CREATE TABLE IF NOT EXISTS router_clocks (
    name_h BLOB PRIMARY KEY,  -- sha256 of the name
    at INTEGER NOT NULL  -- unix microseconds
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS router_clocks_at ON router_clocks (at);
"""
_ADVANCE = ("INSERT INTO router_clocks (name_h, at) VALUES (:name, :now + :cost) ON CONFLICT (name_h) DO UPDATE "
            "SET at = CASE WHEN :cost >= 0 THEN max(at, :now) + :cost ELSE at + :cost END RETURNING at")
_LIVE = "(expires IS NULL OR expires > ?)"


def _blob(vector: tuple[float, ...]) -> bytes:
    return array.array("f", vector).tobytes()


def _vector(blob: bytes) -> tuple[float, ...]:
    return tuple(array.array("f", blob))


class SqliteStore:
    def __init__(self, path: str, timeout_s: float) -> None:
        self._path = path
        self._timeout_s = timeout_s
        self._pool: ThreadPoolExecutor | None = None
        # Touched only on the store's thread:
        self._db: apsw.Connection | None = None
        self._dims: set[int] = set()  # the dimension counts that have a vec0 table
        self._deadline = 0.0  # of the call running now (time.monotonic())
        self._swept = 0.0  # when `advance` last deleted spent clocks (its `now`)

    # ---- the port (event loop) ----

    async def open(self) -> None:
        if self._pool is not None:
            return
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-sqlite")
        try:
            await self._call("open", self._open, budget=max(self._timeout_s, guard.OPEN_TIMEOUT_S))
        except BaseException:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            raise

    async def close(self) -> None:
        if self._pool is None:
            return
        try:
            await self._call("close", self._close)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def put(self, item: Item) -> None:
        guard.check_item(item)
        await self._call("put", self._put, item)

    async def get(self, kind: str, scope: str, key: str) -> Item | None:
        guard.check_scope(kind, scope)
        guard.check_text("key", key)
        return await self._call("get", self._get, kind, scope, key)

    async def nearest(self, kind: str, scope: str, vector: tuple[float, ...], k: int,
                      min_similarity: float = -1.0) -> list[tuple[float, Item]]:
        guard.check_scope(kind, scope)
        guard.check_vector("vector", vector)
        guard.check_k(k)
        return await self._call("nearest", self._nearest, kind, scope, vector, k, min_similarity)

    async def items(self, kind: str, scope: str, limit: int, offset: int = 0) -> list[Item]:
        guard.check_scope(kind, scope)
        guard.check_count("limit", limit)
        guard.check_count("offset", offset)
        return await self._call("items", self._items, kind, scope, limit, offset)

    async def delete(self, kind: str, scope: str, key: str | None = None) -> int:
        guard.check_scope(kind, scope)
        if key is not None:
            guard.check_text("key", key)
        return await self._call("delete", self._delete, kind, scope, key)

    async def count(self, kind: str, scope: str | None = None) -> int:
        guard.check_kind(kind)
        if scope is not None:
            guard.check_text("scope", scope)
        return await self._call("count", self._count, kind, scope)

    async def trim(self, kind: str, scope: str | None, keep: int) -> int:
        guard.check_kind(kind)
        if scope is not None:
            guard.check_text("scope", scope)
        guard.check_count("keep", keep)
        return await self._call("trim", self._trim, kind, scope, keep)

    async def advance(self, clocks: Sequence[tuple[str, float]], now: float) -> list[float]:
        guard.check_clocks(clocks, now)
        return await self._call("advance", self._advance, tuple(clocks), now)

    async def _call(self, name: str, fn: Callable[..., T], *args: Any, budget: float | None = None) -> T:
        pool = self._pool
        if pool is None:
            raise StoreUnavailable(f"sqlite store {name} ({self._path}): the store is not open")
        budget = self._timeout_s if budget is None else budget
        # The thread gives up a little before its caller does, so that a call its caller was told had failed
        # has in fact stopped (its transaction rolled back) and never lands later.
        deadline = time.monotonic() + budget - min(0.05, budget / 10)
        what = f"sqlite store {name} ({self._path})"
        async with guard.deadline(what, budget, (apsw.Error,)):
            # A call that times out waiting for the thread is cancelled before it starts; one that is running
            # stops at its deadline by itself (the busy timeout and the progress handler below).
            result = await asyncio.get_running_loop().run_in_executor(
                pool, self._run, what, budget, deadline, fn, args)
        return result

    # ---- on the store's thread ----

    def _run(self, what: str, budget: float, deadline: float, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        late = StoreUnavailable(f"{what}: no answer within timeout_s={budget:g}")
        if time.monotonic() >= deadline:
            raise late  # its caller has gone already
        self._deadline = deadline
        pause = 0.001
        while True:
            if self._db is not None:
                self._db.set_busy_timeout(self._busy_ms())
            try:
                return fn(*args)
            except apsw.InterruptError as e:
                raise late from e  # the statement ran until the deadline
            except apsw.BusyError as e:
                # Mostly the lock was waited for until the deadline; but SQLite also answers busy at once, without
                # waiting, where a wait could deadlock or while another connection turns the file to WAL (two
                # routers opening a new file). Every call is one transaction, rolled back: it is tried again.
                if deadline - time.monotonic() <= pause:
                    raise late from e
                time.sleep(pause)  # this store's thread, never the event loop
                pause = min(2 * pause, 0.05)

    def _busy_ms(self) -> int:
        return max(1, int((self._deadline - time.monotonic()) * 1000))

    def _late(self) -> bool:
        return time.monotonic() > self._deadline  # True interrupts the statement (apsw.InterruptError)

    @property
    def _conn(self) -> apsw.Connection:
        assert self._db is not None, "used before open or after close"
        return self._db

    def _one(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        return self._conn.execute(sql, args).fetchone()

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return self._conn.execute(sql, args).fetchall()

    @contextmanager
    def _writing(self) -> Iterator[apsw.Connection]:
        # IMMEDIATE: the write lock is taken (or waited for, up to the deadline) at the start, never midway.
        db = self._conn
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if not db.get_autocommit():  # SQLite has not rolled it back itself
                db.execute("ROLLBACK")
            raise

    def _open(self) -> None:
        db = apsw.Connection(self._path)
        try:
            db.enable_load_extension(True)
            db.load_extension(sqlite_vec.loadable_path())
            db.enable_load_extension(False)
            db.set_busy_timeout(self._busy_ms())
            db.set_progress_handler(self._late, PROGRESS_STEPS)
            db.execute("PRAGMA journal_mode=WAL").fetchall()
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a crash of the router loses nothing committed
            db.execute(f"PRAGMA mmap_size={MMAP_BYTES}").fetchall()
            self._db = db
            with self._writing():
                db.execute("CREATE TABLE IF NOT EXISTS router_schema (version INTEGER NOT NULL)")
                version = self._one("SELECT max(version) FROM router_schema")[0]
                if version is not None and version > SCHEMA_VERSION:
                    raise SchemaError(f"sqlite store {self._path}: schema version {version} was written by a newer "
                                      f"router; this one reads version {SCHEMA_VERSION} at most")
                db.execute(_TABLES)
                if version is None:
                    db.execute("INSERT INTO router_schema (version) VALUES (?)", (SCHEMA_VERSION,))
            self._find_vec_tables()
        except BaseException:
            self._db = None
            db.close()
            raise

    def _find_vec_tables(self) -> None:
        names = self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'router_vec_%'")
        self._dims = {int(m[1]) for (name,) in names if (m := re.fullmatch(r"router_vec_(\d+)", name))}

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _scope_id(self, kind: str, scope: str) -> int | None:
        row = self._one("SELECT id FROM router_scopes WHERE kind = ? AND scope = ?", (kind, scope))
        return None if row is None else int(row[0])

    def _vec_table(self, dims: int) -> str:
        name = f"router_vec_{dims}"
        if dims not in self._dims:
            self._conn.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {name} USING vec0(bucket INTEGER PARTITION KEY, "
                f"embedding FLOAT[{dims}] distance_metric=cosine, scope_id INTEGER, expires FLOAT, chunk_size={CHUNK})")
            self._dims.add(dims)
        return name

    def _put(self, item: Item) -> None:
        dims = None if item.vector is None else len(item.vector)
        with self._writing() as db:
            db.execute("INSERT INTO router_scopes (kind, scope) VALUES (?, ?) ON CONFLICT DO NOTHING",
                       (item.kind, item.scope))
            sid = self._scope_id(item.kind, item.scope)
            assert sid is not None
            row = self._one("SELECT id, dims FROM router_items WHERE scope_id = ? AND key = ?", (sid, item.key))
            values = (bytes(item.payload), dims, item.created, item.expires)
            if row is None:
                db.execute("INSERT INTO router_items (kind, scope_id, key, payload, dims, created, expires) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?)", (item.kind, sid, item.key, *values))
                item_id = db.last_insert_rowid()
            else:
                item_id, old_dims = row
                db.execute("UPDATE router_items SET payload = ?, dims = ?, created = ?, expires = ? WHERE id = ?",
                           (*values, item_id))
                if old_dims is not None:
                    db.execute(f"DELETE FROM router_vec_{old_dims} WHERE rowid = ?", (item_id,))
            if item.vector is not None:
                db.execute(f"INSERT INTO {self._vec_table(len(item.vector))} (rowid, bucket, embedding, scope_id, "
                           "expires) VALUES (?, ?, ?, ?, ?)",
                           (item_id, sid % BUCKETS, _blob(item.vector), sid,
                            NEVER if item.expires is None else item.expires))

    def _advance(self, clocks: tuple[tuple[str, float], ...], now: float) -> list[float]:
        at = round(now * 1e6)
        out = []
        with self._writing() as db:
            for name, cost in clocks:
                args = {"name": hashlib.sha256(name.encode()).digest(), "now": at, "cost": round(cost * 1e6)}
                [(moved,)] = db.execute(_ADVANCE, args).fetchall()
                out.append(int(moved) / 1e6)  # type: ignore[arg-type]  # RETURNING at, an INTEGER
            if now - self._swept >= SWEEP_S:
                db.execute("DELETE FROM router_clocks WHERE at <= ?", (at,))
                self._swept = now
        return out

    def _embedding(self, item_id: int, dims: int | None) -> tuple[float, ...] | None:
        if dims is None:
            return None
        row = self._one(f"SELECT embedding FROM router_vec_{dims} WHERE rowid = ?", (item_id,))
        return None if row is None else _vector(row[0])

    def _get(self, kind: str, scope: str, key: str) -> Item | None:
        sid = self._scope_id(kind, scope)
        if sid is None:
            return None
        row = self._one(f"SELECT id, payload, dims, created, expires FROM router_items "
                        f"WHERE scope_id = ? AND key = ? AND {_LIVE}", (sid, key, time.time()))
        if row is None:
            return None
        item_id, payload, dims, created, expires = row
        return Item(kind, scope, key, payload, self._embedding(item_id, dims), created, expires)

    def _nearest(self, kind: str, scope: str, vector: tuple[float, ...], k: int,
                 min_similarity: float) -> list[tuple[float, Item]]:
        sid = self._scope_id(kind, scope)
        if sid is None:
            return []
        if len(vector) not in self._dims:
            self._find_vec_tables()  # another connection to the file may have made it
            if len(vector) not in self._dims:
                return []
        # MATERIALIZED: the KNN runs as vec0 plans it (k, bucket, scope and expiry all inside its scan); only
        # then are its k rows joined to their items.
        rows = self._conn.execute(
            f"WITH knn AS MATERIALIZED (SELECT rowid, distance, embedding FROM router_vec_{len(vector)} "
            "WHERE embedding MATCH ? AND k = ? AND bucket = ? AND scope_id = ? AND expires > ?) "
            "SELECT i.key, i.payload, i.created, i.expires, knn.distance, knn.embedding "
            "FROM knn JOIN router_items i ON i.id = knn.rowid ORDER BY knn.distance",
            (_blob(vector), k, sid % BUCKETS, sid, time.time()))
        found = []
        for key, payload, created, expires, distance, embedding in rows:
            similarity = 1.0 - distance
            if similarity < min_similarity:
                break  # the rest are further
            found.append((similarity, Item(kind, scope, key, payload, _vector(embedding), created, expires)))
        return found

    def _items(self, kind: str, scope: str, limit: int, offset: int) -> list[Item]:
        sid = self._scope_id(kind, scope)
        if sid is None:
            return []
        rows = self._all(
            f"SELECT id, key, payload, dims, created, expires FROM router_items WHERE scope_id = ? AND {_LIVE} "
            "ORDER BY created DESC, id DESC LIMIT ? OFFSET ?", (sid, time.time(), limit, offset))
        return [Item(kind, scope, key, payload, self._embedding(item_id, dims), created, expires)
                for item_id, key, payload, dims, created, expires in rows]

    def _drop(self, rows: list[tuple[int, int | None]]) -> int:
        db = self._conn
        for dims in {d for _, d in rows if d is not None}:
            db.executemany(f"DELETE FROM router_vec_{dims} WHERE rowid = ?", [(i,) for i, d in rows if d == dims])
        db.executemany("DELETE FROM router_items WHERE id = ?", [(i,) for i, _ in rows])
        return len(rows)

    def _delete(self, kind: str, scope: str, key: str | None) -> int:
        with self._writing() as db:
            sid = self._scope_id(kind, scope)
            if sid is None:
                return 0
            if key is not None:
                return self._drop(self._all("SELECT id, dims FROM router_items WHERE scope_id = ? AND key = ?",
                                            (sid, key)))
            gone = self._drop(self._all("SELECT id, dims FROM router_items WHERE scope_id = ?", (sid,)))
            db.execute("DELETE FROM router_scopes WHERE id = ?", (sid,))  # nothing of the scope is left behind
            return gone

    def _count(self, kind: str, scope: str | None) -> int:
        now = time.time()
        if scope is None:
            row = self._one(f"SELECT count(*) FROM router_items WHERE kind = ? AND {_LIVE}", (kind, now))
        else:
            sid = self._scope_id(kind, scope)
            if sid is None:
                return 0
            row = self._one(f"SELECT count(*) FROM router_items WHERE scope_id = ? AND {_LIVE}", (sid, now))
        return int(row[0])

    def _trim(self, kind: str, scope: str | None, keep: int) -> int:
        with self._writing():
            arg: str | int | None = kind
            where = "kind = ?"
            if scope is not None:
                arg, where = self._scope_id(kind, scope), "scope_id = ?"
                if arg is None:
                    return 0
            gone = self._drop(self._all(f"SELECT id, dims FROM router_items WHERE {where} AND expires <= ?",
                                        (arg, time.time())))
            return gone + self._drop(self._all(
                f"SELECT id, dims FROM router_items WHERE {where} ORDER BY created DESC, id DESC LIMIT -1 OFFSET ?",
                (arg, keep)))
