from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import EntryConfig, RouterConfig, parse_config
from services.router.config.plugins import SemanticCacheConfig
from services.router.decision.engine import Router
from services.router.metrics import RouterMetrics
from services.router.plugins.answer import MAX_ANSWER_BYTES, Answer
from services.router.plugins.cache_key import MAX_SEMANTIC_CHARS, cache_key
from services.router.plugins.hooks import Exchange
from services.router.plugins.host import PluginHost
from services.router.plugins.registry import CLASSES, builder
from services.router.plugins.semantic_cache import KIND, SemanticCache
from services.router.plugins.shared import Shared
from services.router.plugins.store.base import Item, StoreUnavailable
from services.router.runtime.models import ModelUnavailable
from tests.support.asgi_client import Answer as AsgiAnswer
from tests.support.asgi_client import request
from tests.support.fake_models import FakeModels, failing
from tests.support.fake_store import FakeStore
from tests.support.fake_upstream import FakeUpstream, Reply, chunk_events
from tests.support.fake_upstream import completion as completion_body

T = TypeVar("T")
QUESTION = "How do I reset my password?"
PARAPHRASE = "how can I reset my password"
OTHER = "What is the capital of France?"
CONFIG = SemanticCacheConfig(embedder="embed")


def _unit(*xs: float) -> list[float]:
    norm = math.sqrt(sum(x * x for x in xs))
    return [x / norm for x in xs]


# QUESTION . PARAPHRASE = 0.96 (over the default 0.92 threshold); QUESTION . OTHER = 0.
VECTORS = {QUESTION: _unit(1, 0, 0), PARAPHRASE: _unit(0.96, 0.28, 0), OTHER: _unit(0, 0, 1)}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def cache(config: SemanticCacheConfig = CONFIG, store: FakeStore | None = None,
          models: FakeModels | None = None) -> SemanticCache:
    shared = Shared(RouterConfig((), {}, {}), store or FakeStore(), models or FakeModels(vectors=dict(VECTORS)))
    plugin = builder(shared)(config)
    assert isinstance(plugin, SemanticCache)
    return plugin


def chat(text: str = QUESTION, *, tenant: str = "k1", user: str | None = None, entry: str = "assistant",
         decision: str = "default", system: str = "Be brief.", **fields: Any) -> Exchange:
    body = {"model": entry, "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
            **fields}
    return Exchange("chat", True, entry, decision, body, dict(body), tenant, user)


def completion(prompt: Any = QUESTION, **fields: Any) -> Exchange:
    body = {"model": "assistant", "prompt": prompt, **fields}
    return Exchange("completions", False, "assistant", "default", body, dict(body), "k1", None)


def answer(content: str = "Use the reset link.", finish: str = "stop", *, n: int = 1,
           tool_calls: list[dict[str, Any]] | None = None, text: bool = False) -> Answer:
    if text:
        choices: list[dict[str, Any]] = [{"index": i, "text": content, "finish_reason": finish} for i in range(n)]
        return Answer({"id": "cmpl-up", "object": "text_completion", "created": 1, "model": "m",
                       "choices": choices}, False, True)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choices = [{"index": i, "message": message, "finish_reason": finish} for i in range(n)]
    return Answer({"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": "m",
                   "choices": choices, "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}},
                  True, True)


async def miss_then_store(plugin: SemanticCache, exchange: Exchange, reply: Answer | None = None) -> None:
    assert await plugin.request(exchange) is None
    await plugin.response(exchange, reply or answer(), answered_by=None)


def headers(exchange: Exchange) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in exchange.headers}


def outcome(exchange: Exchange) -> str:
    return str(exchange.notes["semantic_cache.outcome"])


def test_the_registry_builds_it() -> None:
    assert CLASSES[SemanticCacheConfig] is SemanticCache


def test_a_repeat_is_an_exact_hit_under_a_fresh_id() -> None:
    async def go() -> None:
        plugin = cache()
        first = chat()
        await miss_then_store(plugin, first)
        assert outcome(first) == "miss" and headers(first) == {"x-router-cache": "miss"}
        again = chat()
        before = int(time.time())
        hit = await plugin.request(again)
        assert hit is not None
        assert hit["id"].startswith("chatcmpl-") and hit["id"] != "chatcmpl-up"
        assert hit["created"] >= before
        stored = answer().completion
        assert {k: v for k, v in hit.items() if k not in ("id", "created")} == \
            {k: v for k, v in stored.items() if k not in ("id", "created")}
        assert outcome(again) == "hit_exact"
        assert headers(again) == {"x-router-cache": "hit", "x-router-cache-match": "exact"}
        # Two hits never share an id.
        assert (await plugin.request(chat()))["id"] != hit["id"]  # type: ignore[index]
    run(go())


def test_a_paraphrase_is_a_semantic_hit_and_another_question_a_miss() -> None:
    async def go() -> None:
        models = FakeModels(vectors=dict(VECTORS))
        plugin = cache(models=models)
        await miss_then_store(plugin, chat(QUESTION))
        paraphrase = chat(PARAPHRASE)
        assert await plugin.request(paraphrase) is not None
        assert outcome(paraphrase) == "hit_semantic"
        assert headers(paraphrase) == {"x-router-cache": "hit", "x-router-cache-match": "semantic",
                                       "x-router-cache-similarity": "0.9600"}
        other = chat(OTHER)
        assert await plugin.request(other) is None and outcome(other) == "miss"
        # Only the last user turn is embedded, never the system prompt.
        assert [texts for _, _, texts in models.calls] == [[QUESTION], [PARAPHRASE], [OTHER]]
    run(go())


def test_the_threshold_is_inclusive_and_can_refuse_a_paraphrase() -> None:
    async def go() -> None:
        strict = cache(replace(CONFIG, threshold=0.97))
        await miss_then_store(strict, chat(QUESTION))
        assert await strict.request(chat(PARAPHRASE)) is None
        exact = cache(replace(CONFIG, threshold=0.96))
        await miss_then_store(exact, chat(QUESTION))
        assert await exact.request(chat(PARAPHRASE)) is not None
    run(go())


def test_exact_only_never_embeds() -> None:
    async def go() -> None:
        models = FakeModels(vectors=dict(VECTORS))
        plugin = cache(replace(CONFIG, semantic=False), models=models)
        await miss_then_store(plugin, chat(QUESTION))
        assert await plugin.request(chat(PARAPHRASE)) is None
        assert await plugin.request(chat(QUESTION)) is not None
        assert models.calls == []
    run(go())


@pytest.mark.parametrize("later", [
    {"tenant": "k2"},  # another API key
    {"user": "alice"},  # a user within the key
    {"entry": "other"},
    {"decision": "code"},
    {"system": "Be verbose."},  # the conversation before the last user turn
    {"temperature": 0.2},
    {"max_tokens": 10},
    {"tools": [{"type": "function", "function": {"name": "f"}}]},
    {"response_format": {"type": "json_object"}},
    {"seed": 7},
    {"n": 2},
], ids=lambda d: next(iter(d)))
def test_what_changes_an_answer_or_its_owner_is_another_scope(later: dict[str, Any]) -> None:
    """Neither the same question nor a paraphrase finds the entry across these."""
    async def go() -> None:
        plugin = cache()
        await miss_then_store(plugin, chat(QUESTION))
        assert await plugin.request(chat(QUESTION, **later)) is None
        assert await plugin.request(chat(PARAPHRASE, **later)) is None
    run(go())


@pytest.mark.parametrize("later", [
    {"stream": True, "stream_options": {"include_usage": True}},
    {"metadata": {"trace": "x"}},
    {"service_tier": "auto"},
    {"store": False},
], ids=lambda d: next(iter(d)))
def test_what_does_not_change_an_answer_shares_it(later: dict[str, Any]) -> None:
    async def go() -> None:
        plugin = cache()
        await miss_then_store(plugin, chat(QUESTION))
        assert await plugin.request(chat(QUESTION, **later)) is not None
    run(go())


def test_a_null_field_is_an_absent_one() -> None:
    async def go() -> None:
        plugin = cache()
        await miss_then_store(plugin, chat(QUESTION))
        assert await plugin.request(chat(QUESTION, temperature=None, tools=None)) is not None
    run(go())


def test_a_user_sees_only_their_own_and_a_shared_cache_shares() -> None:
    async def go() -> None:
        plugin = cache()
        await miss_then_store(plugin, chat(user="alice"))
        assert await plugin.request(chat(user="alice")) is not None
        assert await plugin.request(chat(user="bob")) is None
        assert await plugin.request(chat(user=None)) is None
        assert await plugin.request(chat(tenant="k2", user="alice")) is None
        shared = cache(replace(CONFIG, shared=True))
        await miss_then_store(shared, chat(tenant="k1", user="alice"))
        assert await shared.request(chat(tenant="k2", user="bob")) is not None
        assert await shared.request(chat(PARAPHRASE, tenant="k3")) is not None
    run(go())


@pytest.mark.parametrize("a, b", [
    (("k1", "a/b", "e", "d"), ("k1/a", "b", "e", "d")),  # owner joined as tenant/user
    (("k1", None, "e/d", "x"), ("k1", None, "e", "d/x")),  # entry and decision joined
    (("k1", '", "user": "x', "e", "d"), ("k1", "x", "e", "d")),  # a user that writes JSON
    (("k1", "x", "e", "d"), ("k1", None, "e", "d")),
])
def test_no_crafted_name_reaches_another_scope(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    one = chat(tenant=a[0], user=a[1], entry=a[2], decision=a[3])
    two = chat(tenant=b[0], user=b[1], entry=b[2], decision=b[3])
    assert cache_key(one, shared=False).scope != cache_key(two, shared=False).scope


def test_tool_results_after_the_last_user_turn_are_part_of_the_scope() -> None:
    """A turn answered from a tool's result is never served the answer given before the result came."""
    async def go() -> None:
        plugin = cache()
        await miss_then_store(plugin, chat(QUESTION))
        later = chat(QUESTION)
        later.chat["messages"] += [
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                  "function": {"name": "kb", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Settings > Security > Reset"}]
        assert await plugin.request(later) is None
    run(go())


def test_an_image_in_the_last_turn_is_matched_exactly() -> None:
    def with_image(text: str, url: str) -> Exchange:
        exchange = chat(text)
        exchange.chat["messages"][-1]["content"] = [{"type": "text", "text": text},
                                                    {"type": "image_url", "image_url": {"url": url}}]
        return exchange

    async def go() -> None:
        models = FakeModels(vectors=dict(VECTORS))
        plugin = cache(models=models)
        await miss_then_store(plugin, with_image(QUESTION, "http://a/1.png"))
        assert await plugin.request(with_image(PARAPHRASE, "http://a/2.png")) is None
        assert await plugin.request(with_image(PARAPHRASE, "http://a/1.png")) is not None
        assert models.calls[0][2] == [QUESTION]  # the text parts only
    run(go())


def test_text_parts_are_joined_and_compared_as_text() -> None:
    async def go() -> None:
        models = FakeModels(vectors={**VECTORS, "How do I\nreset my password?": VECTORS[QUESTION]})
        plugin = cache(models=models)
        await miss_then_store(plugin, chat(QUESTION))
        parts = chat(QUESTION)
        parts.chat["messages"][-1]["content"] = [{"type": "text", "text": "How do I"},
                                                 {"type": "text", "text": "reset my password?"}]
        assert await plugin.request(parts) is not None and outcome(parts) == "hit_semantic"
    run(go())


def test_a_long_turn_is_matched_exactly_only() -> None:
    async def go() -> None:
        models = FakeModels()
        plugin = cache(models=models)
        long = "x" * (MAX_SEMANTIC_CHARS + 1)
        await miss_then_store(plugin, chat(long))
        assert await plugin.request(chat(long)) is not None
        assert models.calls == []
    run(go())


@pytest.mark.parametrize("fields", [{"logprobs": True}, {"logprobs": True, "top_logprobs": 3},
                                    {"prompt_logprobs": 1}, {"return_token_ids": True}],
                         ids=["logprobs", "top_logprobs", "prompt_logprobs", "return_token_ids"])
def test_logprobs_requests_are_skipped_and_never_stored(fields: dict[str, Any]) -> None:
    async def go() -> None:
        store = FakeStore()
        plugin = cache(store=store)
        await miss_then_store(plugin, chat(QUESTION))
        asking = chat(QUESTION, **fields)
        assert await plugin.request(asking) is None
        assert outcome(asking) == "skipped" and headers(asking) == {"x-router-cache": "skip"}
        await plugin.response(asking, answer("different"), answered_by=None)
        assert await store.count(KIND) == 1
    run(go())


def test_logprobs_off_is_cached_and_completions_logprobs_zero_is_not() -> None:
    async def go() -> None:
        plugin = cache()
        off = chat(QUESTION, logprobs=False, top_logprobs=0)
        await miss_then_store(plugin, off)
        assert outcome(off) == "miss"
        assert await plugin.request(chat(QUESTION, logprobs=False, top_logprobs=0)) is not None
        zero = completion(logprobs=0)  # a count: 0 still returns the chosen token's logprob
        assert await plugin.request(zero) is None and outcome(zero) == "skipped"
    run(go())


def test_completions_are_cached_under_their_own_ids() -> None:
    async def go() -> None:
        models = FakeModels(vectors=dict(VECTORS))
        plugin = cache(models=models)
        await miss_then_store(plugin, completion(QUESTION), answer("text", text=True))
        hit = await plugin.request(completion(QUESTION))
        assert hit is not None and hit["id"].startswith("cmpl-") and hit["choices"][0]["text"] == "text"
        assert await plugin.request(completion([PARAPHRASE])) is not None  # a list of one string
        # The same prompt as a chat turn is another scope: the upstream API differs.
        assert await plugin.request(chat(QUESTION, system="")) is None
        tokens = completion([1, 2, 3])
        await miss_then_store(plugin, tokens, answer("ids", text=True))
        assert await plugin.request(completion([1, 2, 3])) is not None
        assert await plugin.request(completion([1, 2, 4])) is None
        assert len(models.calls) == 3  # token ids are never embedded
    run(go())


@pytest.mark.parametrize("reply, config, stored", [
    (answer(finish="length"), CONFIG, False),
    (answer(finish="length"), replace(CONFIG, store_truncated=True), True),
    (answer(finish="tool_calls", tool_calls=[{"id": "c", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]), CONFIG, False),
    (answer(finish="tool_calls", tool_calls=[{"id": "c", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]),
     replace(CONFIG, store_tool_calls=True), True),
    # vLLM ends a named tool choice's answer with "stop": its tool calls still keep it out.
    (answer(finish="stop", tool_calls=[{"id": "c", "type": "function",
                                        "function": {"name": "f", "arguments": "{}"}}]), CONFIG, False),
    (answer(n=3), CONFIG, True),
    (Answer({**answer(n=2).completion, "choices": [answer().completion["choices"][0],
                                                   {**answer().completion["choices"][0], "index": 1,
                                                    "finish_reason": "length"}]}, True, True), CONFIG, False),
    (answer(finish="content_filter"), CONFIG, False),
    (Answer({**answer().completion, "choices": []}, True, True), CONFIG, False),
    (Answer(answer().completion, True, False), CONFIG, False),
], ids=["length", "length-allowed", "tool-calls", "tool-calls-allowed", "tool-calls-stop", "n3",
        "n2-one-cut", "content-filter", "no-choices", "incomplete"])
def test_what_is_stored(reply: Answer, config: SemanticCacheConfig, stored: bool) -> None:
    async def go() -> None:
        store = FakeStore()
        plugin = cache(config, store=store)
        await miss_then_store(plugin, chat(), reply)
        assert (await store.count(KIND) == 1) is stored
    run(go())


def test_an_answer_past_the_recorder_bound_is_not_stored() -> None:
    async def go() -> None:
        store = FakeStore()
        plugin = cache(store=store)
        await miss_then_store(plugin, chat(), answer("x" * MAX_ANSWER_BYTES))
        assert await store.count(KIND) == 0
        await miss_then_store(plugin, chat(), answer("x" * (MAX_ANSWER_BYTES - 1000)))
        assert await store.count(KIND) == 1
    run(go())


def test_nothing_is_stored_without_an_answer_or_for_a_hit() -> None:
    async def go() -> None:
        store = FakeStore()
        plugin = cache(store=store)
        first = chat()
        assert await plugin.request(first) is None
        await plugin.response(first, None, answered_by=None)  # an error, a break, the client left
        assert await store.count(KIND) == 0
        await plugin.response(first, answer(), answered_by="memory")  # another plugin's answer
        assert await store.count(KIND) == 0
        await plugin.response(first, answer(), answered_by=None)
        [before] = store.items_by.values()
        again = chat()
        hit = await plugin.request(again)
        assert hit is not None
        await plugin.response(again, answer("replayed"), answered_by="semantic_cache")
        assert list(store.items_by.values()) == [before]
    run(go())


def test_an_entry_lives_ttl_seconds() -> None:
    async def go() -> None:
        store = FakeStore()
        plugin = cache(replace(CONFIG, ttl_s=600), store=store)
        before = time.time()
        await miss_then_store(plugin, chat())
        [item] = store.items_by.values()
        assert before <= item.created <= time.time()
        assert item.expires == pytest.approx(item.created + 600)
        assert item.vector == tuple(VECTORS[QUESTION])
        expired = cache(replace(CONFIG, ttl_s=0), store=FakeStore())
        await miss_then_store(expired, chat())
        assert await expired.request(chat()) is None
        assert await expired.request(chat(PARAPHRASE)) is None
    run(go())


class CountingStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.trims = 0

    async def trim(self, kind: str, scope: str | None, keep: int) -> int:
        self.trims += 1
        return await super().trim(kind, scope, keep)


def test_the_size_bound_evicts_the_oldest_over_every_scope() -> None:
    async def go() -> None:
        store = CountingStore()
        plugin = cache(replace(CONFIG, max_entries=3, semantic=False), store=store)
        for i in range(5):
            await miss_then_store(plugin, chat(f"question {i}", tenant=f"k{i}"))
        assert await store.count(KIND) == 3
        assert store.trims == 5  # a small cache is kept exactly: a trim per put
        assert await plugin.request(chat("question 0", tenant="k0")) is None
        assert await plugin.request(chat("question 1", tenant="k1")) is None
        assert await plugin.request(chat("question 4", tenant="k4")) is not None
    run(go())


def test_a_large_cache_is_trimmed_every_thousand_puts() -> None:
    async def go() -> None:
        store = CountingStore()
        plugin = cache(replace(CONFIG, semantic=False), store=store)  # max_entries 100,000
        reply = answer()
        for i in range(2001):
            exchange = chat(f"q{i}")
            exchange.notes["semantic_cache.key"] = cache_key(exchange, False)
            await plugin.response(exchange, reply, answered_by=None)
        assert store.trims == 3  # the 1st, 1001st and 2001st put
    run(go())


def _host(config: SemanticCacheConfig, store: FakeStore, models: FakeModels) -> PluginHost:
    entry = EntryConfig("assistant", ("pool",), plugins=(config,))
    router = RouterConfig((), {}, {"assistant": entry})
    return PluginHost(router, builder(Shared(router, store, models)), RouterMetrics({}))


def _sample(host: PluginHost, name: str, **labels: str) -> float:
    value = host.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_the_store_down_fails_open_through_the_host() -> None:
    async def go() -> None:
        store = FakeStore()
        host = _host(CONFIG, store, FakeModels(vectors=dict(VECTORS)))
        chain = host.plugins_for(EntryConfig("assistant", ("pool",), plugins=(CONFIG,)), "default", True)
        first = chat()
        assert await host.request(chain, first) == (None, 1)
        host.respond(chain, first, answer(), None)
        await host.drain()
        store.fail = True
        down = chat()
        assert await host.request(chain, down) == (None, 1)  # a miss: the request goes on upstream
        assert _sample(host, "router_plugin_outcomes_total", entry="assistant", plugin="semantic_cache",
                       outcome="error") == 1
        assert _sample(host, "router_store_errors_total", plugin="semantic_cache") == 1
        host.respond(chain, down, answer(), None)  # the store still down when the answer is stored
        await host.drain()
        assert _sample(host, "router_store_errors_total", plugin="semantic_cache") == 2
        store.fail = False
        up = chat()
        hit, _ = await host.request(chain, up)
        assert hit is not None
        assert _sample(host, "router_plugin_outcomes_total", entry="assistant", plugin="semantic_cache",
                       outcome="hit_exact") == 1
        assert _sample(host, "router_plugin_outcomes_total", entry="assistant", plugin="semantic_cache",
                       outcome="miss") == 1
    run(go())


def test_an_embedder_wider_than_the_store_takes_is_an_error_the_request_survives(
        caplog: pytest.LogCaptureFixture) -> None:
    """The store refuses vectors of more than 8,192 dimensions: the lookup and the store are plugin errors
    (logged, counted), never a 500 and never a response hook failing as a bug."""
    async def go() -> None:
        store = FakeStore()
        wide = [1.0] + [0.0] * 9000
        host = _host(CONFIG, store, FakeModels(vectors={QUESTION: wide}))
        chain = host.plugins_for(EntryConfig("assistant", ("pool",), plugins=(CONFIG,)), "default", True)
        # The exact lookup misses first; the semantic lookup is refused with the vector's width.
        exchange = chat()
        assert await host.request(chain, exchange) == (None, 1)
        assert _sample(host, "router_plugin_outcomes_total", entry="assistant", plugin="semantic_cache",
                       outcome="error") == 1
        assert _sample(host, "router_store_errors_total", plugin="semantic_cache") == 0  # the store is up
        host.respond(chain, exchange, answer(), None)
        await host.drain()
        assert store.items_by == {}
    with caplog.at_level("WARNING", logger="router"):
        run(go())
    assert "9001 dimensions; allowed 1 to 8192" in caplog.text
    assert "response hook failed" not in caplog.text  # said as a refusal, not as a bug's traceback


def test_the_store_down_at_lookup_still_stores_the_answer_when_it_is_back() -> None:
    async def go() -> None:
        store = FakeStore()
        plugin = cache(store=store)
        store.fail = True
        first = chat()
        with pytest.raises(StoreUnavailable):
            await plugin.request(first)
        store.fail = False
        await plugin.response(first, answer(), answered_by=None)
        [item] = store.items_by.values()
        assert item.vector == tuple(VECTORS[QUESTION])  # embedded in the response hook instead
        assert await plugin.request(chat(PARAPHRASE)) is not None
    run(go())


def test_the_embedder_down_is_an_error_and_exact_hits_go_on() -> None:
    async def go() -> None:
        store = FakeStore()
        models = FakeModels(vectors=dict(VECTORS))
        plugin = cache(store=store, models=models)
        await miss_then_store(plugin, chat(QUESTION))
        models.hook = failing("embed: no ready worker")
        assert await plugin.request(chat(QUESTION)) is not None  # exact: no embedding needed
        with pytest.raises(ModelUnavailable):
            await plugin.request(chat(PARAPHRASE))
    run(go())


def test_an_unreadable_entry_is_a_miss() -> None:
    async def go() -> None:
        store = FakeStore()
        plugin = cache(store=store)
        exchange = chat()
        key = cache_key(exchange, False)
        await store.put(Item(KIND, key.scope, key.key, b"{not json", None, time.time(), None))
        assert await plugin.request(exchange) is None and outcome(exchange) == "miss"
        await store.put(Item(KIND, key.scope, key.key, b'{"other": 1}', None, time.time(), None))
        assert await plugin.request(chat()) is None
    run(go())


# ---- through the router's ASGI app: the relay records, the host stores, a hit is replayed ----

class App:
    """The router app with the cache on its one entry, a fake upstream, store and embedder."""

    def __init__(self, config: SemanticCacheConfig = CONFIG) -> None:
        parsed = parse_config({"listeners": [{"port": 8080, "api_keys": ["key-a", "key-b"]}],
                               "pools": {"p": {"model": "p-m", "replicas": [{"url": UP}]}},
                               "entries": {"assistant": {"default": ["p"]}}})
        entry = replace(parsed.entries["assistant"], plugins=(config,))
        self.config = replace(parsed, entries={"assistant": entry})
        self.store = FakeStore()
        pools = build_pools(self.config)
        self.upstream = FakeUpstream()
        self.host = PluginHost(self.config, builder(Shared(self.config, self.store, FakeModels(vectors=dict(VECTORS)))),
                               RouterMetrics(pools))
        self.app = RouterApp(self.config, Router(self.config), pools, self.upstream, self.host.metrics,
                             plugins=self.host)

    async def post(self, path: str, body: dict[str, Any], key: str = "key-a", **headers: str) -> AsgiAnswer:
        answer = await request(self.app, "POST", path, body, headers={"authorization": f"Bearer {key}", **headers})
        await self.host.drain()  # the response hook has stored what it stores
        return answer


UP = "http://up:8000"
HI = [{"role": "user", "content": QUESTION}]


def sse_reply(break_after: int | None = None) -> Reply:
    return Reply(chunks=chunk_events(["Use the ", "reset link."]), content_type="text/event-stream",
                 break_after=break_after)


def test_a_streamed_responses_miss_is_stored_and_replayed_in_each_shape() -> None:
    async def go() -> None:
        app = App()
        app.upstream.answer(UP, sse_reply())
        body = {"model": "assistant", "input": QUESTION}
        miss = await app.post("/v1/responses", {**body, "stream": True})
        assert miss.status == 200 and miss.headers["x-router-cache"] == "miss"
        assert await app.store.count(KIND) == 1
        whole = await app.post("/v1/responses", body)
        assert whole.headers["x-router-cache"] == "hit" and whole.headers["x-router-cache-match"] == "exact"
        assert whole.json()["output"][0]["content"][0]["text"] == "Use the reset link."
        assert whole.json()["status"] == "completed"
        streamed = await app.post("/v1/responses", {**body, "stream": True})
        events = streamed.events()
        assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Use the reset link."
        assert len(app.upstream.sent) == 1
        assert app.upstream.sent[0].body["stream_options"] == {"include_usage": True}
    run(go())


def test_a_messages_hit_is_replayed_as_a_messages_stream() -> None:
    async def go() -> None:
        app = App()
        app.upstream.answer(UP, Reply(chunks=(completion_body("Use the reset link."),)))
        body = {"model": "assistant", "max_tokens": 64, "messages": HI}
        assert (await app.post("/v1/messages", body)).headers["x-router-cache"] == "miss"
        hit = await app.post("/v1/messages", {**body, "stream": True})
        assert hit.headers["x-router-cache"] == "hit"
        kinds = [e["type"] for e in hit.events()]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        text = "".join(e["delta"].get("text", "") for e in hit.events() if e["type"] == "content_block_delta")
        assert text == "Use the reset link."
        assert len(app.upstream.sent) == 1
    run(go())


def test_a_passed_through_chat_stream_is_stored_and_one_that_broke_off_is_not() -> None:
    async def go() -> None:
        app = App()
        stream = {"model": "assistant", "messages": HI, "stream": True}
        app.upstream.answer(UP, sse_reply(break_after=2))
        broke = await app.post("/v1/chat/completions", stream)
        assert broke.status == 200 and await app.store.count(KIND) == 0
        app.upstream.answer(UP, sse_reply())
        assert (await app.post("/v1/chat/completions", stream)).headers["x-router-cache"] == "miss"
        assert await app.store.count(KIND) == 1
        hit = await app.post("/v1/chat/completions", {"model": "assistant", "messages": HI})
        assert hit.headers["x-router-cache"] == "hit"
        assert hit.json()["choices"][0]["message"]["content"] == "Use the reset link."
        assert hit.json()["usage"]["completion_tokens"] == 2
        assert "cache" not in hit.body.decode()
        other = await app.post("/v1/chat/completions", {"model": "assistant", "messages": HI}, key="key-b")
        assert other.headers["x-router-cache"] == "miss"
        user = await app.post("/v1/chat/completions", {"model": "assistant", "messages": HI}, **{"x-router-user": "a"})
        assert user.headers["x-router-cache"] == "miss"
        assert len(app.upstream.sent) == 4
    run(go())


def test_the_store_down_the_request_goes_on_upstream() -> None:
    async def go() -> None:
        app = App()
        app.store.fail = True
        answer = await app.post("/v1/chat/completions", {"model": "assistant", "messages": HI})
        assert answer.status == 200 and "x-router-cache" not in answer.headers
        assert answer.json()["choices"][0]["message"]["content"] == f"from {UP}"
        assert len(app.upstream.sent) == 1
    run(go())
