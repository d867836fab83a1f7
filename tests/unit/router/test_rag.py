"""The rag plugin (plugins/rag.py) over the fake store and a knowledge base of files in a tmp folder:
what the upstream request carries (the chunks and their sources, in one system message, within the
budget), what the response head says (x-router-rag-sources), and how the host treats a store that is
down (fail open, or a 503 when configured closed)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import pytest

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import RouterConfig, parse_config
from services.router.decision.engine import Router
from services.router.metrics import RouterMetrics
from services.router.plugins.hooks import Exchange, PluginRefusal
from services.router.plugins.host import PluginHost
from services.router.plugins.rag import SOURCES_HEADER, Rag
from services.router.plugins.recall import estimate_tokens
from services.router.plugins.registry import builder
from services.router.plugins.shared import Shared
from tests.support.asgi_client import request
from tests.support.fake_models import FakeModels
from tests.support.fake_store import FakeStore
from tests.support.fake_upstream import FakeUpstream, Reply, chunk_events, completion
from tests.support.word_vectors import WordVectors

T = TypeVar("T")


def run(work: Awaitable[T]) -> T:
    return asyncio.run(work)  # type: ignore[arg-type]


def config(folder: Path, **rag: Any) -> RouterConfig:
    return parse_config({
        "listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [{"url": "http://a:1"}]}},
        "deployments": {"emb": {"model": "minilm", "tasks": ["embed"], "attached": {"urls": ["http://e:1"]}}},
        "store": {}, "knowledge": {"docs": {"paths": [str(folder)], "embedder": "emb", "refresh_s": 0}},
        "entries": {"e": {"default": ["p"], "plugins": [{"type": "rag", "knowledge": "docs", **rag}]}}})


def exchange(text: str, *, chat_api: bool = True) -> Exchange:
    chat = {"model": "m", "messages": [{"role": "user", "content": text}]} if chat_api else {"model": "m",
                                                                                             "prompt": text}
    return Exchange("chat" if chat_api else "completions", chat_api, "e", "default", dict(chat), chat, "k1", None)


def rag(folder: Path, store: FakeStore | None = None, **settings: Any) -> Rag:
    cfg = config(folder, **settings)
    [plugin] = cfg.entries["e"].plugins
    return Rag(plugin, Shared(cfg, store or FakeStore(), FakeModels(vectors=WordVectors())))  # type: ignore[arg-type]


def sources(ex: Exchange) -> list[str]:
    [value] = [v for k, v in ex.headers if k == SOURCES_HEADER]
    return [unquote(s) for s in value.decode("ascii").split(",")]


def test_the_nearest_chunks_go_upstream_with_their_sources_and_the_response_names_them(tmp_path: Path) -> None:
    odd = tmp_path / "sub" / "notes, été #1.md"
    odd.parent.mkdir()
    odd.write_text("# Boilers\n\nThe boiler pressure must stay between one and two bar.\n")
    (tmp_path / "cats.txt").write_text("Cats sleep sixteen hours a day.\n")
    plugin = rag(tmp_path)

    async def go() -> Exchange:
        await plugin.base.refresh()
        ex = exchange("what boiler pressure must it stay between")
        assert await plugin.request(ex) is None
        return ex

    ex = run(go())
    system, user = ex.chat["messages"]
    path = f"{tmp_path}/sub/notes, été #1.md"
    assert system["role"] == "system" and user == ex.request["messages"][0]
    assert f"[{path}#0]\n# Boilers\n\nThe boiler pressure must stay between one and two bar." in system["content"]
    assert "Cats" not in system["content"]
    raw = next(v for k, v in ex.headers if k == SOURCES_HEADER)
    assert b" " not in raw and b"," not in raw and raw.count(b"#") == 1  # the name's are percent-encoded
    assert sources(ex) == [f"{path}#0"] and ex.notes["rag.outcome"] == "recalled"


def test_the_chunks_fit_max_tokens_and_the_header_lists_only_those_given(tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"f{i}.md").write_text(f"pump maintenance schedule {i} " + "detail " * 60)
    plugin = rag(tmp_path, max_tokens=200, top_k=4)

    async def go() -> Exchange:
        await plugin.base.refresh()
        ex = exchange("pump maintenance schedule detail")
        await plugin.request(ex)
        return ex

    ex = run(go())
    content = ex.chat["messages"][0]["content"]
    assert estimate_tokens(content) <= 200
    given = sources(ex)
    assert 1 <= len(given) < 4 and all(f"[{s}]" in content for s in given)
    assert content.count("[" + str(tmp_path)) == len(given)


def test_nothing_similar_is_outcome_none_and_a_text_completion_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("alpha beta gamma")
    plugin = rag(tmp_path)

    async def go() -> tuple[Exchange, Exchange]:
        await plugin.base.refresh()
        unrelated, text = exchange("zebra"), exchange("alpha beta gamma", chat_api=False)
        await plugin.request(unrelated)
        await plugin.request(text)
        return unrelated, text

    unrelated, text = run(go())
    assert unrelated.notes["rag.outcome"] == "none" and not unrelated.headers
    assert unrelated.chat["messages"] == unrelated.request["messages"]
    assert text.notes["rag.outcome"] == "skipped" and not text.headers


def test_every_rag_plugin_of_one_base_shares_its_indexing(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("alpha")
    cfg = parse_config({
        "listeners": [{"port": 8080}], "pools": {"p": {"model": "m", "replicas": [{"url": "http://a:1"}]}},
        "deployments": {"emb": {"model": "minilm", "tasks": ["embed"], "attached": {"urls": ["http://e:1"]}}},
        "store": {}, "knowledge": {"docs": {"paths": [str(tmp_path)], "embedder": "emb", "refresh_s": 60}},
        "entries": {"e": {"default": ["p"], "plugins": [{"type": "rag", "knowledge": "docs"}],
                          "signals": [{"name": "k", "type": "keyword", "keywords": ["x"]}],
                          "decisions": [{"name": "d", "when": "k", "pools": ["p"],
                                         "plugins": [{"type": "rag", "knowledge": "docs", "top_k": 1}]}]}}})
    models = FakeModels(vectors=WordVectors())
    shared = Shared(cfg, FakeStore(), models)
    host = PluginHost(cfg, builder(shared), RouterMetrics({}))

    async def go() -> tuple[int, bool, bool]:
        await host.start()
        base = shared.knowledge["docs"]
        await asyncio.wait_for(base.indexed.wait(), 10)
        plugins = [p for _, p in host.plugins_for(cfg.entries["e"], "d", False) + host.plugins_for(
            cfg.entries["e"], "default", True)]
        assert len(plugins) == 2 and all(isinstance(p, Rag) and p.base is base for p in plugins)
        await plugins[0].stop()  # Rag.stop: one user gone, the other still indexing
        running = base._task is not None
        await plugins[1].stop()
        return base.passes, running, base._task is None

    passes, running, stopped = run(go())
    assert passes == 1 and running and stopped
    assert [c for c in models.calls if c[0] == "embed"] == [("embed", "emb", ["alpha"])]  # indexed once


@pytest.mark.parametrize("on_store_error", ["open", "closed"])
def test_the_store_down_skips_rag_or_refuses_the_request_when_it_fails_closed(tmp_path: Path,
                                                                               on_store_error: str) -> None:
    cfg = config(tmp_path, on_store_error=on_store_error)
    store = FakeStore()
    store.fail = True
    metrics = RouterMetrics({})
    host = PluginHost(cfg, builder(Shared(cfg, store, FakeModels(vectors=WordVectors()))), metrics)
    chain = host.plugins_for(cfg.entries["e"], "default", True)
    ex = exchange("anything at all")

    async def go() -> tuple[Any, int]:
        return await host.request(chain, ex)

    if on_store_error == "closed":
        with pytest.raises(PluginRefusal) as refused:
            run(go())
        assert refused.value.status == 503 and "plugin rag is unavailable" in refused.value.message
    else:
        assert run(go()) == (None, 1)
        assert ex.chat["messages"] == ex.request["messages"] and not ex.headers
    assert metrics.plugin_outcomes.labels("e", "rag", "error")._value.get() == 1


def test_through_the_app_every_api_gets_one_system_message_and_the_client_the_sources_header(
        tmp_path: Path) -> None:
    (tmp_path / "boiler.md").write_text("boiler pressure stays between one and two bar")
    cfg = parse_config({
        "listeners": [{"port": 8080, "api_keys": ["one"]}],
        "pools": {"p": {"model": "m", "replicas": [{"url": "http://a:1"}]}},
        "deployments": {"emb": {"model": "minilm", "tasks": ["embed"], "attached": {"urls": ["http://e:1"]}}},
        "store": {}, "knowledge": {"docs": {"paths": [str(tmp_path)], "embedder": "emb", "refresh_s": 0}},
        "entries": {"e": {"default": ["p"], "plugins": [{"type": "memory", "embedder": "emb"},
                                                         {"type": "rag", "knowledge": "docs"}]}}})
    store, upstream = FakeStore(), FakeUpstream()
    upstream.answer("http://a:1", Reply(chunks=chunk_events(["Sure, ", "noted."]), content_type="text/event-stream"),
                    Reply(chunks=(completion("ok"),)))
    shared = Shared(cfg, store, FakeModels(vectors=WordVectors()))
    pools = build_pools(cfg)
    metrics = RouterMetrics(pools)
    host = PluginHost(cfg, builder(shared), metrics)
    app = RouterApp(cfg, Router(cfg), pools, upstream, metrics, plugins=host, store=store)
    key = {"authorization": "Bearer one", "x-router-user": "ann"}

    async def go() -> list[Any]:
        await host.start()
        await asyncio.wait_for(shared.knowledge["docs"].indexed.wait(), 10)
        streamed = await request(app, "POST", "/v1/chat/completions", {
            "model": "e", "stream": True, "messages": [{"role": "user", "content": "remember boiler pressure"}]},
            headers=key)
        await host.drain()
        messages = await request(app, "POST", "/v1/messages", {
            "model": "e", "max_tokens": 10, "system": "Be brief.",
            "messages": [{"role": "user", "content": "boiler pressure"}]}, headers=key)
        text = await request(app, "POST", "/v1/completions", {"model": "e", "prompt": "boiler pressure"},
                             headers=key)
        await host.stop()
        return [streamed, messages, text]

    streamed, messages, text = run(go())
    assert streamed.status == 200 and sources_of(streamed) == [f"{tmp_path}/boiler.md#0"]
    first = upstream.sent[0].body["messages"]
    assert [m["role"] for m in first] == ["system", "user"] and "boiler pressure stays" in first[0]["content"]
    kept = sorted(i.payload for i in store.items_by.values() if i.kind == "memory" and i.scope.endswith("/ann"))
    assert kept == [b'{"content":"User: boiler pressure\\nAssistant: ok"}',  # the Messages answer, and
                    b'{"content":"User: remember boiler pressure\\nAssistant: Sure, noted."}']  # the stream
    assert messages.status == 200 and sources_of(messages) == [f"{tmp_path}/boiler.md#0"]
    second = upstream.sent[1].body["messages"]
    assert [m["role"] for m in second] == ["system", "user"]  # the client's system prompt took both blocks
    assert second[0]["content"].startswith("Be brief.\n\nNotes from earlier conversations")
    assert "remember boiler pressure\nAssistant: Sure, noted." in second[0]["content"]
    assert "[" + str(tmp_path) + "/boiler.md#0]" in second[0]["content"]
    assert text.status == 200 and upstream.sent[2].body["prompt"] == "boiler pressure" and not sources_of(text)
    assert metrics.plugin_outcomes.labels("e", "rag", "skipped")._value.get() == 1


def sources_of(answer: Any) -> list[str]:
    raw = answer.headers.get(SOURCES_HEADER.decode())
    return [unquote(s) for s in raw.split(",")] if raw else []
