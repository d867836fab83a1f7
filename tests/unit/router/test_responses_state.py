"""Stateful Responses (services/router/listeners/responses_api.py over plugins/responses_state.py), in
process through the router's ASGI app, with the replicas replaced by a fake Upstream and the store by the
fake store: what the client sees, what upstream is sent, and what the store keeps."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from starlette.types import Message, Receive, Scope, Send

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.config.plugins import StoreConfig
from services.router.decision.engine import Router
from services.router.listeners.body_workers import Parsed, parse
from services.router.listeners.responses_api import NO_STATE, Turn, _carry
from services.router.metrics import RouterMetrics
from services.router.plugins.responses_state import KIND, ResponsesState, Stored, input_items
from tests.support.asgi_client import Answer, request
from tests.support.fake_store import FakeStore
from tests.support.fake_upstream import FakeUpstream, Reply, chunk_events, completion

T = TypeVar("T")
A = "http://a:8000"
SSE = "text/event-stream"
KEY, OTHER_KEY = "key-1", "key-2"
CONFIG: dict[str, Any] = {
    "listeners": [{"port": 8080, "api_keys": [KEY, OTHER_KEY]}],
    "pools": {"p": {"model": "p-m", "replicas": [{"url": A}]}},
    "entries": {"fleet": {"default": ["p"]}},
}


STATE = StoreConfig()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Fleet:
    """A RouterApp over the fake upstream and the fake store; `store` None: a router that keeps no state."""

    def __init__(self, store: StoreConfig | None = STATE, *, opened: bool = True) -> None:
        config = dataclasses.replace(parse_config(CONFIG), store=store)
        self.router = Router(config)
        self.pools = build_pools(config)
        self.upstream = FakeUpstream()
        self.store = FakeStore()
        self.metrics = RouterMetrics(self.pools)
        self.app = RouterApp(config, self.router, self.pools, self.upstream, self.metrics,
                             store=self.store if opened else None)

    def call(self, method: str, path: str, body: Any = None, *, key: str = KEY, query: str = "",
             **headers: str) -> Answer:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await self.app({**scope, "query_string": query.encode()}, receive, send)
        return run(request(app, method, path, body, headers={"authorization": f"Bearer {key}", **headers}))

    def create(self, *, key: str = KEY, answer: str = "hello", stream: bool = False,
               headers: dict[str, str] | None = None, **body: Any) -> Answer:
        if stream:
            self.upstream.answer(A, Reply(chunks=chunk_events([answer[:2], answer[2:]]), content_type=SSE))
        else:
            self.upstream.answer(A, Reply(chunks=(completion(answer),)))
        return self.call("POST", "/v1/responses", {"model": "fleet", "input": "hi", "stream": stream, **body},
                         key=key, **(headers or {}))

    def sent_messages(self) -> list[dict[str, Any]]:
        return self.upstream.sent[-1].body["messages"]

    def count(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def final(answer: Answer) -> dict[str, Any]:
    """The response object a client got: the body, or a stream's last event's."""
    if answer.headers["content-type"] == SSE:
        return answer.events()[-1]["response"]
    return answer.json()


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_is_stored_as_the_client_got_it_and_read_back(stream: bool) -> None:
    fleet = Fleet()
    r = fleet.create(stream=stream, answer="hello", metadata={"k": "v"})
    assert r.status == 200
    got = final(r)
    assert got["id"].startswith("resp_") and got["store"] is True and got["previous_response_id"] is None
    assert got["output"][0]["content"][0]["text"] == "hello"
    back = fleet.call("GET", f"/v1/responses/{got['id']}")
    assert back.status == 200 and back.json() == got  # the very object: its id, items' ids and times
    if stream:  # every event of the stream named the same id
        assert {e["response"]["id"] for e in r.events() if "response" in e} == {got["id"]}
    assert fleet.count("router_requests_total", listener="listener-0", api="responses_state", status="200") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_previous_response_id_carries_the_earlier_input_and_output_but_not_its_instructions(stream: bool) -> None:
    fleet = Fleet()
    first = final(fleet.create(input="my name is Ada", instructions="be terse", answer="noted", stream=stream))
    r = fleet.create(input="what is my name?", instructions="be kind", previous_response_id=first["id"],
                     answer="Ada", stream=stream)
    assert r.status == 200
    assert fleet.sent_messages() == [
        {"role": "system", "content": "be kind"},  # this request's instructions, first
        {"role": "user", "content": "my name is Ada"},
        {"role": "assistant", "content": [{"type": "text", "text": "noted"}]},
        {"role": "user", "content": "what is my name?"}]
    second = final(r)
    assert second["previous_response_id"] == first["id"] and second["id"] != first["id"]
    # A third turn carries both earlier ones, from the second alone.
    fleet.create(input="and again?", previous_response_id=second["id"], stream=stream)
    assert [m["role"] for m in fleet.sent_messages()] == ["user", "assistant", "user", "assistant", "user"]


def test_tool_calls_and_their_outputs_are_carried_as_chat_turns() -> None:
    fleet = Fleet()
    called = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
              "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                  "role": "assistant", "content": None,
                  "tool_calls": [{"id": "call_1", "type": "function",
                                  "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]}}]}
    fleet.upstream.answer(A, Reply(chunks=(json.dumps(called).encode(),)))
    tools = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
    first = fleet.call("POST", "/v1/responses", {"model": "fleet", "input": "weather in Oslo?", "tools": tools}).json()
    assert first["output"][0]["type"] == "function_call"
    fleet.create(previous_response_id=first["id"], tools=tools,
                 input=[{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    assert fleet.sent_messages() == [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


def test_store_false_keeps_nothing_and_says_so() -> None:
    fleet = Fleet()
    got = fleet.create(store=False).json()
    assert got["store"] is False
    assert fleet.store.items_by == {}
    assert fleet.call("GET", f"/v1/responses/{got['id']}").status == 404
    # It may still chain from a stored one.
    first = fleet.create(input="one").json()
    fleet.create(input="two", previous_response_id=first["id"], store=False)
    assert [m["content"] for m in fleet.sent_messages()][::2] == ["one", "two"]
    assert len(fleet.store.items_by) == 1


def test_an_unknown_id_and_another_tenants_id_get_the_same_404() -> None:
    fleet = Fleet()
    mine = fleet.create().json()["id"]
    unknown = fleet.create(previous_response_id="resp_nobody", key=OTHER_KEY)
    theirs = fleet.create(previous_response_id=mine, key=OTHER_KEY)
    for r, rid in ((unknown, "resp_nobody"), (theirs, mine)):
        assert r.status == 404
        assert r.json()["error"] == {"message": f"Previous response with id '{rid}' not found.",
                                     "type": "not_found_error", "param": "previous_response_id", "code": 404}
    assert len(fleet.upstream.sent) == 1  # neither was sent upstream
    for method, path in (("GET", f"/v1/responses/{mine}"), ("GET", f"/v1/responses/{mine}/input_items"),
                         ("DELETE", f"/v1/responses/{mine}")):
        r = fleet.call(method, path, key=OTHER_KEY)
        assert r.status == 404 and r.json()["error"]["message"] == f"Response with id '{mine}' not found."
    assert fleet.call("GET", f"/v1/responses/{mine}").status == 200  # the other key deleted nothing


def test_a_user_within_a_tenant_reads_and_chains_only_their_own() -> None:
    fleet = Fleet()
    ada = fleet.create(user="ada").json()["id"]
    assert fleet.call("GET", f"/v1/responses/{ada}").status == 404  # the tenant without the user
    assert fleet.call("GET", f"/v1/responses/{ada}", **{"x-router-user": "bob"}).status == 404
    assert fleet.call("GET", f"/v1/responses/{ada}", **{"x-router-user": "ada"}).status == 200
    assert fleet.create(user="bob", previous_response_id=ada).status == 404
    assert fleet.create(user="ada", previous_response_id=ada).status == 200


def test_delete_then_get_is_404() -> None:
    fleet = Fleet()
    rid = fleet.create().json()["id"]
    r = fleet.call("DELETE", f"/v1/responses/{rid}")
    assert r.status == 200 and r.json() == {"id": rid, "object": "response", "deleted": True}
    assert fleet.call("GET", f"/v1/responses/{rid}").status == 404
    assert fleet.call("DELETE", f"/v1/responses/{rid}").status == 404
    assert fleet.create(previous_response_id=rid).status == 404


def test_input_items_list_this_requests_own_input_in_openais_list_shape() -> None:
    fleet = Fleet()
    first = fleet.create(input="one").json()["id"]
    rid = fleet.create(previous_response_id=first, instructions="rules", input=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "two"}]},
        {"role": "assistant", "content": "three"}, {"role": "user", "content": "four"}]).json()["id"]
    page = fleet.call("GET", f"/v1/responses/{rid}/input_items").json()
    assert page["object"] == "list" and page["has_more"] is False
    data = page["data"]
    # Newest first (desc, OpenAI's default); neither the earlier turn nor the instructions are input items.
    assert [(i["role"], i["content"][0]["type"], i["content"][0]["text"]) for i in data] == [
        ("user", "input_text", "four"), ("assistant", "output_text", "three"), ("user", "input_text", "two"),
        ("system", "input_text", "be brief")]
    assert page["first_id"] == data[0]["id"] and page["last_id"] == data[-1]["id"]
    assert len({i["id"] for i in data}) == 4 and all(i["type"] == "message" for i in data)
    up = fleet.call("GET", f"/v1/responses/{rid}/input_items", query="order=asc&limit=2").json()
    assert [i["id"] for i in up["data"]] == [i["id"] for i in data[::-1][:2]] and up["has_more"] is True
    rest = fleet.call("GET", f"/v1/responses/{rid}/input_items",
                      query=f"order=asc&limit=2&after={up['last_id']}").json()
    assert [i["id"] for i in rest["data"]] == [i["id"] for i in data[::-1][2:]] and rest["has_more"] is False
    again = fleet.call("GET", f"/v1/responses/{rid}/input_items").json()
    assert again == page  # ids are kept, not made anew per read


@pytest.mark.parametrize(("query", "param"), [("limit=0", "limit"), ("limit=101", "limit"), ("limit=x", "limit"),
                                              ("order=up", "order"), ("after=msg_nope", "after")])
def test_bad_input_items_queries_name_the_field(query: str, param: str) -> None:
    fleet = Fleet()
    rid = fleet.create().json()["id"]
    r = fleet.call("GET", f"/v1/responses/{rid}/input_items", query=query)
    assert r.status == 400 and r.json()["error"]["param"] == param


def test_routes_refuse_other_methods_and_paths() -> None:
    fleet = Fleet()
    rid = fleet.create().json()["id"]
    r = fleet.call("POST", f"/v1/responses/{rid}")
    assert r.status == 405 and r.headers["allow"] == "GET, HEAD, DELETE"
    assert fleet.call("DELETE", f"/v1/responses/{rid}/input_items").status == 405
    assert fleet.call("GET", f"/v1/responses/{rid}/cancel").status == 404
    assert fleet.call("GET", f"/v1/responses/{rid}", key="wrong").status == 401
    r = fleet.call("GET", f"/v1/responses/{rid}", query="stream=true")
    assert r.status == 400 and r.json()["error"]["param"] == "stream"


def test_the_store_down_refuses_a_chain_with_503_and_fails_open_on_storing() -> None:
    fleet = Fleet()
    rid = fleet.create().json()["id"]
    fleet.store.fail = True
    r = fleet.create(previous_response_id=rid)
    assert r.status == 503 and r.json()["error"]["param"] == "previous_response_id"
    sent = len(fleet.upstream.sent)
    r = fleet.create(input="still answered")
    assert r.status == 200 and r.json()["output"][0]["content"][0]["text"] == "hello"
    assert len(fleet.upstream.sent) == sent + 1
    assert fleet.call("GET", f"/v1/responses/{rid}").status == 503
    assert fleet.count("router_store_errors_total", plugin="responses") == 3
    fleet.store.fail = False
    assert fleet.call("GET", f"/v1/responses/{r.json()['id']}").status == 404  # it was never stored


def test_without_state_previous_response_id_is_a_400_and_nothing_is_kept() -> None:
    for fleet in (Fleet(store=None), Fleet(StoreConfig(responses=False)), Fleet(opened=False)):
        r = fleet.create(previous_response_id="resp_1")
        assert r.status == 400 and r.json()["error"]["param"] == "previous_response_id"
        assert NO_STATE in r.json()["error"]["message"]
        got = fleet.create().json()
        assert got["store"] is False  # this response is not kept, whatever the client asked
        r = fleet.call("GET", f"/v1/responses/{got['id']}")
        assert r.status == 404 and NO_STATE in r.json()["error"]["message"]
        assert fleet.store.items_by == {}


def test_a_listener_without_responses_has_no_state_routes() -> None:
    config = dict(CONFIG, listeners=[{"port": 8080, "apis": ["chat"]}])
    parsed = dataclasses.replace(parse_config(config), store=StoreConfig())
    pools = build_pools(parsed)
    app = RouterApp(parsed, Router(parsed), pools, FakeUpstream(), RouterMetrics(pools), store=FakeStore())
    assert run(request(app, "GET", "/v1/responses/resp_1")).status == 404


def test_a_stream_that_broke_off_is_not_stored() -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, Reply(chunks=chunk_events(["he", "llo"], done=False), content_type=SSE))
    r = fleet.call("POST", "/v1/responses", {"model": "fleet", "input": "hi", "stream": True})
    assert r.events()[-1]["type"] == "response.failed"
    assert fleet.store.items_by == {}


def test_the_response_is_stored_before_its_last_piece_goes_out() -> None:
    """A client that chains as soon as it has the answer must find it (no race with a background write)."""
    fleet = Fleet()
    seen: list[bool] = []

    class Watching:
        async def __call__(self, message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                seen.append(bool(fleet.store.items_by))

    api = fleet.app.responses
    turn = Turn("-", "resp_x", [{"role": "user", "content": "hi"}], 0, 0)
    send = api.sending(turn, Watching())
    body = json.dumps({"id": "resp_x", "object": "response", "status": "completed", "output": []}).encode()

    async def answer() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    run(answer())
    assert seen == [True]


def test_a_stored_response_expires_after_its_ttl() -> None:
    store = FakeStore()
    now = time.time()  # the fake store expires by the wall clock
    state = ResponsesState(store, 60.0, clock=lambda: now)
    stored = Stored({"id": "resp_1"}, [{"role": "user", "content": "hi"}], [])
    run(state.put("t", stored))
    [item] = store.items_by.values()
    assert (item.kind, item.scope, item.key, item.created, item.expires) == (KIND, "t", "resp_1", now, now + 60.0)
    assert run(state.get("t", "resp_1")) == (stored, len(item.payload))
    store.items_by[(KIND, "t", "resp_1")] = dataclasses.replace(item, expires=1.0)  # past its time
    assert run(state.get("t", "resp_1")) is None
    assert run(state.get("t", "x" * 300)) is None and store.calls == 3  # too long to be an id: no store call


def test_a_long_split_body_gets_the_earlier_turns_in_its_bulk() -> None:
    body = json.dumps({"model": "fleet", "instructions": "rules", "input": "x" * 100}).encode()
    parsed = parse("responses", body, split=True)
    assert parsed.bulk and "messages" not in parsed.chat
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "answer"}]
    conversation = _carry(parsed, 1, history)
    assert conversation == [*history, {"role": "user", "content": "x" * 100}]
    assert json.loads(parsed.bulk)["messages"] == [{"role": "system", "content": "rules"}, *conversation]
    assert parsed.text == "rules\nbefore\nanswer\n" + "x" * 100  # routed on all of it


def test_chat_messages_read_back_as_input_items() -> None:
    items = input_items([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "reasoning_content": "think",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "out"}]}])
    assert [{k: v for k, v in item.items() if k != "id"} for item in items] == [
        {"type": "message", "status": "completed", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "function_call", "status": "completed", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "status": "completed", "call_id": "c1", "output": "out"}]


def test_unused_parsed_fields_stay_as_they_were() -> None:
    """Without earlier turns the upstream body is left as the codec made it."""
    parsed = Parsed({"model": "fleet"}, {"model": "fleet", "messages": [{"role": "user", "content": "hi"}]}, "hi")
    assert _carry(parsed, 0, []) == [{"role": "user", "content": "hi"}]
    assert parsed.chat["messages"] == [{"role": "user", "content": "hi"}] and parsed.text == "hi"


# ---- the Conversations API ----

def test_a_conversation_and_its_items_read_update_and_delete() -> None:
    fleet = Fleet()
    r = fleet.call("POST", "/v1/conversations", {"metadata": {"topic": "demo"}, "items": [
        {"type": "message", "role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]})
    assert r.status == 200
    conversation = r.json()
    cid = conversation["id"]
    assert cid.startswith("conv_") and conversation["object"] == "conversation"
    assert conversation["metadata"] == {"topic": "demo"}
    assert fleet.call("GET", f"/v1/conversations/{cid}").json() == conversation
    items = fleet.call("GET", f"/v1/conversations/{cid}/items", query="order=asc").json()
    assert [(i["role"], i["content"]) for i in items["data"]] == [
        ("user", [{"type": "input_text", "text": "hello"}]),
        ("assistant", [{"type": "output_text", "text": "hi there"}])]
    added = fleet.call("POST", f"/v1/conversations/{cid}/items",
                       {"items": [{"role": "user", "content": "more"}]}).json()
    assert added["object"] == "list" and [i["content"][0]["text"] for i in added["data"]] == ["more"]
    newest = fleet.call("GET", f"/v1/conversations/{cid}/items", query="limit=1").json()
    assert newest["data"] == added["data"] and newest["has_more"] is True
    item_id = added["data"][0]["id"]
    assert fleet.call("GET", f"/v1/conversations/{cid}/items/{item_id}").json() == added["data"][0]
    assert fleet.call("DELETE", f"/v1/conversations/{cid}/items/{item_id}").json() == conversation
    assert fleet.call("GET", f"/v1/conversations/{cid}/items/{item_id}").status == 404
    updated = fleet.call("POST", f"/v1/conversations/{cid}", {"metadata": {"topic": "other"}}).json()
    assert updated == {**conversation, "metadata": {"topic": "other"}}
    r = fleet.call("DELETE", f"/v1/conversations/{cid}")
    assert r.json() == {"id": cid, "object": "conversation.deleted", "deleted": True}
    assert fleet.call("GET", f"/v1/conversations/{cid}").status == 404
    assert fleet.store.items_by == {}  # its items went with it


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_in_a_conversation_carries_its_items_and_adds_its_turn(stream: bool) -> None:
    fleet = Fleet()
    cid = fleet.call("POST", "/v1/conversations", {"items": [{"role": "user", "content": "I am Ada"}]}).json()["id"]
    got = final(fleet.create(input="who am I?", conversation=cid, instructions="rules", answer="Ada", stream=stream))
    assert got["conversation"] == {"id": cid}
    assert fleet.sent_messages() == [{"role": "system", "content": "rules"},
                                     {"role": "user", "content": [{"type": "text", "text": "I am Ada"}]},
                                     {"role": "user", "content": "who am I?"}]
    items = fleet.call("GET", f"/v1/conversations/{cid}/items", query="order=asc").json()["data"]
    assert [(i["role"], i["content"][0]["text"]) for i in items] == [
        ("user", "I am Ada"), ("user", "who am I?"), ("assistant", "Ada")]
    assert items[-1]["id"] == got["output"][0]["id"]  # the output item as the response has it
    # The next turn carries all of it, as {"id": ...} too; store=false still adds to the conversation.
    fleet.create(input="again", conversation={"id": cid}, store=False)
    assert [m["role"] for m in fleet.sent_messages()] == ["user", "user", "assistant", "user"]
    assert len(fleet.call("GET", f"/v1/conversations/{cid}/items").json()["data"]) == 5


def test_a_conversation_is_its_owners_only() -> None:
    fleet = Fleet()
    cid = fleet.call("POST", "/v1/conversations", {}).json()["id"]
    for method, path in (("GET", f"/v1/conversations/{cid}"), ("GET", f"/v1/conversations/{cid}/items"),
                         ("DELETE", f"/v1/conversations/{cid}")):
        assert fleet.call(method, path, key=OTHER_KEY).status == 404
    r = fleet.call("POST", f"/v1/conversations/{cid}/items", {"items": [{"role": "user", "content": "x"}]},
                   key=OTHER_KEY)
    assert r.status == 404
    r = fleet.create(conversation=cid, key=OTHER_KEY)
    assert r.status == 404 and r.json()["error"] == {"message": f"Conversation with id '{cid}' not found.",
                                                     "type": "not_found_error", "param": "conversation", "code": 404}
    assert fleet.call("GET", f"/v1/conversations/{cid}/items").json()["data"] == []


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/conversations", {"items": [{"role": "robot", "content": "x"}]}, "items[0].role"),
    ("/v1/conversations", {"items": [{"role": "user", "content": "x"}] * 21}, "items"),
    ("/v1/conversations", {"items": "hi"}, "items"),
    ("/v1/conversations", {"metadata": {"k": 1}}, "metadata"),
    ("/v1/conversations", {"name": "x"}, "name"),
    ("/v1/conversations/{cid}/items", {}, "items"),
    ("/v1/conversations/{cid}/items", {"items": [{"type": "function_call_output", "output": "x"}]},
     "items[0].call_id"),
])
def test_bad_conversation_requests_name_the_field(path: str, body: dict[str, Any], param: str) -> None:
    fleet = Fleet()
    cid = fleet.call("POST", "/v1/conversations", {}).json()["id"]
    r = fleet.call("POST", path.format(cid=cid), body)
    assert r.status == 400 and r.json()["error"]["param"] == param


def test_conversation_and_previous_response_id_together_are_a_400() -> None:
    fleet = Fleet()
    cid = fleet.call("POST", "/v1/conversations", {}).json()["id"]
    rid = fleet.create().json()["id"]
    r = fleet.create(conversation=cid, previous_response_id=rid)
    assert r.status == 400 and r.json()["error"]["param"] == "previous_response_id"


def test_without_state_there_are_no_conversations() -> None:
    fleet = Fleet(store=None)
    r = fleet.call("POST", "/v1/conversations", {})
    assert r.status == 404 and NO_STATE in r.json()["error"]["message"]
    r = fleet.create(conversation="conv_1")
    assert r.status == 400 and r.json()["error"]["param"] == "conversation"


def test_the_store_down_is_a_503_for_conversations() -> None:
    fleet = Fleet()
    cid = fleet.call("POST", "/v1/conversations", {}).json()["id"]
    fleet.store.fail = True
    assert fleet.call("GET", f"/v1/conversations/{cid}").status == 503
    r = fleet.create(conversation=cid)
    assert r.status == 503 and r.json()["error"]["param"] == "conversation"


def test_a_long_body_read_in_a_body_worker_is_chained_and_stored() -> None:
    fleet = Fleet()
    try:
        first = fleet.create(input="short").json()["id"]
        long = "y" * (300 << 10)  # past OFF_LOOP_BYTES: decoded and translated in a body worker
        r = fleet.create(input=long, previous_response_id=first, instructions="rules")
        assert r.status == 200
        assert fleet.sent_messages() == [{"role": "system", "content": "rules"}, {"role": "user", "content": "short"},
                                         {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
                                         {"role": "user", "content": long}]
        items = fleet.call("GET", f"/v1/responses/{r.json()['id']}/input_items").json()["data"]
        assert [i["content"][0]["text"] for i in items] == [long]
    finally:
        fleet.app.close()


def test_ids_no_store_could_hold_name_nothing_without_a_store_call() -> None:
    """The stores refuse a NUL in a key (a ValueError, which would be a 500): such an id is simply unknown."""
    fleet = Fleet()
    calls = fleet.store.calls
    r = fleet.create(previous_response_id="resp_\x00")
    assert r.status == 404 and r.json()["error"]["param"] == "previous_response_id"
    assert fleet.call("GET", "/v1/responses/resp_\x00").status == 404
    assert fleet.call("DELETE", "/v1/responses/" + "r" * 300).status == 404
    assert fleet.call("GET", "/v1/conversations/conv_\x00").status == 404
    assert fleet.store.calls == calls  # none reached the store
    r = fleet.call("POST", "/v1/conversations", {"items": [{"id": "a\x00", "role": "user", "content": "x"}]})
    assert r.status == 400 and r.json()["error"]["param"] == "items[0].id"
