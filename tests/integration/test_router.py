"""The router as a separate process in front of small OpenAI-compatible test backends (separate
processes too): config errors, API keys, signals and decisions, escalate, replica scheduling, 429 at
the cap, the circuit breaker, retry before the first byte, cache-aware placement, disconnects."""
from __future__ import annotations

import concurrent.futures
import json
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import HttpProc, free_port_block, start_backend, start_router


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[HttpProc]]:
    tmp = tmp_path_factory.mktemp("backends")
    procs = [start_backend(tmp, name) for name in ("a", "b", "c")]
    yield procs
    for p in procs:
        p.stop()


@pytest.fixture
def a_b_c(backends: list[HttpProc]) -> list[HttpProc]:
    for b in backends:
        b.reset()
    return backends


def _pool(name: str, model: str, backends: list[HttpProc], extra: str = "") -> str:
    replicas = ", ".join(f"{{url: {b.url}}}" for b in backends)
    return f"""
  {name}:
    model: {model}
    replicas: [{replicas}]
    health: {{interval_s: 0.2, timeout_s: 1}}
{extra}"""


def _router(tmp_path: Path, pools: str, fleet: str, *args: str, port: int | None = None) -> HttpProc:
    """A router on one open loopback listener with `pools` (YAML of _pool) and the entry `fleet`."""
    return start_router(tmp_path, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:{pools}
entries:
  fleet: {fleet}
""", *args, port=port)


def _chat(router: HttpProc, content: str = "hello", *, model: str = "fleet", key: str | None = None,
          **extra: object) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(router.url + "/v1/chat/completions", headers=headers, timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": content}], **extra})


def _decide(router: HttpProc, content: str, model: str = "fleet") -> dict:  # type: ignore[type-arg]
    r = httpx.post(router.url + "/v1/router/explain", timeout=30,
                   json={"model": model, "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    return r.json()


# ---- start-up ----

def test_invalid_config_names_the_key_and_exits_nonzero(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("""
listeners: [{port: 9}]
pools:
  chat:
    model: m
    replicas: [{url: "http://127.0.0.1:1"}, {url: x}]
    polcy: cache_aware
entries:
  fleet: {default: [chta]}
""")
    proc = subprocess.run([sys.executable, "-m", "services.router", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "pools.chat.replicas[1].url: expected http(s) URL, got 'x'" in proc.stderr
    assert "pools.chat.polcy: unknown key" in proc.stderr and "did you mean 'policy'?" in proc.stderr
    assert "entries.fleet.default[0]: unknown pool 'chta' (pools: chat)" in proc.stderr


def test_port_flag_overrides_the_first_listener(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    port = free_port_block(1, spread=0)
    router = start_router(tmp_path, f"""
listeners: [{{port: 1, host: 127.0.0.1}}]
pools:{_pool("p", "m", a_b_c[:1])}
entries:
  fleet: {{default: [p]}}
""", "--port", str(port), port=port)
    try:
        assert _chat(router).json()["choices"][0]["message"]["content"] == "a:m"
    finally:
        router.stop()


# ---- keys, routes, shapes ----

def test_api_keys_bearer_and_x_api_key_health_open(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    router = start_router(tmp_path, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1, api_keys: [k-one, k-two]}}]
pools:{_pool("p", "m", a_b_c[:1])}
entries:
  fleet: {{default: [p]}}
""")
    try:
        assert httpx.get(router.url + "/health").status_code == 200
        missing = _chat(router)
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == 401 and "Missing API key" in missing.text
        assert _chat(router, key="k-three").status_code == 401
        assert _chat(router, key="k-two").status_code == 200
        r = httpx.post(router.url + "/v1/chat/completions", headers={"x-api-key": "k-one"},
                       json={"model": "fleet", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "a:m"
        anthropic_401 = httpx.post(router.url + "/v1/messages", headers={"x-api-key": "nope"},
                                   json={"model": "fleet", "max_tokens": 5, "messages": []})
        assert anthropic_401.status_code == 401
        assert anthropic_401.json()["type"] == "error"
        assert anthropic_401.json()["error"]["type"] == "authentication_error"
        assert httpx.get(router.url + "/metrics").status_code == 401
        assert httpx.get(router.url + "/metrics", headers={"x-api-key": "k-one"}).status_code == 200
    finally:
        router.stop()


def test_models_unknown_model_bad_json_and_apis_per_listener(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    router = start_router(tmp_path, f"""
listeners:
  - {{name: public, port: {{port}}, host: 127.0.0.1, apis: [chat, models], entries: [fleet, other]}}
pools:{_pool("p", "m", a_b_c[:1])}
entries:
  fleet: {{default: [p]}}
  other: {{default: [p]}}
  internal: {{default: [p]}}
""")
    try:
        models = httpx.get(router.url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["fleet", "other"]
        unknown = _chat(router, model="nope")
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == 404
        assert "available: fleet, other" in unknown.json()["error"]["message"]
        assert _chat(router, model="internal").status_code == 404  # an entry this listener does not serve
        bad = httpx.post(router.url + "/v1/chat/completions", content=b"{not json")
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
        assert httpx.post(router.url + "/v1/completions", json={"model": "fleet", "prompt": "x"}).status_code == 404
        assert httpx.get(router.url + "/v1/chat/completions").status_code == 405
        assert _chat(router, model="other").status_code == 200  # the bad requests cost nothing
    finally:
        router.stop()


def test_dns_discovered_replicas(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a = a_b_c[0]
    pools = f"\n  p: {{model: m, dns: {{name: localhost, port: {a.port}, refresh_s: 0.5}}}}"
    router = _router(tmp_path, pools, "{default: [p]}")
    try:
        r = _chat(router)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "a:m"
        assert r.headers["x-router-replica"] in (f"http://127.0.0.1:{a.port}", f"http://[::1]:{a.port}")
    finally:
        router.stop()


# ---- signals and decisions ----

SIGNALS_CONFIG = """
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:{pools}
entries:
  fleet:
    signal_budget_s: 10  # the in-process embedding on a loaded test host can take more than the default 0.5 s
    signals:
      - {{name: urgent, type: keyword, keywords: [urgent, asap], mode: any}}
      - {{name: both, type: keyword, keywords: [Alpha, Beta], mode: all, case_sensitive: true}}
      - {{name: code, type: regex, pattern: "def \\\\w+\\\\(", flags: []}}
      - {{name: long, type: context_length, min_tokens: 200}}
      - {{name: poetry, type: embedding, threshold: 0.5, examples: ["write a poem about the sea", "compose verses"]}}
    decisions:
      - {{name: code-first, when: code, pools: [big]}}
      - {{name: urgent-short, when: {{all: [urgent, {{not: long}}]}}, pools: [fast]}}
      - {{name: alphabet, when: both, pools: [big]}}
      - {{name: long, when: long, pools: [big]}}
      - {{name: poems, when: poetry, pools: [fast]}}
    default: [small]
"""


def test_each_signal_kind_decision_order_and_default(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a, b, c = a_b_c
    pools = _pool("small", "small-m", [a]) + _pool("fast", "fast-m", [b]) + _pool("big", "big-m", [c])
    router = start_router(tmp_path, SIGNALS_CONFIG.format(pools=pools))
    try:
        plain = _decide(router, "what is the weather")
        assert plain["decision"] == "default" and plain["matched_default"] and plain["pool"] == "small"
        assert set(plain["signals"]) == {"urgent", "both", "code", "long", "poetry"}
        assert not any(s["matched"] for s in plain["signals"].values())

        urgent = _decide(router, "URGENT: reset my password")
        assert urgent["signals"]["urgent"]["matched"] and urgent["decision"] == "urgent-short"
        assert urgent["pool"] == "fast" and urgent["replica"] == b.url
        assert _decide(router, "an insurgent army")["decision"] == "default"  # whole words only

        assert _decide(router, "Alpha and Beta")["decision"] == "alphabet"
        assert _decide(router, "alpha and beta")["decision"] == "default"  # case-sensitive
        assert _decide(router, "Alpha only")["decision"] == "default"  # mode all

        # Two decisions match: the first in file order wins.
        both = _decide(router, "urgent: def foo(x): return x")
        assert both["signals"]["code"]["matched"] and both["signals"]["urgent"]["matched"]
        assert both["decision"] == "code-first" and both["pool"] == "big"

        long_urgent = _decide(router, "urgent " + "word " * 400)
        assert long_urgent["signals"]["long"]["matched"] and long_urgent["decision"] == "long"

        poem = _decide(router, "please write me a short poem about the ocean")
        assert poem["signals"]["poetry"]["matched"] and poem["decision"] == "poems"
        assert poem["signals"]["poetry"]["score"] >= 0.5

        # The decision is what dispatch does: the pool's replica answers with the pool's model name.
        r = _chat(router, "asap please")
        assert r.json()["choices"][0]["message"]["content"] == "b:fast-m"
        assert r.headers["x-router-decision"] == "urgent-short" and r.headers["x-router-pool"] == "fast"
        assert _chat(router, "hi").json()["choices"][0]["message"]["content"] == "a:small-m"
        metrics = httpx.get(router.url + "/metrics").text
        assert 'router_decisions_total{decision="urgent-short",entry="fleet"} 1.0' in metrics
    finally:
        router.stop()


# ---- escalate ----

def test_escalate_calls_the_next_stage_only_when_the_first_fails(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a, b, _ = a_b_c
    router = _router(tmp_path, _pool("cheap", "cheap-m", [a]) + _pool("strong", "strong-m", [b]),
                     """{default: [cheap], algorithm: {type: escalate, stages: [cheap, strong], deadline_s: 10,
                         max_calls: 2, accept: {finish_reasons: [stop], min_chars: 4, regex: "answer"}}}""")
    try:
        a.configure(reply="the answer is 4")
        good = _chat(router)
        assert good.status_code == 200 and good.headers["x-router-stage"] == "cheap"
        assert good.json()["router"] == {"stage": "cheap", "calls": 1, "accepted": True, "reason": None}
        assert good.headers["x-router-replica"] == a.url and good.headers["x-router-attempts"] == "1"
        assert b.stats()["requests"] == 0

        a.configure(finish_reason="length")  # cut off: not accepted
        b.configure(reply="the answer, carefully")
        escalated = _chat(router)
        assert escalated.headers["x-router-stage"] == "strong" and escalated.headers["x-router-calls"] == "2"
        assert escalated.json()["choices"][0]["message"]["content"] == "the answer, carefully"
        assert b.stats()["models"] == ["strong-m"]
        assert "stream" not in a.stats()["last_body"]  # a stage's answer is judged whole

        # A streaming client gets the chosen stage's answer as a stream.
        with httpx.stream("POST", router.url + "/v1/chat/completions", timeout=30, json={
                "model": "fleet", "stream": True, "messages": [{"role": "user", "content": "x"}]}) as r:
            assert r.headers["x-router-stage"] == "strong"
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and '"the answer, carefully"' in events[0]

        b.configure(reply="nope")  # neither accepted: the last stage's answer, marked so
        last = _chat(router)
        assert last.headers["x-router-accepted"] == "false"
        assert last.json()["router"]["reason"] == "no match for 'answer'"

        a.configure(status=500)  # a failing first stage is one call of the budget
        b.configure(reply="the answer")
        failed_first = _chat(router)
        assert failed_first.status_code == 200 and failed_first.headers["x-router-stage"] == "strong"
    finally:
        router.stop()


def test_escalate_deadline_is_shared(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a, b, _ = a_b_c
    router = _router(tmp_path, _pool("cheap", "cheap-m", [a]) + _pool("strong", "strong-m", [b]),
                     "{default: [cheap], algorithm: {type: escalate, stages: [cheap, strong], deadline_s: 0.5}}")
    try:
        a.configure(delay_s=2.0)
        r = _chat(router)
        assert r.status_code == 504 and "deadline" in r.json()["error"]["message"]
        assert b.stats()["requests"] == 0  # no time was left for the second stage
    finally:
        router.stop()


def test_escalate_a_stalled_stage_is_that_replicas_failure_not_the_deadline(
        tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a, b, _ = a_b_c
    pools = _pool("cheap", "cheap-m", [a], "    timeout_s: 0.5\n") + _pool("strong", "strong-m", [b])
    router = _router(tmp_path, pools,
                     "{default: [cheap], algorithm: {type: escalate, stages: [cheap, strong], deadline_s: 20}}")
    try:
        a.configure(delay_s=3.0)  # silent past its pool's timeout_s, well within the shared deadline
        r = _chat(router)
        assert r.status_code == 200 and r.headers["x-router-stage"] == "strong"
        assert 'router_upstream_errors_total{pool="cheap"} 1.0' in httpx.get(router.url + "/metrics").text
        for proc in (a, b):  # answers that are not completions at all: the replicas' fault, a 502
            proc.configure(delay_s=0.0, raw_body='{"choices": [null]}')
        odd = httpx.post(router.url + "/v1/responses", timeout=30, json={"model": "fleet", "input": "hi"})
        assert odd.status_code == 502 and "not a chat completion" in odd.json()["error"]["message"]
    finally:
        router.stop()


# ---- scheduling ----

def _sched_router(tmp_path: Path, backends: list[HttpProc], extra: str = "") -> HttpProc:
    return _router(tmp_path, _pool("p", "m", backends, extra), "{default: [p]}")


def _until_replicas(router: HttpProc, holds: Callable[[list[dict]], bool]) -> None:  # type: ignore[type-arg]
    """Until the router's own view of its replicas (the explain route: in flight, ready) satisfies `holds`."""
    deadline = time.monotonic() + 10
    while not holds(replicas := _decide(router, "x")["replicas"]):
        assert time.monotonic() < deadline, replicas
        time.sleep(0.02)


def _in_flight(n: int) -> Callable[[list[dict]], bool]:  # type: ignore[type-arg]
    return lambda replicas: sum(r["inflight"] for r in replicas) == n


def test_fewest_outstanding_bytes_then_least_recently_assigned(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a, b, _ = a_b_c
    router = _sched_router(tmp_path, [a, b])
    try:
        # Idle replicas tie: turns alternate, least recently assigned first.
        replicas = [_chat(router).headers["x-router-replica"] for _ in range(4)]
        assert replicas[0] != replicas[1] and replicas[:2] == replicas[2:]
        for proc in (a, b):
            proc.configure(delay_s=1.5)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            big = pool.submit(_chat, router, "x" * 20_000)  # a large prompt: many outstanding bytes
            _until_replicas(router, _in_flight(1))
            small = pool.submit(_chat, router, "y")
            _until_replicas(router, _in_flight(2))
            # Both replicas hold one request; the one holding fewer bytes gets the next.
            third = pool.submit(_chat, router, "z")
            big_on, small_on, third_on = (f.result().headers["x-router-replica"] for f in (big, small, third))
        assert small_on != big_on and third_on == small_on
    finally:
        router.stop()


def test_429_with_retry_after_at_the_cap(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a, b, _ = a_b_c
    router = _sched_router(tmp_path, [a, b], "    max_inflight: 1\n")
    try:
        a.configure(delay_s=2.0)
        b.configure(delay_s=2.0)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            busy = [pool.submit(_chat, router) for _ in range(2)]
            _until_replicas(router, _in_flight(2))
            started = time.monotonic()
            refused = _chat(router)
            waited = time.monotonic() - started
            assert all(f.result().status_code == 200 for f in busy)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["type"] == "rate_limit_error" and "in-flight" in error["message"]
        assert waited < 1.5  # answered at once, not queued behind the 2 s requests
        assert 'router_overloaded_total{pool="p"} 1.0' in httpx.get(router.url + "/metrics").text
    finally:
        router.stop()


def test_retry_of_a_refusal_and_circuit_breaker(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a, b, _ = a_b_c
    # A cool-down long enough that a loaded host still reads the breaker open before it passes.
    router = _sched_router(tmp_path, [a, b], "    breaker: {failures: 2, cooldown_s: 3.0}\n")
    try:
        b.configure(status=503)  # a refusal: b says it did not take the request
        answered = [_chat(router) for _ in range(6)]
        assert all(r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "a:m" for r in answered)
        retried = [r for r in answered if r.headers["x-router-attempts"] == "2"]
        assert len(retried) == 2  # b failed twice, each retried on a; then its breaker opened
        assert b.stats()["requests"] == 2
        state = {r["url"]: r for r in _decide(router, "x")["replicas"]}
        assert state[b.url]["breaker"] == "open" and not state[b.url]["ready"]

        b.configure(status=200)
        deadline = time.monotonic() + 15  # the cool-down passes: one probe request is let through, and it succeeds
        while {r["url"]: r for r in _decide(router, "x")["replicas"]}[b.url]["breaker"] == "open":
            assert time.monotonic() < deadline, "the breaker never left open"
            time.sleep(0.1)
        seen = {_chat(router).headers["x-router-replica"] for _ in range(4)}
        assert b.url in seen
        state = {r["url"]: r for r in _decide(router, "x")["replicas"]}
        assert state[b.url]["breaker"] == "closed"
        assert 'router_retries_total{pool="p"} 2.0' in httpx.get(router.url + "/metrics").text
    finally:
        router.stop()


def test_a_retried_stream_says_where_it_ran(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    """A passed-through stream retried after a refusal (503): its head carries the attempt that answered
    (pool, replica, attempts) and the body is the replica's, whole, byte for byte but for ids and times."""
    a, b, _ = a_b_c
    router = _sched_router(tmp_path, [a, b])
    try:
        b.configure(status=503)
        a.configure(chunks=5, chunk_delay_s=0.01)
        request = {"model": "fleet", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        attempts = set()
        for _ in range(4):
            with httpx.stream("POST", router.url + "/v1/chat/completions", timeout=30, json=request) as r:
                body = r.read().decode()
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                assert r.headers["x-router-pool"] == "p" and r.headers["x-router-replica"] == a.url
                assert r.headers["x-router-entry"] == "fleet"
                attempts.add(r.headers["x-router-attempts"])
            direct = httpx.post(a.url + "/v1/chat/completions", timeout=30, json={**request, "model": "m"}).text
            events = [line for line in body.split("\n") if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            assert "".join(json.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "a:m"
            assert len(body) == len(direct)
        assert "2" in attempts and attempts <= {"1", "2"}  # b was tried first at least once, and refused
    finally:
        router.stop()


class DroppingReplica:
    """A replica on a real socket that answers GET /health and, to a POST, reads the whole request and
    then drops the connection unanswered, as a replica that crashed while running it would."""

    def __init__(self) -> None:
        self.posts = 0
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _handler(self) -> type[socketserver.StreamRequestHandler]:
        replica = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while line := self.rfile.readline():
                    headers = {}
                    while (header := self.rfile.readline()) not in (b"\r\n", b""):
                        name, _, value = header.decode().partition(":")
                        headers[name.strip().lower()] = value.strip()
                    self.rfile.read(int(headers.get("content-length", "0")))
                    if line.startswith(b"POST"):
                        replica.posts += 1
                        return  # the connection closes with the request read and no answer
                    self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json"
                                     b"\r\n\r\n{}")

        return Handler

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_a_request_dropped_after_it_reached_a_replica_is_not_sent_again(tmp_path: Path,
                                                                        a_b_c: list[HttpProc]) -> None:
    dropping, b = DroppingReplica(), a_b_c[1]
    # Neither replica was ever assigned: the tie goes to the first listed, the dropping one.
    router = _router(tmp_path, f"""
  p:
    model: m
    replicas: [{{url: {dropping.url}}}, {{url: {b.url}}}]
    health: {{interval_s: 0.2, timeout_s: 1}}
""", "{default: [p]}")
    try:
        r = _chat(router)
        assert r.status_code == 502, r.text
        error = r.json()["error"]
        assert error["code"] == 502 and "not retried on another replica" in error["message"], error
        assert dropping.url in error["message"]
        assert dropping.posts == 1 and b.stats()["requests"] == 0  # it ran (at most) once, where it was sent
    finally:
        router.stop()
        dropping.stop()


def test_health_checks_take_a_replica_out_and_back(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a, b, _ = a_b_c
    router = _sched_router(tmp_path, [a, b], "    breaker: {failures: 1, cooldown_s: 0.5}\n")
    try:
        b.configure(healthy=False)
        # Two failed checks, 0.2 s apart, take it out.
        _until_replicas(router, lambda replicas: not next(r["ready"] for r in replicas if r["url"] == b.url))
        assert {_chat(router).headers["x-router-replica"] for _ in range(4)} == {a.url}
        b.configure(healthy=True)
        deadline = time.monotonic() + 10
        while b.url not in {_chat(router).headers["x-router-replica"] for _ in range(2)}:
            assert time.monotonic() < deadline, "b never came back"
            time.sleep(0.2)
    finally:
        router.stop()


def test_no_retry_after_bytes_reached_the_client(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    doomed = start_backend(tmp_path, "doomed")
    b = a_b_c[1]
    router = _sched_router(tmp_path, [doomed, b])
    try:
        doomed.configure(chunks=50, chunk_delay_s=0.05)
        # Neither replica was ever assigned: the tie goes to the first listed, the doomed one.
        with httpx.stream("POST", router.url + "/v1/chat/completions", timeout=30, json={
                "model": "fleet", "stream": True, "messages": [{"role": "user", "content": "x"}]}) as r:
            assert r.headers["x-router-replica"] == doomed.url
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            doomed.proc.kill()
            rest = list(lines)
        data = [line for line in rest if line.startswith("data: ")]
        assert "data: [DONE]" not in data and "upstream failed mid-stream" in data[-1]
        assert b.stats()["requests"] == 0  # the broken stream was not retried elsewhere
        # Failures before the first byte are: the dead replica's connection is refused, b answers.
        r = _chat(router)
        assert r.status_code == 200 and r.headers["x-router-replica"] == b.url
    finally:
        router.stop()
        doomed.stop()


def test_streams_pass_through_unbuffered(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a = a_b_c[0]
    router = _sched_router(tmp_path, [a])
    try:
        a.configure(chunks=4, chunk_delay_s=0.5)
        with httpx.stream("POST", router.url + "/v1/completions", timeout=30, json={
                "model": "fleet", "prompt": "x", "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            # The first chunk reached the client while upstream was still producing the rest.
            assert a.stats()["streaming"] == 1
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and a.stats()["streaming"] == 0
    finally:
        router.stop()


def test_client_disconnect_closes_the_upstream_request(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a = a_b_c[0]
    router = _sched_router(tmp_path, [a])
    try:
        a.configure(chunks=100, chunk_delay_s=0.05)
        with httpx.stream("POST", router.url + "/v1/chat/completions", timeout=30, json={
                "model": "fleet", "stream": True, "messages": [{"role": "user", "content": "x"}]}) as r:
            next(r.iter_lines())
        deadline = time.monotonic() + 5
        while a.stats()["disconnected"] < 1:
            assert time.monotonic() < deadline, a.stats()
            time.sleep(0.05)
        assert a.stats()["streaming"] == 0  # it stopped: no chunk was sent to a closed connection
        state = _decide(router, "x")["replicas"][0]
        assert state["inflight"] == 0 and state["outstanding_bytes"] == 0
    finally:
        router.stop()


# ---- cache-aware ----

def test_cache_aware_returns_a_prefix_to_its_replica_and_falls_back_under_imbalance(
        tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    router = _sched_router(tmp_path, a_b_c, """    policy: cache_aware
    cache_aware: {cache_threshold: 0.5, balance_abs: 2, balance_rel: 1.5}
""")
    try:
        prefixes = [f"document {i}: " + f"lorem ipsum {i} " * 200 for i in range(3)]
        homes = [_chat(router, p + "question one").headers["x-router-replica"] for p in prefixes]
        assert len(set(homes)) == 3  # new prefixes go to the replica with the smallest tree
        for _ in range(2):
            again = [_chat(router, p + "another question").headers["x-router-replica"] for p in prefixes]
            assert again == homes

        # Load the first prefix's home with 3 slow requests: max - min in-flight 3 > 2 and 3 > 1.5 x 0.
        home = next(b for b in a_b_c if b.url == homes[0])
        home.configure(delay_s=2.0)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            slow = [pool.submit(_chat, router, prefixes[0] + f"slow {i}") for i in range(3)]
            deadline = time.monotonic() + 5
            while True:  # the router's own count of the home's requests in flight
                state = {r["url"]: r for r in _decide(router, "x")["replicas"]}
                if state[homes[0]]["inflight"] == 3:
                    break
                assert time.monotonic() < deadline, state
                time.sleep(0.05)
            decision = _decide(router, prefixes[0] + "yet another")
            assert decision["replica"] != homes[0] and "imbalance" in decision["reason"]
            [f.result() for f in slow]
    finally:
        router.stop()


# ---- odd upstreams ----

def test_adapters_read_crlf_event_streams(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a = a_b_c[0]
    router = _sched_router(tmp_path, [a])
    try:
        a.configure(newline="\r\n", reply="hello there")
        with httpx.stream("POST", router.url + "/v1/responses", timeout=30,
                          json={"model": "fleet", "input": "hi", "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "hello there"
        with httpx.stream("POST", router.url + "/v1/messages", timeout=30, json={
                "model": "fleet", "max_tokens": 5, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as r:
            kinds = [json.loads(line[6:])["type"] for line in r.iter_lines() if line.startswith("data: ")]
        assert kinds[-1] == "message_stop" and kinds.count("content_block_delta") == 3
    finally:
        router.stop()


def test_an_upstream_answer_of_the_wrong_shape_is_a_502_in_the_apis_shape(
        tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a = a_b_c[0]
    # Each bad answer is a failure of the replica: a breaker at its default of 3 would open midway.
    router = _sched_router(tmp_path, [a], "    breaker: {failures: 10}\n")
    try:
        a.configure(raw_body="[1, 2]")
        messages = httpx.post(router.url + "/v1/messages", timeout=30, json={
            "model": "fleet", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
        assert messages.status_code == 502 and messages.json()["type"] == "error"
        assert "not an object" in messages.json()["error"]["message"]
        responses = httpx.post(router.url + "/v1/responses", timeout=30, json={"model": "fleet", "input": "hi"})
        assert responses.status_code == 502 and responses.json()["error"]["type"] == "upstream_error"
        a.configure(raw_body='{"choices": [null]}')
        odd = httpx.post(router.url + "/v1/responses", timeout=30, json={"model": "fleet", "input": "hi"})
        assert odd.status_code == 502 and "not a chat completion" in odd.json()["error"]["message"]
        with httpx.stream("POST", router.url + "/v1/responses", timeout=30,
                          json={"model": "fleet", "input": "hi", "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
        a.configure(raw_body=None)
        assert _chat(router).status_code == 200  # nothing else was lost
        state = _decide(router, "x")["replicas"][0]
        assert state["consecutive_failures"] == 0 and state["breaker"] == "closed"
        metrics = httpx.get(router.url + "/metrics").text
        assert 'router_requests_total{api="messages",listener="listener-0",status="502"} 1.0' in metrics
        assert 'status="0"' not in metrics  # each answer counted once, under its status
    finally:
        router.stop()


def test_responses_that_keep_breaking_off_open_the_breaker(tmp_path: Path, a_b_c: list[HttpProc]) -> None:
    a, b, _ = a_b_c
    router = _sched_router(tmp_path, [a, b], "    breaker: {failures: 2, cooldown_s: 30}\n")
    try:
        a.configure(raw_body='{"choices": [null]}')  # a head, then an answer that is not one
        shapes = [httpx.post(router.url + "/v1/responses", timeout=30, json={"model": "fleet", "input": "hi"})
                  for _ in range(6)]
        failed = [r for r in shapes if r.status_code == 502]
        assert len(failed) == 2 and all(r.status_code == 200 for r in shapes if r not in failed)
        state = {r["url"]: r for r in _decide(router, "x")["replicas"]}
        assert state[a.url]["breaker"] == "open"  # two bad answers in a row: out, though each had a 200 head
        assert 'router_upstream_errors_total{pool="p"} 2.0' in httpx.get(router.url + "/metrics").text
    finally:
        router.stop()
