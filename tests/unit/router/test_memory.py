"""The memory plugin (plugins/memory.py) over the fake store, the system message recall builds
(plugins/recall.py), and GET/DELETE /v1/memory (listeners/memory_api.py): what a user's later request
carries, whose memories it may see, what is kept of an answer, and what the API lists and erases."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import msgspec
import pytest
import schemathesis

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.config.plugins import MemoryConfig
from services.router.decision.engine import Router
from services.router.errors import HTTPError
from services.router.listeners.memory_api import MemoryAPI, memory_in_use
from services.router.metrics import RouterMetrics
from services.router.plugins.answer import Answer
from services.router.plugins.hooks import Exchange
from services.router.plugins.identity import tenant_of
from services.router.plugins.memory import KIND, Memory, MemoryRecord
from services.router.plugins.recall import cut, estimate_tokens, last_user_text, with_system, within_budget
from services.router.plugins.shared import Shared
from services.router.plugins.store.base import Item
from tests.support.asgi_client import request
from tests.support.fake_models import FakeModels
from tests.support.fake_store import FakeStore
from tests.support.fake_upstream import FakeUpstream
from tests.support.word_vectors import WordVectors, vector

T = TypeVar("T")
CONFIG = parse_config({"listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [
    {"url": "http://a:1"}]}}, "deployments": {"emb": {"model": "minilm", "tasks": ["embed"], "attached": {
        "urls": ["http://e:1"]}}}, "store": {}, "entries": {"e": {"default": ["p"], "plugins": [
            {"type": "memory", "embedder": "emb"}]}}})


def run(work: Awaitable[T]) -> T:
    return asyncio.run(work)  # type: ignore[arg-type]


def memory(store: FakeStore, **settings: Any) -> Memory:
    return Memory(MemoryConfig(embedder="emb", **settings), Shared(CONFIG, store, FakeModels(vectors=WordVectors())))


def exchange(text: str, *, tenant: str = "k1", user: str | None = None, system: Any = None,
             chat_api: bool = True) -> Exchange:
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    chat = {"model": "m", "messages": messages} if chat_api else {"model": "m", "prompt": text}
    return Exchange("chat" if chat_api else "completions", chat_api, "e", "default", dict(chat), chat, tenant, user)


def answer(reply: Any, *, complete: bool = True, tool_calls: bool = False) -> Answer:
    message: dict[str, Any] = {"role": "assistant", "content": reply}
    if tool_calls:
        message["tool_calls"] = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    finish = "tool_calls" if tool_calls else "stop"
    return Answer({"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}]},
                  False, complete)


async def converse(plugin: Memory, text: str, reply: str, **who: Any) -> Exchange:
    """One turn through both hooks, as the host runs them."""
    ex = exchange(text, **who)
    await plugin.request(ex)
    await plugin.response(ex, answer(reply), answered_by=None)
    return ex


def test_a_later_request_carries_the_turns_it_resembles_in_one_system_message_put_first() -> None:
    store = FakeStore()
    plugin = memory(store)

    async def go() -> Exchange:
        await converse(plugin, "my cat is called Miso", "Nice name for a cat.")
        await converse(plugin, "I live in Lyon", "Lyon is lovely.")
        later = exchange("what is my cat called")
        assert await plugin.request(later) is None  # memory never answers by itself
        return later

    later = run(go())
    first, last = later.chat["messages"]
    assert first["role"] == "system" and last == {"role": "user", "content": "what is my cat called"}
    assert "User: my cat is called Miso\nAssistant: Nice name for a cat." in first["content"]
    assert "Lyon" not in first["content"]  # min_similarity: an unrelated turn is not recalled
    assert later.notes["memory.outcome"] == "recalled"
    assert later.request["messages"] == [last]  # the client's body is not changed


def test_a_system_message_the_request_has_takes_the_memories_and_stays_the_only_one() -> None:
    store = FakeStore()
    plugin = memory(store)

    async def go(system: Any) -> list[dict[str, Any]]:
        await converse(plugin, "my cat is called Miso", "Noted.")
        ex = exchange("what is my cat called", system=system)
        await plugin.request(ex)
        return ex.chat["messages"]

    merged = run(go("You are terse."))
    assert [m["role"] for m in merged] == ["system", "user"]
    assert merged[0]["content"].startswith("You are terse.\n\n") and "Miso" in merged[0]["content"]
    parts = run(go([{"type": "text", "text": "You are terse."}]))
    assert parts[0]["content"][0] == {"type": "text", "text": "You are terse."}
    assert "Miso" in parts[0]["content"][1]["text"] and len(parts) == 2


def test_with_system_merges_into_the_first_system_or_developer_message_and_changes_nothing_it_was_given() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "developer", "content": "be brief"},
                {"role": "system", "content": "later"}]
    out = with_system(messages, "NOTES")
    assert out[1] == {"role": "developer", "content": "be brief\n\nNOTES"} and out[2]["content"] == "later"
    assert messages[1] == {"role": "developer", "content": "be brief"}
    assert with_system([{"role": "user", "content": "a"}], "NOTES")[0] == {"role": "system", "content": "NOTES"}
    assert with_system([{"role": "system", "content": None}], "N") == [{"role": "system", "content": "N"}]


def test_nothing_to_recall_is_outcome_none_and_a_text_completion_is_skipped() -> None:
    store = FakeStore()
    plugin = memory(store)
    ex = exchange("hello there")
    run(plugin.request(ex))
    assert ex.notes["memory.outcome"] == "none" and ex.chat["messages"] == ex.request["messages"]
    text = exchange("hello there", chat_api=False)
    run(plugin.request(text))
    run(plugin.response(text, Answer({"choices": [{"text": "hi"}]}, False, True), answered_by=None))
    assert text.notes["memory.outcome"] == "skipped" and "messages" not in text.chat and not store.items_by
    no_user = exchange("x")
    no_user.chat["messages"] = [{"role": "system", "content": "only this"}]
    run(plugin.request(no_user))
    assert no_user.notes["memory.outcome"] == "skipped"


def test_memories_are_the_owners_own_the_key_and_the_user_apart() -> None:
    store = FakeStore()
    plugin = memory(store)

    async def go() -> dict[tuple[str, str | None], str]:
        await converse(plugin, "my secret code is 4711", "Kept.", tenant="k1", user="ann")
        seen = {}
        for tenant, user in (("k1", "ann"), ("k1", "bob"), ("k1", None), ("k2", "ann")):
            ex = exchange("what is my secret code", tenant=tenant, user=user)
            await plugin.request(ex)
            seen[(tenant, user)] = ex.notes["memory.outcome"]
        return seen

    assert run(go()) == {("k1", "ann"): "recalled", ("k1", "bob"): "none", ("k1", None): "none",
                         ("k2", "ann"): "none"}
    [(kind, scope, _)] = store.items_by
    assert (kind, scope) == ("memory", "k1/ann")


def test_only_a_complete_answer_with_text_is_kept_each_side_bounded() -> None:
    store = FakeStore()
    plugin = memory(store)
    for kept_not in (None, answer("cut off", complete=False), answer(None, tool_calls=True), answer("   ")):
        run(plugin.response(exchange("question"), kept_not, answered_by=None))
    assert not store.items_by
    run(plugin.response(exchange("q " * 5000), answer([{"type": "text", "text": "parts"}]), answered_by=None))
    [item] = store.items_by.values()
    content = msgspec.json.decode(item.payload, type=MemoryRecord).content
    question, _, reply = content.partition("\nAssistant: ")
    assert reply == "parts" and question.startswith("User: q q") and question.endswith("…")
    assert len(question) <= len("User: ") + 4001
    assert item.vector == vector(content) and item.key.startswith("mem_") and item.created > 0


def test_an_owner_keeps_at_most_max_memories_the_oldest_going_first() -> None:
    store = FakeStore()
    plugin = memory(store, max_memories=2)

    async def go() -> None:
        for i in range(4):
            await converse(plugin, f"fact number {i}", f"ok {i}")
            await converse(plugin, f"other fact {i}", "ok", tenant="k2")

    run(go())
    kept = sorted(msgspec.json.decode(i.payload, type=MemoryRecord).content for i in store.items_by.values()
                  if i.scope == "k1")
    assert kept == ["User: fact number 2\nAssistant: ok 2", "User: fact number 3\nAssistant: ok 3"]
    assert sum(1 for i in store.items_by.values() if i.scope == "k2") == 2


def test_the_recalled_memories_fit_max_tokens_the_first_that_does_not_fit_cut_or_left_out() -> None:
    store = FakeStore()
    plugin = memory(store, max_tokens=80, top_k=5)

    async def go() -> str:
        await converse(plugin, "rust borrow checker " + "x" * 300, "fine")
        await converse(plugin, "rust borrow checker lifetimes", "short")
        ex = exchange("rust borrow checker lifetimes")
        await plugin.request(ex)
        return ex.chat["messages"][0]["content"]

    content = run(go())
    assert estimate_tokens(content) <= 80
    assert "User: rust borrow checker lifetimes\nAssistant: short" in content  # the nearest, whole
    assert content.endswith("…")  # the next, cut to what was left


def test_within_budget_and_cut() -> None:
    assert within_budget("P", ["a" * 40, "b" * 40], 25) == ("P\n\n" + "a" * 40 + "\n\n" + "b" * 40, 2)
    text, used = within_budget("P", ["a" * 400], 25)
    assert used == 1 and estimate_tokens(text) <= 25 and text.endswith("…")
    assert within_budget("P" * 100, ["a"], 25) == ("", 0)  # not even the preamble fits
    assert within_budget("P", [], 25) == ("", 0)
    # Never between a letter and its accent, inside a ZWJ emoji, between a flag's two letters.
    assert cut("ab" + "e\u0301" * 3, 3) == "ab"
    assert cut("x\U0001f469\u200d\U0001f4bb", 3) == "x"
    assert cut("\U0001f1eb\U0001f1f7\U0001f1e9\U0001f1ea", 3) == "\U0001f1eb\U0001f1f7"
    assert cut("abc", 5) == "abc"
    assert last_user_text([{"role": "user", "content": [{"type": "image_url"}, {"type": "text", "text": "hi"}]},
                           {"role": "assistant", "content": "yo"}]) == "hi"
    assert last_user_text(None) == ""


def test_ten_thousand_memories_of_one_user_recall_list_and_erase() -> None:
    store = FakeStore()
    plugin = memory(store, max_memories=10_000)
    now = time.time()
    for i in range(10_000):
        content = f"User: fact {i} topic{i}\nAssistant: ok"
        store.items_by[(KIND, "-", f"mem_{i:05}")] = Item(KIND, "-", f"mem_{i:05}", msgspec.json.encode(
            MemoryRecord(content)), vector(content), created=now - 10_000 + i)
    api = MemoryAPI(store, True)

    async def go() -> tuple[Exchange, dict[str, Any], dict[str, Any], int]:
        ex = exchange("fact 1234 topic1234", tenant="-")  # an open listener's: what the API reads without a key
        await plugin.request(ex)
        await plugin.response(ex, answer("again"), answered_by=None)  # the 10,001st: the oldest goes
        last_page = json.loads(await api.answer("GET", "/v1/memory", b"limit=1000&offset=9000", [], False))
        first = json.loads(await api.answer("GET", "/v1/memory", b"limit=3", [], False))
        gone = json.loads(await api.answer("DELETE", "/v1/memory", b"", [], False))["deleted"]
        return ex, last_page, first, gone

    ex, last_page, first, gone = run(go())
    assert "topic1234\nAssistant: ok" in ex.chat["messages"][0]["content"]
    assert len(last_page["data"]) == 1000 and not last_page["has_more"]
    assert last_page["data"][-1]["id"] == "mem_00001"  # mem_00000, the oldest, was trimmed
    assert [m["content"] for m in first["data"]][0] == "User: fact 1234 topic1234\nAssistant: again"
    assert first["has_more"] and first["data"][1]["id"] == "mem_09999"
    assert gone == 10_000 and not store.items_by


# ---- GET/DELETE /v1/memory ----

def _call(api: MemoryAPI, method: str, path: str = "/v1/memory", query: bytes = b"",
          headers: list[tuple[bytes, bytes]] | None = None, keyed: bool = True) -> Any:
    return json.loads(run(api.answer(method, path, query, headers or [(b"authorization", b"Bearer one")], keyed)))


def _error(api: MemoryAPI, method: str, path: str = "/v1/memory", query: bytes = b"",
           headers: list[tuple[bytes, bytes]] | None = None) -> HTTPError:
    with pytest.raises(HTTPError) as caught:
        _call(api, method, path, query, headers)
    return caught.value


def _seed(store: FakeStore) -> None:
    one, two = tenant_of(True, [(b"authorization", b"Bearer one")]), tenant_of(True, [(b"x-api-key", b"two")])
    for i, (scope, text) in enumerate([(one, "a"), (one, "b"), (f"{one}/ann", "c"), (two, "d")]):
        store.items_by[(KIND, scope, f"mem_{text}")] = Item(KIND, scope, f"mem_{text}", msgspec.json.encode(
            MemoryRecord(text)), (1.0,), created=1000.0 + i)


def test_the_api_lists_the_callers_own_memories_newest_first_in_pages() -> None:
    store = FakeStore()
    _seed(store)
    api = MemoryAPI(store, True)
    listed = _call(api, "GET")
    assert listed == {"object": "list", "has_more": False, "data": [
        {"id": "mem_b", "object": "memory", "created_at": 1001, "content": "b"},
        {"id": "mem_a", "object": "memory", "created_at": 1000, "content": "a"}]}
    assert [m["id"] for m in _call(api, "GET", query=b"limit=1")["data"]] == ["mem_b"]
    assert _call(api, "GET", query=b"limit=1")["has_more"] is True
    assert [m["id"] for m in _call(api, "GET", query=b"limit=1&offset=1")["data"]] == ["mem_a"]
    assert [m["id"] for m in _call(api, "GET", query=b"user=ann")["data"]] == ["mem_c"]
    assert [m["id"] for m in _call(api, "GET", headers=[(b"authorization", b"Bearer one"),
                                                        (b"x-router-user", b"ann")])["data"]] == ["mem_c"]
    assert [m["id"] for m in _call(api, "GET", headers=[(b"x-api-key", b"two")])["data"]] == ["mem_d"]
    assert _call(api, "GET", "/v1/memory/mem_a") == {"id": "mem_a", "object": "memory", "created_at": 1000,
                                                     "content": "a"}


def test_the_api_erases_only_the_callers_own_and_another_owners_id_is_an_unknown_one() -> None:
    store = FakeStore()
    _seed(store)
    api = MemoryAPI(store, True)
    theirs, unknown = _error(api, "DELETE", "/v1/memory/mem_d"), _error(api, "DELETE", "/v1/memory/mem_zz")
    assert theirs.status == unknown.status == 404
    assert theirs.message == "No memory found with id 'mem_d'." and unknown.message.endswith("'mem_zz'.")
    assert _error(api, "GET", "/v1/memory/mem_c").status == 404  # ann's, asked without naming ann
    assert _call(api, "DELETE", "/v1/memory/mem_a") == {"id": "mem_a", "object": "memory", "deleted": True}
    assert _error(api, "GET", "/v1/memory/mem_a").status == 404
    assert _call(api, "DELETE") == {"object": "list", "deleted": 1}
    assert sorted(k[2] for k in store.items_by) == ["mem_c", "mem_d"]
    assert _call(api, "DELETE", query=b"user=ann") == {"object": "list", "deleted": 1}
    assert [k[2] for k in store.items_by] == ["mem_d"]


@pytest.mark.parametrize(("method", "query", "param"), [
    ("GET", b"limit=0", "limit"), ("GET", b"limit=1001", "limit"), ("GET", b"limit=ten", "limit"),
    ("GET", b"limit=+5", "limit"), ("GET", b"limit=", "limit"), ("GET", b"offset=-1", "offset"),
    ("GET", b"offset=1e3", "offset"), ("GET", b"limit=5&limit=6", "limit"), ("GET", b"order=asc", "order"),
    ("DELETE", b"limit=5", "limit"), ("GET", b"user=", "user"), ("GET", b"user=a%00b", "user"),
    ("GET", b"user=" + b"u" * 257, "user")])
def test_a_bad_query_parameter_is_a_400_naming_it(method: str, query: bytes, param: str) -> None:
    error = _error(MemoryAPI(FakeStore(), True), method, query=query)
    assert error.status == 400 and error.param == param and error.message.startswith(f"{param}:")


def test_a_bad_user_header_names_it_and_other_methods_are_405() -> None:
    api = MemoryAPI(FakeStore(), True)
    error = _error(api, "GET", headers=[(b"x-router-user", b"")])
    assert (error.status, error.param) == (400, "x-router-user")
    error = _error(api, "POST")
    assert error.status == 405 and (b"allow", b"GET, HEAD, DELETE") in error.headers
    assert _error(api, "GET", "/v1/memory/").status == 404


def test_the_store_down_is_a_503_and_a_router_without_memory_answers_404_saying_so() -> None:
    store = FakeStore()
    store.fail = True
    error = _error(MemoryAPI(store, True), "GET")
    assert error.status == 503 and "memory store is unavailable" in error.message
    off = _error(MemoryAPI(FakeStore(), False), "GET")
    assert off.status == 404 and "no entry of its config uses the memory plugin" in off.message
    assert memory_in_use(CONFIG)
    assert not memory_in_use(parse_config({"listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [
        {"url": "http://a:1"}]}}, "entries": {"e": {"default": ["p"]}}}))


def test_an_open_listener_is_one_tenant_and_the_api_sees_what_the_plugin_kept() -> None:
    store = FakeStore()
    plugin = memory(store)
    run(converse(plugin, "remember the milk", "Sure.", tenant=tenant_of(False, []), user="ann"))
    listed = _call(MemoryAPI(store, True), "GET", query=b"user=ann", headers=[], keyed=False)
    assert [m["content"] for m in listed["data"]] == ["User: remember the milk\nAssistant: Sure."]


def test_the_app_serves_the_memory_api_where_a_listener_publishes_it_and_documents_it() -> None:
    config = parse_config({
        "listeners": [{"port": 8080, "api_keys": ["one", "two"]}, {"port": 8081, "name": "chat", "apis": ["chat"]}],
        "pools": {"p": {"model": "m", "replicas": [{"url": "http://a:1"}]}},
        "deployments": {"emb": {"model": "minilm", "tasks": ["embed"], "attached": {"urls": ["http://e:1"]}}},
        "store": {}, "entries": {"e": {"default": ["p"], "plugins": [{"type": "memory", "embedder": "emb"}]}}})
    store = FakeStore()
    _seed(store)
    pools = build_pools(config)
    metrics = RouterMetrics(pools)
    app = RouterApp(config, Router(config), pools, FakeUpstream(), metrics, store=store)
    one, two = {"authorization": "Bearer one"}, {"authorization": "Bearer two"}

    async def go() -> list[Any]:
        return [await request(app, "GET", "/v1/memory", headers=one),
                await request(app, "DELETE", "/v1/memory/mem_a", headers=two),
                await request(app, "DELETE", "/v1/memory/mem_a", headers=one),
                await request(app, "POST", "/v1/memory", headers=one),
                await request(app, "GET", "/v1/memory"),
                await request(app, "GET", "/v1/memory", port=8081),
                await request(app, "GET", "/openapi.json", headers=one)]

    listed, theirs, mine, posted, keyless, unpublished, doc = run(go())
    assert [m["id"] for m in listed.json()["data"]] == ["mem_b", "mem_a"]
    assert theirs.status == 404 and theirs.json()["error"]["message"] == "No memory found with id 'mem_a'."
    assert mine.json() == {"id": "mem_a", "object": "memory", "deleted": True}
    assert posted.status == 405 and posted.headers["allow"] == "GET, HEAD, DELETE"
    assert keyless.status == 401 and unpublished.status == 404
    paths = doc.json()["paths"]
    assert set(paths["/v1/memory"]) == {"get", "delete"} and set(paths["/v1/memory/{id}"]) == {"get", "delete"}
    assert all(result.ok() for result in schemathesis.openapi.from_dict(doc.json()).get_all_operations())
    assert metrics.requests.labels("listener-0", "memory", "200")._value.get() == 2
    assert metrics.requests.labels("listener-0", "memory", "404")._value.get() == 1
