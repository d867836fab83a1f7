"""Escalate (services/router/listeners/escalate.py): its pure parts (the verdict on an answer, the replay of a
whole answer as chunks), and the stages called in process through the router's ASGI app against a
fake of the Upstream port: which stage answered, what the client was told, and the replicas' outcomes."""
from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Coroutine
from typing import Any, TypeVar

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.decision.algorithms import verdict
from services.router.decision.engine import Router
from services.router.listeners.codecs.openai import as_chunks
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import Answer, request
from tests.support.fake_upstream import FakeUpstream, Reply, completion

T = TypeVar("T")
X, Y = "http://cheap:8000", "http://strong:8000"
HI = [{"role": "user", "content": "hi"}]
ACCEPT = {"finish_reasons": ["stop"], "min_chars": 3, "regex": "ok"}
CONFIG: dict[str, Any] = {
    "listeners": [{"port": 8080}],
    "pools": {"cheap": {"model": "cheap-m", "replicas": [{"url": X}]},
              "strong": {"model": "strong-m", "replicas": [{"url": Y}]}},
    "entries": {name: {"default": ["cheap"], "algorithm": {"type": "escalate", "stages": ["cheap", "strong"],
                                                           "accept": ACCEPT, **extra}}
                for name, extra in (("escalate", {"deadline_s": 10}), ("quick", {"deadline_s": 0.05}),
                                    ("once", {"max_calls": 1}))},
}


class Fleet:
    def __init__(self) -> None:
        self.router = Router(parse_config(CONFIG), rng=random.Random(1))
        self.pools = build_pools(self.router.config)
        self.upstream = FakeUpstream()
        self.metrics = RouterMetrics(self.pools)
        self.app = RouterApp(self.router.config, self.router, self.pools, self.upstream, self.metrics)

    def post(self, path: str, body: Any) -> Answer:
        return run(request(self.app, "POST", path, body))

    def chat(self, model: str = "escalate", **extra: Any) -> Answer:
        return self.post("/v1/chat/completions", {"model": model, "messages": HI, **extra})

    def replica(self, pool: str) -> dict[str, Any]:
        [state] = self.pools[pool].snapshot()
        return state

    def count(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _reply(text: str, finish: str = "stop") -> Reply:
    return Reply(chunks=(completion(text, finish),))


def test_an_accepted_first_stage_is_the_answer() -> None:
    fleet = Fleet()
    fleet.upstream.answer(X, _reply("it is ok"))
    r = fleet.chat()
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "it is ok"
    assert r.json()["router"] == {"stage": "cheap", "calls": 1, "accepted": True, "reason": None}
    assert {k: v for k, v in r.headers.items() if k.startswith("x-router-")} == {
        "x-router-entry": "escalate", "x-router-decision": "default", "x-router-pool": "cheap",
        "x-router-replica": X, "x-router-attempts": "1", "x-router-stage": "cheap", "x-router-calls": "1",
        "x-router-accepted": "true"}
    assert fleet.upstream.urls() == [X]
    assert fleet.replica("cheap")["inflight"] == 0


def test_an_answer_not_accepted_escalates_to_the_next_stage() -> None:
    fleet = Fleet()
    fleet.upstream.answer(X, _reply("it is ok", "length"))
    fleet.upstream.answer(Y, _reply("ok, carefully"))
    r = fleet.chat()
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "ok, carefully"
    assert r.headers["x-router-stage"] == "strong" and r.headers["x-router-calls"] == "2"
    assert r.headers["x-router-replica"] == Y and r.headers["x-router-accepted"] == "true"
    assert [s.body["model"] for s in fleet.upstream.sent] == ["cheap-m", "strong-m"]
    assert fleet.count("router_escalations_total", entry="escalate", stage="cheap") == 1
    assert fleet.replica("cheap")["consecutive_failures"] == 0  # a rejected answer is no failure of the replica


def test_when_no_stage_is_accepted_the_last_answer_is_sent_marked_so() -> None:
    fleet = Fleet()
    fleet.upstream.answer(X, _reply("no"))
    fleet.upstream.answer(Y, _reply("a fine answer"))
    r = fleet.chat()
    assert r.status == 200 and r.headers["x-router-accepted"] == "false"
    assert r.json()["router"] == {"stage": "strong", "calls": 2, "accepted": False, "reason": "no match for 'ok'"}


def test_max_calls_caps_the_stages_called() -> None:
    fleet = Fleet()
    fleet.upstream.answer(X, _reply("no"))
    r = fleet.chat("once")
    assert r.status == 200 and r.headers["x-router-stage"] == "cheap" and r.headers["x-router-accepted"] == "false"
    assert r.json()["router"]["reason"] == "2 chars < min_chars 3"
    assert fleet.upstream.urls() == [X]


def test_a_streaming_client_gets_the_chosen_answer_replayed_as_a_stream() -> None:
    fleet = Fleet()
    fleet.upstream.answer(X, _reply("ok then"))
    r = fleet.chat(stream=True, stream_options={"include_usage": True})
    assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
    assert all("stream" not in s.body and "stream_options" not in s.body for s in fleet.upstream.sent)
    events = r.events()
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"] == {"role": "assistant", "content": "ok then"}
    assert events[1]["choices"][0]["finish_reason"] == "stop" and events[2]["usage"]["completion_tokens"] == 2
    assert r.body.endswith(b"\n\ndata: [DONE]\n\n") and "router" not in r.body.decode()

    messages = fleet.post("/v1/messages", {"model": "escalate", "max_tokens": 5, "stream": True, "messages": HI})
    kinds = [e["type"] for e in messages.events()]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds.count("content_block_delta") == 1


def test_a_failing_stage_is_one_call_and_that_replicas_failure() -> None:
    fleet = Fleet()
    fleet.upstream.answer(X, Reply(refuse="HTTP 500: boom"))
    fleet.upstream.answer(Y, _reply("ok"))
    r = fleet.chat()
    assert r.status == 200 and r.headers["x-router-stage"] == "strong" and r.headers["x-router-calls"] == "2"
    assert fleet.replica("cheap")["consecutive_failures"] == 1
    assert fleet.count("router_upstream_errors_total", pool="cheap") == 1


def test_a_stage_that_breaks_off_is_its_replicas_failure_not_the_deadline() -> None:
    fleet = Fleet()
    fleet.upstream.answer(X, Reply(chunks=(completion("ok"),), break_after=0))
    fleet.upstream.answer(Y, _reply("ok"))
    r = fleet.chat()
    assert r.status == 200 and r.headers["x-router-stage"] == "strong"
    assert fleet.replica("cheap")["consecutive_failures"] == 1
    assert fleet.count("router_upstream_errors_total", pool="cheap") == 1


def test_the_deadline_is_shared_and_blames_no_replica() -> None:
    fleet = Fleet()
    fleet.upstream.answer(X, Reply(hang=True))
    r = fleet.chat("quick")
    assert r.status == 504 and "deadline" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "timeout_error"
    assert fleet.upstream.urls() == [X]  # no time was left for the second stage
    assert fleet.replica("cheap")["consecutive_failures"] == 0 and fleet.replica("cheap")["inflight"] == 0


def test_a_stage_refusing_the_request_passes_it_to_the_next_then_its_status_to_the_client() -> None:
    fleet = Fleet()
    refusal = json.dumps({"error": {"message": "bad request", "code": 400}}).encode()
    fleet.upstream.answer(X, Reply(status=400, chunks=(refusal,)))
    fleet.upstream.answer(Y, _reply("ok"))
    assert fleet.chat().headers["x-router-stage"] == "strong"
    fleet.upstream.answer(Y, Reply(status=400, chunks=(refusal,)))
    r = fleet.chat()
    assert r.status == 400 and "stage 'strong' answered HTTP 400" in r.json()["error"]["message"]


def test_an_answer_of_the_wrong_shape_is_a_502() -> None:
    fleet = Fleet()
    for url in (X, Y):
        fleet.upstream.answer(url, Reply(chunks=(b'{"choices": [null]}',)))
    r = fleet.post("/v1/responses", {"model": "escalate", "input": "hi"})
    assert r.status == 502 and "not a chat completion" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "upstream_error"


def _completion(text: str, finish: str = "stop") -> dict:  # type: ignore[type-arg]
    return {"id": "c", "created": 1, "model": "m", "usage": {"prompt_tokens": 1, "completion_tokens": 2},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}]}


def test_escalate_verdict() -> None:
    accept = parse_config(CONFIG).entries["escalate"].algorithm.accept  # type: ignore[union-attr]
    assert verdict(accept, _completion("it is ok")) is None
    assert verdict(accept, _completion("it is ok", "length")) == "finish_reason 'length' not in ['stop']"
    assert verdict(accept, _completion("ok")) == "2 chars < min_chars 3"
    assert verdict(accept, _completion("fine answer")) == "no match for 'ok'"
    assert verdict(accept, {"choices": []}) is not None
    completions = {"choices": [{"index": 0, "text": "ok then", "finish_reason": "stop"}]}
    assert verdict(accept, completions) is None


def test_as_chunks_replays_an_answer_as_a_stream() -> None:
    chunks = as_chunks(_completion("hi there"), chat=True, include_usage=True)
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 3
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "hi there"}
    assert chunks[1]["choices"][0]["finish_reason"] == "stop" and chunks[2]["usage"]["completion_tokens"] == 2
    assert len(as_chunks(_completion("x"), chat=True, include_usage=False)) == 2
    text = as_chunks({"choices": [{"index": 0, "text": "t", "finish_reason": "length"}]}, chat=False,
                     include_usage=False)
    assert text[0]["choices"][0] == {"index": 0, "text": "t", "finish_reason": "length"}


def test_as_chunks_carries_reasoning_and_tool_calls_for_the_adapters() -> None:
    calls = [{"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
             {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]
    completion = {"id": "c", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "reasoning_content": "why", "tool_calls": calls}}]}
    chunks = as_chunks(completion, chat=True, include_usage=False)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "reasoning_content": "why"}, {"tool_calls": [{"index": 0, **calls[0]}]},
        {"tool_calls": [{"index": 1, **calls[1]}]}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
