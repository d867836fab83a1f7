"""The memory plugin (router process): each complete turn of a user's conversations (their message and
the answer) is kept as one memory, embedded; at the request hook the memories nearest to the last user
turn are given to the model in a system message, within a token budget. Per owner (plugins/identity.py):
the API key's tenant, and within it the user where one is named."""
from __future__ import annotations

import secrets
import time
from typing import Any

import msgspec

from services.router.config.plugins import MemoryConfig
from services.router.plugins.answer import Answer
from services.router.plugins.hooks import Exchange
from services.router.plugins.recall import cut, decoded, give, last_user_text, recall_query, text_of
from services.router.plugins.shared import Shared
from services.router.plugins.store.base import Item, Store

KIND = "memory"
PREAMBLE = ("Notes from earlier conversations with this user, most relevant first. Use them where they help; "
            "they may be out of date.")
# A turn keeps at most this many characters of each side: a memory is a reminder, not a transcript.
MAX_SIDE_CHARS = 4000
STORE_EMBED_TIMEOUT_S = 30.0  # the response hook's embedding (in the background: no request waits on it)


class MemoryRecord(msgspec.Struct):
    """What a memory's payload holds."""
    content: str


def new_id() -> str:
    return "mem_" + secrets.token_hex(12)


class Memory:
    name = "memory"

    def __init__(self, config: MemoryConfig, shared: Shared) -> None:
        self.config = config
        self.store: Store = shared.store
        self.models = shared.models

    async def request(self, exchange: Exchange) -> dict[str, Any] | None:
        outcome = f"{self.name}.outcome"
        query = recall_query(exchange, outcome)
        if query is None:
            return None
        messages, text = query
        embedded = await self.models.embed(self.config.embedder, [text], timeout_s=self.config.timeout_s)
        found = await self.store.nearest(KIND, exchange.owner, tuple(embedded.vectors[0]), self.config.top_k,
                                         self.config.min_similarity)
        memories = decoded(found, MemoryRecord)
        give(exchange, outcome, messages, PREAMBLE, [m.content for m in memories], self.config.max_tokens)
        return None

    async def response(self, exchange: Exchange, answer: Answer | None, *, answered_by: str | None) -> None:
        """A complete answer with text: the turn kept, then the owner's oldest beyond max_memories dropped."""
        if answer is None or not answer.complete or not exchange.chat_api:
            return
        content = turn(exchange.chat.get("messages"), answer.completion)
        if content is None:
            return
        embedded = await self.models.embed(self.config.embedder, [content], timeout_s=STORE_EMBED_TIMEOUT_S)
        item = Item(KIND, exchange.owner, new_id(), msgspec.json.encode(MemoryRecord(content)),
                    tuple(embedded.vectors[0]), created=time.time())
        await self.store.put(item)
        await self.store.trim(KIND, exchange.owner, self.config.max_memories)


def turn(messages: Any, completion: dict[str, Any]) -> str | None:
    """One memory's text: the last user message and the first choice's reply (None: either has no text,
    as an answer that is only tool calls)."""
    question = last_user_text(messages)
    choices = completion.get("choices") or ()
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    reply = text_of(message.get("content")).strip() if isinstance(message, dict) else ""
    if not question or not reply:
        return None
    return f"User: {_side(question)}\nAssistant: {_side(reply)}"


def _side(text: str) -> str:
    return text if len(text) <= MAX_SIDE_CHARS else cut(text, MAX_SIDE_CHARS) + "…"
