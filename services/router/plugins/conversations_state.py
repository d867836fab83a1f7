"""The Conversations API's state in the store (router process): a conversation (its metadata) in a
scope of its owner's conversations, and its items each an item of their own in a scope of the
conversation's, so that two requests (or two routers) adding to one conversation at once lose nothing.
Kind "response", as the Responses state they belong with; neither expires (OpenAI keeps conversations
until they are deleted)."""
from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from services.router.plugins.responses_state import usable_id
from services.router.plugins.store.base import Item, Store

KIND = "response"
MAX_ITEMS = 10_000  # a conversation's longest: more are refused (each request carries them all upstream)
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(dict[str, Any]).decode


class Full(Exception):
    """The conversation holds MAX_ITEMS items already."""


class ConversationsState:
    """Conversations and their items by (owner, id). Every call raises StoreUnavailable when the store
    does not answer."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._clock = clock

    async def create(self, owner: str, metadata: dict[str, str], items: list[dict[str, Any]]) -> dict[str, Any]:
        """A new conversation (its object), holding `items` (given ids here)."""
        conversation_id = f"conv_{uuid.uuid4().hex}"
        conversation = {"id": conversation_id, "object": "conversation", "created_at": int(self._clock()),
                        "metadata": metadata}
        await self.add(owner, conversation_id, items)
        await self._put(owner, conversation)
        return conversation

    async def get(self, owner: str, conversation_id: str) -> dict[str, Any] | None:
        if not usable_id(conversation_id):
            return None
        item = await self.store.get(KIND, _scope(owner), conversation_id)
        return None if item is None else _decode(item.payload)

    async def update(self, owner: str, conversation_id: str, metadata: dict[str, str]) -> dict[str, Any] | None:
        conversation = await self.get(owner, conversation_id)
        if conversation is not None:
            conversation["metadata"] = metadata
            await self._put(owner, conversation)
        return conversation

    async def delete(self, owner: str, conversation_id: str) -> bool:
        if await self.get(owner, conversation_id) is None:
            return False
        await self.store.delete(KIND, _scope(owner, conversation_id))
        await self.store.delete(KIND, _scope(owner), conversation_id)
        return True

    async def add(self, owner: str, conversation_id: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`items` appended, in order, each with an id (its own if it has one); Full past MAX_ITEMS."""
        scope = _scope(owner, conversation_id)
        if items and await self.store.count(KIND, scope) + len(items) > MAX_ITEMS:
            raise Full(f"a conversation holds at most {MAX_ITEMS} items")
        now = self._clock()
        added = []
        for i, item in enumerate(items):
            item = {**item, "id": item.get("id") or f"{_PREFIXES.get(item.get('type', 'message'), 'item')}_"
                                                    f"{uuid.uuid4().hex}"}
            # Their order is their creation time's: a microsecond apart within one call.
            await self.store.put(Item(KIND, scope, item["id"], _encode(item), created=now + i * 1e-6))
            added.append(item)
        return added

    async def items(self, owner: str, conversation_id: str) -> list[dict[str, Any]]:
        """Every item, oldest first."""
        found = await self.store.items(KIND, _scope(owner, conversation_id), MAX_ITEMS)
        return [_decode(item.payload) for item in reversed(found)]

    async def item(self, owner: str, conversation_id: str, item_id: str) -> dict[str, Any] | None:
        if not usable_id(item_id):
            return None
        found = await self.store.get(KIND, _scope(owner, conversation_id), item_id)
        return None if found is None else _decode(found.payload)

    async def delete_item(self, owner: str, conversation_id: str, item_id: str) -> bool:
        if not usable_id(item_id):
            return False
        return await self.store.delete(KIND, _scope(owner, conversation_id), item_id) > 0

    async def _put(self, owner: str, conversation: dict[str, Any]) -> None:
        await self.store.put(Item(KIND, _scope(owner), conversation["id"], _encode(conversation),
                                  created=float(conversation["created_at"])))


_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def _scope(owner: str, conversation_id: str | None = None) -> str:
    """The scope of an owner's conversations, or of one conversation's items: a digest, so that it is
    never an owner's own scope (a tenant digest, and a user name that may hold any character), where
    its responses are."""
    name = owner if conversation_id is None else f"{owner}\x00{conversation_id}"
    return "conv:" + hashlib.sha256(name.encode()).hexdigest()
