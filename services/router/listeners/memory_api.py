"""GET and DELETE /v1/memory (router process): a caller lists and erases their own memories (the memory
plugin's), and nobody else's. The caller is who the memory plugin keeps them for: the API key's tenant,
and within it the user named by the `user` query parameter or the x-router-user header."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl

import msgspec

from services.router.config import RouterConfig
from services.router.config.plugins import MemoryConfig
from services.router.errors import HTTPError
from services.router.plugins.identity import tenant_of, user_of
from services.router.plugins.memory import KIND, MemoryRecord
from services.router.plugins.store.base import Item, Store, StoreUnavailable

MEMORY_PATH = "/v1/memory"
METHODS = ("GET", "HEAD", "DELETE")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_OFFSET = 2**31 - 1
_json = msgspec.json.Encoder()


def routed(path: str) -> bool:
    """The API's paths: the collection and one memory under it."""
    return path == MEMORY_PATH or path.startswith(MEMORY_PATH + "/")


def memory_in_use(config: RouterConfig) -> bool:
    """Whether some entry or decision runs the memory plugin (else there are no memories to serve)."""
    return config.store is not None and any(
        isinstance(plugin, MemoryConfig)
        for entry in config.entries.values()
        for plugins in (entry.plugins, *(rule.plugins or () for rule in entry.decisions))
        for plugin in plugins)


class MemoryAPI:
    def __init__(self, store: Store | None, in_use: bool) -> None:
        """`in_use`: memory_in_use(config); without it (or a store) every call is a 404 that says why."""
        self.store = store if in_use else None

    async def answer(self, method: str, path: str, query_string: bytes, headers: Iterable[tuple[bytes, bytes]],
                     keyed: bool) -> bytes:
        """The JSON body of a 200; HTTPError otherwise (400 naming the parameter, 404, 405, 503)."""
        if self.store is None:
            raise HTTPError(404, "This router keeps no memories: no entry of its config uses the memory plugin.")
        memory_id = path[len(MEMORY_PATH) + 1:] if path != MEMORY_PATH else None
        if memory_id == "":
            raise HTTPError(404, f"no route for {method} {path}")
        if method not in METHODS:
            allow = ", ".join(METHODS)
            raise HTTPError(405, f"{path} accepts {allow}", headers=[(b"allow", allow.encode())])
        listing = memory_id is None and method != "DELETE"
        query = _query(query_string, ("limit", "offset", "user") if listing else ("user",))
        headers = list(headers)
        try:
            user = user_of({"user": query["user"]} if "user" in query else {}, headers)
        except ValueError as exc:
            raise HTTPError(400, str(exc), param=str(exc).partition(":")[0]) from None
        tenant = tenant_of(keyed, headers)
        owner = tenant if user is None else f"{tenant}/{user}"
        try:
            if listing:
                limit = _integer(query, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
                offset = _integer(query, "offset", 0, 0, MAX_OFFSET)
                return _json.encode(await self._list(owner, limit, offset))
            if memory_id is None:
                return _json.encode({"object": "list", "deleted": await self.store.delete(KIND, owner)})
            return _json.encode(await self._one(method, owner, memory_id))
        except StoreUnavailable as exc:
            raise HTTPError(503, f"The memory store is unavailable: {exc}") from None

    async def _list(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        assert self.store is not None
        items = await self.store.items(KIND, owner, limit + 1, offset)
        return {"object": "list", "data": [_public(item) for item in items[:limit]], "has_more": len(items) > limit}

    async def _one(self, method: str, owner: str, memory_id: str) -> dict[str, Any]:
        """Another owner's memory is answered as an unknown one: whether an id exists is theirs to know."""
        assert self.store is not None
        if method == "DELETE":
            if await self.store.delete(KIND, owner, memory_id):
                return {"id": memory_id, "object": "memory", "deleted": True}
        else:
            item = await self.store.get(KIND, owner, memory_id)
            if item is not None:
                return _public(item)
        raise HTTPError(404, f"No memory found with id {memory_id!r}.")


def _public(item: Item) -> dict[str, Any]:
    try:
        content = msgspec.json.decode(item.payload, type=MemoryRecord).content
    except msgspec.DecodeError:
        content = ""  # written by another version: listed (and erasable) all the same
    return {"id": item.key, "object": "memory", "created_at": int(item.created), "content": content}


def _query(raw: bytes, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query parameters, each at most once, each one of `allowed`; 400 naming the one that is not."""
    try:
        pairs = parse_qsl(raw.decode("ascii"), keep_blank_values=True, strict_parsing=False, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise HTTPError(400, "the query string is not valid percent-encoded UTF-8") from None
    query: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            raise HTTPError(400, f"{name}: unknown query parameter (allowed: {', '.join(allowed)})", param=name)
        if name in query:
            raise HTTPError(400, f"{name}: given more than once", param=name)
        query[name] = value
    return query


def _integer(query: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    # Digits only: int() would also take " 5", "+5", "5_0" and other scripts' digits.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 12) or not low <= int(raw) <= high:
        raise HTTPError(400, f"{name}: must be an integer from {low} to {high}; got {raw!r}", param=name)
    return int(raw)
