"""Two router processes over one real PostgreSQL with pgvector (pgserver), in front of one OpenAI test
backend, each with its own managed `sim` embed deployment (equal texts embed equally in both): what one
router caches, remembers, indexes or stores as Responses state, the other reads. Then the server is
stopped as by a crash: requests still get answers (the cache fails open, counted), and once it is back
the routers use it again without a restart. A router whose store cannot be opened does not start."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.postgres import Server, running
from tests.support.procs import HttpProc, start_router
from tests.support.waiting import until

ONE, TWO = {"authorization": "Bearer key-one"}, {"authorization": "Bearer key-two"}
PUMP = "The pump is serviced every spring by the facilities team."
FAN = "The fan in room four rattles when it runs at full speed."

CONFIG = """
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [key-one, key-two]}}]
pools:
  chat: {{model: tiny, replicas: [{{url: "{backend}"}}]}}
deployments:
  emb: {{model: tiny, tasks: [embed], managed: {{backend: sim}}}}
store: {{backend: postgres, dsn: "{dsn}", timeout_s: 2}}
knowledge:
  docs: {{paths: ["{docs}"], embedder: emb, refresh_s: 0.3}}
entries:
  cached:
    default: [chat]
    plugins: [{{type: semantic_cache, embedder: emb}}]
  recall:
    default: [chat]
    plugins:
      - {{type: memory, embedder: emb, min_similarity: 0.5, timeout_s: 10}}
      - {{type: rag, knowledge: docs, min_similarity: 0.5, timeout_s: 10}}
"""


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running("router-pg-") as pg:
        yield pg


@pytest.fixture(scope="module")
def dsn(server: Server) -> str:
    return server.new_database()


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("docs")
    (folder / "pump.md").write_text(PUMP)
    (folder / "fan.md").write_text(FAN)
    return folder


@pytest.fixture(scope="module")
def routers(tmp_path_factory: pytest.TempPathFactory, backend: HttpProc, dsn: str,
            docs: Path) -> Iterator[tuple[HttpProc, HttpProc]]:
    config = CONFIG.format(backend=backend.url, dsn=dsn, docs=docs)
    started: list[HttpProc] = []
    try:
        for name in ("a", "b"):
            started.append(start_router(tmp_path_factory.mktemp(f"router-{name}"), config))
        for router in started:
            router.wait_ready(headers=ONE, timeout_s=240)
        yield started[0], started[1]
    finally:
        for router in started:
            router.terminate()
        for router in started:
            router.wait_stopped()



def _chat(router: HttpProc, model: str, content: str, headers: dict[str, str] = ONE) -> httpx.Response:
    r = httpx.post(router.url + "/v1/chat/completions", headers=headers, timeout=30,
                   json={"model": model, "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    return r


def _metric(router: HttpProc, name: str, labels: dict[str, str]) -> float:
    text = httpx.get(router.url + "/metrics", headers=ONE, timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def _rows(dsn: str, kind: str) -> int:
    async def count() -> int:
        conn = await asyncpg.connect(dsn)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM router_items WHERE kind = $1", kind))
        finally:
            await conn.close()
    return asyncio.run(count())


def test_an_answer_cached_through_one_router_is_a_hit_through_the_other(
        routers: tuple[HttpProc, HttpProc], backend: HttpProc) -> None:
    a, b = routers
    question = "How do I rotate the API keys of the billing service?"
    assert _chat(a, "cached", question).headers["x-router-cache"] == "miss"
    # a stores its answer once it has gone out: until then a lookup through b could miss, or find it by
    # embedding after its exact lookup missed. a's own exact hit says the entry is in the shared store.
    until("a's answer stored", lambda: _chat(a, "cached", question).headers.get("x-router-cache") == "hit" or None,
          timeout_s=20)
    calls = backend.stats()["requests"]
    hit = _chat(b, "cached", question)
    assert (hit.headers["x-router-cache"], hit.headers["x-router-cache-match"]) == ("hit", "exact")
    assert backend.stats()["requests"] == calls  # b answered from what a stored: no call upstream
    assert _chat(b, "cached", question, TWO).headers["x-router-cache"] == "miss"  # another key: its own cache


def test_a_memory_kept_through_one_router_is_listed_recalled_and_erased_through_the_other(
        routers: tuple[HttpProc, HttpProc], backend: HttpProc) -> None:
    a, b = routers
    ann = {**ONE, "x-router-user": "ann"}
    backend.configure(reply="Noted: the office plant is watered on Fridays.")
    try:
        _chat(a, "recall", "the office plant is watered on Fridays", ann)
        [memory] = until("ann's memory, listed through b", lambda: httpx.get(
            b.url + "/v1/memory", headers=ann, timeout=10).json()["data"] or None)
    finally:
        backend.reset()
    turn = "User: the office plant is watered on Fridays\nAssistant: Noted: the office plant is watered on Fridays."
    assert memory["content"] == turn
    _chat(b, "recall", turn, ann)
    system = backend.stats()["last_body"]["messages"][0]
    assert system["role"] == "system" and turn in system["content"]
    assert httpx.get(b.url + "/v1/memory", headers={**TWO, "x-router-user": "ann"}, timeout=10).json()["data"] == []
    erased = httpx.delete(f"{b.url}/v1/memory/{memory['id']}", headers=ann, timeout=10)
    assert erased.json() == {"id": memory["id"], "object": "memory", "deleted": True}
    assert memory["id"] not in [m["id"] for m in httpx.get(a.url + "/v1/memory", headers=ann,
                                                           timeout=10).json()["data"]]


def test_both_routers_index_one_base_into_one_set_of_chunks(
        routers: tuple[HttpProc, HttpProc], backend: HttpProc, dsn: str, docs: Path) -> None:
    def sources(router: HttpProc, text: str) -> str | None:
        return _chat(router, "recall", text, TWO).headers.get("x-router-rag-sources") or None

    for router in routers:
        for text, name in ((PUMP, "pump.md"), (FAN, "fan.md")):
            found = until(f"{name} recalled", lambda router=router, text=text: sources(router, text), timeout_s=120)
            assert found == f"{docs}/{name}#0"
    assert _rows(dsn, "chunk") == 2 and _rows(dsn, "file") == 2  # the same keys, written by either: no copies


def test_a_response_stored_through_one_router_is_read_and_chained_through_the_other(
        routers: tuple[HttpProc, HttpProc], backend: HttpProc) -> None:
    a, b = routers
    with openai.OpenAI(api_key="key-one", base_url=a.url + "/v1", max_retries=0, timeout=30) as via_a, \
            openai.OpenAI(api_key="key-one", base_url=b.url + "/v1", max_retries=0, timeout=30) as via_b:
        first = via_a.responses.create(model="cached", input="Remember the number 7.")
        assert via_b.responses.retrieve(first.id).output_text == first.output_text
        second = via_b.responses.create(model="cached", input="Which number?", previous_response_id=first.id)
        sent: list[dict[str, Any]] = backend.stats()["last_body"]["messages"]
        said = [m["content"] if isinstance(m["content"], str) else "".join(p["text"] for p in m["content"])
                for m in sent]
        assert said == ["Remember the number 7.", first.output_text, "Which number?"]
        assert via_a.responses.retrieve(second.id).previous_response_id == first.id
    with openai.OpenAI(api_key="key-two", base_url=b.url + "/v1", max_retries=0, timeout=30) as other:
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(first.id)


def test_zz_the_store_down_requests_are_still_answered_and_it_is_used_again_once_back(
        routers: tuple[HttpProc, HttpProc], server: Server) -> None:
    a, _ = routers
    errors = _metric(a, "router_store_errors_total", {"plugin": "semantic_cache"})
    server.stop()
    try:
        started = time.monotonic()
        r = _chat(a, "cached", "Is the canteen open on Sundays?")
        assert "x-router-cache" not in r.headers and time.monotonic() - started < 10
        r = _chat(a, "recall", "Is the canteen open on Sundays?", TWO)  # memory and rag fail open by default
        assert not r.headers.get("x-router-rag-sources")
        assert _metric(a, "router_store_errors_total", {"plugin": "semantic_cache"}) > errors
    finally:
        server.start()
    question = "Is the library open on Sundays?"
    until("a miss once the store is back", lambda: True if _chat(a, "cached", question).headers.get(
        "x-router-cache") == "miss" else None, timeout_s=30)
    until("a hit once the store is back", lambda: True if _chat(a, "cached", question).headers.get(
        "x-router-cache") == "hit" else None, timeout_s=30)


@pytest.mark.parametrize("where", ["no server", "no such database"])
def test_zz_a_router_whose_store_cannot_be_opened_does_not_start(tmp_path: Path, backend: HttpProc, docs: Path,
                                                                 server: Server, where: str) -> None:
    dsn = (f"postgresql://nobody@/router?host={tmp_path / 'no-such-socket-dir'}" if where == "no server"
           else server.uri("no_such_database"))
    router = start_router(tmp_path, CONFIG.format(backend=backend.url, dsn=dsn, docs=docs), wait=False)
    code = router.wait_stopped(timeout_s=60)
    assert code == 2, router.log()
    assert "cannot open the store (postgres)" in router.log()


# A user name is a store key: NUL is refused there (400); text with anything else valid is kept and found.
@pytest.mark.parametrize("text", ["caf\u00e9 \u05e9\u05dc\u05d5\u05dd \U0001f9d1\u200d\U0001f4bb e\u0301",
                                  "\ufeffbom and \u2028 line separator", "lone surrogate \ud800 here"])
def test_unicode_edge_cases_are_cached_and_remembered_through_either_router(
        routers: tuple[HttpProc, HttpProc], backend: HttpProc, text: str) -> None:
    a, b = routers
    user = text if "\ud800" not in text else "surrogates-user"  # a lone surrogate has no UTF-8 form for a URL

    def chat(router: HttpProc, model: str) -> httpx.Response:
        # Written by hand: httpx's json= would refuse a lone surrogate, which JSON itself allows as an escape.
        body = json.dumps({"model": model, "user": user, "messages": [{"role": "user", "content": text}]})
        r = httpx.post(router.url + "/v1/chat/completions", headers={**ONE, "content-type": "application/json"},
                       content=body.encode(), timeout=30)
        assert r.status_code == 200, r.text
        return r

    assert chat(a, "cached").headers["x-router-cache"] == "miss"
    until("a hit through b", lambda: True if chat(b, "cached").headers["x-router-cache"] == "hit" else None,
           timeout_s=20)
    chat(a, "recall")
    listed = until("the turn remembered", lambda: httpx.get(b.url + "/v1/memory", params={"user": user},
                                                               headers=ONE, timeout=10).json()["data"] or None)
    # Kept as the router read it: a lone surrogate, which no UTF-8 text can hold, as U+FFFD.
    assert listed[0]["content"].startswith(f"User: {text.replace(chr(0xD800), chr(0xFFFD))}\nAssistant: ")


def test_a_user_name_with_nul_is_refused_naming_the_field(routers: tuple[HttpProc, HttpProc]) -> None:
    r = httpx.post(routers[0].url + "/v1/chat/completions", headers=ONE, timeout=30, json={
        "model": "recall", "user": "ann\u0000", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "user", r.text
