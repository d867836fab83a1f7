"""What both stores (router process) check before a call, so that bad input is StoreRefused (a ValueError)
naming the field and never a half-written row, and the deadline they hold every call to (StoreUnavailable
past it)."""
from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from services.router.plugins.store.base import KINDS, Item, StoreRefused, StoreUnavailable

# The stores' limits: a key or scope of more UTF-8 bytes, a longer payload, a vector
# of more dimensions, or a larger k is refused with StoreRefused, naming it.
MAX_TEXT_BYTES = 65_536  # scope and key; longer ones are the plugin's to hash
MAX_PAYLOAD_BYTES = 64 << 20
MAX_DIMS = 8192  # sqlite-vec's most (pgvector allows 16,000)
MAX_K = 4096  # sqlite-vec's most neighbours per query
MAX_CLOCK_S = 1e10  # a rate limit's clock or cost (Store.advance), in seconds: kept in microseconds in 64 bits
FLOAT32_MAX = 3.4028234663852886e38  # both stores keep 32-bit components: a larger one would become infinite

# Opening may create the schema (and pgvector) on first start, a dozen round trips: it gets this long at
# least, so that a short per-call timeout_s never stops a router from starting against a distant server.
OPEN_TIMEOUT_S = 10.0


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise StoreRefused(f"kind: {kind!r} is not one of {', '.join(KINDS)}")


def check_text(name: str, value: str) -> None:
    """A scope or key: any unicode but NUL (PostgreSQL text cannot hold it) and lone surrogates (not UTF-8)."""
    if not isinstance(value, str):
        raise StoreRefused(f"{name}: must be a string, not {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise StoreRefused(f"{name}: not encodable as UTF-8 (a lone surrogate at index {e.start})") from None
    if size > MAX_TEXT_BYTES:
        raise StoreRefused(f"{name}: {size} UTF-8 bytes; at most {MAX_TEXT_BYTES}")
    if "\x00" in value:
        raise StoreRefused(f"{name}: must not contain NUL (U+0000)")


def check_vector(name: str, vector: tuple[float, ...]) -> None:
    if not 1 <= len(vector) <= MAX_DIMS:
        raise StoreRefused(f"{name}: {len(vector)} dimensions; allowed 1 to {MAX_DIMS}")
    if not all(math.isfinite(x) and abs(x) <= FLOAT32_MAX for x in vector):
        raise StoreRefused(f"{name}: every component must be a finite 32-bit float (no NaN, no infinity, "
                         f"|x| <= {FLOAT32_MAX:.4g})")
    if not any(vector):
        raise StoreRefused(f"{name}: must not be all zeros (a cosine similarity needs a length)")


def check_item(item: Item) -> None:
    check_kind(item.kind)
    check_text("scope", item.scope)
    check_text("key", item.key)
    if not isinstance(item.payload, bytes | bytearray | memoryview):
        raise StoreRefused(f"payload: must be bytes, not {type(item.payload).__name__}")
    if len(item.payload) > MAX_PAYLOAD_BYTES:
        raise StoreRefused(f"payload: {len(item.payload)} bytes; at most {MAX_PAYLOAD_BYTES}")
    if item.vector is not None:
        check_vector("vector", item.vector)
    if not math.isfinite(item.created):
        raise StoreRefused("created: must be finite unix seconds")
    if item.expires is not None and not math.isfinite(item.expires):
        raise StoreRefused("expires: must be finite unix seconds, or None for never")


def check_scope(kind: str, scope: str) -> None:
    check_kind(kind)
    check_text("scope", scope)


def check_k(k: int) -> None:
    if not 1 <= k <= MAX_K:
        raise StoreRefused(f"k: {k}; allowed 1 to {MAX_K}")


def check_count(name: str, value: int) -> None:
    if value < 0:
        raise StoreRefused(f"{name}: {value}; must be 0 or more")


def check_clocks(clocks: Sequence[tuple[str, float]], now: float) -> None:
    """Rate limits' clocks (Store.advance): distinct names, finite costs and time."""
    names = set()
    for i, (name, cost) in enumerate(clocks):
        check_text(f"clocks[{i}].name", name)
        if name in names:
            raise StoreRefused(f"clocks[{i}].name: {name!r} is given twice; names must be distinct")
        names.add(name)
        if not isinstance(cost, int | float) or not math.isfinite(cost) or abs(cost) > MAX_CLOCK_S:
            raise StoreRefused(f"clocks[{i}].cost: {cost!r}; a finite number of seconds, at most {MAX_CLOCK_S:g} "
                               "either way")
    if not math.isfinite(now) or not 0 <= now <= MAX_CLOCK_S:
        raise StoreRefused(f"now: {now!r}; finite unix seconds")


@asynccontextmanager
async def deadline(what: str, timeout_s: float, failures: tuple[type[BaseException], ...]) -> AsyncIterator[None]:
    """Bounds the block by `timeout_s` and turns its failures into StoreUnavailable saying `what` failed."""
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError:  # before `failures`: it is an OSError too
        raise StoreUnavailable(f"{what}: no answer within timeout_s={timeout_s:g}") from None
    except failures as e:
        raise StoreUnavailable(f"{what}: {type(e).__name__}: {e}") from e
