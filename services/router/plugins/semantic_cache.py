"""The semantic cache (router process): at the request hook, a stored answer to the same conversation
(exact) or to a close paraphrase of its last user turn (semantic, by embedding) answers instead of
upstream; at the response hook, an answer that completed normally is stored for the next one."""
from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import msgspec

from services.router.config.plugins import SemanticCacheConfig
from services.router.plugins.answer import MAX_ANSWER_BYTES, Answer
from services.router.plugins.cache_key import CacheKey, cache_key, uncached_reason
from services.router.plugins.hooks import Exchange
from services.router.plugins.shared import Shared
from services.router.plugins.store.base import Item

log = logging.getLogger("router")

KIND = "cache"
HEADER = b"x-router-cache"  # hit, miss or skip
MATCH_HEADER = b"x-router-cache-match"  # on a hit: exact or semantic
SIMILARITY_HEADER = b"x-router-cache-similarity"  # on a semantic hit: the cosine similarity
# The size bound is kept by a trim of the whole cache every so many puts, not by one per put (a trim
# scans the kind): between two trims a router may add up to TRIM_EVERY_MAX - 1 entries past max_entries,
# and never more than 1% of it.
TRIM_EVERY_MAX = 1000
_KEY_NOTE = "semantic_cache.key"
_VECTOR_NOTE = "semantic_cache.vector"


class _Entry(msgspec.Struct, frozen=True):
    completion: dict[str, Any]  # the chat.completion or text_completion object as upstream gave it


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(_Entry).decode


class SemanticCache:
    name = "semantic_cache"

    def __init__(self, config: SemanticCacheConfig, shared: Shared) -> None:
        self.config = config
        self.store = shared.store
        self.models = shared.models
        self._trim_every = max(1, min(TRIM_EVERY_MAX, config.max_entries // 100))
        self._puts = 0
        stored = {"stop"}
        if config.store_tool_calls:
            stored.add("tool_calls")
        if config.store_truncated:
            stored.add("length")
        self._stored_reasons = frozenset(stored)

    async def request(self, exchange: Exchange) -> dict[str, Any] | None:
        reason = uncached_reason(exchange.chat, exchange.chat_api)
        if reason is not None:
            self._outcome(exchange, "skipped", b"skip")
            return None
        key = cache_key(exchange, self.config.shared)
        exchange.notes[_KEY_NOTE] = key  # kept first: the response hook stores the answer even if the lookup fails
        item = await self.store.get(KIND, key.scope, key.key)
        if item is not None and (hit := self._hit(exchange, item, "exact")) is not None:
            return hit
        if self.config.semantic and key.text is not None:
            vector = await self._embed(key.text)
            exchange.notes[_VECTOR_NOTE] = vector
            found = await self.store.nearest(KIND, key.scope, vector, 1, min_similarity=self.config.threshold)
            if found and (hit := self._hit(exchange, found[0][1], "semantic", found[0][0])) is not None:
                return hit
        self._outcome(exchange, "miss", b"miss")
        return None

    async def response(self, exchange: Exchange, answer: Answer | None, *, answered_by: str | None) -> None:
        key = exchange.notes.get(_KEY_NOTE)
        if answered_by is not None or answer is None or not isinstance(key, CacheKey) or not self._storable(answer):
            return
        payload = _encode(_Entry(answer.completion))
        if len(payload) > MAX_ANSWER_BYTES:  # the bound a streamed answer is recorded under holds for whole ones too
            return
        vector = exchange.notes.get(_VECTOR_NOTE)
        if vector is None and self.config.semantic and key.text is not None:
            vector = await self._embed(key.text)  # the lookup failed before it embedded: the entry still gets one
        now = time.time()
        await self.store.put(Item(KIND, key.scope, key.key, payload, vector, now, now + self.config.ttl_s))
        self._puts += 1
        if self._puts % self._trim_every == 1 % self._trim_every:  # the first put, then every _trim_every-th
            await self.store.trim(KIND, None, self.config.max_entries)

    def _storable(self, answer: Answer) -> bool:
        """A complete answer whose every choice ended as configured: "stop", and "tool_calls" or "length"
        when allowed. An answer with tool calls is one whatever its finish reason (vLLM ends a named
        tool choice's with "stop")."""
        reasons = answer.finish_reasons()
        if not answer.complete or not reasons or any(r not in self._stored_reasons for r in reasons):
            return False
        if not self.config.store_tool_calls:
            for choice in answer.completion.get("choices") or ():
                message = choice.get("message") if isinstance(choice, dict) else None
                if isinstance(message, dict) and message.get("tool_calls"):
                    return False
        return True

    async def _embed(self, text: str) -> tuple[float, ...]:
        embedded = await self.models.embed(self.config.embedder, [text], timeout_s=self.config.timeout_s)
        return tuple(embedded.vectors[0])

    def _hit(self, exchange: Exchange, item: Item, match: str,
             similarity: float | None = None) -> dict[str, Any] | None:
        """The stored answer under a fresh id and time, and the hit's outcome and headers; None (a miss)
        for an entry this version cannot read."""
        try:
            completion = _decode(item.payload).completion
        except msgspec.DecodeError as exc:  # a corrupt payload, or one of another shape (ValidationError is one)
            log.warning("semantic cache: an unreadable entry in scope %s ignored: %s", item.scope, exc)
            return None
        prefix = "chatcmpl-" if exchange.chat_api else "cmpl-"
        self._outcome(exchange, f"hit_{match}", b"hit")
        exchange.headers.append((MATCH_HEADER, match.encode()))
        if similarity is not None:
            exchange.headers.append((SIMILARITY_HEADER, f"{similarity:.4f}".encode()))
        return {**completion, "id": prefix + uuid.uuid4().hex, "created": int(time.time())}

    def _outcome(self, exchange: Exchange, outcome: str, header: bytes) -> None:
        exchange.notes[f"{self.name}.outcome"] = outcome
        exchange.headers.append((HEADER, header))
