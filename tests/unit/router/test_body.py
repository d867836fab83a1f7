"""Request bodies as the router reads them (services/router/listeners/json_body.py, body_workers.py): the
lenient JSON vLLM's clients rely on, and long bodies read in a body worker process, which must reach
upstream and the routing exactly as a short body read on the event loop does."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from services.router.app import OFF_LOOP_BYTES, RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.decision.engine import Router
from services.router.listeners.body_workers import parse
from services.router.listeners.json_body import BodyError, decode_object
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import Answer, request
from tests.support.fake_upstream import FakeUpstream

CONFIG: dict[str, Any] = {"listeners": [{"port": 8080}],
                          "pools": {"p": {"model": "p-m", "replicas": [{"url": "http://a:8000"}]}},
                          "entries": {"fleet": {"default": ["p"],
                                                "signals": [{"name": "needle", "type": "regex",
                                                             "pattern": "needle *$"}],
                                                "decisions": [{"name": "found", "when": "needle", "pools": ["p"]}]}}}


def test_lone_surrogates_become_the_replacement_character() -> None:
    body = decode_object(b'{"model": "m", "messages": [{"role": "user", "content": "cut \\ud83d here \\ud83d\\ude00"}],'
                         b' "\\udc00key": "x"}')
    assert body["messages"][0]["content"] == "cut \ufffd here \U0001F600"  # the pair stays one emoji
    assert body["\ufffdkey"] == "x"


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"temperature": NaN}', "temperature"),
    (b'{"x": {"y": [1, -Infinity]}}', "x.y[1]"),
    (b'{"top_p": 1e400}', "top_p"),
])
def test_a_number_that_is_not_finite_is_a_400_naming_the_field(raw: bytes, param: str) -> None:
    with pytest.raises(BodyError) as caught:
        decode_object(raw)
    assert caught.value.param == param and caught.value.message.startswith(f"{param}: must be a finite number")


def test_invalid_json_is_still_refused_with_msgspecs_reason() -> None:
    with pytest.raises(BodyError, match="not valid JSON: JSON is malformed") as caught:
        decode_object(b'{"a": nope}')
    assert caught.value.param == ""


def test_routes_answer_the_lenient_readings() -> None:
    app = _app()
    try:
        nan = asyncio.run(request(app, "POST", "/v1/chat/completions",
                                  b'{"model": "fleet", "messages": [], "temperature": NaN}'))
        assert nan.status == 400 and nan.json()["error"]["param"] == "temperature"
        cut = asyncio.run(request(app, "POST", "/v1/chat/completions",
                                  b'{"model": "fleet", "messages": [{"role": "user", "content": "a\\ud83d"}]}'))
        assert cut.status == 200
        assert app.relay.dispatcher.upstream.sent[0].body["messages"][0]["content"] == "a\ufffd"  # type: ignore[attr-defined]
    finally:
        app.close()


def _app() -> RouterApp:
    router = Router(parse_config(CONFIG))
    pools = build_pools(router.config)
    return RouterApp(router.config, router, pools, FakeUpstream(), RouterMetrics(pools), body_workers=1)


def _long_bodies() -> dict[str, dict[str, Any]]:
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} ünïcode"} for i in range(9000)]
    many[-1] = {"role": "user", "content": "the needle"}
    return {
        "/v1/chat/completions": {"model": "fleet", "messages": many, "temperature": 0.5, "stream": True},
        "/v1/completions": {"model": "fleet", "prompt": "needle " * 60000, "max_tokens": 3},
        "/v1/responses": {"model": "fleet", "input": [{"role": m["role"], "content": m["content"]} for m in many],
                          "max_output_tokens": 7, "metadata": {"k": "v"}},
        "/v1/messages": {"model": "fleet", "max_tokens": 9, "system": "be brief " * 100,
                         "messages": [{"role": "user", "content": "needle " * 60000}]},
    }


def test_a_long_body_read_in_a_worker_goes_upstream_and_is_routed_as_a_short_one_would_be() -> None:
    app = _app()
    try:
        asyncio.run(request(app, "POST", "/v1/chat/completions", {"model": "fleet", "messages": []}))
        assert not app.bodies.started  # a short body is read on the loop
        for path, body in _long_bodies().items():
            raw = json.dumps(body).encode()
            assert len(raw) > OFF_LOOP_BYTES
            answer: Answer = asyncio.run(request(app, "POST", path, raw))
            assert answer.status == 200, answer.body
            assert app.bodies.started
            assert answer.headers["x-router-decision"] == "found"  # the signals read the whole text
            sent = app.relay.dispatcher.upstream.sent[-1]  # type: ignore[attr-defined]
            assert sent.body == {**parse(_api(path), raw).chat, "model": "p-m"}, path  # as read on the loop
            if path == "/v1/responses":  # the request's echoed fields came back from the worker
                assert answer.json()["metadata"] == {"k": "v"} and answer.json()["max_output_tokens"] == 7
        for path in ("/v1/chat/completions", "/v1/responses"):  # the explain route reads them as they go
            raw = json.dumps(_long_bodies()[path]).encode()
            explained = asyncio.run(request(app, "POST", "/v1/router/explain", raw)).json()
            assert explained["decision"] == "found" and explained["replica"] == "http://a:8000", explained
    finally:
        app.close()


def test_a_long_body_refused_in_a_worker_is_a_400_naming_the_field() -> None:
    app = _app()
    try:
        body = _long_bodies()["/v1/responses"]
        body["input"][3]["role"] = "robot"
        answer = asyncio.run(request(app, "POST", "/v1/responses", json.dumps(body).encode()))
        assert answer.status == 400 and answer.json()["error"]["param"] == "input[3].role"
        nan = json.dumps(_long_bodies()["/v1/chat/completions"]).encode()[:-1] + b', "top_p": NaN}'
        answer = asyncio.run(request(app, "POST", "/v1/chat/completions", nan))
        assert answer.status == 400 and answer.json()["error"]["param"] == "top_p"
    finally:
        app.close()


def _api(path: str) -> str:
    return {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses",
            "/v1/messages": "messages"}[path]
