"""A pool's fair queue through a real router process in front of a slow test backend (separate processes,
real sockets): a burst beyond capacity is queued and answered, a flooding tenant does not delay a quiet
one, a waiter past its class's TTL is refused with Retry-After, and a client that leaves while queued is
removed at once (its slot never handed to it, nothing sent upstream for it)."""
from __future__ import annotations

import concurrent.futures
import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.procs import HttpProc, start_backend, start_router
from tests.support.waiting import until

KEYS = {"flood": "k-flood", "quiet": "k-quiet", "short": "k-short"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpProc, HttpProc]]:
    tmp = tmp_path_factory.mktemp("queue")
    backend = start_backend(tmp, "a")
    router = start_router(tmp, f"""
listeners:
  - port: {{port}}
    host: 127.0.0.1
    api_keys: [k-flood, k-quiet, k-short]
    keys:
      - {{key: k-flood, name: flood, tenant: flood}}
      - {{key: k-quiet, name: quiet, tenant: quiet}}
      - {{key: k-short, name: short, tenant: short, priority: short}}
admission:
  priorities: [{{name: standard, queue_ttl_s: 60}}, {{name: short, queue_ttl_s: 0.3}}]
pools:
  p:
    model: m
    replicas: [{{url: {backend.url}}}]
    max_inflight: 1
    queue_size: 40
    health: {{interval_s: 0.5, timeout_s: 2}}
entries:
  fleet: {{default: [p]}}
""")
    try:
        yield backend, router
    finally:
        router.stop()
        backend.stop()


@pytest.fixture
def slow(fleet: tuple[HttpProc, HttpProc]) -> Iterator[tuple[HttpProc, HttpProc]]:
    backend, router = fleet
    backend.reset()
    yield backend, router
    until("the backend idle", lambda: backend.stats()["inflight"] == 0 or None, timeout_s=30)
    until("the queue empty", lambda: _depth(router) == 0 or None, timeout_s=30)


def _chat(router: HttpProc, tenant: str, content: str = "hi", **headers: str) -> httpx.Response:
    return httpx.post(router.url + "/v1/chat/completions", timeout=60,
                      headers={"authorization": f"Bearer {KEYS[tenant]}", **headers},
                      json={"model": "fleet", "messages": [{"role": "user", "content": content}]})


def _metric(router: HttpProc, name: str, **labels: str) -> float:
    text = httpx.get(router.url + "/metrics", headers={"authorization": "Bearer k-quiet"}, timeout=10).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if m and m[1] == name:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(m[3])
    return total


def _depth(router: HttpProc) -> int:
    return int(_metric(router, "router_queue_depth", pool="p"))


def _queued(router: HttpProc, n: int) -> None:
    until(f"{n} request(s) queued", lambda: _depth(router) == n or None, timeout_s=20, every_s=0.02)


def _entered(router: HttpProc) -> int:
    """Requests that have joined the queue so far: waiting now, or served from it."""
    return _depth(router) + int(_metric(router, "router_queue_served_total", pool="p"))


def test_a_burst_beyond_capacity_is_queued_and_answered(slow: tuple[HttpProc, HttpProc]) -> None:
    backend, router = slow
    backend.configure(held=True)
    served = _metric(router, "router_queue_served_total", pool="p", **{"class": "standard"})
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        burst = [pool.submit(_chat, router, "flood", f"burst {i}") for i in range(8)]
        _queued(router, 7)  # 8x the cap of 1: 429s without the queue
        backend.configure(held=False)
        assert [f.result().status_code for f in burst] == [200] * 8
    assert backend.stats()["completed"] == 8
    assert _metric(router, "router_queue_served_total", pool="p", **{"class": "standard"}) - served == 7


def test_a_flooding_tenant_does_not_delay_a_quiet_one(slow: tuple[HttpProc, HttpProc]) -> None:
    backend, router = slow
    backend.configure(held=True)  # nothing finishes until the queue is laid out: no timer to race
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        flood = [pool.submit(_chat, router, "flood", f"flood {i}") for i in range(15)]
        until("one flood request in flight", lambda: backend.stats()["inflight"] == 1 or None, timeout_s=20)
        _queued(router, 14)
        quiet = pool.submit(_chat, router, "quiet", "quiet 0")
        _queued(router, 15)
        backend.configure(held=False)
        assert quiet.result().status_code == 200 and all(f.result().status_code == 200 for f in flood)
    # The order the backend saw them in (one slot: the router sends the next only when one is answered).
    # The quiet request's turn comes with the next slot but one: behind the request in flight and the one
    # flood request whose turn it was. First come, first served would put it behind all 14 queued floods.
    order = backend.stats()["prompts"]
    assert sorted(order) == sorted([f"flood {i}" for i in range(15)] + ["quiet 0"])
    assert order.index("quiet 0") <= 2, order


def test_a_waiter_past_its_class_ttl_gets_429_with_retry_after(slow: tuple[HttpProc, HttpProc]) -> None:
    backend, router = slow
    backend.configure(delay_s=2.0)
    before = _metric(router, "router_queue_rejections_total", tenant="short", reason="ttl")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_chat, router, "flood")
        until("the slot taken", lambda: backend.stats()["inflight"] == 1 or None, timeout_s=20, every_s=0.02)
        r = _chat(router, "short")  # its class waits 0.3 s at most
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert "queue_ttl_s (0.3s)" in r.json()["error"]["message"]
        assert held.result().status_code == 200
    assert _metric(router, "router_queue_rejections_total", tenant="short", reason="ttl") == before + 1


def test_an_unknown_priority_class_is_a_400_naming_the_header(slow: tuple[HttpProc, HttpProc]) -> None:
    _, router = slow
    r = _chat(router, "quiet", **{"x-router-priority": "gold"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-router-priority"


def test_a_client_that_leaves_while_queued_is_removed_at_once(slow: tuple[HttpProc, HttpProc]) -> None:
    backend, router = slow
    backend.configure(delay_s=3.0)
    abandoned = _metric(router, "router_queue_abandoned_total", pool="p")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_chat, router, "flood")
        until("the slot taken", lambda: backend.stats()["inflight"] == 1 or None, timeout_s=20, every_s=0.02)
        body = b'{"model":"fleet","messages":[{"role":"user","content":"leaving"}]}'
        with socket.create_connection(("127.0.0.1", router.port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k-quiet\r\n"
                      b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            _queued(router, 1)
        left = time.monotonic()
        _queued(router, 0)  # gone from the queue while the slot is still taken
        assert backend.stats()["inflight"] == 1, "removed only when the slot freed, not when it left"
        assert time.monotonic() - left < 2.5
        assert held.result().status_code == 200
    assert _metric(router, "router_queue_abandoned_total", pool="p") == abandoned + 1
    assert backend.stats()["requests"] == 1  # the one that left was never sent upstream
