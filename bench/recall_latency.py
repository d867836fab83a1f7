"""Recall latency of the memory and rag plugins' request hooks over the real stores: a user with 10,000
memories, and a knowledge base of 1,000 chunks (384-dimension unit vectors, as all-MiniLM-L6-v2's), on
SQLite (a tmp file) and on PostgreSQL (pgserver). The embedding call is left out (a precomputed vector
answers it at once): what is measured is the hook's own work, the store's nearest-neighbour search, and
building the system message. Also: keeping a turn at the cap (the response hook's put and trim of the
oldest, at 10,000), and listing a page of that user's memories (GET /v1/memory's store call).
Usage: .venv/bin/python bench/recall_latency.py [--memories 10000] [--chunks 1000] [--queries 300]
"""
from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from services.router.config import parse_config  # noqa: E402
from services.router.config.plugins import MemoryConfig, RagConfig, StoreConfig  # noqa: E402
from services.router.plugins.answer import Answer  # noqa: E402
from services.router.plugins.hooks import Exchange  # noqa: E402
from services.router.plugins.knowledge import Chunk  # noqa: E402
from services.router.plugins.memory import KIND, Memory, MemoryRecord  # noqa: E402
from services.router.plugins.rag import Rag  # noqa: E402
from services.router.plugins.registry import Shared  # noqa: E402
from services.router.plugins.store.base import Item, Store  # noqa: E402
from services.router.plugins.store.factory import open_store  # noqa: E402
from services.router.runtime.models import Embedded  # noqa: E402

DIMENSIONS = 384


class Vectors:
    """The model runtime's embed, answered from a table at once."""

    def __init__(self) -> None:
        self.table: dict[str, list[float]] = {}

    async def embed(self, deployment: str, texts: list[str], *, timeout_s: float, truncate: bool = True) -> Embedded:
        return Embedded("bench", 0.0, [self.table[t] for t in texts])


def unit(rng: random.Random) -> list[float]:
    v = [rng.gauss(0.0, 1.0) for _ in range(DIMENSIONS)]
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


def near(rng: random.Random, v: list[float], noise: float = 0.3) -> list[float]:
    """A vector close to `v` (cosine about 0.95): a query that recalls it."""
    w = [x + rng.gauss(0.0, noise / math.sqrt(DIMENSIONS)) for x in v]
    norm = math.sqrt(sum(x * x for x in w))
    return [x / norm for x in w]


async def fill(store: Store, memories: int, chunks: int, rng: random.Random) -> tuple[list[list[float]],
                                                                                          list[list[float]]]:
    now = time.time()
    memory_vectors, chunk_vectors = [], []
    for i in range(memories):
        v = unit(rng)
        memory_vectors.append(v)
        content = f"User: question {i} " + "q" * 200 + f"\nAssistant: answer {i} " + "a" * 400
        await store.put(Item(KIND, "ktenant/ann", f"mem_{i:06}", msgspec.json.encode(MemoryRecord(content)),
                             tuple(v), created=now - memories + i))
    for i in range(memories // 10):  # other owners' memories, in the same table
        await store.put(Item(KIND, f"ktenant/u{i % 100}", f"mem_o{i:06}", msgspec.json.encode(
            MemoryRecord("User: other\nAssistant: other")), tuple(unit(rng)), created=now))
    for i in range(chunks):
        v = unit(rng)
        chunk_vectors.append(v)
        path = f"docs/file{i // 10}.md"
        await store.put(Item("chunk", "docs", f"{path}#{i % 10}", msgspec.json.encode(
            Chunk(path, i % 10, f"chunk {i} " + "c" * 1400)), tuple(v), created=now))
    return memory_vectors, chunk_vectors


def exchange(text: str) -> Exchange:
    chat = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return Exchange("chat", True, "e", "default", dict(chat), chat, "ktenant", "ann")


async def timed(queries: int, call: Any) -> tuple[float, float]:
    took = []
    for i in range(queries):
        started = time.perf_counter()
        await call(i)
        took.append(time.perf_counter() - started)
    took.sort()
    return statistics.median(took) * 1e3, took[min(len(took) - 1, int(len(took) * 0.99))] * 1e3


async def measure(name: str, config: StoreConfig, args: argparse.Namespace) -> None:
    rng = random.Random(7)
    store = open_store(config)
    await store.open()
    try:
        started = time.perf_counter()
        memory_vectors, chunk_vectors = await fill(store, args.memories, args.chunks, rng)
        filled_s = time.perf_counter() - started
        router_config = parse_config({
            "listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [{"url": "http://a:1"}]}},
            "deployments": {"emb": {"model": "minilm", "tasks": ["embed"], "attached": {"urls": ["http://e:1"]}}},
            "store": {}, "knowledge": {"docs": {"paths": ["docs"], "embedder": "emb"}},
            "entries": {"e": {"default": ["p"]}}})
        models = Vectors()
        shared = Shared(router_config, store, models)  # type: ignore[arg-type]
        memory = Memory(MemoryConfig(embedder="emb", max_memories=args.memories), shared)
        rag = Rag(RagConfig(knowledge="docs"), shared)
        for i in range(args.queries):
            models.table[f"m{i}"] = near(rng, memory_vectors[rng.randrange(len(memory_vectors))])
            models.table[f"r{i}"] = near(rng, chunk_vectors[rng.randrange(len(chunk_vectors))])

        async def recall_memory(i: int) -> None:
            ex = exchange(f"m{i}")
            await memory.request(ex)
            assert ex.notes["memory.outcome"] == "recalled"

        async def recall_chunks(i: int) -> None:
            ex = exchange(f"r{i}")
            await rag.request(ex)
            assert ex.notes["rag.outcome"] == "recalled"

        async def keep(i: int) -> None:
            ex = exchange(f"k{i}")
            models.table[f"User: k{i}\nAssistant: noted"] = unit(rng)
            await memory.response(ex, Answer({"choices": [{"message": {"content": "noted"}}]}, False, True),
                                  answered_by=None)

        async def list_page(i: int) -> None:
            await store.items(KIND, "ktenant/ann", 101, (i * 100) % args.memories)

        await recall_memory(0)  # warm: the first query may build an index or a plan
        await recall_chunks(0)
        rows = [(f"memory recall, 1 user with {args.memories:,} memories", await timed(args.queries, recall_memory)),
                (f"rag recall, a base of {args.chunks:,} chunks", await timed(args.queries, recall_chunks)),
                (f"memory kept at the cap ({args.memories:,}): put + trim", await timed(args.queries, keep)),
                ("GET /v1/memory page of 100 (store call)", await timed(args.queries, list_page))]
        print(f"\n{name}: filled {args.memories + args.memories // 10 + args.chunks:,} items in {filled_s:.1f}s")
        for label, (p50, p99) in rows:
            print(f"  {label:<52} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms")
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--chunks", type=int, default=1_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(measure("SQLite (sqlite-vec)", StoreConfig(path=f"{tmp}/state.db", timeout_s=10), args))
        if not args.no_postgres:
            import pgserver

            server = pgserver.get_server(f"{tmp}/pg", cleanup_mode="stop")
            try:
                asyncio.run(measure("PostgreSQL (pgvector)", StoreConfig(backend="postgres", dsn=server.get_uri(),
                                                                         timeout_s=10), args))
            finally:
                server.cleanup()


if __name__ == "__main__":
    main()
