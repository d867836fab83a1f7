"""The frontend's OpenAPI document, served at /openapi.json by each API server process. The request
bodies are generated from schema.py's structs (msgspec), with the number ranges `check_common` checks
and the values `messages.py` accepts added, so the document cannot drift from what is parsed."""
from __future__ import annotations

from typing import Any

import msgspec

from services.frontend.messages import ROLES
from services.frontend.schema import BOUNDS, CHAT_BOUNDS, Bounds, ChatCompletionRequest, CompletionRequest
from services.frontend.stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS
from services.frontend.translation import PIN_HEADER

_REF = "#/components/schemas/{name}"
# The error body errors.py builds (no struct: it is built once per error, from a dict).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "integer"]}}}}}


_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
PROMPT_SCHEMA: dict[str, Any] = {"anyOf": [
    {"type": "string", "minLength": 1}, _TOKEN_IDS,
    {"type": "array", "items": {"anyOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]}, "minItems": 1,
     "maxItems": 1}]}


def document(model: str, *, max_logprobs: int = 20) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a frontend serving `model` (the only model name it accepts) with
    `--max-logprobs`."""
    (chat, completion), schemas = msgspec.json.schema_components([ChatCompletionRequest, CompletionRequest],
                                                                   ref_template=_REF)
    stop = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}  # and MAX_STOP_CHARS in all
    counts = Bounds(0, max_logprobs, "")  # check_logprobs' range
    for name, bounds in (("ChatCompletionRequest", {**BOUNDS, **CHAT_BOUNDS, "top_logprobs": counts,
                                                    "prompt_logprobs": counts}),
                         ("CompletionRequest", {**BOUNDS, "logprobs": counts, "prompt_logprobs": counts})):
        properties = schemas[name]["properties"]
        properties["model"]["enum"] = [model]
        for field, bound in bounds.items():
            _number(properties[field]).update(bound.json_schema())
        properties["stop"] = {"anyOf": [stop, {"type": "array", "items": stop, "maxItems": MAX_STOP_STRINGS},
                                        {"type": "null"}], "default": None}
    schemas["ChatMessage"]["properties"]["role"]["enum"] = list(ROLES)
    # messages.py refuses other parts, and a text part without its text.
    schemas["ContentPart"]["properties"].update(type={"enum": ["text"]}, text={"type": "string"})
    schemas["ContentPart"]["required"] = ["type", "text"]
    schemas["ChatCompletionRequest"]["properties"]["messages"]["minItems"] = 1  # ChatTemplate.render's check
    # The struct's list[Any] (msgspec takes one array type in a union): the forms Translator.completion takes.
    schemas["CompletionRequest"]["properties"]["prompt"] = PROMPT_SCHEMA
    schemas["Error"] = ERROR_SCHEMA
    pin = {"name": PIN_HEADER, "in": "header", "required": False, "schema": {"type": "integer"},
           "description": "the data-parallel rank to run the request on"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "fleet frontend", "version": "1", "description": f"OpenAI-compatible API serving {model}"},
        "paths": {
            "/v1/chat/completions": {"post": _generate("Chat completion", chat, pin)},
            "/v1/completions": {"post": _generate("Text completion", completion, pin)},
            "/v1/models": {"get": _get("The model served", "application/json")},
            "/health": {"get": _get("Liveness", "application/json")},
            "/ready": {"get": _get("Readiness: every engine rank handshaken", "application/json", 503)},
            "/metrics": {"get": _get("Prometheus metrics", "text/plain")},
            "/openapi.json": {"get": _get("This document", "application/json")},
        },
        "components": {"schemas": schemas},
    }


def _number(schema: dict[str, Any]) -> dict[str, Any]:
    """The number branch of a field's schema (`int | None` is anyOf [integer, null])."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") in ("integer", "number"):
            return branch
    raise ValueError(f"no number in {schema}")


def _errors() -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}}}
    return {"400": {"description": "A field is invalid: `param` names it", **error},
            "404": {"description": "Unknown model", **error},
            "413": {"description": "The body is over the size limit", **error},
            "503": {"description": "No engine ready", **error}}


def _generate(summary: str, body: dict[str, Any], pin: dict[str, Any]) -> dict[str, Any]:
    return {"summary": summary, "parameters": [pin],
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": {"description": "The completion (JSON), or its chunks (SSE) when `stream`",
                                  "content": {"application/json": {}, "text/event-stream": {}}}, **_errors()}}


def _get(summary: str, media_type: str, other: int | None = None) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": summary, "content": {media_type: {}}}}
    if other is not None:
        responses[str(other)] = {"description": "Not yet", "content": {media_type: {}}}
    return {"summary": summary, "responses": responses}
