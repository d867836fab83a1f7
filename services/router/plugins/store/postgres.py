"""The shared store (router process): PostgreSQL with pgvector through an asyncpg pool, so that several routers
share one cache, memory and knowledge. Every call is bounded by timeout_s; a server that went away is
reconnected to by the pool on a later call."""
from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import asyncpg

from services.router.plugins.store import guard
from services.router.plugins.store.base import SCHEMA_VERSION, Item, SchemaError, StoreUnavailable

T = TypeVar("T")

# The key of the transaction-scoped advisory lock under which a router creates or checks the schema: two
# routers starting at once against a new database take turns instead of both creating it.
SCHEMA_LOCK = 0x726F_7574_6572  # "router"
POOL_MAX = 10
# What a call that reached no answer raises; any of them becomes StoreUnavailable. OSError covers a refused
# or vanished server, PostgresError what the server says (a statement cancelled, a shutdown), and
# InterfaceError a connection the pool found closed.
_FAILURES: tuple[type[BaseException], ...] = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)

# `nearest` is an exact scan of the scope's rows (an index on kind and scope, then every vector of the
# scope): pgvector's HNSW index filters after its search, so a scope whose neighbours are outnumbered by
# another scope's closer vectors could get fewer than k, or none. bench/store_lookup.py has the figures.
_TABLES = """
CREATE TABLE router_items (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    scope text NOT NULL,
    key text NOT NULL,
    -- Digests stand in for scope and key in the indexes (a btree entry holds ~2.7 kB, a key up to 64 KiB):
    scope_h bytea NOT NULL,  -- sha256 of the scope
    item_h bytea NOT NULL,  -- sha256 of scope and key; one by one, the only index a key's lookup can use
    payload bytea NOT NULL,
    dims integer,  -- NULL: no vector
    embedding vector,  -- of any dimension count: a query compares only rows of its own
    created double precision NOT NULL,
    expires double precision);
-- Kept in the row (a large payload is moved out first): the scan of a scope reads vectors, not TOAST.
ALTER TABLE router_items ALTER COLUMN embedding SET STORAGE MAIN;
CREATE UNIQUE INDEX router_items_key ON router_items (kind, item_h);
CREATE INDEX router_items_scope_newest ON router_items (kind, scope_h, created, id);
CREATE INDEX router_items_kind_newest ON router_items (kind, created, id);
CREATE INDEX router_items_expires ON router_items (kind, expires) WHERE expires IS NOT NULL;
"""
# Rate limits' clocks (Store.advance), by a digest of their name; created on any open (a store of schema version
# 1 made before them gets them too: a table added is no new version, older routers ignore it).
_CLOCKS = """
CREATE TABLE IF NOT EXISTS router_clocks (
    name_h bytea PRIMARY KEY,  -- sha256 of the name
    at bigint NOT NULL);  -- unix microseconds
CREATE INDEX IF NOT EXISTS router_clocks_at ON router_clocks (at);
"""
# One statement, so atomic; names in digest order, so that two routers' statements lock rows in one order and
# never deadlock. Integer microseconds: `EXCLUDED.at - now` is the cost exactly, as a float near 1.7e9 is not.
_ADVANCE = """
INSERT INTO router_clocks AS c (name_h, at) SELECT n, $3 + d FROM unnest($1::bytea[], $2::bigint[]) AS x(n, d)
ON CONFLICT (name_h) DO UPDATE SET at = CASE WHEN EXCLUDED.at >= $3 THEN GREATEST(c.at, $3) + (EXCLUDED.at - $3)
                                             ELSE c.at + (EXCLUDED.at - $3) END
RETURNING name_h, at
"""
SWEEP_S = 60.0  # how often `advance` deletes the clocks that hold nothing (not ahead of now)
_COLUMNS = "key, payload, embedding, created, expires"
_LIVE = "(expires IS NULL OR expires > $%d)"


def where(dsn: str) -> str:
    """The server a DSN names (host and port, or the socket's folder), never its user or password."""
    try:
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
        host = parts.hostname or query.get("host", ["localhost"])[0]
        port = parts.port or query.get("port", ["5432"])[0]
    except ValueError:
        return "an unparsable dsn"
    return f"{host}:{port}" if not host.startswith("/") else host


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def _item_digest(scope: str, key: str) -> bytes:
    return _digest(f"{scope}\x00{key}")  # neither holds a NUL (guard.check_text): the pair is unambiguous


def _encode(vector: tuple[float, ...]) -> bytes:
    return struct.pack(f">HH{len(vector)}f", len(vector), 0, *vector)  # pgvector's binary form


def _decode(data: bytes) -> tuple[float, ...]:
    return struct.unpack_from(f">{struct.unpack_from('>H', data)[0]}f", data, 4)


def _gone(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])  # "DELETE 3"


class PostgresStore:
    def __init__(self, dsn: str, timeout_s: float) -> None:
        self._dsn = dsn
        self._where = where(dsn)
        self._timeout_s = timeout_s
        self._pool: asyncpg.Pool | None = None
        self._vector_schema = "public"  # where pgvector's type lives (found at open)
        self._swept = 0.0  # when `advance` last deleted spent clocks (its `now`)

    def _what(self, call: str) -> str:
        return f"postgres store {call} ({self._where})"

    async def open(self) -> None:
        if self._pool is not None:
            return
        budget = max(self._timeout_s, guard.OPEN_TIMEOUT_S)
        async with guard.deadline(self._what("open"), budget, _FAILURES):
            conn = await asyncpg.connect(self._dsn, timeout=budget)
            try:
                await self._schema(conn)
            finally:
                await conn.close()
            # min_size 0: a connection is made when a call needs one, so a server that is down is found by
            # the next call (StoreUnavailable), not by a background task that logs a traceback each retry.
            self._pool = await asyncpg.create_pool(
                self._dsn, min_size=0, max_size=POOL_MAX, timeout=budget, command_timeout=self._timeout_s,
                init=self._init)

    async def _schema(self, conn: asyncpg.Connection) -> None:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            await conn.execute("CREATE TABLE IF NOT EXISTS router_schema (version integer NOT NULL)")
            version = await conn.fetchval("SELECT max(version) FROM router_schema")
            if version is not None and version > SCHEMA_VERSION:
                raise SchemaError(f"{self._what('open')}: schema version {version} was written by a newer router; "
                                  f"this one reads version {SCHEMA_VERSION} at most")
            if version is None:
                await conn.execute(_TABLES)
                await conn.execute("INSERT INTO router_schema (version) VALUES ($1)", SCHEMA_VERSION)
            await conn.execute(_CLOCKS)
            self._vector_schema = await conn.fetchval(
                "SELECT typnamespace::regnamespace::text FROM pg_type WHERE typname = 'vector'")

    async def _init(self, conn: asyncpg.Connection) -> None:
        await conn.set_type_codec("vector", schema=self._vector_schema, encoder=_encode, decoder=_decode,
                                  format="binary")

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                async with asyncio.timeout(self._timeout_s):
                    await pool.close()  # waits for calls in flight
            except _FAILURES:  # TimeoutError among them
                pool.terminate()  # the server or a call is stuck: nothing to close politely

    async def _call(self, name: str, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        pool = self._pool
        if pool is None:
            raise StoreUnavailable(f"{self._what(name)}: the store is not open")
        async with guard.deadline(self._what(name), self._timeout_s, _FAILURES):
            async with pool.acquire() as conn:
                result = await fn(conn)
        return result

    async def put(self, item: Item) -> None:
        guard.check_item(item)
        dims = None if item.vector is None else len(item.vector)
        args = (item.kind, _digest(item.scope), _item_digest(item.scope, item.key), item.scope, item.key,
                bytes(item.payload), dims,
                item.vector, item.created, item.expires)
        await self._call("put", lambda conn: conn.execute(
            "INSERT INTO router_items (kind, scope_h, item_h, scope, key, payload, dims, embedding, created, expires) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (kind, item_h) DO UPDATE SET "
            "payload = EXCLUDED.payload, dims = EXCLUDED.dims, embedding = EXCLUDED.embedding, "
            "created = EXCLUDED.created, expires = EXCLUDED.expires", *args))

    async def get(self, kind: str, scope: str, key: str) -> Item | None:
        guard.check_scope(kind, scope)
        guard.check_text("key", key)
        row = await self._call("get", lambda conn: conn.fetchrow(
            f"SELECT {_COLUMNS} FROM router_items WHERE kind = $1 AND item_h = $2 AND scope = $3 AND key = $4 "
            f"AND {_LIVE % 5}", kind, _item_digest(scope, key), scope, key, time.time()))
        return None if row is None else _item(kind, scope, row)

    async def nearest(self, kind: str, scope: str, vector: tuple[float, ...], k: int,
                      min_similarity: float = -1.0) -> list[tuple[float, Item]]:
        guard.check_scope(kind, scope)
        guard.check_vector("vector", vector)
        guard.check_k(k)
        # The scan sorts ids and distances only; the k rows found are read whole after (~10% faster at 100k).
        rows = await self._call("nearest", lambda conn: conn.fetch(
            f"SELECT {', '.join(f'i.{c}' for c in _COLUMNS.split(', '))}, n.distance FROM ("
            "SELECT id, embedding <=> $4 AS distance FROM router_items "
            f"WHERE kind = $1 AND scope_h = $2 AND scope = $3 AND dims = $5 AND {_LIVE % 6} "
            "ORDER BY 2 LIMIT $7) n JOIN router_items i ON i.id = n.id ORDER BY n.distance",
            kind, _digest(scope), scope, vector, len(vector), time.time(), k))
        found = []
        for row in rows:
            similarity = 1.0 - row["distance"]
            if similarity < min_similarity:
                break  # the rest are further
            found.append((similarity, _item(kind, scope, row)))
        return found

    async def items(self, kind: str, scope: str, limit: int, offset: int = 0) -> list[Item]:
        guard.check_scope(kind, scope)
        guard.check_count("limit", limit)
        guard.check_count("offset", offset)
        rows = await self._call("items", lambda conn: conn.fetch(
            f"SELECT {_COLUMNS} FROM router_items WHERE kind = $1 AND scope_h = $2 AND scope = $3 AND {_LIVE % 4} "
            "ORDER BY created DESC, id DESC LIMIT $5 OFFSET $6",
            kind, _digest(scope), scope, time.time(), limit, offset))
        return [_item(kind, scope, row) for row in rows]

    async def delete(self, kind: str, scope: str, key: str | None = None) -> int:
        guard.check_scope(kind, scope)
        sql = "DELETE FROM router_items WHERE kind = $1 AND scope_h = $2 AND scope = $3"
        args: tuple[Any, ...] = (kind, _digest(scope), scope)
        if key is not None:
            guard.check_text("key", key)
            sql = "DELETE FROM router_items WHERE kind = $1 AND item_h = $2 AND scope = $3 AND key = $4"
            args = (kind, _item_digest(scope, key), scope, key)
        return _gone(await self._call("delete", lambda conn: conn.execute(sql, *args)))

    async def count(self, kind: str, scope: str | None = None) -> int:
        guard.check_kind(kind)
        args: tuple[Any, ...]
        if scope is None:
            sql, args = f"SELECT count(*) FROM router_items WHERE kind = $1 AND {_LIVE % 2}", (kind, time.time())
        else:
            guard.check_text("scope", scope)
            sql = f"SELECT count(*) FROM router_items WHERE kind = $1 AND scope_h = $2 AND scope = $3 AND {_LIVE % 4}"
            args = (kind, _digest(scope), scope, time.time())
        return int(await self._call("count", lambda conn: conn.fetchval(sql, *args)))

    async def trim(self, kind: str, scope: str | None, keep: int) -> int:
        guard.check_kind(kind)
        guard.check_count("keep", keep)
        args: tuple[Any, ...]
        if scope is None:
            mine, args = "kind = $1", (kind,)
        else:
            guard.check_text("scope", scope)
            mine, args = "kind = $1 AND scope_h = $2 AND scope = $3", (kind, _digest(scope), scope)
        n = len(args)

        async def trim(conn: asyncpg.Connection) -> int:
            async with conn.transaction():
                expired = await conn.execute(f"DELETE FROM router_items WHERE {mine} AND expires <= ${n + 1}",
                                             *args, time.time())
                oldest = await conn.execute(
                    f"DELETE FROM router_items WHERE id IN (SELECT id FROM router_items WHERE {mine} "
                    f"ORDER BY created DESC, id DESC OFFSET ${n + 1})", *args, keep)
            return _gone(expired) + _gone(oldest)

        return await self._call("trim", trim)

    async def advance(self, clocks: Sequence[tuple[str, float]], now: float) -> list[float]:
        guard.check_clocks(clocks, now)
        names = [_digest(name) for name, _ in clocks]
        order = sorted(range(len(names)), key=names.__getitem__)
        at = round(now * 1e6)
        sweep = now - self._swept >= SWEEP_S

        async def advance(conn: asyncpg.Connection) -> list[asyncpg.Record]:
            rows = await conn.fetch(_ADVANCE, [names[i] for i in order], [round(clocks[i][1] * 1e6) for i in order], at)
            if sweep:
                await conn.execute("DELETE FROM router_clocks WHERE at <= $1", at)
            return rows

        rows = await self._call("advance", advance)
        if sweep:
            self._swept = now
        by = {bytes(row["name_h"]): row["at"] for row in rows}
        return [by[name] / 1e6 for name in names]


def _item(kind: str, scope: str, row: asyncpg.Record) -> Item:
    return Item(kind, scope, row["key"], row["payload"], row["embedding"], row["created"], row["expires"])
