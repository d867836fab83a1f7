"""What the router answers a request of the wrong shape, in process through its ASGI app (the replicas
a fake of the Upstream port): every field the codecs and the router read, sent with a wrong type,
is a 400 naming the field in the API's error shape, never a 500; so is a body nested too deeply."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import parse_config
from services.router.decision.engine import Router
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import Answer, request
from tests.support.fake_upstream import FakeUpstream

CONFIG: dict[str, Any] = {"listeners": [{"port": 8080}],
                          "pools": {"p": {"model": "p-m", "replicas": [{"url": "http://a:8000"}]}},
                          "entries": {"fleet": {"default": ["p"]}}}
HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
CLAUDE_TOOL = {"name": "f", "input_schema": {"type": "object"}}
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "fleet", "messages": HI},
    "/v1/completions": {"model": "fleet", "prompt": "hi"},
    "/v1/responses": {"model": "fleet", "input": "hi"},
    "/v1/router/explain": {"model": "fleet", "input": "hi"},
    "/v1/messages": {"model": "fleet", "max_tokens": 8, "messages": HI},
}


def _app() -> RouterApp:
    router = Router(parse_config(CONFIG))
    pools = build_pools(router.config)
    return RouterApp(router.config, router, pools, FakeUpstream(), RouterMetrics(pools))


def post(path: str, body: Any) -> Answer:
    return asyncio.run(request(_app(), "POST", path, body))


def refused_field(answer: Answer) -> str:
    """The field a 400 names: `param` in OpenAI's shape; the message's lead in Anthropic's, which has no param."""
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    field, _, _ = error["message"].partition(": ")
    if "param" in error:
        assert error["param"] == field, error
    return field


def message(role: str, content: Any) -> list[dict[str, Any]]:
    return [{"role": role, "content": content}]


def item(**fields: Any) -> list[dict[str, Any]]:
    return [fields]


WRONG_TYPES: list[tuple[str, dict[str, Any], str]] = [
    # chat and completions pass through to upstream, which checks them; the router reads these itself
    ("/v1/chat/completions", {"model": 5}, "model"),
    ("/v1/chat/completions", {"stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"stream_options": 5}, "stream_options"),
    ("/v1/completions", {"model": ["fleet"]}, "model"),
    ("/v1/router/explain", {"model": {"a": 1}, "messages": HI, "input": None}, "model"),
    ("/v1/router/explain", {"prompt": 5, "input": None}, "prompt"),
    ("/v1/router/explain", {"messages": [5], "input": None}, "messages[0]"),
    # Responses
    ("/v1/responses", {"model": 5}, "model"),
    ("/v1/responses", {"input": 5}, "input"),
    ("/v1/responses", {"input": [5]}, "input[0]"),
    ("/v1/responses", {"input": item(role=["user"], content="hi")}, "input[0].role"),
    ("/v1/router/explain", {"input": item(role=["user"], content="hi")}, "input[0].role"),
    ("/v1/responses", {"input": item(type=["message"], role="user", content="hi")}, "input[0].type"),
    ("/v1/responses", {"input": item(role="user", content=5)}, "input[0].content"),
    ("/v1/responses", {"input": item(role="user", content=[5])}, "input[0].content[0]"),
    ("/v1/responses", {"input": item(role="user", content=[{"type": "input_text", "text": 5}])},
     "input[0].content[0].text"),
    ("/v1/responses", {"input": item(type="function_call", call_id=5, name="f", arguments="{}")}, "input[0].call_id"),
    ("/v1/responses", {"input": item(type="function_call", call_id="c", name=[], arguments="{}")}, "input[0].name"),
    ("/v1/responses", {"input": item(type="function_call", call_id="c", name="f", arguments={})},
     "input[0].arguments"),
    ("/v1/responses", {"input": item(type="function_call_output", call_id=["c"], output="x")}, "input[0].call_id"),
    ("/v1/responses", {"input": item(type="function_call_output", call_id="c", output=5)}, "input[0].output"),
    ("/v1/responses", {"input": item(type="reasoning", content="x")}, "input[0].content"),
    ("/v1/responses", {"input": item(type="reasoning", summary=[5])}, "input[0].summary[0]"),
    ("/v1/responses", {"input": item(type="reasoning", summary=[])}, "input"),  # nothing left to send
    ("/v1/responses", {"instructions": 5}, "instructions"),
    ("/v1/responses", {"max_output_tokens": "5"}, "max_output_tokens"),
    ("/v1/responses", {"max_output_tokens": True}, "max_output_tokens"),
    ("/v1/responses", {"temperature": "hot"}, "temperature"),
    ("/v1/responses", {"top_p": [1]}, "top_p"),
    ("/v1/responses", {"reasoning": "high"}, "reasoning"),
    ("/v1/responses", {"reasoning": {"effort": ["low"]}}, "reasoning.effort"),
    ("/v1/responses", {"reasoning": {"summary": 5}}, "reasoning.summary"),
    ("/v1/responses", {"stream": "yes"}, "stream"),
    ("/v1/responses", {"tools": {}}, "tools"),
    ("/v1/responses", {"tools": [5]}, "tools[0]"),
    ("/v1/responses", {"tools": [{**TOOL, "type": ["function"]}]}, "tools[0].type"),
    ("/v1/responses", {"tools": [{**TOOL, "name": 5}]}, "tools[0].name"),
    ("/v1/responses", {"tools": [{**TOOL, "description": 5}]}, "tools[0].description"),
    ("/v1/responses", {"tools": [{**TOOL, "parameters": "x"}]}, "tools[0].parameters"),
    ("/v1/responses", {"tools": [{**TOOL, "strict": "yes"}]}, "tools[0].strict"),
    ("/v1/responses", {"tools": [TOOL], "tool_choice": 5}, "tool_choice"),
    ("/v1/responses", {"tools": [TOOL], "tool_choice": ["auto"]}, "tool_choice"),
    ("/v1/responses", {"tools": [TOOL], "tool_choice": {"type": "function", "name": ["f"]}}, "tool_choice.name"),
    ("/v1/responses", {"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ("/v1/responses", {"text": "x"}, "text"),
    ("/v1/responses", {"text": {"format": "text"}}, "text.format"),
    ("/v1/responses", {"text": {"format": {"type": ["text"]}}}, "text.format.type"),
    ("/v1/responses", {"tools": [TOOL], "tool_choice": {"type": 5, "name": "f"}}, "tool_choice.type"),
    ("/v1/responses", {"truncation": ["disabled"]}, "truncation"),
    ("/v1/responses", {"metadata": [1]}, "metadata"),
    ("/v1/responses", {"metadata": {"a": 1}}, "metadata"),
    ("/v1/responses", {"user": 5}, "user"),
    ("/v1/responses", {"background": "yes"}, "background"),
    ("/v1/responses", {"previous_response_id": 5}, "previous_response_id"),
    # Anthropic Messages
    ("/v1/messages", {"model": 5}, "model"),
    ("/v1/messages", {"max_tokens": "5"}, "max_tokens"),
    ("/v1/messages", {"messages": {}}, "messages"),
    ("/v1/messages", {"messages": [5]}, "messages[0]"),
    ("/v1/messages", {"messages": message(["user"], "hi")}, "messages[0].role"),
    ("/v1/messages", {"messages": message("user", 5)}, "messages[0].content"),
    ("/v1/messages", {"messages": message("user", [5])}, "messages[0].content[0]"),
    ("/v1/messages", {"messages": message("user", [{"type": "text", "text": 5}])}, "messages[0].content[0].text"),
    ("/v1/messages", {"messages": message("user", [{"type": "tool_result", "tool_use_id": 5}])},
     "messages[0].content[0].tool_use_id"),
    ("/v1/messages", {"messages": message("user", [{"type": "tool_result", "tool_use_id": "t", "content": 5}])},
     "messages[0].content[0].content"),
    ("/v1/messages", {"messages": message("user", [{"type": "tool_result", "tool_use_id": "t", "is_error": "no"}])},
     "messages[0].content[0].is_error"),
    ("/v1/messages", {"messages": message("assistant", [{"type": "tool_use", "id": 5, "name": "f", "input": {}}])},
     "messages[0].content[0].id"),
    ("/v1/messages", {"messages": message("assistant", [{"type": "tool_use", "id": "t", "name": 5, "input": {}}])},
     "messages[0].content[0].name"),
    ("/v1/messages", {"messages": message("assistant", [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}])},
     "messages[0].content[0].input"),
    ("/v1/messages", {"messages": message("assistant", [{"type": "thinking", "thinking": 5}])},
     "messages[0].content[0].thinking"),
    ("/v1/messages", {"system": 5}, "system"),
    ("/v1/messages", {"system": [5]}, "system[0]"),
    ("/v1/messages", {"temperature": "hot"}, "temperature"),
    ("/v1/messages", {"top_p": [1]}, "top_p"),
    ("/v1/messages", {"top_k": "5"}, "top_k"),
    ("/v1/messages", {"stop_sequences": "x"}, "stop_sequences"),
    ("/v1/messages", {"stop_sequences": [5]}, "stop_sequences"),
    ("/v1/messages", {"stream": "yes"}, "stream"),
    ("/v1/messages", {"tools": {}}, "tools"),
    ("/v1/messages", {"tools": [5]}, "tools[0]"),
    ("/v1/messages", {"tools": [{**CLAUDE_TOOL, "type": ["custom"]}]}, "tools[0].type"),
    ("/v1/messages", {"tools": [{**CLAUDE_TOOL, "input_schema": "x"}]}, "tools[0].input_schema"),
    ("/v1/messages", {"tools": [{**CLAUDE_TOOL, "name": 5}]}, "tools[0].name"),
    ("/v1/messages", {"tools": [{**CLAUDE_TOOL, "description": 5}]}, "tools[0].description"),
    ("/v1/messages", {"tools": [CLAUDE_TOOL], "tool_choice": 5}, "tool_choice"),
    ("/v1/messages", {"tools": [CLAUDE_TOOL], "tool_choice": {"type": "tool", "name": ["f"]}}, "tool_choice.name"),
    ("/v1/messages", {"tools": [CLAUDE_TOOL], "tool_choice": {"type": "auto", "disable_parallel_tool_use": "x"}},
     "tool_choice.disable_parallel_tool_use"),
    ("/v1/messages", {"thinking": 5}, "thinking"),
    ("/v1/messages", {"thinking": {"type": 5}}, "thinking.type"),
    ("/v1/messages", {"tools": [CLAUDE_TOOL], "tool_choice": {"type": ["auto"]}}, "tool_choice.type"),
    ("/v1/messages", {"tools": [CLAUDE_TOOL], "tool_choice": {"type": "auto", "name": 5}}, "tool_choice.name"),
    ("/v1/messages", {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": "2048"}},
     "thinking.budget_tokens"),
]


@pytest.mark.parametrize(("path", "change", "field"), WRONG_TYPES,
                         ids=[f"{path.rsplit('/', 1)[1]}:{field}" for path, _, field in WRONG_TYPES])
def test_a_wrong_type_is_a_400_naming_the_field(path: str, change: dict[str, Any], field: str) -> None:
    body = {**BASES[path], **change}
    assert refused_field(post(path, {k: v for k, v in body.items() if v is not None})) == field


@pytest.mark.parametrize("path", sorted(BASES))
def test_json_nested_too_deeply_is_a_400_in_the_apis_shape(path: str) -> None:
    deep = b"[" * 1000 + b"]" * 1000
    answer = post(path, b'{"model": "fleet", "tools": ' + deep + b"}")
    assert answer.status == 400
    error = answer.json()["error"]
    assert "nests too deeply" in error["message"] and "64 levels" in error["message"]
    assert ("param" in error) == (path != "/v1/messages")  # Anthropic's shape has no param


def test_decisions_takes_each_apis_body() -> None:
    for body in ({"model": "fleet", "prompt": "hi"}, {"model": "fleet", "messages": HI}, BASES["/v1/responses"]):
        answer = post("/v1/router/explain", body)
        assert answer.status == 200 and answer.json()["entry"] == "fleet", answer.body


def test_unknown_paths_and_methods_are_json_errors() -> None:
    missing, wrong = post("/v1/nothing", {}), asyncio.run(request(_app(), "GET", "/v1/responses"))
    assert missing.status == 404 and missing.json()["error"]["message"].startswith("no route for POST /v1/nothing")
    assert wrong.status == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["message"] == "/v1/responses accepts POST only"


@pytest.mark.parametrize("path", ["/health", "/metrics", "/openapi.json", "/v1/models"])
@pytest.mark.parametrize("method", ["TRACE", "DELETE", "POST", "PUT"])
def test_the_read_only_routes_refuse_other_methods(path: str, method: str) -> None:
    answer = asyncio.run(request(_app(), method, path))
    assert answer.status == 405 and answer.headers["allow"] == "GET, HEAD"
    assert answer.json()["error"] == {"message": f"{path} accepts GET and HEAD only",
                                      "type": "invalid_request_error", "param": None, "code": 405}
    assert asyncio.run(request(_app(), "GET", path)).status == 200


def test_every_openai_shaped_error_carries_its_status_as_an_integer_code() -> None:
    unknown = post("/v1/chat/completions", {"model": "nope", "messages": HI})
    assert unknown.status == 404 and unknown.json()["error"]["code"] == 404
    assert unknown.json()["error"]["param"] == "model"
    bad = post("/v1/responses", {"model": "fleet", "input": 1})
    assert bad.json()["error"]["code"] == 400 and bad.json()["error"]["param"] == "input"


@pytest.mark.parametrize("body", [b"[1]", b'"x"', b"{", b""])
def test_a_body_that_is_no_json_object_is_a_400(body: bytes) -> None:
    answer = post("/v1/responses", body)
    assert answer.status == 400 and answer.json()["error"]["type"] == "invalid_request_error"
