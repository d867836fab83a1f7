"""The frontend's OpenAPI document (services/frontend/http_api/openapi.py) held to the parser it describes: it
is served at /openapi.json and loads in schemathesis; every documented field sent with a type the
document does not allow is a 400 naming that field; every documented enum value and range end is
accepted."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
import schemathesis

from services.frontend.http_api.app import Frontend
from services.frontend.http_api.openapi import ERROR_SCHEMA, document
from tests.support.asgi_client import Answer, request
from tests.support.frontend_app import frontend_app
from tests.support.openapi_checks import Probe, documented_values, wrong_types

DOC = document("tiny")
HI = {"role": "user", "content": "hi"}
CHAT = {"model": "tiny", "messages": [HI], "max_tokens": 1}
COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
# Each documented POST body: (path, its component, a valid body). /tokenize takes two forms.
BODIES = [("/v1/chat/completions", "ChatCompletionRequest", CHAT),
          ("/v1/completions", "CompletionRequest", COMPLETION),
          ("/v1/chat/completions/render", "ChatCompletionRequest", CHAT),
          ("/v1/completions/render", "CompletionRequest", COMPLETION),
          ("/inference/v1/generate", "TokenInRequest", {"token_ids": [1], "sampling_params": {"max_tokens": 1}}),
          ("/tokenize", "TokenizeCompletionRequest", {"prompt": "hi"}),
          ("/tokenize", "TokenizeChatRequest", {"messages": [HI]}),
          ("/detokenize", "DetokenizeRequest", {"tokens": [1]})]
NESTED = {"ChatMessage": HI, "ContentPart": {"type": "text", "text": "x"}, "StreamOptions": {},
          "TokenSampling": {"max_tokens": 1}, "StructuredOutputs": {"json": {}},
          "StructuredOutputsParams": {"regex": "a"},
          "JsonSchemaResponseFormat": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}},
          "JsonSchemaFormat": {"name": "n", "schema": {}}, "StructuralTagFormat": {"type": "structural_tag"}}
# A documented value of a field that needs another goes with it (vLLM's rule: top_logprobs needs logprobs).
WITH = {"top_logprobs": {"logprobs": True}}


def _ref(component: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{component}"}


def _id(path: str, field: str) -> str:
    return f"{path.removeprefix('/v1/').removeprefix('/')}:{field}"


PROBES = [(path, probe) for path, component, base in BODIES
          for probe in wrong_types(_ref(component), DOC, base, NESTED)]
VALUES = [(path, base, field, value) for path, component, base in BODIES
          for field, value in documented_values(_ref(component), DOC)]


@pytest.fixture(scope="module")
def app() -> Frontend:
    return frontend_app()


def call(app: Frontend, method: str, path: str, body: Any = None) -> Answer:
    return asyncio.run(request(app, method, path, body))


def test_the_document_is_served_and_loads_in_schemathesis(app: Frontend) -> None:
    answer = call(app, "GET", "/openapi.json")
    assert answer.status == 200 and answer.json() == DOC
    operations = {(op.method.upper(), op.path) for op in
                  (result.ok() for result in schemathesis.openapi.from_dict(DOC).get_all_operations())}
    assert {("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models")} <= operations
    assert DOC["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]["enum"] == ["tiny"]


def test_every_documented_field_is_probed() -> None:
    operations = {(op.method.upper(), op.path) for op in
                  (result.ok() for result in schemathesis.openapi.from_dict(DOC).get_all_operations())}
    assert {("POST", path) for path, _, _ in BODIES} == {op for op in operations if op[0] == "POST"}
    for _, component, base in BODIES:
        probes = wrong_types(_ref(component), DOC, base, NESTED)
        assert {probe.field.split(".")[0].split("[")[0] for probe in probes} == set(
            DOC["components"]["schemas"][component]["properties"])
    assert {"messages[0].role", "messages[0].content[0].type", "stream_options.include_usage",
            "sampling_params.temperature", "sampling_params.structured_outputs.regex"} <= {
        probe.field for _, probe in PROBES}


@pytest.mark.parametrize(("path", "probe"), PROBES, ids=[_id(p, probe.field) for p, probe in PROBES])
def test_a_type_the_document_does_not_allow_is_a_400_naming_the_field(app: Frontend, path: str, probe: Probe) -> None:
    answer = call(app, "POST", path, probe.body)
    assert answer.status == 400 and answer.json()["error"]["param"] == probe.field, answer.body


@pytest.mark.parametrize(("path", "base", "field", "value"), VALUES,
                         ids=[f"{_id(p, field)}={value}" for p, _, field, value in VALUES])
def test_documented_values_are_accepted(app: Frontend, path: str, base: dict[str, Any], field: str,
                                        value: Any) -> None:
    answer = call(app, "POST", path, {**base, **WITH.get(field, {}), field: value})
    assert answer.status == 200, answer.body


SAMPLING_VALUES = list(documented_values(_ref("TokenSampling"), DOC))


@pytest.mark.parametrize(("field", "value"), SAMPLING_VALUES, ids=[f"{f}={v}" for f, v in SAMPLING_VALUES])
def test_documented_token_in_sampling_values_are_accepted(app: Frontend, field: str, value: Any) -> None:
    answer = call(app, "POST", "/inference/v1/generate",
                  {"token_ids": [1], "sampling_params": {"max_tokens": 1, "min_tokens": 0, field: value}})
    assert answer.status == 200, answer.body


def test_a_render_only_document_has_no_generation_routes() -> None:
    paths = set(document("tiny", render_only=True)["paths"])
    assert not paths & {"/v1/chat/completions", "/v1/completions", "/inference/v1/generate"}
    assert {"/v1/chat/completions/render", "/v1/completions/render", "/tokenize", "/detokenize", "/version"} <= paths


@pytest.mark.parametrize("role", DOC["components"]["schemas"]["ChatMessage"]["properties"]["role"]["enum"])
def test_every_documented_role_is_accepted(app: Frontend, role: str) -> None:
    message = {"role": role, "content": "hi"}
    answer = call(app, "POST", "/v1/chat/completions",
                  {**CHAT, "messages": [HI, message] if role != "user" else [message]})
    assert answer.status == 200, answer.body


def test_error_bodies_match_the_documented_error_schema(app: Frontend) -> None:
    import jsonschema

    for path, body in (("/v1/chat/completions", {"model": "gpt-9", "messages": [HI]}), ("/v1/nothing", None),
                       ("/v1/completions", {"model": "tiny", "prompt": 5})):
        answer = call(app, "POST", path, body)
        assert answer.status >= 400
        jsonschema.validate(answer.json(), ERROR_SCHEMA)
