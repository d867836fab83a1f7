"""The frontend's OpenAPI document (services/frontend/openapi.py) held to the parser it describes: it
is served at /openapi.json and loads in schemathesis; every documented field sent with a type the
document does not allow is a 400 naming that field; every documented enum value and range end is
accepted."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
import schemathesis

from services.frontend.app import Frontend
from services.frontend.openapi import ERROR_SCHEMA, document
from tests.support.asgi_client import Answer, request
from tests.support.frontend_app import frontend_app
from tests.support.openapi_checks import Probe, documented_values, wrong_types

DOC = document("tiny")
HI = {"role": "user", "content": "hi"}
BODIES = {"/v1/chat/completions": ("ChatCompletionRequest", {"model": "tiny", "messages": [HI], "max_tokens": 1}),
          "/v1/completions": ("CompletionRequest", {"model": "tiny", "prompt": "hi", "max_tokens": 1})}
NESTED = {"ChatMessage": HI, "ContentPart": {"type": "text", "text": "x"}, "StreamOptions": {},
          "JsonSchemaResponseFormat": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}},
          "JsonSchemaFormat": {"name": "n", "schema": {}}, "StructuralTagFormat": {"type": "structural_tag"},
          "StructuredOutputs": {"regex": "a"}}


def _ref(component: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{component}"}


PROBES = [(path, probe) for path, (component, base) in BODIES.items()
          for probe in wrong_types(_ref(component), DOC, base, NESTED)]
VALUES = [(path, field, value) for path, (component, _) in BODIES.items()
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
    for path, (component, _) in BODIES.items():
        fields = {probe.field.split(".")[0].split("[")[0] for p, probe in PROBES if p == path}
        assert fields == set(DOC["components"]["schemas"][component]["properties"])
    assert {"messages[0].role", "messages[0].content[0].type", "stream_options.include_usage"} <= {
        probe.field for _, probe in PROBES}


@pytest.mark.parametrize(("path", "probe"), PROBES, ids=[f"{p.rsplit('/', 1)[1]}:{probe.field}" for p, probe in PROBES])
def test_a_type_the_document_does_not_allow_is_a_400_naming_the_field(app: Frontend, path: str, probe: Probe) -> None:
    answer = call(app, "POST", path, probe.body)
    assert answer.status == 400 and answer.json()["error"]["param"] == probe.field, answer.body


@pytest.mark.parametrize(("path", "field", "value"), VALUES,
                         ids=[f"{p.rsplit('/', 1)[1]}:{field}={value}" for p, field, value in VALUES])
def test_documented_values_are_accepted(app: Frontend, path: str, field: str, value: Any) -> None:
    answer = call(app, "POST", path, {**BODIES[path][1], field: value})
    assert answer.status == 200, answer.body


@pytest.mark.parametrize("role", DOC["components"]["schemas"]["ChatMessage"]["properties"]["role"]["enum"])
def test_every_documented_role_is_accepted(app: Frontend, role: str) -> None:
    message = {"role": role, "content": "hi"}
    answer = call(app, "POST", "/v1/chat/completions", {**BODIES["/v1/chat/completions"][1],
                                                         "messages": [HI, message] if role != "user" else [message]})
    assert answer.status == 200, answer.body


def test_error_bodies_match_the_documented_error_schema(app: Frontend) -> None:
    import jsonschema

    for path, body in (("/v1/chat/completions", {"model": "gpt-9", "messages": [HI]}), ("/v1/nothing", None),
                       ("/v1/completions", {"model": "tiny", "prompt": 5})):
        answer = call(app, "POST", path, body)
        assert answer.status >= 400
        jsonschema.validate(answer.json(), ERROR_SCHEMA)
