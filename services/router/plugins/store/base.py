"""The store every plugin keeps its state in (router process): one port over items, each a payload with
an optional vector, found by key or by cosine similarity within a (kind, scope). SQLite (sqlite.py) is
the embedded default; PostgreSQL with pgvector (postgres.py) is shared by several routers."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# The schema the code writes: a store created by a newer router (a larger number) is refused at open.
SCHEMA_VERSION = 1

# What the plugins keep, each kind in scopes of its own; a scope is never read by another's request.
KINDS = ("cache", "memory", "chunk", "file", "response")


class StoreUnavailable(RuntimeError):
    """The store did not answer: unreachable, failed, or past the call's deadline. The message says which;
    the plugin fails open or closed as configured, never with a 500."""


class StoreRefused(ValueError):
    """The store refuses an input it cannot hold (store/guard.py: a key too long, NUL, a payload too large,
    a vector it cannot compare); nothing was written. The message names the field and the limit."""


class SchemaError(RuntimeError):
    """The store holds a schema this router cannot use (written by a newer version)."""


@dataclass(frozen=True, slots=True)
class Item:
    kind: str  # of KINDS
    scope: str  # whose or what it is: a cache scope (tenant and what changes an answer), a user, a knowledge base
    key: str  # unique within (kind, scope); put() replaces an item of the same key
    payload: bytes  # what the plugin keeps (its own JSON)
    vector: tuple[float, ...] | None = None  # unit length: cosine similarity is their dot product
    created: float = 0.0  # unix seconds; items() lists newest first, trim() drops oldest first
    expires: float | None = None  # unix seconds; an expired item is never returned


class Store(Protocol):
    """Every call raises StoreUnavailable rather than hang past the store's `timeout_s`."""

    async def open(self) -> None:
        """Connect, and create the schema on first start; SchemaError for a newer one."""

    async def close(self) -> None: ...

    async def put(self, item: Item) -> None: ...

    async def get(self, kind: str, scope: str, key: str) -> Item | None: ...

    async def nearest(self, kind: str, scope: str, vector: tuple[float, ...], k: int,
                      min_similarity: float = -1.0) -> list[tuple[float, Item]]:
        """Up to `k` items of (kind, scope) whose vector has as many dimensions as `vector` and a cosine
        similarity of at least `min_similarity` to it, most similar first, with their similarity."""

    async def items(self, kind: str, scope: str, limit: int, offset: int = 0) -> list[Item]:
        """Items of (kind, scope), newest first."""

    async def delete(self, kind: str, scope: str, key: str | None = None) -> int:
        """One item, or (key None) every item of the scope; how many went."""

    async def count(self, kind: str, scope: str | None = None) -> int:
        """Items of a kind (not expired), in one scope or (None) in all."""

    async def trim(self, kind: str, scope: str | None, keep: int) -> int:
        """Expired items, then the oldest beyond `keep` in the scope (None: in the whole kind); how many went."""

    async def advance(self, clocks: Sequence[tuple[str, float]], now: float) -> list[float]:
        """Rate limits' clocks (listeners/buckets.py: the time each budget is spent until, unix seconds), moved
        on together in one transaction, each by its (distinct) name; their new times in the order given. A cost
        of 0 or more counts from `now` where a clock is behind it (max(clock, now) + cost; a new name is at
        `now`), a negative one (a refund) is taken off as it is. Kept to the microsecond; a clock not ahead of
        `now` holds nothing and is deleted now and then."""
