"""The router's rate limits (listeners/limits.py, buckets.py, usage.py) on a fake clock: the GCRA budget per
tenant and per user, the 429 and its headers, the token charge corrected from usage, idle budgets expired and
memory bounded under a flood of user names, and shared budgets over a store that may be down."""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any, TypeVar

import msgspec
import pytest

from services.router.config import ListenerConfig, RouterConfig
from services.router.config.admission import AdmissionConfig, KeySettings, Limits
from services.router.errors import HTTPError
from services.router.listeners.buckets import LocalBuckets
from services.router.listeners.caller import Caller
from services.router.listeners.limits import (
    DEFAULT_OUTPUT_TOKENS,
    Charge,
    Line,
    RateLimiter,
    duration,
    estimate_tokens,
    remaining,
)
from services.router.listeners.usage import Usage
from services.router.metrics import RouterMetrics
from tests.support.fake_store import FakeStore

T = TypeVar("T")
LISTENER = ListenerConfig("l", 8080, api_keys=("k-a", "k-b"), limits=Limits(requests_per_minute=60),
                          keys={"k-b": KeySettings(tenant="beta", limits=Limits(5, 1000))})
ALPHA = Caller("team-a", "alpha", None, "standard", KeySettings())
BETA = Caller("k-b", "beta", None, "standard", LISTENER.keys["k-b"])
CHAT = {"model": "m", "max_tokens": 100}


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def limiter(listener: ListenerConfig = LISTENER, *, store: FakeStore | None = None, on_store_error: str = "open",
            local: LocalBuckets | None = None) -> tuple[RateLimiter, Clock, RouterMetrics]:
    admission = AdmissionConfig(shared=store is not None, on_store_error=on_store_error)
    config = RouterConfig(listeners=(listener,), pools={}, entries={}, admission=admission)
    clock = Clock()
    metrics = RouterMetrics({})
    return RateLimiter(config, metrics, store, clock=clock, local=local), clock, metrics


def admit(limits: RateLimiter, caller: Caller = ALPHA, chat: dict[str, Any] = CHAT, text: str = "",
          listener: ListenerConfig = LISTENER) -> tuple[Charge | None, dict[str, str]]:
    headers: list[tuple[bytes, bytes]] = []
    ticket = run(limits.admit(listener, caller, chat, text, headers=headers))
    return ticket, {k.decode(): v.decode() for k, v in headers}


def refused(limits: RateLimiter, caller: Caller = ALPHA, chat: dict[str, Any] = CHAT, text: str = "",
            listener: ListenerConfig = LISTENER) -> HTTPError:
    with pytest.raises(HTTPError) as info:
        admit(limits, caller, chat, text, listener)
    return info.value


def headers_of(error: HTTPError) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in error.headers}


def rejections(metrics: RouterMetrics, **labels: str) -> float:
    return sum(s.value for m in metrics.registry.collect() for s in m.samples
               if s.name == "router_limit_rejections_total" and all(s.labels.get(k) == v for k, v in labels.items()))


# ---- the budget ----

def test_a_minutes_requests_may_come_at_once_then_one_per_interval() -> None:
    limits, clock, metrics = limiter()
    for i in range(60):
        _, headers = admit(limits)
        assert headers["x-ratelimit-remaining-requests"] == str(59 - i)
    error = refused(limits)
    assert error.status == 429
    said = headers_of(error)
    assert said["retry-after"] == "1" and said["retry-after-ms"] == "1000"
    assert said["x-ratelimit-limit-requests"] == "60" and said["x-ratelimit-remaining-requests"] == "0"
    assert said["x-ratelimit-reset-requests"] == "1m0s"
    assert "Rate limit reached for tenant 'alpha' on requests per minute: limit 60" in error.message
    assert rejections(metrics, tenant="alpha", kind="requests", level="tenant") == 1
    clock.now += 0.999
    refused(limits)  # a refused request charged nothing: the next fits exactly one interval on
    clock.now += 0.001
    _, headers = admit(limits)
    assert headers["x-ratelimit-remaining-requests"] == "0"
    clock.now += 30
    assert admit(limits)[1]["x-ratelimit-remaining-requests"] == "29"


def test_tenants_have_budgets_of_their_own_and_a_key_its_own_limits() -> None:
    limits, _, _ = limiter()
    for _ in range(5):
        admit(limits, BETA)
    error = refused(limits, BETA)
    assert "tenant 'beta'" in error.message and headers_of(error)["x-ratelimit-limit-requests"] == "5"
    assert admit(limits)[1]["x-ratelimit-remaining-requests"] == "59"  # alpha's is untouched


def test_a_users_budget_is_within_its_tenants() -> None:
    listener = replace(LISTENER, limits=Limits(requests_per_minute=10), user_limits=Limits(requests_per_minute=2))
    limits, _, metrics = limiter(listener)
    ann, bob = replace(ALPHA, user="ann"), replace(ALPHA, user="bob")
    admit(limits, ann, listener=listener)
    _, headers = admit(limits, ann, listener=listener)
    assert headers["x-ratelimit-limit-requests"] == "2" and headers["x-ratelimit-remaining-requests"] == "0"
    error = refused(limits, ann, listener=listener)
    assert "user 'ann' of tenant 'alpha'" in error.message and headers_of(error)["retry-after"] == "30"
    assert rejections(metrics, level="user") == 1
    for _ in range(2):
        admit(limits, bob, listener=listener)
    for _ in range(6):  # the tenant's own requests (no user): 4 + 6 = 10
        admit(limits, listener=listener)
    assert "tenant 'alpha'" in refused(limits, replace(ALPHA, user="cy"), listener=listener).message


def test_no_limit_no_ticket_and_a_listener_without_limits_is_not_even_asked() -> None:
    open_listener = ListenerConfig("o", 8081)
    limits, _, _ = limiter(open_listener)
    assert not limits.applies(open_listener)
    assert limits.applies(LISTENER) is False  # not one of this config's listeners
    limits, _, _ = limiter()
    assert limits.applies(LISTENER)
    unlimited = replace(ALPHA, settings=KeySettings(limits=Limits()))  # a key's `limits: {}`: none
    assert admit(limits, unlimited) == (None, {})


# ---- tokens ----

def test_tokens_are_estimated_from_the_prompt_and_max_tokens() -> None:
    assert estimate_tokens({"max_tokens": 100}, "x" * 400) == 200
    assert estimate_tokens({"max_completion_tokens": 10, "max_tokens": 99, "n": 3}, "") == 30
    assert estimate_tokens({}, "é" * 4) == 2 + DEFAULT_OUTPUT_TOKENS  # UTF-8 bytes / 4
    assert estimate_tokens({"max_tokens": "9", "n": True}, "") == DEFAULT_OUTPUT_TOKENS


def test_tokens_charged_at_admission_are_corrected_by_the_answers_usage() -> None:
    limits, _, _ = limiter()
    ticket, headers = admit(limits, BETA, text="x" * 400)  # 100 + 100
    assert ticket is not None and ticket.tokens == 200 and ticket.usage is not None
    assert headers["x-ratelimit-remaining-tokens"] == "800" and headers["x-ratelimit-limit-tokens"] == "1000"
    ticket.usage.whole({"usage": {"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": 100}})
    limits.settle(ticket, status=200, started=True)
    ticket, headers = admit(limits, BETA, text="x" * 400)
    assert headers["x-ratelimit-remaining-tokens"] == "700"  # 100 used, 200 charged now
    limits.settle(ticket, status=200, started=True)  # no usage seen: the estimate stands
    _, headers = admit(limits, BETA, {"max_tokens": 0})
    assert headers["x-ratelimit-remaining-tokens"] == "700"


def test_usage_above_the_estimate_is_charged_on_top() -> None:
    limits, _, _ = limiter()
    ticket, _ = admit(limits, BETA, {"max_tokens": 10})
    assert ticket is not None and ticket.usage is not None
    ticket.usage.chunk({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 495}})
    limits.settle(ticket, status=200, started=True)
    assert admit(limits, BETA, {"max_tokens": 0})[1]["x-ratelimit-remaining-tokens"] == "500"


def test_a_cached_answer_an_upstream_refusal_and_a_router_refusal_are_given_back() -> None:
    limits, _, _ = limiter()
    for outcome in ({"status": 200, "started": True, "cached": True}, {"status": 400, "started": True}):
        ticket, _ = admit(limits, BETA)
        limits.settle(ticket, **outcome)
    _, headers = admit(limits, BETA, {"max_tokens": 0})
    assert headers["x-ratelimit-remaining-tokens"] == "1000"  # nothing generated
    assert headers["x-ratelimit-remaining-requests"] == "2"  # but each was a request served
    ticket, _ = admit(limits, BETA)
    limits.settle(ticket, status=429, started=False)  # every replica busy: the router refused it
    ticket, headers = admit(limits, BETA, {"max_tokens": 0})
    assert headers["x-ratelimit-remaining-requests"] == "1"
    limits.settle(ticket, status=499, started=False)  # the client left: it counts
    admit(limits, BETA, {"max_tokens": 0})
    assert "requests per minute" in refused(limits, BETA).message


def test_a_request_larger_than_a_minutes_tokens_is_refused_for_good() -> None:
    limits, _, metrics = limiter()
    error = refused(limits, BETA, {"max_tokens": 2000})
    assert error.status == 429 and headers_of(error) == {"x-should-retry": "false"}
    assert "Request too large for the tokens per minute of tenant 'beta': limit 1000, requested 2000" in error.message
    assert rejections(metrics, tenant="beta", kind="tokens") == 1
    assert admit(limits, BETA)[1]["x-ratelimit-remaining-requests"] == "4"  # nothing was charged


def test_over_the_tokens_the_retry_after_is_when_the_request_fits() -> None:
    limits, clock, _ = limiter()
    admit(limits, BETA, {"max_tokens": 900})
    error = refused(limits, BETA, {"max_tokens": 200})  # 100 left: 100 more come in 6 s
    said = headers_of(error)
    assert said["retry-after"] == "6" and said["retry-after-ms"] == "6000"
    assert said["x-ratelimit-remaining-tokens"] == "100" and said["x-ratelimit-reset-tokens"] == "54s"
    assert said["x-ratelimit-remaining-requests"] == "4"  # the refused request gave its own back
    clock.now += 6
    admit(limits, BETA, {"max_tokens": 200})


# ---- headers ----

@pytest.mark.parametrize(("seconds", "said"), [
    (0, "0s"), (-1, "0s"), (0.012, "12ms"), (0.0001, "1ms"), (1, "1s"), (1.5, "1.5s"), (17.28, "17.28s"),
    (59.9999, "1m0s"), (60, "1m0s"), (360, "6m0s"), (3723.5, "1h2m3.5s"), (7200, "2h0m0s")])
def test_durations_are_written_as_openai_writes_them(seconds: float, said: str) -> None:
    assert duration(seconds) == said


def test_where_tenant_and_user_both_count_the_headers_tell_the_tighter() -> None:
    listener = replace(LISTENER, limits=Limits(requests_per_minute=100), user_limits=Limits(requests_per_minute=3))
    limits, _, _ = limiter(listener)
    _, headers = admit(limits, replace(ALPHA, user="ann"), listener=listener)
    assert headers == {"x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "2",
                       "x-ratelimit-reset-requests": "20s"}
    assert re.fullmatch(r"\d+", headers["x-ratelimit-remaining-requests"])


# ---- memory ----

def test_idle_budgets_expire_and_a_flood_of_user_names_is_bounded() -> None:
    buckets = LocalBuckets(max_names=1000)
    listener = replace(LISTENER, limits=Limits(), user_limits=Limits(requests_per_minute=10))
    limits, clock, _ = limiter(listener, local=buckets)
    for i in range(5000):
        admit(limits, replace(ALPHA, user=f"u{i}"), listener=listener)
    assert len(buckets) == 1000  # the least recently used went
    clock.now += 6.0001  # a user's one request is spent after 6 s: every budget is full again
    admit(limits, replace(ALPHA, user="late"), listener=listener)
    assert len(buckets) == 1


def test_a_budget_evicted_under_the_flood_starts_full_again() -> None:
    buckets = LocalBuckets(max_names=2)
    listener = replace(LISTENER, limits=Limits(), user_limits=Limits(requests_per_minute=1))
    limits, _, _ = limiter(listener, local=buckets)
    ann = replace(ALPHA, user="ann")
    admit(limits, ann, listener=listener)
    refused(limits, ann, listener=listener)
    admit(limits, replace(ALPHA, user="bob"), listener=listener)
    admit(limits, replace(ALPHA, user="cy"), listener=listener)
    admit(limits, ann, listener=listener)  # what the cap costs: ann was forgotten


# ---- shared ----

def test_shared_budgets_are_counted_in_the_store() -> None:
    store = FakeStore()
    limits, clock, _ = limiter(store=store)
    other, other_clock, _ = limiter(store=store)  # a second router on the same store
    other_clock.now = clock.now
    for i in range(5):
        admit(other if i % 2 else limits, BETA)
    assert "requests per minute" in refused(other, BETA).message  # 5 of 5, whichever router counted
    assert len(limits.local) == 0


def test_a_shared_tickets_correction_goes_to_the_store() -> None:
    store = FakeStore()
    limits, _, _ = limiter(store=store)

    async def go() -> None:
        ticket = await limits.admit(LISTENER, BETA, {"max_tokens": 500}, "")
        assert ticket is not None and ticket.shared and ticket.usage is not None
        ticket.usage.whole({"usage": {"total_tokens": 100}})
        limits.settle(ticket, status=200, started=True)
        await asyncio.gather(*limits._settling)
        headers: list[tuple[bytes, bytes]] = []
        await limits.admit(LISTENER, BETA, {"max_tokens": 0}, "", headers=headers)
        assert (b"x-ratelimit-remaining-tokens", b"900") in headers

    run(go())


def test_the_store_down_fails_open_counting_here_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    store = FakeStore()
    limits, _, metrics = limiter(store=store)
    store.fail = True
    with caplog.at_level(logging.WARNING, "router"):
        for _ in range(5):
            ticket, headers = admit(limits, BETA)
            assert ticket is not None and not ticket.shared
        assert "requests per minute" in refused(limits, BETA).message  # counted here meanwhile
        store.fail = False
        ticket, _ = admit(limits, BETA, {"max_tokens": 0})
        assert ticket is not None and ticket.shared  # the store again: its budget, untouched by the outage
    said = [r.getMessage() for r in caplog.records]
    assert sum("does not answer" in m for m in said) == 1 and sum("answers again" in m for m in said) == 1
    assert sum(s.value for m in metrics.registry.collect() for s in m.samples
               if s.name == "router_limit_store_errors_total") == 6


def test_the_store_down_fails_closed_with_a_503() -> None:
    store = FakeStore()
    limits, _, _ = limiter(store=store, on_store_error="closed")
    store.fail = True
    error = refused(limits, BETA)
    assert error.status == 503 and "admission.on_store_error is closed" in error.message


# ---- usage ----

def test_usage_is_read_from_bodies_streams_and_chunks() -> None:
    body = Usage()
    body.body(b'{"id": "x", "choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 3, '
              b'"completion_tokens": 4, "total_tokens": 7}}')
    assert body.tokens == 7
    responses = Usage()
    responses.whole({"usage": {"input_tokens": 2, "output_tokens": 5}})
    assert responses.tokens == 7
    stream = Usage(streamed_usage=True)
    events = (b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
              b'data: {"choices": [], "usage": {"total_tokens": 42}}\n\ndata: [DONE]\n\n')
    for i in range(0, len(events), 7):  # split anywhere, even inside an event
        stream.raw(events[i:i + 7])
    assert stream.tokens == 42
    unasked = Usage()
    unasked.raw(events)
    assert unasked.tokens is None
    bad = Usage()
    bad.body(b"[1, 2]")
    bad.body(msgspec.json.encode({"usage": {"total_tokens": -1}}))
    bad.whole({"usage": "many"})
    assert bad.tokens is None


def test_remaining_is_not_cut_by_a_store_clocks_microsecond_rounding() -> None:
    """The shared clocks are whole microseconds: a first request of a 4-per-minute budget leaves 3, whether
    the store rounded the clock up or down (the header said 2 when it came back a fraction of a µs ahead)."""
    line = Line("requests:tenant:t", "requests", "tenant", 4, "tenant 't'")
    now = 1_796_280_000.1234567
    for rounding in (-0.9e-6, 0.0, 0.9e-6):
        assert remaining(line, now + 15 + rounding, now) == 3
    assert remaining(line, now + 15 + 2e-6, now) == 2  # beyond the rounding, a real part of a request
