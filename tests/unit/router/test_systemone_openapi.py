"""The System One API in /openapi.json (listeners/openapi.py) held to its body checks
(listeners/systemone_schema.py): every documented field sent with a type the document does not allow is
a 400 naming it, every documented value accepted; one request and one answer per published family, each
request's `model` that family's names; the paths only on a listener that publishes the API."""
from __future__ import annotations

from typing import Any

import msgspec
import pytest
import schemathesis

from services.router.config import ListenerConfig
from services.router.listeners import openapi, systemone_schema
from services.router.listeners.json_body import BodyError
from tests.support.openapi_checks import Probe, documented_values, wrong_types

FAMILIES = {"cls": "classifier", "emb": "embedding", "rr": "cross_encoder", "triage": "classifier"}
LISTENER = ListenerConfig("public", 8080, apis=("chat", "systemone"), systemone=tuple(FAMILIES))
DOC = openapi.document(LISTENER, ("auto",), FAMILIES)
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "classifier": ("ClassifyRequest", {"model": "cls", "input": ["x"]}),
    "embedding": ("EmbedRequest", {"model": "emb", "input": "x"}),
    "cross_encoder": ("ScoreRequest", {"model": "rr", "query": "q", "documents": ["d"]}),
}
PROBES = [(family, probe) for family, (component, base) in BODIES.items()
          for probe in wrong_types({"$ref": f"#/components/schemas/{component}"}, DOC, base, {})]
VALUES = [(family, field, value) for family, (component, _) in BODIES.items()
          for field, value in documented_values({"$ref": f"#/components/schemas/{component}"}, DOC)]


def test_the_paths_are_documented_with_one_request_and_one_answer_per_family() -> None:
    assert {"/v1/systemone", "/v1/decisions", "/v1/systemone/models", "/v1/chat/completions"} <= set(DOC["paths"])
    post = DOC["paths"]["/v1/systemone"]["post"]
    requests = post["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    answers = post["responses"]["200"]["content"]["application/json"]["schema"]["oneOf"]
    assert [r["$ref"].rsplit("/", 1)[1] for r in requests] == ["ClassifyRequest", "EmbedRequest", "ScoreRequest"]
    assert [r["$ref"].rsplit("/", 1)[1] for r in answers] == ["Classification", "Embedding", "Scores"]
    assert DOC["paths"]["/v1/decisions"]["post"]["requestBody"] == post["requestBody"]
    schemas = DOC["components"]["schemas"]
    assert schemas["ClassifyRequest"]["properties"]["model"]["enum"] == ["cls", "triage"]
    assert schemas["ScoreRequest"]["properties"]["model"]["enum"] == ["rr"]
    assert schemas["Classification"]["properties"]["object"]["enum"] == ["systemone.classification"]
    assert {"429", "502", "503", "504"} <= set(post["responses"])
    assert all(result.ok() for result in schemathesis.openapi.from_dict(DOC).get_all_operations())


def test_only_the_families_published_are_documented() -> None:
    doc = openapi.document(LISTENER, (), {"emb": "embedding"})
    body = doc["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"oneOf": [{"$ref": "#/components/schemas/EmbedRequest"}]}
    assert "ClassifyRequest" not in doc["components"]["schemas"]


def test_a_listener_without_the_api_does_not_document_it() -> None:
    doc = openapi.document(ListenerConfig("chat", 8081), ("auto",), FAMILIES)
    assert not {"/v1/systemone", "/v1/decisions", "/v1/systemone/models"} & set(doc["paths"])
    assert "ClassifyRequest" not in doc["components"]["schemas"]
    assert "/v1/router/explain" in doc["paths"]  # the routing preview keeps its own path


@pytest.mark.parametrize(("family", "probe"), PROBES, ids=[f"{f}:{p.field}" for f, p in PROBES])
def test_a_type_the_document_does_not_allow_is_refused_naming_the_field(family: str, probe: Probe) -> None:
    with pytest.raises(BodyError) as info:
        systemone_schema.read(probe.body, family)
    assert info.value.param == probe.field


@pytest.mark.parametrize(("family", "field", "value"), VALUES, ids=[f"{f}:{k}={v}" for f, k, v in VALUES])
def test_documented_values_are_accepted(family: str, field: str, value: Any) -> None:
    systemone_schema.read({**BODIES[family][1], field: value}, family)


def test_the_documented_bodies_are_read_and_a_documented_closed_body_refuses_an_unknown_field() -> None:
    for family, (component, body) in BODIES.items():
        assert DOC["components"]["schemas"][component]["additionalProperties"] is False
        msgspec.convert(body, systemone_schema.REQUESTS[family])  # valid by the documented struct too
        assert systemone_schema.read({**body, "user": "u"}, family).model == body["model"]
        with pytest.raises(BodyError) as info:
            systemone_schema.read({**body, "zz": 1}, family)
        assert info.value.param == "zz"


def test_the_bound_on_inputs_is_the_documented_one() -> None:
    items = DOC["components"]["schemas"]["ScoreRequest"]["properties"]["documents"]
    assert (items["minItems"], items["maxItems"]) == (1, systemone_schema.MAX_INPUTS)
    systemone_schema.read({"model": "rr", "query": "q", "documents": ["d"] * systemone_schema.MAX_INPUTS},
                          "cross_encoder")
    with pytest.raises(BodyError):
        systemone_schema.read({"model": "rr", "query": "q", "documents": ["d"] * (systemone_schema.MAX_INPUTS + 1)},
                              "cross_encoder")
