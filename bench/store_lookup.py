"""The plugins' two stores side by side (services/router/plugins/store/): SQLite (a file, sqlite-vec) and
PostgreSQL with pgvector (a local pgserver, over its Unix socket), each filled through the port with
--items random unit vectors of 384 dimensions, once all in one scope and once spread over --scopes scopes:

- insert: items/s through `put`, --concurrency calls in flight;
- nearest: p50/p99 of `nearest` (k 10) from a random unit vector, in the one scope or in a random scope
  of the spread layout (a scope of items/scopes items, the rest of the table the other scopes');
- get: p50/p99 of `get` by an existing key;
- size: the SQLite file, or the PostgreSQL table with its indexes and TOAST.

Latencies are one call at a time, as the event loop sees them (the SQLite store's thread hop included).
Usage: .venv/bin/python bench/store_lookup.py [--items 100000] [--scopes 1000] [--queries 200]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timing import percentile  # noqa: E402

from services.router.config.plugins import StoreConfig  # noqa: E402
from services.router.plugins.store.base import Item, Store  # noqa: E402
from services.router.plugins.store.factory import open_store  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # pgserver's platformdirs warns at import where XDG_RUNTIME_DIR is unset
    import pgserver

DIMS = 384
K = 10
BATCH = 1000  # vectors drawn at a time: 100k tuples of 384 floats at once would take ~1.5 GB


@dataclass(slots=True)
class Figures:
    insert_per_s: float
    nearest_ms: tuple[float, float]
    get_ms: tuple[float, float]
    size_mb: float


def unit_vectors(rng: np.random.Generator, n: int) -> Iterator[tuple[float, ...]]:
    while n > 0:
        x = rng.standard_normal((min(n, BATCH), DIMS)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        yield from (tuple(row) for row in x.tolist())
        n -= len(x)


def p50_p99(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 0.50) * 1e3, percentile(samples, 0.99) * 1e3


async def measure(store: Store, items: int, scopes: int, queries: int, concurrency: int) -> tuple[float, ...]:
    rng = np.random.default_rng(0)
    scope_of = [f"tenant-{n % scopes}" for n in range(items)]
    pending: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()
    for n, vector in enumerate(unit_vectors(rng, items)):
        item = Item("cache", scope_of[n], f"key-{n}", b'{"answer": "' + b"x" * 200 + b'"}', vector, float(n))
        pending.add(asyncio.create_task(store.put(item)))
        if len(pending) >= concurrency:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(*pending)
    insert_per_s = items / (time.perf_counter() - t0)

    pick = random.Random(1)
    nearest: list[float] = []
    for vector in unit_vectors(rng, queries):
        scope = f"tenant-{pick.randrange(scopes)}"
        t = time.perf_counter()
        found = await store.nearest("cache", scope, vector, K)
        nearest.append(time.perf_counter() - t)
        assert len(found) == min(K, items // scopes) and all(i.scope == scope for _, i in found)
    gets: list[float] = []
    for _ in range(queries * 5):
        n = pick.randrange(items)
        t = time.perf_counter()
        got = await store.get("cache", scope_of[n], f"key-{n}")
        gets.append(time.perf_counter() - t)
        assert got is not None
    return (insert_per_s, *p50_p99(nearest), *p50_p99(gets))


async def sqlite_figures(home: Path, items: int, scopes: int, queries: int, concurrency: int) -> Figures:
    path = home / f"store-{scopes}.db"
    store = open_store(StoreConfig(backend="sqlite", path=str(path), timeout_s=30.0))
    await store.open()
    try:
        insert, n50, n99, g50, g99 = await measure(store, items, scopes, queries, concurrency)
    finally:
        await store.close()  # the last connection checkpoints the WAL into the file
    size = sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())
    return Figures(insert, (n50, n99), (g50, g99), size / 1e6)


async def postgres_figures(server: pgserver.PostgresServer, items: int, scopes: int, queries: int,
                           concurrency: int) -> Figures:
    admin = await asyncpg.connect(server.get_uri())
    await admin.execute(f"CREATE DATABASE bench_{scopes}")
    await admin.close()
    dsn = server.get_uri(f"bench_{scopes}")
    store = open_store(StoreConfig(backend="postgres", dsn=dsn, timeout_s=30.0))
    await store.open()
    try:
        insert, n50, n99, g50, g99 = await measure(store, items, scopes, queries, concurrency)
    finally:
        await store.close()
    conn = await asyncpg.connect(dsn)
    size = await conn.fetchval("SELECT pg_total_relation_size('router_items')")
    await conn.close()
    return Figures(insert, (n50, n99), (g50, g99), size / 1e6)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--scopes", type=int, default=1000, help="the spread layout's scope count")
    p.add_argument("--queries", type=int, default=200, help="nearest calls per layout (and 5x as many gets)")
    p.add_argument("--concurrency", type=int, default=16, help="puts in flight while filling")
    args = p.parse_args()

    home = Path(tempfile.mkdtemp(prefix="store-bench-"))
    server = pgserver.get_server(home / "pg", cleanup_mode="stop")
    rows: list[tuple[str, int, Figures]] = []
    try:
        for scopes in (1, args.scopes):
            for backend in ("sqlite", "postgres"):
                started = time.perf_counter()
                if backend == "sqlite":
                    figures = asyncio.run(sqlite_figures(home, args.items, scopes, args.queries, args.concurrency))
                else:
                    figures = asyncio.run(postgres_figures(server, args.items, scopes, args.queries,
                                                           args.concurrency))
                rows.append((backend, scopes, figures))
                print(f"  ({backend}, {scopes} scope(s): {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    finally:
        server.cleanup()
        shutil.rmtree(home, ignore_errors=True)

    print(f"{args.items:,} items of {DIMS} dimensions (random unit vectors), nearest k={K}, "
          f"{args.queries} nearest and {args.queries * 5} get calls per row, one at a time")
    print(f"{'backend':<9} {'scopes':>6} {'items/scope':>11} {'insert/s':>9} {'nearest p50':>12} {'p99':>8} "
          f"{'get p50':>8} {'p99':>7} {'size MB':>8}")
    for backend, scopes, f in rows:
        print(f"{backend:<9} {scopes:>6} {args.items // scopes:>11} {f.insert_per_s:>9.0f} {f.nearest_ms[0]:>9.2f} ms "
              f"{f.nearest_ms[1]:>8.2f} {f.get_ms[0]:>5.2f} ms {f.get_ms[1]:>7.2f} {f.size_mb:>8.0f}")


if __name__ == "__main__":
    main()
