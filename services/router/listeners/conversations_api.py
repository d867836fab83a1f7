"""The OpenAI Conversations API over HTTP (router process): conversations and their items, each for its
owner only (plugins/conversations_state.py keeps them), and what a Responses request's `conversation`
needs: its items, checked and read as chat messages. Served where the Responses API is."""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from services.router.errors import HTTPError
from services.router.listeners.codecs.codec import CodecError
from services.router.listeners.codecs.responses_request import input_messages
from services.router.listeners.json_body import BodyError, decode_object
from services.router.plugins.conversations_state import MAX_ITEMS, ConversationsState, Full
from services.router.plugins.responses_state import MAX_ID_CHARS, usable_id

log = logging.getLogger("router")
PREFIX = "/v1/conversations"
MAX_ADD = 20  # items per create or add, as OpenAI's
MAX_METADATA = 16  # keys, of at most 64 characters, values of at most 512, as OpenAI's
_json = msgspec.json.Encoder()
Body = Callable[[], Awaitable[bytes]]


class ConversationsAPI:
    def __init__(self, state: ConversationsState) -> None:
        self.state = state

    async def serve(self, owner: str, method: str, path: str, query: dict[str, list[str]],
                    body: Body) -> dict[str, Any]:
        """The answer to one Conversations route for `owner`; HTTPError (400, 404, 405) naming what is wrong."""
        parts = path[len(PREFIX):].strip("/").split("/") if path != PREFIX else []
        if not parts:
            _allow(method, ("POST",), path)
            request = await _body(body)
            _known(request, ("items", "metadata"))
            items = checked_items(request.get("items"), "items")
            return await self.state.create(owner, _metadata(request.get("metadata")), items)
        conversation_id, rest = parts[0], parts[1:]
        if rest == []:
            _allow(method, ("GET", "HEAD", "POST", "DELETE"), path)
            if method == "POST":
                request = await _body(body)
                _known(request, ("metadata",))
                return _found(await self.state.update(owner, conversation_id, _metadata(request.get("metadata"))),
                              conversation_id)
            if method == "DELETE":
                if not await self.state.delete(owner, conversation_id):
                    raise _missing(conversation_id)
                return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}
            return _found(await self.state.get(owner, conversation_id), conversation_id)
        if rest == ["items"]:
            _allow(method, ("GET", "HEAD", "POST"), path)
            if method == "POST":
                request = await _body(body)
                _known(request, ("items",))
                items = checked_items(request.get("items"), "items", required=True)
                _found(await self.state.get(owner, conversation_id), conversation_id)
                return list_page(await self._add(owner, conversation_id, items), len(items), "asc", None)
            page = page_query(query)
            _found(await self.state.get(owner, conversation_id), conversation_id)
            return list_page(await self.state.items(owner, conversation_id), *page)
        if len(rest) == 2 and rest[0] == "items":
            _allow(method, ("GET", "HEAD", "DELETE"), path)
            conversation = _found(await self.state.get(owner, conversation_id), conversation_id)
            if method == "DELETE":
                if not await self.state.delete_item(owner, conversation_id, rest[1]):
                    raise HTTPError(404, f"Item with id '{rest[1]}' not found.")
                return conversation
            item = await self.state.item(owner, conversation_id, rest[1])
            if item is None:
                raise HTTPError(404, f"Item with id '{rest[1]}' not found.")
            return item
        raise HTTPError(404, f"no route for {method} {path}")

    async def _add(self, owner: str, conversation_id: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            return await self.state.add(owner, conversation_id, items)
        except Full as exc:
            raise HTTPError(400, f"items: {exc}", param="items") from None

    async def history(self, owner: str, conversation: Any) -> tuple[str, list[dict[str, Any]]]:
        """A Responses request's `conversation` (an id, or {"id"}): its id and its items as chat messages;
        400 for a bad value, 404 for a conversation the owner does not have."""
        conversation_id = conversation.get("id") if isinstance(conversation, dict) else conversation
        if not isinstance(conversation_id, str) or not conversation_id:
            raise HTTPError(400, "conversation: must be a conversation id, or an object with its `id`",
                            param="conversation")
        if await self.state.get(owner, conversation_id) is None:
            raise HTTPError(404, f"Conversation with id '{conversation_id}' not found.", param="conversation")
        items = await self.state.items(owner, conversation_id)
        if len(items) >= MAX_ITEMS:
            raise HTTPError(400, f"conversation: holds {MAX_ITEMS} items, the most one may; start another",
                            param="conversation")
        try:
            return conversation_id, input_messages(items) if items else []
        except CodecError as exc:  # items were checked when added: only a reasoning item alone is dropped
            log.warning("conversation %s: items not carried: %s", conversation_id, exc)
            return conversation_id, []


def checked_items(items: Any, where: str, *, required: bool = False) -> list[dict[str, Any]]:
    """Items to add: at most MAX_ADD input items that translate as a Responses input does (a 400 naming
    the item otherwise), a message's string content as its one text part, each with its status."""
    if items is None and not required:
        return []
    if not isinstance(items, list) or not items and required or len(items) > MAX_ADD:
        raise HTTPError(400, f"{where}: must be a list of 1 to {MAX_ADD} input items", param=where)
    if not items:
        return []
    try:
        input_messages(items)
    except CodecError as exc:
        param = where + exc.param[len("input"):] if exc.param.startswith("input") else where
        raise HTTPError(400, f"{param}: {exc.message}", param=param) from None
    for i, item in enumerate(items):
        if item.get("id") is not None and not usable_id(item["id"]):
            raise HTTPError(400, f"{where}[{i}].id: must be a string of 1 to {MAX_ID_CHARS} characters without NUL",
                            param=f"{where}[{i}].id")
    return [_normal(item) for item in items]


def _normal(item: dict[str, Any]) -> dict[str, Any]:
    item = {"type": "message", **item, "status": item.get("status") or "completed"}
    if item["type"] == "message" and isinstance(item.get("content"), str):
        kind = "output_text" if item.get("role") == "assistant" else "input_text"
        item["content"] = [{"type": kind, "text": item["content"]}]
    return item


def page_query(query: dict[str, list[str]]) -> tuple[int, str, str | None]:
    """A list's limit (1-100, 20), order (asc or desc, desc) and after (an item id); 400 naming the field."""
    raw = _last(query, "limit")
    limit = 20
    if raw is not None:
        if not raw.isdigit() or not 1 <= int(raw) <= 100:
            raise HTTPError(400, f"limit: must be an integer in [1, 100], got {raw!r}", param="limit")
        limit = int(raw)
    order = _last(query, "order") or "desc"
    if order not in ("asc", "desc"):
        raise HTTPError(400, f"order: must be one of ['asc', 'desc'], got {order!r}", param="order")
    return limit, order, _last(query, "after") or None


def list_page(items: list[dict[str, Any]], limit: int, order: str, after: str | None) -> dict[str, Any]:
    """One page of items (given oldest first) in OpenAI's list shape."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        at = next((i for i, item in enumerate(ordered) if item.get("id") == after), None)
        if at is None:
            raise HTTPError(400, f"after: no item of this list has the id {after!r}", param="after")
        ordered = ordered[at + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit}


def _last(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


async def _body(body: Body) -> dict[str, Any]:
    try:
        return decode_object(await body())
    except BodyError as exc:
        raise HTTPError(400, exc.message, param=exc.param or None) from None


def _known(request: dict[str, Any], fields: tuple[str, ...]) -> None:
    for name in request:
        if name not in fields:
            raise HTTPError(400, f"{name}: unknown field; known fields: {', '.join(fields)}", param=name)


def _metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA or not all(
            isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items()):
        raise HTTPError(400, f"metadata: must be an object of at most {MAX_METADATA} string values (keys of at "
                             "most 64 characters, values of at most 512)", param="metadata")
    return metadata


def _allow(method: str, allowed: tuple[str, ...], path: str) -> None:
    if method not in allowed:
        raise HTTPError(405, f"{path} accepts {', '.join(allowed)} only",
                        headers=[(b"allow", ", ".join(allowed).encode())])


def _missing(conversation_id: str) -> HTTPError:
    return HTTPError(404, f"Conversation with id '{conversation_id}' not found.")


def _found(conversation: dict[str, Any] | None, conversation_id: str) -> dict[str, Any]:
    if conversation is None:
        raise _missing(conversation_id)
    return conversation
