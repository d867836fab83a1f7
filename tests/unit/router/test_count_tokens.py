"""Anthropic's POST /v1/messages/count_tokens (services/router/listeners/codecs/anthropic_count.py): the
Messages request as the chat form of a replica's POST /tokenize, in process through the router's ASGI
app against a fake of the Upstream port; the count back in Anthropic's shape, errors in it too."""
from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.decision.engine import Router
from services.router.listeners.codecs.anthropic_count import count_to_tokenize
from services.router.listeners.codecs.codec import CodecError
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import Answer, request
from tests.support.fake_upstream import FakeUpstream, Reply

A, B = "http://a:8000", "http://b:8000"
HI = [{"role": "user", "content": "hi"}]
TOOL = {"name": "lookup", "description": "Look it up", "input_schema": {"type": "object"}}
CONFIG: dict[str, Any] = {
    "listeners": [{"port": 8080}, {"port": 8081, "name": "chat-only", "apis": ["chat"]}],
    "pools": {"p": {"model": "p-m", "replicas": [{"url": A}]}, "q": {"model": "q-m", "replicas": [{"url": B}]}},
    "entries": {"fleet": {"default": ["p"]},
                "tiered": {"default": ["p"], "algorithm": {"type": "escalate", "stages": ["p", "q"],
                                                           "accept": {"min_chars": 10**6}}}},
}


def tokenized(count: int) -> Reply:
    return Reply(chunks=(json.dumps({"count": count, "max_model_len": 4096, "tokens": list(range(count)),
                                     "token_strs": None}).encode(),))


class Fleet:
    def __init__(self) -> None:
        self.router = Router(parse_config(CONFIG), rng=random.Random(1))
        self.upstream = FakeUpstream()
        pools = build_pools(self.router.config)
        self.app = RouterApp(self.router.config, self.router, pools, self.upstream, RouterMetrics(pools))

    def count(self, body: Any, port: int = 8080) -> Answer:
        return asyncio.run(request(self.app, "POST", "/v1/messages/count_tokens", body, port=port))


def test_the_count_is_the_replica_s_tokenize_count_of_the_chat_form() -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, tokenized(42))
    answer = fleet.count({"model": "fleet", "system": "Be brief.", "messages": HI, "tools": [TOOL],
                          "tool_choice": {"type": "auto"}, "thinking": {"type": "enabled", "budget_tokens": 2048}})
    assert answer.status == 200 and answer.json() == {"input_tokens": 42}
    assert answer.headers["x-router-pool"] == "p" and answer.headers["x-router-replica"] == A
    [sent] = fleet.upstream.sent
    assert sent.path == "/tokenize"
    assert sent.body == {"model": "p-m", "messages": [{"role": "system", "content": "Be brief."}, *HI],
                         "tools": [{"type": "function", "function": {"name": "lookup", "description": "Look it up",
                                                                     "parameters": {"type": "object"}}}],
                         "chat_template_kwargs": {"enable_thinking": True}}


def test_a_prefill_is_counted_as_the_messages_route_renders_it() -> None:
    body = count_to_tokenize({"model": "fleet", "messages": [*HI, {"role": "assistant", "content": "Sure"}]})
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def test_max_tokens_and_stream_are_no_count_tokens_fields() -> None:
    assert count_to_tokenize({"model": "fleet", "messages": HI, "max_tokens": "x", "stream": "x"}) == {
        "model": "fleet", "messages": HI}


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": HI}, "model"),
    ({"model": "fleet"}, "messages"),
    ({"model": "fleet", "messages": []}, "messages"),
    ({"model": "fleet", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"model": "fleet", "messages": HI, "tools": [{"name": "t"}]}, "tools[0].input_schema"),
    ({"model": "fleet", "messages": HI, "thinking": {"type": "enabled", "budget_tokens": 5}},
     "thinking.budget_tokens"),
    ({"model": "fleet", "messages": HI, "tool_choice": {"type": "any"}}, "tool_choice"),
])
def test_bad_input_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(CodecError) as info:
        count_to_tokenize(body)
    assert info.value.param == param
    answer = Fleet().count(body)
    assert answer.status == 400
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(param)


def test_errors_are_anthropic_s_shape() -> None:
    fleet = Fleet()
    unknown = fleet.count({"model": "nope", "messages": HI})
    assert unknown.status == 404 and unknown.json()["error"]["type"] == "not_found_error"
    fleet.upstream.answer(A, Reply(status=404, chunks=(b'{"error": {"message": "Not Found"}}',)))
    missing = fleet.count({"model": "fleet", "messages": HI})
    assert missing.status == 404 and "POST /tokenize" in missing.json()["error"]["message"]
    fleet.upstream.answer(A, Reply(chunks=(b'{"count": "many"}',)))
    assert fleet.count({"model": "fleet", "messages": HI}).status == 502  # the replica's fault


def test_served_where_messages_is() -> None:
    answer = Fleet().count({"model": "fleet", "messages": HI}, port=8081)
    assert answer.status == 404 and "count_tokens" in answer.body.decode()


def test_an_escalate_entry_counts_on_its_first_stage_unjudged() -> None:
    fleet = Fleet()
    fleet.upstream.answer(A, tokenized(9))
    answer = fleet.count({"model": "tiered", "messages": HI})
    assert answer.status == 200 and answer.json() == {"input_tokens": 9}
    assert fleet.upstream.urls() == [A]  # no second stage: a count is no answer to judge
