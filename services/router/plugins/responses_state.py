"""The Responses API's state in the store (router process): each stored response as the client got it,
with the conversation that led to it and its answer as chat messages (what `previous_response_id`
carries into the next call) and its own input as items; one item of kind "response" per response, in
its owner's scope (tenant and user), kept `responses_ttl_s`."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from services.router.plugins.store.base import Item, Store

KIND = "response"
MAX_ID_CHARS = 256  # the router's ids are 37; a longer one names nothing stored (no store call is made)
# A payload longer than this is encoded or decoded in a thread, off the event loop that serves every stream.
OFF_LOOP_BYTES = 256 << 10


class Stored(msgspec.Struct, frozen=True):
    """One stored response (its payload in the store)."""
    response: dict[str, Any]  # the response object as the client got it (its final event's, when streamed)
    messages: list[dict[str, Any]]  # the conversation without instructions: the earlier turns, this input, the answer
    input_items: list[dict[str, Any]]  # this request's own input as Responses items, each with an id


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Stored).decode


class ResponsesState:
    """Stored responses by (owner, id). Every call raises StoreUnavailable when the store does not answer."""

    def __init__(self, store: Store, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        """`ttl_s`: how long a response is kept (StoreConfig.responses_ttl_s)."""
        self.store = store
        self.ttl_s = ttl_s
        self._clock = clock

    async def get(self, owner: str, response_id: str) -> tuple[Stored, int] | None:
        """The owner's stored response of that id, and its payload's size in bytes; None for an unknown,
        expired or another owner's one (the same answer for all three: an id tells nobody whether someone
        else has it)."""
        if not usable_id(response_id):
            return None
        item = await self.store.get(KIND, owner, response_id)
        if item is None:
            return None
        if len(item.payload) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(_decode, item.payload), len(item.payload)
        return _decode(item.payload), len(item.payload)

    async def put(self, owner: str, stored: Stored, size: int = 0) -> None:
        """Keep `stored` under its response's id (each id is new); `size`: about its encoded length (the
        request's and the answer's bytes), which decides whether it is encoded off the event loop."""
        now = self._clock()
        payload = await asyncio.to_thread(_encode, stored) if size > OFF_LOOP_BYTES else _encode(stored)
        await self.store.put(Item(KIND, owner, stored.response["id"], payload, created=now,
                                  expires=now + self.ttl_s))

    async def delete(self, owner: str, response_id: str) -> bool:
        """Whether the owner had it (it is gone now)."""
        if not usable_id(response_id):
            return False
        return await self.store.delete(KIND, owner, response_id) > 0


def usable_id(value: object) -> bool:
    """Whether `value` may name something stored: a string of 1 to MAX_ID_CHARS characters without NUL
    (which the stores refuse). Any other names nothing: a 404, never a store call."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and "\x00" not in value


def input_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages (a request's input, as the codec translated it) as the Responses items input_items
    lists: messages with input_text (an assistant's: output_text) parts, reasoning, function calls and
    their outputs, each with an id of its own. A developer message reads back as system, as it was sent."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            items.append({"type": "function_call_output", "id": _new("fco"), "status": "completed",
                          "call_id": message.get("tool_call_id", ""), "output": _text(message.get("content"))})
            continue
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            items.append({"type": "reasoning", "id": _new("rs"), "summary": [],
                          "content": [{"type": "reasoning_text", "text": reasoning}]})
        content = message.get("content")
        if content is not None:
            kind = "output_text" if role == "assistant" else "input_text"
            parts = [{"type": kind, "text": content}] if isinstance(content, str) else \
                [{"type": kind, "text": part.get("text", "")} for part in content if isinstance(part, dict)]
            if kind == "output_text":
                parts = [{**part, "annotations": []} for part in parts]
            items.append({"type": "message", "id": _new("msg"), "status": "completed", "role": role,
                          "content": parts})
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            items.append({"type": "function_call", "id": _new("fc"), "status": "completed",
                          "call_id": call.get("id", ""), "name": function.get("name", ""),
                          "arguments": function.get("arguments", "")})
    return items


def _new(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""
