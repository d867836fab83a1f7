"""The Responses API's state over HTTP (router process): a request's `previous_response_id` carried in
(the stored conversation put before its input), its response stored as it goes out (the last piece is
held until it is stored, so that the client can chain from it at once), and GET and DELETE
/v1/responses/{id} and GET /v1/responses/{id}/input_items, each for the response's owner only."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import msgspec
from starlette.types import Message, Scope, Send

from services.router.decision.signals import request_text
from services.router.errors import HTTPError
from services.router.listeners.asgi import send_json
from services.router.listeners.body_workers import Parsed
from services.router.listeners.codecs.codec import Codec, CodecError
from services.router.listeners.codecs.responses import CHOSEN_ID, RESPONSES, response_id
from services.router.listeners.codecs.responses_request import input_messages
from services.router.listeners.listener import Listener
from services.router.listeners.sse import SSEData
from services.router.metrics import RouterMetrics
from services.router.plugins.identity import tenant_of, user_of
from services.router.plugins.responses_state import OFF_LOOP_BYTES, ResponsesState, Stored, input_items
from services.router.plugins.store.base import StoreUnavailable

log = logging.getLogger("router")
PREFIX = "/v1/responses/"
API = "responses_state"  # these routes' name in the metrics (a listener serves them where it serves `responses`)
NO_STATE = "this router keeps no response state (its config has no `store`, or `store.responses` is false)"
ORDERS = ("asc", "desc")
MAX_LIMIT = 100
_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()
_PREVIOUS = "previous_response_id"


@dataclass(slots=True)
class Turn:
    """One Responses request whose response is to be stored."""
    owner: str
    id: str  # the response's, chosen up front
    messages: list[dict[str, Any]]  # the conversation sent but for instructions: the earlier turns, then this input
    input_from: int  # where this request's own input begins in `messages`
    size: int  # about the bytes of `messages` (the request's and the earlier turns' payload)


class ResponsesAPI:
    def __init__(self, state: ResponsesState | None, metrics: RouterMetrics) -> None:
        """`state` None: the router keeps none (previous_response_id is a 400, the routes answer 404)."""
        self.state = state
        self.metrics = metrics

    # ---- a Responses request ----

    async def begin(self, listener: Listener, codec: Codec, parsed: Parsed, size: int,
                    scope: Scope) -> Turn | None:
        """A Responses request made ready for the state: the earlier turns of `previous_response_id` put
        before its input (in `parsed`'s upstream body, and in the text routing reads), and the request
        the codec's translations read given the response's id and whether it is stored. The Turn that
        stores the response as it goes out, or None (not a Responses request, or not stored). `size`:
        the request body's bytes."""
        if codec.name != RESPONSES.name:
            return None
        request = parsed.request
        previous = request.get(_PREVIOUS)
        if self.state is None:
            if previous is not None:
                raise HTTPError(400, f"{_PREVIOUS}: is not supported: {NO_STATE}", param=_PREVIOUS)
            parsed.request = {**request, "store": False}  # echoed: this response is not kept
            return None
        owner = owner_of(listener, request, scope["headers"])
        history: list[dict[str, Any]] = []
        if previous is not None:
            stored, stored_size = await self._previous(owner, previous)
            history, size = stored.messages, size + stored_size
        keep = request.get("store") is not False
        if not keep and not history:
            return None
        # The codec put the instructions first, as one system message; the earlier turns go after them
        # (an earlier response's instructions are not carried, as OpenAI's are not).
        skip = 1 if request.get("instructions") is not None else 0
        if parsed.bulk or size > OFF_LOOP_BYTES:
            conversation = await asyncio.to_thread(_carry, parsed, skip, history)
        else:
            conversation = _carry(parsed, skip, history)
        if not keep:
            return None
        turn = Turn(owner, response_id(), conversation, len(history), size)
        parsed.request = {**request, CHOSEN_ID: turn.id, "store": True}
        return turn

    async def _previous(self, owner: str, previous: str) -> tuple[Stored, int]:
        assert self.state is not None  # asked only when the router keeps state
        try:
            stored = await self.state.get(owner, previous)
        except StoreUnavailable as exc:
            self.metrics.store_errors.labels("responses").inc()
            raise HTTPError(503, f"{_PREVIOUS}: the response store did not answer ({exc}), so the earlier "
                                 "turns cannot be carried; retry", param=_PREVIOUS) from None
        if stored is None:  # unknown, expired, or another owner's: one answer for all
            raise HTTPError(404, f"Previous response with id '{previous}' not found.", param=_PREVIOUS)
        return stored

    def sending(self, turn: Turn | None, send: Send) -> Send:
        """`send` for the answer: as it is, or (a stored response) holding its last piece until stored."""
        return send if turn is None else _Keeping(send, self, turn)

    async def keep(self, turn: Turn, last: bytes) -> None:
        """Store the response whose last piece (a whole body, or a stream's tail) is `last`. Fails open:
        the client has its answer whatever the store does (logged, and counted in router_store_errors)."""
        assert self.state is not None  # a Turn is only made when the router keeps state
        response = _final(last)
        if response is None or response.get("id") != turn.id or response.get("status") not in ("completed",
                                                                                               "incomplete"):
            return  # failed, or not a response of ours: nothing to chain from
        try:
            answer = input_messages(response.get("output") or [])
        except CodecError:  # an answer of reasoning alone carries no message
            answer = []
        stored = Stored(response, turn.messages + answer, input_items(turn.messages[turn.input_from:]))
        try:
            await self.state.put(turn.owner, stored, turn.size + len(last))
        except StoreUnavailable as exc:
            self.metrics.store_errors.labels("responses").inc()
            log.warning("response %s not stored: %s", turn.id, exc)

    # ---- GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items ----

    async def serve(self, listener: Listener, scope: Scope, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        key, _, rest = path[len(PREFIX):].partition("/")
        if not key or rest not in ("", "input_items") or "responses" not in listener.config.apis:
            raise HTTPError(404, f"no route for {method} {path} on listener {listener.name!r}")
        allowed = ("GET", "HEAD") if rest else ("GET", "HEAD", "DELETE")
        if method not in allowed:
            raise HTTPError(405, f"{path} accepts {', '.join(allowed)} only",
                            headers=[(b"allow", ", ".join(allowed).encode())])
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        page = _page_query(query) if rest else None
        if not rest and method != "DELETE" and _last(query, "stream") in ("true", "1"):
            raise HTTPError(400, "stream: a stored response is answered whole, never replayed as a stream",
                            param="stream")
        if self.state is None:
            raise HTTPError(404, f"Response with id '{key}' not found: {NO_STATE}")
        owner = owner_of(listener, {}, scope["headers"])
        try:
            if method == "DELETE":
                found = await self.state.delete(owner, key)
                body: dict[str, Any] = {"id": key, "object": "response", "deleted": True}
            else:
                got = await self.state.get(owner, key)
                found = got is not None
                if got is not None:
                    body = got[0].response if page is None else _page(got[0].input_items, *page)
        except StoreUnavailable as exc:
            self.metrics.store_errors.labels("responses").inc()
            raise HTTPError(503, f"the response store did not answer ({exc}); retry") from None
        if not found:
            raise HTTPError(404, f"Response with id '{key}' not found.")
        self.metrics.requests.labels(listener.name, API, "200").inc()
        await send_json(send, 200, _json.encode(body))


class _Keeping:
    """The answer's send for a stored response: every piece goes on as it comes, but the last, which
    waits until the response is stored (a client that chains from it next is never told it is unknown)."""

    __slots__ = ("_api", "_ok", "_send", "_turn")

    def __init__(self, send: Send, api: ResponsesAPI, turn: Turn) -> None:
        self._send, self._api, self._turn = send, api, turn
        self._ok = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._ok = message["status"] == 200
        elif self._ok and message["type"] == "http.response.body" and not message.get("more_body", False):
            await self._api.keep(self._turn, message.get("body", b""))
        await self._send(message)


def owner_of(listener: Listener, request: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> str:
    """Whose a response is, as the plugins' Exchange.owner says: the tenant (a digest of the API key),
    and within it the user the request names (`user`, or the x-router-user header); 400 for a bad user."""
    tenant = tenant_of(bool(listener.keys), headers)
    try:
        user = user_of(request, headers)
    except ValueError as exc:
        raise HTTPError(400, str(exc), param=str(exc).partition(":")[0]) from None
    return tenant if user is None else f"{tenant}/{user}"


def _carry(parsed: Parsed, skip: int, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`history` put into the upstream body after its first `skip` messages (the instructions); the
    conversation without them (history, then this input). A split body's bulk is decoded and re-encoded."""
    bulk = _decode.decode(parsed.bulk) if parsed.bulk else None
    messages: list[dict[str, Any]] = (bulk if bulk is not None else parsed.chat)["messages"]
    own = messages[skip:]
    if history:
        whole = [*messages[:skip], *history, *own]
        if bulk is not None:
            parsed.bulk = _json.encode({**bulk, "messages": whole})
        else:
            parsed.chat["messages"] = whole
        parsed.text = request_text({"messages": whole})  # routed on the whole conversation, as a chat client's
    return [*history, *own]


def _final(last: bytes) -> dict[str, Any] | None:
    """The response object in a response's last piece: the whole JSON body, or the last event of a
    stream's tail (response.completed, .incomplete or .failed); None if it holds none."""
    try:
        if last.lstrip().startswith(b"{"):
            value = _decode.decode(last)
        else:
            reader = SSEData()
            events = reader.feed(last) + reader.finish()
            value = _decode.decode(events[-1]).get("response") if events else None
    except (msgspec.DecodeError, AttributeError):
        return None
    return value if isinstance(value, dict) else None


def _last(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _page_query(query: dict[str, list[str]]) -> tuple[int, str, str | None]:
    """input_items' limit (1-100, 20), order (asc or desc, desc) and after (an item id); 400 naming the field."""
    raw = _last(query, "limit")
    limit = 20
    if raw is not None:
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
            raise HTTPError(400, f"limit: must be an integer in [1, {MAX_LIMIT}], got {raw!r}", param="limit")
        limit = int(raw)
    order = _last(query, "order") or "desc"
    if order not in ORDERS:
        raise HTTPError(400, f"order: must be one of {list(ORDERS)}, got {order!r}", param="order")
    return limit, order, _last(query, "after") or None


def _page(items: list[dict[str, Any]], limit: int, order: str, after: str | None) -> dict[str, Any]:
    """One page of input items in OpenAI's list shape."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        at = next((i for i, item in enumerate(ordered) if item.get("id") == after), None)
        if at is None:
            raise HTTPError(400, f"after: no input item of this response has the id {after!r}", param="after")
        ordered = ordered[at + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit}
