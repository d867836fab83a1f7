"""Shared rate limits: three router processes counting one budget in one real PostgreSQL (pgserver), two that
fail open and one that fails closed. Then the server is stopped as by a crash: the open ones admit and count
on their own (the failures counted), the closed one answers 503 at once, and once the server is back the
budget in it counts again."""
from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.postgres import Server, running
from tests.support.procs import HttpProc, start_router
from tests.support.waiting import until

KEY = {"authorization": "Bearer k"}
CONFIG = """
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [k], limits: {{requests_per_minute: 4}}}}]
pools:
  chat: {{model: tiny, replicas: [{{url: "{backend}"}}]}}
store: {{backend: postgres, dsn: "{dsn}", timeout_s: 1}}
admission: {{shared: true, on_store_error: {on_error}}}
entries:
  m: {{default: [chat]}}
"""


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running("router-limits-pg-") as pg:
        yield pg


@pytest.fixture(scope="module")
def routers(tmp_path_factory: pytest.TempPathFactory, backend: HttpProc,
            server: Server) -> Iterator[tuple[HttpProc, HttpProc, HttpProc]]:
    dsn = server.new_database()
    started: list[HttpProc] = []
    try:
        for name, on_error in (("a", "open"), ("b", "open"), ("c", "closed")):
            config = CONFIG.format(backend=backend.url, dsn=dsn, on_error=on_error)
            started.append(start_router(tmp_path_factory.mktemp(f"router-{name}"), config))
        yield started[0], started[1], started[2]
    finally:
        for router in started:
            router.terminate()
        for router in started:
            router.wait_stopped()


def _chat(router: HttpProc) -> httpx.Response:
    return httpx.post(router.url + "/v1/chat/completions", headers=KEY, timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def _metric(router: HttpProc, name: str) -> float:
    text = httpx.get(router.url + "/metrics", headers=KEY, timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name)


def test_routers_share_one_budget_and_the_store_down_fails_open_or_closed(
        routers: tuple[HttpProc, HttpProc, HttpProc], server: Server) -> None:
    a, b, c = routers
    said = [_chat(router) for router in (a, b, c, a)]
    assert [r.status_code for r in said] == [200] * 4
    assert [r.headers["x-ratelimit-remaining-requests"] for r in said] == ["3", "2", "1", "0"]
    for router in (b, c):  # a minute's 4, through three routers: the budget is spent for all
        refused = _chat(router)
        assert refused.status_code == 429 and refused.headers["retry-after"]
    server.stop()
    try:
        started = time.monotonic()
        r = _chat(a)
        assert r.status_code == 200  # open: counted by a alone meanwhile (its own fresh budget)
        assert r.headers["x-ratelimit-remaining-requests"] == "3"
        closed = _chat(c)
        assert closed.status_code == 503 and "admission.on_store_error is closed" in closed.json()["error"]["message"]
        assert time.monotonic() - started < 10  # never a hang: each store call is bounded by its timeout_s
        assert _metric(a, "router_limit_store_errors_total") >= 1 and _metric(c, "router_limit_store_errors_total") >= 1
    finally:
        server.start()
    # Back: the budget in the store (still spent) counts again, through every router.
    until("b refused by the store's budget again", lambda: _chat(b).status_code == 429 or None, timeout_s=20)
    assert _chat(c).status_code == 429
