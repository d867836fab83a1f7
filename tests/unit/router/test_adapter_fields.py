"""Which fields the Responses and Messages adapters take (services/router/listeners/codecs/): every field
known, honoured (carried to upstream's chat body) or refused by name, whole-number floats taken as
integers, and upstream's refusals naming the field the client sent; through the router's ASGI app with
the replicas a fake of the Upstream port, so the test sees what went upstream and what came back."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.decision.engine import Router
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import Answer, request
from tests.support.fake_upstream import FakeUpstream, Reply

A = "http://a:8000"
CONFIG: dict[str, Any] = {"listeners": [{"port": 8080}],
                          "pools": {"p": {"model": "p-m", "replicas": [{"url": A}]}},
                          "entries": {"fleet": {"default": ["p"]}}}
HI = [{"role": "user", "content": "hi"}]
RESPONSES = {"model": "fleet", "input": "hi"}
MESSAGES = {"model": "fleet", "max_tokens": 8, "messages": HI}
SSE = "text/event-stream"


class Fleet:
    def __init__(self) -> None:
        router = Router(parse_config(CONFIG))
        pools = build_pools(router.config)
        self.upstream = FakeUpstream()
        self.app = RouterApp(router.config, router, pools, self.upstream, RouterMetrics(pools))

    def post(self, path: str, body: Any) -> Answer:
        return asyncio.run(request(self.app, "POST", path, body))

    def sent(self) -> dict[str, Any]:
        return self.upstream.sent[-1].body


def refused(answer: Answer) -> tuple[str, str]:
    """The field a 400 names (param, or the lead of Anthropic's message), and the message."""
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    field = error.get("param") or error["message"].partition(": ")[0]
    return field, error["message"]


@pytest.mark.parametrize(("path", "change", "field", "says"), [
    ("/v1/responses", {"respone_format": {"type": "json_object"}}, "respone_format", "unknown field"),
    ("/v1/responses", {"temprature": 0.5}, "temprature", "did you mean 'temperature'?"),
    ("/v1/responses", {"reasoning": {"efort": "low"}}, "reasoning.efort", "did you mean 'effort'?"),
    ("/v1/responses", {"text": {"fromat": {"type": "text"}}}, "text.fromat", "unknown field"),
    ("/v1/responses", {"text": {"format": {"type": "json_object", "schema": {}}}}, "text.format.schema", "unknown"),
    ("/v1/responses", {"tools": [{"type": "function", "name": "f", "paramters": {}}]}, "tools[0].paramters",
     "did you mean 'parameters'?"),
    ("/v1/responses", {"request_id": "r1"}, "request_id", "is not supported by this router"),
    ("/v1/responses", {"vllm_xargs": {"a": 1}}, "vllm_xargs", "is not supported by this router"),
    ("/v1/responses", {"include": ["message.input_text.tokens"]}, "include[0]", "must be one of"),
    ("/v1/messages", {"stop_sequence": ["x"]}, "stop_sequence", "did you mean 'stop_sequences'?"),
    ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 2048, "budget": 1}}, "thinking.budget",
     "unknown field"),
    ("/v1/messages", {"tools": [{"name": "f", "input_schema": {}, "inputschema": {}}]}, "tools[0].inputschema",
     "unknown field"),
    ("/v1/messages", {"tool_choice": {"type": "auto", "disable_parallel": True}}, "tool_choice.disable_parallel",
     "unknown field"),
    ("/v1/messages", {"kv_transfer_params": {"a": 1}}, "kv_transfer_params", "is not supported by this router"),
    ("/v1/messages", {"output_config": {"effort": "high"}}, "output_config.effort", "is not supported"),
])
def test_an_unknown_or_unsupported_field_is_a_400_naming_it(path: str, change: dict[str, Any], field: str,
                                                            says: str) -> None:
    fleet = Fleet()
    base = RESPONSES if path == "/v1/responses" else MESSAGES
    name, message = refused(fleet.post(path, {**base, **change}))
    assert name == field and says in message, message
    assert fleet.upstream.sent == []


def test_a_refused_extra_sent_as_null_asks_for_nothing() -> None:
    fleet = Fleet()
    assert fleet.post("/v1/responses", {**RESPONSES, "request_id": None, "vllm_xargs": None}).status == 200
    assert fleet.post("/v1/messages", {**MESSAGES, "mm_payload": None, "metadata": {"user_id": "u"},
                                       "service_tier": "auto"}).status == 200


def test_vllms_responses_extras_are_carried_to_upstream() -> None:
    fleet = Fleet()
    extras = {"stop": ["END"], "top_k": 5, "min_p": 0.1, "seed": 7, "logit_bias": {"42": -100},
              "structured_outputs": {"regex": "[ab]+"}, "repetition_penalty": 1.1, "presence_penalty": 0.5,
              "frequency_penalty": 0.2, "stop_token_ids": [3], "ignore_eos": True, "cache_salt": "s",
              "priority": 1, "skip_special_tokens": False, "include_stop_str_in_output": True,
              "chat_template_kwargs": {"enable_thinking": False}}
    answer = fleet.post("/v1/responses", {**RESPONSES, **extras, "top_logprobs": 2})
    assert answer.status == 200, answer.body
    assert fleet.sent() == {"model": "p-m", "messages": HI, **extras, "logprobs": True, "top_logprobs": 2}


@pytest.mark.parametrize(("change", "field"), [
    ({"stop": 5}, "stop"), ({"stop": ["a", 1]}, "stop"), ({"top_k": 2.5}, "top_k"), ({"seed": "7"}, "seed"),
    ({"min_p": "x"}, "min_p"), ({"logit_bias": {"1": "x"}}, "logit_bias.1"), ({"logit_bias": [1]}, "logit_bias"),
    ({"structured_outputs": "x"}, "structured_outputs"), ({"top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 1.5}, "top_logprobs"), ({"stop_token_ids": [1.5]}, "stop_token_ids[0]"),
    ({"max_output_tokens": 5.5}, "max_output_tokens"),
    ({"structured_outputs": {"json": {}}, "text": {"format": {"type": "json_object"}}}, "structured_outputs"),
])
def test_a_bad_extra_is_a_400_naming_it(change: dict[str, Any], field: str) -> None:
    assert refused(Fleet().post("/v1/responses", {**RESPONSES, **change}))[0] == field


def test_whole_number_floats_are_integers() -> None:
    fleet = Fleet()
    assert fleet.post("/v1/responses", {**RESPONSES, "max_output_tokens": 5.0, "top_k": 3.0, "seed": 1.0}).status == 200
    sent = fleet.sent()
    assert (sent["max_tokens"], sent["top_k"], sent["seed"]) == (5, 3, 1) and type(sent["max_tokens"]) is int
    answer = fleet.post("/v1/messages", {**MESSAGES, "max_tokens": 4096.0, "top_k": 2.0,
                                         "thinking": {"type": "enabled", "budget_tokens": 1024.0}})
    assert answer.status == 200, answer.body
    assert (fleet.sent()["max_tokens"], fleet.sent()["top_k"]) == (4096, 2)
    assert refused(fleet.post("/v1/messages", {**MESSAGES, "max_tokens": 8.5}))[0] == "max_tokens"


def test_messages_carry_chat_template_kwargs_and_cache_salt_beside_thinking() -> None:
    fleet = Fleet()
    answer = fleet.post("/v1/messages", {**MESSAGES, "chat_template_kwargs": {"custom": 1}, "cache_salt": "s",
                                         "thinking": {"type": "disabled"}})
    assert answer.status == 200, answer.body
    assert fleet.sent()["chat_template_kwargs"] == {"custom": 1, "enable_thinking": False}
    assert fleet.sent()["cache_salt"] == "s"


def _chat_logprobs(tokens: list[str]) -> dict[str, Any]:
    return {"content": [{"token": t, "logprob": -0.5, "bytes": list(t.encode()),
                         "top_logprobs": [{"token": t, "logprob": -0.5, "bytes": list(t.encode())}]} for t in tokens]}


def test_output_logprobs_come_back_in_the_output_text() -> None:
    fleet = Fleet()
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop",
                         "logprobs": _chat_logprobs(["a", "b"])}]}
    fleet.upstream.answer(A, Reply(chunks=(json.dumps(body).encode(),)))
    answer = fleet.post("/v1/responses", {**RESPONSES, "include": ["message.output_text.logprobs"]})
    part = answer.json()["output"][0]["content"][0]
    assert fleet.sent()["logprobs"] is True and fleet.sent()["top_logprobs"] == 0
    assert part["logprobs"] == _chat_logprobs(["a", "b"])["content"]

    def chunk(delta: dict[str, Any], **choice: Any) -> bytes:
        data = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None, **choice}]}
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    events = (chunk({"content": "a"}, logprobs=_chat_logprobs(["a"])),
              chunk({"content": "b"}, logprobs=_chat_logprobs(["b"])),
              chunk({}, finish_reason="stop"), b"data: [DONE]\n\n")
    fleet.upstream.answer(A, Reply(chunks=events, content_type=SSE))
    streamed = fleet.post("/v1/responses", {**RESPONSES, "stream": True, "top_logprobs": 1})
    deltas = [e for e in streamed.events() if e["type"] == "response.output_text.delta"]
    assert [d["logprobs"] for d in deltas] == [_chat_logprobs([t])["content"] for t in "ab"]
    done = next(e for e in streamed.events() if e["type"] == "response.output_text.done")
    assert done["logprobs"] == _chat_logprobs(["a", "b"])["content"]
    assert fleet.sent()["top_logprobs"] == 1


def test_no_logprobs_unless_asked() -> None:
    fleet = Fleet()
    assert fleet.post("/v1/responses", RESPONSES).status == 200
    assert "logprobs" not in fleet.sent()


def test_upstream_refusals_name_the_field_the_client_sent() -> None:
    fleet = Fleet()
    refusal = {"error": {"message": "max_tokens: 5000 is too large: the context has 4096 tokens",
                         "type": "BadRequestError", "param": "max_tokens", "code": 400}}
    fleet.upstream.answer(A, Reply(status=400, chunks=(json.dumps(refusal).encode(),)))
    answer = fleet.post("/v1/responses", {**RESPONSES, "max_output_tokens": 5000})
    assert answer.status == 400
    assert answer.json()["error"] == {"message": "max_output_tokens: 5000 is too large: the context has 4096 tokens",
                                      "type": "BadRequestError", "param": "max_output_tokens", "code": 400}

    stop = {"error": {"message": "17 stop strings, at most 16 are allowed", "type": "BadRequestError",
                      "param": "stop", "code": 400}}
    fleet.upstream.answer(A, Reply(status=400, chunks=(json.dumps(stop).encode(),)))
    answer = fleet.post("/v1/messages", {**MESSAGES, "stop_sequences": [str(i) for i in range(17)]})
    assert answer.status == 400
    assert answer.json()["error"]["message"] == "stop_sequences: 17 stop strings, at most 16 are allowed"

    other = {"error": {"message": "temperature: must be in [0, 2]", "type": "BadRequestError",
                       "param": "temperature", "code": 400}}
    raw = json.dumps(other).encode()
    fleet.upstream.answer(A, Reply(status=400, chunks=(raw,)))
    assert fleet.post("/v1/responses", {**RESPONSES, "temperature": 3}).body == raw  # passed on as it is


def test_an_upstream_path_below_a_renamed_field_is_passed_on_as_it_is() -> None:
    """Chat's messages[1] is not the client's input[1] (instructions come first, items merge), nor is
    response_format.json_schema a Responses path: a refusal naming such a path keeps it, message and
    param alike, rather than naming a field the client never sent."""
    fleet = Fleet()
    for param in ("messages[1].content", "response_format.json_schema.schema"):
        refusal = {"error": {"message": f"{param}: is not valid", "type": "BadRequestError", "param": param,
                             "code": 400}}
        raw = json.dumps(refusal).encode()
        fleet.upstream.answer(A, Reply(status=400, chunks=(raw,)))
        assert fleet.post("/v1/responses", {**RESPONSES, "instructions": "be brief"}).body == raw
