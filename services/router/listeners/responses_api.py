"""The Responses API's state over HTTP (router process): a request's `previous_response_id` or
`conversation` carried in (the earlier turns put before its input), its response stored and its turn
added to its conversation as it goes out (the last piece is held until then, so that the client can
chain from it at once), GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items, and the
Conversations API (listeners/conversations_api.py), each for the owner only."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import msgspec
from starlette.types import Message, Scope, Send

from services.router.backends.sse import SSEData
from services.router.config.plugins import StoreConfig
from services.router.decision.signals import request_text
from services.router.errors import HTTPError
from services.router.listeners.asgi import send_json
from services.router.listeners.body_workers import Parsed
from services.router.listeners.codecs.codec import Codec, CodecError
from services.router.listeners.codecs.responses import CHOSEN_ID, RESPONSES, response_id
from services.router.listeners.codecs.responses_request import input_messages
from services.router.listeners.conversations_api import PREFIX as CONVERSATIONS
from services.router.listeners.conversations_api import Body, ConversationsAPI, list_page, page_query
from services.router.listeners.listener import Listener
from services.router.metrics import RouterMetrics
from services.router.plugins.conversations_state import ConversationsState, Full
from services.router.plugins.identity import tenant_of, user_of
from services.router.plugins.responses_state import OFF_LOOP_BYTES, ResponsesState, Stored, input_items
from services.router.plugins.store.base import Store, StoreUnavailable

log = logging.getLogger("router")
PREFIX = "/v1/responses/"
API = "responses_state"  # these routes' name in the metrics (a listener serves them where it serves `responses`)
NO_STATE = "this router keeps no response state (its config has no `store`, or `store.responses` is false)"
_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()
_PREVIOUS = "previous_response_id"
_CONVERSATION = "conversation"


def is_state_path(path: str) -> bool:
    """Whether `path` is one of these routes (served where the listener serves `responses`)."""
    return path.startswith(PREFIX) or path == CONVERSATIONS or path.startswith(CONVERSATIONS + "/")


@dataclass(slots=True)
class Turn:
    """One Responses request whose response is to be stored, or added to a conversation."""
    owner: str
    id: str  # the response's, chosen up front
    messages: list[dict[str, Any]]  # the conversation sent but for instructions: the earlier turns, then this input
    input_from: int  # where this request's own input begins in `messages`
    size: int  # about the bytes of `messages` (the request's and the earlier turns' payload)
    store: bool = True  # the response is stored (the request's `store`)
    conversation: str | None = None  # the conversation its input and output items are added to


class ResponsesAPI:
    def __init__(self, state: ResponsesState | None, metrics: RouterMetrics,
                 conversations: ConversationsAPI | None = None) -> None:
        """`state` None: the router keeps none (previous_response_id and conversation are 400s, the
        routes answer 404)."""
        self.state = state
        self.metrics = metrics
        self.conversations = conversations

    # ---- a Responses request ----

    async def begin(self, listener: Listener, codec: Codec, parsed: Parsed, size: int,
                    scope: Scope) -> Turn | None:
        """A Responses request made ready for the state: the earlier turns of `previous_response_id` (or
        the items of its `conversation`) put before its input, in `parsed`'s upstream body and in the
        text routing reads; and the request the codec's translations read given the response's id,
        whether it is stored and its conversation. The Turn that keeps the response as it goes out, or
        None (not a Responses request, or nothing to keep). `size`: the request body's bytes."""
        if codec.name != RESPONSES.name:
            return None
        request = parsed.request
        previous, conversation = request.get(_PREVIOUS), request.get(_CONVERSATION)
        if self.state is None or self.conversations is None:
            for name, value in ((_PREVIOUS, previous), (_CONVERSATION, conversation)):
                if value is not None:
                    raise HTTPError(400, f"{name}: is not supported: {NO_STATE}", param=name)
            parsed.request = {**request, "store": False}  # echoed: this response is not kept
            return None
        if previous is not None and conversation is not None:
            raise HTTPError(400, f"{_PREVIOUS}: cannot be used together with conversation", param=_PREVIOUS)
        owner = owner_of(listener, request, scope["headers"])
        history: list[dict[str, Any]] = []
        conversation_id = None
        if previous is not None:
            stored, stored_size = await self._previous(owner, previous)
            history, size = stored.messages, size + stored_size
        elif conversation is not None:
            conversation_id, history = await self._conversation(owner, conversation)
        keep = request.get("store") is not False
        if not keep and not history and conversation_id is None:
            return None  # nothing to carry in, nothing to keep
        # The codec put the instructions first, as one system message; the earlier turns go after them
        # (an earlier response's instructions are not carried, as OpenAI's are not).
        skip = 1 if request.get("instructions") is not None else 0
        if parsed.bulk or size > OFF_LOOP_BYTES:
            whole = await asyncio.to_thread(_carry, parsed, skip, history)
        else:
            whole = _carry(parsed, skip, history)
        if not keep and conversation_id is None:
            return None
        turn = Turn(owner, response_id(), whole, len(history), size, keep, conversation_id)
        parsed.request = {**request, CHOSEN_ID: turn.id, "store": keep}
        if conversation_id is not None:
            parsed.request[_CONVERSATION] = {"id": conversation_id}  # echoed as OpenAI does
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

    async def _conversation(self, owner: str, conversation: Any) -> tuple[str, list[dict[str, Any]]]:
        assert self.conversations is not None  # asked only when the router keeps state
        try:
            return await self.conversations.history(owner, conversation)
        except StoreUnavailable as exc:
            self.metrics.store_errors.labels("responses").inc()
            raise HTTPError(503, f"conversation: the store did not answer ({exc}), so its items cannot be "
                                 "carried; retry", param=_CONVERSATION) from None

    def sending(self, turn: Turn | None, send: Send) -> Send:
        """`send` for the answer: as it is, or (a Turn) holding its last piece until the response is kept."""
        return send if turn is None else _Keeping(send, self, turn)

    async def keep(self, turn: Turn, last: bytes) -> None:
        """Store the response whose last piece (a whole body, or a stream's tail) is `last`, and add its
        input and output items to its conversation. Fails open: the client has its answer whatever the
        store does (logged, and counted in router_store_errors)."""
        assert self.state is not None and self.conversations is not None  # a Turn is only made with state
        response = _final(last)
        if response is None or response.get("id") != turn.id or response.get("status") not in ("completed",
                                                                                               "incomplete"):
            return  # failed, or not a response of ours: nothing to chain from
        try:
            answer = input_messages(response.get("output") or [])
        except CodecError:  # an answer of reasoning alone carries no message
            answer = []
        own = input_items(turn.messages[turn.input_from:])
        try:
            if turn.store:
                await self.state.put(turn.owner, Stored(response, turn.messages + answer, own), turn.size + len(last))
            if turn.conversation is not None:
                await self.conversations.state.add(turn.owner, turn.conversation, own + list(response["output"]))
        except StoreUnavailable as exc:
            self.metrics.store_errors.labels("responses").inc()
            log.warning("response %s not kept: %s", turn.id, exc)
        except ValueError as exc:  # past a store's limit (a payload over 64 MiB): the answer still goes out
            log.warning("response %s not kept: %s", turn.id, exc)
        except Full as exc:
            log.warning("response %s not added to conversation %s: %s", turn.id, turn.conversation, exc)

    # ---- the routes ----

    async def serve(self, listener: Listener, scope: Scope, send: Send, body: Body) -> None:
        """GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items, and the Conversations
        API's routes (`body` reads the request's body)."""
        path, method = scope["path"], scope["method"]
        if "responses" not in listener.config.apis:
            raise HTTPError(404, f"no route for {method} {path} on listener {listener.name!r}")
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        try:
            if path.startswith(PREFIX):
                answer = await self._responses(listener, scope, query)
            elif self.conversations is None:
                raise HTTPError(404, f"no conversation: {NO_STATE}")
            else:
                answer = await self.conversations.serve(owner_of(listener, {}, scope["headers"]), method, path,
                                                        query, body)
        except StoreUnavailable as exc:
            self.metrics.store_errors.labels("responses").inc()
            raise HTTPError(503, f"the store did not answer ({exc}); retry") from None
        self.metrics.requests.labels(listener.name, API, "200").inc()
        await send_json(send, 200, _json.encode(answer))

    async def _responses(self, listener: Listener, scope: Scope, query: dict[str, list[str]]) -> dict[str, Any]:
        path, method = scope["path"], scope["method"]
        key, _, rest = path[len(PREFIX):].partition("/")
        if not key or rest not in ("", "input_items"):
            raise HTTPError(404, f"no route for {method} {path} on listener {listener.name!r}")
        allowed = ("GET", "HEAD") if rest else ("GET", "HEAD", "DELETE")
        if method not in allowed:
            raise HTTPError(405, f"{path} accepts {', '.join(allowed)} only",
                            headers=[(b"allow", ", ".join(allowed).encode())])
        page = page_query(query) if rest else None
        if not rest and method != "DELETE" and _last(query, "stream") in ("true", "1"):
            raise HTTPError(400, "stream: a stored response is answered whole, never replayed as a stream",
                            param="stream")
        if self.state is None:
            raise HTTPError(404, f"Response with id '{key}' not found: {NO_STATE}")
        owner = owner_of(listener, {}, scope["headers"])
        if method == "DELETE":
            if not await self.state.delete(owner, key):
                raise HTTPError(404, f"Response with id '{key}' not found.")
            return {"id": key, "object": "response", "deleted": True}
        got = await self.state.get(owner, key)
        if got is None:
            raise HTTPError(404, f"Response with id '{key}' not found.")
        return got[0].response if page is None else list_page(got[0].input_items, *page)


class _Keeping:
    """The answer's send for a Turn: every piece goes on as it comes, but the last, which waits until the
    response is stored and added to its conversation (a client that chains from it next is never told
    it is unknown, nor misses its last turn)."""

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


def responses_api(config: StoreConfig | None, store: Store | None, metrics: RouterMetrics) -> ResponsesAPI:
    """The routes and the request path over the state the config keeps in the opened `store`: none
    without a store, or with `responses: false`."""
    if config is None or store is None or not config.responses:
        return ResponsesAPI(None, metrics)
    return ResponsesAPI(ResponsesState(store, config.responses_ttl_s), metrics,
                        ConversationsAPI(ConversationsState(store)))
