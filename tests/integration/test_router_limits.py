"""Rate limits through a real router process in front of the OpenAI test backend, seen by the openai and
anthropic SDKs: the 429 and its headers (RateLimitError), Retry-After honoured by the SDK's retry, the
headers on admitted answers, and a token charge corrected from the answer's usage (whole, passed-through
stream, translated stream)."""
from __future__ import annotations

import re
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import HttpProc, start_router

CONFIG = """
listeners:
  - port: {{port}}
    host: 127.0.0.1
    api_keys: [k-req, k-tok, k-retry, k-msg, k-free]
    limits: {{requests_per_minute: 1000}}
    keys:
      - {{key: k-req, tenant: req, limits: {{requests_per_minute: 2}}}}
      - {{key: k-tok, tenant: tok, limits: {{tokens_per_minute: 10000}}}}
      - {{key: k-retry, tenant: retry, limits: {{requests_per_minute: 30}}}}
      - {{key: k-msg, tenant: msg, limits: {{requests_per_minute: 1}}}}
      - {{key: k-free, tenant: free, limits: {{}}}}
pools:
  chat: {{model: tiny, replicas: [{{url: "{backend}"}}]}}
entries:
  m: {{default: [chat]}}
"""
DURATION = re.compile(r"(\d+h)?(\d+m)?\d+(\.\d+)?s|\d+ms")


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, backend: HttpProc) -> Iterator[HttpProc]:
    proc = start_router(tmp_path_factory.mktemp("router"), CONFIG.format(backend=backend.url))
    yield proc
    proc.stop()


def _client(router: HttpProc, key: str, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=router.url + "/v1", max_retries=retries, timeout=30)


def _metric(router: HttpProc, name: str, labels: dict[str, str]) -> float:
    text = httpx.get(router.url + "/metrics", headers={"authorization": "Bearer k-free"}, timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def test_over_the_limit_the_sdk_gets_a_rate_limit_error_with_openais_headers(router: HttpProc) -> None:
    with _client(router, "k-req") as client:
        said = []
        for _ in range(2):
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "hi"}])
            said.append(raw.headers)
        assert [h["x-ratelimit-limit-requests"] for h in said] == ["2", "2"]
        assert [h["x-ratelimit-remaining-requests"] for h in said] == ["1", "0"]
        assert all(DURATION.fullmatch(h["x-ratelimit-reset-requests"]) for h in said)
        assert "x-ratelimit-limit-tokens" not in said[0]  # no token limit set: no token headers
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    error = info.value
    headers = error.response.headers
    assert 28 <= int(headers["retry-after"]) <= 30 and int(headers["retry-after-ms"]) <= 30_000
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert DURATION.fullmatch(headers["x-ratelimit-reset-requests"])
    assert isinstance(error.body, dict) and error.body["type"] == "rate_limit_error"
    assert "Rate limit reached for tenant 'req' on requests per minute: limit 2" in error.body["message"]
    assert _metric(router, "router_limit_rejections_total", {"tenant": "req", "kind": "requests"}) == 1
    assert _metric(router, "router_requests_total", {"api": "chat", "status": "429"}) >= 1


def test_the_sdk_waits_as_retry_after_says_and_then_gets_its_answer(router: HttpProc) -> None:
    with httpx.Client(base_url=router.url, headers={"authorization": "Bearer k-retry"}, timeout=30) as http:
        for _ in range(100):  # the burst: a minute's 30 at once
            r = http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
            if r.status_code == 429:
                break
        assert r.status_code == 429 and r.headers["retry-after-ms"]
    with _client(router, "k-retry", retries=3) as client:
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert answer.choices[0].message.content == "a:tiny"
    # The SDK's own first try was refused too (a slot opens every 2 s), then it waited and was admitted.
    assert _metric(router, "router_limit_rejections_total", {"tenant": "retry"}) >= 2


def test_tokens_charged_at_admission_are_corrected_by_usage_in_every_form_of_answer(router: HttpProc) -> None:
    """10,000 tokens a minute, each request asking up to 4,000: without the correction from usage (the backend
    reports ~10), the second request would leave under 2,000."""
    def remaining(headers: httpx.Headers) -> int:
        assert headers["x-ratelimit-limit-tokens"] == "10000"
        return int(headers["x-ratelimit-remaining-tokens"])

    with _client(router, "k-tok") as client:
        ask = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4000}
        first = client.chat.completions.with_raw_response.create(**ask)  # type: ignore[call-overload]
        assert 5900 <= remaining(first.headers) < 6000
        with client.chat.completions.with_streaming_response.create(  # type: ignore[call-overload]
                **ask, stream=True, stream_options={"include_usage": True}) as streamed:
            assert remaining(streamed.headers) > 5000
            assert "data: [DONE]" in streamed.read().decode()
        with client.responses.with_streaming_response.create(
                model="m", input="hello", max_output_tokens=4000, stream=True) as translated:
            assert remaining(translated.headers) > 5000
            translated.read()
        last = client.chat.completions.with_raw_response.create(**ask)  # type: ignore[call-overload]
        assert remaining(last.headers) > 5000


def test_the_messages_api_refuses_in_anthropics_shape(router: HttpProc) -> None:
    with anthropic.Anthropic(api_key="k-msg", base_url=router.url, max_retries=0, timeout=30) as client:
        ask = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        client.messages.create(**ask)  # type: ignore[call-overload]
        with pytest.raises(anthropic.RateLimitError) as info:
            client.messages.create(**ask)  # type: ignore[call-overload]
    error = info.value
    assert error.body == {"type": "error", "error": {"type": "rate_limit_error", "message": error.body["error"][  # type: ignore[index]
        "message"]}}
    assert "tenant 'msg' on requests per minute" in error.message
    assert int(error.response.headers["retry-after"]) >= 59


def test_a_key_without_limits_gets_no_rate_limit_headers(router: HttpProc) -> None:
    r = httpx.post(router.url + "/v1/chat/completions", headers={"authorization": "Bearer k-free"}, timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and not any(h.startswith("x-ratelimit") for h in r.headers)
