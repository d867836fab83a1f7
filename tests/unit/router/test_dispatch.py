"""Dispatch (services/router/backends/dispatch.py), in process through the router's ASGI app, with the replicas
replaced by a fake of the Upstream port: what the client sees, which replica was called, and what the
lease left on the replica (load, failures, breaker)."""
from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from services.router.app import RouterApp
from services.router.backends.pool import Lease, build_pools
from services.router.config import parse_config
from services.router.decision.engine import Router
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import Answer, request
from tests.support.fake_upstream import FakeUpstream, Reply, chunk_events, completion

T = TypeVar("T")
A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"
HI = [{"role": "user", "content": "hi"}]
SSE = "text/event-stream"
CONFIG: dict[str, Any] = {
    "listeners": [{"port": 8080}],
    "pools": {"p": {"model": "p-m", "replicas": [{"url": A}, {"url": B}], "api_key": "up-key", "timeout_s": 30,
                    "breaker": {"failures": 2, "cooldown_s": 60}},
              "q": {"model": "q-m", "replicas": [{"url": C}]}},
    "entries": {"fleet": {"default": ["p"]}, "spill": {"default": ["p", "q"]}},
}


class Fleet:
    """A RouterApp over the fake upstream, and the router state a test looks at afterwards."""

    def __init__(self, **pool_p: Any) -> None:
        config = copy.deepcopy(CONFIG)
        config["pools"]["p"].update(pool_p)
        self.router = Router(parse_config(config), rng=random.Random(1))
        self.pools = build_pools(self.router.config)
        self.upstream = FakeUpstream()
        self.metrics = RouterMetrics(self.pools)
        self.app = RouterApp(self.router.config, self.router, self.pools, self.upstream, self.metrics)

    def post(self, path: str, body: Any, **kw: Any) -> Answer:
        return run(request(self.app, "POST", path, body, **kw))

    def chat(self, model: str = "fleet", *, leave_after_chunks: int | None = None, **extra: Any) -> Answer:
        return self.post("/v1/chat/completions", {"model": model, "messages": HI, **extra},
                         leave_after_chunks=leave_after_chunks)

    def replica(self, url: str, pool: str = "p") -> dict[str, Any]:
        return next(r for r in self.pools[pool].snapshot() if r["url"] == url)

    def count(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_a_chat_answer_passes_through_as_upstream_sent_it() -> None:
    fleet = Fleet()
    body = completion("hello there")
    fleet.upstream.answer(A, Reply(chunks=(body[:20], body[20:])))
    r = fleet.chat(temperature=0.5)
    assert r.status == 200 and r.body == body
    assert r.headers["content-type"] == "application/json" and r.headers["content-length"] == str(len(body))
    assert {k: v for k, v in r.headers.items() if k.startswith("x-router-")} == {
        "x-router-entry": "fleet", "x-router-decision": "default", "x-router-pool": "p", "x-router-replica": A,
        "x-router-attempts": "1"}
    [sent] = fleet.upstream.sent
    assert (sent.url, sent.path, sent.api_key, sent.timeout_s) == (A, "/v1/chat/completions", "up-key", 30.0)
    assert sent.body == {"model": "p-m", "messages": HI, "temperature": 0.5}  # the pool's model name upstream
    assert fleet.upstream.responses[0].closed
    assert fleet.replica(A)["inflight"] == 0 and fleet.replica(A)["outstanding_bytes"] == 0
    assert fleet.count("router_requests_total", listener="listener-0", api="chat", status="200") == 1


def test_a_stream_passes_through_piece_by_piece() -> None:
    fleet = Fleet()
    events = chunk_events(["Hel", "lo"])
    fleet.upstream.answer(A, Reply(chunks=events, content_type=SSE))
    r = fleet.post("/v1/completions", {"model": "fleet", "prompt": "x", "stream": True})
    assert r.status == 200 and r.headers["content-type"] == SSE
    pieces = [m["body"] for m in r.messages if m["type"] == "http.response.body"]
    assert pieces == [*events, b""]  # each piece sent as it came, then the end
    assert fleet.upstream.sent[0].path == "/v1/completions"


def test_a_streams_last_piece_goes_out_with_the_end_when_upstreams_end_came_with_it() -> None:
    fleet = Fleet()
    events = chunk_events(["Hel", "lo"])
    fleet.upstream.answer(A, Reply(chunks=events, content_type=SSE, ends_with_last=True))
    r = fleet.post("/v1/completions", {"model": "fleet", "prompt": "x", "stream": True})
    bodies = [m for m in r.messages if m["type"] == "http.response.body"]
    assert [m["body"] for m in bodies] == list(events)  # no empty message of its own for the end
    assert [m["more_body"] for m in bodies] == [True] * (len(events) - 1) + [False]


@pytest.mark.parametrize("refusal", ["connection refused", "HTTP 503: not ready", "HTTP 429: busy"])
def test_a_request_that_never_reached_a_replica_or_was_refused_is_retried_on_another(refusal: str) -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, Reply(refuse=refusal))
    r = fleet.chat()
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == f"from {B}"
    assert r.headers["x-router-replica"] == B and r.headers["x-router-attempts"] == "2"
    assert fleet.upstream.urls() == [A, B]
    assert fleet.replica(A)["consecutive_failures"] == 1 and fleet.replica(B)["consecutive_failures"] == 0
    assert fleet.count("router_retries_total", pool="p") == 1
    assert fleet.count("router_upstream_errors_total", pool="p") == 1


@pytest.mark.parametrize("failure", ["HTTP 500: boom", "ServerDisconnectedError: Server disconnected"])
def test_a_request_that_may_have_run_on_a_replica_is_not_sent_to_another(failure: str) -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, Reply(refuse=failure, retryable=False))
    r = fleet.chat(model="spill")  # not to the plan's next pool either
    assert r.status == 502 and r.json()["error"]["code"] == 502
    assert r.json()["error"]["message"] == (f"pool 'p': {A}: {failure}; not retried on another replica, as the "
                                            "request may have reached this one")
    assert fleet.upstream.urls() == [A]
    assert fleet.replica(A)["consecutive_failures"] == 1 and fleet.replica(A)["inflight"] == 0
    assert fleet.count("router_retries_total", pool="p") == 0
    assert fleet.count("router_upstream_errors_total", pool="p") == 1


def test_an_upstream_refusing_the_pools_api_key_is_a_502_naming_it_logged_once_per_change(
        caplog: pytest.LogCaptureFixture) -> None:
    fleet = Fleet()
    refusal = json.dumps({"error": {"message": "Incorrect API key provided.", "code": 401}}).encode()
    for url in (A, B):
        fleet.upstream.answer(url, Reply(status=401, chunks=(refusal,)))
    with caplog.at_level(logging.WARNING, logger="router"):
        answers = [fleet.chat() for _ in range(3)]
    for r in answers:
        assert r.status == 502, r.body  # the client's key was good: never the replica's 401
        error = r.json()["error"]
        assert error["type"] == "upstream_error" and error["code"] == 502
        assert "refused the pool's api_key (HTTP 401: " in error["message"]
        assert "check pools.p.api_key" in error["message"]
    messages = fleet.post("/v1/messages", {"model": "fleet", "max_tokens": 5, "messages": HI})
    assert messages.status == 502 and messages.json()["error"]["type"] == "api_error"
    refused = [rec.getMessage() for rec in caplog.records if "refuses the pool's api_key" in rec.getMessage()]
    assert len(refused) == 2 and {A, B} == {url for url in (A, B) for m in refused if url in m}
    assert all(response.closed for response in fleet.upstream.responses)
    # A config error, not a failing replica: the breaker stays closed, and nothing is left in flight.
    assert fleet.replica(A)["breaker"] == "closed" and fleet.replica(A)["inflight"] == 0
    caplog.clear()
    fleet.upstream.answer(A, Reply(chunks=(completion("ok"),)))
    fleet.upstream.answer(B, Reply(chunks=(completion("ok"),)))
    with caplog.at_level(logging.WARNING, logger="router"):
        assert fleet.chat().status == 200
    assert [rec.getMessage() for rec in caplog.records] == [f"pool p: replica {A} accepts the pool's api_key again"]


def test_repeated_failures_open_the_breaker_and_the_replica_is_left_out() -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, Reply(refuse="connection refused"))
    assert [fleet.chat().headers["x-router-replica"] for _ in range(3)] == [B, B, B]
    assert fleet.upstream.urls() == [A, B, A, B, B]  # the breaker opened after A's second failure
    assert fleet.replica(A)["breaker"] == "open" and not fleet.replica(A)["ready"]


def test_every_replica_failing_is_a_502() -> None:
    fleet = Fleet()
    for url in (A, B):
        fleet.upstream.answer(url, Reply(refuse="HTTP 503: busy"))
    r = fleet.chat()
    assert r.status == 502 and r.json()["error"]["type"] == "upstream_error"
    assert "every replica tried failed" in r.json()["error"]["message"]
    assert fleet.count("router_requests_total", listener="listener-0", api="chat", status="502") == 1


def test_no_retry_once_bytes_reached_the_client() -> None:
    fleet = Fleet()
    events = chunk_events(["a", "b", "c"])
    fleet.upstream.answer(A, Reply(chunks=events, content_type=SSE, break_after=1))
    r = fleet.chat(stream=True)
    assert r.status == 200
    assert r.body.startswith(events[0]) and "[DONE]" not in r.events()
    assert r.events()[-1] == {"error": {"message": "upstream failed mid-stream: ClientPayloadError",
                                        "type": "upstream_error", "code": 502}}
    assert fleet.upstream.urls() == [A]  # not retried: the client had the first bytes
    assert fleet.replica(A)["consecutive_failures"] == 1
    assert fleet.count("router_upstream_errors_total", pool="p") == 1


def test_every_replica_at_its_cap_is_a_429_at_once() -> None:
    fleet = Fleet(max_inflight=1)
    held = [fleet.pools["p"].acquire(10) for _ in range(2)]
    r = fleet.chat()
    assert r.status == 429 and r.headers["retry-after"] == "1" and r.headers["x-router-entry"] == "fleet"
    error = r.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == 429 and "in-flight" in error["message"]
    assert fleet.upstream.sent == []
    assert fleet.count("router_overloaded_total", pool="p") == 1
    for lease in held:
        assert isinstance(lease, Lease)
        lease.release(True)


def test_a_full_pool_passes_the_request_to_the_next_candidate() -> None:
    fleet = Fleet(max_inflight=1)
    held = [fleet.pools["p"].acquire(10) for _ in range(2)]
    r = fleet.chat(model="spill")
    assert r.status == 200 and r.headers["x-router-pool"] == "q" and r.headers["x-router-replica"] == C
    assert fleet.upstream.sent[0].body["model"] == "q-m"
    assert fleet.count("router_overloaded_total", pool="p") == 0
    for lease in held:
        assert isinstance(lease, Lease)
        lease.release(True)


def test_no_ready_replica_is_a_503() -> None:
    fleet = Fleet()
    pool = fleet.pools["p"]
    for replica in pool.replicas:
        for _ in range(2):  # health.failures defaults to 2
            pool.record_health(replica, False, detail="HTTP 500")
    r = fleet.chat()
    assert r.status == 503 and r.json()["error"]["code"] == 503
    assert "unhealthy (HTTP 500)" in r.json()["error"]["message"] and fleet.upstream.sent == []


def test_an_upstream_refusal_is_passed_on_in_the_apis_shape() -> None:
    fleet = Fleet()
    refusal = json.dumps({"error": {"message": "max_tokens is too large", "type": "BadRequestError",
                                    "param": "max_tokens", "code": 400}}).encode()
    fleet.upstream.answer(A, Reply(status=400, chunks=(refusal,)))
    fleet.upstream.answer(B, Reply(status=400, chunks=(refusal,)))
    chat = fleet.chat()
    assert chat.status == 400 and chat.body == refusal and chat.headers["content-type"] == "application/json"
    messages = fleet.post("/v1/messages", {"model": "fleet", "max_tokens": 5, "messages": HI})
    assert messages.status == 400
    assert messages.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                          "message": "max_tokens is too large"}}
    assert fleet.replica(A)["consecutive_failures"] == fleet.replica(B)["consecutive_failures"] == 0


def test_a_responses_request_gets_a_response_object() -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, Reply(chunks=(completion("fine, thanks", "length"),)))
    r = fleet.post("/v1/responses", {"model": "fleet", "input": "hi", "max_output_tokens": 4})
    body = r.json()
    assert r.status == 200 and body["object"] == "response" and body["status"] == "incomplete"
    assert body["output"][0]["content"][0]["text"] == "fine, thanks" and body["usage"]["output_tokens"] == 2
    sent = fleet.upstream.sent[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.body == {"model": "p-m", "messages": HI, "max_tokens": 4}


def test_a_messages_stream_is_translated_as_it_arrives() -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, Reply(chunks=chunk_events(["Hel", "lo"]), content_type=SSE))
    r = fleet.post("/v1/messages", {"model": "fleet", "max_tokens": 5, "stream": True, "messages": HI})
    assert r.status == 200 and r.headers["content-type"] == SSE and r.headers["cache-control"] == "no-cache"
    events = r.events()
    assert [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"] == ["Hel", "lo"]
    assert events[-1] == {"type": "message_stop"}
    assert fleet.upstream.sent[0].body["stream_options"] == {"include_usage": True}
    assert fleet.replica(A)["consecutive_failures"] == 0


def test_an_adapted_stream_that_ends_early_ends_with_an_error_event() -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, Reply(chunks=chunk_events(["Hel"], done=False), content_type=SSE))
    r = fleet.post("/v1/messages", {"model": "fleet", "max_tokens": 5, "stream": True, "messages": HI})
    assert r.status == 200
    assert r.events()[-1] == {"type": "error", "error": {"type": "api_error",
                                                         "message": "upstream ended the stream early"}}
    assert fleet.replica(A)["consecutive_failures"] == 1  # a stream that broke off is the replica's failure


def test_an_answer_of_the_wrong_shape_is_a_502_in_the_apis_shape() -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, Reply(chunks=(b"[1, 2]",)))
    r = fleet.post("/v1/messages", {"model": "fleet", "max_tokens": 5, "messages": HI})
    assert r.status == 502 and r.json()["type"] == "error" and "not an object" in r.json()["error"]["message"]
    assert fleet.replica(A)["consecutive_failures"] == 1
    assert fleet.count("router_requests_total", listener="listener-0", api="messages", status="502") == 1


def test_a_client_that_leaves_closes_the_upstream_response_and_blames_no_one() -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, Reply(chunks=chunk_events(["a", "b"]), content_type=SSE, stall_after=1))
    r = fleet.chat(stream=True, leave_after_chunks=1)
    assert r.status == 200
    response = fleet.upstream.responses[0]
    assert response.closed and not response.drained  # closing it unread aborts the request upstream
    assert fleet.replica(A)["inflight"] == 0 and fleet.replica(A)["consecutive_failures"] == 0
    assert fleet.count("router_requests_total", listener="listener-0", api="chat", status="499") == 1
