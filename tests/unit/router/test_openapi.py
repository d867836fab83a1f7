"""The router's OpenAPI document (services/router/listeners/openapi.py) held to the codecs' parsing, which
it describes without generating it: every documented field sent with a type the document does not allow
is a CodecError naming that field; every documented enum value and range end is accepted; the
document's examples of each shape translate; each listener serves its own document."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
import schemathesis

from services.router.app import RouterApp
from services.router.backends.pool import build_pools
from services.router.config import ListenerConfig, parse_config
from services.router.decision.engine import Router
from services.router.listeners import openapi
from services.router.listeners.codecs.codec import CodecError
from services.router.listeners.codecs.registry import CODECS
from services.router.metrics import RouterMetrics
from tests.support.asgi_client import request
from tests.support.fake_upstream import FakeUpstream
from tests.support.openapi_checks import Probe, documented_values, wrong_types

DOC = openapi.document(ListenerConfig("public", 8080), ("fleet",))
HI = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "name": "f"}
# Per API: its request component and a valid body (with a tool, so a tool_choice value can be valid).
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("ChatRequest", {"model": "fleet", "messages": [HI]}),
    "completions": ("CompletionsRequest", {"model": "fleet", "prompt": "hi"}),
    "responses": ("ResponsesRequest", {"model": "fleet", "input": "hi", "tools": [TOOL]}),
    "messages": ("MessagesRequest", {"model": "fleet", "max_tokens": 2048, "messages": [HI],
                                     "tools": [{"name": "f", "input_schema": {}}]}),
    "count_tokens": ("CountTokensRequest", {"model": "fleet", "messages": [HI],
                                            "tools": [{"name": "f", "input_schema": {}}]}),
    "images": ("ImagesRequest", {"model": "fleet", "prompt": "a red square"}),
}
# A valid value of the components inside them, for probing their fields (in a user message, for Messages).
NESTED: dict[str, dict[str, Any]] = {
    "ChatMessage": HI, "InputMessage": HI, "InputText": {"type": "input_text", "text": "x"},
    "FunctionCall": {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    "FunctionCallOutput": {"type": "function_call_output", "call_id": "c", "output": "x"},
    "ReasoningItem": {"type": "reasoning"}, "ReasoningText": {"type": "reasoning_text", "text": "x"},
    "SummaryText": {"type": "summary_text", "text": "x"}, "FunctionTool": TOOL,
    "NamedFunction": {"type": "function", "name": "f"}, "Reasoning": {}, "TextOptions": {},
    "TextFormat": {"type": "text"}, "JsonObjectFormat": {"type": "json_object"},
    "JsonSchemaFormat": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}, "Message": HI,
    "TextBlock": {"type": "text", "text": "x"},
    "ToolResultBlock": {"type": "tool_result", "tool_use_id": "t"}, "Tool": {"name": "f", "input_schema": {}},
    "ToolChoice": {"type": "auto"}, "ThinkingEnabled": {"type": "enabled", "budget_tokens": 1024},
    "ThinkingDisabled": {"type": "disabled"},
}


def _ref(component: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{component}"}


PROBES = [(api, probe) for api, (component, base) in BODIES.items()
          for probe in wrong_types(_ref(component), DOC, base, NESTED)]
VALUES = [(api, field, value) for api, (component, _) in BODIES.items()
          for field, value in documented_values(_ref(component), DOC)]


def test_every_documented_field_and_component_is_probed() -> None:
    for api, (component, _) in BODIES.items():
        fields = {probe.field.split(".")[0].split("[")[0] for a, probe in PROBES if a == api}
        assert fields == set(DOC["components"]["schemas"][component]["properties"]), api
    probed = {probe.field for _, probe in PROBES}
    assert {"input[0].role", "input[0].content[0].text", "input[0].summary[0].type", "tool_choice.name",
            "messages[0].content[0].tool_use_id", "thinking.budget_tokens"} <= probed
    used = {c for c, _ in BODIES.values()} | set(NESTED)
    assert used | {"Error", "ToolUseBlock", "ThinkingBlock", "RedactedThinkingBlock"} == set(
        DOC["components"]["schemas"])  # every component probed but the assistant-only blocks


@pytest.mark.parametrize(("api", "probe"), PROBES, ids=[f"{api}:{probe.field}" for api, probe in PROBES])
def test_a_type_the_document_does_not_allow_is_refused_naming_the_field(api: str, probe: Probe) -> None:
    with pytest.raises(CodecError) as info:
        CODECS[api].to_chat(probe.body)
    assert info.value.param == probe.field


@pytest.mark.parametrize(("api", "field", "value"), VALUES, ids=[f"{api}:{f}={v}" for api, f, v in VALUES])
def test_documented_values_are_accepted(api: str, field: str, value: Any) -> None:
    CODECS[api].to_chat({**BODIES[api][1], field: value})


@pytest.mark.parametrize("api", sorted(BODIES))
def test_the_valid_bodies_and_their_components_translate(api: str) -> None:
    CODECS[api].to_chat(BODIES[api][1])
    CODECS["responses"].to_chat({"model": "fleet", "input": [
        NESTED[c] for c in ("InputMessage", "FunctionCall", "FunctionCallOutput", "ReasoningItem")]})


def test_each_listener_serves_its_own_document_which_loads_in_schemathesis() -> None:
    config = parse_config({
        "listeners": [{"port": 8080}, {"port": 8081, "name": "claude", "apis": ["messages"], "entries": ["b"],
                                       "api_keys": ["k"]}],
        "pools": {"p": {"model": "p-m", "replicas": [{"url": "http://a:8000"}]}},
        "entries": {"a": {"default": ["p"]}, "b": {"default": ["p"]}}})
    router = Router(config)
    pools = build_pools(config)
    app = RouterApp(config, router, pools, FakeUpstream(), RouterMetrics(pools))
    public = asyncio.run(request(app, "GET", "/openapi.json")).json()
    assert set(public["paths"]) == {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                                    "/v1/messages/count_tokens", "/v1/router/explain", "/v1/images/generations",
                                    "/v1/models", "/health", "/ready", "/metrics", "/openapi.json",
                                    "/v1/responses/{response_id}", "/v1/responses/{response_id}/input_items",
                                    "/v1/conversations", "/v1/conversations/{conversation_id}",
                                    "/v1/conversations/{conversation_id}/items",
                                    "/v1/conversations/{conversation_id}/items/{item_id}"}
    assert public["components"]["schemas"]["ResponsesRequest"]["properties"]["model"]["enum"] == ["a", "b"]
    assert asyncio.run(request(app, "GET", "/openapi.json", port=8081)).status == 401  # behind the API key
    claude = asyncio.run(request(app, "GET", "/openapi.json", port=8081, headers={"x-api-key": "k"})).json()
    assert set(claude["paths"]) == {"/v1/messages", "/v1/messages/count_tokens", "/health", "/ready", "/metrics",
                                    "/openapi.json"}
    assert claude["components"]["schemas"]["MessagesRequest"]["properties"]["model"]["enum"] == ["b"]
    assert claude["security"] and "bearer" in claude["components"]["securitySchemes"]
    for doc in (public, claude):
        assert all(result.ok() for result in schemathesis.openapi.from_dict(doc).get_all_operations())
    wrong = asyncio.run(request(app, "POST", "/openapi.json"))
    assert wrong.status == 405 and wrong.headers["allow"] == "GET, HEAD"


STRICT: list[tuple[str, str, dict[str, Any], str]] = [
    # (api, component, the body with an unknown field "zz" in that component, the field's name)
    ("responses", "ResponsesRequest", {**BODIES["responses"][1], "zz": 1}, "zz"),
    ("responses", "Reasoning", {**BODIES["responses"][1], "reasoning": {"zz": 1}}, "reasoning.zz"),
    ("responses", "TextOptions", {**BODIES["responses"][1], "text": {"zz": 1}}, "text.zz"),
    ("responses", "JsonSchemaFormat", {**BODIES["responses"][1], "text": {"format": {**NESTED["JsonSchemaFormat"],
                                                                                        "zz": 1}}}, "text.format.zz"),
    ("responses", "FunctionTool", {**BODIES["responses"][1], "tools": [{**TOOL, "zz": 1}]}, "tools[0].zz"),
    ("responses", "NamedFunction", {**BODIES["responses"][1], "tool_choice": {**TOOL, "zz": 1}}, "tool_choice.zz"),
    ("messages", "MessagesRequest", {**BODIES["messages"][1], "zz": 1}, "zz"),
    ("messages", "Tool", {**BODIES["messages"][1], "tools": [{"name": "f", "input_schema": {}, "zz": 1}]},
     "tools[0].zz"),
    ("messages", "ToolChoice", {**BODIES["messages"][1], "tool_choice": {"type": "auto", "zz": 1}}, "tool_choice.zz"),
    ("messages", "ThinkingDisabled", {**BODIES["messages"][1], "thinking": {"type": "disabled", "zz": 1}},
     "thinking.zz"),
    ("images", "ImagesRequest", {**BODIES["images"][1], "zz": 1}, "zz"),
]


@pytest.mark.parametrize(("api", "component", "body", "field"), STRICT, ids=[s[1] for s in STRICT])
def test_a_component_documented_closed_refuses_an_unknown_field_naming_it(api: str, component: str,
                                                                          body: dict[str, Any], field: str) -> None:
    assert DOC["components"]["schemas"][component]["additionalProperties"] is False
    with pytest.raises(CodecError) as info:
        CODECS[api].to_chat(body)
    assert info.value.param == field


def test_the_open_components_are_the_ones_sdks_send_back_with_fields_of_their_own() -> None:
    closed = {name for name, schema in DOC["components"]["schemas"].items()
              if schema.get("additionalProperties") is False}
    assert closed == {s[1] for s in STRICT} | {"TextFormat", "JsonObjectFormat", "ThinkingEnabled"}
